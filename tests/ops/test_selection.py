import pytest
import torch

from checks import check_op

DTYPES = [torch.float32, torch.bfloat16, torch.int64]
NAN = float("nan")


def _ties(shape, dtype, high=4):
    """Small integers: many equal elements, so tie indices are exercised."""
    return torch.randint(0, high, shape).to(dtype)


def _with_nans(x):
    x = x.clone()
    x.view(-1)[::7] = NAN
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_cummax_cummin(dtype, seed):
    x = _ties((4, 9), dtype)
    for dim in (0, 1, -1):
        check_op(lambda t: torch.cummax(t, dim), x)
        check_op(lambda t: torch.cummin(t, dim), x)
    check_op(lambda t: torch.cummax(t.t(), 1), x)  # strided rows
    check_op(lambda t: torch.cummin(t, 0), torch.tensor(3, dtype=dtype))
    if dtype.is_floating_point:
        check_op(lambda t: torch.cummax(t, 1), _with_nans(x))
        check_op(lambda t: torch.cummin(t, 1), _with_nans(x))


def test_cummax_backward(seed):
    x = torch.randn(3, 6, requires_grad=True)
    check_op(lambda t: torch.cummax(t, 1).values, x, grad=True)
    check_op(lambda t: torch.cummin(t, 0).values, x, grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logcumsumexp(dtype, seed):
    x = (torch.randn(5, 7) * 4).to(dtype)
    check_op(lambda t: torch.logcumsumexp(t, 1), x)
    check_op(lambda t: torch.logcumsumexp(t, 0), x)
    special = torch.tensor([-float("inf"), 1.0, float("inf"), 2.0, NAN, 0.0]).to(dtype)
    check_op(lambda t: torch.logcumsumexp(t, 0), special)
    check_op(lambda t: torch.logcumsumexp(t, 0), torch.full((4,), -float("inf"), dtype=dtype))


def test_logcumsumexp_backward_and_errors(seed):
    check_op(lambda t: torch.logcumsumexp(t, 1), torch.randn(3, 5, requires_grad=True),
             grad=True)
    with pytest.raises(NotImplementedError, match="logcumsumexp"):
        torch.logcumsumexp(torch.arange(3, device="neuron"), 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_median_kthvalue_mode(dtype, seed):
    x = _ties((5, 23), dtype)
    for dim in (0, 1):
        check_op(lambda t: torch.median(t, dim), x)
        check_op(lambda t: torch.nanmedian(t, dim, keepdim=True), x)
        check_op(lambda t: torch.mode(t, dim), x)
        check_op(lambda t: torch.kthvalue(t, 3, dim), x)
    check_op(torch.median, x)
    check_op(torch.nanmedian, x)
    check_op(lambda t: torch.mode(t.t(), 0), x)
    check_op(lambda t: torch.kthvalue(t, 1, 0), torch.tensor(2, dtype=dtype))


def test_mode_long_rows_follow_introsort(seed):
    # past 16 elements std::sort partitions: which equal element is last in its run changes
    for n in (17, 40, 300):
        check_op(lambda t: torch.mode(t, 1), _ties((4, n), torch.int64, 5))
    check_op(lambda t: torch.mode(t, 0), torch.rand(33) > 0.5)


def test_nan_handling(seed):
    x = _with_nans(torch.randn(4, 10))
    check_op(lambda t: torch.median(t, 1), x)
    check_op(lambda t: torch.nanmedian(t, 1), x)
    check_op(lambda t: torch.kthvalue(t, 9, 1), x)
    check_op(lambda t: torch.mode(t, 1), x)
    check_op(torch.median, x)
    check_op(torch.nanmedian, x)
    check_op(lambda t: torch.nanmedian(t, 0), torch.full((3, 2), NAN))


def test_order_statistic_backward(seed):
    x = torch.randn(4, 7, requires_grad=True)
    check_op(lambda t: torch.median(t, 1).values, x, grad=True)
    check_op(lambda t: torch.nanmedian(t, 0).values, x, grad=True)
    check_op(lambda t: torch.kthvalue(t, 2, 1).values, x, grad=True)
    check_op(lambda t: torch.mode(t, 1).values, x, grad=True)
    check_op(torch.median, x, grad=True)


def test_selection_errors():
    x = torch.randn(3, 4, device="neuron")
    with pytest.raises(RuntimeError, match="out of range"):
        torch.kthvalue(x, 5, 1)
    with pytest.raises(IndexError):
        torch.median(x, 2)
    with pytest.raises(NotImplementedError, match="Bool"):
        torch.median(x > 0, 1)


@pytest.mark.parametrize("dtype", DTYPES + [torch.bool])
def test_unique(dtype, seed):
    x = _ties((3, 4, 5), dtype, 3 if dtype != torch.bool else 2)
    for inverse in (False, True):
        for counts in (False, True):
            check_op(lambda t: torch.unique(t, return_inverse=inverse, return_counts=counts), x)
            check_op(lambda t: torch.unique_consecutive(t, return_inverse=inverse,
                                                        return_counts=counts), x)
    for dim in (0, 1, -1):
        check_op(lambda t: torch.unique(t, dim=dim, return_inverse=True, return_counts=True), x)
        check_op(lambda t: torch.unique_consecutive(t, dim=dim, return_inverse=True,
                                                    return_counts=True), x)
    check_op(lambda t: torch.unique(t, sorted=False), x)
    check_op(lambda t: torch.unique(t.t()), x[0])
    check_op(torch.unique, torch.zeros((), dtype=dtype))
    check_op(lambda t: torch.unique(t, return_counts=True), torch.zeros(0, dtype=dtype))


def test_unique_nan():
    x = torch.tensor([2.0, NAN, 1.0, NAN, 2.0])
    check_op(lambda t: torch.unique(t, return_inverse=True, return_counts=True), x)
    check_op(lambda t: torch.unique_consecutive(t, return_counts=True), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_searchsorted(dtype, seed):
    bd = torch.sort(_ties((10,), dtype, 6)).values
    values = _ties((3, 4), dtype, 7)
    for right in (False, True):
        check_op(lambda b, v: torch.searchsorted(b, v, right=right), bd, values)
        check_op(lambda b, v: torch.searchsorted(b, v, side="right" if right else "left",
                                                 out_int32=True), bd, values)
        check_op(lambda v, b: torch.bucketize(v, b, right=right), values, bd)
    rows = torch.sort(_ties((3, 6), dtype, 6), dim=1).values
    check_op(torch.searchsorted, rows, _ties((3, 5), dtype, 7))
    unsorted = _ties((3, 6), dtype, 6)
    check_op(lambda b, v, s: torch.searchsorted(b, v, sorter=s), unsorted, _ties((3, 2), dtype),
             unsorted.argsort(dim=1, stable=True))
    check_op(lambda b: torch.searchsorted(b, 2), bd)
    check_op(lambda b: torch.bucketize(3, b, right=True), bd)
    check_op(lambda b, v: torch.searchsorted(b, v), bd, torch.zeros(0, dtype=dtype))


def test_searchsorted_mixed_dtypes_and_nan():
    bd = torch.tensor([1.0, 2.0, 2.0, 3.0, NAN])
    check_op(torch.searchsorted, bd, torch.tensor([NAN, 2.0, 0.5, 4.0]))
    check_op(torch.searchsorted, bd, torch.tensor([1, 2, 5]))
    check_op(lambda b: torch.searchsorted(b, 2.5), bd)
    with pytest.raises(RuntimeError):
        torch.searchsorted(bd.to("neuron"), bd.to("neuron"), side="left", right=True)


@pytest.mark.parametrize("bd", [
    torch.tensor([1.0, 1.0009765625, 2.0], dtype=torch.float16),
    torch.tensor([1.0, 1.0078125, 2.0], dtype=torch.bfloat16),
    torch.tensor([0, 5, 200], dtype=torch.uint8),
    torch.tensor([-128, 5, 44, 127], dtype=torch.int8),
], ids=str)
def test_searchsorted_scalar_values_take_the_boundaries_dtype(bd):
    """A Python scalar or a 0-dim value is cast to the boundaries' dtype, as result_type
    ranks it (rounded to fp16/bf16, wrapped to uint8), before it is compared."""
    for v in (1.0001, 1.0005, 1.004, -1, 300, 261, -129, 2.5):
        for right in (False, True):
            check_op(lambda b: torch.searchsorted(b, v, right=right), bd)
            check_op(lambda b: torch.bucketize(v, b, right=right), bd)
            check_op(lambda b, t: torch.searchsorted(b, t, right=right), bd, torch.tensor(v))
            check_op(lambda t, b: torch.bucketize(t, b, right=right), torch.tensor(v), bd)
    # a 1-dim value keeps its own rank: the boundaries are widened to it
    check_op(torch.searchsorted, bd, torch.tensor([1.0005, 300.0]))


def test_isin(seed):
    a, b = torch.randint(0, 9, (4, 5)), torch.randint(0, 9, (6,))
    check_op(torch.isin, a, b)
    check_op(lambda x, y: torch.isin(x, y, invert=True), a.float(), b.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_histc(dtype, seed):
    x = (torch.rand(7, 11) * 20 - 10).to(dtype)
    check_op(torch.histc, x)
    check_op(lambda t: torch.histc(t, bins=10, min=-5, max=5), x)
    check_op(lambda t: torch.histc(t, bins=3, min=0, max=10), x)
    check_op(lambda t: torch.histc(t, bins=4), torch.full((5,), 2.0, dtype=dtype))
    check_op(lambda t: torch.histc(t, bins=4), torch.zeros(0, dtype=dtype))


def test_histc_errors():
    with pytest.raises(NotImplementedError, match="beyond 2"):  # integers counted as fp32
        torch.histc(torch.tensor([1 << 30], device="neuron"))
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(torch.ones(3, device="neuron"), min=2, max=1)
    with pytest.raises(RuntimeError, match="not finite"):
        torch.histc(torch.tensor([1.0, NAN], device="neuron"))


def test_histc_runs_in_deterministic_mode_as_on_the_cpu(seed):
    # (torch's meta kernels took the meta tensor for a CUDA one and refused it there:
    # meta.as_cpu_kernels)
    x = torch.randn(100)
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.equal(torch.histc(x.to("neuron"), 7).cpu(), torch.histc(x, 7))
        assert torch.are_deterministic_algorithms_enabled()  # (and left on)
        for median in (torch.median, torch.nanmedian):
            got, want = median(x.reshape(10, 10).to("neuron"), 1), median(x.reshape(10, 10), 1)
            assert torch.equal(got.values.cpu(), want.values)
            assert torch.equal(got.indices.cpu(), want.indices)
        with pytest.raises(RuntimeError, match="does not have a deterministic"):  # as the CPU
            torch.nn.functional.max_unpool1d(*torch.nn.functional.max_pool1d(
                x.reshape(1, 1, 100).to("neuron"), 2, return_indices=True), 2)
    finally:
        torch.use_deterministic_algorithms(False)


def test_bincount(seed):
    x = torch.randint(0, 8, (30,))
    check_op(torch.bincount, x)
    check_op(lambda t: torch.bincount(t, minlength=12), x.int())
    check_op(torch.bincount, x, torch.rand(30))
    check_op(torch.bincount, x, torch.rand(30).bfloat16())
    check_op(torch.bincount, x, torch.randint(0, 5, (30,)))
    check_op(lambda t: torch.bincount(t, minlength=3), torch.zeros(0, dtype=torch.int64))
    for bad, match in [(torch.tensor([-1, 2]), "non-negative"), (torch.ones(2, 2).long(), "1-d")]:
        with pytest.raises(RuntimeError, match=match):
            torch.bincount(bad.to("neuron"))
    with pytest.raises(RuntimeError, match="same length"):
        torch.bincount(x.to("neuron"), torch.rand(3, device="neuron"))
    for dtype in (torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.float32):
        with pytest.raises(NotImplementedError) as cpu:  # (the CPU takes int8..int64, uint8)
            torch.bincount(x.to(dtype))
        with pytest.raises(NotImplementedError, match=str(cpu.value)):
            torch.bincount(x.to(dtype).to("neuron"))


def test_histogram(seed):
    x, w = torch.randn(6, 5), torch.rand(6, 5)
    for density in (False, True):
        check_op(lambda t: torch.histogram(t, 4, density=density), x)
        check_op(lambda t, u: torch.histogram(t, 7, range=(-1.0, 1.5), weight=u,
                                              density=density), x, w)
        check_op(lambda t, b: torch.histogram(t, b, density=density), x,
                 torch.tensor([-2.0, -0.5, 0.0, 0.3, 2.0]))
    check_op(lambda t: torch.histogram(t, 3), torch.zeros(0))
    check_op(lambda t: torch.histogram(t, 2), torch.full((3,), 1.5))


def test_histogramdd(seed):
    pts, w = torch.randn(20, 3), torch.rand(20)
    check_op(lambda t: torch.histogramdd(t, [2, 3, 4]), pts)
    check_op(lambda t, u: torch.histogramdd(t, [3, 2, 2], range=[-1.0, 1.0, -2.0, 0.5, 0.0, 1.0],
                                            weight=u, density=True), pts, w)
    edges = [torch.tensor([-3.0, 0.0, 3.0]), torch.tensor([-1.0, 1.0]),
             torch.tensor([-2.0, -1.0, 0.5, 2.0])]
    check_op(lambda t, a, b, c: torch.histogramdd(t, [a, b, c]), pts, *edges)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_of_integers_as_cuda_counts_them(dtype):
    """transformers' MoE routing calls histc on int32 expert ids off the CPU (CUDA accepts
    integers): the counts of the values as floats, in the input's dtype."""
    ids = torch.randint(0, 8, (64,), dtype=dtype, generator=torch.Generator().manual_seed(0))
    for kwargs in (dict(bins=8, min=0, max=7), dict(bins=5)):
        got = torch.histc(ids.to("neuron")[::2], **kwargs).cpu()
        assert got.dtype == dtype
        assert torch.equal(got, torch.histc(ids[::2].float(), **kwargs).to(dtype))
