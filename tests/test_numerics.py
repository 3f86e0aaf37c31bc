"""Trainium numerics: fast transcendentals in ulp, stochastic rounding, auto-cast."""
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from numba import njit

from neuron_eager import numerics_report
from neuron_eager.ops import numerics
from neuron_eager.device_sim import config
from checks import lane_sums


@pytest.mark.parametrize("spec", numerics_report.SPECS, ids=lambda s: s.name)
def test_transcendentals_within_4_ulp_of_the_exact_value(spec):
    row = numerics_report.measure(spec, 60_000)
    assert row["vs_exact"] <= numerics_report.TARGET_ULP, row
    # against torch: at most our error plus torch's own, which depends on the CPU torch
    # dispatches to (gelu: 4.6 ulp from exact with AVX-512, 9 with AVX2 only)
    assert row["vs_torch"] <= math.ceil(row["vs_exact"] + row["torch_vs_exact"]), row


def test_gelu_below_minus_one_is_closer_to_exact_than_torch():
    # Note [gelu's CDF]: below -1 the ulp columns do not judge gelu (torch's 1 + erf
    # cancels there); ours must be no further from the exact value than torch's CPU result
    x = torch.linspace(-14, -1, 200_001)
    exact = x.double() * 0.5 * torch.special.erfc(-x.double() / math.sqrt(2))
    ours = torch.nn.functional.gelu(x.to("neuron")).cpu().double()
    theirs = torch.nn.functional.gelu(x).double()
    assert (ours - exact).abs().max() <= max((theirs - exact).abs().max(), 2e-7)


def test_vectorised_loops_give_the_scalar_loops_bits():
    # Note [512-bit vectors]: a 1-element launch runs the loop's scalar remainder, a long one
    # its (512-bit where the CPU has AVX-512) vector body; no op may depend on which.
    x = torch.cat([torch.linspace(-12, 12, 197), torch.tensor([0.0, -0.0, 1e-40, 88.7, -104.0])])
    xd = x.to("neuron")
    for fn in (torch.exp, torch.tanh, torch.sigmoid, torch.erf, torch.sin, torch.log,
               torch.nn.functional.gelu, lambda t: t * 0.3 + 1.5):
        vector = fn(xd.repeat(8)).cpu()[-x.numel():]
        scalar = torch.cat([fn(xd[i:i + 1]).cpu() for i in range(x.numel())])
        assert torch.equal(vector.view(torch.int32), scalar.view(torch.int32)), fn


def test_kernels_use_512_bit_vectors_on_avx512():
    import llvmlite.binding as ll
    import numba
    import numpy as np

    from neuron_eager.ops import elementwise, kernelgen

    if "+avx512f" not in ll.get_host_cpu_features().flatten().split(","):
        pytest.skip("no AVX-512")
    # a loop compiled here, with the kernels' options (a kernel loaded from the disk cache
    # has no assembly to inspect)
    gelu = elementwise.OPS_BY_NAME["gelu"].fn

    def loop(x, out):
        for i in range(out.size):
            out[i] = gelu(x[i])

    kernel = numba.njit(**kernelgen.JIT_OPTIONS)(loop)
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    kernel(x, np.empty_like(x))
    assert any("zmm" in asm for asm in kernel.inspect_asm().values())


def test_transcendentals_keep_special_values():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40,
                      100.0, -100.0, 1e4, -1e4, 3e38])
    for fn in (torch.exp, torch.tanh, torch.sigmoid, torch.erf, torch.sin, torch.cos, torch.log,
               torch.nn.functional.gelu, torch.nn.functional.silu):
        if fn is torch.nn.functional.gelu:  # torch's gelu(inf) is NaN and gelu(3e38) inf
            x = x[x.abs() < 1e30]
        got, want = fn(x.to("neuron")).cpu(), fn(x)
        torch.testing.assert_close(got, want, equal_nan=True, rtol=4e-7, atol=0,
                                   msg=lambda m: f"{fn.__name__}: {m}")


def test_sin_and_cos_of_large_arguments_are_reduced_exactly(seed):
    # Note [Large trigonometric arguments]: from 8192 up to the largest fp32, both signs,
    # against float64 libm (exact reduction) rounded to fp32
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([8192 + 1e5 * torch.rand(4000, generator=g),
                   10 ** (4 + 34 * torch.rand(4000, generator=g)),
                   torch.tensor([8192.0, 2.0 ** 24, 3.4e38, 1e20])])
    x = torch.cat([x, -x])
    for fn, ref in ((torch.sin, np.sin), (torch.cos, np.cos)):
        exact = ref(x.double().numpy())
        got = fn(x.to("neuron")).cpu().double().numpy()
        ulps = np.abs(got - exact) / np.spacing(np.abs(exact).astype(np.float32))
        assert ulps.max() <= numerics_report.TARGET_ULP, (fn.__name__, ulps.max())


@pytest.fixture
def stochastic():
    config.stochastic_rounding = True
    yield
    config.stochastic_rounding = False


def _between_bf16_neighbours(n: int, fraction: float) -> tuple[torch.Tensor, float]:
    """bf16 ones and the fp32 offset `fraction` of a bf16 ulp above 1."""
    return torch.ones(n, dtype=torch.bfloat16, device="neuron"), fraction * 2.0 ** -7


def test_stochastic_rounding_is_unbiased(stochastic):
    ones, delta = _between_bf16_neighbours(200_000, 0.3)
    got = (ones + delta).float().cpu()  # fp32 1 + delta, rounded stochastically to bf16
    assert set(got.unique().tolist()) == {1.0, 1.0 + 2.0 ** -7}  # only the two neighbours
    bias = (got.double().mean().item() - (1 + delta)) / 2.0 ** -7
    assert abs(bias) < 0.01, bias  # in bf16 ulps; round-to-nearest would be -0.3
    config.stochastic_rounding = False
    nearest = (ones + delta).float().cpu()
    assert (nearest == 1.0).all()  # the same sum rounded to nearest: biased, the test can fail


@pytest.mark.parametrize("value", [1e-8, -1e-8, 2.0 ** -26, -3.0 * 2 ** -27, -0.3 * 2 ** -14])
def test_stochastic_rounding_to_fp16_is_unbiased_near_zero(stochastic, value):
    """A negative value whose nearest fp16 is -0.0 rounds to -0.0 or -2**-24 (its other
    neighbour was +2**-24, so it never left -0.0: a mean of 0)."""
    got = torch.full((400_000,), value, device="neuron").half().cpu().double()
    ulp = 2.0 ** -24
    assert set(got.unique().tolist()) <= {math.floor(value / ulp) * ulp,
                                          math.ceil(value / ulp) * ulp}
    assert abs(got.mean().item() - value) < 0.02 * ulp, (got.mean().item(), value)


_ROW_OPS = {
    "softmax": lambda t: t.softmax(-1), "log_softmax": lambda t: t.log_softmax(0),
    "softmax backward": lambda t: torch.ops.aten._softmax_backward_data(t, t, -1, t.dtype),
    "logcumsumexp": lambda t: t.logcumsumexp(-1),
    "embedding_bag": lambda t: F.embedding_bag(
        torch.arange(60, device=t.device).view(10, 6) % t.shape[0], t, mode="mean")}


@pytest.mark.parametrize("name", _ROW_OPS)
def test_row_kernels_round_stochastically_too(stochastic, name):
    """Each result is one of the two bf16 neighbours of the op's fp32 value, the upper one
    as often as its distance says (softmax and friends rounded to nearest before)."""
    fn = _ROW_OPS[name]
    x = (torch.randn(40, 64, generator=torch.Generator().manual_seed(0)) * 3).bfloat16()
    x = x.to("neuron")
    config.stochastic_rounding = False
    exact = fn(x.float()).cpu()
    config.stochastic_rounding = True
    torch.neuron.manual_seed(0)
    got = fn(x).cpu().float()
    down = exact.bfloat16().float()  # (nearest; the other neighbour is one bf16 step away)
    step = torch.where(exact >= down, 1, -1)
    bits = down.bfloat16().view(torch.int16) + step * torch.where(down >= 0, 1, -1)
    up = bits.to(torch.int16).view(torch.bfloat16).float()
    assert ((got == down) | (got == up)).all()
    moved = (got != down).float().mean().item()
    assert 0.1 < moved < 0.5, moved  # (round to nearest: 0)


def test_stochastic_rounding_is_reproducible_under_manual_seed(stochastic):
    ones, delta = _between_bf16_neighbours(10_000, 0.5)

    def run(seed):
        torch.neuron.manual_seed(seed)
        return [(ones + delta).cpu(), (ones * (1 + delta)).sum(0, keepdim=True).cpu(),
                torch.mm(ones.view(100, 100), ones.view(100, 100) * delta).cpu()]

    first, again, other = run(0), run(0), run(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])


def test_restoring_the_rng_state_repeats_the_rounding_too(stochastic):
    """get/set_rng_state and fork_rng carry the rounding noise's seed and launch count
    (Note [stochastic rounding noise]); a 16-byte state (CUDA's size) still loads."""
    x = torch.full((4096,), 1 + 0.3 * 2 ** -7, device="neuron")
    torch.neuron.manual_seed(5)
    x.bfloat16()
    state = torch.neuron.get_rng_state()
    first = [x.bfloat16().cpu(), torch.rand(8, device="neuron").cpu()]
    torch.neuron.set_rng_state(state)
    again = [x.bfloat16().cpu(), torch.rand(8, device="neuron").cpu()]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    with torch.random.fork_rng(device_type="neuron"):
        inside = x.bfloat16().cpu()
    assert torch.equal(inside, x.bfloat16().cpu())
    torch.neuron.set_rng_state(state[:16].clone())  # (seed and offset only: noise as it was)
    assert torch.equal(torch.rand(8, device="neuron").cpu(), first[1])


def test_stochastic_rounding_does_not_shift_other_random_numbers():
    torch.neuron.manual_seed(3)
    plain = torch.rand(1000, device="neuron").cpu()
    config.stochastic_rounding = True
    try:
        torch.neuron.manual_seed(3)
        ones = torch.ones(64, dtype=torch.bfloat16, device="neuron")
        (ones + 1e-3).cpu()  # consumes rounding noise
        noisy = torch.rand(1000, device="neuron").cpu()
    finally:
        config.stochastic_rounding = False
    assert torch.equal(plain, noisy)


@pytest.fixture
def auto_cast():
    yield config
    config.auto_cast, config.auto_cast_type = "none", "bf16"


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 to 10 mantissa bits, ties to even (NumPy reference)."""
    u = x.numpy().view(np.uint32).astype(np.uint64)
    u = (u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000
    return torch.from_numpy(u.astype(np.uint32).view(np.float32))


@pytest.mark.parametrize("kind", ["bf16", "fp16", "tf32"])
@pytest.mark.parametrize("mkn", [(48, 300, 40), (200, 300, 260)])
def test_auto_cast_matmult_rounds_matmul_operands(auto_cast, kind, mkn, seed):
    m, k, n = mkn
    a, b = torch.randn(m, k), torch.randn(k, n)
    rounded = {"bf16": lambda t: t.bfloat16().float(), "fp16": lambda t: t.half().float(),
               "tf32": _tf32}[kind]
    # the same product computed without auto-cast on pre-rounded operands: for bf16, the
    # bf16 product's fp32 accumulator (large ones sum on the bf16 units: Note [bf16 chunks
    # on MKL] in ops/bf16_chunks.py)
    if kind == "bf16":
        want = torch.mm(a.bfloat16().to("neuron"), b.bfloat16().to("neuron"),
                        out_dtype=torch.float32).cpu()
    else:
        want = torch.mm(rounded(a).to("neuron"), rounded(b).to("neuron")).cpu()
    plain = torch.mm(a.to("neuron"), b.to("neuron")).cpu()
    assert not torch.equal(plain, want)  # rounding the operands changes the product
    auto_cast.auto_cast, auto_cast.auto_cast_type = "matmult", kind
    got = torch.mm(a.to("neuron"), b.to("neuron"))
    assert got.dtype == torch.float32
    assert torch.equal(got.cpu(), want)
    torch.testing.assert_close(got.cpu(), rounded(a) @ rounded(b), rtol=1e-5, atol=1e-4)


def test_auto_cast_all_rounds_elementwise_inputs_too(auto_cast, seed):
    x = torch.randn(1000)
    want = torch.exp(x.bfloat16().float().to("neuron")).cpu()
    auto_cast.auto_cast = "matmult"
    assert not torch.equal(torch.exp(x.to("neuron")).cpu(), want)  # matmult leaves exp alone
    auto_cast.auto_cast = "all"
    assert torch.equal(torch.exp(x.to("neuron")).cpu(), want)


def test_auto_cast_settings_are_checked():
    with pytest.raises(ValueError, match="auto_cast .*must be one of 'none', 'matmult', 'all'"):
        neuron_eager.config.auto_cast = "everything"
    with pytest.raises(ValueError, match="auto_cast_type"):
        neuron_eager.config.auto_cast_type = "fp64"
    assert config.auto_cast == "none" and config.auto_cast_type == "bf16"


def test_auto_cast_matmult_rounds_convolution_operands(auto_cast, seed):
    x, w = torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3)
    conv = torch.nn.functional.conv2d
    want = conv(x.bfloat16().float().to("neuron"), w.bfloat16().float().to("neuron")).cpu()
    auto_cast.auto_cast = "matmult"
    assert torch.equal(conv(x.to("neuron"), w.to("neuron")).cpu(), want)


@njit
def _fp16_codecs(halves, widened, x, enc, rounded):
    for i in range(halves.shape[0]):
        widened[i] = numerics.f16_to_f32(halves[i])
    for i in range(x.shape[0]):
        enc[i] = numerics.f32_to_f16(x[i])
        rounded[i] = numerics.round_to_f16(x[i])


def test_fp16_conversions_against_torch_and_each_other():
    # Note [Cheap fp16 conversions]: every half, fp32 patterns around each half's rounding
    # boundaries (subnormals, normals, overflow, NaN payloads) and random patterns
    halves = np.arange(65536, dtype=np.uint16)
    reference = torch.from_numpy(halves.view(np.int16)).view(torch.float16).float().numpy()
    base = reference.view(np.uint32).astype(np.int64)
    near = (base[:, None] + np.arange(-4100, 4101, 37)[None, :]).reshape(-1)
    rng = np.random.default_rng(0)
    bits = np.concatenate([near[(near >= 0) & (near < 2 ** 32)],
                           rng.integers(0, 2 ** 32, 200_000)]).astype(np.uint32)
    x = bits.view(np.float32)
    widened = np.empty(65536, np.float32)
    enc, rounded = np.empty(x.shape[0], np.uint16), np.empty(x.shape[0], np.float32)
    _fp16_codecs(halves, widened, x, enc, rounded)
    assert np.array_equal(widened.view(np.uint32), reference.view(np.uint32))
    expected = torch.from_numpy(x).to(torch.float16).view(torch.int16).numpy().view(np.uint16)
    finite = ~np.isnan(x)  # torch keeps NaN payloads; ours is the canonical quiet NaN
    assert np.array_equal(enc[finite], expected[finite])
    assert ((enc[~finite] & 0x7FFF) == 0x7E00).all()
    back = torch.from_numpy(enc.view(np.int16)).view(torch.float16).float().numpy()
    assert np.array_equal(rounded.view(np.uint32), back.view(np.uint32))


@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_float_to_int_conversions_are_the_cpus(source):
    # Note [Float to int]: NaN, infinities and values past int32 give INT32_MIN, narrower
    # types its low bits, as the CPU's conversion; the same in a large (vectorised, split)
    # copy and through an elementwise op's kernel
    v = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e10, 2.5e9, -2.5e9, 300.7,
                      -1.5, 70000.0, 1e20, -2.0 ** 31, 2.0 ** 31 - 128, -0.0, 0.99])
    x = torch.cat([v, v.repeat(5000)]).to(source)  # 70K elements
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.bool):
        expected = x.to(dtype)
        assert torch.equal(x.to("neuron").to(dtype).cpu(), expected), dtype
        assert torch.equal((x.to("neuron") * 1).to(dtype).cpu(), expected), dtype
        assert torch.equal(torch.zeros(x.shape, dtype=dtype, device="neuron").copy_(
            x.to("neuron")).cpu(), expected), dtype
    inside = x.abs() < 2 ** 31  # int64 is computed as int32: the same values inside its range
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = x.to("neuron").long().cpu()
    assert torch.equal(got[inside], x[inside].long())
    assert (got[~inside] == -2 ** 31).all()


@njit
def _lane_sum_and_deviations(values, mu):
    lanes, lanes2 = np.empty(numerics.SUM_LANES, np.float32), np.empty(numerics.SUM_LANES, np.float32)
    return (numerics.lane_sum(values, values.size, lanes),
            numerics.deviation_sums(values, values.size, mu, lanes, lanes2))


@pytest.mark.parametrize("n", [7, 64, 255, 257, 1000, 2 * 4096 + 300])
def test_row_sums_add_in_the_lane_order(n, seed):
    # what softmax, the norms, var and logsumexp sum with (Note [Sum order]); values of
    # mixed magnitudes, so any other order rounds otherwise
    x = (np.random.default_rng(n).standard_normal(n) *
         10.0 ** np.random.default_rng(n + 1).uniform(-3, 3, n)).astype(np.float32)
    mu = np.float32(x.mean())
    total, (s1, s2) = _lane_sum_and_deviations(x, mu)
    d = x - mu
    assert np.float32(total) == lane_sums(x[None])[0]
    assert np.float32(s1) == lane_sums(d[None])[0]
    assert np.float32(s2) == lane_sums((d * d)[None])[0]
