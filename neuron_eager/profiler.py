"""torch.profiler with a simulated NeuronCore: device events, a device timeline, metrics.

While torch.profiler records, every kernel launch is recorded with its op, the user's
source line, its stream and engine, and its simulated start, end and cost. When results
are read, each launch becomes a device event `neuron::<op>` (in `events()` and
`key_averages()`, its time also counted as device time of the host op that issued it);
`export_chrome_trace` adds a NeuronCore process with one track per stream and per engine.
`export_metrics(dir)` writes the vendor-style tables. docs/cost-model.md has the details.

>>> import torch, neuron_eager
>>> x = torch.ones(64, device="neuron")
>>> with torch.profiler.profile() as prof:
...     y = x + x
>>> "neuron::add" in {e.key for e in prof.key_averages()}
True
"""
from __future__ import annotations

import bisect
import csv
import json
import os

from neuron_eager.device_sim import core
from neuron_eager.device_sim.clock import ENGINES
from neuron_eager.ops import _compat, router

DEVICE_PID = "NeuronCore 0"  # the trace's device process (Kineto also uses named pids)
ENGINE_TIDS = {engine: 100 + i for i, engine in enumerate(ENGINES)}
ENGINE_NAMES = {"tensor": "Tensor engine", "vector": "Vector engine", "scalar": "Scalar engine",
                "gpsimd": "GpSimd engine", "dma": "DMA queues"}

# The metrics tables and their columns (docs/cost-model.md, "Metrics").
COLUMNS = {
    "Summary": ["chip", "kernels", "span_ns", "busy_ns", "overhead_ns", "dma_ns", "engine_ns",
                "hbm_bytes", "matmul_tiles", "peak_hbm_allocated_bytes",
                "launch_overhead_param_ns"],
    "OpSummary": ["op", "engine", "count", "device_ns", "mean_ns", "overhead_ns", "dma_ns",
                  "engine_ns", "elements", "hbm_bytes", "matmul_tiles", "first_source"],
    "EngineSummary": ["engine", "kernels", "busy_ns", "utilization", "elements", "hbm_bytes"],
    "Kernel": ["index", "op", "engine", "stream", "start_ns", "end_ns", "duration_ns",
               "overhead_ns", "dma_ns", "engine_ns", "elements", "hbm_bytes", "transfers",
               "matmul_tiles", "source"],
    "HbmUsage": ["time_ns", "allocated_bytes", "reserved_bytes"],
}

# Host events that wrap an op's Python dispatch rather than name it.
_NOT_OPS = {"PythonSubclass"}

_last_records: list = []  # the latest profiling session's launches


# -- hooks ----------------------------------------------------------------------------------
def _on_start(prof) -> None:
    router.start_profiling()


def _on_stop(prof) -> None:
    global _last_records
    records = router.stop_profiling()
    prof._neuron_records = records
    _last_records = records


def _op_name(record, host_name: str | None) -> str:
    if type(record.op) is str:  # what adaptive eager ran: a fused kernel, or a recorded op
        return "neuron::" + record.op
    if record.op is not None:
        return "neuron::" + record.op.overloadpacket.__name__
    if host_name and "::" in host_name:  # launched outside the router (factories, copies)
        return "neuron::" + host_name.split("::", 1)[1]
    return "neuron::" + record.engine


def _shift_ns(records) -> int:
    """Wall-clock ns of simulated time 0 in the trace. Each device event starts no earlier
    than the host op that launched it, and at least one starts exactly then. (Integers:
    wall-clock ns since 1970 do not fit a float's mantissa.)"""
    return max(r.wall_ns - r.start_ps // 1000 for r in records)


class _Innermost:
    """Finds the innermost of nested host intervals that contains a time."""

    def __init__(self, intervals):  # (start, end, payload)
        self.items = sorted(intervals, key=lambda x: (x[0], -x[1]))
        self.starts = [x[0] for x in self.items]

    def find(self, t, limit: int = 4096):
        i = bisect.bisect_right(self.starts, t) - 1
        stop = max(-1, i - limit)
        while i > stop:
            start, end, payload = self.items[i]
            if end >= t:
                return payload
            i -= 1
        return None


def _on_results(prof, result, events):
    records = getattr(prof, "_neuron_records", None)
    if not records:
        return events
    trace_start = result.trace_start_ns()
    # (with_stack's Python function events are not ops: the launch's own timing call was
    # the innermost event and took every kernel)
    host = _Innermost([(e.time_range.start, e.time_range.end, e) for e in events
                       if _compat.is_host_event(e) and e.name not in _NOT_OPS
                       and not getattr(e, "is_python_function", False)])
    shift = _shift_ns(records)
    next_id = max((e.id for e in events), default=0) + 1
    device_events = []
    for i, r in enumerate(records):
        parent = host.find((r.wall_ns - trace_start) / 1e3)
        name = _op_name(r, parent.name if parent is not None else None)
        start = (shift - trace_start + r.start_ps / 1000) / 1e3
        end = (shift - trace_start + r.end_ps / 1000) / 1e3
        flops = 2 * r.elements if r.engine == "tensor" else None
        fe = _compat.device_function_event(name, start, end, r.stream, flops)
        fe.id = next_id + i
        fe.neuron_engine, fe.neuron_bytes, fe.neuron_source = r.engine, r.nbytes, r.source
        device_events.append(fe)
        # (what adaptive eager ran for recorded ops is not the op's whose sync point ran it:
        # an 11 us fused kernel made the `ones_like` that flushed it a table's top row)
        if parent is not None and type(r.op) is not str:
            parent.append_kernel(name, 0, end - start)
    if prof.use_device is None:
        prof.use_device = _compat.BACKEND
    for e in events:
        e.use_device = prof.use_device
    events = events + device_events
    events.sort(key=lambda e: [e.time_range.start, -e.time_range.end])
    return events


def _on_export(prof, path: str) -> None:
    records = getattr(prof, "_neuron_records", None)
    if not records:
        return
    with open(path) as f:
        trace = json.load(f)
    trace["traceEvents"].extend(trace_events(records, trace))
    with open(path, "w") as f:
        json.dump(trace, f)


def install() -> None:
    _compat.install_profiler_hooks(_on_start, _on_stop, _on_results, _on_export)


# -- the Chrome trace ------------------------------------------------------------------------
def trace_events(records, trace: dict) -> list[dict]:
    """Device events for a Kineto Chrome trace: a NeuronCore process, a track per stream and
    per engine, an HBM counter, and flow arrows from each host op to its kernel."""
    base_ns = trace.get("baseTimeNanoseconds", 0)
    host_ops = [e for e in trace["traceEvents"] if e.get("ph") == "X" and
                e.get("cat") in ("cpu_op", "user_annotation") and e["name"] not in _NOT_OPS]
    host = _Innermost([(e["ts"], e["ts"] + e.get("dur", 0), e) for e in host_ops])
    shift = _shift_ns(records)
    out = [_meta("process_name", {"name": f"NeuronCore 0 ({core.spec.name}, simulated)"}),
           _meta("process_labels", {"labels": "neuron"}),
           _meta("process_sort_index", {"sort_index": 1 << 28})]
    streams = sorted({r.stream for r in records})
    for s in streams:
        name = f"stream {s}" + (" (default)" if s == 0 else "")
        out += [_meta("thread_name", {"name": name}, s),
                _meta("thread_sort_index", {"sort_index": s}, s)]
    for engine in sorted({r.engine for r in records}, key=ENGINES.index):
        tid = ENGINE_TIDS[engine]
        out += [_meta("thread_name", {"name": ENGINE_NAMES[engine]}, tid),
                _meta("thread_sort_index", {"sort_index": tid}, tid)]
    for i, r in enumerate(records):
        wall_us = (r.wall_ns - base_ns) / 1e3
        parent = host.find(wall_us)
        name = _op_name(r, parent["name"] if parent is not None else None)
        ts = (shift - base_ns + r.start_ps / 1000) / 1e3
        dur = (r.end_ps - r.start_ps) / 1e6
        c = r.cost
        args = {"source": r.source or "<unknown>", "engine": r.engine, "stream": r.stream,
                "elements": r.elements, "hbm bytes": r.nbytes, "matmul tiles": c.tiles,
                "dma transfers": c.transfers, "overhead ns": c.overhead_ns, "dma ns": c.dma_ns,
                "engine ns": c.engine_ns, "simulated start ns": r.start_ns, "correlation": i + 1}
        if parent is not None:
            args["host op"] = parent["name"]
        for tid in (r.stream, ENGINE_TIDS[r.engine]):
            out.append({"ph": "X", "cat": "kernel", "name": name, "pid": DEVICE_PID, "tid": tid,
                        "ts": ts, "dur": dur, "args": args})
        out.append({"ph": "C", "name": "HBM", "pid": DEVICE_PID, "tid": 0, "ts": ts + dur,
                    "args": {"allocated": r.hbm_allocated, "reserved": r.hbm_reserved}})
        if parent is not None:
            flow = {"cat": "ac2g", "name": "ac2g", "id": i + 1}
            out.append({**flow, "ph": "s", "pid": parent["pid"], "tid": parent["tid"],
                        "ts": wall_us})
            out.append({**flow, "ph": "f", "bp": "e", "pid": DEVICE_PID, "tid": r.stream,
                        "ts": ts})
    return out


def _meta(name: str, args: dict, tid: int = 0) -> dict:
    return {"ph": "M", "name": name, "pid": DEVICE_PID, "tid": tid, "ts": 0, "args": args}


# -- metrics tables -------------------------------------------------------------------------
def _records_of(prof):
    if prof is None:
        return _last_records
    inner = getattr(prof, "profiler", prof)  # torch.profiler.profile wraps the autograd one
    return getattr(inner, "_neuron_records", None) or []


def metrics(prof=None) -> dict[str, list[dict]]:
    """The metrics tables of a profiling session (default: the latest) as lists of rows."""
    records = _records_of(prof)
    kernel_rows, ops, engines, hbm = [], {}, {}, []
    for i, r in enumerate(records):
        c = r.cost
        op = _op_name(r, None)
        kernel_rows.append({"index": i, "op": op, "engine": r.engine, "stream": r.stream,
                            "start_ns": r.start_ns, "end_ns": r.end_ns,
                            "duration_ns": c.duration_ns, "overhead_ns": c.overhead_ns,
                            "dma_ns": c.dma_ns, "engine_ns": c.engine_ns,
                            "elements": r.elements, "hbm_bytes": r.nbytes,
                            "transfers": c.transfers, "matmul_tiles": c.tiles,
                            "source": r.source or "<unknown>"})
        row = ops.setdefault((op, r.engine), {
            "op": op, "engine": r.engine, "count": 0, "device_ns": 0.0, "mean_ns": 0.0,
            "overhead_ns": 0.0, "dma_ns": 0.0, "engine_ns": 0.0, "elements": 0, "hbm_bytes": 0,
            "matmul_tiles": 0, "first_source": r.source or "<unknown>"})
        row["count"] += 1
        row["device_ns"] += c.duration_ns
        row["overhead_ns"] += c.overhead_ns
        row["dma_ns"] += c.dma_ns
        row["engine_ns"] += c.engine_ns
        row["elements"] += r.elements
        row["hbm_bytes"] += r.nbytes
        row["matmul_tiles"] += c.tiles
        e = engines.setdefault(r.engine, {"engine": r.engine, "kernels": 0, "busy_ns": 0.0,
                                          "utilization": 0.0, "elements": 0, "hbm_bytes": 0})
        e["kernels"] += 1
        e["busy_ns"] += c.duration_ns
        e["elements"] += r.elements
        e["hbm_bytes"] += r.nbytes
        hbm.append({"time_ns": r.end_ns, "allocated_bytes": r.hbm_allocated,
                    "reserved_bytes": r.hbm_reserved})
    span = (max(r.end_ns for r in records) - min(r.start_ns for r in records)) if records else 0.0
    for row in ops.values():
        row["mean_ns"] = row["device_ns"] / row["count"]
    for e in engines.values():
        e["utilization"] = e["busy_ns"] / span if span else 0.0
    total = lambda key: sum(row[key] for row in kernel_rows)  # noqa: E731
    summary = {"chip": core.spec.name, "kernels": len(records), "span_ns": span,
               "busy_ns": total("duration_ns"), "overhead_ns": total("overhead_ns"),
               "dma_ns": total("dma_ns"), "engine_ns": total("engine_ns"),
               "hbm_bytes": total("hbm_bytes"), "matmul_tiles": total("matmul_tiles"),
               "peak_hbm_allocated_bytes": max((r.hbm_allocated for r in records), default=0),
               "launch_overhead_param_ns": core.cost_model.launch_overhead_ns}
    return {"Summary": [summary],
            "OpSummary": sorted(ops.values(), key=lambda row: -row["device_ns"]),
            "EngineSummary": [engines[k] for k in ENGINES if k in engines],
            "Kernel": kernel_rows, "HbmUsage": hbm}


def export_metrics(directory: str, prof=None, format: str | None = None) -> dict[str, str]:
    """Write the metrics tables (Summary, OpSummary, EngineSummary, Kernel, HbmUsage) of a
    profiling session (default: the latest) into `directory`: Parquet when pyarrow is
    installed, CSV otherwise (or as `format` says). Returns table name -> file path."""
    if format is None:
        try:
            import pyarrow  # noqa: F401
            format = "parquet"
        except ImportError:
            format = "csv"
    if format not in ("csv", "parquet"):
        raise ValueError(f"format must be 'csv' or 'parquet', not {format!r}")
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, rows in metrics(prof).items():
        path = paths[name] = os.path.join(directory, f"{name}.{format}")
        columns = COLUMNS[name]
        if format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.table({c: [row[c] for row in rows] for c in columns})
            pq.write_table(table, path)
        else:
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
    return paths
