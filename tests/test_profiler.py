"""torch.profiler on the neuron device: device events, the Chrome trace, metrics tables."""
import csv
import json
import numbers

import pytest
import torch

import neuron_eager  # noqa: F401
from neuron_eager import profiler
from neuron_eager.device_sim import core


def _profile(fn):
    fn()  # compile kernels outside the profile
    with torch.profiler.profile(record_shapes=True) as prof:
        fn()
    return prof


@pytest.fixture(scope="module")
def linear_prof():
    torch.manual_seed(0)
    w = torch.randn(8, 16, device="neuron", requires_grad=True)
    b = torch.randn(8, device="neuron", requires_grad=True)
    x = torch.randn(4, 16, device="neuron")

    def step():
        y = torch.nn.functional.linear(x, w, b)  # LINE: linear
        y.relu().sum().backward()

    return _profile(step)


def _line(marker: str) -> str:
    with open(__file__) as f:
        for i, text in enumerate(f, 1):
            if f"# LINE: {marker}" in text:
                return f"{__file__}:{i}"
    raise AssertionError(marker)


def test_hooks_are_installed():
    # torch internals touched by ops/_compat.install_profiler_hooks: fail loudly on upgrades
    from torch.autograd.profiler import profile

    for name in ("_start_trace", "__exit__", "_parse_kineto_results", "export_chrome_trace"):
        assert getattr(getattr(profile, name), "_neuron", False), name


def test_key_averages_hold_device_time(linear_prof):
    records = linear_prof.profiler._neuron_records
    rows = {e.key: e for e in linear_prof.key_averages()}
    addmm = [r for r in records if r.op is torch.ops.aten.addmm.default]
    assert len(addmm) == 1
    row = rows["neuron::addmm"]
    assert row.count == 1
    assert row.device_time_total == pytest.approx(addmm[0].cost.duration_ns / 1e3)
    assert row.cpu_time_total == 0
    # the host op that issued it counts the kernel as its device time, as with CUDA
    assert rows["aten::addmm"].device_time_total == pytest.approx(row.device_time_total)
    assert row.flops == 2 * 4 * 16 * 8
    total = sum(e.self_device_time_total for e in linear_prof.events()
                if e.name.startswith("neuron::"))
    assert total == pytest.approx(sum(r.cost.duration_ns for r in records) / 1e3)
    assert "NEURON" in linear_prof.key_averages().table(sort_by="device_time_total")


def test_the_legacy_profiler_with_use_device_neuron_records_device_time():
    # its own PrivateUse1 mode needs C++ stubs: every op logged an error and CPU totals were
    # garbage; it runs in Kineto's mode, as torch.profiler.profile does
    a = torch.randn(32, 32, device="neuron")
    (a @ a).sum().item()  # (compiled before profiling)
    with torch.autograd.profiler.profile(use_device="neuron") as prof:
        (a @ a).sum().item()
    events = {e.key: e for e in prof.key_averages()}
    assert events["aten::mm"].device_time_total > 0
    assert all(0 <= e.cpu_time_total < 60e6 for e in events.values())
    assert "NEURON" in prof.key_averages().table()


def test_with_stack_still_charges_kernels_to_the_ops_that_launched_them():
    """with_stack adds Python function events (the launch's own clock read among them):
    they are not ops, so a kernel's time stays with its aten:: event."""
    x = torch.randn(16, 16, device="neuron")
    step = lambda: (x @ x).relu()  # noqa: E731
    step()
    tables = []
    for stack in (False, True):
        with torch.profiler.profile(with_stack=stack) as prof:
            step()
        tables.append({e.key: e.self_device_time_total for e in prof.key_averages()
                       if e.self_device_time_total > 0})
    assert tables[1] == pytest.approx(tables[0]) and tables[0]["aten::relu"] > 0


def test_device_events_carry_engine_bytes_and_source(linear_prof):
    (event,) = [e for e in linear_prof.events() if e.name == "neuron::addmm"]
    assert event.neuron_engine == "tensor"
    assert event.neuron_bytes == 4 * (4 * 16 + 8 * 16 + 8 + 4 * 8)
    assert event.neuron_source == _line("linear")


def _validate_chrome_trace(trace: dict) -> None:
    """The JSON Object Format of the Trace Event Format (the document Perfetto's importer
    follows): required fields and types per phase."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    ids = lambda v: isinstance(v, (int, str))  # noqa: E731
    for e in trace["traceEvents"]:
        ph = e["ph"]
        assert ph in "BEXiIMCsftbneNODP", e
        assert isinstance(e.get("name", ""), str)
        if ph != "M":
            assert isinstance(e["ts"], numbers.Real), e
        if ph in "XBEiICMsft":
            assert ids(e.get("pid", 0)) and ids(e.get("tid", 0)), e
        if ph == "X":
            assert isinstance(e["dur"], numbers.Real) and e["dur"] >= 0, e
        if ph == "M":
            assert e["name"] in ("process_name", "process_labels", "process_sort_index",
                                 "thread_name", "thread_sort_index"), e
            assert isinstance(e["args"], dict)
        if ph == "C":
            assert all(isinstance(v, numbers.Real) for v in e["args"].values()), e
        if ph in "sft":
            assert ids(e["id"]), e
        if ph == "f":
            assert e.get("bp", "e") == "e"


def test_chrome_trace_has_a_device_timeline(linear_prof, tmp_path):
    path = tmp_path / "trace.json"
    linear_prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    _validate_chrome_trace(trace)
    device = [e for e in trace["traceEvents"] if e.get("pid") == profiler.DEVICE_PID]
    kernels = [e for e in device if e["ph"] == "X"]
    records = linear_prof.profiler._neuron_records
    assert len(kernels) == 2 * len(records)  # one on its stream, one on its engine
    tracks = {e["args"]["name"] for e in device if e["name"] == "thread_name"}
    assert {"stream 0 (default)", "Tensor engine", "Vector engine"} <= tracks
    (mm,) = [e for e in kernels if e["name"] == "neuron::addmm" and e["tid"] == 0]
    assert mm["args"]["source"] == _line("linear") and mm["args"]["engine"] == "tensor"
    assert mm["args"]["host op"] == "aten::addmm"
    # aligned to the host: it starts no earlier than the host op that launched it
    host = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and
            e["name"] == "aten::addmm"]
    assert host and mm["ts"] >= host[0]["ts"]
    flows = [e for e in trace["traceEvents"] if e.get("cat") == "ac2g"]
    assert {e["ph"] for e in flows} == {"s", "f"}
    # kernels on one stream do not overlap
    stream0 = sorted((e["ts"], e["dur"]) for e in kernels if e["tid"] == 0)
    assert all(a[0] + a[1] <= b[0] + 0.01 for a, b in zip(stream0, stream0[1:]))  # us


def test_metrics_csv(linear_prof, tmp_path, monkeypatch):
    paths = profiler.export_metrics(str(tmp_path), linear_prof, format="csv")
    assert set(paths) == set(profiler.COLUMNS)
    records = linear_prof.profiler._neuron_records
    for name, path in paths.items():
        with open(path) as f:
            rows = list(csv.DictReader(f))
        assert list(rows[0].keys()) == profiler.COLUMNS[name]
    with open(paths["Summary"]) as f:
        (summary,) = list(csv.DictReader(f))
    assert int(summary["kernels"]) == len(records)
    assert float(summary["busy_ns"]) == pytest.approx(sum(r.cost.duration_ns for r in records))
    with open(paths["HbmUsage"]) as f:
        assert len(list(csv.DictReader(f))) == len(records)
    # without pyarrow, CSV is the default
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    assert profiler.export_metrics(str(tmp_path / "d"))["Summary"].endswith(".csv")


def test_metrics_parquet(linear_prof, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    paths = profiler.export_metrics(str(tmp_path), linear_prof, format="parquet")
    for name, path in paths.items():
        assert pq.read_table(path).column_names == profiler.COLUMNS[name]


def test_streams_get_their_own_tracks(tmp_path):
    a = torch.randn(64, 64, device="neuron")
    s = torch.neuron.Stream()

    def run():
        with torch.neuron.stream(s):
            a @ a
        a * 2

    prof = _profile(run)
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"]
             if e.get("pid") == profiler.DEVICE_PID and e["name"] == "thread_name"}
    assert f"stream {s.stream_id}" in names


def test_no_recording_outside_the_profiler():
    x = torch.ones(4, device="neuron")
    with torch.profiler.profile():
        x + x
    assert core.clock.records is None and core.clock.context is None
    from neuron_eager.ops import router, tensor

    assert tensor._dispatcher is router.dispatch


def test_adaptive_eager_kernels_are_named_for_what_they_ran():
    """A fused region's launch is the fused ops at the line of the first, not the op that
    flushed it; ops a region runs one by one keep their own names and lines."""
    from neuron_eager import adaptive

    x, w = torch.randn(32, 32, device="neuron"), torch.randn(32, 32, device="neuron")
    line = test_adaptive_eager_kernels_are_named_for_what_they_ran.__code__.co_firstlineno + 9

    def f():
        h = torch.tanh(x * 2.0 + 1.0) * 0.5  # line `line`: one fused kernel
        return h @ w  # flushes the region

    def g():
        return (x - 3.0).exp().sum()  # line `line + 4`: recorded, then run op by op

    with adaptive.adaptive_eager():
        for _ in range(3):  # compiled and cached
            f()
        torch.neuron.synchronize()
        with torch.profiler.profile() as fused:
            f()
            torch.neuron.synchronize()
        with torch.profiler.profile() as unfused:  # seen once: not compiled yet
            g().item()

    def sources(prof):
        return {r["op"]: r["source"] for r in profiler.metrics(prof)["Kernel"]}

    rows = sources(fused)
    assert rows["neuron::fused_mul_add_tanh"].endswith(f"test_profiler.py:{line}")
    times = {e.key: e.self_device_time_total for e in fused.key_averages()}
    assert times["aten::mm"] == times["neuron::mm"]  # (the fused kernel it flushed: not its)
    assert times["neuron::fused_mul_add_tanh"] > 0
    assert rows["neuron::mm"].endswith(f"test_profiler.py:{line + 1}")
    rows = sources(unfused)
    assert rows["neuron::sub"].endswith(f"test_profiler.py:{line + 4}")
    assert rows["neuron::exp"].endswith(f"test_profiler.py:{line + 4}")
