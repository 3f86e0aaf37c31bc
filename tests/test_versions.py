"""Version counters: autograd sees in-place writes on neuron as on the CPU, so a tensor saved
for backward and then changed raises instead of giving silently wrong gradients."""
import pytest
import torch

from neuron_eager import adaptive

FOREACH_INPLACE = [
    lambda ts: torch._foreach_add_(ts, 1.0),
    lambda ts: torch._foreach_mul_(ts, [2.0] * len(ts)),
    lambda ts: torch._foreach_addcdiv_(ts, ts, [t + 2 for t in ts], 0.5),
    lambda ts: torch._foreach_lerp_(ts, [t * 0 for t in ts], 0.25),
    lambda ts: torch._foreach_zero_(ts),
    lambda ts: torch._foreach_copy_(ts, [t * 3 for t in ts]),
    lambda ts: torch._foreach_sqrt_(ts),
    lambda ts: torch._foreach_clamp_min_(ts, 0.5),
    lambda ts: torch._foreach_maximum_(ts, [t * 0 for t in ts]),
]


@pytest.fixture(params=["plain", "adaptive"])
def mode(request):
    if request.param == "adaptive":
        adaptive.enable()
    yield request.param
    adaptive.disable()


@pytest.mark.parametrize("k", range(len(FOREACH_INPLACE)))
def test_foreach_inplace_ops_bump_versions_as_on_cpu(mode, k):
    def versions(device):
        ts = [torch.rand(4, device=device) + 0.1, torch.rand(2, 3, device=device) + 0.1]
        before = [t._version for t in ts]
        FOREACH_INPLACE[k](ts)
        return [t._version - b for t, b in zip(ts, before)]

    assert versions("neuron") == versions("cpu")


def _train_then_backward_old_graph(device):
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0], device=device))
    opt = torch.optim.SGD([w], lr=0.5, foreach=True)
    first, second = w.sum(), (w * w).sum()  # the second graph saves w
    first.backward()
    opt.step()  # changes w in place
    w.grad = None
    second.backward()


def test_optimizer_step_on_saved_weights_raises_as_on_cpu(mode):
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _train_then_backward_old_graph("cpu")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _train_then_backward_old_graph("neuron")


def test_foreach_write_into_saved_result_raises(mode):
    a = torch.ones(3, device="neuron", requires_grad=True)
    c = (a * 1).exp()  # exp saves its result
    torch._foreach_mul_([c], 2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        c.sum().backward()
