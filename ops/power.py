"""pow in its forms (Tensor ** Scalar, Tensor ** Tensor, Scalar ** Tensor, in place): integer
powers by squaring with the CPU's wrapping, float powers with the CPU kernel's own choices.

Three scalar functions, because the CPU's kernels differ: for a scalar exponent (fp32, bf16)
x ** 0.5 is sqrt (-0.0 at -0.0, NaN at -inf), for a tensor exponent (and fp16's scalar
kernel) it is C's pow, and an integer tensor exponent may be negative. bf16's scalar kernel
multiplies bf16 values, so x ** 3 and x ** -2 round the square to bf16 first.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import types
from numba.extending import overload

from neuron_eager.ops import elementwise as E
from neuron_eager.ops import numerics
from neuron_eager.ops.arithmetic import _no_bool, define, dtype_rounded
from neuron_eager.ops.jit import njit
from neuron_eager.ops.registry import register

aten = torch.ops.aten


def _no_negative_int_power(x, y):
    if isinstance(x, torch.Tensor) and not x.dtype.is_floating_point and \
            type(y) is int and y < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")


def _check_scalar_exponent(x, y, dtype):
    """The CPU's checks of x ** y for a scalar y and a `dtype` result: no negative integer
    powers of integers; y converted to a 16-bit float or integer result's dtype must fit it
    (fp32 and fp64 results take y as a double)."""
    _no_negative_int_power(x, y)
    if dtype not in (torch.float32, torch.float64) and not dtype.is_complex:  # (refused later)
        numerics.check_fits(y, dtype)


@njit(inline="always")
def _int_pow(x, y):
    """x ** y for integers (y >= 0: negative powers are refused first) by squaring, wrapping
    as the CPU's integer kernel does."""
    result, base = np.int64(1), np.int64(x)
    while y > 0:
        if y & 1:
            result *= base
        base *= base
        y >>= 1
    return result


def _pow(x, y):
    """pow's scalar function: integers stay integers (a branch returning a float would make
    the whole function float, and overflowing powers saturate instead of wrapping)."""


@overload(_pow, inline="always")
def _pow_typed(x, y):
    if isinstance(x, types.Integer) and isinstance(y, types.Integer):
        return lambda x, y: _int_pow(x, y)
    return lambda x, y: _float_pow(x, y)


@njit(inline="always")
def _float_pow(x, y):
    # the exponents PyTorch's CPU kernel computes without powf, computed as it does (the same
    # bits, and sqrt's answers at -inf and -0.0: x ** 0.5 is NaN and -0.0 there); x ** 1 is
    # x, as the CPU copies it (a gradient of x ** 2 asks for it: powf took 2.4 ms per 1M)
    if y == 1:
        return x
    if y == 2:
        return x * x
    if y == 3:
        return x * x * x
    if y == 0.5:
        return np.sqrt(x)
    if y == -0.5:
        return 1 / np.sqrt(x)
    if y == -1:
        return 1 / x
    if y == -2:
        return 1 / (x * x)
    return x ** y


_POW = define("pow", lambda x, y: _pow(x, y), engine="scalar")  # (registered below)


@njit(inline="always")
def _bf16_pow(x, y):
    # the CPU's bf16 kernel computes x * x * x and 1 / (x * x) in bf16 arithmetic, each
    # product rounded (x ** 3: -207 where one rounding of x * x * x gives -206)
    if y == 3:
        return numerics.round_to_bf16(x * x) * x
    if y == -2:
        return 1 / numerics.round_to_bf16(x * x)
    return _float_pow(x, y)


_POW_BF16 = define("pow_bf16", lambda x, y: _bf16_pow(x, y), engine="scalar")  # (by dtype)


@njit(inline="always")
def _int_pow_any(x, y):
    """x ** y for integers as the CPU's tensor-exponent kernel: a negative power is 0 but
    for bases 1 and -1."""
    if y < 0:
        if x == 1:
            return np.int64(1)
        if x == -1:
            return np.int64(1) if y % 2 == 0 else np.int64(-1)
        return np.int64(0)
    return _int_pow(x, y)


@njit(inline="always")
def _float_pow_any(x, y):
    # C's pow at -0.0 and -inf for the exponents _float_pow computes through sqrt: a tensor
    # exponent is computed by pow on the CPU (pow(-0.0, 0.5) is 0.0, not sqrt's -0.0)
    if (y == 0.5 or y == -0.5) and (x == 0 or x == -np.inf):
        return abs(x) ** y  # (at +-0 and +-inf the sign of x does not matter to pow)
    return _float_pow(x, y)


def _pow_any(x, y):
    """pow's scalar function for a tensor exponent (pow.Tensor_Tensor, pow.Scalar)."""


@overload(_pow_any, inline="always")
def _pow_any_typed(x, y):
    if isinstance(x, types.Integer) and isinstance(y, types.Integer):
        return lambda x, y: _int_pow_any(x, y)
    return lambda x, y: _float_pow_any(x, y)


# bool ** bool has no CPU kernel with a tensor exponent (x ** True works: the CPU copies x)
_POW_ANY = define("pow_tensor", lambda x, y: _pow_any(x, y),
                  [aten.pow.Tensor_Tensor, aten.pow.Scalar], [aten.pow_.Tensor], engine="scalar",
                  check=_no_bool("pow"), round_scalars=True)  # (a scalar base: 0.1 ** x)


# An odd integer exponent past 2^24 is even once it is an fp32 kernel argument, but the
# CPU's fp32 kernel takes it as a double: (-1.0) ** (2**24 + 1) is -1. So x ** e is computed
# as x * x ** (e - 1) there, e - 1 being even as the argument it becomes (a negative e as
# 1 / (x * x ** (-e - 1)): -0.0 and -inf keep their signs).
_POW_ODD = define("pow_odd", lambda x, y: x * _float_pow(x, y), engine="scalar")
_POW_ODD_NEGATIVE = define("pow_odd_negative", lambda x, y: 1 / (x * _float_pow(x, y)),
                           engine="scalar")


def _odd_power(x, exponent):
    """The plan of x ** exponent for an odd exponent past 2^24 (see _POW_ODD)."""
    if exponent > 0:
        return _POW_ODD, [x, exponent - 1], ()
    return _POW_ODD_NEGATIVE, [x, -exponent - 1], ()


def _odd_past_fp32(exponent, dtype) -> bool:
    return dtype in (torch.float32, torch.float64) and isinstance(exponent, (int, float)) and \
        abs(exponent) > 2 ** 24 and float(exponent).is_integer() and int(exponent) % 2 == 1


def _pow_scalar_op(dtype: torch.dtype):
    # the CPU computes fp16 x ** scalar by pow too: no sqrt for 0.5 (pow(-0.0, 0.5) is 0.0)
    return _POW_ANY if dtype == torch.float16 else _POW_BF16 if dtype == torch.bfloat16 \
        else _POW


# A bf16/fp16 tensor's scalar exponent is rounded to its dtype first, as the CPU rounds it
# (bf16 x ** 257 is x ** 256; Note [Reduced-precision scalars] in arithmetic.py).
@register(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(x, exponent):
    op, operands, _ = _pow_tensor_scalar_plan(x, exponent)
    return E.run(op, operands)


@register(aten.pow_.Scalar)
def pow_scalar_(x, exponent):
    op, operands, _ = _pow_scalar_plan_(x, exponent)
    return E.run(op, operands, out=x)


pow_tensor_scalar.checks_devices = pow_scalar_.checks_devices = True


@E.fusible(aten.pow.Tensor_Scalar)  # the same choices as the kernels (Note [Fusible ops])
def _pow_tensor_scalar_plan(x, exponent):
    dtype = E.result_type(x, exponent)
    _check_scalar_exponent(x, exponent, dtype)  # (before the rounding: 1e39 does not fit)
    exponent = dtype_rounded(x, exponent)
    if _odd_past_fp32(exponent, dtype):
        return _odd_power(x, exponent)
    return _pow_scalar_op(dtype), [x, exponent], ()


@E.fusible_inplace(aten.pow_.Scalar)
def _pow_scalar_plan_(x, exponent):
    E.check_castable(E.result_type(x, exponent), x.dtype)
    _check_scalar_exponent(x, exponent, x.dtype)
    exponent = dtype_rounded(x, exponent)
    if _odd_past_fp32(exponent, x.dtype):
        return _odd_power(x, exponent)
    return _pow_scalar_op(x.dtype), [x, exponent], ()
