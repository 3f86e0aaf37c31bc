"""Adaptive eager's HBM: a region's memory goes back as plain eager's does (first sightings run
op by op and free as they go; a failed region frees at once)."""
import pytest
import torch

import neuron_eager
from neuron_eager import adaptive
from neuron_eager.adaptive import launch
from neuron_eager.ops import tensor as T

N = torch.device("neuron")

pytestmark = pytest.mark.usefixtures("plain_after")


def test_a_failed_region_frees_its_memory_at_once(monkeypatch):
    # its error's traceback held run_region's frame, which held the error: a cycle that kept
    # the region's memory until the garbage collector ran (a retry after OOM failed again)
    import gc

    def failing(region, values, g, *let_go):
        values[g.nodes[0]] = T.new_contiguous((1 << 16,), torch.float32)
        raise RuntimeError("simulated kernel failure")

    x = torch.randn(1 << 16).to(N)
    adaptive.enable()
    before = torch.neuron.memory_allocated()
    monkeypatch.setattr(launch, "_run_ops", failing)
    gc.disable()
    try:
        try:
            ((x * 2) + 1).sum().item()
        except RuntimeError as e:
            assert "simulated kernel failure" in str(e)
        assert torch.neuron.memory_allocated() == before
    finally:
        gc.enable()
    assert "failed: RuntimeError" in adaptive.explain(1)  # the failed region is shown


def test_an_op_by_op_run_frees_intermediates_as_it_goes():
    # a first sighting runs op by op; it held every intermediate until the region ended, so
    # a long chain that fits in plain eager ran out of HBM
    def chain(x):
        for _ in range(10):
            x = x * 1.01 + 0.001
        return x.sum(-1).item()

    peaks = []
    for mode in (False, True):
        (adaptive.enable if mode else adaptive.disable)()
        x = torch.randn(1 << 16).to(N)
        torch.neuron.synchronize()
        torch.neuron.reset_peak_memory_stats()
        base = torch.neuron.memory_allocated()
        chain(x)
        peaks.append(torch.neuron.max_memory_allocated() - base)
    assert adaptive.stats()["unfused_ops"] > 0  # (it ran op by op)
    assert peaks[1] <= peaks[0]


def test_an_op_by_op_backward_lets_saved_activations_go_as_it_goes():
    # autograd releases each saved activation once its node has run (recorded, here); the
    # region still held them all until it ended, one tensor past plain eager's peak
    def loss(x):
        h = x
        for _ in range(6):
            h = (h * 1.01).tanh()
        return h.sum()  # (only autograd holds the activations now)

    peaks = []
    for mode in (False, True):
        (adaptive.enable if mode else adaptive.disable)()
        x = torch.randn(1 << 16).to(N).requires_grad_()
        torch.neuron.synchronize()
        torch.neuron.reset_peak_memory_stats()
        base = torch.neuron.memory_allocated()
        loss(x).backward()
        torch.neuron.synchronize()
        peaks.append(torch.neuron.max_memory_allocated() - base)
    assert adaptive.stats()["unfused_ops"] > 0  # (a first sighting: op by op)
    assert peaks[1] <= peaks[0]


def test_out_of_memory_in_a_fused_group_keeps_the_ops_before_it():
    # Note [Out of memory in a fused group]: as in plain eager, x.add_(1) takes effect and
    # the error comes from the op that does not fit
    import gc

    from neuron_eager.device_sim import core

    hbm = core.hbm
    source = torch.randn(512, 1024)  # 2 MiB

    def attempt(adaptive_on):
        x = source.to("neuron")
        with neuron_eager.adaptive_eager(adaptive_on):
            try:
                x.add_(1)
                y = x * 2
                z = y + 1
                w = z.exp()
                (w - y).cpu()  # five 2 MiB tensors at once in plain eager: more than 8 MiB
            except torch.OutOfMemoryError:
                pass
        y = z = w = None  # noqa: F841
        gc.collect()
        return (x.cpu() - source).mean().item()

    gc.collect()
    hbm.empty_cache()
    old = hbm.capacity
    hbm.set_capacity(hbm.reserved + 8 * 2**20)
    try:
        plain = [attempt(False) for _ in range(3)]
        fused = [attempt(True) for _ in range(3)]  # fused from the second sighting
    finally:
        gc.collect()
        hbm.empty_cache()
        hbm.set_capacity(old)
    assert plain == [1.0] * 3 and fused == plain


def test_plans_of_shapes_that_never_repeat_stay_within_their_op_budget(monkeypatch):
    # Note [The plan cache's size]: a buffer growing each step makes a new plan every step
    from neuron_eager.adaptive import fusion

    monkeypatch.setattr(fusion, "_plans", {})
    monkeypatch.setattr(fusion, "plan_ops", 0)
    monkeypatch.setattr(fusion, "_PLAN_OPS_LIMIT", 100)

    def step(n):
        x = torch.arange(float(n), device=N)
        return ((x * 0.5 + 1).sigmoid() * x - 2).tanh().sum().item()

    expected = [step(n) for n in range(1, 40)]
    adaptive.enable()
    held = []
    for n in range(1, 40):
        assert step(n) == expected[n - 1]
        held.append(fusion.plan_ops)
    assert max(held) <= 100 and len(fusion._plans) < 39
