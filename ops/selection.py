"""Order statistics, searching and uniqueness: cummax/cummin, logcumsumexp, median/nanmedian,
kthvalue, mode, unique (+ consecutive, by dim), searchsorted/bucketize. Histograms live in
histogram.py, registered through the import below.

Comparisons run on float64 keys: exact for every float (its fp32 value) and for integers up
to 2**53 (not cut to 32 bits: comparing costs nothing extra); selected values are copied bit
for bit. Where CPU picks one of several equal elements, the same algorithm runs here
(Note [Tie indices]). logcumsumexp computes in fp32, rounded once per prefix.
"""
from __future__ import annotations

import numpy as np
import torch
from torch._decomp import decomposition_table

from neuron_eager.device_sim import core
from neuron_eager.ops import histogram  # noqa: F401  (histc, bincount, histogram)
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import numerics
from neuron_eager.ops import reduction as R
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import stage_dtype
from neuron_eager.ops.indexing import finish
from neuron_eager.ops.jit import njit
from neuron_eager.ops.meta import in_cpu_words, meta_outputs
from neuron_eager.ops.reduction import load, store  # template placeholders
from neuron_eager.ops.registry import register
from neuron_eager.ops.scan import _dest, _merge_sort

aten = torch.ops.aten
JIT = R.JIT
KTH, MEDIAN, NANMEDIAN, MODE = range(4)
PLAIN, BY_INDEX, NAN_LAST = (np.int64(r) for r in range(3))  # comparison rules of _less

# -- kernels of one storage format (Note [Kernel templates] in reduction.py) ------------------

_F64 = njit(lambda v: np.float64(v))
# Families that only compare: they load float64 keys, exact for every float (widened from
# its fp32 value) and for integers up to 2**53, so one set of sort helpers serves all dtypes.
_KEYED = ("cumext_kernel", "select_kernel", "runs_kernel", "search_kernel")
_kernels: dict = {}


def _kernel(family, dtype: torch.dtype, out_dtype: torch.dtype | None = None, op=None):
    """`family` specialised to load `dtype` (a float64 key, or an fp32 value for arithmetic
    families) and store `out_dtype` (for the kernels that round a computed float)."""
    code = R.code(dtype, op or family)
    out_code = R.code(out_dtype, op or family) if out_dtype is not None else "f32"
    key = (family.__name__, code, out_code)
    k = _kernels.get(key)
    if k is None:
        if dtype.is_floating_point:
            widen = numerics.loader(code, "f32")
            if family.__name__ in _KEYED:
                loader = njit((lambda f: lambda v: np.float64(f(v)))(widen))
            else:
                loader = njit((lambda f: lambda v: f(v))(widen))
        else:
            loader = _F64  # only comparing families take integers
        saver = njit((lambda f: lambda v: f(v))(numerics.storer(out_code)))
        k = _kernels[key] = R.specialize(family, load=loader, store=saver)
    return k


def _keys(n: int) -> np.ndarray:
    return np.empty(n, np.float64)


def _meta(op, *args, **kwargs):
    """Run `op` on meta copies of the tensor arguments: CPU-identical shapes and errors."""
    return meta_outputs(op, args, kwargs)


# -- libstdc++ sort and nth_element (Note [Tie indices]) --------------------------------------
# Note [Tie indices]: median(dim) runs std::nth_element on CPU with ties broken by index (a
# total order: the answer is fixed whatever the algorithm); mode runs std::sort on the values
# alone, so which equal element ends its run depends on the exact steps of libstdc++'s
# introsort, reproduced below over an index array `order` compared through `keys`.
# kthvalue runs ATen's own quickselect (_quick_select), reproduced as well.


@njit(**JIT)
def _less(keys, a, b, rule):
    """Rule PLAIN: `<` of the values (mode). BY_INDEX: ties broken by index (median).
    NAN_LAST: also NaN above every number (nanmedian)."""
    x, y = keys[a], keys[b]
    return x < y or (rule != PLAIN and x == y and a < b) or \
        (rule == NAN_LAST and y != y and x == x)


@njit(**JIT)
def _insertion_sort(order, first, last, keys, rule, guarded):
    """std::__insertion_sort; past `first + guarded` the unguarded form of the final pass."""
    for i in range(first + 1, last):
        val = order[i]
        if i < first + guarded and _less(keys, val, order[first], rule):
            for j in range(i, first, -1):
                order[j] = order[j - 1]
            order[first] = val
        else:
            j = i
            while j > first and _less(keys, val, order[j - 1], rule):
                order[j] = order[j - 1]
                j -= 1
            order[j] = val


@njit(**JIT)
def _adjust_heap(order, first, hole, length, value, keys, rule):
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if _less(keys, order[first + child], order[first + child - 1], rule):
            child -= 1
        order[first + hole] = order[first + child]
        hole = child
    if (length & 1) == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        order[first + hole] = order[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and _less(keys, order[first + parent], value, rule):
        order[first + hole] = order[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    order[first + hole] = value


@njit(**JIT)
def _heap_select(order, first, middle, last, keys, rule):
    length = middle - first
    if length >= 2:
        parent = (length - 2) // 2
        while True:
            _adjust_heap(order, first, parent, length, order[first + parent], keys, rule)
            if parent == 0:
                break
            parent -= 1
    for i in range(middle, last):
        if _less(keys, order[i], order[first], rule):  # pop_heap into i
            value = order[i]
            order[i] = order[first]
            _adjust_heap(order, first, np.int64(0), length, value, keys, rule)


@njit(**JIT)
def _partition_pivot(order, first, last, keys, rule):
    """Median of three moved to `first`, then Hoare partition; returns the cut."""
    a, b, c = first + 1, first + (last - first) // 2, last - 1
    if _less(keys, order[a], order[b], rule):
        if _less(keys, order[b], order[c], rule):
            m = b
        elif _less(keys, order[a], order[c], rule):
            m = c
        else:
            m = a
    elif _less(keys, order[a], order[c], rule):
        m = a
    elif _less(keys, order[b], order[c], rule):
        m = c
    else:
        m = b
    order[first], order[m] = order[m], order[first]
    lo, hi, pivot = first + 1, last, order[first]
    while True:
        while lo < last - 1 and _less(keys, order[lo], pivot, rule):
            lo += 1
        hi -= 1
        while hi > first and _less(keys, pivot, order[hi], rule):
            hi -= 1
        if not lo < hi:
            return lo
        order[lo], order[hi] = order[hi], order[lo]
        lo += 1


@njit(**JIT)
def _log2(n):
    k = 0
    while n > 1:
        n >>= 1
        k += 1
    return k


@njit(**JIT)
def _nth_element(order, nth, n, keys, rule):
    first, last = np.int64(0), np.int64(n)
    depth = 2 * _log2(n)
    while last - first > 3:
        if depth == 0:
            _heap_select(order, first, nth + 1, last, keys, rule)
            order[first], order[nth] = order[nth], order[first]
            return
        depth -= 1
        cut = _partition_pivot(order, first, last, keys, rule)
        if cut <= nth:
            first = cut
        else:
            last = cut
    _insertion_sort(order, first, last, keys, rule, last - first)


@njit(**JIT)
def _std_sort(order, n, keys):
    """std::sort: introsort down to runs of 16, heapsort past the depth limit, then one
    insertion sort over all (ranges are independent, so a stack replaces recursion)."""
    stack = np.empty((2 * _log2(max(n, 1)) + 2) * 2 + 8, np.int64)
    stack[0], stack[1], stack[2] = 0, n, 2 * _log2(max(n, 1))
    sp = 3
    while sp:
        sp -= 3
        first, last, depth = stack[sp], stack[sp + 1], stack[sp + 2]
        while last - first > 16:
            if depth == 0:  # heapsort: make_heap, then pop one by one
                _heap_select(order, first, last, last, keys, PLAIN)
                end = last
                while end - first > 1:
                    end -= 1
                    value = order[end]
                    order[end] = order[first]
                    _adjust_heap(order, first, np.int64(0), end - first, value, keys, PLAIN)
                break
            depth -= 1
            cut = _partition_pivot(order, first, last, keys, PLAIN)
            if sp + 3 > stack.size:
                grown = np.empty(stack.size * 2, np.int64)
                grown[:sp] = stack[:sp]
                stack = grown
            stack[sp], stack[sp + 1], stack[sp + 2] = cut, last, depth
            sp += 3
            last = cut
    _insertion_sort(order, np.int64(0), n, keys, PLAIN, np.int64(16))


@njit(**JIT)
def _quick_select(work, order, k):
    """ATen's quick_select_template: NaN above all numbers; swaps values and indices."""
    lo, hi = 0, work.size - 1
    while True:
        if hi <= lo:
            return
        if hi == lo + 1:
            if _gt(work[lo], work[hi]):
                _swap2(work, order, lo, hi)
            return
        _swap2(work, order, lo + (hi - lo) // 2, lo + 1)
        if _gt(work[lo + 1], work[hi]):
            _swap2(work, order, lo + 1, hi)
        if _gt(work[lo], work[hi]):
            _swap2(work, order, lo, hi)
        if _gt(work[lo + 1], work[lo]):
            _swap2(work, order, lo + 1, lo)
        i, j, piv = lo + 1, hi, work[lo]
        while True:
            i += 1
            while _gt(piv, work[i]):
                i += 1
            j -= 1
            while _gt(work[j], piv):
                j -= 1
            if j < i:
                break
            _swap2(work, order, i, j)
        _swap2(work, order, lo, j)
        if j <= k:
            lo = i
        if j >= k:
            hi = j - 1


@njit(**JIT)
def _gt(x, y):
    return (x != x and y == y) or x > y


@njit(**JIT)
def _swap2(work, order, i, j):
    work[i], work[j] = work[j], work[i]
    order[i], order[j] = order[j], order[i]


# -- row kernels -------------------------------------------------------------------------------


def cumext_kernel(src, base, starts, steps, stride, n, vals, idxs, dstarts, dstride, want_max):
    """cummax/cummin: a later equal element takes over (>=, <=), and so does every NaN."""
    gathered = steps.size > 0
    for r in range(starts.size):
        s0, d0 = base + starts[r], dstarts[r]
        best, at, bits = load(src[s0]), 0, src[s0]
        for i in range(n):
            p = s0 + (steps[i] if gathered else i * stride)
            v = load(src[p])
            if v != v or (best == best and (v >= best if want_max else v <= best)):
                best, at, bits = v, i, src[p]
            vals[d0 + i * dstride] = bits
            idxs[d0 + i * dstride] = at


def logcumsumexp_kernel(src, base, starts, steps, stride, n, out, dstarts, dstride):
    """log(exp(acc) + exp(x)) as max + log1p(exp(min - max)); equal infinities keep x."""
    gathered = steps.size > 0
    for r in range(starts.size):
        s0, d0 = base + starts[r], dstarts[r]
        acc = np.float32(-np.inf)
        for i in range(n):
            x = load(src[s0 + (steps[i] if gathered else i * stride)])
            if acc != acc:
                lo = hi = acc
            else:
                lo = acc if acc < x else x
                hi = acc if x < acc else x
            if lo != hi or np.isfinite(lo):
                acc = np.log1p(np.exp(lo - hi)) + hi
            else:
                acc = x
            out[d0 + i * dstride] = store(acc)


def select_kernel(src, base, starts, steps, stride, n, vals, idxs, keys, order, work, mode, k):
    """One order statistic per row: kthvalue, median, nanmedian or mode (Note [Tie indices])."""
    gathered = steps.size > 0
    for r in range(starts.size):
        s0 = base + starts[r]
        nan, first_nan = 0, -1
        for i in range(n):
            keys[i] = load(src[s0 + (steps[i] if gathered else i * stride)])
            order[i] = i
            if keys[i] != keys[i]:
                nan += 1
                if first_nan < 0:
                    first_nan = i
        if mode == KTH:
            for i in range(n):
                work[i] = keys[i]
            _quick_select(work, order, k)
            at = order[k]
        elif mode == MEDIAN and first_nan >= 0:
            at = first_nan
        elif mode == MEDIAN or mode == NANMEDIAN:
            nth = max(0, (n - nan - 1) // 2) if mode == NANMEDIAN else (n - 1) // 2
            _nth_element(order, nth, n, keys, NAN_LAST if mode == NANMEDIAN else BY_INDEX)
            at = order[nth]
        else:  # mode: the smallest of the most frequent values, as std::sort left it
            _std_sort(order, n, keys)
            at, best, run = order[0], 0, 0
            for i in range(n):
                run += 1
                if i == n - 1 or keys[order[i]] != keys[order[i + 1]]:
                    if run > best:
                        at, best = order[i], run
                    run = 0
        vals[r] = src[s0 + (steps[at] if gathered else at * stride)]
        idxs[r] = at


def runs_kernel(src, n, m, keys, order, tmp, firsts, inverse, counts, sort):
    """Groups of equal rows (m keys each, NaN equal to nothing): sorted lexicographically
    (stable LSD passes, NaN last) for unique, or as they come for unique_consecutive.
    Writes each group's first row, every row's group and the group sizes; returns the count."""
    col = np.empty(n, keys.dtype)
    for i in range(n):
        order[i] = i
    if sort:
        for c in range(m - 1, -1, -1):
            for i in range(n):
                col[i] = load(src[i * m + c])
            _merge_sort(order, tmp, col, False)
    groups = 0
    for j in range(n):
        i = order[j]
        same = j > 0
        if same:
            p = order[j - 1]
            for c in range(m):
                if load(src[i * m + c]) != load(src[p * m + c]):
                    same = False
                    break
        if not same:
            firsts[groups] = i
            counts[groups] = 0
            groups += 1
        counts[groups - 1] += 1
        inverse[i] = groups - 1
    return groups


def search_kernel(bd, nb, sorter, vals, out, inner, per_row, right):
    """Lower (upper with `right`) bound of each value in its boundary row, as CPU's
    `!(mid >= v)` / `!(mid > v)` tests: NaN values land past the end."""
    by_sorter = sorter.size > 0
    for i in range(vals.size):
        start = (i // inner) * nb if per_row else 0
        lo, hi = start, start + nb
        v = load(vals[i])
        while lo < hi:
            mid = lo + ((hi - lo) >> 1)
            m = load(bd[start + sorter[mid]]) if by_sorter else load(bd[mid])
            if not (m > v) if right else not (m >= v):
                lo = mid + 1
            else:
                hi = mid
        out[i] = lo - start


def _run(kernel, x, dims, *arrays, engine="gpsimd"):
    """A row kernel over x (Note [Rows]); account for its launch."""
    r = R.rows(x, dims)
    result = kernel(R.flat(x), x.storage_offset(), r.starts, r.steps, r.stride, r.n, *arrays)
    core.launch(engine, x.numel(), x._nd.nbytes + sum(a.nbytes for a in arrays
                                                       if isinstance(a, np.ndarray)))
    return result


def _nd(t: torch.Tensor) -> np.ndarray:
    return t._nd.reshape(-1)


# -- cummax, cummin, logcumsumexp --------------------------------------------------------------


def _cum(op, x, dim, kernel, *params, out_dtype=None):
    _meta(op, x, dim)
    d = R.wrap_dims(x, dim)
    if x.numel() == 0:
        return R.on_empty(op, x, dim)
    outs = [T.empty(x.shape, out_dtype or x.dtype)]
    if out_dtype is None:
        outs.append(T.empty(x.shape, torch.int64))
    dstarts, dstride = _dest(outs[0], d[0] if d else 0)
    _run(_kernel(kernel, x.dtype, out_dtype, op), x, d, *[_nd(o) for o in outs], dstarts,
         dstride, *params, engine="vector")
    return tuple(outs) if len(outs) > 1 else outs[0]


@register(aten.cummax.default)
def cummax(x, dim):
    return _cum(aten.cummax.default, x, dim, cumext_kernel, True)


@register(aten.cummin.default)
def cummin(x, dim):
    return _cum(aten.cummin.default, x, dim, cumext_kernel, False)


@register(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f'"logcumsumexp_out_cpu" not implemented for '
                                  f"'{T.dtype_name(x.dtype)}'")
    return finish(_cum(aten.logcumsumexp.default, x, dim, logcumsumexp_kernel,
                       out_dtype=stage_dtype(x.dtype)), x.dtype)  # (stochastic rounding)


# -- kthvalue, median, nanmedian, mode ----------------------------------------------------------


def _select(op, x, dim, keepdim, mode, k=0, name=""):
    if dim is not None and x.numel() == 0:  # (the CPU checks an empty dim before k)
        in_cpu_words(op, (x, *([k + 1] if mode == KTH else []), dim, keepdim), {})
    if dim is not None:  # (the CPU checks k and dim before the dtype)
        _meta(op, x, *([k + 1] if mode == KTH else []), dim, keepdim)
    if x.dtype == torch.bool and mode != MODE:
        raise NotImplementedError(f'"{name}" not implemented for \'Bool\'')
    if x.numel() == 0:
        return R.on_empty(op, x, *([k + 1] if mode == KTH else []),
                          *([] if dim is None else [dim, keepdim]))
    dims = R.wrap_dims(x, dim)
    shape = R.out_shape(x, dims, keepdim)
    vals, idxs = T.empty(shape, x.dtype), T.empty(shape, torch.int64)
    n = R.rows(x, dims).n
    keys = _keys(n)
    _run(_kernel(select_kernel, x.dtype, op=op), x, dims, _nd(vals), _nd(idxs), keys,
         np.empty(n, np.int64), np.empty_like(keys), mode, k)
    return vals, idxs


@register(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    return _select(aten.kthvalue.default, x, dim, keepdim, KTH, k - 1, "kthvalue_cpu")


@register(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    return _select(aten.median.dim, x, dim, keepdim, MEDIAN, name="median_out")


@register(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    return _select(aten.nanmedian.dim, x, dim, keepdim, NANMEDIAN, name="median_out")


@register(aten.median.default)
def median(x):
    if x.numel() == 0:
        return _empty_median(x)
    return _select(aten.median.default, x, None, False, MEDIAN, name="median_cpu")[0]


@register(aten.nanmedian.default)
def nanmedian(x):
    if x.numel() == 0:
        return _empty_median(x)
    return _select(aten.nanmedian.default, x, None, False, NANMEDIAN, name="median_cpu")[0]


def _empty_median(x):
    """The median of no elements: NaN, as the CPU gives it (cast to x's dtype there)."""
    return aten._to_copy.default(torch.tensor(float("nan")).to(x.dtype), device=T.DEVICE)


@register(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    return _select(aten.mode.default, x, dim, keepdim, MODE)


# -- unique ---------------------------------------------------------------------------------------


def _groups(x2d: torch.Tensor, sort: bool):
    """(firsts, inverse, counts) NumPy arrays of the equal rows of a contiguous (n, m) tensor."""
    n, m = x2d.shape
    firsts, inverse, counts = (np.empty(n, np.int64) for _ in range(3))
    k = _kernel(runs_kernel, x2d.dtype, op="unique")
    groups = k(_nd(x2d), n, m, _keys(0), np.empty(n, np.int64),
               np.empty(n, np.int64), firsts, inverse, counts, sort)
    core.launch("gpsimd", x2d.numel(), x2d._nd.nbytes * 2)
    return firsts[:groups], inverse, counts[:groups]


def _from_nd(arr: np.ndarray, shape=None, dtype=torch.int64) -> torch.Tensor:
    out = T.empty(arr.shape if shape is None else shape, dtype)
    _nd(out)[:] = arr.reshape(-1)
    return out


_NONE = (0,)


def _unique_flat(x, sort, return_inverse, return_counts):
    flat = x.contiguous().reshape(-1, 1) if x.numel() else x.reshape(0, 1)
    firsts, inverse, counts = _groups(flat, sort)
    values = _from_nd(_nd(flat)[firsts], dtype=x.dtype)
    inv = _from_nd(inverse, x.shape) if return_inverse else T.empty(_NONE, torch.int64)
    cnt = _from_nd(counts) if return_counts else T.empty(_NONE, torch.int64)
    return values, inv, cnt


@register(aten._unique2.default)
def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    return _unique_flat(x, True, return_inverse, return_counts)


@register(aten._unique.default)
def unique(x, sorted=True, return_inverse=False):
    return _unique_flat(x, True, return_inverse, False)[:2]


def _unique_dim(op, x, dim, sort, return_inverse, return_counts, consecutive):
    if not x.dim():
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    d = R.wrap_dims(x, dim, False)[0]
    if x.numel() == 0:
        args = (return_inverse, return_counts, dim) if consecutive else \
            (dim, sort, return_inverse, return_counts)
        return R.on_empty(op, x, *args)
    moved = x.movedim(d, 0).contiguous()
    firsts, inverse, counts = _groups(moved.reshape(moved.shape[0], -1), sort)
    index = _from_nd(firsts)
    values = x.index_select(d, index)
    return values, _from_nd(inverse), _from_nd(counts)


@register(aten.unique_dim.default)
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    return _unique_dim(aten.unique_dim.default, x, dim, True, return_inverse, return_counts,
                       False)


@register(aten.unique_consecutive.default)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    if dim is None:
        return _unique_flat(x, False, return_inverse, return_counts)
    return _unique_dim(aten.unique_consecutive.default, x, dim, False, return_inverse,
                       return_counts, True)


# -- searchsorted, bucketize -----------------------------------------------------------------------


def _sorter(sorter, nb: int, size: int) -> np.ndarray:
    """The sorter's indices, checked as the CPU checks them (an index outside a row would
    read another row's boundaries, or other memory)."""
    if sorter is None:
        return np.empty(0, np.int64)
    if sorter.dtype != torch.int64:
        raise RuntimeError(f"torch.searchsorted(): sorter must be a tensor of long dtype but "
                           f"got dtype {T.dtype_name(sorter.dtype)}")
    st = sorter.contiguous()._nd.reshape(-1)
    if size and (st.min() < 0 or st.max() >= nb):
        raise RuntimeError("torch.searchsorted(): sorter index out of range")
    return st


def _search(op, boundaries, values, out_int32, right, side=None, sorter=None, scalar=False):
    if side is not None:  # (the meta kernel does not look at it)
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but "
                               f"got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, "
                               "got side of left while right was True")
    if op is aten.bucketize.Tensor:
        result = _meta(op, values, boundaries, out_int32=out_int32, right=right)
    else:
        result = _meta(op, boundaries, values, out_int32=out_int32, right=right, side=side,
                       sorter=sorter)
    out = T.empty(result.shape, result.dtype)
    if out.numel() == 0:
        return out
    # The CPU compares in result_type(boundaries, values): a Python scalar or a 0-dim value
    # ranks below the boundaries, so it is cast to their dtype (rounded to fp16, wrapped to
    # uint8) rather than the boundaries widened to its own.
    dtype = E.result_type(boundaries, values)
    if dtype == torch.bool:
        raise NotImplementedError('"searchsorted_out_cpu" not implemented for \'Bool\'')
    if scalar:  # (as the CPU's wrapped number: a double or a long, then cast)
        wide = torch.float64 if isinstance(values, float) else \
            torch.bool if isinstance(values, bool) else torch.int64
        values = T.from_cpu(torch.tensor(values, dtype=wide).to(dtype))
    bd = boundaries.to(dtype).contiguous()
    values = values.to(dtype).contiguous()
    nb = bd.shape[-1] if bd.dim() else 1
    per_row = bd.dim() > 1
    st = _sorter(sorter, nb, bd.numel())
    inner = values.shape[-1] if values.dim() else 1
    k = _kernel(search_kernel, dtype, op=op)
    k(_nd(bd), nb, st, _nd(values), _nd(out), max(inner, 1), per_row,
      right or side == "right")
    core.launch("gpsimd", values.numel(), values._nd.nbytes + bd._nd.nbytes + out._nd.nbytes)
    return out


@register(aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    if sorted_sequence.dim() == 0:  # (the meta kernel takes it; the CPU's check names x too)
        T.cpu_refusal(aten.searchsorted.Tensor, sorted_sequence, x, out_int32=out_int32,
                      right=right, side=side, sorter=sorter)
    return _search(aten.searchsorted.Tensor, sorted_sequence, x, out_int32, right, side, sorter)


@register(aten.searchsorted.Scalar)
def searchsorted_scalar(sorted_sequence, x, *, out_int32=False, right=False, side=None,
                        sorter=None):
    if sorted_sequence.dim() == 0:
        T.cpu_refusal(aten.searchsorted.Scalar, sorted_sequence, x, out_int32=out_int32,
                      right=right, side=side, sorter=sorter)
    return _search(aten.searchsorted.Scalar, sorted_sequence, x, out_int32, right, side, sorter,
                   scalar=True)


def _isin(op):
    def kernel(elements, test_elements, *, assume_unique=False, invert=False):
        if any(isinstance(v, bool) or getattr(v, "dtype", None) == torch.bool
               for v in (elements, test_elements)):
            raise RuntimeError("Unsupported input type encountered for isin(): Bool")
        return decomposition_table[op](elements, test_elements, assume_unique=assume_unique,
                                       invert=invert)

    register(op)(kernel)


for _op in (aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor):
    _isin(_op)  # the decomposition, after the CPU's refusal of bools


def _check_boundaries(boundaries) -> None:
    if boundaries.dim() != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim("
                           f"{boundaries.dim()})")


@register(aten.bucketize.Tensor)
def bucketize(x, boundaries, *, out_int32=False, right=False):
    _check_boundaries(boundaries)
    return _search(aten.bucketize.Tensor, boundaries, x, out_int32, right)


@register(aten.bucketize.Scalar)
def bucketize_scalar(x, boundaries, *, out_int32=False, right=False):
    _check_boundaries(boundaries)
    return _search(aten.searchsorted.Scalar, boundaries, x, out_int32, right, scalar=True)
