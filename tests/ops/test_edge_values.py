"""Edge values a new user's sweep found wrong, bit for bit against the CPU (assert_close
equates -0.0 and 0.0, so signs of zero are compared as bits)."""
import warnings

import pytest
import torch
import torch.nn.functional as F

NEURON = "neuron"


def _bits(t: torch.Tensor) -> torch.Tensor:
    if not t.dtype.is_floating_point:
        return t
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same_bits(expected: torch.Tensor, actual: torch.Tensor) -> None:
    nan = expected.isnan() if expected.dtype.is_floating_point else None
    if nan is not None:
        assert torch.equal(actual.isnan(), nan)
        expected, actual = expected[~nan], actual[~nan]  # (NaN payloads aside)
    assert torch.equal(_bits(expected), _bits(actual)), (expected, actual)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64])
def test_integer_pow_of_a_negative_tensor_exponent(dtype):
    base = torch.tensor([-3, -2, -1, -1, 0, 1, 2, 3, -1, 2], dtype=dtype)
    exponent = torch.tensor([-1, -1, -1, -2, -1, -3, -2, -1, 3, 3], dtype=dtype)
    b, e = base.to(NEURON), exponent.to(NEURON)
    _same_bits(torch.pow(base, exponent), torch.pow(b, e).cpu())
    _same_bits(torch.pow(2, exponent), torch.pow(2, e).cpu())
    x = base.clone()
    x.pow_(exponent)
    b.pow_(e)
    _same_bits(x, b.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pow_of_a_tensor_half_exponent_at_negative_zero_and_infinity(dtype):
    """pow(x, tensor) is C's pow (pow(-0.0, 0.5) = 0.0); pow(x, 0.5) is sqrt (-0.0)."""
    x = torch.tensor([-0.0, 0.0, -float("inf"), float("inf"), 4.0, -4.0, 3.3, float("nan")],
                     dtype=dtype)
    for value in (0.5, -0.5, 2.0, -1.0, 1.0):  # (x ** 1.0: x, as the CPU copies it)
        e = torch.full_like(x, value)
        _same_bits(torch.pow(x, e), torch.pow(x.to(NEURON), e.to(NEURON)).cpu())
        _same_bits(torch.pow(x, value), torch.pow(x.to(NEURON), value).cpu())


@pytest.mark.parametrize("exponent", [2 ** 24 + 1, 2 ** 24 + 3, -(2 ** 24 + 1), 2 ** 31 + 1,
                                      -(2 ** 31 + 1), 16777217.0])
def test_odd_integer_powers_past_fp32s_integers_keep_their_sign(exponent):
    # (the exponent became an even fp32 kernel argument: (-1.0) ** (2**24 + 1) gave 1.0)
    x = torch.tensor([-1.0, -1.0000001, -0.9999999, 2.0, -0.0, 0.0, -float("inf"),
                      float("inf"), float("nan")])
    want, got = x ** exponent, (x.to(NEURON) ** exponent).cpu()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0, equal_nan=True)
    assert torch.equal(got.signbit(), want.signbit())
    in_place = x.to(NEURON)
    in_place.pow_(exponent)
    torch.testing.assert_close(in_place.cpu(), got, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nextafter_steps_one_ulp_of_the_16_bit_type(dtype):
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    for target in (float("inf"), -float("inf"), 0.0, -0.0, 1.0, float("nan")):
        t = torch.full_like(every, target)
        _same_bits(torch.nextafter(every, t), torch.nextafter(every.to(NEURON), t.to(NEURON)).cpu())


def test_signed_zeros_of_relu_sin_tanh_and_fmax():
    x = torch.tensor([-0.0, 0.0, -1.5, 2.0, -float("inf"), float("nan")])
    for fn in (F.relu, torch.relu_, lambda t: F.threshold(t, 0.0, 0.0)):
        _same_bits(fn(x.clone()), fn(x.to(NEURON)).cpu())
    x = x[[0, 1, 4, 5]]  # (elsewhere the approximations are within a few ulp, not bit-exact)
    for fn in (torch.sin, torch.cos, torch.tanh, F.tanhshrink,
               lambda t: F.gelu(t, approximate="tanh")):
        _same_bits(fn(x), fn(x.to(NEURON)).cpu())
    a = torch.tensor([0.0, -0.0, 1.0, float("nan")])
    b = torch.tensor([-0.0, 0.0, float("nan"), 2.0])
    for fn in (torch.fmax, torch.fmin, torch.maximum, torch.minimum):
        _same_bits(fn(a, b), fn(a.to(NEURON), b.to(NEURON)).cpu())


def test_logaddexp2_of_far_apart_values_is_within_a_few_ulp():
    a, b = torch.zeros(2001), torch.linspace(-100, 100, 2001)
    got = torch.logaddexp2(a.to(NEURON), b.to(NEURON)).cpu()
    exact = torch.logaddexp2(a.double(), b.double()).float()
    ulps = (got.view(torch.int32).long() - exact.view(torch.int32).long()).abs()
    assert ulps.max() <= 4  # was 12 at b = -30: exp(-d ln 2) for 2^-d


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_median_of_no_elements(dtype):
    x = torch.empty(0, dtype=dtype)
    _same_bits(x.median(), x.to(NEURON).median().cpu())
    if dtype.is_floating_point:
        _same_bits(x.nanmedian(), x.to(NEURON).nanmedian().cpu())


_FMA_OPS = {  # (Note [Fused multiply-adds] in ops/arithmetic.py)
    "add": lambda a, b, c: torch.add(a, b, alpha=0.587),
    "sub": lambda a, b, c: torch.sub(a, b, alpha=-1.3),
    "rsub": lambda a, b, c: torch.rsub(a, b, alpha=0.3),
    "add_": lambda a, b, c: a.clone().add_(b, alpha=0.7),
    "addcmul": lambda a, b, c: torch.addcmul(a, b, c, value=0.37),
    "addcdiv": lambda a, b, c: torch.addcdiv(a, b, c, value=-0.37),
    "lerp": lambda a, b, c: torch.lerp(a, b, 0.3),
    "lerp big weight": lambda a, b, c: torch.lerp(a, b, 0.8),
    "lerp tensor": lambda a, b, c: torch.lerp(a, b, c - 1),  # weights on both sides of 0.5
    "foreach": lambda a, b, c: torch._foreach_add([a, b], [b, c], alpha=0.587)[1],
    "foreach lerp": lambda a, b, c: torch._foreach_lerp([a], [b], 0.9)[0],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(_FMA_OPS))
def test_multiply_adds_round_once_as_the_cpu(name, dtype):
    """A sweep found `add(x, y, alpha=0.587)` 1 ulp off in a fifth of the elements (so
    torchvision's uint8 saturation was off by a level): the CPU's fmadd rounds once."""
    # 1024 elements: all in the CPU's vector loop, whose bf16/fp16 add rounds alpha to the
    # dtype (its scalar tail, the last n % 32 elements of a chunk, keeps it in fp32)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, generator=g) * 10, torch.randn(1024, generator=g) * 3
    c = torch.rand(1024, generator=g) + 0.5
    a, b, c = a.to(dtype), b.to(dtype), c.to(dtype)
    op = _FMA_OPS[name]
    _same_bits(op(a, b, c), op(a.to(NEURON), b.to(NEURON), c.to(NEURON)).cpu())


def test_integer_add_with_alpha_is_exact():
    a, b = torch.arange(-50, 50, dtype=torch.int32), torch.arange(100, dtype=torch.int32)
    _same_bits(torch.add(a, b, alpha=3), torch.add(a.to(NEURON), b.to(NEURON), alpha=3).cpu())
    t, f = torch.tensor([True, False, True]), torch.tensor([False, False, True])
    _same_bits(torch.add(t, f, alpha=True), torch.add(t.to(NEURON), f.to(NEURON),
                                                     alpha=True).cpu())


_SCALAR_OPS = {  # (Note [Reduced-precision scalars] in ops/arithmetic.py)
    "add": lambda a: a + 0.587,
    "sub": lambda a: a - 0.587,
    "rsub": lambda a: 0.587 - a,
    "add_": lambda a: a.clone().add_(0.587),
    "foreach add": lambda a: torch._foreach_add([a], 0.587)[0],
    "remainder": lambda a: a.remainder(1.7),
    "fmod": lambda a: a.fmod(1.7),
    "remainder_": lambda a: a.clone().remainder_(1.7),
    "mul": lambda a: a * 0.587,  # (kept in fp32 by the CPU)
    "div": lambda a: a / 0.587,
    # ints are rounded too: bf16 + 257 adds 256 (fp16 from 2049)
    "add int": lambda a: a + 4099,
    "sub alpha int": lambda a: a.sub(a, alpha=4099),
    "foreach add int": lambda a: torch._foreach_add([a, a], 4099)[1],
    "remainder int": lambda a: a.remainder(4099),
    "mul int": lambda a: a * 4099,
    # the CPU's mul_.Scalar rounds its scalar (Note [mul_ by a Scalar]); its foreach mul_ too
    "aten mul_.Scalar": lambda a: torch.ops.aten.mul_.Scalar(a.clone(), 0.587),
    "foreach mul_": lambda a: _foreach_(torch._foreach_mul_, a, 0.587),
    "foreach mul_ list": lambda a: _foreach_(torch._foreach_mul_, a, [0.587, 70000.0]),
    # comparisons round theirs too: bf16 0.587 == 0.587
    "eq": lambda a: _with_values(a, 0.587, 4099.0) == 0.587,
    "ge int": lambda a: _with_values(a, 0.587, 4099.0).ge(4099),
    "lt_": lambda a: _with_values(a, 0.587, 4099.0).lt_(4099),
    # and pow its exponent: bf16 (-1) ** 257 is (-1) ** 256
    "pow 257": lambda a: a.new_tensor([-1.0, -2.0, 0.5, 1.0]).pow(4099),
    "foreach pow_ 257": lambda a: _foreach_(torch._foreach_pow_, a.new_tensor([-1.0, -2.0]),
                                           4099),
}


def _with_values(a, *values):
    return torch.cat([a, a.new_tensor(values)])


def _foreach_(op, a, scalar):
    pair = [a.clone(), a.clone() * 2]
    op(pair, scalar)
    return torch.cat(pair)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(_SCALAR_OPS))
def test_python_scalars_meet_16_bit_tensors_as_on_the_cpu(name, dtype):
    """A sweep found `x + 0.587` in bf16 1 ulp off in a tenth of the elements and
    `x.remainder(1.7)` off in most: the CPU rounds those scalars to the dtype first."""
    a = (torch.randn(1024, generator=torch.Generator().manual_seed(1)) * 10).to(dtype)
    op = _SCALAR_OPS[name]
    _same_bits(op(a), op(a.to(NEURON)).cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounded_scalars_keep_the_sign_of_zero_and_nan(dtype):
    """The scalars rounded to a 16-bit dtype are remembered by value: -0.0 is not 0.0, a NaN
    is not remembered, each agrees with the CPU whichever came first."""
    a = torch.tensor([-0.0, 0.0, 1.5, -2.25]).to(dtype)
    for scalar in (0.0, -0.0, 0.0, float("nan"), 0.587, -0.0, float("inf"), 1e39):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # (NumPy's overflow in its cast)
            _same_bits(a + scalar, (a.to(NEURON) + scalar).cpu())
        if scalar != 1e39:  # (an alpha beyond the dtype raises: tests/test_cpu_errors.py)
            _same_bits(a.sub(1.0, alpha=scalar), a.to(NEURON).sub(1.0, alpha=scalar).cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fills_of_equal_values_keep_their_own_bits(dtype):
    """Filled values are remembered in their stored form; 0.0 == -0.0 and 1 == 1.0 == True,
    so each must still get its own (a fill of 0.0 first, then of -0.0)."""
    for value in (0.0, -0.0, 0.0, 1, 1.0, True, float("nan"), float("-inf"), 1e-40):
        _same_bits(torch.full((3,), value, dtype=dtype),
                   torch.full((3,), value, dtype=dtype, device=NEURON).cpu())
        _same_bits(torch.zeros(2, dtype=dtype).fill_(value),
                   torch.zeros(2, dtype=dtype, device=NEURON).fill_(value).cpu())
    with pytest.raises(RuntimeError, match="without overflow"):
        torch.full((2,), 300, dtype=torch.uint8, device=NEURON)
    with pytest.raises(RuntimeError, match="without overflow"):  # refused every time
        torch.full((2,), 300, dtype=torch.uint8, device=NEURON)
    assert torch.full((2,), True, device=NEURON).dtype == torch.bool
    assert torch.full((2,), 1, device=NEURON).dtype == torch.int64


@pytest.mark.parametrize("size", [10, 256])
def test_bf16_cube_and_inverse_square_round_the_square(size):
    """The CPU's bf16 pow kernel computes x * x * x and 1 / (x * x) in bf16 arithmetic: the
    square is rounded to bf16 before the next step (x ** 3 of -5.9 is -207, not -206)."""
    x = (torch.randn(size, generator=torch.Generator().manual_seed(1)) * 8).bfloat16()
    for exponent in (3, -2, 3.0, -2.0):
        _same_bits(x ** exponent, (x.to(NEURON) ** exponent).cpu())
        y, d = x.clone(), x.to(NEURON)
        y.pow_(exponent)
        d.pow_(exponent)
        _same_bits(y, d.cpu())


def test_a_scalar_past_fp32s_range_is_inf_without_numpys_warning():
    x = torch.tensor([1.0, 0.0, -2.0], dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (NumPy's "overflow encountered in cast" leaked)
        for fn in (lambda t: t * 1e39, lambda t: t - 1e39, lambda t: torch.where(t > 0, t, -1e39),
                   lambda t: t.float() + 1e300):
            _same_bits(fn(x), fn(x.to(NEURON)).cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_python_number_first_in_mul_and_div_is_rounded_to_the_dtype(dtype):
    """torch.mul(0.1, x) rounds 0.1 to x's dtype on the CPU (a wrapped number first), where
    x * 0.1 keeps it in fp32; so in fused regions too."""
    from neuron_eager import adaptive

    x = torch.tensor([1e-4, 0.0, 3.0, 1.7, -2.5])
    x = x.to(dtype)
    for fn in (lambda t: torch.mul(0.1, t), lambda t: torch.div(70000.0, t),
               lambda t: torch.mul(257, t), lambda t: torch.mul(t, 0.1)):
        expected = fn(x)
        _same_bits(expected, fn(x.to(NEURON)).cpu())
        adaptive.enable()
        try:
            for _ in range(3):
                _same_bits(expected * 2, (fn(x.to(NEURON)) * 2).cpu())
        finally:
            adaptive.disable()
