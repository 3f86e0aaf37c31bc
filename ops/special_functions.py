"""Special mathematical functions: gamma family (digamma, lgamma, polygamma, mvlgamma, zeta,
igamma/igammac), erfinv, ndtri, log_ndtr, erfcx, entr; registers those plus the Bessel family
(kernels in `special_bessel`) and the orthogonal polynomials (`special_polynomials`) through
the elementwise machinery (promotion, broadcasting, strides, 16-bit storage, in-place/out=).

Algorithms follow Cephes as PyTorch's float32 CPU kernels do, in fp32. Exceptions, in float64
inside the kernel: zeta (and polygamma n >= 2, which uses it) because PyTorch's CPU zeta
accumulates in double; erfcx and igamma/igammac, whose fp32 forms lose more than 1e-4.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.ops import elementwise as E
from neuron_eager.ops import special_bessel as B
from neuron_eager.ops.activation import erf_f32, erfc_f32, exp_f32, log1p_f32, log_f32, sin_f32
from neuron_eager.ops.fastmath import log_scaled
from neuron_eager.ops.jit import njit
from neuron_eager.ops.kernelgen import JIT_OPTIONS
from neuron_eager.ops.registry import register
from neuron_eager.ops.special_polynomials import POLYNOMIALS

aten = torch.ops.aten
f32 = np.float32
jit = njit(**JIT_OPTIONS)
_0, _HALF, _1, _2, _10 = f32(0), f32(0.5), f32(1), f32(2), f32(10)
_INF, _NAN = f32(np.inf), f32(np.nan)
_PI = f32(math.pi)
_polevl = B.polevl


def _f32(*values):
    return np.array(values, dtype=np.float32)


# -- digamma, trigamma, polygamma, zeta (Cephes) --------------------------------------------
_DIGAMMA_A = _f32(0.08333333333333333, -0.021092796092796094, 0.007575757575757576,
                  -0.004166666666666667, 0.003968253968253968, -0.008333333333333333,
                  0.08333333333333333)
_PSI_10 = f32(2.25175258906672110764)
_ZETA_A = np.array([12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1892437580.3183792,
                    74724249600.0, -2950130727918.164, 116467828143500.67, -4597978722407473.0,
                    1.8152105401943546e+17, -7.166165256175667e+18])


@jit
def _digamma_pos(x):
    result = _0
    while x < _10:
        result -= _1 / x
        x += _1
    if x == _10:
        return result + _PSI_10
    y = _0
    if x < f32(1e17):
        z = _1 / (x * x)
        y = z * _polevl(z, _DIGAMMA_A)
    return result + log_f32(x) - _HALF / x - y


@jit
def digamma(x):
    if x == _0:
        return _INF if np.signbit(x) else -_INF  # copysign(inf, -x)
    if x < _0:
        if x == np.trunc(x):
            return _NAN
        r = np.float64(x) - np.trunc(np.float64(x))  # reflection term in double, as on CPU
        return _digamma_pos(_1 - x) - f32(math.pi / math.tan(math.pi * r))
    return _digamma_pos(x)


@jit
def trigamma(x):
    sign = _1
    result = _0
    if x < _HALF:
        sign = -_1
        s = sin_f32(_PI * x)
        result -= (_PI * _PI) / (s * s)
        x = _1 - x
    for _ in range(6):
        result += _1 / (x * x)
        x += _1
    ixx = _1 / (x * x)
    tail = ixx * (f32(1 / 6) - ixx * (f32(1 / 30) - ixx * f32(1 / 42)))
    result += (_1 + _1 / (_2 * x) + tail) / x
    return sign * result


@jit
def _zeta64(x, q):
    """Hurwitz zeta by Euler-Maclaurin, in float64 (PyTorch's CPU zeta accumulates in double)."""
    machep = 1.11022302462515654042e-16
    if x == 1.0:
        return np.inf
    if x < 1.0:
        return np.nan
    if q <= 0.0:
        if q == math.floor(q):
            return np.inf
        if x != math.floor(x):
            return np.nan
    s = q ** -x
    a = q
    i = 0
    b = 0.0
    while i < 9 or a <= 9.0:
        i += 1
        a += 1.0
        b = a ** -x
        s += b
        if -machep * s < b < machep * s:
            return s
    w = a
    s += b * w / (x - 1.0)
    s -= 0.5 * b
    a = 1.0
    k = 0.0
    for j in range(12):
        a *= x + k
        b /= w
        t = a * b / _ZETA_A[j]
        s = s + t
        if abs(t / s) < machep:
            return s
        k += 1.0
        a *= x + k
        b /= w
        k += 1.0
    return s


@jit
def zeta(x, q):
    return f32(_zeta64(np.float64(x), np.float64(q)))


@jit
def polygamma(x, n):
    k = np.int64(n)
    if k == 0:
        return digamma(x)
    if k == 1:
        return trigamma(x)
    sign = _1 if k % 2 else -_1
    return sign * exp_f32(f32(math.lgamma(f32(k) + _1))) * zeta(f32(k + 1), x)


@jit
def lgamma(x):  # libm lgamma through Numba, like the other transcendental helpers
    return f32(math.lgamma(x))


@jit
def mvlgamma(x, p):
    s = _0
    for j in range(np.int64(p)):
        s += lgamma(x + f32(-0.5 * (p - 1 - j)))
    return s + f32(p * (p - 1) * math.log(math.pi) / 4)


# -- incomplete gamma, float64 series / continued fraction ----------------------------------
@jit
def _iterations(a):
    """Both expansions need O(sqrt(a)) terms when x is near a (about 9 sqrt(a) for 1e-16)."""
    return 2000 + np.int64(20.0 * math.sqrt(min(a, 1e10)))


@jit
def _igam_series(a, x):
    """P(a, x) by its power series (converges for all x; used for x < a + 1)."""
    ax = a * math.log(x) - x - math.lgamma(a)
    if ax < -745.0:
        return 0.0
    r, c, total = a, 1.0, 1.0
    for _ in range(_iterations(a)):
        r += 1.0
        c *= x / r
        total += c
        if c <= 1.1e-16 * total:
            break
    return total * math.exp(ax) / a


@jit
def _igamc_cf(a, x):
    """Q(a, x) by Lentz's continued fraction (used for x >= a + 1)."""
    ax = a * math.log(x) - x - math.lgamma(a)
    if ax < -745.0:
        return 0.0
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, _iterations(a)):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1.1e-16:
            break
    return math.exp(ax) * h


@jit
def _igamma64(a, x, upper):
    # the CPU's order of special cases: a NaN falls through the comparisons to its result
    # (P(nan, 0) is 0, P(nan, inf) is 1, P(inf, nan) is 0)
    if x < 0.0 or a < 0.0:
        return np.nan
    if a == 0.0:
        if x > 0.0:
            return 0.0 if upper else 1.0
        return np.nan
    if x == 0.0:
        return 1.0 if upper else 0.0
    if a == np.inf:
        if x == np.inf:
            return np.nan
        return 1.0 if upper else 0.0
    if x == np.inf:
        return 0.0 if upper else 1.0
    if a != a or x != x:
        return np.nan
    if x < a + 1.0:
        p = _igam_series(a, x)
        return 1.0 - p if upper else p
    q = _igamc_cf(a, x)
    return q if upper else 1.0 - q


@jit
def igamma(a, x):
    return f32(_igamma64(np.float64(a), np.float64(x), False))


@jit
def igammac(a, x):
    return f32(_igamma64(np.float64(a), np.float64(x), True))


# -- error-function family -----------------------------------------------------------------
_EI_A = _f32(0.886226899, -1.645349621, 0.914624893, -0.140543331)
_EI_B = _f32(-2.118377725, 1.442710462, -0.329097515, 0.012229801)
_EI_C = _f32(-1.970840454, -1.624906493, 3.429567803, 1.641345311)
_EI_D = _f32(3.543889200, 1.637067800)
_2_SQRTPI = f32(2 / math.sqrt(math.pi))
_TINY = f32(1.17549435e-38)  # the smallest normal fp32


@njit(inline="always", **JIT_OPTIONS)
def _erf_minus(x, y, ya):
    """erf(x) - y for Newton's step, where x has y's sign. Beyond |y| = 1/2 as (1 - |y|) -
    erfc(|x|), signed: 1 - |y| is exact there and erfc keeps its relative accuracy, while
    erf(x) near 1 carries an absolute error of half an ulp of 1, which the step divides by
    the small slope 2/sqrt(pi) exp(-x^2) (58 ulp at |y| = 1 - 6e-8 that way). (Negated
    for a negative y, not copysign: the difference has either sign.)"""
    near = (_1 - ya) - erfc_f32(abs(x))
    near = -near if y < 0 else near
    return near if ya > f32(0.5) else erf_f32(x) - y


@njit(inline="always", **JIT_OPTIONS)  # Note [Inlined op bodies] in ops/elementwise.py
def erfinv(y):
    """Rational first guess refined by two Newton steps (PyTorch's CPU algorithm), without
    branches (Note [branch-free] in ops/fastmath.py): both guesses are formed and one kept,
    and the body is inlined, so the loop vectorises (a call per element with branches: ~70
    ns an element)."""
    ya = abs(y)
    z = y * y
    num = ((_EI_A[3] * z + _EI_A[2]) * z + _EI_A[1]) * z + _EI_A[0]
    dem = (((_EI_B[3] * z + _EI_B[2]) * z + _EI_B[1]) * z + _EI_B[0]) * z + _1
    central = y * num / dem
    # (1 - |y|) / 2 >= 2**-25 for |y| < 1; the clamp keeps the unused lanes' log finite
    t = np.sqrt(-log_scaled(max((_1 - ya) / _2, _TINY), np.int32(0)))
    num = ((_EI_C[3] * t + _EI_C[2]) * t + _EI_C[1]) * t + _EI_C[0]
    dem = (_EI_D[1] * t + _EI_D[0]) * t + _1
    x = central if ya <= f32(0.7) else np.copysign(num, y) / dem
    x = x - _erf_minus(x, y, ya) / (_2_SQRTPI * exp_f32(-x * x))
    x = x - _erf_minus(x, y, ya) / (_2_SQRTPI * exp_f32(-x * x))
    edge = np.copysign(_INF, y) if ya == _1 else _NAN  # (|y| > 1 and NaN: NaN)
    return x if ya < _1 else edge


_NDTRI_P0 = _f32(-59.96335010141079, 98.00107541859997, -56.67628574690703, 13.931260938727968,
                 -1.2391658386738125)
_NDTRI_Q0 = _f32(1.0, 1.9544885833814176, 4.676279128988815, 86.36024213908905,
                 -225.46268785411937, 200.26021238006066, -82.03722561683334, 15.90562251262117,
                 -1.1833162112133)
_NDTRI_P1 = _f32(4.0554489230596245, 31.525109459989388, 57.16281922464213, 44.08050738932008,
                 14.684956192885803, 2.1866330685079025, -0.1402560791713545,
                 -0.03504246268278482, -0.0008574567851546854)
_NDTRI_Q1 = _f32(1.0, 15.779988325646675, 45.39076351288792, 41.3172038254672, 15.04253856929075,
                 2.504649462083094, -0.14218292285478779, -0.03808064076915783,
                 -0.0009332594808954574)
_NDTRI_P2 = _f32(3.2377489177694603, 6.915228890689842, 3.9388102529247444, 1.3330346081580755,
                 0.20148538954917908, 0.012371663481782003, 0.00030158155350823543,
                 2.6580697468673755e-06, 6.239745391849833e-09)
_NDTRI_Q2 = _f32(1.0, 6.02427039364742, 3.6798356385616087, 1.3770209948908132,
                 0.21623699359449663, 0.013420400608854318, 0.00032801446468212774,
                 2.8924786474538068e-06, 6.790194080099813e-09)
_EXP_M2 = f32(0.13533528323661269189)


@jit
def ndtri(y0):
    if y0 == _0:
        return -_INF
    if y0 == _1:
        return _INF
    if y0 < _0 or y0 > _1 or y0 != y0:
        return _NAN
    code = True
    y = y0
    if y > _1 - _EXP_M2:
        y = _1 - y
        code = False
    if y > _EXP_M2:
        y = y - _HALF
        y2 = y * y
        x = y + y * (y2 * _polevl(y2, _NDTRI_P0) / _polevl(y2, _NDTRI_Q0))
        return x * f32(2.50662827463100050242)
    x = np.sqrt(f32(-2) * log_f32(y))
    x0 = x - log_f32(x) / x
    z = _1 / x
    if x < f32(8):
        x1 = z * _polevl(z, _NDTRI_P1) / _polevl(z, _NDTRI_Q1)
    else:
        x1 = z * _polevl(z, _NDTRI_P2) / _polevl(z, _NDTRI_Q2)
    x = x0 - x1
    return -x if code else x


@jit
def _erfcx64(x):
    """exp(x^2) erfc(x) in float64: in fp32 the x^2 rounding alone costs ~x^2 ulp."""
    if x != x:
        return x
    if x >= 0.0:
        if x > 5e7:
            return 0.56418958354775628694807945156 / x
        if x > 10.0:  # continued fraction, as Faddeeva's erfcx does past 50
            xx = x * x
            return (0.56418958354775628694807945156 * (xx * (xx + 4.5) + 2.0)
                    / (x * (xx * (xx + 5.0) + 3.75)))
        return math.exp(x * x) * math.erfc(x)
    if x < -26.7:
        return np.inf
    if x < -6.1:
        return 2.0 * math.exp(x * x)
    return 2.0 * math.exp(x * x) - _erfcx64(-x)


@jit
def erfcx(x):
    return f32(_erfcx64(np.float64(x)))


_SQRT1_2 = f32(math.sqrt(0.5))


@jit
def log_ndtr(x):
    t = x * _SQRT1_2
    if x < -_1:
        return log_f32(erfcx(-t) / _2) - t * t
    return log1p_f32(-erfc_f32(t) / _2)


@jit
def entr(x):
    if x != x:
        return x
    if x > _0:
        return -x * log_f32(x)
    if x == _0:
        return _0
    return -_INF


# -- registration ---------------------------------------------------------------------------
_HALF_TYPES = (torch.bfloat16, torch.float16)


def _define(name, fn, overloads, half=True, float_only=False):
    """Register `fn` (jitted, fp32 scalars) as an elementwise op; integers promote to float
    unless float_only (then they raise, as igamma does on the CPU).

    half=False refuses bfloat16/float16 results as the CPU does for these functions.
    """
    kind = "default" if float_only else "int_to_float"
    op = E.Elementwise(name, fn, 0, kind, "scalar", float_only)

    @register(*overloads)
    def forward(*args):
        if not half:
            dtype = E.dtypes_for(op, args)[0]
            if dtype in _HALF_TYPES:
                raise NotImplementedError(
                    f"\"{name}\" not implemented for '{E.T.dtype_name(dtype)}'")
        return E.run(op, args)

    forward.checks_devices = True
    return op


_define("digamma", digamma, [aten.digamma.default])
_define("lgamma", lgamma, [aten.lgamma.default])
_define("erfinv", erfinv, [aten.erfinv.default])
_define("i0", B.i0, [aten.i0.default])
_define("special_i0e", B.i0e, [aten.special_i0e.default])
_define("special_i1", B.i1, [aten.special_i1.default])
_define("special_i1e", B.i1e, [aten.special_i1e.default])
_define("special_entr", entr, [aten.special_entr.default])
_define("igamma", igamma, [aten.igamma.default], float_only=True)
_define("igammac", igammac, [aten.igammac.default], float_only=True)
for _name, _fn in [
    ("ndtri", ndtri), ("log_ndtr", log_ndtr), ("erfcx", erfcx), ("airy_ai", B.airy_ai),
    ("bessel_j0", B.bessel_j0), ("bessel_j1", B.bessel_j1), ("bessel_y0", B.bessel_y0),
    ("bessel_y1", B.bessel_y1), ("modified_bessel_i0", B.modified_i0),
    ("modified_bessel_i1", B.modified_i1), ("modified_bessel_k0", B.modified_k0),
    ("modified_bessel_k1", B.modified_k1), ("scaled_modified_bessel_k0", B.scaled_k0),
    ("scaled_modified_bessel_k1", B.scaled_k1), ("spherical_bessel_j0", B.spherical_j0),
]:
    _define(_name, _fn, [getattr(aten, "special_" + _name).default], half=False)
_define("zeta", zeta, [aten.special_zeta.default, aten.special_zeta.self_scalar,
                       aten.special_zeta.other_scalar], half=False)
for _name, _fn in POLYNOMIALS.items():
    _packet = getattr(aten, "special_" + _name)
    _define(_name, _fn, [_packet.default, _packet.x_scalar, _packet.n_scalar], half=False)

_POLYGAMMA = E.Elementwise("polygamma", polygamma, 1, "int_to_float", "scalar")
_MVLGAMMA = E.Elementwise("mvlgamma", mvlgamma, 1, "int_to_float", "scalar")


def _check_n(n):
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")


@register(aten.polygamma.default)
def polygamma_op(n, x):
    _check_n(n)
    return E.run(_POLYGAMMA, [x], [n])


@register(aten.polygamma_.default)  # (self, n): argument order differs from polygamma
def polygamma_inplace(x, n):
    _check_n(n)
    return E.run(_POLYGAMMA, [x], [n], out=x)


@register(aten.mvlgamma.default)
def mvlgamma_op(x, p):
    if p < 1:
        raise RuntimeError("p has to be greater than or equal to 1")
    if x.dtype == torch.bool:
        raise RuntimeError("The input tensor may not be a boolean tensor.")
    return E.run(_MVLGAMMA, [x], [p])


for _fn in (polygamma_op, polygamma_inplace, mvlgamma_op):
    _fn.checks_devices = True
