"""The OpInfo conformance runner itself, on a handful of ops."""
import json

import pytest
import torch

import neuron_eager.conformance as conformance
from checks import without_kernel


def test_runner_classifies_and_reports(tmp_path):
    report, table = tmp_path / "report.json", tmp_path / "coverage.md"
    with without_kernel(torch.ops.aten.special_i0e.default):
        code = conformance.main(["--ops", "add,sin,complex,uniform,special.i0e", "--dtypes",
                                 "float32,int32", "--samples", "2", "--out", str(report),
                                 "--coverage-md", str(table)])
    assert code == 0
    data = json.loads(report.read_text())
    status = {(r["op"], r["dtype"]): r["status"] for r in data["results"]}
    assert status["add", "float32"] == "native"
    assert status["sin", "float32"] == "native"
    assert status["complex", "float32"] == "by design"  # needs complex tensors
    assert status["uniform", "float32"] == "native"  # random: compared by metadata
    assert status["special.i0e", "float32"] == "fallback"
    summary = data["summary"]["forward"]
    assert summary["judged"] == sum(summary["counts"][s] for s in
                                    ("native", "fallback", "mismatch", "error"))
    assert 0 < summary["native_rate"] <= summary["with_fallback_rate"] <= 1
    assert "| add | float32 | forward | native |" in table.read_text()


def test_16_bit_results_off_the_cpus_are_judged_by_the_exact_value(monkeypatch):
    """Note [Judged by the exact value]: the CPU's bf16 cross product rounds its products
    to bf16 before subtracting, neuron rounds once; a wrong result still fails."""
    from torch.testing._internal.common_methods_invocations import op_db

    cross = next(info for info in op_db if info.name == "cross")
    result = conformance.check(cross, torch.bfloat16, "forward", 4)
    assert (result.status, result.message) == ("native", conformance._CLOSER_THAN_CPU)
    call = conformance._call_on_neuron
    monkeypatch.setattr(conformance, "_call_on_neuron",
                        lambda *args: call(*args) * 1.05)  # off from both answers
    assert conformance.check(cross, torch.bfloat16, "forward", 4).status == "mismatch"


def test_runner_fails_below_the_floor(tmp_path):
    with without_kernel(torch.ops.aten.special_i0e.default):
        assert conformance.main(["--ops", "special.i0e", "--dtypes", "float32", "--samples",
                                 "1", "--min-native-rate", "0.5"]) == 1


def test_sampled_conformance_stays_above_the_floor(tmp_path):
    """CI's sampled OpInfo pass: fails when the native pass rate drops below the floor."""
    import pathlib

    from torch.testing._internal.common_methods_invocations import op_db

    floor = json.loads((pathlib.Path(__file__).parent / "conformance_floor.json").read_text())
    names = sorted({conformance._op_name(info) for info in op_db})[::floor["every_nth_op"]]
    report = tmp_path / "report.json"
    conformance.main(["--ops", ",".join(names), "--dtypes", floor["dtypes"], "--samples",
                      str(floor["samples"]), "--out", str(report)])
    summary = json.loads(report.read_text())["summary"]["forward"]
    failures = [f"{r['op']}[{r['dtype']}]: {r['status']} {r['message'][:80]}"
                for r in json.loads(report.read_text())["results"]
                if r["status"] in ("mismatch", "error")]
    assert summary["native_rate"] >= floor["forward_native_floor"], failures
    assert summary["with_fallback_rate"] >= floor["forward_with_fallback_floor"], failures


def test_unknown_op_names_and_dtypes_are_refused_with_suggestions(capsys):
    import pytest

    for argv, expected in ((["--ops", "gelu"], "did you mean nn.functional.gelu"),
                           (["--dtypes", "float32,int8"], "int8 is not one of")):
        with pytest.raises(SystemExit) as exit_:
            conformance.main(argv)
        assert exit_.value.code == 2 and expected in capsys.readouterr().err
    assert conformance._dtypes(None, "--dtypes", "bf16,fp32") == [torch.bfloat16, torch.float32]


@pytest.mark.parametrize("args,words", [(["--min-native-rate", "95"], "fraction in [0, 1]"),
                                        (["--samples", "0"], "1 or more"),
                                        # (after the run, the results lost: checked first now)
                                        (["--out", "/proc/nope/x.json"], "cannot make"),
                                        (["--coverage-md", "/"], "a folder, not a file")])
def test_options_out_of_range_are_usage_errors(args, words, capsys):
    with pytest.raises(SystemExit) as stop:
        conformance.main(["--ops", "add", *args])
    assert stop.value.code == 2 and words in capsys.readouterr().err


def test_a_seeded_dropout_is_compared_by_metadata():
    # OpInfo's wrapper_set_seed seeds SDPA with 42 on each call, so two seeds gave the CPU one
    # result and its dropout looked deterministic; the device's generator is not the CPU's
    from torch.testing._internal.common_methods_invocations import op_db

    sdpa = next(info for info in op_db if info.name == "nn.functional.scaled_dot_product_attention")
    assert conformance.check(sdpa, torch.float32, "forward", 4).status == "native"
