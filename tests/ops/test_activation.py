import pytest
import torch
import torch.nn.functional as F

from checks import check_op
from neuron_eager.device_sim import core

FLOATS = [torch.float32, torch.bfloat16]


def _make(shape, dtype, low=-4.0, high=4.0, grad=False):
    x = (torch.rand(shape) * (high - low) + low).to(dtype)
    return x.requires_grad_(grad)


# (op, low, high): input ranges inside each function's domain and away from overflow.
UNARY = [
    (torch.exp, -4, 4), (torch.exp2, -4, 4), (torch.expm1, -2, 2), (torch.log, 0.1, 5),
    (torch.log2, 0.1, 5), (torch.log10, 0.1, 5), (torch.log1p, -0.9, 4), (torch.tanh, -4, 4),
    (torch.sigmoid, -6, 6), (torch.erf, -3, 3), (torch.erfc, -3, 3), (torch.sin, -6, 6),
    (torch.cos, -6, 6), (torch.tan, -1.2, 1.2), (torch.asin, -0.95, 0.95),
    (torch.acos, -0.95, 0.95), (torch.atan, -4, 4), (torch.sinh, -3, 3), (torch.cosh, -3, 3),
    (torch.asinh, -4, 4), (torch.acosh, 1.1, 5), (torch.atanh, -0.9, 0.9),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op,low,high", UNARY, ids=[u[0].__name__ for u in UNARY])
def test_unary_math(op, low, high, dtype, seed):
    check_op(op, _make((4, 9), dtype, low, high, grad=True), grad=True)


def test_unary_math_float16_and_float64(seed):
    for op in [torch.exp, torch.tanh]:
        check_op(op, _make((16,), torch.float16, -0.5, 2, grad=True), grad=True)
        check_op(op, _make((16,), torch.float64, -0.5, 2))


def test_integer_and_bool_inputs_become_float(seed):
    i = torch.randint(-5, 6, (12,))
    for op in [torch.exp, torch.sigmoid, torch.tanh, torch.sin, torch.erf]:
        assert check_op(op, i).dtype == torch.float32
    check_op(torch.exp, torch.rand(6) > 0.5)
    check_op(torch.log, torch.randint(1, 9, (6,), dtype=torch.int32))


def test_special_values():
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 100.0, -100.0])
    for op in [torch.exp, torch.sigmoid, torch.tanh, torch.erf, torch.log1p, torch.expm1,
               F.relu, F.silu, F.softplus, F.elu, F.hardtanh, F.mish, F.logsigmoid,
               F.hardswish, F.hardsigmoid, F.leaky_relu]:
        check_op(op, x)
    check_op(F.gelu, x[2:])  # the CPU's gelu(inf) is nan, ours inf


ACTIVATIONS = [
    F.relu, F.relu6, F.gelu, lambda t: F.gelu(t, approximate="tanh"), F.silu, F.mish,
    F.softplus, lambda t: F.softplus(t, beta=2.0, threshold=3.0), F.leaky_relu,
    lambda t: F.leaky_relu(t, 0.2), F.elu, lambda t: F.elu(t, alpha=0.5), F.selu, F.celu,
    lambda t: F.celu(t, alpha=2.0), F.hardtanh, lambda t: F.hardtanh(t, -2.0, 0.5),
    F.hardsigmoid, F.hardswish, F.logsigmoid, lambda t: F.threshold(t, 0.5, -1.0),
    F.hardshrink, F.softshrink, lambda t: F.glu(t, 0), F.glu, torch.nn.SiLU(), torch.nn.GELU(),
    torch.nn.Tanh(),
    torch.nn.Sigmoid(),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fn", ACTIVATIONS, ids=range(len(ACTIVATIONS)))
def test_activation_forward_and_grad(fn, dtype, seed):
    check_op(fn, _make((6, 12), dtype, -5, 5, grad=True), grad=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_grad_at_kinks(dtype):
    # the backward formulas' boundary cases (x exactly at a kink) match the CPU's
    x = torch.tensor([-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 20.0], dtype=dtype)
    for fn in [F.relu, F.relu6, F.hardtanh, F.hardsigmoid, F.hardswish, F.leaky_relu, F.elu,
               F.celu, F.hardshrink, F.softshrink, lambda t: F.threshold(t, 1.0, 0.0),
               lambda t: F.softplus(t, threshold=20.0), lambda t: F.softplus(t, beta=2.0)]:
        check_op(fn, x.clone().requires_grad_(), grad=True)


@pytest.mark.parametrize("fn", [F.gelu, F.silu, F.relu, F.softplus, F.hardswish])
def test_activation_float16(fn, seed):
    check_op(fn, _make((33,), torch.float16, -5, 5, grad=True), grad=True)


def test_non_contiguous_inputs(seed):
    x = _make((8, 6), torch.float32, grad=True)
    check_op(lambda t: F.gelu(t.t()), x, grad=True)
    check_op(lambda t: F.silu(t[::2, 1::2]), x, grad=True)
    check_op(lambda t: torch.exp(t.unsqueeze(0).expand(3, 8, 6)), x, grad=True)


def test_inplace_forms(seed):
    def inplace(fn):
        def run(t):
            y = t.clone()
            r = fn(y.t()[1:])  # a strided view of the clone
            assert r.data_ptr() == y.t()[1:].data_ptr()
            return y
        return run

    x = _make((5, 7), torch.float32)
    check_op(inplace(torch.relu_), x)
    check_op(inplace(lambda t: F.silu(t, inplace=True)), x)
    check_op(inplace(lambda t: F.leaky_relu(t, 0.1, inplace=True)), x)
    check_op(inplace(lambda t: F.hardtanh(t, -0.5, 0.5, inplace=True)), x)
    check_op(inplace(lambda t: F.relu6(t, inplace=True)), x)
    check_op(inplace(lambda t: F.elu(t, inplace=True)), x)
    check_op(inplace(torch.sigmoid_), x)
    check_op(inplace(torch.exp_), x.bfloat16())


def test_inplace_activation_grad(seed):
    # autograd saves the result of an in-place relu / elu / leaky_relu (self_is_result paths)
    def f(t, act):
        return act(t * 1.0)

    x = _make((4, 5), torch.float32, grad=True)
    check_op(lambda t: f(t, lambda u: F.relu(u, inplace=True)), x, grad=True)
    check_op(lambda t: f(t, lambda u: F.elu(u, inplace=True)), x, grad=True)
    check_op(lambda t: f(t, lambda u: F.leaky_relu(u, 0.1, inplace=True)), x, grad=True)


def test_integer_activations(seed):
    i = torch.randint(-5, 6, (10,))
    assert check_op(F.relu, i).dtype == torch.int64
    check_op(lambda t: F.hardtanh(t, -2, 3), i.to(torch.int32))
    check_op(lambda t: F.threshold(t, 1, 7), i)


def test_errors_match_cpu():
    dev = torch.device("neuron")
    with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
        F.gelu(torch.arange(3, device=dev))
    with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
        F.silu(torch.arange(3).to(dev))
    with pytest.raises(RuntimeError, match="Boolean inputs not supported for relu"):
        F.relu(torch.ones(3, dtype=torch.bool).to(dev))
    with pytest.raises(RuntimeError, match="approximate argument must be either none or tanh"):
        F.gelu(torch.ones(3).to(dev), approximate="fast")
    with pytest.raises(RuntimeError, match="Halving dimension must be even"):
        F.glu(torch.ones(2, 3).to(dev))
    with pytest.raises(RuntimeError, match="alpha cannot be 0 for CELU"):
        F.celu(torch.ones(3).to(dev), alpha=0.0)
    i = torch.arange(3).to(dev)
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.exp_()
    assert i.cpu().tolist() == [0, 1, 2]


def test_one_scalar_engine_launch_per_activation(seed):
    x = torch.randn(64, 32).to("neuron")
    for fn in [F.gelu, F.silu, torch.exp, torch.tanh, F.relu]:
        before = core.launches_by_engine["scalar"], core.kernels_launched
        fn(x)
        assert (core.launches_by_engine["scalar"], core.kernels_launched) == \
            (before[0] + 1, before[1] + 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [F.silu, F.mish])
def test_composite_backwards_run_one_kernel_rounding_once(fn, dtype, seed):
    # silu_backward and mish_backward decompose above the Python key; ours runs instead (Note
    # [Kernels before decompositions]): one launch, rounded once as on the CPU (decomposed,
    # 16-bit grads came out double-rounded, ~40% of them one ulp off)
    x = _make((2000,), dtype, -6, 6)
    expected = torch.ops.aten.silu_backward if fn is F.silu else torch.ops.aten.mish_backward
    g = torch.randn(2000).to(dtype)
    gn, xn = g.to("neuron"), x.to("neuron")
    before = core.kernels_launched
    got = expected(gn, xn)
    assert core.kernels_launched == before + 1
    assert torch.equal(got.cpu(), expected(g, x))
    xc, xn = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
    fn(xc).sum().backward()
    fn(xn).sum().backward()
    assert torch.equal(xn.grad.cpu(), xc.grad)


@pytest.mark.parametrize("fn", [F.silu, F.mish])
def test_composite_backwards_keep_double_backward(fn, seed):
    x = _make((40,), torch.float32, -4, 4)
    second = []
    for dev in ("cpu", "neuron"):
        t = x.to(dev).requires_grad_()
        (g,) = torch.autograd.grad(fn(t).sum(), t, create_graph=True)
        (gg,) = torch.autograd.grad((g * g).sum(), t)
        second.append(gg.cpu())
    torch.testing.assert_close(second[1], second[0], rtol=1e-5, atol=1e-5)
