"""Activation functions and transcendental elementwise ops (Scalar engine), with their backwards.

Every transcendental sits behind one jitted helper (`exp_f32`, `tanh_f32`, ...): a faster
approximation replaces it in one place, and softmax uses the same helpers. Op bodies follow
PyTorch's CPU formulas in fp32 with fp32 constants; the store rounds once.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.ops import elementwise as E
from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops.arithmetic import define
from neuron_eager.ops.fastmath import (cos_f32, erf_f32, exp_f32, log1p_f32,  # noqa: F401
                                      log_f32, normal_cdf_f32, sigmoid_f32, sin_f32,
                                      tanh_f32)
from neuron_eager.ops.jit import njit
from neuron_eager.ops.kernelgen import JIT_OPTIONS
from neuron_eager.ops.registry import before_decomposition, register

aten = torch.ops.aten
f32 = np.float32
_0, _HALF, _1, _3, _6 = f32(0), f32(0.5), f32(1), f32(3), f32(6)
_ONE_SIXTH = f32(1.0 / 6.0)
_GELU_PDF = f32(2 / math.sqrt(math.pi) * math.sqrt(0.5) * 0.5)  # 1/sqrt(2*pi)
_GELU_BETA = f32(math.sqrt(2) * 2 / math.sqrt(math.pi) * 0.5)  # sqrt(2/pi)
_GELU_KAPPA = f32(0.044715)


# -- transcendentals: one helper each, the only place a function's accuracy is decided -----
# Note [Transcendentals]: exp, log, log1p, tanh, sigmoid, erf, sin and cos are the in-kernel
# approximations of ops/fastmath.py (errors measured in docs/numerics.md); the rest call libm
# through Numba (correctly rounded to ~1 ulp in fp32, but scalar calls: slower).
@njit(**JIT_OPTIONS)
def exp2_f32(x):
    return np.exp2(f32(x))


@njit(**JIT_OPTIONS)
def expm1_f32(x):
    return np.expm1(f32(x))


@njit(**JIT_OPTIONS)
def log2_f32(x):
    return np.log2(f32(x))


@njit(**JIT_OPTIONS)
def log10_f32(x):
    return np.log10(f32(x))


@njit(**JIT_OPTIONS)
def erfc_f32(x):
    return f32(math.erfc(f32(x)))


@njit(**JIT_OPTIONS)
def tan_f32(x):
    return np.tan(f32(x))


@njit(**JIT_OPTIONS)
def asin_f32(x):
    return np.arcsin(f32(x))


@njit(**JIT_OPTIONS)
def acos_f32(x):
    return np.arccos(f32(x))


@njit(**JIT_OPTIONS)
def atan_f32(x):
    return np.arctan(f32(x))


@njit(**JIT_OPTIONS)
def sinh_f32(x):
    return np.sinh(f32(x))


@njit(**JIT_OPTIONS)
def cosh_f32(x):
    return np.cosh(f32(x))


@njit(**JIT_OPTIONS)
def asinh_f32(x):
    return np.arcsinh(f32(x))


@njit(**JIT_OPTIONS)
def acosh_f32(x):
    return np.arccosh(f32(x))


@njit(**JIT_OPTIONS)
def atanh_f32(x):
    return np.arctanh(f32(x))


# -- unary math: int and bool inputs compute in float32 -----------------------------------
for _name, _fn in [
    ("exp", lambda x: exp_f32(x)), ("exp2", lambda x: exp2_f32(x)),
    ("expm1", lambda x: expm1_f32(x)), ("log", lambda x: log_f32(x)),
    ("log2", lambda x: log2_f32(x)), ("log10", lambda x: log10_f32(x)),
    ("log1p", lambda x: log1p_f32(x)), ("tanh", lambda x: tanh_f32(x)),
    ("sigmoid", lambda x: sigmoid_f32(x)), ("erf", lambda x: erf_f32(x)),
    ("erfc", lambda x: erfc_f32(x)), ("sin", lambda x: sin_f32(x)),
    ("cos", lambda x: cos_f32(x)), ("tan", lambda x: tan_f32(x)),
    ("asin", lambda x: asin_f32(x)), ("acos", lambda x: acos_f32(x)),
    ("atan", lambda x: atan_f32(x)), ("sinh", lambda x: sinh_f32(x)),
    ("cosh", lambda x: cosh_f32(x)), ("asinh", lambda x: asinh_f32(x)),
    ("acosh", lambda x: acosh_f32(x)), ("atanh", lambda x: atanh_f32(x)),
]:
    define(_name, _fn, [getattr(aten, _name).default], operands=1, kind="int_to_float",
           engine="scalar", inline=_name in ("sin", "cos"))  # (Note [Inlined op bodies])


def _float(name, fn, nparams=0, engine="scalar", inline=False):
    """A float-only op (integer inputs raise, as on CPU); `inline`: Note [Inlined op bodies]."""
    options = dict(JIT_OPTIONS, inline="always") if inline else JIT_OPTIONS
    return E.Elementwise(name, njit(**options)(fn), nparams, engine=engine, float_only=True)


def _refuse_bool(x, name: str, word: str = "Boolean") -> None:
    if x.dtype == torch.bool:
        raise RuntimeError(f"{word} inputs not supported for {name}")


# -- piecewise-linear activations (integers allowed: params arrive in the compute type) -----
def _threshold(x, th, value):
    return value if x <= th else x


def _hardtanh(x, lo, hi):
    y = lo if x < lo else x  # clamp order: max wins when min > max, NaN passes through
    return hi if y > hi else y


def _relu(x, zero):
    # clamp_min(x, 0), as the CPU computes relu: -0.0 and NaN pass through (threshold(x, 0, 0)
    # gives +0.0 for -0.0)
    return zero if x < zero else x


THRESHOLD = E.Elementwise("threshold", njit(**JIT_OPTIONS)(_threshold), 2, engine="scalar")
HARDTANH = E.Elementwise("hardtanh", njit(**JIT_OPTIONS)(_hardtanh), 2, engine="scalar")
RELU = E.Elementwise("relu", njit(**JIT_OPTIONS)(_relu), 1, engine="scalar")


@register(aten.relu.default)
def relu(x):
    _refuse_bool(x, "relu")
    return E.run(RELU, [x], [0])


@register(aten.relu_.default)
def relu_(x):
    _refuse_bool(x, "relu")
    return E.run(RELU, [x], [0], out=x)


def _threshold_plan(x, threshold, value):
    if x.dtype == torch.bool:
        raise NotImplementedError("\"threshold_cpu\" not implemented for 'Bool'")
    _fit(x, value)  # (the CPU range-checks the value, not the threshold: fp16 70000 is inf)
    return THRESHOLD, [x], [threshold, value]


def _fit(x, *scalars, compute=False) -> None:
    """The CPU's range check of scalars it converts to x's dtype (or, with `compute`, to its
    compute type): threshold's and hardtanh's to the dtype, leaky_relu's and elu's to fp32."""
    if compute and not x.dtype.is_floating_point:
        return  # (float-only ops: the dtype's own error comes first, as on the CPU)
    check = numerics.check_fits_compute if compute else numerics.check_fits
    for v in scalars:
        check(v, x.dtype)


@register(aten.threshold.default)
def threshold(x, threshold, value):
    return E.run(*_threshold_plan(x, threshold, value))


def _hardtanh_check(x, min_val, max_val):
    _refuse_bool(x, "hardtanh", "Bool")
    if x.dtype == torch.uint8 and (min_val < 0 or max_val < 0):  # (-1 would wrap to 255)
        raise RuntimeError("cannot do hardtanh on an unsigned type with negative limits")
    _fit(x, min_val, max_val)


@register(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    _hardtanh_check(x, min_val, max_val)
    return E.run(HARDTANH, [x], [min_val, max_val])


@register(aten.hardtanh_.default)
def hardtanh_(x, min_val=-1, max_val=1):
    _hardtanh_check(x, min_val, max_val)
    return E.run(HARDTANH, [x], [min_val, max_val], out=x)


# -- smooth activations --------------------------------------------------------------------
def _silu(x):
    return x / (_1 + exp_f32(-x))


def _leaky_relu(x, slope):
    return x if x > _0 else x * slope


def _softplus(x, beta, threshold):
    return x if x * beta > threshold else log1p_f32(exp_f32(x * beta)) / beta


def _elu(x, alpha, scale, input_scale):
    return expm1_f32(x * input_scale) * (alpha * scale) if x <= _0 else x * scale


def _hardsigmoid(x):
    y = x + _3
    y = _0 if y < _0 else y
    return (_6 if y > _6 else y) / _6


def _hardswish(x):
    y = x + _3
    y = _0 if y < _0 else y
    return x * (_6 if y > _6 else y) / _6


def _mish(x):
    return x * tanh_f32(log1p_f32(exp_f32(x)))


def _log_sigmoid(x):
    return (x if x < _0 else _0) - log1p_f32(exp_f32(-abs(x)))


def _hardshrink(x, lambd):
    return _0 if (x >= -lambd and x <= lambd) else x


def _softshrink(x, lambd):
    return x - lambd if x > lambd else (x + lambd if x < -lambd else x * _0)


SILU = _float("silu", _silu)
LEAKY_RELU = _float("leaky_relu", _leaky_relu, 1)
ELU = _float("elu", _elu, 3)
GELU = _float("gelu", lambda x: x * normal_cdf_f32(x))  # Note [gelu's CDF]
GELU_TANH = _float("gelu_tanh", lambda x: _HALF * x * (
    _1 + tanh_f32(_GELU_BETA * (x + _GELU_KAPPA * x * x * x))))

define("softplus", _softplus, [aten.softplus.default], operands=1,
       params=[("beta", 1), ("threshold", 20)], engine="scalar", float_only=True, inline=True)
define("hardsigmoid", _hardsigmoid, [aten.hardsigmoid.default], operands=1, engine="scalar",
       float_only=True)
define("hardswish", _hardswish, [aten.hardswish.default], operands=1, engine="scalar",
       float_only=True)
define("mish", _mish, [aten.mish.default], operands=1, engine="scalar", float_only=True,
       inline=True)
define("hardshrink", _hardshrink, [aten.hardshrink.default], operands=1,
       params=[("lambd", 0.5)], engine="scalar", float_only=True)
define("softshrink", _softshrink, [aten.softshrink.default], operands=1,
       params=[("lambd", 0.5)], engine="scalar", float_only=True)
_LOG_SIGMOID = _float("log_sigmoid", _log_sigmoid, inline=True)


@register(aten.silu.default)
def silu(x):
    return E.run(SILU, [x])


@register(aten.silu_.default)
def silu_(x):
    return E.run(SILU, [x], out=x)


def _leaky_relu_plan(x, negative_slope=0.01):
    _fit(x, negative_slope, compute=True)
    return LEAKY_RELU, [x], [negative_slope]


def _elu_plan(x, alpha=1, scale=1, input_scale=1):
    _fit(x, alpha, scale, input_scale, compute=True)
    return ELU, [x], [alpha, scale, input_scale]


@register(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return E.run(*_leaky_relu_plan(x, negative_slope))


@register(aten.leaky_relu_.default)
def leaky_relu_(x, negative_slope=0.01):
    return E.run(*_leaky_relu_plan(x, negative_slope), out=x)


@register(aten.elu.default)
def elu(x, alpha=1, scale=1, input_scale=1):
    return E.run(*_elu_plan(x, alpha, scale, input_scale))


@register(aten.celu.default)
def celu(x, alpha=1.0):
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError: alpha cannot be 0 for CELU")
    return E.run(ELU, [x], [alpha, 1.0, 1.0 / alpha])


def _gelu_op(approximate: str, none, tanh):
    if approximate == "none":
        return none
    if approximate == "tanh":
        return tanh
    raise RuntimeError("approximate argument must be either none or tanh.")


@register(aten.gelu.default)
def gelu(x, *, approximate="none"):
    return E.run(_gelu_op(approximate, GELU, GELU_TANH), [x])


@register(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    # The buffer stays empty, as on CUDA: the backward recomputes exp(-|x|). The result is
    # contiguous whatever x's layout, as the CPU's (x.view(-1) after it works there)
    out = None if x.is_contiguous() else T.empty(tuple(x.shape), x.dtype)
    return E.run(_LOG_SIGMOID, [x], out=out), T.empty((0,), x.dtype)


# -- backwards: (grad_output, input or result) -> grad_input, formulas as on CPU ------------
def _gelu_backward(g, x):
    cdf = normal_cdf_f32(x)
    pdf = exp_f32(-_HALF * x * x) * _GELU_PDF
    return g * (cdf + x * pdf)


def _gelu_tanh_backward(g, x):
    inner = _GELU_BETA * (x + _GELU_KAPPA * x * x * x)
    t = tanh_f32(inner)
    left_derivative = _HALF * (_1 + t)
    right_derivative = _HALF * x * (_1 - t * t) * _GELU_BETA * (_1 + _3 * _GELU_KAPPA * x * x)
    return g * (left_derivative + right_derivative)


def _silu_backward(g, x):
    s = sigmoid_f32(x)
    return g * s * (_1 + x * (_1 - s))


def _softplus_backward(g, x, beta, threshold):
    z = exp_f32(x * beta)
    return g if x * beta > threshold else g * z / (z + _1)


def _elu_backward(g, x, alpha, scale, input_scale):
    if x <= _0:
        return g * input_scale * (alpha * scale) * exp_f32(x * input_scale)
    return g * scale


def _elu_backward_result(g, y, alpha, scale, input_scale):
    return g * input_scale * (y + alpha * scale) if y <= _0 else g * scale


def _hardswish_backward(g, x):
    if x <= -_3:
        return _0
    return g * (x / _3 + _HALF) if x < _3 else g


def _mish_backward(g, x):
    s = sigmoid_f32(x)
    t = tanh_f32(log1p_f32(exp_f32(x)))
    return g * (t + x * s * (_1 - t * t))


def _log_sigmoid_backward(g, x):
    z = exp_f32(-abs(x))
    if x < _0:
        return g * (_1 - z / (_1 + z))
    return g * (z / (_1 + z))


def _shrink_backward(g, x, lambd):
    return _0 if (x >= -lambd and x <= lambd) else g


define("threshold_backward", lambda g, x, th: _0 if x <= th else g,
       [aten.threshold_backward.default], params=[("threshold", 0)])
define("sigmoid_backward", lambda g, y: g * (_1 - y) * y, [aten.sigmoid_backward.default])
define("tanh_backward", lambda g, y: g * (_1 - y * y), [aten.tanh_backward.default])
define("silu_backward", _silu_backward, [aten.silu_backward.default], engine="scalar")
define("softplus_backward", _softplus_backward, [aten.softplus_backward.default],
       params=[("beta", 1), ("threshold", 20)], engine="scalar")
define("hardtanh_backward", lambda g, x, lo, hi: _0 if (x <= lo or x >= hi) else g,
       [aten.hardtanh_backward.default], params=[("min_val", -1), ("max_val", 1)])
define("hardsigmoid_backward", lambda g, x: g * _ONE_SIXTH if (x > -_3 and x < _3) else _0,
       [aten.hardsigmoid_backward.default])
define("hardswish_backward", _hardswish_backward, [aten.hardswish_backward.default])
define("mish_backward", _mish_backward, [aten.mish_backward.default], engine="scalar",
       inline=True)
before_decomposition(aten.silu_backward.default, aten.mish_backward.default)
define("hardshrink_backward", _shrink_backward, [aten.hardshrink_backward.default],
       params=[("lambd", 0.5)])
define("softshrink_backward", _shrink_backward, [aten.softshrink_backward.default],
       params=[("lambd", 0.5)])
_LEAKY_RELU_BACKWARD = E.Elementwise(
    "leaky_relu_backward", njit(**JIT_OPTIONS)(lambda g, x, slope: g if x > _0 else g * slope), 1)
_ELU_BACKWARD = E.Elementwise("elu_backward", njit(**JIT_OPTIONS)(_elu_backward), 3,
                              engine="scalar")
_ELU_BACKWARD_RESULT = E.Elementwise("elu_backward_result",
                                     njit(**JIT_OPTIONS)(_elu_backward_result), 3)
# (Note [Inlined op bodies])
_GELU_BACKWARD = E.Elementwise("gelu_backward",
                               njit(inline="always", **JIT_OPTIONS)(_gelu_backward),
                               engine="scalar")
_GELU_TANH_BACKWARD = E.Elementwise("gelu_tanh_backward",
                                    njit(**JIT_OPTIONS)(_gelu_tanh_backward), engine="scalar")
_LOG_SIGMOID_BACKWARD = E.Elementwise(
    "log_sigmoid_backward", njit(**JIT_OPTIONS)(_log_sigmoid_backward), engine="scalar")


@register(aten.gelu_backward.default)
def gelu_backward(grad_output, x, *, approximate="none"):
    return E.run(_gelu_op(approximate, _GELU_BACKWARD, _GELU_TANH_BACKWARD), [grad_output, x])


@register(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output, x, negative_slope, self_is_result):
    if self_is_result and negative_slope < 0:
        raise RuntimeError(
            "In-place leakyReLu backward calculation is triggered with a negative slope which is "
            "not supported. This is caused by calling in-place forward function with a negative "
            "slope, please call out-of-place version instead.")
    return E.run(_LEAKY_RELU_BACKWARD, [grad_output, x], [negative_slope])


@register(aten.elu_backward.default)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    if is_result:
        if alpha < 0:
            raise RuntimeError(
                "In-place elu backward calculation is triggered with a negative slope which is "
                "not supported. This is caused by calling in-place forward function with a "
                "negative slope, please call out-of-place version instead.")
        op = _ELU_BACKWARD_RESULT
    else:
        op = _ELU_BACKWARD
    return E.run(op, [grad_output, self_or_result], [alpha, scale, input_scale])


@register(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output, x, buffer):
    return E.run(_LOG_SIGMOID_BACKWARD, [grad_output, x])


# -- glu: out = a * sigmoid(b), with a and b the two halves of `dim` -----------------------
_GLU = _float("glu", lambda a, b: a * sigmoid_f32(b))
_GLU_BACKWARD_A = _float("glu_backward_a", lambda g, b: g * sigmoid_f32(b))
_GLU_BACKWARD_B = _float("glu_backward_b", lambda g, a, b: g * a * sigmoid_f32(b) * (
    _1 - sigmoid_f32(b)))


def _halves(x, dim: int):
    if x.dim() == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    dim = dim % x.dim() if -x.dim() <= dim < x.dim() else dim
    if x.shape[dim] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim} is size "
                           f"{x.shape[dim]}")
    h = x.shape[dim] // 2
    return dim, x.narrow(dim, 0, h), x.narrow(dim, h, h)


@register(aten.glu.default)
def glu(x, dim=-1):
    _, a, b = _halves(x, dim)
    return E.run(_GLU, [a, b])


@register(aten.glu_backward.default)
def glu_backward(grad_output, x, dim):
    dim, a, b = _halves(x, dim)
    out = T.empty(x.shape, torch.result_type(grad_output, x))
    h = a.shape[dim]
    E.run(_GLU_BACKWARD_A, [grad_output, b], out=out.narrow(dim, 0, h))
    E.run(_GLU_BACKWARD_B, [grad_output, a, b], out=out.narrow(dim, h, h))
    return out


# -- fusible forms (Note [Fusible ops]): each repeats its kernel's checks and E.run arguments --
@E.fusible(aten.relu.default)
@E.fusible_inplace(aten.relu_.default)  # nn.ReLU(inplace=True)
def _relu_plan(x):
    _refuse_bool(x, "relu")
    return RELU, [x], [0]


@E.fusible(aten.hardtanh.default)
@E.fusible_inplace(aten.hardtanh_.default)  # nn.ReLU6(inplace=True), nn.Hardtanh(inplace=True)
def _hardtanh_plan(x, min_val=-1, max_val=1):
    _hardtanh_check(x, min_val, max_val)
    return HARDTANH, [x], [min_val, max_val]


E.fusible(aten.threshold.default)(_threshold_plan)
E.fusible(aten.silu.default)(E.fusible_inplace(aten.silu_.default)(lambda x: (SILU, [x], ())))
E.fusible(aten.leaky_relu.default)(E.fusible_inplace(aten.leaky_relu_.default)(_leaky_relu_plan))
E.fusible(aten.elu.default)(_elu_plan)
E.fusible(aten.gelu.default)(
    lambda x, *, approximate="none": (_gelu_op(approximate, GELU, GELU_TANH), [x], ()))
E.fusible(aten.gelu_backward.default)(
    lambda grad_output, x, *, approximate="none": (
        _gelu_op(approximate, _GELU_BACKWARD, _GELU_TANH_BACKWARD), [grad_output, x], ()))
E.fusible(aten.log_sigmoid_backward.default)(
    lambda grad_output, x, buffer: (_LOG_SIGMOID_BACKWARD, [grad_output, x], ()))
