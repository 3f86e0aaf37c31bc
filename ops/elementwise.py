"""Elementwise execution: type promotion, broadcasting, layouts, launch.

`run(op, operands, params, out)` is the one entry point every elementwise op
family uses. Operands are neuron tensors, CPU 0-dim tensors or Python
scalars; PyTorch's promotion rules pick the result dtype (`kind`: "default",
"int_to_float", "always_bool"); values are widened to the compute type, the
op's scalar function runs, and the result is rounded once into the output.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable

import numpy as np
import torch

from neuron_eager.device_sim import config, core
from neuron_eager.ops import jit, kernelgen, numerics, streaming, transpose, workers
from neuron_eager.ops import overlap
from neuron_eager.ops.broadcasting import (  # noqa: F401  (E.broadcast_shape, ...)
    broadcast_shape, broadcast_strides, layout_for, output_strides, try_broadcast)
from neuron_eager.ops import tensor as T

NeuronTensor = T.NeuronTensor
_promotion_cache: dict = {}
# A Python float meeting an integer tensor, and int_to_float ops, give the default dtype: it
# is part of every cache key that holds a promoted dtype (torch.set_default_dtype may change
# it between two calls: Hugging Face sets it while building a model in bf16).
default_dtype = torch.get_default_dtype


@dataclass(frozen=True, eq=False)  # hashed by identity: it keys the fast-path plans
class Elementwise:
    """An elementwise op: its jitted scalar function and how PyTorch types its result."""

    name: str
    fn: Callable
    nparams: int = 0
    kind: str = "default"  # "default" | "int_to_float" | "always_bool"
    engine: str = "vector"  # the engine a Trainium kernel would use
    float_only: bool = False  # refuse integer/bool inputs as PyTorch does
    dense_result: bool = False  # a new result is contiguous whatever its operands' layouts

    def __post_init__(self):
        if self.fn is not None:  # (None: a typing stand-in, never run)
            _register_name(self)


# Note [Inlined op bodies]
# A loop calls its op's scalar function, and LLVM inlines it unless it is large: a body
# that calls two of ops/fastmath.py's approximations (erf and exp, log1p and exp) stays a
# call, and the loop runs one element at a time (gelu_backward 8x, softplus 5x slower).
# Such bodies are jitted with inline="always": Numba inlines them into every loop, which
# then vectorises; the arithmetic, and so every bit, is the same.


# Note [Ops by name]
# Generated kernel files name the scalar functions they call by op name (a kernel file on
# disk cannot hold a function object), so a name must mean one function. A second op with a
# name already taken is accepted only if it is the same definition (same fields, module,
# bytecode and constants, no closure): then the name keeps meaning the first one. (Today:
# "div", defined twice in arithmetic.py.)
OPS_BY_NAME: dict = {}


def _register_name(op: "Elementwise") -> None:
    first = OPS_BY_NAME.setdefault(op.name, op)
    if first is not op and _definition(first) != _definition(op):
        raise ValueError(f"two different elementwise ops are named {op.name!r}")


def _definition(op: "Elementwise"):
    fn = getattr(op.fn, "py_func", op.fn)
    code = fn.__code__
    no_closure = fn.__closure__ is None or object()  # a closure never matches: cells differ
    return (op.nparams, op.kind, op.engine, op.float_only, op.dense_result, fn.__module__,
            code.co_code, code.co_consts, code.co_names, no_closure)


def resolve(recipe: tuple):
    """The jitted function a recipe names, for generated kernel files: ("op", name) an
    elementwise op's scalar function (Note [Ops by name]), ("loader", code, compute),
    ("storer", code[, stochastic]), ("bits", "f32_as_u32" | "u32_as_f32") a bit cast,
    ("pointer", NumPy dtype name) an address's cast for multi-tensor loops (jit.pointer_to),
    ("row", "fold_lanes" | "lane_sum" | "row_max") row sums and maxima (Note [Sum order] in
    numerics.py),
    or ("rounder", "f16"): fp32 rounded to fp16's values (Note [fp16 values stay fp32] in
    adaptive/codegen.py).

    >>> resolve(("storer", "f32"))(1.5)
    1.5
    """
    kind, *args = recipe
    if kind == "op":
        return OPS_BY_NAME[args[0]].fn
    if kind == "loader":
        return numerics.loader(*args)
    if kind == "storer":
        return numerics.storer(*args)
    if kind == "rounder" and args[0] == "f16":
        return numerics.round_to_f16
    if kind == "pointer":
        return jit.pointer_to(args[0])
    if kind == "bits" and args[0] in ("f32_as_u32", "u32_as_f32"):
        return getattr(numerics, args[0])
    if kind == "row" and args[0] in ("fold_lanes", "lane_sum", "row_max"):
        return getattr(numerics, args[0])
    raise ValueError(f"unknown kernel recipe {recipe!r}")


def _proxy(key):
    """A CPU stand-in with the same promotion category as the operand `key` describes."""
    if isinstance(key, tuple):
        return torch.empty(() if key[1] else (1,), dtype=key[0])
    return key(1)


def _result_type(keys) -> torch.dtype:
    proxies = [_proxy(k) for k in keys]
    if len(proxies) == 2:
        return torch.result_type(proxies[0], proxies[1])
    if len(proxies) == 1:
        a = proxies[0]
        return a.dtype if isinstance(a, torch.Tensor) else torch.result_type(torch.tensor(0), a)
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    return elementwise_dtypes(*proxies,
                              type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]


def dtypes_for(op: Elementwise, operands) -> tuple[torch.dtype, str]:
    """(result dtype, compute type) of `op` on `operands`, by PyTorch's promotion rules."""
    return promotion(op, operands)[:2]


def signature(operands) -> tuple:
    """What PyTorch's dtype rules see of `operands`: (dtype, is 0-dim) of each tensor, the
    type of each Python scalar."""
    return tuple([(a.dtype, a.dim() == 0) if isinstance(a, torch.Tensor) else type(a)
                  for a in operands])


def promotion(op: Elementwise, operands, sig: tuple | None = None):
    """(result dtype, compute type, scalar cast, 16-bit dtype integer tensors round to
    first or None) of `op` on `operands`, by PyTorch's promotion rules; the cast turns a
    Python scalar into a kernel argument (Note [Integers into 16-bit floats] for the last).

    Computed on CPU stand-ins (torch.result_type on neuron tensors would dispatch) and
    cached by the operands' signature (given, or found here).
    """
    if sig is None:
        sig = signature(operands)
    key = (op.kind, op.float_only, op.name, default_dtype(), sig)
    hit = _promotion_cache.get(key)
    if hit is None:
        hit = _promotion_cache[key] = _dtypes_uncached(op, sig)
    return hit


BAREBONES = (torch.uint16, torch.uint32, torch.uint64)  # PyTorch's storage-only unsigned types


# Note [Integers into 16-bit floats]
# The CPU casts every tensor operand to the common dtype before the op (TensorIterator's
# promote_inputs_to_common_dtype), so in `int32 + bf16` the integer is first rounded to
# bf16: 257 adds as 256, and 70000 is fp16's inf. The engines load an integer straight to
# fp32, exact below 2^24. Where the common dtype is bf16 or fp16 and an operand is an
# integer tensor too wide for it to hold exactly (int16 and wider), that operand is
# converted first, in a launch of its own, as the CPU's cast; adaptive eager runs such an
# op eagerly. Rare in models (masks are bool or small), so the extra launch is not fused.
_WIDE_INTS = (torch.int16, torch.int32, torch.int64)
_HALVES = (torch.bfloat16, torch.float16)


def _dtypes_uncached(op: Elementwise, keys):
    for k in keys:
        if isinstance(k, tuple) and k[0] in BAREBONES:
            raise NotImplementedError(
                f"{user_name(op)} has no neuron kernel for {k[0]}: PyTorch's {k[0]} is a storage "
                f"type (copies and views); convert it first, e.g. x.to(torch.int32)")
    common = _result_type(keys)
    if common.is_complex:  # (t == 1j: the refusal, not a TypeError that __eq__ turns into a
        T.check_dtype(common)  # Python False)
    if op.kind == "int_to_float" and not common.is_floating_point:
        common = torch.get_default_dtype()
    elif op.float_only and not common.is_floating_point and op.kind != "always_bool":
        raise NotImplementedError(f"\"{op.name}\" not implemented for '{T.dtype_name(common)}'")
    compute = numerics.compute_type(common)
    rounds = common in _HALVES and any(
        isinstance(k, tuple) and k[0] in _WIDE_INTS for k in keys)
    dtype = torch.bool if op.kind == "always_bool" else common
    return dtype, compute, numerics.scalar_cast(compute, common), common if rounds else None


def _ints_rounded(operands, common: torch.dtype) -> tuple:
    """`operands` with each integer tensor converted to `common` (Note [Integers into 16-bit
    floats])."""
    return tuple(copy_into(T.empty(a.shape, common, None), a)  # (out's layout is chosen)
                 if isinstance(a, NeuronTensor) and a.dtype in _WIDE_INTS else a
                 for a in operands)


_PROMOTE = Elementwise("promote", None)

# Note [Fusible ops]
# FUSIBLE maps an aten overload whose kernel is exactly `run(op, operands, params)` to its
# plan: called with the op's (args, kwargs), it makes the kernel's own argument checks and
# returns that (op, operands, params). Adaptive eager records such calls instead of running
# them; the plan is what lets it fuse them without changing a bit of the result.
FUSIBLE: dict = {}


def fusible(*overloads):
    """Declare `plan(*args, **kwargs) -> (Elementwise, operands, params)` for `overloads`."""
    def register_plan(plan):
        for overload in overloads:
            FUSIBLE[overload] = plan
        return plan

    return register_plan


# In-place forms whose kernel is exactly `run(op, operands, params, out=operands[0])`.
FUSIBLE_INPLACE: dict = {}


def fusible_inplace(*overloads):
    """Declare the plan of in-place `overloads` (see FUSIBLE): the kernel writes the result,
    computed in the promoted type, into its first operand."""
    def register_plan(plan):
        for overload in overloads:
            FUSIBLE_INPLACE[overload] = plan
        return plan

    return register_plan


def scalar_tensors_cast(op: Elementwise, operands):
    """`operands` with each 0-dim neuron tensor beside larger tensors cast first to the common
    dtype where that changes its value, as the CPU's TensorIterator casts its inputs: a 0-dim
    tensor does not promote, so `uint8 // tensor(-3)` divides by 253, a bf16 tensor plus
    a float32 tensor(1.0001) adds bf16's 1.0 and plus tensor(257) adds 256 (the kernels load
    it whole otherwise)."""
    zero = wide = False
    for a in operands:
        if type(a) is NeuronTensor:
            if a.dim() == 0:
                zero = True
            else:
                wide = True
        elif isinstance(a, torch.Tensor):  # (a CPU 0-dim tensor, read on the host)
            zero = True
    if not (zero and wide):
        return operands
    target = result_type(*operands) if op.kind == "always_bool" else promotion(op, operands)[0]
    return tuple(_scalar_tensor_cast(op, k, a, target) if isinstance(a, torch.Tensor) and
                 a.dim() == 0 and a.dtype != target and (
                     torch.promote_types(a.dtype, target) != target or
                     target.is_floating_point and not a.dtype.is_floating_point) else a
                 for k, a in enumerate(operands))


_OPMATH_DIVISORS = ("mul", "div", "div_floor", "div_trunc")


def _scalar_tensor_cast(op: Elementwise, k: int, a: torch.Tensor, target: torch.dtype):
    """A 0-dim operand cast for `scalar_tensors_cast`. The CPU's mul and divisions of bf16/fp16
    read a one-value second operand at fp32 (`original_scalar_value<opmath_t>`), as they read a
    Python scalar (Note [Reduced-precision scalars] in arithmetic.py): clip_grad_norm_'s
    `grads * clip_coef` multiplies by the fp32 coefficient."""
    if k == 1 and op.name in _OPMATH_DIVISORS and target in (torch.bfloat16, torch.float16):
        return a if a.dtype == torch.float32 else a.to(torch.float32)
    return a.to(target)


def result_type(*operands, sig: tuple | None = None) -> torch.dtype:
    """torch.result_type for neuron operands, without dispatching (`sig`: their signature,
    where the caller has it)."""
    return promotion(_PROMOTE, operands, sig)[0]


_SCALAR_TYPES = (float, int, bool)
_fast_plans: dict = {}


def _run_contiguous(op: Elementwise, operands, params):
    """The common case in one pass: contiguous same-shape tensors and Python scalars.

    Returns None when the operands need the general path.
    """
    fast = fast_new(op, operands)
    if fast is None:
        return None
    (kernel, dtype, cast, exact), shape = fast
    out = T.new_contiguous(shape, dtype)
    args = [T.flat(a) if type(a) is NeuronTensor else cast(a) for a in operands]
    _call_fast(op, kernel, out._flat, args, params, cast, exact, 0, streams=True)
    return out


def fast_new(op: Elementwise, operands, table: bool = False):
    """(plan, shape) of `_run_contiguous` for these operands, None if it does not apply;
    `table`: the plan of a multi-tensor launch (`_plan_contiguous`)."""
    shape = None
    signature = [op, config.numerics_key, default_dtype(), table]
    for a in operands:
        kind = type(a)
        if kind is NeuronTensor:
            key = a._key
            if key is None:
                return None
            if shape is None:
                shape = key[0]
            elif key[0] != shape:
                if not (table and key[0] == ()):
                    return None
                signature.append(("z", key[1]))  # (a 0-dim tensor: one value for all rows)
                continue
            signature.append(key[1])
        elif kind in _SCALAR_TYPES:
            signature.append(kind)
        else:
            return None
    if not shape:
        return None
    signature = tuple(signature)
    plan = _fast_plans.get(signature)
    if plan is None:
        plan = _fast_plans[signature] = _plan_contiguous(op, operands, None, table)
    return (plan, shape) if plan else None


def _call_fast(op, kernel, out_arr, args, params, cast, exact, reads_of_out, streams=False):
    """A fast path's launch: `run_fast` and its accounting."""
    moved = run_fast(op, kernel, out_arr, args, params, cast, exact, reads_of_out, streams)
    core.launch(op.engine, out_arr.size, moved)


def run_fast(op, kernel, out_arr, args, params, cast, exact, reads_of_out, streams) -> int:
    """A fast path's kernel (split across cores when large; `streams`: a new result that
    outgrows the cache is written around it) and int64 wraps; returns the bytes moved (the
    write, each array read, and `reads_of_out` reads of the output itself)."""
    n = out_arr.size
    moved = out_arr.nbytes * (1 + reads_of_out) + sum(a.nbytes for a in args
                                                      if type(a) is np.ndarray)
    if params:
        args += [cast(p) for p in params]
    if n < workers.SPLIT_MIN:
        kernel(out_arr, *args)
    else:
        workers.split_call(streams and streaming.kernel_for(op.name, out_arr, args) or kernel,
                           out_arr, args)
    if exact:
        numerics.wrap_int64(out_arr, user_name(op))
    return moved


def _run_contiguous_into(op: Elementwise, operands, params, out: NeuronTensor):
    """`_run_contiguous` for a given contiguous `out` (in-place ops: foreach steps, x.add_(y)):
    operands of its shape, each `out` itself or on other memory, or scalars. None when the
    general path must decide (broadcasts, aliases, casts it refuses)."""
    plan = fast_into(op, operands, out)
    if plan is None:
        return None
    kernel, _, cast, exact = plan
    args = [T.flat(a) if type(a) is NeuronTensor else cast(a) for a in operands if a is not out]
    _call_fast(op, kernel, T.flat(out), args, params, cast, exact, len(operands) - len(args))
    return out


def fast_into(op: Elementwise, operands, out, table: bool = False):
    """The plan of `_run_contiguous_into`, None if it does not apply (`table`: as fast_new)."""
    if type(out) is not NeuronTensor:
        return None
    key = out._key
    if key is None:
        return None
    shape = key[0]
    if not shape:
        return None
    signature = [op, config.numerics_key, default_dtype(), table, key[1]]  # (shared with fast_new)
    for a in operands:
        kind = type(a)
        if a is out:
            signature.append("o")
        elif kind is NeuronTensor:
            akey = a._key
            if akey is None or a._storage is out._storage:
                return None
            if akey[0] != shape:
                if not (table and akey[0] == ()):
                    return None
                signature.append(("z", akey[1]))  # (as in fast_new)
                continue
            signature.append(akey[1])
        elif kind in _SCALAR_TYPES:
            signature.append(kind)
        else:
            return None
    signature = tuple(signature)
    plan = _fast_plans.get(signature)
    if plan is None:
        plan = _fast_plans[signature] = _plan_contiguous(op, operands, out, table)
    return plan or None


def _plan_contiguous(op, operands, out=None, table=False):
    """(kernel, result dtype, scalar cast, int64 wrap) of a fast path; with `out`, of the
    in-place form (False: the result type does not cast to out's, the general path raises).
    With `table`, the kernel is a multi-tensor loop over an address table (False for results
    that wrap int64 or round stochastically: their tensors run one by one), and a 0-dim tensor
    among operands with dims is one value for every row ("z")."""
    dtype, compute, cast, rounds = promotion(op, operands)
    if rounds is not None:
        return False
    if out is not None:
        if not torch.can_cast(dtype, out.dtype) or dtype != out.dtype and dtype in _HALVES:
            return False  # (the general path raises, or rounds to dtype before out's)
        dtype = out.dtype
    kinds = tuple("o" if a is out else "s" if type(a) is not NeuronTensor else
                  "z" if table and a.dim() == 0 and any(b.dim() for b in operands if
                                                         type(b) is NeuronTensor) else "a"
                  for a in operands)
    codes = tuple(numerics.load_code(a.dtype) if type(a) is NeuronTensor else "py"
                  for a in operands)
    stochastic = config.stochastic_rounding and dtype in (torch.bfloat16, torch.float16)
    out_code = _out_code(dtype, compute)
    if table:
        if stochastic or out_code == "i64x":
            return False
        storage = tuple(T.STORAGE_DTYPE[a.dtype].name if k in "az" else ""
                        for k, a in zip(kinds, operands))
        kernel = kernelgen.table_kernel(op.name, op.fn, op.nparams, kinds, codes, compute,
                                        out_code, (T.STORAGE_DTYPE[dtype].name, *storage))
        return kernel, dtype, cast, False
    kernel = kernelgen.elementwise_kernel(op.name, op.fn, op.nparams, kinds, codes, compute,
                                          out_code, "c", stochastic)
    return kernel, dtype, cast, out_code == "i64x"


def _out_code(dtype: torch.dtype, compute: str) -> str:
    """The store format of a result: int64 arithmetic is stored whole, then wrapped to int32
    as Trainium computes it (numerics.wrap_int64), so that a wrap can warn."""
    code = numerics.CODE[dtype]
    return "i64x" if code == "i64" and compute == "int" else code


def user_name(op: Elementwise) -> str:
    """An op's name as users know it (add, not add_plain)."""
    return op.name.removesuffix("_plain")


def check_castable(result_dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    if not torch.can_cast(result_dtype, out_dtype):
        raise RuntimeError(f"result type {T.dtype_name(result_dtype)} can't be cast to the "
                           f"desired output type {T.dtype_name(out_dtype)}")


def run(op: Elementwise, operands, params=(), out: NeuronTensor | None = None) -> NeuronTensor:
    """Compute `op` elementwise and return the result (written into `out` if given).

    Checks devices itself (kernels calling it set `checks_devices`): operands are neuron
    tensors, Python scalars or CPU 0-dim tensors. An `out` wider than a bf16/fp16 result
    gets the rounded result, as a user's out= does on the CPU: a kernel that means to compute
    in out's dtype promotes its operands first (as addr does for its vectors).
    """
    if out is not None and type(out) is not NeuronTensor:  # (a CPU 0-dim x.add_(neuron y))
        raise T.device_error(out.device)
    result = _run_contiguous(op, operands, params) if out is None else \
        _run_contiguous_into(op, operands, params, out)
    if result is not None:
        return result
    operands = scalar_tensors_cast(op, operands)
    key = _layout_key(op, operands, out)
    planned = _planned.get(key) if key is not None else None
    if planned is not None and (out is None or _no_aliases(operands, out)):
        plan, result_dtype, strides = planned
        if out is None:
            out = T.empty(plan[0], result_dtype, strides)
        return _launch_planned(plan, operands, params, out)
    for a in operands:
        if isinstance(a, torch.Tensor) and type(a) is not NeuronTensor:
            T.check_foreign(a)
    result_dtype, compute, cast, rounds = promotion(op, operands)
    arrays = [a for a in operands if isinstance(a, NeuronTensor)]
    shape = broadcast_shape([a.shape for a in arrays]) if arrays else ()
    strides = None
    if out is None:
        strides = output_strides(arrays, shape)
        out = T.empty(shape, result_dtype, strides)
    else:
        check_castable(result_dtype, out.dtype)
        if tuple(out.shape) != shape and arrays:
            if broadcast_shape([out.shape, shape]) != tuple(out.shape):
                raise RuntimeError(f"output with shape {list(out.shape)} doesn't match the "
                                   f"broadcast shape {list(broadcast_shape([out.shape, shape]))}")
            shape = tuple(out.shape)
        overlap.check_no_internal_overlap(out)
        if not _no_aliases(operands, out) or (
                out.dtype != result_dtype and result_dtype in _HALVES):
            # another view of the output's memory: compute aside, then copy (no torn reads);
            # a bf16/fp16 result for an out= of another dtype: the CPU rounds to it first
            tmp = run(op, operands, params, None)
            return copy_into(out, tmp)
    if rounds is not None:  # (not planned: the converted operands' call is)
        return run(op, _ints_rounded(operands, rounds), params, out)
    plan = _plan_launch(op, operands, out, shape, compute, cast)
    if plan is None:
        return _run_sliced(op, operands, params, out)
    if key is not None:
        if len(_planned) > 4096:
            _planned.clear()
        _planned[key] = (plan, result_dtype, strides)
    return _launch_planned(plan, operands, params, out)


# Note [Planned layouts]
# An op the contiguous fast path does not take (a broadcast, a transposed or sliced operand)
# costs a promotion, a broadcast, the output's layout rule, the coalescing of strides and a
# kernel lookup: ~40 us of Python for a (64, 1024) - (1024,) sub, three times the fast path.
# All of it follows from the operands' dtypes, shapes and strides (and the numerics
# settings), so it is planned once per such layout and replayed: a call then checks only
# what depends on memory (an output sharing an operand's storage) and makes the NumPy views.
_planned: dict = {}


def _layout_key(op, operands, out) -> tuple | None:
    """What a planned launch depends on; None when it cannot be planned (CPU tensors)."""
    key = [op, config.numerics_key, default_dtype()]
    for a in operands:
        kind = type(a)
        if kind is NeuronTensor:
            key.append("o" if a is out else (a.dtype, a.shape, a.stride()))
        elif kind in _SCALAR_TYPES:
            key.append(kind)
        else:
            return None
    if out is not None:
        key.append((out.dtype, out.shape, out.stride()))
    return tuple(key)


def _no_aliases(operands, out) -> bool:
    """Raises the CPU's error for partly overlapping operands; False if an operand other
    than `out` itself reads out's memory (then the result is computed aside)."""
    storage, alone = out._storage, True
    for a in operands:
        if type(a) is NeuronTensor and a is not out and a._storage is storage:
            overlap.check_no_partial_overlap(out, a)
            alone = False
    return alone


def launch(op: Elementwise, operands, params, out: NeuronTensor, shape, compute: str,
           cast=None):
    """Run `op` into an allocated `out` (of broadcast `shape`) computing in `compute`,
    Python scalars converted by `cast` (numerics.scalar_cast)."""
    plan = _plan_launch(op, operands, out, shape, compute, cast)
    if plan is None:
        return _run_sliced(op, operands, params, out)
    return _launch_planned(plan, operands, params, out)


def _one_value(t: NeuronTensor) -> bool:
    """Whether every element of t is one and the same (one element, or one expanded)."""
    numel = t.numel()
    return numel == 1 or (numel > 0 and not t.is_contiguous() and not any(
        stride for size, stride in zip(t.shape, t.stride()) if size > 1))


def _plan_launch(op: Elementwise, operands, out: NeuronTensor, shape, compute: str, cast):
    """The layout-only part of a launch: (shape, n, kernel, split, views, args, cast, wrap,
    moved, engine), where views holds (shape, byte strides) of the output, then of each array
    operand, and args says where each kernel argument comes from. None: more than 4 dims
    that do not merge (run slice by slice)."""
    cast = cast or numerics.SCALAR_CAST[compute]
    n = out.numel()
    kinds, codes, args = [], [], []  # args: ("a", operand) arrays, ("z", k) neuron 0-dim
    aliased = 0  # operands that are `out` itself (Note [In-place loops] in kernelgen.py)
    for k, a in enumerate(operands):
        if a is out and out.dim():
            kinds.append("o")
            codes.append(numerics.load_code(a.dtype))
            aliased += 1
        elif isinstance(a, NeuronTensor) and (a.dim() or out.dim() == 0) and not (
                n > 1 and _one_value(a)):
            kinds.append("a")
            codes.append(numerics.load_code(a.dtype))
            args.append(("a", k))
        elif isinstance(a, NeuronTensor):  # a 0-dim or one-element tensor in a larger
            kinds.append("s")  # result, or one value expanded (mean's gradient): loaded once
            # (as a scalar operand, not gathered at every element)
            codes.append(numerics.load_code(a.dtype))
            args.append(("z", k))
        else:  # Python scalar or CPU 0-dim tensor, converted once on the host
            kinds.append("s")
            codes.append("py")
            args.append(("s", k))
    tensors = [out] + [operands[k] for kind, k in args if kind == "a"]
    if all(a.shape == out.shape and a.is_contiguous() for a in tensors):
        layout = "c"
        views = [((n,), (a.element_size(),)) for a in tensors]
    else:
        strides = [list(out.stride())] + [broadcast_strides(a, shape) for a in tensors[1:]]
        order = memory_order(strides[0])  # (a transposed output merges like a plain one)
        cshape, cstrides = kernelgen.coalesce([shape[d] for d in order],
                                              [[st[d] for d in order] for st in strides])
        if len(cshape) > 4:
            return None
        layout, views, array_kinds = _broadcast_views(tensors, cshape, cstrides)
        kind_of = iter(array_kinds[1:])
        kinds = [next(kind_of) if kind == "a" else kind for kind in kinds]
    out_code = _out_code(out.dtype, compute)
    kernel = kernelgen.elementwise_kernel(
        op.name, op.fn, op.nparams, tuple(kinds), tuple(codes), compute, out_code, layout,
        config.stochastic_rounding and out.dtype in (torch.bfloat16, torch.float16))
    moved = n * out.element_size() * (1 + aliased) + sum(
        prod(shape_) * a.element_size() for a, (shape_, _) in zip(tensors[1:], views[1:]))
    split = n >= workers.SPLIT_MIN and splits(layout, views[0][0])
    return (tuple(shape), n, kernel, split, views, args, cast, out_code == "i64x", moved, op)


def splits(layout: str, out_shape) -> bool:
    """Whether a large loop of this layout runs in slices: a strided one when its outermost
    dim can be cut (Note [Strided loops in slices] in kernelgen.py)."""
    return layout != "s" or out_shape[0] > 1


def _launch_planned(plan, operands, params, out: NeuronTensor) -> NeuronTensor:
    """Run a planned launch (`_plan_launch`) on these operands' memory."""
    _, n, kernel, split, views, args, cast, wrap, moved, op = plan
    if n == 0:
        return out
    out_arr = _view_of(out, *views[0])
    values, k = [], 1
    for kind, i in args:
        a = operands[i]
        if kind == "a":
            values.append(_view_of(a, *views[k]))
            k += 1
        elif kind == "z":
            values.append(_view_of(a, (), ())[()])
        else:
            values.append(cast(a.item() if isinstance(a, torch.Tensor) else a))
    values += [cast(p) for p in params]
    if split:
        workers.split_call(kernel, out_arr, values)
    else:
        kernel(out_arr, *values)
    if wrap:
        numerics.wrap_int64(out_arr, user_name(op))
    core.launch(op.engine, n, moved)
    return out


def _view_of(t: NeuronTensor, shape, byte_strides) -> np.ndarray:
    """A NumPy view of t's memory from its first element (strides in bytes)."""
    dtype = T.STORAGE_DTYPE[t.dtype]
    return np.ndarray(shape, dtype, t._storage.buffer, t.storage_offset() * dtype.itemsize,
                      byte_strides)


def _broadcast_views(tensors, cshape, cstrides) -> tuple[str, list, tuple]:
    """(layout, views, array kinds) of tensors (the output first) over a coalesced shape with
    their strides there, each view a (shape, byte strides) pair: 'c' where they all merge to
    one unit-stride dim (a transposed tensor alone, or with operands of its layout), 'b'
    where it fits (Note [Broadcast rows] in kernelgen.py), else 's' (4-D strided views);
    kinds all "a" but under 'b'."""
    if len(cshape) == 1 and all(st[0] == 1 for st in cstrides):
        return "c", [_in_bytes(t, cshape, (1,)) for t in tensors], ("a",) * len(tensors)
    kinds = kernelgen.broadcast_kinds(cshape, cstrides)
    if kinds is not None:
        rows, cols = cshape
        views = [_in_bytes(t, *kernelgen.BROADCAST_VIEWS[kind](rows, cols))
                 for t, kind in zip(tensors, kinds)]
        return "b", views, kinds
    views = [_in_bytes(t, *kernelgen.strided_4d(cshape, st)) for t, st in zip(tensors, cstrides)]
    return "s", views, ("a",) * len(tensors)


def _in_bytes(t: NeuronTensor, shape, strides) -> tuple:
    size = t.element_size()
    return tuple(shape), tuple(st * size for st in strides)


def memory_order(stride) -> list[int]:
    """The dims from the largest stride to the smallest (ties keep their order)."""
    return sorted(range(len(stride)), key=lambda d: -stride[d])


def _run_sliced(op, operands, params, out):
    """More than 4 non-mergeable dims: run slice by slice along the first dim."""
    for i in range(out.shape[0]):
        sub = []
        for a in operands:
            if isinstance(a, NeuronTensor) and a.dim() == out.dim():
                a = a[i] if a.shape[0] == out.shape[0] else a[0]
            sub.append(a)
        run(op, sub, params, out[i])
    return out


def copy_into(dst: NeuronTensor, src: NeuronTensor) -> NeuronTensor:
    """dst[...] = src, broadcasting src and converting its dtype with Trainium rounding."""
    if src.dtype == dst.dtype:  # a DMA
        out_nd = dst._nd
        if src._storage is dst._storage:
            np.copyto(out_nd, src._nd)  # NumPy handles overlapping views
        elif out_nd.size < transpose.MIN_ELEMENTS or not transpose.copy_into_rows(dst, src):
            workers.copy(out_nd, src._nd)
        core.launch("dma", dst.numel(), 2 * out_nd.nbytes)
        return dst
    if src._storage is dst._storage:
        src = src.clone()
    compute = numerics.compute_type(src.dtype)
    _launch_converted(dst, src, compute)
    return dst


def _launch_converted(dst, src, compute):
    if dst.numel() == 0:
        return
    shape = tuple(dst.shape)
    if dst.is_contiguous() and src.is_contiguous() and src.shape == dst.shape:
        layout, out_arr, arr, kind = "c", dst._nd.reshape(-1), src._nd.reshape(-1), "a"
    else:
        cshape, (so, si) = kernelgen.coalesce(shape, [list(dst.stride()),
                                                      broadcast_strides(src, shape)])
        if len(cshape) > 4:
            for i in range(dst.shape[0]):
                _launch_converted(dst[i], src[i] if src.dim() == dst.dim() and src.shape[0] > 1
                                  else (src[0] if src.dim() == dst.dim() else src), compute)
            return
        layout, (out_view, view), (_, kind) = _broadcast_views([dst, src], cshape, [so, si])
        out_arr, arr = _view_of(dst, *out_view), _view_of(src, *view)
    kernel = kernelgen.elementwise_kernel(
        "convert", numerics.identity, 0, (kind,), (numerics.CODE[src.dtype],), compute,
        numerics.CODE[dst.dtype], layout,
        config.stochastic_rounding and dst.dtype in (torch.bfloat16, torch.float16))
    if dst.numel() >= workers.SPLIT_MIN and splits(layout, out_arr.shape):  # a slice per core
        workers.split_call(kernel, out_arr, [arr])
    else:
        kernel(out_arr, arr)
    core.launch("vector", dst.numel(), out_arr.nbytes + arr.nbytes)

