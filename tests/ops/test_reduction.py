import re

import numpy as np
import pytest
import torch

import neuron_eager
from neuron_eager.ops import reduction
from checks import check_op, lane_sums

FLOATS = [torch.float32, torch.bfloat16]
aten = torch.ops.aten


def _inputs(dtype):
    """Contiguous, transposed, sliced and expanded inputs (CPU), all 3-D."""
    base = torch.randn(4, 6, 5)
    return {
        "contiguous": base.to(dtype),
        "transposed": base.to(dtype).transpose(0, 2),
        "sliced": torch.randn(8, 6, 10).to(dtype)[::2, :, 1::2],
        "expanded": torch.randn(4, 1, 5).to(dtype).expand(4, 6, 5),
    }


DIMS = [None, 0, -1, (0, 2), (-1, 1), ()]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "expanded"])
def test_sum_mean_layouts_and_dims(dtype, layout, seed):
    x = _inputs(dtype)[layout]
    for dim in DIMS:
        for keepdim in (False, True):
            if dim is None:
                check_op(torch.sum, x)
                check_op(torch.mean, x)
                continue
            check_op(lambda t: t.sum(dim, keepdim=keepdim), x)
            check_op(lambda t: t.mean(dim, keepdim=keepdim), x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_min_family(dtype, seed):
    for x in _inputs(dtype).values():
        check_op(torch.amax, x)
        check_op(lambda t: t.amin((0, -1), keepdim=True), x)
        check_op(torch.max, x)
        check_op(torch.min, x)
        check_op(lambda t: t.max(-2), x)
        check_op(lambda t: t.min(0, keepdim=True), x)
        check_op(torch.argmax, x)
        check_op(lambda t: t.argmin(1), x)
        check_op(lambda t: t.argmax(-1, keepdim=True), x)
        check_op(lambda t: t.argmax(keepdim=True), x)


def test_max_nan_and_ties(seed):
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, float("nan"), 5.0, float("nan")],
                      [-1.0, -1.0, -4.0, -4.0]])
    check_op(lambda t: t.max(1), x)
    check_op(lambda t: t.min(1), x)
    check_op(lambda t: t.argmax(1), x)
    check_op(lambda t: t.argmin(1), x)
    check_op(lambda t: t.amax(1), x)
    check_op(torch.max, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1000, 5000])
def test_max_of_long_rows_takes_the_first_extreme(dtype, n, seed):
    # long rows are searched a group of 64 at a time for their extreme (numerics.first_equal):
    # ties, NaNs and the extreme at or beside a group's edge, zeros of both signs
    x = torch.randint(-40, 40, (12, n)).float()
    x[0, 63] = x[0, 64] = 99.0
    x[1, 64] = x[1, 700] = float("nan")
    x[2, 127] = float("-nan")
    x[3, :] = 0.0
    x[3, ::7] = -0.0
    x[4, :] = -0.0
    x[4, 300] = 0.0
    x[5, -1] = float("inf")
    x[6, 1] = float("nan")
    x[7, 0] = 99.0
    x = x.to(dtype)
    dev = x.to("neuron")
    for fn in ("max", "min"):
        for t, d in ((x, 1), (x.t(), 0)):
            got, want = getattr(t.to("neuron"), fn)(d), getattr(t, fn)(d)
            assert torch.equal(got.indices.cpu(), want.indices), fn
            assert torch.equal(got.values.cpu().view(torch.int16 if dtype == torch.bfloat16
                                                     else torch.int32),
                               want.values.view(torch.int16 if dtype == torch.bfloat16
                                                else torch.int32)), fn  # (bits: zeros' signs)
    assert torch.equal(dev.argmax(1).cpu(), x.argmax(1))
    assert torch.equal(dev.argmin(1).cpu(), x.argmin(1))
    assert torch.equal(dev[8:].argmax().cpu(), x[8:].argmax())


def test_integer_and_bool_dtypes(seed):
    i = torch.randint(-50, 50, (6, 7))
    b = torch.rand(6, 7) > 0.5
    for t in (i, b):  # integers and bools sum, multiply and accumulate to int64
        check_op(torch.sum, t)
        check_op(lambda u: u.sum(1), t)
        check_op(lambda u: u.prod(0), t)
        check_op(lambda u: u.cumsum(0), t)
        check_op(torch.any, t)
        check_op(lambda u: u.all(1), t)
    check_op(lambda u: u.amax(1), i)
    check_op(lambda u: u.max(0), i)
    check_op(torch.argmin, i)
    check_op(lambda u: u.sum(0), i.to(torch.int8))
    with pytest.raises(RuntimeError, match="does not support bool"):
        b.to("neuron").argmax()
    check_op(lambda u: u.t().sum(0, dtype=torch.float32), i)
    check_op(lambda u: u.mean(dtype=torch.float32), i)
    check_op(lambda u: u.sum(dtype=torch.int64), torch.randn(5, 3) * 4)
    check_op(lambda u: u.sum(1, dtype=torch.float32), torch.randn(5, 3).bfloat16())


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0")
@pytest.mark.parametrize("dtype", FLOATS)
def test_var_std(dtype, seed):
    for x in _inputs(dtype).values():
        check_op(torch.var, x)
        check_op(lambda t: t.std(1), x)
        check_op(lambda t: t.var((0, 2), correction=0, keepdim=True), x)
        check_op(lambda t: torch.var_mean(t, -1, correction=2), x)
        check_op(lambda t: torch.std_mean(t, (0, 1)), x)
    one = torch.randn(3, 1).to(dtype)
    check_op(lambda t: t.var(1), one)  # n - correction == 0: NaN, as on CPU


def test_var_large_offset_is_accurate(seed):
    # a naive sum of squares would lose all digits; a sequential fp32 mean of 1e5 values near
    # 1e4 was off by 0.05, and the variance of this noise came out 20x too large
    x = torch.randn(100_000) * 0.01 + 10000.3
    exact_var, exact_mean = torch.var_mean(x.double())
    var, mean = torch.var_mean(x.to("neuron"))
    torch.testing.assert_close(var.cpu().double(), exact_var, rtol=2e-3, atol=0)
    torch.testing.assert_close(mean.cpu().double(), exact_mean, rtol=1e-6, atol=0)
    check_op(torch.var, x, rtol=2e-2, atol=0)  # (the CPU's own error is ~1% here)
    columns = x.view(1000, 100).t()  # strided rows
    torch.testing.assert_close(torch.std(columns.to("neuron"), 1).cpu().double(),
                               torch.std(columns.double(), 1), rtol=2e-2, atol=0)
    constant = torch.full((1000,), 1234.567)
    assert torch.std(constant.to("neuron")).item() == torch.std(constant).item() == 0


@pytest.mark.parametrize("dtype", FLOATS)
def test_prod_any_all_count(dtype, seed):
    x = (torch.rand(5, 6) + 0.5).to(dtype)
    check_op(torch.prod, x)
    check_op(lambda t: t.prod(-1, keepdim=True), x.t())
    z = torch.randint(0, 3, (4, 5)).to(dtype)
    check_op(torch.any, z)
    check_op(torch.all, z)
    check_op(lambda t: t.any(1), z)
    check_op(lambda t: t.all(-2, keepdim=True), z)
    check_op(lambda t: aten.any.dims(t, [0, 1]), z)
    check_op(lambda t: aten.all.dims(t, []), z)  # no dims: elementwise truth
    check_op(lambda t: torch.count_nonzero(t, 1), z)
    check_op(torch.count_nonzero, z)


def test_any_all_keep_uint8():
    u = torch.tensor([[0, 2], [0, 0]], dtype=torch.uint8)
    check_op(lambda t: t.any(1), u)
    check_op(torch.all, u)


@pytest.mark.parametrize("dtype", FLOATS)
def test_logsumexp_and_norms(dtype, seed):
    x = (torch.randn(4, 9) * 3).to(dtype)
    check_op(lambda t: t.logsumexp(1), x)
    check_op(lambda t: t.logsumexp((0, 1), keepdim=True), x.t())
    for ord in (2, 1, float("inf"), float("-inf"), 0, 3, 0.5):
        check_op(lambda t: torch.linalg.vector_norm(t, ord), x)
        check_op(lambda t: torch.linalg.vector_norm(t, ord, dim=0, keepdim=True), x)
    check_op(lambda t: torch.linalg.vector_norm(t, dtype=torch.float32), x)
    check_op(lambda t: t.norm(), x)
    check_op(lambda t: aten.norm.ScalarOpt_dim(t, 1, [1]), x)


def test_logsumexp_infinities_and_ints():
    x = torch.tensor([[float("-inf"), float("-inf")], [float("inf"), 1.0], [2.0, 3.0]])
    check_op(lambda t: t.logsumexp(1), x)
    check_op(lambda t: t.logsumexp(0), torch.arange(6).reshape(2, 3))  # ints -> float


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_cumsum_cumprod(dtype, seed):
    x = (torch.rand(4, 6) + 0.5) * 2
    x = x.to(dtype)
    check_op(lambda t: t.cumsum(1), x)
    check_op(lambda t: t.cumsum(-2), x.t())
    check_op(lambda t: t.cumprod(0), x[:, ::2])
    check_op(lambda t: t.cumsum(0, dtype=torch.float32), x)
    big = torch.randn(600, 700).to(dtype).to("neuron")  # rows shared between cores
    for dim in (1, 0):
        whole = big.cumsum(dim).cpu()
        alone = [row.cumsum(0).cpu() for row in big.unbind(1 - dim)]  # one row at a time
        assert torch.equal(whole, torch.stack(alone, 1 - dim))


@pytest.mark.parametrize("dtype", FLOATS)
def test_sort_topk(dtype, seed):
    x = torch.randperm(40).reshape(5, 8).to(dtype)  # distinct values: tie order is moot
    check_op(lambda t: t.sort(), x)
    check_op(lambda t: t.sort(0, descending=True), x)
    check_op(lambda t: t.t().sort(-1), x)
    check_op(lambda t: t.topk(3), x)
    check_op(lambda t: t.topk(2, 0, largest=False), x)
    check_op(lambda t: t.argsort(1, descending=True), x)


def test_stable_sort_and_nan(seed):
    ties = torch.randint(0, 4, (3, 20))
    check_op(lambda t: t.sort(stable=True), ties)
    check_op(lambda t: t.sort(dim=1, descending=True, stable=True), ties)
    check_op(lambda t: t.argsort(stable=True), ties.float())
    nan = torch.tensor([3.0, float("nan"), -1.0, float("inf"), float("nan"), 0.0])
    check_op(lambda t: t.sort(stable=True), nan)
    check_op(lambda t: t.sort(descending=True, stable=True), nan)
    check_op(lambda t: t.topk(3), nan)
    check_op(lambda t: t.sort(), torch.rand(7) > 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_float_sorts_keep_ties_zeros_and_nans_in_the_stable_order(dtype):
    # Note [Sorting float keys]: -0.0 ties +0.0, NaNs of either sign tie above +inf; rows
    # enough to be shared between cores, and a transposed input
    x = torch.randint(-3, 4, (64, 2048)).float()
    zeros = x == 0
    x[zeros] = torch.where(torch.rand(int(zeros.sum())) < 0.5, 0.0, -0.0)
    x[:, ::97] = float("nan")
    x[:, 5::101] = -float("nan")
    x[:, 7::89] = float("inf")
    x = x.to(dtype)
    for t, dim in ((x, 1), (x.t(), 0)):
        for descending in (False, True):
            got = torch.sort(t.to("neuron"), dim=dim, descending=descending)
            ref = torch.sort(t, dim=dim, descending=descending, stable=True)
            assert torch.equal(got.indices.cpu(), ref.indices)
            bits = torch.int32 if dtype == torch.float32 else torch.int16
            assert torch.equal(got.values.cpu().view(bits), ref.values.view(bits))


# by insertion up to 64, in a heap up to a quarter of the row, by sorting above
@pytest.mark.parametrize("k", [1, 5, 64, 65, 75, 76, 150])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_is_the_head_of_the_stable_sort(k, largest, seed):
    # ties, NaN and an ascending run (selection's worst case): the first k of the stable sort
    x = torch.randint(0, 20, (6, 300)).float()
    x[:, ::37] = float("nan")
    x[0] = torch.arange(300.0)
    for t, dim in ((x, 1), (x.t(), 0), (x.to(torch.int32), 1)):
        top = torch.topk(t.to("neuron"), k, dim, largest)
        ordered = torch.sort(t, dim=dim, descending=largest, stable=True)  # the CPU's
        assert torch.equal(top.indices.cpu(), ordered.indices.narrow(dim, 0, k))
        torch.testing.assert_close(top.values.cpu(), ordered.values.narrow(dim, 0, k),
                                   rtol=0, atol=0, equal_nan=True)


def test_scalars():
    s = torch.tensor(2.5)
    for fn in (torch.sum, torch.amax, torch.argmax, torch.prod, torch.any,
               lambda t: t.max(0), lambda t: t.sum(-1), lambda t: t.cumsum(0),
               lambda t: t.sort(0), lambda t: t.topk(1), lambda t: t.logsumexp(0)):
        check_op(fn, s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_selections_of_a_scalar_with_k_at_the_edge(dtype):
    # a 0-dim topk(x, 0) is (x, 0) on the CPU: k counts nothing there
    s = torch.tensor(2.5).to(dtype)
    for fn in (lambda t: t.topk(0), lambda t: t.topk(0, -1, largest=False, sorted=False),
               lambda t: t.topk(1, 0), lambda t: t.kthvalue(1), lambda t: t.sort(0)):
        check_op(fn, s)


def test_empty_inputs():
    e = torch.empty(0, 3)
    check_op(torch.sum, e)  # 0
    check_op(lambda t: t.sum(0), e)  # zeros(3)
    check_op(torch.prod, e)  # 1
    check_op(lambda t: t.amax(1), e)  # shape [0]
    check_op(lambda t: t.logsumexp(0), e)  # -inf
    check_op(lambda t: t.cumsum(0), e)
    check_op(lambda t: t.sort(1), e)
    check_op(torch.any, e)
    for fn, err in [(torch.amax, RuntimeError), (lambda t: t.amax(0), IndexError),
                    (torch.max, RuntimeError), (lambda t: t.max(0), IndexError),
                    (torch.argmax, IndexError)]:
        with pytest.raises(err) as cpu_err:
            fn(e)
        with pytest.raises(err, match=re.escape(str(cpu_err.value))):
            fn(e.to("neuron"))


def test_errors_match_cpu():
    x = torch.randn(3, 4)
    i = torch.arange(6)
    for fn in [lambda t: t.sum(2), lambda t: t.sum((0, -2)), lambda t: t.amax(-3),
               lambda t: t.topk(5), lambda t: t.max(4)]:
        with pytest.raises((IndexError, RuntimeError)) as cpu_err:
            fn(x)
        with pytest.raises(cpu_err.type, match=re.escape(str(cpu_err.value))):
            fn(x.to("neuron"))
    for fn in [torch.mean, torch.var, torch.linalg.vector_norm]:
        with pytest.raises(RuntimeError) as cpu_err:
            fn(i)
        with pytest.raises(RuntimeError, match=re.escape(str(cpu_err.value))):
            fn(i.to("neuron"))


def test_out_arguments(seed):
    x = torch.randn(4, 5)
    d = x.to("neuron")
    out = torch.empty(4).to("neuron")
    torch.sum(d, 1, out=out)
    torch.testing.assert_close(out.cpu(), x.sum(1))
    values, indices = torch.empty(5).to("neuron"), torch.empty(5, dtype=torch.long).to("neuron")
    torch.max(d, 0, out=(values, indices))
    expected = x.max(0)
    torch.testing.assert_close(values.cpu(), expected.values)
    torch.testing.assert_close(indices.cpu(), expected.indices)


def test_bf16_rounds_once(seed):
    x = torch.randn(4096).bfloat16()
    # accumulate the bf16 values in fp32, round the total once
    expected = x.float().sum().bfloat16()
    assert torch.equal(x.to("neuron").sum().cpu(), expected)


def test_long_rows_stay_accurate(seed):
    x = torch.randn(3, 100_000)
    check_op(lambda t: t.sum(1), x, rtol=1e-5, atol=1e-3)
    check_op(lambda t: t.mean(1), x)
    columns = torch.randn(100_000, 3)  # summed column by column, memory read in order
    check_op(lambda t: t.sum(0), columns, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("layout", ["contiguous", "strided", "gathered", "by column"])
@pytest.mark.parametrize("n", [8 * 1024 + 300, 100, 7])
def test_sums_add_in_the_lane_order(layout, n, seed):
    # two whole blocks and a part, one part block with a partial lane group, fewer than 64
    x = torch.randn(32, n) * 10 ** (6 * torch.rand(32, n) - 3)  # any other order rounds otherwise
    rows = x.numpy()
    if layout == "contiguous":
        got = x.to("neuron").sum(1)
    elif layout == "strided":
        got = x.t().contiguous().to("neuron").t().sum(1)
    elif layout == "by column":  # rows adjacent in memory: walked side by side
        got = x.t().contiguous().to("neuron").sum(0)
    else:  # two reduced dims that do not merge: offsets from a table
        if n % 4:
            pytest.skip("needs n divisible by 4")
        y = x.reshape(32, 4, n // 4).transpose(1, 2).contiguous().to("neuron")
        got = y.sum((1, 2))
        rows = x.reshape(32, 4, n // 4).transpose(1, 2).reshape(32, n).numpy()
    ref = lane_sums(rows)
    assert np.array_equal(got.cpu().numpy(), ref)
    if layout == "contiguous":
        assert torch.equal(x.to("neuron").mean(1).cpu(), torch.from_numpy(ref) / n)
    if n > 64:
        one_chain = np.cumsum(rows.astype(np.float32), axis=1, dtype=np.float32)[:, -1]
        assert not np.array_equal(one_chain, ref)  # else the test could not see the order


@pytest.mark.parametrize("shared", [True, False])
def test_whole_tensor_sums_add_their_blocks_in_order(shared, seed, monkeypatch):
    # its blocks summed a share per core (Note [Blocks side by side] in ops/reduction.py), or
    # all on one core, with a partial last block
    monkeypatch.setattr(reduction, "BLOCKS_SPLIT_MIN", 1 << 18 if shared else 1 << 40)
    n = 70 * 4096 + 300
    x = torch.randn(n) * 10 ** (6 * torch.rand(n) - 3)
    ref = lane_sums(x.numpy()[None])[0]
    assert x.to("neuron").sum().item() == ref
    assert torch.equal(x.to("neuron").mean().cpu(), torch.tensor(ref / np.float32(n)))
    assert x.to("neuron").reshape(10, -1).sum().item() == ref  # (the same one row)


def test_sums_over_contiguous_runs_add_in_the_lane_order(seed):
    # dims (0, 2) of (3, 32, 8320): each row is 3 contiguous runs (a multiple of 64 long),
    # read run by run; a block of 4096 ends inside a run
    x = torch.randn(3, 32, 8320) * 10 ** (6 * torch.rand(3, 32, 8320) - 3)
    got = x.to("neuron").sum((0, 2))
    rows = x.permute(1, 0, 2).reshape(32, -1).numpy()
    assert np.array_equal(got.cpu().numpy(), lane_sums(rows))
    nchw = torch.randn(4, 8, 16, 16)  # BatchNorm's statistics: same bits from any layout
    dev = nchw.to("neuron")
    assert torch.equal(dev.mean((0, 2, 3)).cpu(),
                       dev.contiguous(memory_format=torch.channels_last).mean((0, 2, 3)).cpu())
    torch.testing.assert_close(dev.mean((0, 2, 3)).cpu(), nchw.mean((0, 2, 3)))


def test_gradients(seed):
    x = torch.randn(4, 6, requires_grad=True)
    check_op(lambda t: t.sum(1), x, grad=True)
    check_op(lambda t: t.t().mean(0, keepdim=True), x, grad=True)
    check_op(lambda t: t.amax(1), x, grad=True)
    check_op(lambda t: t.var(0), x, grad=True)
    check_op(lambda t: t.logsumexp(1), x, grad=True)
    check_op(lambda t: torch.linalg.vector_norm(t, dim=1), x, grad=True)
    check_op(lambda t: t.cumsum(1), x, grad=True)


def test_launches_run_on_vector_engine(seed):
    core = neuron_eager.device_sim.core
    x = torch.randn(8, 16).to("neuron")
    core.reset_counters()
    x.sum(1)
    x.amax(0)
    x.var(1)
    assert core.launches_by_engine["vector"] == 3
    assert core.elements_by_engine["vector"] == 3 * x.numel()


def test_var_with_no_degrees_of_freedom_warns_as_the_cpu():
    for fn, name in ((lambda t: t.var(), "var"), (lambda t: t.std(), "std"),
                     (lambda t: t.var(correction=3), "var"),
                     (lambda t: torch.std_mean(t)[0], "std_mean"),
                     (lambda t: torch.var_mean(t.view(1, 1), dim=1)[0], "var_mean")):
        for device in ("cpu", "neuron"):
            with pytest.warns(UserWarning, match=rf"^{name}\(\): degrees of freedom is <= 0"):
                result = fn(torch.ones(1, device=device))
            assert torch.isnan(result.cpu()).all() or torch.isinf(result.cpu()).all()
