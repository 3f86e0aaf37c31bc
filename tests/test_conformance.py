"""The OpInfo conformance runner itself, on a handful of ops."""
import json

import neuron_eager.conformance as conformance


def test_runner_classifies_and_reports(tmp_path):
    report, table = tmp_path / "report.json", tmp_path / "coverage.md"
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


def test_runner_fails_below_the_floor(tmp_path):
    assert conformance.main(["--ops", "special.i0e", "--dtypes", "float32", "--samples", "1",
                             "--min-native-rate", "0.5"]) == 1
