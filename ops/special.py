"""Less common elementwise math (xlogy, logaddexp, copysign, fmax/fmin, logit, sinc, ...).

Built like the arithmetic family (`arithmetic.define`); transcendentals go through the
activation family's one-per-function helpers (`exp_f32`, `log_f32`, ...), so a faster
approximation there serves these ops too.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.ops import elementwise as E, numerics
from neuron_eager.ops.activation import exp2_f32, exp_f32, log1p_f32, log_f32, sin_f32
from neuron_eager.ops.arithmetic import define, float_only
from neuron_eager.ops.jit import njit
from neuron_eager.ops.registry import register

aten = torch.ops.aten
_0, _1 = np.float32(0), np.float32(1)
_PI = np.float32(math.pi)
_LN2 = np.float32(math.log(2))


@njit
def _xlogy(x, y):
    if y != y:
        return y
    return _0 if x == 0 else x * log_f32(y)  # +0 for either zero, as the CPU


@njit
def _xlog1py(x, y):
    if y != y:
        return y
    return _0 if x == 0 else x * log1p_f32(y)


@njit
def _logaddexp(a, b):
    if a == b and (a == np.inf or a == -np.inf):
        return a
    m = max(a, b)
    return m + log1p_f32(exp_f32(-abs(a - b)))


@njit
def _logaddexp2(a, b):
    if a == b and (a == np.inf or a == -np.inf):
        return a
    m = max(a, b)
    # 2^-d directly, as the CPU: exp(-d ln 2) carried fp32's rounding of d ln 2 (12 ulp at d=30)
    return m + log1p_f32(exp2_f32(-abs(a - b))) / _LN2


@njit
def _fmax(a, b):
    if a != a:
        return b
    if b != b:
        return a
    return a if a >= b else b  # a tie gives a, as the CPU does: fmax(0.0, -0.0) is 0.0


@njit
def _fmin(a, b):
    if a != a:
        return b
    if b != b:
        return a
    return a if a <= b else b


@njit
def _heaviside(x, v):
    if x == 0:
        return v
    return 1 if x > 0 else 0  # NaN gives 0, as the CPU


@njit
def _sinc(x):
    if x == 0:
        return _1
    px = _PI * x
    return sin_f32(px) / px


@njit
def _logit(x, eps, use_eps):
    if use_eps:
        x = min(max(x, eps), _1 - eps)
    return log_f32(x / (_1 - x))


define("xlogy", _xlogy.py_func, [aten.xlogy.Tensor, aten.xlogy.Scalar_Self,
                                  aten.xlogy.Scalar_Other],
       [aten.xlogy_.Tensor, aten.xlogy_.Scalar_Other], kind="int_to_float", engine="scalar",
       round_scalars=True)  # (the CPU rounds a Python number to a bf16/fp16 result's dtype)
define("xlog1py", _xlog1py.py_func, [aten.special_xlog1py.default,
                                      aten.special_xlog1py.self_scalar,
                                      aten.special_xlog1py.other_scalar],
       kind="int_to_float", engine="scalar")
define("logaddexp", _logaddexp.py_func, [aten.logaddexp.default], kind="int_to_float",
       engine="scalar", float_only=True, inline=True, check=float_only("logaddexp_cpu"))
define("logaddexp2", _logaddexp2.py_func, [aten.logaddexp2.default], kind="int_to_float",
       engine="scalar", float_only=True, check=float_only("logaddexp2_cpu"))
define("fmax", _fmax.py_func, [aten.fmax.default])
define("fmin", _fmin.py_func, [aten.fmin.default])
define("copysign", lambda a, b: np.copysign(a, b), [aten.copysign.Tensor, aten.copysign.Scalar],
       [aten.copysign_.Tensor, aten.copysign_.Scalar], kind="int_to_float")
def _same_dtypes(x, values):
    if isinstance(values, torch.Tensor) and x.dtype != values.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")


define("heaviside", _heaviside.py_func, [aten.heaviside.default], [aten.heaviside_.default],
       check=_same_dtypes)
define("sinc", _sinc.py_func, [aten.sinc.default], [aten.sinc_.default], operands=1,
       kind="int_to_float", engine="scalar")
define("deg2rad", lambda x: x * np.float32(math.pi / 180), [aten.deg2rad.default],
       [aten.deg2rad_.default], operands=1, kind="int_to_float")
define("rad2deg", lambda x: x * np.float32(180 / math.pi), [aten.rad2deg.default],
       [aten.rad2deg_.default], operands=1, kind="int_to_float")
define("signbit", lambda x: np.signbit(x), [aten.signbit.default],
       operands=1, kind="always_bool")
define("frac", lambda x: x - np.trunc(x), [aten.frac.default], [aten.frac_.default],
       operands=1, float_only=True)
def _hypot(a, b):
    # scaled by the larger magnitude, so squares neither overflow nor underflow in fp32;
    # an infinite side gives inf even beside NaN (IEEE hypot)
    a, b = abs(a), abs(b)
    if a == np.inf or b == np.inf:
        return np.float32(np.inf)
    big, small = (a, b) if a >= b else (b, a)
    if big == 0 or big != big or small != small:
        return big + small
    r = small / big
    return big * np.sqrt(np.float32(1) + r * r)


define("hypot", _hypot, [aten.hypot.default], [aten.hypot_.default], float_only=True)
# nextafter steps one ulp of the tensors' own type: a 16-bit value, computed in fp32, moves
# to the next bf16/fp16 value (fp32's next value would round back to the input)
_NEXTAFTER = E.Elementwise("nextafter", njit(lambda a, b: np.nextafter(a, b)), float_only=True)


@njit
def _nextafter_bf16(a, b):
    if a != a or b != b:
        return a + b
    if a == b:
        return b
    if a == 0:  # the smallest subnormal bf16, with b's sign
        return np.copysign(numerics.u32_as_f32(np.uint32(0x10000)), b)
    bits = numerics.f32_as_u32(a)  # bf16 values are fp32 values with 16 zero low bits
    away = (b > a) == (a > 0)
    return numerics.u32_as_f32(bits + np.uint32(0x10000) if away else bits - np.uint32(0x10000))


@njit
def _nextafter_f16(a, b):
    if a != a or b != b:
        return a + b
    if a == b:
        return b
    tiny = np.float32(2.0 ** -24)  # fp16's subnormal spacing
    if a == 0:
        return np.copysign(tiny, b)
    m = abs(a)
    if m == np.inf:  # toward a finite b: the largest fp16
        return np.copysign(np.float32(65504.0), a)
    step = tiny
    bottom = False
    if m >= np.float32(2.0 ** -14):  # a normal fp16: its binade's spacing
        e = np.int32((numerics.f32_as_u32(m) >> np.uint32(23)) & np.uint32(0xFF)) - 127
        step = numerics.u32_as_f32(np.uint32(e - 10 + 127) << np.uint32(23))
        bottom = e > -14 and m == numerics.u32_as_f32(np.uint32(e + 127) << np.uint32(23))
    if (b > a) == (a > 0):
        return np.copysign(m + step, a)  # (65504 + 32 rounds to inf, as it should)
    if bottom:  # below a power of two the spacing halves
        step = step / 2
    return np.copysign(m - step, a)  # (a zero keeps a's sign)


_NEXTAFTER_16 = {torch.bfloat16: E.Elementwise("nextafter_bf16", _nextafter_bf16, float_only=True),
                 torch.float16: E.Elementwise("nextafter_f16", _nextafter_f16, float_only=True)}


def _nextafter_op(a, b):
    dtype = E.result_type(a, b)
    return _NEXTAFTER_16.get(dtype, _NEXTAFTER)


@register(aten.nextafter.default)
def nextafter(a, b):
    return E.run(_nextafter_op(a, b), (a, b))


nextafter.checks_devices = True


@E.fusible(aten.nextafter.default)
def _nextafter_plan(a, b):
    return _nextafter_op(a, b), (a, b), ()

_LOGIT = E.Elementwise("logit", _logit, nparams=2, kind="int_to_float", engine="scalar")


@register(aten.logit.default)
def logit(x, eps=None):
    return E.run(_LOGIT, [x], [0.0 if eps is None else eps, eps is not None])


@register(aten.logit_.default)
def logit_(x, eps=None):
    return E.run(_LOGIT, [x], [0.0 if eps is None else eps, eps is not None], out=x)


@njit
def _round_decimals(x, scale):
    return np.rint(x * scale) / scale if scale > 0 else np.rint(x / -scale) * -scale


_ROUND_DECIMALS = E.Elementwise("round_decimals", _round_decimals, nparams=1)


@register(aten.round.decimals)
def round_decimals(x, *, decimals=0):
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f"\"round_cpu\" not implemented for '{E.T.dtype_name(x.dtype)}'")
    scale = 10.0 ** decimals if decimals >= 0 else -(10.0 ** -decimals)
    return E.run(_ROUND_DECIMALS, [x], [scale])


@register(aten.equal.default)
def equal(a, b):
    """True when both have the same size and elements (a host read of one bool, as on CUDA)."""
    if not isinstance(b, E.NeuronTensor):
        E.T.check_foreign(b)
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bool(aten.all.default(aten.eq.Tensor(a, b)).item())


# ldexp with an integer exponent scales exactly and rounds once, in the input's dtype (the
# CPU's std::ldexp): 0.5 * 2**128 is 1.7e38, where 2**128 alone overflows fp32. Any other
# operands multiply by 2**e, as the CPU does then.
@njit
def _ldexp(x, e):
    k = np.int64(max(min(e, np.float32(400)), np.float32(-400)))  # beyond: 0 or inf anyway
    return np.float32(math.ldexp(np.float64(x), k))


_LDEXP = E.Elementwise("ldexp", _ldexp, float_only=True)


@register(aten.ldexp.Tensor)
def ldexp(x, e):
    if x.dtype.is_floating_point and not (e.dtype.is_floating_point or e.dtype.is_complex):
        return E.run(_LDEXP, (x, e))
    return torch.mul(x, torch.pow(2.0, e))
