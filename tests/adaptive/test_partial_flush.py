"""Reading one pending tensor runs only what it needs (Note [Partial flush])."""
import faulthandler

import pytest
import torch

from neuron_eager import adaptive
from neuron_eager.adaptive import fusion, recording

from test_adaptive import same_bits

N = torch.device("neuron")


def program(x, w):
    a = x * 2 + 1
    b = (w - 3).exp()  # independent of `a`
    first = a.sum().item()  # runs a's chain only
    c = a * b + w  # reads a (computed) and b (still pending)
    w.mul_(0.5)  # in place on an input that b read before
    return first, c, b, w


def test_a_read_runs_only_its_dependencies_and_results_match():
    x = torch.randn(4, 5, device=N)
    w0 = torch.randn(4, 5, device=N)
    adaptive.disable()
    expected = program(x, w0.clone())
    adaptive.enable()
    saved = recording.options.compile_after
    recording.options.compile_after = 1
    try:
        for _ in range(3):
            adaptive.reset_stats()
            got = program(x, w0.clone())
            assert recording._region.nodes  # b's chain and the rest are still pending
            assert got[0] == expected[0]
            for g, e in zip(got[1:], expected[1:]):
                same_bits(g.cpu(), e.cpu())
            reasons = adaptive.stats()["flush_reasons"]
            # .item() ran a's 3 ops alone; c.cpu() ran c and b; w.cpu() the update of w
            assert reasons == {"aten::_local_scalar_dense": 1, "aten::_to_copy": 2}
            assert [count for _, count, *_ in list(fusion.history)[-3:]] == [3, 4, 1]
    finally:
        recording.options.compile_after = saved
        adaptive.disable()


def test_events_streams_and_memory_queries_run_recorded_work():
    x = torch.randn(1 << 12, device=N)
    adaptive.enable()
    try:
        start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
        start.record()
        y = (x * 2 + 1).relu()
        end.record()  # the region runs before the event is placed on the clock
        assert not recording._region.nodes
        assert start.elapsed_time(end) > 0
        before = torch.neuron.memory_allocated()
        z = y * 3  # pending: no memory yet
        assert torch.neuron.memory_allocated() == before + z.numel() * 4  # the query ran it
        w = z - 1
        with torch.neuron.stream(torch.neuron.Stream()):  # a stream change is a boundary
            assert not recording._region.nodes
        assert torch.equal(w.cpu(), (x.cpu() * 2 + 1).relu() * 3 - 1)
    finally:
        adaptive.disable()


def test_a_view_read_later_keeps_its_layout():
    """Reading a view of a pending result runs it alone; the ops still pending read the view
    through a stand-in that must have the view's strides and offset, not a new layout."""
    def program():
        torch.manual_seed(0)
        h = torch.tanh(torch.randn(8, 8, device=N))
        v = h[2:6, 0:4]
        w = torch.where(v > 0, v, v * 0.5)
        v.cpu()  # runs tanh and the view only
        return w.cpu()

    adaptive.disable()
    expected = program()
    with adaptive.adaptive_eager():
        for _ in range(3):
            same_bits(program(), expected)


def test_ops_left_by_a_read_run_at_the_next_read():
    """A loop that updates three tensors a step and reads one: the others' updates stay
    pending through one read, not more, so the regions repeat (and fuse) instead of growing
    until the buffer limit runs a region that never repeats op by op."""
    def steps(tensors, n):
        firsts = []
        for _ in range(n):
            for t in tensors:
                t.mul_(0.9).add_(1.0).sqrt_()
            firsts.append(tensors[0][0].item())  # reads the first tensor only
        return firsts

    start = [torch.rand(16, device=N) for _ in range(3)]
    adaptive.disable()
    expected_tensors = [t.clone() for t in start]
    expected = steps(expected_tensors, 30)
    with adaptive.adaptive_eager():
        tensors = [t.clone() for t in start]
        got = steps(tensors, 10)
        adaptive.reset_stats()
        got += steps(tensors, 20)
        stats = adaptive.stats()
        assert len(recording._region.nodes) <= 6  # the last step's two other updates
        assert "buffer limit" not in stats["flush_reasons"]
        assert stats["unfused_ops"] == 0 and stats["fused_kernels"] == 20
    assert got == expected
    for g, e in zip(tensors, expected_tensors):
        same_bits(g.cpu(), e.cpu())


def test_detach_of_a_pending_view_left_by_a_partial_flush(plain_after):
    """The view's base became a region input when x's chain ran: detach() looped forever
    (under the recording lock, so Ctrl-C could not stop it) reading that input's number as a
    node's."""
    x0 = torch.arange(24.0).view(4, 6)
    adaptive.enable()
    x = x0.to(N) * 2
    v = x[1:3]
    first = x.cpu()[0]
    faulthandler.dump_traceback_later(120, exit=True)  # (a hang ends the run, with its stack)
    try:
        d = v.detach()
    finally:
        faulthandler.cancel_dump_traceback_later()
    d.add_(1)  # (an update through the detached view is seen by x and v, as in eager)
    same_bits(first, x0[0] * 2)
    same_bits(d.cpu(), x0[1:3] * 2 + 1)
    same_bits(x.cpu(), torch.cat([x0[:1] * 2, x0[1:3] * 2 + 1, x0[3:] * 2]))


def test_views_of_pending_tensors_are_inference_tensors_exactly_when_eager_makes_them(
        plain_after):
    """As the views plain eager makes (views.normal_views_of): inside inference_mode a view of
    a normal pending tensor is normal; outside, a view of a pending inference tensor is one,
    so in-place updates through it and saving it for backward raise."""
    for mode in ("plain", "adaptive"):
        adaptive.enable() if mode == "adaptive" else adaptive.disable()
        x = torch.arange(6.0, device=N) * 1
        with torch.inference_mode():
            views = [x[0:3], x.detach(), x.view(2, 3).t()]
            y = x * 2
        assert [v.is_inference() for v in views] == [False] * 3, mode
        same_bits(views[2].cpu(), torch.arange(6.0).view(2, 3).t())
        v, d = y[0:3], y.detach()
        assert v.is_inference() and d.is_inference(), mode
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
            v.add_(1)
        w = torch.ones(6, device=N, requires_grad=True)
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved"):
            (w * d).sum().backward()
