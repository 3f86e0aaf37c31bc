"""Arithmetic, comparison and logical elementwise ops (Vector engine).

Each op is a small jitted scalar function; `define` registers its functional,
in-place and (via the router) out= forms. Constants are float32 so fp32 math
stays fp32; integer math runs in int64 and wraps on store. Also here: frexp, allclose
and renorm; the bitwise and integer-only ops (and hash_tensor) are in ops/bitwise.py.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import fma, njit
from neuron_eager.ops.registry import KERNELS, register

aten = torch.ops.aten


def define(name, fn, functional=(), inplace=(), operands=2, params=(), kind="default",
           engine="vector", float_only=False, plain=None, check=None, inline=False,
           round_scalars=False, checked_params=False):
    """Register `fn` for the given overloads.

    `params` lists (name, default) of the scalar arguments after the operands. `plain`, if
    given, is the same function with every parameter at its default (e.g. add without
    alpha): calls that pass no parameter use it, one kernel argument fewer. `check`, if
    given, sees the operands first and raises the CPU's error for those it refuses.
    `inline`: Numba inlines `fn` into its loops (Note [Inlined op bodies] in elementwise.py).
    `round_scalars`: Python float operands and parameters are rounded to a bf16/fp16
    result's dtype first, as the CPU rounds add's (Note [Reduced-precision scalars]);
    "first": only a first operand (`torch.mul(0.1, x)`: mul and div keep a second in fp32).
    `checked_params`: the CPU converts the parameters to the compute type with a range check
    (numerics.check_fits_compute: addcmul's value, lerp's weight).
    """
    op = E.Elementwise(name, njit(fn, inline="always") if inline else njit(fn), len(params),
                       kind, engine, float_only)
    plain_op = E.Elementwise(name + "_plain", njit(plain), 0, kind, engine, float_only) \
        if plain is not None else None

    passed = set()  # signatures whose in-place checks passed (Note [Checks by signature])

    def parse(args, kwargs, inplace=False):
        operands_ = args[:operands]
        sig = None
        if check is not None and not inplace:
            check(*operands_)  # (cheap: the type tests alone)
        elif check is not None:
            sig = E.signature(operands_)
            if sig not in passed:  # the CPU checks the cast into the output first
                E.check_castable(E.result_type(*operands_, sig=sig), args[0].dtype)
                check(*operands_)
                passed.add(sig)
        values = []
        for j, (pname, default) in enumerate(params):
            i = operands + j
            values.append(args[i] if i < len(args) else kwargs.get(pname, default))
        if values and params[0][0] == "alpha":
            if not numerics.fits_every_dtype(values[0]):
                sig = sig or E.signature(operands_)
                _check_alpha(values[0], E.result_type(*operands_, sig=sig))
        elif checked_params and not _fit_float_compute(operands_, values):
            dtype = E.result_type(*operands_, sig=sig)
            for v in values:
                numerics.check_fits_compute(v, dtype)
        if round_scalars == "first" and _is_number(operands_[0]):
            operands_ = (dtype_rounded(operands_[1], operands_[0]), *operands_[1:])
        elif round_scalars is True:
            operands_, values = _rounded(operands_, values)
        return operands_, values

    if functional:
        @register(*functional)
        def forward(*args, **kwargs):
            if plain_op is not None and len(args) == operands and not kwargs:
                if check is not None:
                    check(*args)
                return E.run(plain_op, _rounded(args)[0] if round_scalars is True else args)
            ops, values = parse(args, kwargs)
            return E.run(op, ops, values)

        forward.checks_devices = True

        @E.fusible(*functional)  # the same choice as `forward` (Note [Fusible ops])
        def plan(*args, **kwargs):
            if plain_op is not None and len(args) == operands and not kwargs:
                if check is not None:
                    check(*args)
                return plain_op, _rounded(args)[0] if round_scalars is True else args, ()
            ops, values = parse(args, kwargs)
            return op, ops, values

    if inplace:
        @register(*inplace)
        def forward_(*args, **kwargs):
            ops, values = parse(args, kwargs, inplace=True)
            return E.run(op, ops, values, out=args[0])

        forward_.checks_devices = True

        @E.fusible_inplace(*inplace)  # the same choice as `forward_`
        def plan_(*args, **kwargs):
            ops, values = parse(args, kwargs, inplace=True)
            return op, ops, values

    return op


# Note [Checks by signature]
# The CPU's checks of an in-place op's operands (a result that cannot be cast into the
# tensor, a bool subtraction, an integer quotient, lerp's dtypes) depend only on what
# E.signature keeps: the dtypes, which tensors are 0-dim, the scalars' types. So each
# passing signature is remembered per op, and an optimizer's add_, addcmul_ and addcdiv_
# skip them (finding the result type took most of their ~15 us of checks). Out of place
# there is no cast to check, and the type tests alone cost less than a signature. A float
# alpha's range check depends on its value: passing (value, dtype) pairs are remembered too,
# as a schedule repeats them.
_alphas_passed: set = set()


def _check_alpha(alpha, dtype: torch.dtype) -> None:
    key = (type(alpha), alpha, dtype)
    if key not in _alphas_passed:
        numerics.check_alpha(alpha, dtype)
        if len(_alphas_passed) > 4096:  # (a schedule of ever new values: keep it bounded)
            _alphas_passed.clear()
        _alphas_passed.add(key)


def _fit_float_compute(operands, values) -> bool:
    """Whether checked parameters fit without the result's dtype being needed (it takes
    microseconds to find): float tensors, so fp32 compute or wider, and finite numbers within
    fp32's range. An optimizer's addcmul_, addcdiv_ and lerp_ on every step."""
    for o in operands:
        if isinstance(o, torch.Tensor) and not o.dtype.is_floating_point:
            return False
    for v in values:
        if not ((type(v) is float or type(v) is int) and -3.4e38 < v < 3.4e38):
            return False
    return True


# Note [Reduced-precision scalars]
# For a bf16/fp16 result the CPU rounds some Python scalars (floats and ints alike: bf16 + 257
# adds 256) to the tensor's dtype before it computes in fp32: add's and sub's scalar operand
# and alpha (in its vector loop), and the divisor of fmod and remainder; mul's and div's
# scalars it keeps in fp32, 0-dim tensors too (E.scalar_tensors_cast). Measured bit for
# bit against the CPU (tests/ops/test_edge_values.py); `x + 0.587` in bf16 was 1 ulp off in
# a tenth of the elements, `x.remainder(1.7)` in most.
_REDUCED = (torch.bfloat16, torch.float16)


def _rounded(operands, values=()) -> tuple:
    """(operands, values) with their Python numbers as the CPU converts them for a bf16/fp16
    result: to the dtype, through float32."""
    for v in operands:  # (a bf16/fp16 operand first: the common fp32 call pays one check)
        if isinstance(v, torch.Tensor) and v.dtype in _REDUCED:
            break
    else:
        return operands, values
    if not any(_is_number(v) for v in (*operands, *values)):
        return operands, values
    dtype = E.result_type(*operands)
    if dtype not in _REDUCED:
        return operands, values

    def cast(v):
        return numerics.reduced_scalar(v, dtype) if _is_number(v) else v

    return tuple([cast(v) for v in operands]), [cast(v) for v in values]


def _is_number(v) -> bool:
    """A Python float, or an int the CPU rounds the same way (bf16 + 257 adds 256)."""
    return type(v) is float or (type(v) is int and -(1 << 63) <= v < 1 << 63)


# -- binary arithmetic -------------------------------------------------------------------
def _is_bool(x) -> bool:
    return x.dtype == torch.bool if isinstance(x, torch.Tensor) else isinstance(x, bool)


def _no_bool_sub(x, y):
    if _is_bool(x) and _is_bool(y):
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not "
                           "supported. Use the `^` or `logical_xor()` operator instead.")
    if _is_bool(x) or _is_bool(y):
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. "
                           "If you are trying to invert a mask, use the `~` or `logical_not()` "
                           "operator instead.")


def _no_bool_neg(x):
    if _is_bool(x):
        raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. If "
                           "you are trying to invert a mask, use the `~` or `logical_not()` "
                           "operator instead.")


def _no_bool(cpu_name):
    """A check raising the CPU's error for bool operands (abs, floor, ... have no bool
    kernel there; `sign` has one)."""
    def check(*operands):  # (the result is bool exactly when every operand is)
        if all(_is_bool(o) for o in operands):
            raise NotImplementedError(f"\"{cpu_name}\" not implemented for 'Bool'")
    return check


def _no_integer_quotient(x, a, b):
    if not _is_float(a) and not _is_float(b):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future  release "
            "addcdiv will perform a true division of tensor1 and tensor2. The historic addcdiv "
            "behavior can be implemented as (input + value * torch.trunc(tensor1 / tensor2))"
            ".to(input.dtype) for integer inputs and as (input + value * tensor1 / tensor2) for "
            "float inputs. The future addcdiv behavior is just the latter implementation: "
            "(input + value * tensor1 / tensor2), for all dtypes.")


def _is_float(x) -> bool:
    return x.dtype.is_floating_point if isinstance(x, torch.Tensor) else isinstance(x, float)


def float_only(cpu_name):
    """A check raising the CPU's error where the operands' result type is not a float (it is
    one exactly when an operand is: a float tensor or a Python float)."""
    def check(*operands):
        if not any(_is_float(o) for o in operands):
            dtype = E.result_type(*operands)
            raise NotImplementedError(f"\"{cpu_name}\" not implemented for "
                                      f"'{T.dtype_name(dtype)}'")
    return check


def _lerp_check(kernel_name):
    """The CPU's checks of lerp: `end`, and a `weight` tensor of one or more dims, in self's
    dtype; a float result (a 0-dim weight takes part in promotion)."""
    def check(x, end, weight=None):
        for name, t in (("end", end), ("weight", weight)):
            if isinstance(t, torch.Tensor) and t.dtype != x.dtype and \
                    (name == "end" or t.dim() > 0):
                raise RuntimeError(f"expected dtype {T.CPP_NAMES[x.dtype]} for `{name}` but "
                                   f"got dtype {T.CPP_NAMES[t.dtype]}")
        floats(*[o for o in (x, end, weight) if o is not None])

    floats = float_only(kernel_name)  # (after the dtype checks, as the CPU orders them)
    return check


# Note [Fused multiply-adds]
# The CPU's kernels compute x + alpha * y, addcmul and lerp with one rounding (its vector
# fmadd; GCC contracts the scalar tails too), and its vector loop rounds add's alpha to a
# bf16/fp16 tensor's dtype first (its scalar tail, a chunk's last n % 32 elements, does not):
# so do these, bit for bit (tests/ops/test_edge_values.py). addcdiv divides after the
# multiply, x + (value * a) / b, as the CPU does.
define("add", lambda x, y, a: fma(a, y, x), [aten.add.Tensor, aten.add.Scalar],
       [aten.add_.Tensor, aten.add_.Scalar], params=[("alpha", 1)], plain=lambda x, y: x + y,
       round_scalars=True)
define("sub", lambda x, y, a: fma(-a, y, x), [aten.sub.Tensor, aten.sub.Scalar],
       [aten.sub_.Tensor, aten.sub_.Scalar], params=[("alpha", 1)], plain=lambda x, y: x - y,
       check=_no_bool_sub, round_scalars=True)
define("rsub", lambda x, y, a: fma(-a, x, y), [aten.rsub.Tensor, aten.rsub.Scalar],
       params=[("alpha", 1)], check=_no_bool_sub, round_scalars=True)
define("mul", lambda x, y: x * y, [aten.mul.Tensor, aten.mul.Scalar], [aten.mul_.Tensor],
       round_scalars="first")


# Note [mul_ by a Scalar]
# The CPU's mul_.Scalar (its foreach mul_ calls it: optimizers' momentum, weight decay; not
# `x.mul_(0.1)`'s mul_.Tensor, nor mul.Scalar) rounds its scalar to a bf16/fp16 dtype first.
def dtype_rounded(x, other):
    """`other`, a Python number, rounded to x's dtype when that is bf16/fp16 (else as is)."""
    if isinstance(x, torch.Tensor) and x.dtype in _REDUCED and _is_number(other):
        return numerics.reduced_scalar(other, x.dtype)
    return other


@register(aten.mul_.Scalar)
def mul_scalar_(x, other):
    return KERNELS[aten.mul_.Tensor](x, dtype_rounded(x, other))


mul_scalar_.checks_devices = True


@E.fusible_inplace(aten.mul_.Scalar)
def _plan_mul_scalar_(x, other):
    return E.FUSIBLE_INPLACE[aten.mul_.Tensor](x, dtype_rounded(x, other))
define("div", lambda x, y: x / y, [aten.div.Tensor, aten.div.Scalar],
       [aten.div_.Tensor, aten.div_.Scalar], kind="int_to_float", round_scalars="first")


@njit
def _fmod(x, y):
    return np.fmod(x, y)


@njit
def _remainder(x, y):
    m = np.fmod(x, y)
    if m != 0 and ((y < 0) != (m < 0)):
        m += y
    return m


@njit
def _div_floor(x, y):
    """Python-style floor division, the way PyTorch computes it for floats."""
    if y == 0:
        return x / y
    m = np.fmod(x, y)
    d = (x - m) / y
    if m != 0 and ((y < 0) != (m < 0)):
        d -= 1
    if d != 0:
        f = np.floor(d)
        if d - f > 0.5:
            f += 1
        return f
    return np.copysign(d * 0, x / y)


@njit
def _div_trunc(x, y):
    return np.trunc(x / y)


_FMOD = E.Elementwise("fmod", njit(lambda x, y: np.fmod(x, y)))
_REMAINDER = E.Elementwise("remainder", _remainder)


@njit
def _int_fmod(x, y):
    # the sign of the dividend, like C's %; np.fmod is not used for integers
    r = abs(x) % abs(y) if y != 0 else 0
    return r if x >= 0 else -r


@njit
def _int_remainder(x, y):
    # Python's %: the sign of the divisor
    return x % y if y != 0 else 0


_IFMOD = E.Elementwise("int_fmod", _int_fmod)
_IREMAINDER = E.Elementwise("int_remainder", _int_remainder)


def check_integer_divisor(x, y) -> None:
    """Integer division by zero raises RuntimeError("ZeroDivisionError") on the CPU (in its
    loop: not for an empty result); here too."""
    if any(isinstance(t, torch.Tensor) and not t.numel() for t in (x, y)):
        return
    if isinstance(y, torch.Tensor) and not y.dtype.is_floating_point and y.numel():
        common = E.dtypes_for(_DIV_FLOOR, [x, y])[0]
        if common.is_floating_point:
            return
        # the host reads the check back, as the CPU kernel does (a CPU 0-dim divisor at once;
        # a 0-dim one of a wider type than the common one wraps to it first: uint8 // 256)
        if y.dim() == 0 and y.dtype != common:
            zero = numerics.scalar_cast("int", common)(y.item()) == 0
        else:
            zero = (y._nd == 0).any() if isinstance(y, E.NeuronTensor) else y.item() == 0
        if zero:
            raise RuntimeError("ZeroDivisionError")
    elif isinstance(y, (int, bool)) and isinstance(x, E.NeuronTensor) and \
            not x.dtype.is_floating_point:  # (Note [Integer scalars wrap]: uint8 // 256)
        if numerics.scalar_cast("int", x.dtype)(y) == 0:
            raise RuntimeError("ZeroDivisionError")


def _modulo(float_op, int_op, cpu_name):
    refuse_bool = _no_bool(cpu_name)

    def run(x, y, out=None):
        refuse_bool(x, y)
        check_integer_divisor(x, y)
        floating = E.dtypes_for(float_op, [x, y])[0].is_floating_point
        if floating:  # (Note [Reduced-precision scalars])
            x, y = _rounded((x, y))[0]
        return E.run(float_op if floating else int_op, [x, y], out=out)

    return run


_fmod_run = _modulo(_FMOD, _IFMOD, "fmod_cpu")
_remainder_run = _modulo(_REMAINDER, _IREMAINDER, "remainder_cpu")
register(aten.fmod.Tensor, aten.fmod.Scalar)(lambda x, y: _fmod_run(x, y))
register(aten.fmod_.Tensor, aten.fmod_.Scalar)(lambda x, y: _fmod_run(x, y, out=x))
register(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)(
    lambda x, y: _remainder_run(x, y))
register(aten.remainder_.Tensor, aten.remainder_.Scalar)(
    lambda x, y: _remainder_run(x, y, out=x))
_DIV_FLOOR = E.Elementwise("div_floor", _div_floor)
_DIV_TRUNC = E.Elementwise("div_trunc", _div_trunc)
_DIV = E.Elementwise("div", njit(lambda x, y: x / y), kind="int_to_float")


@njit
def _int_div_trunc(x, y):
    q = abs(x) // abs(y) if y != 0 else 0
    return q if (x < 0) == (y < 0) else -q


_IDIV_TRUNC = E.Elementwise("idiv_trunc", _int_div_trunc)
_IDIV_FLOOR = E.Elementwise("idiv_floor", njit(lambda x, y: x // y if y != 0 else 0))


def _floor(x, y, out=None):
    _no_bool("div_floor_cpu")(x, y)
    check_integer_divisor(x, y)
    x = dtype_rounded(y, x)  # (a Python dividend: 0.1 // bf16 divides bf16's 0.1)
    floating = E.dtypes_for(_DIV_FLOOR, [x, y])[0].is_floating_point
    return E.run(_DIV_FLOOR if floating else _IDIV_FLOOR, [x, y], out=out)


def _div_mode(x, y, mode, out=None):
    if mode is None:
        return E.run(_DIV, [x, y], out=out)
    if mode == "floor":
        return _floor(x, y, out)
    x = dtype_rounded(y, x)  # (as in _floor)
    floating = E.dtypes_for(_DIV_FLOOR, [x, y])[0].is_floating_point
    if mode == "trunc":
        _no_bool("div_trunc_cpu")(x, y)
    if mode == "trunc" and not floating:
        check_integer_divisor(x, y)
    if mode == "trunc":
        return E.run(_DIV_TRUNC if floating else _IDIV_TRUNC, [x, y], out=out)
    raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but "
                       f"found '{mode}'")


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(x, y, *, rounding_mode=None):
    return _div_mode(x, y, rounding_mode)


@register(aten.div_.Tensor_mode, aten.div_.Scalar_mode)
def div_mode_(x, y, *, rounding_mode=None):
    return _div_mode(x, y, rounding_mode, out=x)


@register(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(x, y):
    return _floor(x, y)


@register(aten.floor_divide_.Tensor, aten.floor_divide_.Scalar)
def floor_divide_(x, y):
    return _floor(x, y, out=x)


@njit
def _maximum(x, y):
    if x != x:
        return x
    if y != y:
        return y
    return x if x >= y else y  # a tie gives x, as the CPU does: maximum(-0.0, 0.0) is -0.0


@njit
def _minimum(x, y):
    if x != x:
        return x
    if y != y:
        return y
    return x if x <= y else y


define("maximum", _maximum.py_func, [aten.maximum.default])
define("minimum", _minimum.py_func, [aten.minimum.default])
define("atan2", lambda x, y: np.arctan2(x, y), [aten.atan2.default], [aten.atan2_.default],
       kind="int_to_float", engine="scalar")

# -- unary arithmetic --------------------------------------------------------------------
define("neg", lambda x: -x, [aten.neg.default], [aten.neg_.default], operands=1,
       check=_no_bool_neg)
define("abs", lambda x: abs(x), [aten.abs.default], [aten.abs_.default], operands=1,
       check=_no_bool("abs_cpu"))


@njit
def _sign(x):  # as the CPU: (0 < x) - (x < 0), so +-inf give +-1 and NaN and -0.0 give 0
    return 1 if x > 0 else (-1 if x < 0 else 0)


define("sign", _sign.py_func, [aten.sign.default, aten.sgn.default],
       [aten.sign_.default, aten.sgn_.default], operands=1)  # sgn == sign for real dtypes
define("reciprocal", lambda x: np.float32(1) / x, [aten.reciprocal.default],
       [aten.reciprocal_.default], operands=1, kind="int_to_float")
define("sqrt", lambda x: np.sqrt(x), [aten.sqrt.default], [aten.sqrt_.default], operands=1,
       kind="int_to_float", engine="scalar")
define("rsqrt", lambda x: np.float32(1) / np.sqrt(x), [aten.rsqrt.default],
       [aten.rsqrt_.default], operands=1, kind="int_to_float", engine="scalar")
define("floor", lambda x: np.floor(x), [aten.floor.default],
       [aten.floor_.default], operands=1, check=_no_bool("floor_vml_cpu"))
define("ceil", lambda x: np.ceil(x), [aten.ceil.default],
       [aten.ceil_.default], operands=1, check=_no_bool("ceil_vml_cpu"))
define("trunc", lambda x: np.trunc(x), [aten.trunc.default],
       [aten.trunc_.default], operands=1, check=_no_bool("trunc_vml_cpu"))
define("round", lambda x: np.rint(x), [aten.round.default],
       [aten.round_.default], operands=1, check=_no_bool("round_vml_cpu"))


@njit
def _clamp(x, lo, hi, has_lo, has_hi):
    if x != x:
        return x
    if has_lo and (x < lo or lo != lo):  # a NaN bound gives NaN, as on the CPU
        x = lo
    if has_hi and (x > hi or hi != hi):
        x = hi
    return x


_CLAMP = E.Elementwise("clamp", _clamp, nparams=4)


def _clamp_run(x, lo, hi, out=None):
    if lo is None and hi is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    operands = [x] + [v for v in (lo, hi) if v is not None]
    dtype, compute = E.dtypes_for(_CLAMP, operands)
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        if lo is not None and hi is not None and dtype == torch.bool:
            raise NotImplementedError("\"clamp_cpu\" not implemented for 'Bool'")
        return _clamp_tensor(x, lo, hi, out)
    if out is not None and not torch.can_cast(dtype, out.dtype):
        raise RuntimeError(f"result type {T.dtype_name(dtype)} can't be cast to the desired "
                           f"output type {T.CPP_NAMES.get(out.dtype, out.dtype)}")
    check_clamp_bounds(lo, hi, dtype)
    if out is None and dtype != x.dtype:
        x = x.to(dtype)
    return E.run(_CLAMP, [x], clamp_params(lo, hi, dtype), out=out)


def clamp_params(lo, hi, dtype) -> list:
    """The clamp kernel's parameters. The CPU casts the bounds to a bf16/fp16 x's dtype
    before comparing: 1e-8 is fp16's 0.0, which -0.0 is not below."""
    if dtype in (torch.float16, torch.bfloat16):
        lo, hi = (None if v is None else numerics.reduced_scalar(v, dtype) for v in (lo, hi))
    return [0 if lo is None else lo, 0 if hi is None else hi, lo is not None, hi is not None]


def check_clamp_bounds(lo, hi, dtype) -> None:
    if dtype == torch.bool:  # (the CPU has no bool kernel for scalar bounds)
        kernel = "clamp_min" if hi is None else "clamp_max" if lo is None else "clamp"
        raise NotImplementedError(f"\"{kernel}_scalar_cpu\" not implemented for 'Bool'")
    for bound in (lo, hi):
        if bound is not None:
            numerics.check_fits(bound, dtype)


def _clamp_tensor(x, lo, hi, out):
    if lo is not None:
        x = E.run(_MAX_CLAMP, [x, lo], out=out)
        out = x if out is not None else None
    if hi is not None:
        x = E.run(_MIN_CLAMP, [x, hi], out=out)
    return x


_MAX_CLAMP = E.Elementwise("clamp_min", _maximum)
_MIN_CLAMP = E.Elementwise("clamp_max", _minimum)


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):
    return _clamp_run(x, min, max)


@register(aten.clamp_.default, aten.clamp_.Tensor)
def clamp_(x, min=None, max=None):
    return _clamp_run(x, min, max, out=x)


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x, min):
    return _clamp_run(x, min, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, max):
    return _clamp_run(x, None, max)


@register(aten.clamp_min_.default, aten.clamp_min_.Tensor)
def clamp_min_(x, min):
    return _clamp_run(x, min, None, out=x)


@register(aten.clamp_max_.default, aten.clamp_max_.Tensor)
def clamp_max_(x, max):
    return _clamp_run(x, None, max, out=x)


# -- ternary -----------------------------------------------------------------------------
# (Note [Fused multiply-adds])
define("addcmul", lambda x, a, b, v: fma(v * a, b, x), [aten.addcmul.default],
       [aten.addcmul_.default], operands=3, params=[("value", 1)],
       check=_no_bool("addcmul_cpu_out"), checked_params=True)
define("addcdiv", lambda x, a, b, v: x + (v * a) / b, [aten.addcdiv.default],
       [aten.addcdiv_.default], operands=3, params=[("value", 1)], check=_no_integer_quotient,
       checked_params=True)


@njit
def _lerp(x, y, w):
    # PyTorch's formula, stable near both ends, with one rounding (Note [Fused multiply-adds])
    if abs(w) < 0.5:
        return fma(w, y - x, x)
    return fma(w - np.float32(1), y - x, y)  # (float32 throughout: lerp is float-only)


define("lerp", _lerp.py_func, [aten.lerp.Tensor], [aten.lerp_.Tensor], operands=3,
       check=_lerp_check("lerp_kernel_tensor"))
define("lerp_scalar", _lerp.py_func, [aten.lerp.Scalar], [aten.lerp_.Scalar], operands=2,
       params=[("weight", 0)], check=_lerp_check("lerp_kernel_scalar"), checked_params=True)

_WHERE = E.Elementwise("where", njit(lambda c, x, y: x if c else y))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(condition, x, y):
    if not isinstance(condition, torch.Tensor) or condition.dtype not in (torch.bool, torch.uint8):
        raise RuntimeError("where expected condition to be a boolean tensor" + (
            f", but got a tensor with dtype {T.dtype_name(condition.dtype)}"
            if isinstance(condition, torch.Tensor) else ""))
    if condition.dtype == torch.uint8:
        warnings.warn("where received a uint8 condition tensor. This behavior is deprecated and "
                      "will be removed in a future version of PyTorch. Use a boolean condition "
                      "instead.", UserWarning, stacklevel=2)
    dtype = E.result_type(x, y)
    arrays = [t for t in (condition, x, y) if isinstance(t, E.NeuronTensor)]
    shape = E.broadcast_shape([t.shape for t in arrays])
    out = E.T.empty(shape, dtype, E.output_strides(arrays, shape))
    compute = numerics.compute_type(dtype)
    return E.launch(_WHERE, [condition, x, y], (), out, shape, compute,
                    numerics.scalar_cast(compute, dtype))


# -- classification of floats ------------------------------------------------------------
define("isinf", lambda x: abs(x) == np.inf, [aten.isinf.default], operands=1,
       kind="always_bool")
define("isposinf", lambda x: x == np.inf, [aten.isposinf.default], operands=1,
       kind="always_bool")
define("isneginf", lambda x: x == -np.inf, [aten.isneginf.default], operands=1,
       kind="always_bool")
define("isfinite", lambda x: x == x and abs(x) != np.inf, [aten.isfinite.default], operands=1,
       kind="always_bool")


@njit
def _nan_to_num(x, nan, posinf, neginf):
    if x != x:
        return nan
    if x == np.inf:
        return posinf
    if x == -np.inf:
        return neginf
    return x


_NAN_TO_NUM = E.Elementwise("nan_to_num", _nan_to_num, nparams=3)


def _nan_to_num_run(x, nan, posinf, neginf, out=None):
    if not x.dtype.is_floating_point:
        return x.clone() if out is None else E.copy_into(out, x)
    # float64 computes as float32 on neuron, so its limits are float32's
    info = torch.finfo(torch.float32 if x.dtype == torch.float64 else x.dtype)
    params = [0.0 if nan is None else nan, info.max if posinf is None else posinf,
              info.min if neginf is None else neginf]
    return E.run(_NAN_TO_NUM, [x], params, out=out)


@register(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    return _nan_to_num_run(x, nan, posinf, neginf)


@register(aten.nan_to_num_.default)
def nan_to_num_(x, nan=None, posinf=None, neginf=None):
    return _nan_to_num_run(x, nan, posinf, neginf, out=x)


# -- angle, frexp (real inputs) ----------------------------------------------------------
@njit
def _angle(x):
    if x != x:
        return x
    return np.float32(np.pi) if x < 0 else np.float32(0)


define("angle", _angle.py_func, [aten.angle.default], operands=1, kind="int_to_float")


def _make_frexp(load, store):
    @njit(error_model="numpy", nogil=True)
    def frexp(mantissa, exponent, x):
        for i in range(x.shape[0]):
            m, e = math.frexp(load(x[i]))
            mantissa[i] = store(m)
            exponent[i] = e

    return frexp


_frexps: dict = {}


@register(aten.frexp.Tensor)
def frexp(x):
    if not x.dtype.is_floating_point:
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    code = numerics.CODE[x.dtype]
    kernel = _frexps.get(code)
    if kernel is None:  # a split of the bits: exact in any width, float64 included
        if code == "f64":
            kernel = _make_frexp(numerics.identity, numerics.identity)
        else:
            kernel = _make_frexp(numerics.loader(code, "f32"), numerics.storer(code))
        _frexps[code] = kernel
    src = x.contiguous()
    mantissa, exponent = E.T.empty(x.shape, x.dtype), E.T.empty(x.shape, torch.int32)
    if x.numel():
        kernel(mantissa._nd.reshape(-1), exponent._nd.reshape(-1), src._nd.reshape(-1))
        core.launch("vector", x.numel(), 3 * mantissa._nd.nbytes)
    return mantissa, exponent


# -- allclose -----------------------------------------------------------------------------
@register(aten.allclose.default)
def allclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    if x.dtype != other.dtype:
        raise RuntimeError(f"{E.T.dtype_name(x.dtype)} did not match "
                           f"{E.T.dtype_name(other.dtype)}")
    close = aten.isclose.default(x, other, rtol, atol, equal_nan)
    return bool(aten.all.default(close).item())  # the host reads the verdict back


# -- renorm --------------------------------------------------------------------------------
_RENORM_FACTOR = E.Elementwise("renorm_factor", njit(
    lambda n, m: m / (n + np.float32(1e-7)) if n > m else np.float32(1)))
_SCALE = E.Elementwise("renorm_scale", njit(lambda x, f: x * f))


@register(aten.renorm.default)
def renorm(x, p, dim, maxnorm):
    """Slices along `dim` whose p-norm exceeds maxnorm are scaled down to it (fp32 norms)."""
    from neuron_eager.ops.indexing import meta_call

    # the CPU's wording for these two differs from the meta kernel's
    if not p > 0:
        raise RuntimeError("renorm: non-positive-norm not supported")
    if maxnorm < 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm:g}")
    meta_call(aten.renorm.default, x, p, dim, maxnorm)  # the remaining checks
    dim = dim % x.dim()
    dims = [d for d in range(x.dim()) if d != dim]
    norm = aten.linalg_vector_norm.default(x, p, dims, True, dtype=torch.float32)
    factor = E.run(_RENORM_FACTOR, [norm, maxnorm])
    return E.run(_SCALE, [x, factor], out=E.T.empty(x.shape, x.dtype))
