"""Multi-tensor launches: one elementwise op over lists of tensors, for the foreach ops
(torch.optim's default path, clip_grad_norm_, EMA updates).

`run(plan, rows, inplace)` takes the calls of one per-tensor op, `(args, kwargs)` each, and
launches them once: contiguous tensors of one format and equal scalars as one loop over an
address table (Note [Address tables]), otherwise each call's cached per-tensor loop in turn
(Note [Multi-tensor launches]).
"""
from __future__ import annotations

import math
from math import prod

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import tensor as T
from neuron_eager.ops import workers

NeuronTensor = T.NeuronTensor


def run(plan, rows, inplace: bool) -> list | None:
    """The calls `rows` of the op that `plan` parses (E.FUSIBLE / E.FUSIBLE_INPLACE) as one
    launch; with `inplace` each writes its first argument. Their results, or None with
    nothing run when a call needs the general path (broadcasts, strided tensors)."""
    done = _run_table(plan, rows, inplace)
    if done is not None:
        return done
    return run_many([plan(*a, **kw) for a, kw in rows], inplace)  # (raises before any run)


# Note [Address tables]
# A device's multi-tensor kernel reads a table of tensor addresses (CUDA's foreach kernels
# take chunks of such a list). When every call of a foreach op has contiguous tensors of the
# same formats and the same scalars, so that one plan fits them all, the launch is one
# jitted loop over a table: a row per tensor holding its output's address and its operands',
# and its element count (kernelgen.table_kernel). Each tensor's loop body is the per-tensor
# kernel's, so the bits are the same. Rows run in order, so a tensor listed twice sees its
# first update, as one op per tensor would. Checks and the plan are row 0's: the others have
# the same dtypes and scalars, so their checks are the same. A 26-tensor optimizer
# `_foreach_add_` took 207 us calling the per-tensor loops in turn, 30-40 us as a table.
# Large tensors keep the per-tensor loops, which share them between cores.


def _run_table(plan, rows, inplace: bool) -> list | None:
    if len(rows) < 2:
        return None
    for args0, kwargs0 in rows:  # the first call of a tensor with dims plans them all
        if type(args0[0]) is NeuronTensor and args0[0].dim():
            break
    else:
        return None
    op, given, params = plan(*args0, **kwargs0)  # (its checks raise here)
    operands = E.scalar_tensors_cast(op, given)  # (as E.run: a shared 0-dim tensor, once)
    out0 = operands[0] if inplace else None
    fast = E.fast_into(op, operands, out0, True) if inplace else E.fast_new(op, operands, True)
    if fast is None:
        return None
    kernel, dtype, cast, _ = fast if inplace else fast[0]
    slots = [j for j, a in enumerate(operands) if type(a) is NeuronTensor]
    shared = [j for j in slots if operands[j].dim() == 0]  # one 0-dim tensor for all rows
    slots = [j for j in slots if j not in shared]
    arrays = [j for j in slots if operands[j] is not out0]  # (in place: slot 0 is the output)
    fixed = [(j, args0[j]) for j in range(len(args0)) if j not in slots and j not in shared]
    reads_out = [j for j in slots[1:] if j not in arrays]  # in place: slots reading the output
    first, dtypes = slots[0], [(j, operands[j].dtype) for j in slots]
    out_size = T.STORAGE_DTYPE[dtype].itemsize
    sizes_of = [(j, T.STORAGE_DTYPE[operands[j].dtype].itemsize) for j in arrays]
    limit, nargs = workers.SPLIT_MIN, len(args0)
    shapes = []
    for args, kwargs in rows:  # (hot: one pass of plain tests per call)
        if len(args) != nargs or (kwargs is not kwargs0 and not _same(kwargs, kwargs0)):
            return None
        for j, value in fixed:
            a = args[j]
            if a is not value and not _same_scalar(a, value):
                return None
        for j in shared:
            if args[j] is not given[j]:
                return None
        shape = None
        for j, dtype_j in dtypes:
            a = args[j]
            if type(a) is not NeuronTensor:
                return None
            key = a._key
            if key is None or key[1] != dtype_j:
                return None
            if shape is None:
                shape = key[0]
            elif key[0] != shape:
                return None
        if prod(shape) >= limit:  # (0-dim tensors, a scalar parameter, are promoted as
            return None            # tensors with dims are when a call has no others)
        if inplace:
            out = args[first]
            for j in reads_out:
                if args[j] is not out:
                    return None
            for j in arrays:
                if args[j]._storage is out._storage:
                    return None
            for j in shared:  # (read once, before any row writes)
                if given[j]._storage is out._storage:
                    return None
        shapes.append(shape)
    outs, table, sizes = [], [], []
    for (args, _), shape in zip(rows, shapes):
        out = args[first] if inplace else T.new_contiguous(shape, dtype)
        outs.append(out)
        row = [_address(out, out_size)]
        for j, size in sizes_of:
            row.append(_address(args[j], size))
        table.append(row)
        sizes.append(prod(shape))
    scalars = [T.address(a) if j in shared else cast(a) for j, a in enumerate(operands)
               if j not in slots] + [cast(p) for p in params]
    kernel(np.array(table, dtype=np.int64), np.array(sizes, dtype=np.int64), *scalars)
    elements = sum(sizes)
    per_element = out_size * (1 + len(slots) - len(arrays)) + sum(s for _, s in sizes_of)
    core.launch(op.engine, elements, elements * per_element)
    return outs


def _address(t, itemsize: int) -> int:
    """T.address with the element size known (hot)."""
    block = t._storage.block
    return 0 if block is None else block.pointer + t.storage_offset() * itemsize


def _same_scalar(a, b) -> bool:
    """Whether two scalar arguments are equal as kernel arguments (-0.0 is not 0.0)."""
    return type(a) is type(b) and type(a) in (int, float, bool) and a == b and \
        math.copysign(1.0, a) == math.copysign(1.0, b)


def _same(kwargs, kwargs0) -> bool:
    return kwargs.keys() == kwargs0.keys() and all(
        kwargs[k] is v or _same_scalar(kwargs[k], v) for k, v in kwargs0.items())


def run_many(calls, inplace: bool) -> list | None:
    """Calls of elementwise ops, `(op, operands, params)` each, as one launch: a device's
    multi-tensor kernel, for foreach ops (Note [Multi-tensor launches]). With `inplace` each
    call writes its first operand. None, with nothing run, unless every call takes the
    contiguous fast path or has only 0-dim tensors (run through `run`, a launch each).
    Calls run in order, so later ones see earlier writes."""
    plans = []
    for op, operands, _ in calls:
        fast = E.fast_into(op, operands, operands[0]) if inplace else E.fast_new(op, operands)
        if fast is None and not _zero_dim(operands):
            return None
        plans.append(fast)
    results, elements, moved = [], 0, 0
    for (op, operands, params), fast in zip(calls, plans):
        if fast is None:  # 0-dim tensors (a scalar parameter): their own launch, in turn
            results.append(E.run(op, operands, params, operands[0] if inplace else None))
            continue
        if inplace:
            (kernel, _, cast, exact), out = fast, operands[0]
        else:
            (kernel, dtype, cast, exact), shape = fast
            out = T.new_contiguous(shape, dtype)
        args = [T.flat(a) if type(a) is NeuronTensor else cast(a) for a in operands
                if a is not out]
        out_arr = T.flat(out)
        moved += E.run_fast(op, kernel, out_arr, args, params, cast, exact,
                           len(operands) - len(args), not inplace)
        elements += out_arr.size
        results.append(out)
    core.launch(calls[0][0].engine, elements, moved)
    return results


def _zero_dim(operands) -> bool:
    """Whether the tensors of a call are all neuron 0-dim tensors (and there is one)."""
    tensors = [a for a in operands if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(type(a) is NeuronTensor and a.dim() == 0 for a in tensors)


# Note [Multi-tensor launches]
# A foreach op (torch.optim's default path, clip_grad_norm_) is one kernel launch on a device:
# CUDA passes the list of tensor addresses to one multi-tensor kernel. Here the launch calls
# the cached per-tensor loop for each tensor in turn, with one price for the launch: the same
# loops, so the same bits as one op per tensor, without the per-tensor dispatch. A 16-tensor
# `_foreach_mul_` of an optimizer step took 130 us through the per-tensor kernels, 90 us so.
# A 0-dim tensor (a scalar parameter) goes through `run` at its turn, a launch of its own.


