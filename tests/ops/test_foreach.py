"""aten._foreach_* ops (ops/foreach.py): optimizer steps and clip_grad_norm_ match the CPU."""
import os
import subprocess
import sys

import pytest
import torch

import neuron_eager
from checks import NEURON, check_op

SHAPES = [(4, 3), (5,), (2, 3, 2), ()]


def _params(device, dtype=torch.float32):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s).to(dtype).to(device)) for s in SHAPES]


def _train(make_opt, device, dtype=torch.float32, steps=3, clip=None):
    params = _params(device, dtype)
    opt = make_opt(params)
    for step in range(steps):
        torch.manual_seed(100 + step)
        for p in params:
            p.grad = torch.randn(p.shape).to(dtype).to(device)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        opt.step()
    return params


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True,
                                               weight_decay=0.01, foreach=True),
    "sgd_maximize": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5, dampening=0.1,
                                               maximize=True, foreach=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True),
    "adam_all": lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True, maximize=True,
                                            weight_decay=0.1, foreach=True),
    "adam_wd": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, foreach=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True),
    "adamw_all": lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True, maximize=True,
                                              weight_decay=0.1, foreach=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_step_matches_cpu(name):
    expected = _train(OPTIMIZERS[name], "cpu", clip=1.0)
    neuron_eager.clear_op_tracking()
    actual = _train(OPTIMIZERS[name], NEURON, clip=1.0)
    assert neuron_eager.get_fallback_ops() == {}
    executed = neuron_eager.get_executed_ops()
    assert any("_foreach_" in op for op in executed), executed
    for a, e in zip(actual, expected):
        assert a.device.type == "neuron"
        torch.testing.assert_close(a.detach().cpu(), e.detach(), rtol=1e-5, atol=1e-5)


def test_adam_bfloat16_matches_cpu():
    make = OPTIMIZERS["adam_all"]
    expected = _train(make, "cpu", torch.bfloat16)
    neuron_eager.clear_op_tracking()
    actual = _train(make, NEURON, torch.bfloat16)
    assert neuron_eager.get_fallback_ops() == {}
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.detach().cpu(), e.detach(), rtol=2e-2, atol=2e-2)


def test_clip_grad_norm(seed):
    grads = [torch.randn(s) * 3 for s in SHAPES]
    for norm_type in (2.0, 1.0, float("inf")):
        cpu = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads]
        dev = [torch.nn.Parameter(torch.zeros(g.shape, device=NEURON)) for g in grads]
        for p, q, g in zip(cpu, dev, grads):
            p.grad, q.grad = g.clone(), g.to(NEURON)
        neuron_eager.clear_op_tracking()
        total = torch.nn.utils.clip_grad_norm_(dev, 1.0, norm_type=norm_type, foreach=True)
        assert neuron_eager.get_fallback_ops() == {}
        expected = torch.nn.utils.clip_grad_norm_(cpu, 1.0, norm_type=norm_type, foreach=True)
        torch.testing.assert_close(total.cpu(), expected)
        for p, q in zip(cpu, dev):
            torch.testing.assert_close(q.grad.cpu(), p.grad)


def _lists(n=3, dtype=torch.float32, positive=False):
    out = [torch.randn(s).to(dtype) for s in SHAPES[:n]]
    return [t.abs() + 0.5 for t in out] if positive else out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foreach_binary_and_ternary(dtype, seed):
    a, b, c = _lists(dtype=dtype), _lists(dtype=dtype), _lists(dtype=dtype, positive=True)
    scalars = [0.5, -2.0, 3.0]
    for name in ("add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max"):
        op, op_ = getattr(torch, f"_foreach_{name}"), getattr(torch, f"_foreach_{name}_")
        check_op(lambda x, y: op(x, y), a, c)
        check_op(lambda x: op(x, 1.5), a)
        check_op(lambda x: op(x, scalars), a)

        def inplace(x, y):
            x = [t.clone() for t in x]
            op_(x, y)
            return x

        check_op(inplace, a, c)
        check_op(lambda x: inplace(x, 0.25), a)
        check_op(lambda x: inplace(x, scalars), a)
    check_op(lambda x, y: torch._foreach_add(x, y, alpha=-0.5), a, b)
    check_op(lambda x, s: torch._foreach_mul(x, s), a, torch.tensor(2.5))
    check_op(lambda x: torch._foreach_pow(x, 2.0), c)
    check_op(lambda x, y: torch._foreach_pow(x, y), c, b)
    check_op(lambda y: torch._foreach_pow(2.0, y), b)
    for name in ("addcmul", "addcdiv"):
        op, op_ = getattr(torch, f"_foreach_{name}"), getattr(torch, f"_foreach_{name}_")
        check_op(lambda x, y, z: op(x, y, z, value=0.3), a, b, c)
        check_op(lambda x, y, z: op(x, y, z, scalars), a, b, c)
        check_op(lambda x, y, z, s: op(x, y, z, s), a, b, c, torch.tensor(scalars))

        def inplace3(x, y, z, v):
            x = [t.clone() for t in x]
            op_(x, y, z, v)
            return x

        check_op(lambda x, y, z: inplace3(x, y, z, scalars), a, b, c)
    check_op(lambda x, y: torch._foreach_lerp(x, y, 0.3), a, b)
    check_op(lambda x, y, w: torch._foreach_lerp(x, y, w), a, b, _lists(dtype=dtype))


def test_foreach_unary_and_misc(seed):
    a, c = _lists(), _lists(positive=True)
    for name in ("sqrt", "neg", "abs", "reciprocal", "sign", "rsqrt"):
        op, op_ = getattr(torch, f"_foreach_{name}"), getattr(torch, f"_foreach_{name}_")
        check_op(op, c)

        def inplace(x):
            x = [t.clone() for t in x]
            op_(x)
            return x

        check_op(inplace, c)
    check_op(lambda x: torch._foreach_norm(x), a)
    check_op(lambda x: torch._foreach_norm(x, 1), a)
    check_op(lambda x: torch._foreach_max(x), a)

    def copy_zero(x, y):
        x = [t.clone() for t in x]
        torch._foreach_copy_(x, y)
        torch._foreach_zero_(x[:1])
        return x

    check_op(copy_zero, a, c)


def test_foreach_errors():
    a = [torch.ones(2, device=NEURON)]
    with pytest.raises(RuntimeError, match="same number of tensors"):
        torch._foreach_add(a, a + a)
    with pytest.raises(RuntimeError, match="at least one tensor"):
        torch._foreach_mul([], 2.0)


# -- multi-tensor launches (ops/multitensor.py) ----------------------------------------------
def _launches(fn):
    from neuron_eager.device_sim import core

    before = core.kernels_launched
    fn()
    return core.kernels_launched - before


def test_a_foreach_op_is_one_launch_with_the_per_tensor_bits(seed):
    a, b = _lists(), _lists(positive=True)
    x, y = [t.to(NEURON) for t in a], [t.to(NEURON) for t in b]
    y1 = [u + 1 for u in y]
    one_by_one = [torch.addcdiv(t, u, u1, value=-0.3) for t, u, u1 in zip(x, y, y1)]
    assert _launches(lambda: torch._foreach_addcdiv_(x, y, y1, -0.3)) == 1
    torch._foreach_addcdiv_(a, b, [u + 1 for u in b], -0.3)
    for got, each, expected in zip(x, one_by_one, a):
        assert torch.equal(got.cpu(), each.cpu())
        torch.testing.assert_close(got.cpu(), expected)
    assert _launches(lambda: torch._foreach_sqrt(y)) == 1
    # a 0-dim tensor (a scalar parameter) is a row of the launch like the others
    s, s_cpu = torch.tensor(1.5, device=NEURON), torch.tensor(1.5)
    assert _launches(lambda: torch._foreach_mul_(x + [s], 0.5)) == 1
    torch._foreach_mul_(a + [s_cpu], 0.5)
    for got, expected in zip(x + [s], a + [s_cpu]):
        torch.testing.assert_close(got.cpu(), expected)
    # a list off the fast path (a transposed tensor) runs tensor by tensor, right
    z = [y[0].t(), y[1]]
    assert _launches(lambda: torch._foreach_mul_(z, 2.0)) == 2
    torch.testing.assert_close(z[0].cpu(), (b[0] * 2).t())


def test_foreach_lists_that_alias_update_in_order(seed):
    a, b = _lists(2), _lists(2)
    x, y = [t.to(NEURON) for t in a], [t.to(NEURON) for t in b]
    torch._foreach_add_([x[0], x[0]], [y[0], y[0]], alpha=0.5)  # the same tensor twice
    torch._foreach_add_([x[1], y[1]], [y[1], x[1]])  # each reads the other's update
    torch._foreach_add_([a[0], a[0]], [b[0], b[0]], alpha=0.5)
    torch._foreach_add_([a[1], b[1]], [b[1], a[1]])
    for got, expected in zip(x + y, a + b):
        torch.testing.assert_close(got.cpu(), expected)


def test_a_foreach_op_that_fails_on_one_tensor_leaves_what_the_cpu_leaves():
    """The CPU updates the tensors before the one it refuses; so do we (tensor by tensor)."""
    cpu = [torch.ones(3), torch.ones(2), torch.ones(2, dtype=torch.int64)]
    dev = [t.to(NEURON) for t in cpu]
    for lists in (cpu, dev):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
            torch._foreach_div_(lists, 3.0)
    for got, expected in zip(dev, cpu):
        assert torch.equal(got.cpu(), expected)
    # a scalar of a list that the second call refuses; an op without an in-place aten op
    ints = [torch.arange(3, dtype=torch.int32), torch.arange(2, dtype=torch.int32)]
    floats = [torch.full((3,), -2.5), torch.full((2,), 0.5)]
    for lists, others in ((ints, floats), ([t.to(NEURON) for t in ints],
                                           [t.to(NEURON) for t in floats])):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Int"):
            torch._foreach_sub_(lists, [1, 2.5])
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Int"):
            torch._foreach_minimum_(lists, others)
        assert [t.tolist() for t in lists] == [[-1, 0, 1], [0, 1]]


def _tables(monkeypatch) -> list:
    """Records, per multi-tensor launch, whether it ran as one address table."""
    from neuron_eager.ops import multitensor

    ran, real = [], multitensor._run_table

    def spy(*args):
        out = real(*args)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(multitensor, "_run_table", spy)
    return ran


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_an_address_table_gives_each_tensor_the_cpus_bits(dtype, monkeypatch, seed):
    """Rows of every size (0-dim, empty, views at an offset into one storage) in one table."""
    base = torch.randn(3, 8) * 4
    shapes = [(4, 3), (), (0, 2), (7,)]
    cpu = [(torch.randn(s) * 4).to(dtype) for s in shapes] + [base[1].to(dtype),
                                                             base[2].to(dtype)]
    other = [(torch.rand(t.shape) * 3 + 1).to(dtype) for t in cpu]
    block = torch.stack(cpu[-2:]).to(NEURON)  # the last two rows share one storage
    dev, other_dev = [t.to(NEURON) for t in cpu[:-2]] + [block[0], block[1]], \
        [t.to(NEURON) for t in other]
    ran = _tables(monkeypatch)
    if dtype.is_floating_point:
        for lists in (cpu, dev):
            torch._foreach_addcmul_(lists, lists, [o for o in (other if lists is cpu
                                                               else other_dev)], value=-0.75)
    for lists, others in ((cpu, other), (dev, other_dev)):
        torch._foreach_mul_(lists, 3)
        torch._foreach_add_(lists, others, alpha=2)
    for got, expected in zip(dev, cpu):
        assert torch.equal(got.cpu(), expected)
    new_dev, new_cpu = torch._foreach_sub(dev, other_dev), torch._foreach_sub(cpu, other)
    for got, expected in zip(new_dev, new_cpu):
        assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected)
    assert ran and all(ran), ran


def test_an_address_table_is_refused_where_its_rows_differ(monkeypatch, seed):
    """Rows that one plan does not fit run tensor by tensor, with the CPU's results: scalars
    of a list that differ (-0.0 is not 0.0), a row reading its own output where row 0 reads
    another tensor, formats that differ."""
    cpu = [torch.rand(5) + 0.5, torch.rand(3) + 0.5]
    dev = [t.to(NEURON) for t in cpu]
    ran = _tables(monkeypatch)
    for lists in (cpu, dev):
        signs = torch._foreach_mul(lists, [0.0, -0.0])
        assert torch.equal(torch.signbit(signs[1]).cpu(), torch.ones(3, dtype=torch.bool))
        torch._foreach_add_(lists, [lists[0].clone(), lists[1]])
        torch._foreach_add_(lists, [lists[0], lists[1].clone()])
    for got, expected in zip(dev, cpu):
        assert torch.equal(got.cpu(), expected)
    mixed = [dev[0], dev[1].to(torch.bfloat16)]
    torch._foreach_mul_(mixed, 2.0)
    torch.testing.assert_close(mixed[1].cpu(), (cpu[1] * 2).to(torch.bfloat16))
    assert ran == [False, False, False, False], ran


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_shared_0_dim_tensor_is_one_value_for_every_row(dtype, monkeypatch, seed):
    """clip_grad_norm_'s `_foreach_mul_(grads, clip_coef)`: the 0-dim tensor is read by the
    kernel, cast first where TensorIterator casts it (int64 257 is bf16's 256 in an add; mul
    reads fp32 1.0035 whole), and a list that updates it runs tensor by tensor."""
    cpu, z = [torch.randn(s).to(dtype) for s in [(64, 3), (5,), (0,)]], torch.tensor(1.0035)
    dev, z_dev = [t.to(NEURON) for t in cpu], z.to(NEURON)
    ran = _tables(monkeypatch)
    torch._foreach_mul_(cpu, z)
    torch._foreach_mul_(dev, z_dev)
    n, n_dev = torch.tensor(257), torch.tensor(257, device=NEURON)
    new_cpu, new_dev = torch._foreach_add(cpu, n), torch._foreach_add(dev, n_dev)
    # a 0-dim call promotes with the shared one as tensors with dims do: bf16 * fp32 is fp32
    scalar = torch.tensor(1.5).to(dtype)  # (with a 0-dim call the calls run one by one)
    mixed_cpu, mixed_dev = torch._foreach_mul([cpu[0], scalar], z), \
        torch._foreach_mul([dev[0], scalar.to(NEURON)], z_dev)
    assert ran == [True, True, False], ran
    writes_z_cpu, writes_z_dev = [z.clone(), cpu[0]], [z_dev.clone(), dev[0]]
    torch._foreach_mul_(writes_z_cpu, writes_z_cpu[0])  # (the second row reads z squared)
    torch._foreach_mul_(writes_z_dev, writes_z_dev[0])
    assert ran[3] is False
    for got, expected in zip([*dev, *new_dev, *writes_z_dev, *mixed_dev],
                             [*cpu, *new_cpu, *writes_z_cpu, *mixed_cpu]):
        assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foreach_norm_gives_each_tensor_its_per_tensor_bits(dtype, monkeypatch, seed):
    from neuron_eager.ops import folds

    cpu = [torch.randn(s).to(dtype) for s in [(64, 33), (7,), (), (300_000,)]]
    dev = [t.to(NEURON) for t in cpu]
    ran, real = [], folds.norms_of
    monkeypatch.setattr(folds, "norms_of", lambda *a: ran.append(real(*a)) or ran[-1])
    for ord in (2, 1.0, float("inf")):
        together = torch._foreach_norm(dev, ord)
        each = [torch.linalg.vector_norm(t, ord) for t in dev]
        for got, alone, expected in zip(together, each, torch._foreach_norm(cpu, ord)):
            assert got.dtype == expected.dtype and got.shape == ()
            assert torch.equal(got.cpu(), alone.cpu())
            torch.testing.assert_close(got.cpu(), expected, rtol=2e-2 if dtype != torch.float32
                                       else 1e-5, atol=0)
    assert [r is not None for r in ran] == [True, True, False]


_NAN_SIGNS = """
import torch, neuron_eager
values = [0.5, float("-inf"), 1.0, -1e30, 2.0, 3.0, 4.0, 5.0, -2.0, -1.0, float("nan")]
for dtype, bits in ((torch.float32, torch.int32), (torch.float16, torch.int16)):
    dev = [torch.tensor(values[:k], dtype=dtype, device="neuron") for k in (8, 11, 3)]
    dev.append(torch.full((3,), -float("inf"), dtype=dtype, device="neuron"))
    for got, t in zip(torch._foreach_log1p(dev), dev):
        assert torch.equal(got.cpu().view(bits), torch.log1p(t).cpu().view(bits)), (got, t)
print("same bits")
"""


def test_nan_signs_of_a_table_are_the_per_tensor_kernels():
    """log1p(-inf) multiplied two NaNs, whose sign the table's vector loop and the per-tensor
    loop took from different operands; a NaN result is now the one constant. (Vector loops
    need a process without the tests' bounds checks, which keep loops scalar.)"""
    env = dict(os.environ, NUMBA_BOUNDSCHECK="0")
    run = subprocess.run([sys.executable, "-c", _NAN_SIGNS], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0 and "same bits" in run.stdout, run.stderr[-2000:]


def test_large_tensors_of_a_table_run_alone_when_no_row_reads_another(monkeypatch, seed):
    """A tensor of SPLIT_MIN elements or more runs its own (shared-between-cores) loop and
    the rest the table (Note [Large tensors in a table]), unless an update is what another
    row reads: then list order matters and the calls run one by one."""
    from neuron_eager.ops import workers

    big = workers.SPLIT_MIN + 3
    cpu = [torch.randn(5, 3), torch.randn(big), torch.randn(7)]
    other = [torch.rand(t.shape) + 0.5 for t in cpu]
    dev, other_dev = [t.to(NEURON) for t in cpu], [t.to(NEURON) for t in other]
    ran = _tables(monkeypatch)
    for lists, others in ((cpu, other), (dev, other_dev)):
        torch._foreach_addcmul_(lists, others, others, value=-0.5)
        torch._foreach_mul_(lists, 1.5)
    roots = torch._foreach_sqrt(other_dev)  # (the engines' sqrt: the per-tensor op's bits)
    assert ran == [True, True, True], ran
    for got, expected in zip([*dev, *roots], [*cpu, *[torch.sqrt(t).cpu() for t in other_dev]]):
        assert torch.equal(got.cpu(), expected)
    # the first row reads the large row's first 15 elements before that row's update
    for lists in (cpu, dev):
        torch._foreach_add_(lists, [lists[1][:15].view(5, 3), lists[1].new_ones(big),
                                    lists[2] * 0])
    assert ran[-1] is False
    for got, expected in zip(dev, cpu):
        assert torch.equal(got.cpu(), expected)
