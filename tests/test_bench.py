"""`neuron-eager bench` on tiny workloads: every figure in the JSON, the PNG, ratios that
follow from the raw figures, and kernel counts that are the runtime's own."""
import json
import textwrap

import pytest
import torch

import neuron_eager
from neuron_eager import adaptive, bench, cli, workloads
from neuron_eager.device_sim import core

FIGURES = {"steps", "wall_ms", "first_step_s", "compile_s", "launches_per_step",
           "device_ms_per_step", "hbm_mb_moved_per_step", "peak_hbm_mb"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    code = bench.main(["--workloads", "gelu,adamw", "--sizes", "small", "--warmup", "2",
                       "--repeat", "3", "--out", str(out)])
    assert code == 0
    return json.loads((out / "bench.json").read_text()), out


def test_json_has_every_figure_for_every_mode(report):
    data, _ = report
    assert {"machine", "settings", "results"} <= set(data)
    assert [r["workload"] for r in data["results"]] == ["gelu", "adamw"]
    for r in data["results"]:
        assert set(r["modes"]) == set(bench.MODES)
        for mode, figures in r["modes"].items():
            assert set(figures) == FIGURES
            assert figures["steps"] == 3
            wall = figures["wall_ms"]
            assert wall["min"] <= wall["median"] <= wall["max"] and wall["iqr"] >= 0
            device = [figures[k] for k in ("launches_per_step", "device_ms_per_step",
                                           "hbm_mb_moved_per_step", "peak_hbm_mb")]
            if mode == "cpu":
                assert device == [None] * 4
            else:
                assert all(v > 0 for v in device)
        assert r["same_bits"] is True


def test_ratios_follow_from_the_figures(report):
    data, _ = report
    for r in data["results"]:
        p, a = r["modes"]["plain"], r["modes"]["adaptive"]
        ratio = r["ratios"]["adaptive_vs_plain"]
        assert ratio["wall"] == pytest.approx(a["wall_ms"]["median"] / p["wall_ms"]["median"])
        assert ratio["launches"] == pytest.approx(a["launches_per_step"] / p["launches_per_step"])
        assert ratio["device"] == pytest.approx(a["device_ms_per_step"] / p["device_ms_per_step"])
        assert ratio["hbm_moved"] == pytest.approx(
            a["hbm_mb_moved_per_step"] / p["hbm_mb_moved_per_step"])
        cpu = r["modes"]["cpu"]["wall_ms"]["median"]
        assert r["ratios"]["plain_vs_cpu"]["wall"] == pytest.approx(p["wall_ms"]["median"] / cpu)


def test_png_is_written(report):
    _, out = report
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["gelu", "adamw"])
def test_launch_counts_are_the_runtimes_own(report, name):
    """The same step, counted here by the core's launch counter, in both modes."""
    data, _ = report
    r = next(r for r in data["results"] if r["workload"] == name)
    for mode in ("plain", "adaptive"):
        with adaptive.adaptive_eager(mode == "adaptive"):
            step = workloads.get(name, "1K").make("neuron")
            for _ in range(2):  # adaptive eager compiles on the second sighting
                out = step()
                torch.neuron.synchronize()
            before = core.kernels_launched
            out = step()
            torch.neuron.synchronize()
            launched = core.kernels_launched - before
            del out
        assert r["modes"][mode]["launches_per_step"] == launched


def test_user_script(tmp_path):
    script = tmp_path / "my_step.py"
    script.write_text(textwrap.dedent("""
        import torch

        def make(device):
            x = torch.linspace(-3, 3, 256).to(device)
            return lambda: torch.tanh(x * 2 + 1) * 0.5
    """))
    out = tmp_path / "out"
    assert bench.main(["--script", f"{script}:make", "--modes", "plain,adaptive", "--warmup",
                       "2", "--repeat", "2", "--out", str(out), "--no-plot"]) == 0
    data = json.loads((out / "bench.json").read_text())
    (r,) = data["results"]
    assert r["workload"] == "my_step:make" and r["kind"] == "script"
    assert set(r["modes"]) == {"plain", "adaptive"} and r["same_bits"] is True
    assert r["modes"]["adaptive"]["launches_per_step"] < r["modes"]["plain"]["launches_per_step"]
    assert not (out / "bench.png").exists()


def test_an_unseeded_script_with_dropout_computes_the_same_bits_in_every_mode(tmp_path):
    """Note [Each mode its own random stream]: random weights and dropout masks alike."""
    script = tmp_path / "noisy.py"
    script.write_text(textwrap.dedent("""
        import torch

        def step(device):
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3),
                                        torch.nn.Linear(16, 2)).to(device)
            x = torch.randn(4, 8).to(device)
            return lambda: model(x).sum()
    """))
    out = tmp_path / "out"
    assert bench.main(["--script", str(script), "--warmup", "1", "--repeat", "3", "--out",
                       str(out), "--no-plot"]) == 0
    (r,) = json.loads((out / "bench.json").read_text())["results"]
    assert r["workload"] == "noisy:step" and r["same_bits"] is True


def test_bad_arguments_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--sizes", "huge"])
    assert e.value.code == 2
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit) as e:  # (a traceback after the whole run, before)
        bench.main(["--workloads", "gelu", "--out", str(tmp_path / "a_file")])
    assert e.value.code == 2 and "cannot make this folder" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no workload 'nope'"):
        bench.main(["--workloads", "nope", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="has no function 'step'"):
        empty = tmp_path / "empty.py"
        empty.write_text("x = 1\n")
        bench.main(["--script", str(empty), "--out", str(tmp_path)])


def test_cli_dispatches_and_explains(capsys):
    assert cli.main([]) == 0
    assert "bench" in capsys.readouterr().out
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"neuron-eager {neuron_eager.__version__}")


def test_cpu_mode_alone(tmp_path):
    assert bench.main(["--modes", "cpu", "--workloads", "gelu", "--warmup", "0", "--repeat",
                       "1", "--out", str(tmp_path)]) == 0
    (r,) = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert set(r["modes"]) == {"cpu"} and r["ratios"] == {}
    assert (tmp_path / "bench.png").exists()
