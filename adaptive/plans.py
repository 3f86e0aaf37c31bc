"""What adaptive eager records beyond the elementwise table: casts, where, clamp, reductions.

A plan gets an op's (args, kwargs) and returns a `Planned` (what to record, typed the way
the eager kernel types it, with the eager kernel's errors raised now) or None when this
call should simply run eagerly (an unusual form: tensor bounds, a cast to int, a reduction
over leading dims...). Eager and recorded forms compute the same bits: a plan only accepts
calls whose eager kernel is exactly the recorded loop (Note [Bit-identical fusion]).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from numba import njit

from neuron_eager.device_sim import config
from neuron_eager.ops import arithmetic, copy, masking, numerics, reduction
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import tensor as T

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor


class Planned(NamedTuple):
    op: object  # an Elementwise, or a Reduction
    operands: list
    params: list
    dtype: torch.dtype | None = None  # None: PyTorch's promotion of the operands decides
    compute: str | None = None
    shape: tuple | None = None  # the result shape (None: the operands' broadcast)
    runner: Callable | None = None  # runner(operands, params, dtype): the eager kernel


@dataclass(frozen=True, eq=False)
class Reduction:
    """sum/mean/amax over the trailing `dims` of one operand (a region's last stage).

    `eager(x)` runs the plain-eager kernel; the fused row kernel (adaptive/rowgen.py)
    repeats its accumulation order exactly: Note [Sum order] (ops/numerics.py) for sums,
    first-NaN-wins for amax. One instance per (name, dims, keepdim): it keys plans.
    """

    name: str  # "sum" | "mean" | "amax"
    dims: tuple
    keepdim: bool
    engine: str = "vector"
    fn: None = None
    nparams: int = 0

    def eager(self, x: NeuronTensor) -> NeuronTensor:
        kernel = {"sum": reduction.sum_dim, "mean": reduction.mean_dim,
                  "amax": reduction.amax}[self.name]
        return kernel(x, list(self.dims), self.keepdim)


_reductions: dict = {}


CONVERT = E.Elementwise("convert", numerics.identity)  # a dtype cast: load, then store


class _View:
    """The op of a recorded view of a pending tensor: no kernel, its base's memory."""

    name, engine, fn, nparams = "view", "dma", None, 0

    def __repr__(self) -> str:
        return "VIEW"


VIEW = _View()

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
PLANS: dict = {}


def plan(*overloads):
    def register_plan(fn):
        for overload in overloads:
            PLANS[overload] = fn
        return fn
    return register_plan


@plan(aten._to_copy.default)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    if (type(x) is not NeuronTensor or dtype is None or dtype == x.dtype
            or x.dtype not in _FLOATS or dtype not in _FLOATS or layout not in (None, torch.strided)
            or (device is not None and torch.device(device).type != T.DEVICE.type)
            or memory_format not in (None, torch.preserve_format)
            or config.auto_cast == "all"  # the eager cast loads without auto-cast
            or _odd_contiguous(x)):
        return None
    return Planned(CONVERT, [x], [], dtype, "f32", None,
                   lambda ops, params, to: copy._to_copy(ops[0], dtype=to))


def _odd_contiguous(x) -> bool:
    """Contiguous with other strides than the canonical ones (size-1 dims: `(4, 1)`'s `.t()` is
    (1, 4) with strides (1, 1)): the eager cast keeps them, as the CPU's does, where a
    recorded one would be laid out canonically, so such casts run eagerly."""
    shape = x.shape
    return 1 in shape and x.stride() != T.contiguous_strides(shape) and x.is_contiguous()


# x ** 2 and x ** 3 are products in the pow kernel (ops/power._pow); recorded as their
# own ops they leave no powf call in a fused loop, which would keep LLVM from vectorizing it.
SQUARE = E.Elementwise("square", njit(lambda x: x * x))
CUBE = E.Elementwise("cube", njit(lambda x: x * x * x))
CUBE_BF16 = E.Elementwise("cube_bf16", njit(lambda x: numerics.round_to_bf16(x * x) * x))  # (as
# the CPU's bf16 kernel, ops/power._bf16_pow)


_pow_plans: dict = {}  # (x's dtype, exponent, its type, default dtype) -> planned parts


@plan(aten.pow.Tensor_Scalar)
def pow_scalar(x, exponent):
    generic = E.FUSIBLE[aten.pow.Tensor_Scalar]
    if type(exponent) not in (int, float) or exponent not in (2, 3):
        return generic(x, exponent)
    key = (x.dtype, exponent, type(exponent), E.default_dtype())
    parts = _pow_plans.get(key)
    if parts is None:  # (GELU's x ** 3 is in every step: its typing is looked up, not redone)
        op, operands, _ = generic(x, exponent)
        parts = _pow_plans[key] = (op, *E.dtypes_for(op, operands))
    op, dtype, compute = parts
    cube = CUBE_BF16 if dtype == torch.bfloat16 else CUBE
    return Planned(SQUARE if exponent == 2 else cube, [x], [], dtype, compute, None,
                   lambda ops, params, to: E.run(op, [ops[0], exponent]))


@plan(aten.where.self)
def where(condition, x, y):
    if not isinstance(condition, torch.Tensor) or condition.dtype is not torch.bool:
        return None  # the eager kernel raises (or warns, for uint8)
    dtype = E.result_type(x, y)
    return Planned(arithmetic._WHERE, [condition, x, y], [], dtype, numerics.compute_type(dtype),
                   None, lambda ops, params, to: arithmetic.where(*ops))


@plan(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    value = masking.recordable_fill(x, mask, value)
    if value is None:
        return None
    dtype, compute = E.dtypes_for(masking._MASKED_FILL, [x, mask])
    shape = E.broadcast_shape([mask.shape, x.shape])  # (the CPU's order, for its message)
    return Planned(masking._MASKED_FILL, [x, mask], [value], dtype, compute, shape,
                   lambda ops, params, to: masking.masked_fill(ops[0], ops[1], value))


def _clamp(x, lo, hi):
    if type(x) is not NeuronTensor or (lo is None and hi is None) or \
            isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        return None
    dtype, _ = E.dtypes_for(arithmetic._CLAMP, [x] + [v for v in (lo, hi) if v is not None])
    if dtype != x.dtype:
        return None  # eager casts first
    arithmetic.check_clamp_bounds(lo, hi, dtype)
    return Planned(arithmetic._CLAMP, [x], arithmetic.clamp_params(lo, hi, dtype),
                   runner=lambda ops, params, to: arithmetic._clamp_run(ops[0], lo, hi))


plan(aten.clamp.default)(lambda x, min=None, max=None: _clamp(x, min, max))
plan(aten.clamp_min.default)(lambda x, min: _clamp(x, min, None))
plan(aten.clamp_max.default)(lambda x, max: _clamp(x, None, max))


def _reduce(name, x, dim, keepdim, dtype):
    if type(x) is not NeuronTensor or x.dtype not in _FLOATS or x.numel() == 0 or \
            (dtype is not None and dtype != x.dtype):
        return None
    dims = reduction.wrap_dims(x, dim)  # raises as the CPU does
    nd = x.dim()
    if dims != tuple(range(nd - len(dims), nd)) or not dims:
        return None  # only trailing dims: a row kernel's rows
    shape = tuple(reduction.out_shape(x, dims, keepdim))
    key = (name, dims, keepdim)
    op = _reductions.get(key)
    if op is None:
        op = _reductions[key] = Reduction(name, dims, keepdim)
    return Planned(op, [x], [], x.dtype, "f32", shape, lambda ops, params, to: op.eager(ops[0]))


@plan(aten.sum.dim_IntList)
def sum_dim(x, dim, keepdim=False, *, dtype=None):
    return _reduce("sum", x, dim, keepdim, dtype)


@plan(aten.sum.default)
def sum_all(x, *, dtype=None):
    return _reduce("sum", x, None, False, dtype)


@plan(aten.mean.dim)
def mean_dim(x, dim, keepdim=False, *, dtype=None):
    return _reduce("mean", x, dim, keepdim, dtype)


@plan(aten.mean.default)
def mean_all(x, *, dtype=None):
    return _reduce("mean", x, None, False, dtype)


@plan(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return _reduce("amax", x, dim, keepdim, None)
