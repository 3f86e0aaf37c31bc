"""Row kernels: elementwise ops fused with sum/mean/amax over trailing dims, and the other
recorded forms (casts, where, clamp), bit-identical to plain eager."""
import pytest
import torch

from neuron_eager import adaptive
from neuron_eager.adaptive import fusion, recording

from test_adaptive import both_modes, rand

N = torch.device("neuron")


@pytest.fixture(autouse=True)
def _fuse_at_once():
    saved = recording.options.compile_after
    recording.options.compile_after = 1
    yield
    recording.options.compile_after = saved
    adaptive.disable()


def softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(-1, keepdim=True)
    return xc / torch.sqrt(var + 1e-5) * w + b


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    w = torch.randn(shape[-1], generator=g).to(dtype)
    b = torch.randn(shape[-1], generator=g).to(dtype)
    return x.to(N), w.to(N), b.to(N)


# rows shorter than, equal to and longer than a sum block (256), and several row dims
@pytest.mark.parametrize("shape", [(3, 7), (4, 256), (2, 3, 600), (1, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_normalizations_fuse_into_one_kernel(shape, dtype):
    x, w, b = _inputs(shape, dtype)
    both_modes(softmax, x)
    both_modes(layer_norm, x, w, b)
    both_modes(rms_norm, x, w)
    adaptive.enable()
    adaptive.reset_stats()
    layer_norm(x, w, b).cpu()
    assert adaptive.stats()["kernels_launched"] == 1  # nine ops, one kernel


# the lanes of Note [Sum order] (ops/numerics.py): whole lane groups, a partial one, two
# blocks of 4096 and part of a third, and a row of lane groups over two dims
@pytest.mark.parametrize("shape", [(3, 1024), (2, 2600), (2, 9000), (2, 2, 16, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_rows_keep_the_eager_sum_order(shape, dtype):
    x, w, b = _inputs(shape, dtype, seed=7)
    x = x * 100 + 3  # large, offset values: any other summation order shows in the bits
    both_modes(softmax, x)
    both_modes(layer_norm, x, w, b)
    both_modes(rms_norm, x, w)
    both_modes(lambda t: (t * 3 - 1).sum(-1, keepdim=True) + t.exp().mean(-1, keepdim=True), x)
    if len(shape) == 4:
        both_modes(lambda t: (t * 2).sum((-2, -1)), x)  # 1024 columns made of two dims


def _specs() -> list:
    return [g.spec for g in fusion.history[-1][2].groups if g.spec is not None]


# weights every row reads are passed as their vectors (Note [Broadcast rows] in
# ops/kernelgen.py), whole to every slice of a loop split across cores
@pytest.mark.parametrize("rows", [3, 512])
def test_weights_every_row_reads_go_whole_to_each_slice(rows):
    x, w, b = _inputs((rows, 1024), torch.float32, seed=3)
    both_modes(layer_norm, x, w, b)
    assert [spec[-1] for spec in _specs()] == [("a", "col", "col")]  # x, w, b
    scale = x[:, :1] * 0.5  # a column vector
    both_modes(lambda t, w, b, s: t * w + b * s, x, w, b, scale)
    assert [(spec[0], spec[-1]) for spec in _specs()] == [("b", ("a", "col", "col", "row"))]


@pytest.mark.parametrize("reduce", [
    lambda t: (t * 2).sum(-1), lambda t: (t + 1).mean((-2, -1), keepdim=True),
    lambda t: t.exp().sum(), lambda t: (t - 1).mean(), lambda t: t.abs().amax(-1),
    lambda t: (t * t).sum((1, 2)), lambda t: torch.tanh(t).sum(-1, keepdim=True) * t])
def test_reductions_end_regions(reduce):
    x, _, _ = _inputs((3, 4, 300), torch.float32)
    both_modes(reduce, x)
    both_modes(reduce, x.transpose(0, 1))  # rows made of strided runs
    both_modes(reduce, x.to(torch.bfloat16))


def test_amax_keeps_the_first_nan_and_signed_zeros():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("inf")], [-0.0, 0.0, -1.0, -2.0],
                      [float("-inf")] * 4], device=N)
    both_modes(lambda t: (t * 1).amax(-1, keepdim=True) + t, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_amax_by_keys_matches_the_eager_scan(dtype):
    """Row maxima found on integer keys (rowgen, Note [Amax by keys]): NaNs of both signs
    and several payloads anywhere, zero maxima of both signs in both orders, infinities,
    all-negative rows, and a long row of several sum blocks."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 700, generator=g) * 4
    bits = x.view(torch.int32)
    bits[1, 5], bits[1, 9] = 0x7FC00001, -0x0040_0000  # +NaN with a payload, then 0xFFC00000
    bits[2, 650] = -1  # 0xFFFFFFFF, a negative NaN, near the end of the row
    x[3] = -x[3].abs() - 1  # all negative
    x[4], x[4, 10], x[4, 20] = -1.0, -0.0, 0.0  # zero maximum: -0.0 comes first
    x[5], x[5, 10], x[5, 20] = -1.0, 0.0, -0.0  # zero maximum: +0.0 comes first
    x[6] = float("-inf")
    x[7, 100] = float("inf")
    x = x.to(dtype).to(N)
    both_modes(lambda t: (t * 1).amax(-1, keepdim=True) - t, x)
    both_modes(lambda t: (t - t.amax(-1, keepdim=True)).exp(), x)


def test_reduction_over_leading_dims_runs_eagerly():
    x, _, _ = _inputs((5, 6), torch.float32)
    both_modes(lambda t: (t * 2).sum(0) + 1, x)
    both_modes(lambda t: (t * 2).amax((0, 1)), x)


def test_non_keepdim_result_is_not_read_in_its_row_kernel():
    x, _, _ = _inputs((8, 8), torch.float32)  # (8,) broadcasts over columns, not rows
    both_modes(lambda t: (t * 2).sum(-1) + t, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_casts_where_and_clamp_fuse(dtype):
    x, w, _ = _inputs((6, 40), dtype)
    both_modes(lambda t: (t * 3).float().relu().to(torch.bfloat16) + 1, x)
    both_modes(lambda t: torch.where(t > 0, t, t * 0.01).clamp(-0.5, 2.0), x)
    both_modes(lambda t, u: torch.where(t > u, t, u).clamp_min(0.25).clamp_max(1.0), x, w)
    adaptive.enable()
    adaptive.reset_stats()
    torch.where(x > 0, x, x * 0.01).clamp(-0.5, 2.0).cpu()
    assert adaptive.stats()["kernels_launched"] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_squares_and_cubes_are_products(dtype):
    """...computed as the CPU's kernels do: bf16's rounds x * x before the third factor."""
    x = torch.arange(-6, 6, dtype=torch.float32).mul(0.7).to(dtype).to(N)
    both_modes(lambda t: (t + 1) ** 2 - t ** 3.0 + t ** 0.5, x)
    both_modes(lambda t: torch.pow(t * 2, 3) + torch.pow(t, 2.0), x)
    x = rand(300, dtype=dtype)
    expected = both_modes(lambda t: (t ** 3 + 1, t ** 2 * 2), x)
    for got, want in zip(expected, (x.cpu() ** 3 + 1, x.cpu() ** 2 * 2)):
        assert torch.equal(got, want)


def test_masked_fill_fuses_as_in_attention():
    x, _, _ = _inputs((2, 3, 5, 5), torch.float32)
    causal = torch.tril(torch.ones(5, 5, device=N)).view(1, 1, 5, 5)
    attention = lambda t: softmax((t * 0.5).masked_fill(causal == 0, float("-inf")))  # noqa: E731
    both_modes(attention, x)
    both_modes(lambda t: t.masked_fill(t > 1, torch.tensor(2.5)) + 1, x.to(torch.bfloat16))


def test_errors_raise_at_record_time():
    x, _, _ = _inputs((3, 4), torch.float32)
    adaptive.enable()
    with pytest.raises(IndexError, match="Dimension out of range"):
        (x * 2).sum(5)
    with pytest.raises(RuntimeError, match="At least one of 'min' or 'max'"):
        (x * 2).clamp()


def test_views_of_pending_tensors_are_recorded():
    x, w, _ = _inputs((4, 6), torch.float32)
    wt = torch.randn(6, 4).to(N)
    both_modes(lambda t: ((t * 2).view(2, 12) + 1).exp(), x)
    both_modes(lambda t, u: ((t * 2).transpose(0, 1) * u).sum(-1, keepdim=True), x, wt)
    both_modes(lambda t: (t.sum(-1) * 2).unsqueeze(-1).expand(4, 6) + t, x)
    both_modes(lambda t: (t + 1)[:, 1:4] * 3 + (t + 1)[2, :3], x)
    both_modes(lambda t: (t * 3).view(24).view(6, 4).t().relu(), x)

    def update_base_seen_by_view(t):
        y = t * 2
        v = y.view(24)
        y.add_(1)  # runs eagerly: the view must see it
        return v * 2

    def update_through_view(t):
        y = t * 2
        y.view(24).mul_(2)
        return y + 1

    both_modes(update_base_seen_by_view, x)
    both_modes(update_through_view, x)
    adaptive.enable()
    adaptive.reset_stats()
    ((x * 2).view(24) + 1).cpu()
    assert adaptive.stats()["flush_reasons"] == {"aten::_to_copy": 1}  # the view did not flush
    adaptive.reset_stats()  # a transposed operand gives a transposed result, recorded with
    y = (x * 2).transpose(0, 1) + 1  # the layout plain eager gives it (Note [Output layout])
    assert y.stride() == (1, 6) and adaptive.stats()["flush_reasons"] == {}
    assert torch.equal(y.cpu(), (x.cpu() * 2).transpose(0, 1) + 1)
    with pytest.raises(RuntimeError, match="invalid for input of size"):
        (x * 2).view(5, 5)


def test_lane_loops_load_vectors_not_gathers():
    # a signed column index may be negative for all LLVM knows: it wraps it around and
    # gathers each load (3x slower, same bits, so only the code shows it)
    from neuron_eager.adaptive import codegen, rowgen
    from neuron_eager.ops import elementwise, kernelgen

    x, w, b = _inputs((4, 1024), torch.float32)
    adaptive.enable()
    rms_norm(x, w).cpu()  # sum of squares: a plain-arithmetic pass, summed in lanes
    adaptive.disable()
    names = ["square", "mean", "add_plain", "rsqrt", "mul", "mul"]
    spec = next(s for s in codegen._kernels  # (an earlier test may have compiled it)
                if s[0] == "r" and [getattr(n[1], "name", n[1]) for n in s[1]] == names)
    src, recipes = rowgen.source(spec)
    assert "for q in range(width)" in src
    kernel = kernelgen.jit_source(
        src, {name: elementwise.resolve(r) for name, r in recipes.items()}, "test")
    inputs = [w._nd if kind == "col" else x._nd for kind in spec[-1]]
    kernel(torch.empty_like(x)._nd, *inputs, torch.tensor(1e-6).numpy())
    llvm = kernel.inspect_llvm(kernel.signatures[0])
    assert "x float>" in llvm and "masked.gather" not in llvm
