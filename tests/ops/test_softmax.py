import pytest
import torch
import torch.nn.functional as F

from checks import assert_close, check_op
from neuron_eager.device_sim import core

FLOATS = [torch.float32, torch.bfloat16]
aten = torch.ops.aten


def _x(shape, dtype=torch.float32, scale=3.0):
    return (torch.randn(shape) * scale).to(dtype).requires_grad_()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
def test_softmax_dims_of_non_contiguous_3d(fn, dim, dtype, seed):
    x = _x((5, 6, 7), dtype)
    check_op(lambda t: fn(t.permute(2, 0, 1), dim), x, grad=True)  # non-contiguous
    check_op(lambda t: fn(t, dim), x, grad=True)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
def test_float16(fn, seed):
    check_op(lambda t: fn(t, -1), _x((4, 33), torch.float16), grad=True)
    check_op(lambda t: fn(t.t(), 0), _x((8, 5), torch.float16), grad=True)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
def test_layouts(fn, seed):
    x = _x((6, 8))
    check_op(lambda t: fn(t[1::2, ::3], -1), x, grad=True)  # sliced rows and columns
    check_op(lambda t: fn(t.unsqueeze(1).expand(6, 4, 8), 1), x, grad=True)  # stride-0 dim
    check_op(lambda t: fn(t.unsqueeze(1).expand(6, 4, 8), 2), x, grad=True)
    # outer dims that cannot be merged into one: the kernel runs on a contiguous copy
    y = _x((3, 4, 5, 6))
    check_op(lambda t: fn(t.permute(2, 0, 3, 1), 2), y, grad=True)
    check_op(lambda t: fn(t.permute(0, 2, 1, 3), 1), y, grad=True)


def test_scalar_and_empty(seed):
    check_op(lambda t: F.softmax(t, 0), torch.tensor(1.5, requires_grad=True), grad=True)
    check_op(lambda t: F.log_softmax(t, -1), torch.tensor(1.5, requires_grad=True), grad=True)
    check_op(lambda t: F.softmax(t, 1), torch.empty(0, 4))
    check_op(lambda t: F.log_softmax(t, 0), torch.empty(3, 0))


def test_extreme_values():
    x = torch.tensor([[1e4, 0.0, -1e4], [88.0, 89.0, 90.0], [-float("inf"), 0.0, 1.0],
                      [-float("inf")] * 3, [float("nan"), 0.0, 1.0], [float("inf"), 0.0, 1.0]])
    check_op(lambda t: F.softmax(t, -1), x)
    check_op(lambda t: F.log_softmax(t, -1), x)
    check_op(lambda t: F.softmax(t, 0), x)


def test_dtype_argument(seed):
    x = _x((4, 9), torch.bfloat16)
    check_op(lambda t: F.softmax(t, -1, dtype=torch.float32), x, grad=True)
    check_op(lambda t: F.log_softmax(t, 0, dtype=torch.float32), x, grad=True)
    check_op(lambda t: torch.softmax(t, 1, dtype=torch.float64), _x((3, 5)))


@pytest.mark.parametrize("op", [aten._softmax, aten._log_softmax])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_to_float(op, dtype, seed):
    # The CPU has no half_to_float: the reference is the fp32 op on the widened input.
    x = _x((5, 16), dtype)
    dx = x.detach().to("neuron").requires_grad_()
    y = op(dx, -1, True)
    assert y.dtype == torch.float32
    ref = op(x.float(), -1, False)
    assert_close(y, ref, msg="forward")
    g = torch.randn(5, 16)
    ref.backward(g)
    y.backward(g.to("neuron"))
    assert dx.grad.dtype == dtype
    assert_close(dx.grad, x.grad, msg="grad")


def test_backward_ops_directly(seed):
    y = F.softmax(torch.randn(4, 6, 5), 1)
    ly = F.log_softmax(torch.randn(4, 6, 5), 1)
    g = torch.randn(4, 6, 5)
    for dim in [0, 1, 2]:
        check_op(lambda a, b: aten._softmax_backward_data(a, b, dim, torch.float32), g, y)
        check_op(lambda a, b: aten._log_softmax_backward_data(a, b, dim, torch.float32), g, ly)
    check_op(lambda a, b: aten._softmax_backward_data(a.transpose(0, 2), b.transpose(0, 2), 1,
                                                      torch.float32), g, y)


def test_safe_softmax():
    inf = float("inf")
    x = torch.tensor([[0.0, -inf, 1.0], [-inf, -inf, -inf], [2.0, 2.0, -inf]])
    check_op(lambda t: aten._safe_softmax(t, -1), x)
    check_op(lambda t: aten._safe_softmax(t, 0), x)
    check_op(lambda t: aten._safe_softmax(t, -1, dtype=torch.float32), x.bfloat16())


def test_attention_masked_softmax(seed):
    q, k = torch.randn(2, 3, 8, 4), torch.randn(2, 3, 8, 4)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    check_op(lambda a, b, m: F.softmax((a @ b.transpose(-1, -2)).masked_fill(~m, -float("inf")),
                                       -1), q, k, mask)


def test_errors_match_cpu():
    x = torch.randn(3, 4).to("neuron")
    with pytest.raises(IndexError, match="Dimension out of range"):
        F.softmax(x, 2)
    with pytest.raises(IndexError, match="Dimension out of range"):
        F.log_softmax(torch.tensor(1.0).to("neuron"), 1)
    with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
        F.softmax(torch.arange(4).to("neuron"), 0)
    with pytest.raises(RuntimeError, match="conversion is supported for Half type only"):
        aten._softmax(x, 0, True)


def test_one_launch_per_kernel(seed):
    x = torch.randn(16, 32).to("neuron").requires_grad_()
    for fn, engines in [(F.softmax, ("scalar", "vector")), (F.log_softmax, ("scalar", "scalar"))]:
        before = core.kernels_launched, core.launches_by_engine["scalar"]
        y = fn(x, -1)
        assert (core.kernels_launched, core.launches_by_engine["scalar"]) == \
            (before[0] + 1, before[1] + 1)
        g = torch.ones(16, 32).to("neuron")
        before = core.kernels_launched, core.launches_by_engine[engines[1]]
        y.backward(g)
        assert core.kernels_launched - before[0] >= 1
        assert core.launches_by_engine[engines[1]] == before[1] + 1
        x.grad = None


@pytest.mark.parametrize("mask_type", [0, 1, 2])
def test_masked_softmax_mask_types(mask_type, seed):
    x = torch.randn(2, 3, 5, 5)
    full = torch.rand(2, 3, 5, 5) > 0.6
    full[..., 0] = False
    full[0, 0, 1] = full[1, 0, 0] = True  # rows masked out entirely: NaN, as on the CPU
    mask = {0: full[0, 0], 1: full[:, 0, 0], 2: full}[mask_type]
    check_op(lambda t, m: torch._masked_softmax(t, m, 3, mask_type), x, mask)
    if mask_type == 2:  # along another dim
        full[:, 0] = False
        check_op(lambda t, m: torch._masked_softmax(t, m, 1, 2), x, full)
