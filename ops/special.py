"""Less common elementwise math (xlogy, logaddexp, copysign, fmax/fmin, logit, sinc, ...).

Built like the arithmetic family (`arithmetic.define`); transcendentals go through the
activation family's one-per-function helpers (`exp_f32`, `log_f32`, ...), so a faster
approximation there serves these ops too.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.ops import elementwise as E
from neuron_eager.ops.activation import exp_f32, log1p_f32, log_f32, sin_f32
from neuron_eager.ops.arithmetic import define
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
    return m + log1p_f32(exp_f32(-abs(a - b) * _LN2)) / _LN2


@njit
def _fmax(a, b):
    if a != a:
        return b
    if b != b:
        return a
    return a if a > b else b


@njit
def _fmin(a, b):
    if a != a:
        return b
    if b != b:
        return a
    return a if a < b else b


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
       [aten.xlogy_.Tensor, aten.xlogy_.Scalar_Other], kind="int_to_float", engine="scalar")
define("xlog1py", _xlog1py.py_func, [aten.special_xlog1py.default,
                                      aten.special_xlog1py.self_scalar,
                                      aten.special_xlog1py.other_scalar],
       kind="int_to_float", engine="scalar")
define("logaddexp", _logaddexp.py_func, [aten.logaddexp.default], kind="int_to_float",
       engine="scalar", float_only=True, inline=True)
define("logaddexp2", _logaddexp2.py_func, [aten.logaddexp2.default], kind="int_to_float",
       engine="scalar", float_only=True)
define("fmax", _fmax.py_func, [aten.fmax.default])
define("fmin", _fmin.py_func, [aten.fmin.default])
define("copysign", lambda a, b: np.copysign(a, b), [aten.copysign.Tensor, aten.copysign.Scalar],
       [aten.copysign_.Tensor, aten.copysign_.Scalar], kind="int_to_float")
define("heaviside", _heaviside.py_func, [aten.heaviside.default], [aten.heaviside_.default])
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
define("nextafter", lambda a, b: np.nextafter(a, b), [aten.nextafter.default], float_only=True)

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
