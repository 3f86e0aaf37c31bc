"""Debugging stays honest under adaptive eager: print and pdb inside a model's forward."""
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import neuron_eager

SCRIPT = textwrap.dedent("""
    import sys
    import torch, neuron_eager
    from neuron_eager import adaptive

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.lin(x) * 2 + 1)
            y = h * 0.5 - x
            print("inside forward:", repr(float(y.sum())))
            breakpoint()
            return y

    torch.manual_seed(0)
    model = Block().to("neuron")
    x = torch.randn(4, 8, device="neuron")
    if sys.argv[1] == "adaptive":
        adaptive.enable()
    for _ in range(3):  # op by op, then compiled, then from the cache
        model(x)
    if sys.argv[1] == "adaptive":
        print("fused kernels:", adaptive.stats()["fused_kernels"])
""")
# pdb commands typed at each of the three breakpoints
PDB_INPUT = "p repr(float(y.mean()))\np y[0, :3].tolist()\nc\n" * 3


def _run(mode: str, tmp_path) -> list[str]:
    script = tmp_path / "debug_me.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONBREAKPOINT="pdb.set_trace")
    done = subprocess.run([sys.executable, str(script), mode], input=PDB_INPUT, text=True,
                          capture_output=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _values(lines: list[str]) -> list[str]:
    """What print and pdb showed: the forward's prints and pdb's answers, in order."""
    shown = [line.split("inside forward:")[1].strip() for line in lines
             if "inside forward:" in line]
    answers = [line.split("(Pdb) ", 1)[1] for line in lines if line.startswith("(Pdb) ")]
    shown += [a for a in answers if a.strip() and "inside forward:" not in a and ":" not in a]
    return shown


def test_print_and_pdb_show_eager_values_under_adaptive_eager(tmp_path):
    plain, adaptive = _run("plain", tmp_path), _run("adaptive", tmp_path)
    fused = [int(line.split("fused kernels:")[1]) for line in adaptive if "fused kernels:" in line]
    assert fused and fused[0] > 0  # the forward's elementwise tail did fuse
    plain_values = _values(plain)
    assert len(plain_values) == 3 + 3 * 2  # 3 prints, 2 pdb answers at each breakpoint
    assert _values(adaptive) == plain_values  # bit-identical values, as printed


@pytest.mark.parametrize("adaptive", [False, True], ids=["plain", "adaptive"])
def test_a_warning_raised_as_an_error_keeps_its_type(adaptive, monkeypatch):
    """With warnings as errors (pytest -W error), int64 arithmetic that wraps raises the
    same warning class in both modes, inside the block whose filter says so (it runs
    eagerly: Note [int64 runs eagerly]); a warning a region raises at its sync point keeps
    its class too (it came as a RuntimeError)."""
    from neuron_eager.adaptive import launch
    from neuron_eager.ops import numerics

    monkeypatch.setattr(numerics, "_wrap_warned", set())
    x = torch.full((4,), 2 ** 30, device="neuron", dtype=torch.int64)
    with neuron_eager.adaptive_eager(adaptive):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(UserWarning, match="left the int32 range"):
                (x + 1) * 2
            numerics._wrap_warned.clear()
            with pytest.raises(UserWarning, match="left the int32 range"):
                x.clone().mul_(4)  # (in place too)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert ((x + 1) * 4).tolist() == [4] * 4  # (wrapped; silent, as asked)
    if not adaptive:
        return
    monkeypatch.setattr(launch, "_run_ops", _warning_kernel)
    with neuron_eager.adaptive_eager(), warnings.catch_warnings():
        warnings.simplefilter("error")
        y = torch.ones(4, device="neuron") * 2
        with pytest.raises(UserWarning, match="simulated"):
            y.tolist()


def _warning_kernel(*args):
    warnings.warn("simulated kernel warning", UserWarning)


@pytest.mark.parametrize("leaving", [True, False])
def test_a_block_whose_pending_ops_fail_still_restores_the_mode(leaving, monkeypatch):
    """Entering a plain-eager block or leaving an adaptive one runs what is pending; when
    that raises (a warning as an error here), the mode is still the one the blocks ask for."""
    from neuron_eager import adaptive
    from neuron_eager.adaptive import launch

    monkeypatch.setattr(launch, "_run_ops", _warning_kernel)
    x = torch.ones(4, device="neuron")
    assert not adaptive.is_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if leaving:
            with pytest.raises(UserWarning, match="simulated"):
                with neuron_eager.adaptive_eager():
                    y = x * 4  # noqa: F841  (pending: runs, and warns, at the block's end)
            assert not adaptive.is_enabled()
        else:
            with neuron_eager.adaptive_eager():
                y = x * 4  # noqa: F841
                with pytest.raises(UserWarning, match="simulated"):
                    with neuron_eager.adaptive_eager(False):
                        pytest.fail("entered")
                assert adaptive.is_enabled()  # the outer block's mode
                with neuron_eager.adaptive_eager(False):
                    assert not adaptive.is_enabled()
                assert adaptive.is_enabled()
            assert not adaptive.is_enabled()
    assert not adaptive.recording._installed


STEPPING = textwrap.dedent("""
    import sys
    import torch, neuron_eager
    if sys.argv[1] == "adaptive":
        neuron_eager.adaptive.enable()
    x = torch.ones(3, device=sys.argv[2])
    (x * 2).exp().cpu()
    breakpoint()
    y = x * 2
    z = y.exp()
    w = (z + 1).sum()
    print("done", w.item())
""")


@pytest.mark.parametrize("mode", ["plain", "adaptive"])
def test_pdb_steps_over_an_op_as_on_the_cpu(mode, tmp_path):
    # (Note [Debuggers step over the device] in ops/sourceline.py): `s` on a line with one op
    # went through the dispatcher and the kernels, 206 steps to the next line
    script = tmp_path / "step_me.py"
    script.write_text(STEPPING)
    env = dict(os.environ, PYTHONBREAKPOINT="pdb.set_trace")
    shown = {}
    for device in ("cpu", "neuron"):
        done = subprocess.run([sys.executable, str(script), mode, device],
                              input="n\ns\ns\np z.sum().item()\nc\n", text=True,
                              capture_output=True, env=env, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        shown[device] = [line for line in done.stdout.splitlines() if line.startswith("-> ")
                         or line.startswith("(Pdb) ") and "> " not in line]
    # (`n` over the first op, which shows the device the debugger; then `s` steps line by line)
    assert shown["neuron"] == shown["cpu"] and "-> w = (z + 1).sum()" in shown["cpu"]


def test_a_complex_scalar_raises_eagers_error():
    # (recording cast the scalar before any dtype check: a TypeError of its own)
    x = torch.ones(3, device="neuron")
    with neuron_eager.adaptive_eager():
        for op in (lambda: x * 1j, lambda: torch.mul(x, 2j), lambda: 1j + x,
                   lambda: x == 1j):
            with pytest.raises(RuntimeError, match="Trainium has no complex dtypes"):
                op()
