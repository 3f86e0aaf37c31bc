"""Training loops under adaptive eager: the built-in MLP and nanoGPT-style transformer steps
(neuron_eager.workloads, small sizes) give the same losses, parameters and optimizer moments,
bit for bit, as in plain eager; with compile_after=1 the fused kernels run from the first
step. The chain workloads are checked the same way at their 1K size.
"""
import functools

import pytest

import neuron_eager
from neuron_eager import adaptive, workloads

from test_adaptive import same_bits

STEPS = 4


@pytest.fixture(autouse=True)
def _plain_after():
    adaptive.reset_stats()
    yield
    adaptive.disable()


def train(name: str, size: str, on: bool, steps: int = STEPS):
    """`steps` steps of a fresh build: (outputs per step, final state), on the CPU."""
    with adaptive.adaptive_eager(on):
        step = workloads.get(name, size).make("neuron")
        outputs = [step().cpu() for _ in range(steps)]
        state = [t.detach().cpu() for t in step.state()]
    return outputs, state


@functools.cache
def plain(name: str, size: str):
    return train(name, size, False)


def same_run(got, expected):
    (outputs, state), (outputs_e, state_e) = got, expected
    assert len(outputs) == len(outputs_e) and len(state) == len(state_e)
    for g, e in zip(outputs + state, outputs_e + state_e):
        same_bits(g, e)


@pytest.mark.parametrize("compile_after, record_min", [(2, None), (1, None), (1, 0)])
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_training_steps_same_bits(name, compile_after, record_min, monkeypatch):
    """record_min=0: the optimizer's foreach steps are recorded and fused too, as they are for
    large parameters (Note [Foreach in adaptive eager])."""
    monkeypatch.setattr(adaptive.options, "compile_after", compile_after)
    if record_min is not None:
        monkeypatch.setattr(adaptive.options, "foreach_record_min", record_min)
    neuron_eager.clear_op_tracking()
    got = train(name, "small", True)
    same_run(got, plain(name, "small"))
    assert neuron_eager.get_fallback_ops() == {}
    stats = adaptive.stats()
    assert stats["compile_failures"] == 0
    # the MLP's GELU sits between matmuls alone: only its SGD steps can fuse
    if name == "transformer" or record_min == 0:
        assert stats["ops_recorded"] > 0
        assert stats["fused_kernels"] >= STEPS - compile_after + 1


def test_losses_go_down_and_builds_repeat():
    """The steps train (a sanity check on the workload), and a second build of a workload
    runs the same bits (no global RNG, no state shared between builds)."""
    for name in ("mlp", "transformer"):
        losses, _ = plain(name, "small")
        assert losses[-1].item() < losses[0].item(), (name, losses)
        same_run(train(name, "small", False), plain(name, "small"))


@pytest.mark.parametrize("name", ["gelu", "layernorm", "softmax", "adamw"])
def test_chain_workloads_same_bits(name, monkeypatch):
    monkeypatch.setattr(adaptive.options, "compile_after", 1)
    same_run(train(name, "1K", True, steps=3), train(name, "1K", False, steps=3))
    assert adaptive.stats()["fused_kernels"] >= 3
