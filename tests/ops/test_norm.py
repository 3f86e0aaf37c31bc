import pytest
import torch
import torch.nn.functional as F
from checks import NEURON, assert_close, check_op

import neuron_eager

aten = torch.ops.aten
FLOATS = [torch.float32, torch.bfloat16]


def _ran(*names):
    """Every op in `names` (aten names without overload) ran on a neuron kernel."""
    ran = {k.split("::")[-1].split(".")[0] for k in neuron_eager.get_executed_ops()}
    missing = set(names) - ran
    assert not missing, f"{missing} did not run on neuron: {sorted(ran)}"


def check_grads_vs_fp32(fn, *args):
    """bf16 on neuron against the same bf16 values computed in fp32 on the CPU.

    Trainium widens to fp32, computes and rounds once; PyTorch's CPU bf16 backward kernels
    for the norms round intermediates (statistics, partial sums) to bf16 and land farther
    from the exact answer than neuron does, so CPU-in-fp32 is the reference here.
    """
    cpu = [a.detach().float().requires_grad_(a.requires_grad) for a in args]
    dev = [a.detach().to(NEURON).requires_grad_(a.requires_grad) for a in args]
    neuron_eager.clear_op_tracking()
    expected, actual = fn(*cpu), fn(*dev)
    assert_close(actual, expected.to(actual.dtype), msg="forward")
    seed = torch.randn(expected.shape).to(actual.dtype)
    expected.backward(seed.float())
    actual.backward(seed.to(NEURON))
    for c, d in zip(cpu, dev):
        if c.requires_grad:
            assert_close(d.grad, c.grad.to(d.dtype), msg="grad")
    assert neuron_eager.get_fallback_ops() == {}


def _params(n, dtype, requires_grad=True):
    shape = n if isinstance(n, tuple) else (n,)
    return (torch.randn(shape, dtype=dtype).requires_grad_(requires_grad),
            torch.randn(shape, dtype=dtype).requires_grad_(requires_grad))


# -- layer norm --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("normalized", [(16,), (6, 16)])
def test_layer_norm(dtype, normalized, seed):
    x = torch.randn(3, 6, 16, dtype=dtype, requires_grad=True)
    w, b = _params(normalized, dtype)

    def ln(x, w, b):
        return F.layer_norm(x, normalized, w, b, eps=1e-5)

    check_op(ln, x, w, b, grad=dtype == torch.float32)
    check_op(lambda x: F.layer_norm(x, normalized), x, grad=dtype == torch.float32)
    if dtype == torch.bfloat16:
        check_grads_vs_fp32(ln, x, w, b)
        check_grads_vs_fp32(lambda x: F.layer_norm(x, normalized), x)
    _ran("native_layer_norm")


def test_layer_norm_module_and_strided_input(seed):
    ln = torch.nn.LayerNorm(8)
    x = torch.randn(8, 5, requires_grad=True)
    check_op(lambda x, w, b: F.layer_norm(x.t(), (8,), w, b), x, ln.weight, ln.bias, grad=True)
    dev_ln = torch.nn.LayerNorm(8).to(NEURON)
    y = dev_ln(torch.randn(2, 8).to(NEURON))
    y.sum().backward()
    assert dev_ln.weight.grad is not None and dev_ln.weight.grad.device.type == "neuron"
    _ran("native_layer_norm", "native_layer_norm_backward")


def test_layer_norm_statistics(seed):
    """mean/rstd are fp32 for 16-bit inputs (like meta and CUDA), with the CPU's values."""
    x = torch.randn(4, 10, dtype=torch.bfloat16)
    out, mean, rstd = aten.native_layer_norm(x.to(NEURON), [10], None, None, 1e-5)
    meta = aten.native_layer_norm(x.to("meta"), [10], None, None, 1e-5)
    assert (mean.dtype, mean.shape, rstd.shape) == (meta[1].dtype, meta[1].shape, meta[2].shape)
    _, cmean, crstd = aten.native_layer_norm(x.float(), [10], None, None, 1e-5)
    assert_close(mean, cmean)
    assert_close(rstd, crstd)


@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_norm_statistics_are_accurate_for_zero_and_large_means(offset, seed):
    """Note [Corrected two-pass statistics]: the saved means of zero-mean rows and channels
    (the common case after a matmul or conv) stay near fp64, as do those of large-mean data."""
    def rel(got, exact):
        return ((got.cpu().double().flatten() - exact).abs().max() / exact.abs().max()).item()

    y = torch.randn(64, 4096) * 0.5 + offset
    _, mean, rstd = aten.native_layer_norm(y.to(NEURON), [4096], None, None, 1e-5)
    y64 = y.double()
    assert rel(mean, y64.mean(1)) < 4e-6
    assert rel(rstd, (y64.var(1, unbiased=False) + 1e-5).rsqrt()) < 1e-6
    x = torch.randn(4, 16, 56, 56) * 0.5 + offset
    _, mean, invstd = aten.native_batch_norm(x.to(NEURON), None, None, None, None, True, 0.1,
                                             1e-5)
    x64 = x.double()
    assert rel(mean, x64.mean((0, 2, 3))) < 4e-6
    assert rel(invstd, (x64.var((0, 2, 3), unbiased=False) + 1e-5).rsqrt()) < 1e-6


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, True),
                                  (True, True, False)])
def test_layer_norm_backward_output_mask(mask, seed):
    x, g = torch.randn(5, 12), torch.randn(5, 12)
    w, b = torch.randn(12), torch.randn(12)
    _, mean, rstd = aten.native_layer_norm(x, [12], w, b, 1e-5)
    check_op(lambda *a: aten.native_layer_norm_backward(*a, list(mask)), g, x, [12], mean,
             rstd, w, b)


def test_layer_norm_float64(seed):
    """float64 computes in fp32 (no fp64 on Trainium); statistics come back as float64."""
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    check_op(lambda x, w: aten.native_layer_norm(x, (6,), w, None, 1e-5), x, w)
    check_op(lambda x, w: F.layer_norm(x, (6,), w), x, w, grad=True)


def test_layer_norm_errors_match_cpu():
    x = torch.randn(3, 4).to(NEURON)
    with pytest.raises(RuntimeError, match="Given normalized_shape"):
        F.layer_norm(x, (5,))
    with pytest.raises(RuntimeError, match="Expected weight to be of same shape"):
        F.layer_norm(x, (4,), torch.ones(3).to(NEURON))


# -- group norm --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_group_norm(dtype, seed):
    x = torch.randn(2, 6, 4, 5, dtype=dtype, requires_grad=True)
    w, b = _params(6, dtype)

    def gn(x, w, b):
        return F.group_norm(x, 3, w, b)

    check_op(gn, x, w, b, grad=dtype == torch.float32)
    check_op(lambda x: F.group_norm(x, 2), x, grad=dtype == torch.float32)
    if dtype == torch.bfloat16:
        check_grads_vs_fp32(gn, x, w, b)
    else:  # no spatial dims: one weight per element, as in layer norm
        check_op(gn, torch.randn(4, 6, requires_grad=True), w, b, grad=True)
    _ran("native_group_norm")


# -- batch norm --------------------------------------------------------------------------
def _bn_step(module_cpu, x, train=True):
    """One forward/backward through a BatchNorm module on CPU and its copy on neuron."""
    dev = type(module_cpu)(module_cpu.num_features, momentum=module_cpu.momentum,
                           track_running_stats=module_cpu.track_running_stats)
    dev.load_state_dict(module_cpu.state_dict())
    dev = dev.to(x.dtype).to(NEURON)
    module_cpu.zero_grad()
    module_cpu.train(train)
    dev.train(train)
    xc = x.detach().requires_grad_()
    xd = x.detach().to(NEURON).requires_grad_()
    yc, yd = module_cpu(xc), dev(xd)
    assert_close(yd, yc, msg="output")
    seed = torch.randn_like(yc)
    yc.backward(seed)
    yd.backward(seed.to(NEURON))
    assert_close(xd.grad, xc.grad, msg="grad input")
    assert_close(dev.weight.grad, module_cpu.weight.grad, msg="grad weight")
    assert_close(dev.bias.grad, module_cpu.bias.grad, msg="grad bias")
    return dev


@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_2d_module(train, seed):
    bn = torch.nn.BatchNorm2d(5, momentum=0.3)
    with torch.no_grad():
        bn.weight.normal_(), bn.bias.normal_()
        bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 2)
    neuron_eager.clear_op_tracking()
    dev = _bn_step(bn, torch.randn(4, 5, 3, 6) * 2 + 1, train)
    # running statistics: updated in place with momentum and the unbiased variance
    assert_close(dev.running_mean, bn.running_mean, msg="running_mean")
    assert_close(dev.running_var, bn.running_var, msg="running_var")
    assert dev.num_batches_tracked.item() == bn.num_batches_tracked.item()
    assert neuron_eager.get_fallback_ops() == {}
    _ran("native_batch_norm", "native_batch_norm_backward")


@pytest.mark.parametrize("shape", [(8, 5), (4, 5, 7)])
def test_batch_norm_1d_module(shape, seed):
    bn = torch.nn.BatchNorm1d(5)
    dev = _bn_step(bn, torch.randn(shape))
    assert_close(dev.running_var, bn.running_var)
    _bn_step(torch.nn.BatchNorm1d(5, track_running_stats=False), torch.randn(shape))
    _bn_step(bn, torch.randn(shape), train=False)


def test_batch_norm_bfloat16(seed):
    x = torch.randn(4, 3, 5, 5, dtype=torch.bfloat16, requires_grad=True)
    w, b = _params(3, torch.bfloat16)
    rm, rv = torch.randn(3, dtype=torch.bfloat16), torch.rand(3, dtype=torch.bfloat16) + 0.5

    def train(x, w, b, rm, rv):
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2), rm, rv

    check_op(train, x, w, b, rm, rv)  # output and the bf16 running stats after the update
    check_op(lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b), x, w, b, rm, rv)
    check_grads_vs_fp32(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                        x, w, b)
    check_grads_vs_fp32(lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b), x, w, b, rm, rv)


def test_batch_norm_channels_last_and_mixed_dtype(seed):
    x = torch.randn(2, 4, 3, 3).to(memory_format=torch.channels_last).requires_grad_()
    w, b = _params(4, torch.float32)
    check_op(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b,
             grad=True)
    xb = torch.randn(6, 4, dtype=torch.bfloat16)  # bf16 input, fp32 parameters and stats
    rm, rv = torch.zeros(4), torch.ones(4)
    check_op(lambda x, w, b, rm, rv: (F.batch_norm(x, rm, rv, w, b, training=True), rm, rv),
             xb, w, b, rm, rv)


def test_native_batch_norm_overloads(seed):
    x, w, b = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)

    def stats():
        return torch.randn(3), torch.rand(3) + 0.5

    def legit(x, w, b, rm, rv):
        return aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.1, 1e-5), rm, rv

    check_op(legit, x, w, b, *stats())
    check_op(lambda *a: aten._native_batch_norm_legit(*a, False, 0.1, 1e-5), x, w, b, *stats())
    check_op(lambda *a: aten._native_batch_norm_legit.no_stats(*a, True, 0.1, 1e-5), x, w, b)
    check_op(lambda *a: aten._native_batch_norm_legit_no_training(*a, 0.1, 1e-5), x, w, b,
             *stats())
    check_op(lambda *a: aten._native_batch_norm_legit_functional(*a, True, 0.1, 1e-5), x, w,
             b, *stats())
    check_op(lambda *a: (aten._batch_norm_with_update(*a, 0.1, 1e-5), a[3], a[4]), x, w, b,
             *stats())
    check_op(lambda *a: aten._batch_norm_no_update(*a, 0.1, 1e-5), x, w, b, *stats())


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False),
                                  (False, True, True)])
def test_native_batch_norm_backward(train, mask, seed):
    x, g, w = torch.randn(3, 4, 6), torch.randn(3, 4, 6), torch.randn(4)
    rm, rv = torch.randn(4), torch.rand(4) + 0.5
    _, save_mean, save_invstd = aten.native_batch_norm(x, w, None, rm.clone(), rv.clone(),
                                                       train, 0.1, 1e-5)
    check_op(lambda *a: aten.native_batch_norm_backward(*a, train, 1e-5, list(mask)), g, x, w,
             rm, rv, save_mean, save_invstd)
    check_op(lambda *a: aten.batch_norm_backward(*a[:-1], train, 1e-5, list(mask), a[-1]), g,
             x, w, rm, rv, save_mean, save_invstd, torch.empty(0, dtype=torch.uint8))


def test_batch_norm_errors_match_cpu():
    x = torch.randn(0, 3, 2).to(NEURON)
    with pytest.raises(RuntimeError, match="input tensor must have at least one element"):
        aten.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        F.batch_norm(torch.randn(1, 3).to(NEURON), None, None, training=True)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_weight_norm_gradients(dim, seed):
    def run(v, g, x):
        w = torch._weight_norm(v, g, dim)
        return (x @ w.t()).pow(2).sum()

    g_shape = {0: (3, 1), 1: (1, 5), -1: (1, 5)}[dim]
    check_op(run, torch.randn(3, 5, requires_grad=True),
             torch.rand(g_shape, requires_grad=True) + 0.5, torch.randn(4, 5), grad=True,
             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [0, -1])
def test_weight_norm_rounds_once_as_the_cpus_fused_kernel(dtype, dim, seed):
    # (torch's decomposition rounded g / |v| to bf16 first: a third of the weights 1 ulp off)
    v = torch.randn(8, 16).to(dtype)
    g = (torch.rand(8, 1) + 0.5).to(dtype) if dim == 0 else (torch.rand(1, 16) + 0.5).to(dtype)
    w = check_op(lambda v, g: torch._weight_norm(v, g, dim), v.requires_grad_(),
                 g.requires_grad_(), grad=True, rtol=0.02 if dtype != torch.float32 else None,
                 atol=0.02 if dtype != torch.float32 else None)
    if dtype != torch.float32:  # (the one rounding hides the norms' fp32 sum order)
        assert torch.equal(w.cpu(), torch._weight_norm(v, g, dim))
