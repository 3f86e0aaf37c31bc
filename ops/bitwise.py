"""Comparisons, logic, bitwise and integer-only elementwise ops: eq / lt / ..., logical_and /
..., isnan, bitwise and / or / xor / not, shifts, gcd, lcm; hash_tensor (an XOR of bits).

Defined with arithmetic's `define` (the same functional, in-place and out= forms); the
bitwise ones refuse the float operands (and the integer-only ones bool) that the CPU has no
kernel for, in its words.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import tensor as T
from neuron_eager.ops.arithmetic import define
from neuron_eager.ops.jit import njit
from neuron_eager.ops.registry import register

aten = torch.ops.aten


# -- comparisons and logic ---------------------------------------------------------------
for _name, _fn in [("eq", lambda x, y: x == y), ("ne", lambda x, y: x != y),
                   ("lt", lambda x, y: x < y), ("le", lambda x, y: x <= y),
                   ("gt", lambda x, y: x > y), ("ge", lambda x, y: x >= y)]:
    _packet, _packet_ = getattr(aten, _name), getattr(aten, _name + "_")
    define(_name, _fn, [_packet.Tensor, _packet.Scalar], [_packet_.Tensor, _packet_.Scalar],
           kind="always_bool", round_scalars=True)  # (bf16 x == 0.1 compares with bf16's 0.1)

define("logical_and", lambda x, y: (x != 0) and (y != 0), [aten.logical_and.default],
       [aten.logical_and_.default], kind="always_bool")
define("logical_or", lambda x, y: (x != 0) or (y != 0), [aten.logical_or.default],
       [aten.logical_or_.default], kind="always_bool")
define("logical_xor", lambda x, y: (x != 0) != (y != 0), [aten.logical_xor.default],
       [aten.logical_xor_.default], kind="always_bool")
define("logical_not", lambda x: x == 0, [aten.logical_not.default], operands=1,
       kind="always_bool")
define("isnan", lambda x: x != x, [aten.isnan.default], operands=1, kind="always_bool")


def _integral_only(name):
    def check(*operands):
        dtype = E.result_type(*operands)
        if dtype.is_floating_point:
            raise NotImplementedError(f"\"{name}_cpu\" not implemented for "
                                      f"'{T.dtype_name(dtype)}'")
    return check


# (the dunder overloads are the CPU's same kernels; PyTorch's decompositions reach them, and
# its decomposition of `__iand__` calls the `__and__` packet, whose overload matching formats
# the tensors for a discarded message: two prints of them in every allclose)
for _name, _fn in (("and", lambda x, y: x & y), ("or", lambda x, y: x | y),
                   ("xor", lambda x, y: x ^ y)):
    _op, _inplace = getattr(aten, f"bitwise_{_name}"), getattr(aten, f"bitwise_{_name}_")
    _dunder, _idunder = getattr(aten, f"__{_name}__"), getattr(aten, f"__i{_name}__")
    define(f"bitwise_{_name}", _fn, [_op.Tensor, _op.Scalar, _dunder.Tensor, _dunder.Scalar],
           [_inplace.Tensor, _inplace.Scalar, _idunder.Tensor, _idunder.Scalar],
           check=_integral_only(f"bitwise_{_name}"))
    # `torch.bitwise_and(5, t)`: the ops commute, and the scalar promotes the same either way
    register(_op.Scalar_Tensor)(lambda self, other, _op=_op: _op.Scalar(other, self))


_BITWISE_NOT = E.Elementwise("bitwise_not", njit(lambda x: ~x))
_LOGICAL_NOT_BOOL = E.Elementwise("bool_not", njit(lambda x: not x))


_no_float_not = _integral_only("bitwise_not")


@register(aten.bitwise_not.default)
def bitwise_not(x):
    _no_float_not(x)
    return E.run(_LOGICAL_NOT_BOOL if x.dtype == torch.bool else _BITWISE_NOT, [x])


@register(aten.bitwise_not_.default)
def bitwise_not_(x):
    _no_float_not(x)
    return E.run(_LOGICAL_NOT_BOOL if x.dtype == torch.bool else _BITWISE_NOT, [x], out=x)


# -- integer-only: gcd, lcm, shifts ------------------------------------------------------
def _integer_only(op, operands, cpu_name):
    dtype = E.dtypes_for(op, operands)[0]
    if dtype.is_floating_point or dtype == torch.bool:
        raise NotImplementedError(f"\"{cpu_name}\" not implemented for '{T.dtype_name(dtype)}'")


@njit
def _gcd(a, b):
    a, b = abs(a), abs(b)
    while a != 0:
        a, b = b % a, a
    return b


@njit
def _lcm(a, b):
    g = _gcd(a, b)
    return 0 if g == 0 else abs(a // g * b)


@njit
def _lshift(x, y):
    # the CPU shifts the unsigned bits; shifting by the width or more (or negative) gives 0
    return 0 if (y < 0 or y >= 64) else x << y


@njit
def _rshift(x, y):
    # arithmetic shift; out-of-range amounts leave only the sign
    return x >> 63 if (y < 0 or y >= 64) else x >> y


def _integer_op(name, fn, cpu_name, functional, inplace=()):
    op = E.Elementwise(name, fn)

    def forward(x, y):
        _integer_only(op, [x, y], cpu_name)
        return E.run(op, [x, y])

    def forward_(x, y):
        _integer_only(op, [x, y], cpu_name)
        return E.run(op, [x, y], out=x)

    forward.checks_devices = forward_.checks_devices = True
    register(*functional)(forward)
    if inplace:
        register(*inplace)(forward_)


_integer_op("gcd", _gcd, "gcd_cpu", [aten.gcd.default])
_integer_op("lcm", _lcm, "lcm_cpu", [aten.lcm.default])
_integer_op("lshift", _lshift, "lshift_cpu",
            [aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
             aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor,
             aten.__lshift__.Scalar], [aten.__ilshift__.Tensor, aten.__ilshift__.Scalar])
_integer_op("rshift", _rshift, "rshift_cpu",
            [aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
             aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor,
             aten.__rshift__.Scalar], [aten.__irshift__.Tensor, aten.__irshift__.Scalar])


# -- hash_tensor ---------------------------------------------------------------------------
@njit(error_model="numpy", nogil=True)
def _xor_rows(out, bits):
    for r in range(bits.shape[0]):
        h = np.uint64(0)
        for c in range(bits.shape[1]):
            h ^= bits[r, c]
        out[r] = h


@register(aten.hash_tensor.default)
def hash_tensor(x, dim=(), *, keepdim=False, mode=0):
    """XOR of the elements' bits after widening to float64 / int64 (mode 0), as the CPU."""
    from neuron_eager.ops.views import meta_like

    meta = aten.hash_tensor.default(meta_like(x), dim, keepdim=keepdim, mode=mode)
    dims = sorted({d % max(x.dim(), 1) for d in dim}) if dim else list(range(x.dim()))
    wide = E.copy_into(E.T.empty(x.shape, torch.float64 if x.dtype.is_floating_point
                                 else torch.int64), x)  # exact widening
    kept = [d for d in range(x.dim()) if d not in dims]
    rows = E.T.numel([x.shape[d] for d in kept])
    flat = wide.permute(kept + dims).contiguous() if x.dim() else wide
    out = E.T.empty(meta.shape, torch.uint64)
    if rows:
        bits = flat._nd.reshape(-1).view(np.uint64).reshape(rows, x.numel() // rows)
        _xor_rows(out._nd.reshape(-1), bits)
    core.launch("vector", x.numel(), wide._nd.nbytes)
    return out
