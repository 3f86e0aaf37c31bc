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
    calls = _plans(plan, rows)
    return None if calls is None else run_many(calls, inplace)


def _plans(plan, rows) -> list | None:
    """Each call's plan; None when the op refuses one, so that the calls run one by one: those
    before it take effect and it raises, leaving what the CPU leaves."""
    try:
        return [plan(*a, **kw) for a, kw in rows]
    except Exception:  # noqa: BLE001  (raised again by the call itself)
        return None


# Note [Address tables]
# A device's multi-tensor kernel reads a table of tensor addresses (CUDA's foreach kernels
# take chunks of such a list). When every call of a foreach op has contiguous tensors of the
# same formats and the same scalars, so that one plan fits them all, the launch is one
# jitted loop over a table: per tensor its output's address, its operands' and its element
# count (kernelgen.table_kernel). Each tensor's loop body is the per-tensor kernel's, so the
# bits are the same. Tensors run in list order, so one listed twice sees its first update, as
# with one op per tensor. Checks and the plan are those of the first call with dims: the
# others have the same dtypes and scalars, so the same checks. The calls are compared a
# column (one argument of every call) at a time, and addresses come with the contiguous
# layout (`_key`), since this Python is the launch's cost: a 146-tensor AdamW step took
# 10.5-10.9 ms calling the per-tensor loops, 5.7-6.2 ms as tables, clip_grad_norm_ 5.7 and
# 2.0-2.3 ms (benchmarks/optimizer_step.py). Large tensors keep the per-tensor loops, which
# share them between cores.


def _run_table(plan, rows, inplace: bool) -> list | None:
    if len(rows) < 2:
        return None
    for args0, kwargs0 in rows:  # the first call of a tensor with dims plans them all
        if type(args0[0]) is NeuronTensor and args0[0].dim():
            break
    else:
        return None
    planned = _plans(plan, [(args0, kwargs0)])
    if planned is None:
        return None
    op, given, params = planned[0]
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
    # the calls, checked a column (an argument of every call) at a time: plain passes in C
    nargs = len(args0)
    if any(len(args) != nargs for args, _ in rows):
        return None
    if any(kwargs is not kwargs0 for _, kwargs in rows):
        if any(kwargs.keys() != kwargs0.keys() for _, kwargs in rows) or not all(
                _all_same([kwargs[k] for _, kwargs in rows], v) for k, v in kwargs0.items()):
            return None
    for j in range(nargs):
        if j not in slots:
            value, column = given[j] if j in shared else args0[j], [args[j] for args, _ in rows]
            if not (all(a is value for a in column) or j not in shared and
                    _all_same(column, value)):
                return None
    columns, keys = {j: [args[j] for args, _ in rows] for j in slots}, {}
    for j in slots:
        if not all(type(t) is NeuronTensor for t in columns[j]):
            return None
        keys[j], dtype_j = [t._key for t in columns[j]], operands[j].dtype
        if None in keys[j] or not all(k[1] is dtype_j for k in keys[j]):
            return None
        if j == slots[0]:
            shapes = [k[0] for k in keys[j]]
        elif not all(k[0] == shape for k, shape in zip(keys[j], shapes)):
            return None
    if shared and () in shapes:
        return None  # (a 0-dim call promotes with a shared 0-dim tensor as tensors with dims do)
    sizes = np.array(list(map(prod, shapes)), dtype=np.int64)
    large = np.flatnonzero(sizes >= workers.SPLIT_MIN)  # (Note [Large tensors in a table])
    if len(large):
        if shared:
            return None
        alone = _alone_plans(op, operands, columns, slots, large, inplace)
        if alone is None:
            return None
    itemsizes = [T.STORAGE_DTYPE[dtype].itemsize] + [
        T.STORAGE_DTYPE[operands[j].dtype].itemsize for j in arrays]
    if inplace:
        outs = columns[slots[0]]
        for j in slots[1:]:
            if j not in arrays and not all(t is o for t, o in zip(columns[j], outs)):
                return None  # (row 0 reads its output here, another row another tensor)
        table = np.array([[k[2] for k in keys[slots[0]]]] + [[k[2] for k in keys[j]]
                                                             for j in arrays], dtype=np.int64)
        reads = [(table[c + 1], itemsizes[c + 1]) for c in range(len(arrays))]
        reads += [(T.address(given[j]), given[j].element_size()) for j in shared]
        if _overlaps(table[0], sizes * itemsizes[0], reads, sizes) or len(large) and \
                not _rows_apart(table, sizes, itemsizes):
            return None
    else:
        outs = [T.new_contiguous(shape, dtype) for shape in shapes]
        table = np.array([[o._key[2] for o in outs]] + [[k[2] for k in keys[j]]
                                                        for j in arrays], dtype=np.int64)
    scalars = [T.address(a) if j in shared else cast(a) for j, a in enumerate(operands)
               if j not in slots] + [cast(p) for p in params]
    per_element = itemsizes[0] * (1 + len(slots) - len(arrays)) + sum(itemsizes[1:])
    moved = 0
    if len(large):
        for k, (fast, row) in zip(large, alone):
            moved += _run_call(op, fast, row, params, outs[k], inplace)
        small = np.flatnonzero(sizes < workers.SPLIT_MIN)
        table, sizes_small = table[:, small], sizes[small]
    else:
        sizes_small = sizes
    if len(sizes_small):
        kernel(table, sizes_small, *scalars)  # (addresses: Note [Address tables])
    small_elements = int(sizes_small.sum())
    core.launch(op.engine, int(sizes.sum()), small_elements * per_element + moved)
    return outs


# Note [Large tensors in a table]
# A tensor of SPLIT_MIN elements or more runs its per-tensor loop, which the cores share,
# and the others run as the table; so the tensors no longer run in list order, which is the
# same only when no tensor's update is what another reads or writes (`_rows_apart`, on the
# addresses). New results are fresh memory, so functional ops always qualify.


def _alone_plans(op, operands, columns, slots, large, inplace) -> list | None:
    """(per-tensor fast plan, operands) of each large call, None when one has none."""
    plans = []
    for k in large:
        row = list(operands)
        for j in slots:
            row[j] = columns[j][k]
        fast = E.fast_into(op, row, row[0]) if inplace else E.fast_new(op, row)
        if fast is None:
            return None
        plans.append((fast if inplace else fast[0], row))
    return plans


def _rows_apart(table, sizes, itemsizes) -> bool:
    """Whether no row's output overlaps another row's output or operands (rows with no
    elements aside): then the rows may run in any order, or side by side."""
    live = sizes > 0
    rows = np.flatnonzero(live)
    lo = table[0][live]
    hi = lo + sizes[live] * itemsizes[0]
    order = np.argsort(lo, kind="stable")
    lo, hi, owner = lo[order], hi[order], rows[order]
    if (lo[1:] < hi[:-1]).any():
        return False
    for c in range(1, len(table)):
        read_lo = table[c][live]
        read_hi = read_lo + sizes[live] * itemsizes[c]
        last = np.searchsorted(lo, read_hi, side="left") - 1  # last output starting before
        hit = (last >= 0) & (hi[np.maximum(last, 0)] > read_lo) & (
            owner[np.maximum(last, 0)] != rows)
        if hit.any():
            return False
    return True


def _overlaps(out_lo, out_bytes, reads, sizes) -> bool:
    """Whether any row's output memory overlaps memory its row reads (another tensor's, or a
    shared 0-dim tensor's, which is read once before any row writes)."""
    out_hi = out_lo + out_bytes
    for lo, itemsize in reads:
        hi = lo + (sizes * itemsize if isinstance(lo, np.ndarray) else itemsize)
        if ((lo < out_hi) & (out_lo < hi)).any():
            return True
    return False


def _all_same(values: list, value) -> bool:
    """Whether scalar arguments all equal `value` as kernel arguments (-0.0 is not 0.0)."""
    if all(v is value for v in values):
        return True
    if type(value) not in (int, float) or value != value or set(map(type, values)) != {
            type(value)} or abs(value) >= 1 << 53:
        return all(_same_scalar(v, value) for v in values)
    array = np.array(values)
    return bool((array == value).all()) and (
        value != 0 or not (np.signbit(array) != (math.copysign(1.0, value) < 0)).any())


def _same_scalar(a, b) -> bool:
    """Whether two scalar arguments are equal as kernel arguments (-0.0 is not 0.0)."""
    return type(a) is type(b) and type(a) in (int, float, bool) and a == b and \
        math.copysign(1.0, a) == math.copysign(1.0, b)


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
            out = operands[0]
        else:
            fast, shape = fast
            out = T.new_contiguous(shape, fast[1])
        moved += _run_call(op, fast, operands, params, out, inplace)
        elements += out.numel()
        results.append(out)
    core.launch(calls[0][0].engine, elements, moved)
    return results


def _run_call(op, fast, operands, params, out, inplace: bool) -> int:
    """One call's per-tensor fast-path loop (`fast`: its plan) into `out`, shared by the
    cores when large; the bytes it moved (its launch is the caller's)."""
    kernel, _, cast, exact = fast
    args = [T.flat(a) if type(a) is NeuronTensor else cast(a) for a in operands if a is not out]
    return E.run_fast(op, kernel, T.flat(out), args, params, cast, exact,
                      len(operands) - len(args), not inplace)


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
