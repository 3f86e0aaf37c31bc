"""Fast fp32 transcendentals, as the Scalar engine computes them: in-kernel approximations.

Numba's llvmlite has no vector math library, so `np.exp` in a kernel is a scalar libm call
(~15 ns per element). These are range reductions plus polynomials in fp32 arithmetic that
vectorise and run at memory speed. Their errors against torch's fp32 and against the exact
values (float64 references) are measured over dense sweeps by
`python -m neuron_eager.numerics_report`, which writes docs/numerics.md. Coefficients come from
tools/fit_transcendentals.py.
"""
from __future__ import annotations

import math

import numpy as np

from neuron_eager.ops.jit import fma as fma64, njit
from neuron_eager.ops.numerics import f32_as_u32, u32_as_f32

JIT = dict(error_model="numpy", nogil=True, fastmath={"contract"})  # FMA in polynomials
f32 = np.float32
_INF = f32(np.inf)
_NAN = f32(np.nan)


def _split(value: float, bits: int) -> tuple[float, float]:
    """value = hi + lo with hi holding `bits` significant bits (so n * hi is exact)."""
    exponent = math.frexp(value)[1]
    hi = math.floor(value * 2.0 ** (bits - exponent)) / 2.0 ** (bits - exponent)
    return hi, value - hi


# -- exp: x = n ln2 + r, |r| <= ln2/2, e^r by its Taylor polynomial to r^7 ---------------------
_LN2_HI, _LN2_LO = (f32(v) for v in _split(math.log(2), 9))
_LOG2E = f32(1 / math.log(2))
_EXP_MAX = f32(88.72283)  # above: inf
_EXP_MIN = f32(-103.97208)  # below: 0 (under half the smallest subnormal)
_EXP_C = tuple(f32(1 / math.factorial(k)) for k in range(8))


@njit(**JIT)
def _pow2(k):
    """2**k as fp32 for -126 <= k <= 127."""
    return u32_as_f32(np.uint32((k + 127) << 23))


@njit(**JIT)
def _exp_reduced(v):
    """(n, p) with e^v = p * 2**n: n = round(v / ln2), p = e^r by its polynomial."""
    n = np.floor(v * _LOG2E + f32(0.5))
    r = (v - n * _LN2_HI) - n * _LN2_LO
    c = _EXP_C
    p = c[7] * r + c[6]
    p = p * r + c[5]
    p = p * r + c[4]
    p = p * r + c[3]
    p = p * r + c[2]
    p = p * r + c[1]
    p = p * r + c[0]
    return n, p


@njit(**JIT)
def exp_f32(x):  # Note [branch-free]
    x = f32(x)
    big = _INF if x == x else x  # overflow, +inf, NaN
    tiny = x < _EXP_MIN
    n, p = _exp_reduced(max(min(x, _EXP_MAX), _EXP_MIN))
    k = np.int32(n)
    half = k >> 1  # two scalings keep 2**k inside the normal range, one rounding at the end
    y = p * _pow2(half) * _pow2(k - half)
    y = f32(0) if tiny else y
    return y if x < _EXP_MAX else big


@njit(**JIT)
def _exp_small(v):
    """exp_f32(v) for 0 <= v <= 18.2 (tanh's range): without the overflow, underflow and
    NaN cases, and 2**n in one scaling (exact either way)."""
    n, p = _exp_reduced(v)
    return p * _pow2(np.int32(n))


# -- log: x = m 2^e, m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s) with s = (m-1)/(m+1) -------
_SQRT2 = f32(math.sqrt(2))
_LOG_C = tuple(f32(2 / (2 * k + 1)) for k in range(1, 5))  # 2/3, 2/5, 2/7, 2/9
_TWO23 = f32(2.0 ** 23)


@njit(**JIT)
def log_f32(x):
    x = f32(x)
    if not x > f32(0) or x == _INF:  # 0, negatives, NaN, +inf
        if x == f32(0):
            return -_INF
        return x if (x != x or x == _INF) else _NAN
    e = np.int32(0)
    if x < f32(1.17549435e-38):  # subnormal: scale into the normal range first
        x = x * _TWO23
        e = np.int32(-23)
    return log_scaled(x, e)


@njit(**JIT)
def log_scaled(x, e):
    """log(x * 2**e) for a positive normal x, without branches (Note [branch-free]): what
    log_f32 computes once its special cases are out of the way."""
    bits = f32_as_u32(x)
    e += np.int32(bits >> np.uint32(23)) - np.int32(127)
    m = u32_as_f32((bits & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000))
    big = m > _SQRT2
    m = m * f32(0.5) if big else m
    e = e + np.int32(1) if big else e
    f = m - f32(1)  # exact
    s = f / (f32(2) + f)
    z = s * s
    c = _LOG_C
    r = z * (c[0] + z * (c[1] + z * (c[2] + z * c[3])))
    hf = f32(0.5) * f * f
    log_m = f - (hf - s * (hf + r))  # = 2s + 2s^3/3 + ..., arranged to keep f's bits exact
    ef = f32(e)
    return ef * _LN2_HI + (log_m + ef * _LN2_LO)


@njit(**JIT)
def log1p_f32(x):  # Note [branch-free]
    """log(1 + x) as log_f32(u) * x / (u - 1) with u = fl(1 + x): the factor undoes the
    rounding of 1 + x to first order (Goldberg), so small x keep their precision."""
    x = f32(x)
    u = f32(1) + x
    d = u - f32(1)  # exact
    r = log_f32(u) * (x / d)
    r = x if d == f32(0) else r  # |x| under half an ulp of 1: log1p(x) rounds to x
    r = _NAN if x < f32(-1) else r  # (-inf: NaN times NaN, whose sign a vector loop may flip)
    return x if x == _INF else r


# -- tanh: odd polynomial near 0, 1 - 2/(e^2|x| + 1) beyond ----------------------------------
_TANH_Q = tuple(f32(v) for v in (
    -0.3333333326584929, 0.13333310765282577, -0.05396049174509566, 0.021776904598959423,
    -0.00836582363676626, 0.0023141252280051787))


# Note [branch-free]: each candidate is computed for every element and one is selected, so
# LLVM turns the choice into vector selects and the loop vectorises (branches would not).
@njit(**JIT)
def tanh_f32(x):
    x = f32(x)
    a = abs(x)
    z = x * x
    c = _TANH_Q
    q = c[0] + z * (c[1] + z * (c[2] + z * (c[3] + z * (c[4] + z * c[5]))))
    small = x + x * z * q
    e = _exp_small(f32(2) * min(a, f32(9.1)))
    t = f32(1) - f32(2) / (e + f32(1))  # rounds to exactly 1 from |x| = 9.1 on
    large = t if x > 0 else -t
    r = small if a < f32(0.625) else large
    return np.copysign(r, x) if x == x else x  # (tanh(-0.0) is -0.0: small gives +0.0)


@njit(**JIT)
def sigmoid_f32(x):
    return f32(1) / (f32(1) + exp_f32(-f32(x)))


# -- erf: x Q(x^2) below 0.84, 1 - erfc polynomials up to 3.92, +-1 beyond -----------------------
_ERF_SMALL = tuple(f32(v) for v in (
    1.1283791670945957, -0.3761263887254317, 0.11283790624159427, -0.02686604288914533,
    0.005223228374287174, -0.0008524629310984505, 0.000116384635616313, -1.1017690659127515e-05))
_ERFC_MID = tuple(f32(v) for v in (
    0.031586503380273516, -0.1119595351152126, 0.1701784469550649, -0.13512772404243714,
    0.045972086138158626, 0.012588504215690549, -0.018648102770650564, 0.0050929204861793744,
    0.002105214962362903, -0.0016727341026608192, 4.8920999825853375e-05,
    0.00021304125384490714))
_ERFC_TAIL = tuple(f32(v) for v in (
    1.5081754858161957e-05, -9.678395631466503e-05, 0.00029620430722886274,
    -0.0005725782661721781, 0.0007767321726823825, -0.0007745707246400665,
    0.0005856682082358111, -0.00034105834211710785, 0.00012949259185427329,
    -3.6576162621247957e-06, -1.4838799051203125e-05))


@njit(**JIT)
def _horner(c, t):
    """c[0] + c[1] t + ... + c[-1] t^(n-1) (the loop unrolls: len(c) is a compile-time constant)."""
    p = c[len(c) - 1]
    for i in range(len(c) - 2, -1, -1):
        p = p * t + c[i]
    return p


@njit(**JIT)
def erf_f32(x):  # Note [branch-free]
    x = f32(x)
    a = abs(x)
    z = x * x
    c = _ERF_SMALL
    q = c[6] + z * c[7]
    q = c[5] + z * q
    q = c[4] + z * q
    q = c[3] + z * q
    q = c[2] + z * q
    q = c[1] + z * q
    q = (c[0] - f32(1)) + z * q  # c[0] - 1 is exact; x + x*q keeps x's bits
    small = x + x * q
    mid = f32(1) - _horner(_ERFC_MID, a - f32(1.52))
    tail = f32(1) - _horner(_ERFC_TAIL, min(a, f32(3.92)) - f32(3.06))
    r = mid if a < f32(2.2) else tail
    r = r if a < f32(3.92) else f32(1)
    r = r if x > 0 else -r
    r = small if a < f32(0.84) else r
    return r if x == x else x


# -- the standard normal CDF (gelu's): one polynomial per side of 1.5 ------------------------
# Note [gelu's CDF]
# gelu(x) = x Phi(x). Through erf that is three polynomials (erf_f32 keeps its relative
# accuracy out to 3.92) and a cancelling 1 + erf for x < -1, about 60 vector instructions per
# 16 elements: the kernel was compute-bound at 1.8x torch's time. gelu needs less: Phi to
# within ~1 ulp where Phi >= 1/2 (x >= 0), relative accuracy on [-1.5, 0], and beyond -1.5
# only an absolute error well under torch's own (its 1 + erf(x/sqrt 2) cancels). So
# Phi = 1/2 + x Q(x^2) for |x| < 1.5, and one polynomial R(|x|) = Phi(-|x|) on [1.5, 5.5]
# (Phi(x) = 1 - R for x > 0): 20 coefficients instead of 31, no 1 + erf cancellation, and
# Phi(-5.5) = 1.9e-8 is where R stops (0 beyond: x Phi(x) under 1.1e-7 there; 1 - R rounds
# to 1 on the other side). NaN gives Phi = 0, so x Phi(x) stays NaN, and x = -inf gives NaN
# as torch's CPU kernel does. docs/numerics.md has the measured errors.
_PHI_SMALL = tuple(f32(v) for v in (
    0.39894228001555077, -0.06649034923578427, 0.009973304714216806, -0.0011865989187770578,
    0.0001144458428767279, -8.75223168709491e-06, 4.16428871041195e-07))
_PHI_TAIL = tuple(f32(v) for v in (
    0.0002326211766429133, -0.0008726304014378743, 0.0015273877118692238,
    -0.001636688489150544, 0.0011764444857984893, -0.0005776675464483576,
    0.00018170128984358678, -2.23665369677452e-05, -1.0786982747912384e-05,
    6.486606347786811e-06, -9.154847258202751e-07, -2.625406703752974e-07,
    7.528703349938732e-08))
_PHI_SPLIT, _PHI_END = f32(1.5), f32(5.5)


@njit(**JIT)
def normal_cdf_f32(x):  # Note [branch-free]
    x = f32(x)
    a = abs(x)
    small = f32(0.5) + x * _horner(_PHI_SMALL, x * x)
    tail = _horner(_PHI_TAIL, min(a, _PHI_END) - f32(3.5))
    tail = tail if a < _PHI_END else f32(0)
    big = f32(1) - tail if x > f32(0) else tail
    return small if a < _PHI_SPLIT else big


# -- sin, cos: x = n pi/2 + r (two-part Cody-Waite in float64), |r| <= pi/4, Taylor polynomials
_TWO_OVER_PI = f32(2 / math.pi)
_TRIG_MAX = f32(8192)  # (beyond: _reduce_large)
_SIN_C = tuple(f32((-1) ** k / math.factorial(2 * k + 1)) for k in range(1, 5))
_COS_C = tuple(f32((-1) ** k / math.factorial(2 * k)) for k in range(2, 6))


@njit(**JIT)
def _sin_poly(r):
    z = r * r
    c = _SIN_C
    # sin has r's sign for |r| <= pi/4; copysign keeps sin(-0.0) = -0.0
    return np.copysign(r + r * z * (c[0] + z * (c[1] + z * (c[2] + z * c[3]))), r)


@njit(**JIT)
def _cos_poly(r):
    z = r * r
    c = _COS_C
    return f32(1) - f32(0.5) * z + z * z * (c[0] + z * (c[1] + z * (c[2] + z * c[3])))


# Note [Trigonometric reduction]
# Near a multiple of pi/2 the remainder r is tiny and every bit of pi/2 it lost shows as
# relative error: three fp32 parts of pi/2 (46 bits) left r ~1e-10 off, up to 688 ulp in sin
# and cos near their zeros (sin(-4476.77)). In float64, pi/2 = hi + lo with 33 bits in hi
# (n * hi exact for n < 2**20) and lo its next 53 bits (from Machin's pi below) leaves r
# ~2**-73 off: within an ulp of the exact remainder for every fp32 x below 8192.
@njit(**JIT)
def _reduce(x):
    n = np.floor(x * _TWO_OVER_PI + f32(0.5))
    r = (np.float64(x) - np.float64(n) * _PIO2_HI) - np.float64(n) * _PIO2_LO
    return f32(r), np.int32(n) & np.int32(3)


# Note [Large trigonometric arguments]
# From 8192 on, n * pi/2 is no longer exact in three fp32 parts, so large arguments are
# reduced in float64 with a table: x = m * 2**e (m the 24-bit significand), and
# x * 2/pi mod 4 = m * T[e] mod 4 with T[e] = 2**e * 2/pi mod 4 as a double-double (from
# Machin's pi to 400 bits), the product formed exactly with an FMA. The fraction left, times
# pi/2, is the remainder in [-pi/4, pi/4] to ~2**-70, rounded to fp32 for the polynomials.
# No libm call: np.sin in a rare branch was an LLVM intrinsic that the vectorizer ran for
# every element (randn of 1M, Box-Muller's cosine, took 38 ms; now 2 ms).
def _pi_fixed(bits: int) -> int:
    """floor(pi * 2**bits), from Machin's formula in integers."""
    one = 1 << (bits + 16)

    def atan_inv(x: int) -> int:
        total, term, n, sign = 0, one // x, 1, 1
        while term:
            total += sign * (term // n)
            term //= x * x
            n, sign = n + 2, -sign
        return total

    return (16 * atan_inv(5) - 4 * atan_inv(239)) >> 16


def _reduction_table():
    """(hi, lo) float64 arrays: T[e - _E_MIN] = 2**e * 2/pi mod 4 as hi + lo."""
    from fractions import Fraction

    bits = 400
    pi = Fraction(_pi_fixed(bits), 1 << bits)
    his, los = [], []
    for e in range(_E_MIN, _E_MAX + 1):
        t = (Fraction(2) ** e * 2 / pi) % 4
        hi = float(t)
        his.append(hi)
        los.append(float(t - Fraction(hi)))
    return np.array(his), np.array(los)


_E_MIN, _E_MAX = 13 - 23, 127 - 23  # x = m * 2**e, 2**13 <= |x| < 2**128
_T_HI, _T_LO = _reduction_table()
_PIO2_F64 = math.pi / 2


def _pio2_parts():
    """pi/2 = hi + lo: hi with 33 significant bits, lo the float64 nearest the rest."""
    from fractions import Fraction

    pio2 = Fraction(_pi_fixed(200), 1 << 201)
    hi = _split(float(pio2), 33)[0]
    return hi, float(pio2 - Fraction(hi))


_PIO2_HI, _PIO2_LO = _pio2_parts()  # (Note [Trigonometric reduction])


@njit(inline="always", **JIT)
def _reduce_large(x):
    """(r, n & 3) for |x| >= 8192 (finite) with x = n * pi/2 + r: Note [Large trigonometric
    arguments]. Any other x gives a valid (unused) result: the table index is clamped."""
    u = f32_as_u32(abs(x))
    m = np.float64((u & np.uint32(0x7FFFFF)) | np.uint32(0x800000))
    k = min(max(np.int32(u >> np.uint32(23)) - np.int32(150) - _E_MIN, 0), _E_MAX - _E_MIN)
    hi, lo = _T_HI[k], _T_LO[k]
    p1 = m * hi
    p2 = np.float64(fma64(m, hi, -p1))  # m * hi = p1 + p2 exactly
    n1 = np.floor(p1 + 0.5)
    f = (p1 - n1) + p2 + m * lo
    n2 = np.floor(f + 0.5)
    f -= n2
    n = np.int64(n1) + np.int64(n2)
    if x < 0:
        f, n = -f, -n
    return f32(f * _PIO2_F64), np.int32(n & 3)


@njit(inline="always", **JIT)  # (too large for LLVM to inline: a call per element)
def sin_f32(x):
    x = f32(x)
    r, q = _reduce(x)
    r_large, q_large = _reduce_large(x)  # (computed always: a branch kept LLVM from
    if not abs(x) < _TRIG_MAX:  # vectorizing its table loads; a select does not)
        r, q = r_large, q_large
    v = _cos_poly(r) if q & 1 else _sin_poly(r)  # (Note [branch-free]: both polynomials,
    v = -v if q & 2 else v  # then selects; random quadrants mispredicted each branch)
    return v if abs(x) < _INF else x - x  # inf, NaN: NaN


@njit(inline="always", **JIT)
def cos_f32(x):
    x = f32(x)
    r, q = _reduce(x)
    r_large, q_large = _reduce_large(x)  # (computed always: a branch kept LLVM from
    if not abs(x) < _TRIG_MAX:  # vectorizing its table loads; a select does not)
        r, q = r_large, q_large
    v = _sin_poly(r) if q & 1 else _cos_poly(r)  # (as sin_f32)
    v = -v if (q + 1) & 2 else v
    return v if abs(x) < _INF else x - x


@njit(**JIT)
def rsqrt_f32(x):
    """1/sqrt(x): fp32 sqrt and division are correctly rounded instructions (<= 1 ulp)."""
    return f32(1) / np.sqrt(f32(x))
