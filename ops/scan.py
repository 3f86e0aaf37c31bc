"""Ops along one dim that keep it: cumsum and cumprod (Vector engine), sort and topk.

They reuse the row view of reduction.py (Note [Rows]): the dim is the row, read in place
from storage; results go to new tensors (a sort in its input's layout). Scans accumulate in
fp32 (int64 for integers) and round each prefix once. Sorting is stable with NaN ordered above
+inf, as on CPU (float rows as integer keys, Note [Sorting float keys]; integer rows by a merge
sort); sorted values are copied bit for bit.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import numerics
from neuron_eager.ops import reduction as R
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import like_strides
from neuron_eager.ops.jit import njit
from neuron_eager.ops.numerics import f32_as_u32
from neuron_eager.ops.reduction import cast, load, stage, store  # template placeholders
from neuron_eager.ops.registry import register

aten = torch.ops.aten
CUMSUM, CUMPROD = 0, 1
RUN = 16  # merge sort starts from insertion-sorted runs of this length


def _dest(out: torch.Tensor, dim: int):
    """Row starts and stride of a contiguous output along `dim`, in the input's row order."""
    r = R.rows(out, (dim,) if out.dim() else ())
    return r.starts, r.stride


# -- cumsum, cumprod --------------------------------------------------------------------


def scan_kernel(src, base, starts, steps, stride, n, dst, dstarts, dstride, mode):
    gathered = steps.size > 0
    for r in range(starts.size):
        s0, d0 = base + starts[r], dstarts[r]
        acc = cast(0) if mode == CUMSUM else cast(1)
        for i in range(n):
            v = load(src[s0 + (steps[i] if gathered else i * stride)])
            acc = acc + v if mode == CUMSUM else acc * v
            dst[d0 + i * dstride] = store(acc)


def _scan(op, x, dim, dtype, mode):
    dims = R.wrap_dims(x, dim)
    x, out_dtype = R.accumulated(x, dtype)
    if x.numel() == 0:
        return R.on_empty(op, x, dim, dtype=dtype)
    out = T.empty(x.shape, out_dtype)
    compute = "f32" if out_dtype.is_floating_point else "int"
    k = R.kernel("scan", x.dtype, out_dtype, compute, op, exact=True)
    dstarts, dstride = _dest(out, dims[0] if dims else 0)
    r, src, dst = R.rows(x, dims), R.flat(x), out._nd.reshape(-1)
    R.by_rows(lambda lo, hi: k(src, x.storage_offset(), r.starts[lo:hi], r.steps, r.stride, r.n,
                               dst, dstarts[lo:hi], dstride, mode), r, x.numel())
    core.launch("vector", x.numel(), x._nd.nbytes + dst.nbytes)
    if out_dtype == torch.int64:
        numerics.wrap_int64(out._nd, "cumsum" if mode == CUMSUM else "cumprod")
    return out


@register(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    return _scan(aten.cumsum.default, x, dim, dtype, CUMSUM)


@register(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    return _scan(aten.cumprod.default, x, dim, dtype, CUMPROD)


# -- sort, topk -------------------------------------------------------------------------


@njit(inline="always")
def _before(a, b, descending):
    """a strictly before b; NaN is the largest value."""
    if descending:
        return a > b or (a != a and b == b)
    return a < b or (b != b and a == a)


@njit(**R.JIT)
def _merge_sort(order, tmp, keys, descending):
    """Stable bottom-up merge sort of the indices in `order` by `keys`, from sorted runs."""
    n = order.size
    for lo in range(0, n, RUN):  # insertion-sort short runs first: fewer merge passes
        for i in range(lo + 1, min(lo + RUN, n)):
            item, j = order[i], i
            while j > lo and _before(keys[item], keys[order[j - 1]], descending):
                order[j] = order[j - 1]
                j -= 1
            order[j] = item
    src, dst = order, tmp
    width, swapped = RUN, False
    while width < n:
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if _before(keys[src[j]], keys[src[i]], descending):
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
                k += 1
            while i < mid:
                dst[k] = src[i]
                i += 1
                k += 1
            while j < hi:
                dst[k] = src[j]
                j += 1
                k += 1
        src, dst = dst, src
        swapped = not swapped
        width *= 2
    if swapped:
        for i in range(n):
            order[i] = src[i]


@njit(**R.JIT)
def _write_picks(vals, idxs, d0, dstride, src, s0, steps, stride, picks, k):
    """The first k picked elements of a row, by index, and their stored values (bit for bit)."""
    gathered = steps.size > 0
    for j in range(k):
        i = picks[j]
        vals[d0 + j * dstride] = src[s0 + (steps[i] if gathered else i * stride)]
        idxs[d0 + j * dstride] = i


def sort_kernel(src, base, starts, steps, stride, n, vals, idxs, dstarts, dstride, keys,
                descending, k):
    gathered = steps.size > 0
    order = np.empty(n, np.int64)
    tmp = np.empty(n, np.int64)
    for r in range(starts.size):
        s0, d0 = base + starts[r], dstarts[r]
        for i in range(n):
            keys[i] = load(src[s0 + (steps[i] if gathered else i * stride)])
            order[i] = i
        _merge_sort(order, tmp, keys, descending)
        _write_picks(vals, idxs, d0, dstride, src, s0, steps, stride, order, k)


# Note [Sorting float keys]
# A float row sorts as unsigned integers: each value's bits made order-preserving (+-0 made
# +0 and every NaN the quiet NaN first, so ties stay ties and NaN sorts above +inf, as
# _before orders them; descending inverts the key) in the high half, its index in the low
# half. The keys are then distinct, so any sort gives the stable order, and Numba's sort of
# plain integers beats _merge_sort's chasing of indices: 1024-element rows 70 -> 35 us.
@njit(inline="always")
def _ordered_key(v, descending):
    bits = np.uint32(0) if v == 0 else np.uint32(0x7FC00000) if v != v else f32_as_u32(v)
    key = ~bits if bits >> np.uint32(31) else bits | np.uint32(0x80000000)
    return ~key if descending else key


def keysort_kernel(src, base, starts, steps, stride, n, vals, idxs, dstarts, dstride, keys,
                   descending, k):
    """sort_kernel's result for float rows of fewer than 2^32 (Note [Sorting float keys])."""
    packed = np.empty(n, np.uint64)
    order = np.empty(n, np.int64)
    for r in range(starts.size):
        s0, d0 = base + starts[r], dstarts[r]
        stage(keys, src, np.uint64(s0), steps, stride, n)  # (the row as fp32 values)
        for i in range(n):
            key = _ordered_key(keys[i], descending)
            packed[i] = (np.uint64(key) << np.uint64(32)) | np.uint64(i)
        packed.sort()
        for i in range(n):
            order[i] = np.int64(packed[i] & np.uint64(0xFFFFFFFF))
        _write_picks(vals, idxs, d0, dstride, src, s0, steps, stride, order, k)


def select_kernel(src, base, starts, steps, stride, n, vals, idxs, dstarts, dstride, keys,
                  descending, k):
    """The first k of sort_kernel's order, by selection (Note [Top k by selection])."""
    gathered = steps.size > 0
    best = np.empty(k, np.int64)
    for r in range(starts.size):
        s0, d0 = base + starts[r], dstarts[r]
        for i in range(n):
            keys[i] = load(src[s0 + (steps[i] if gathered else i * stride)])
        m = 0
        for i in range(n):
            v = keys[i]
            if m == k:
                if not _before(v, keys[best[k - 1]], descending):
                    continue
                p = k - 1  # the last one drops out
            else:
                p = m
                m += 1
            while p > 0 and _before(v, keys[best[p - 1]], descending):
                best[p] = best[p - 1]
                p -= 1
            best[p] = i
        _write_picks(vals, idxs, d0, dstride, src, s0, steps, stride, best, k)


@njit(inline="always")
def _later(keys, i, j, descending):
    """Element i comes after element j in the stable sort (equal keys: by index)."""
    return _before(keys[j], keys[i], descending) or \
        (not _before(keys[i], keys[j], descending) and i > j)


@njit(**R.JIT)
def _sift_down(heap, p, m, keys, descending):
    """Restore the heap (each entry after its children in the order) below slot p."""
    item = heap[p]
    while True:
        c = 2 * p + 1
        if c >= m:
            break
        if c + 1 < m and _later(keys, heap[c + 1], heap[c], descending):
            c += 1
        if not _later(keys, heap[c], item, descending):
            break
        heap[p] = heap[c]
        p = c
    heap[p] = item


def heap_kernel(src, base, starts, steps, stride, n, vals, idxs, dstarts, dstride, keys,
                descending, k):
    """select_kernel's result for a larger k: the best k in a heap whose root comes last, then
    sorted by (key, index) (Note [Top k by selection])."""
    gathered = steps.size > 0
    heap = np.empty(k, np.int64)
    tmp = np.empty(k, np.int64)
    for r in range(starts.size):
        s0, d0 = base + starts[r], dstarts[r]
        for i in range(n):
            keys[i] = load(src[s0 + (steps[i] if gathered else i * stride)])
        for i in range(k):
            heap[i] = i
        for p in range(k // 2 - 1, -1, -1):
            _sift_down(heap, p, k, keys, descending)
        for i in range(k, n):  # i comes after every equal key in the heap: strictly before
            if _before(keys[i], keys[heap[0]], descending):
                heap[0] = i
                _sift_down(heap, 0, k, keys, descending)
        heap.sort()  # by index, so that the stable merge sort orders ties by index
        _merge_sort(heap, tmp, keys, descending)
        _write_picks(vals, idxs, d0, dstride, src, s0, steps, stride, heap, k)


# Note [Top k by selection]
# topk with a small k keeps the best k seen so far in order, scanning the row once: an
# element goes in only when it comes before the k-th best, and after every equal one (its
# index is larger), so the result is the first k of the stable sort, the same as sorting
# the row. topk(10) of 1024 x 1024 took 90 ms as a merge sort per row, 5.6 ms this way. Its
# worst case (a row in the opposite order) shifts k entries per element, so a larger k keeps
# a heap of the best k whose root is the one that comes last (n log k at worst, nearly n
# comparisons on most rows), then sorts those k by key and index: the same result. topk(300)
# of 8 rows of 131072 took 375 ms as a sort per row (the CPU's: 8 ms). From a quarter of the
# row on, sorting the row costs about the same.
SELECT_MAX_K = 64


R.FAMILIES.update(scan=scan_kernel, sort=sort_kernel, keysort=keysort_kernel, select=select_kernel,
                  heap=heap_kernel)


def sort_rows(op, x, dim: int, descending: bool, k: int | None = None, engine="gpsimd"):
    """(values, indices) of the first `k` (all by default) of x sorted along `dim`."""
    dims = R.wrap_dims(x, dim)
    d = dims[0] if dims else 0
    shape = list(x.shape)
    if k is not None and shape:
        shape[d] = k
    # a sort keeps x's layout where x is dense (the CPU's); a topk is contiguous
    stride = like_strides(x, None) if k is None else None
    vals, idxs = T.empty(shape, x.dtype, stride), T.empty(shape, torch.int64, stride)
    compute = "f32" if x.dtype.is_floating_point else "int"
    n = x.shape[d] if x.dim() else 1
    family = "sort" if k is None or not 0 < k < n else "select" if k <= SELECT_MAX_K else \
        "heap" if 4 * k <= n else "sort"
    if family == "sort" and compute == "f32" and n < 1 << 32:
        family = "keysort"
    kern = R.kernel(family, x.dtype, x.dtype, compute, op)
    r = R.rows(x, dims)
    dstarts, dstride = _dest(vals, d)
    nk = r.n if k is None or not shape else k  # (a 0-dim topk(x, 0) is (x, 0) on the CPU)
    src, out_values, out_indices = R.flat(x), R.flat(vals), R.flat(idxs)  # (any layout)

    def run(lo, hi):
        keys = np.empty(r.n, np.float32 if compute == "f32" else np.int64)
        kern(src, x.storage_offset(), r.starts[lo:hi], r.steps, r.stride, r.n, out_values,
             out_indices, dstarts[lo:hi], dstride, keys, descending, nk)

    R.by_rows(run, r, x.numel())
    core.launch(engine, x.numel(), x._nd.nbytes + vals._nd.nbytes + idxs._nd.nbytes)
    return vals, idxs


@register(aten.sort.default)
def sort(x, dim=-1, descending=False):
    if x.numel() == 0:
        return R.on_empty(aten.sort.default, x, dim, descending)
    return sort_rows(aten.sort.default, x, dim, descending)


@register(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    if x.numel() == 0:
        return R.on_empty(aten.sort.stable, x, stable=stable, dim=dim, descending=descending)
    return sort_rows(aten.sort.stable, x, dim, descending)


@register(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    dims = R.wrap_dims(x, dim)
    n = x.shape[dims[0]] if dims else 1
    if not 0 <= k <= n:
        raise RuntimeError("selected index k out of range")
    if x.dtype == torch.bool:
        raise RuntimeError("topk does not support bool dtypes on CPU")
    if x.numel() == 0:
        return R.on_empty(aten.topk.default, x, k, dim, largest, sorted)
    # Vector-engine max8/find_index8 instructions select top values on Trainium
    return sort_rows(aten.topk.default, x, dim, largest, k, engine="vector")

