"""Reductions on the Vector engine: sum, mean, amax/amin, max/min, argmax/argmin and var/std
(+ _mean); the row machinery the other reductions share (folds.py: prod, any/all,
count_nonzero, logsumexp, vector norms; scan.py; selection.py).

Note [Rows]: a reduction sees its input as rows. The reduced dims (in order) form one row;
the kept dims enumerate rows in the output's order. Kernels read rows straight from storage
through element offsets, so transposed, sliced and expanded inputs need no copy. Floats
accumulate in fp32 (integers in int64) and are rounded once into the output dtype.
"""
from __future__ import annotations

from types import FunctionType
from typing import NamedTuple

import numpy as np
import torch
from torch._decomp import decomposition_table

from neuron_eager.device_sim import config, core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import kernelgen, numerics, workers
from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit
from neuron_eager.ops.numerics import (SUM_BLOCK, SUM_LANES, SUM_QUAD, deviation_sums,
                                       first_equal, fold_lanes, lane_sum, row_extreme)
from neuron_eager.ops.registry import register
from neuron_eager.ops.sourceline import warn_at_user_line

aten = torch.ops.aten
JIT = kernelgen.JIT_OPTIONS
BLOCK = 256  # a row is summed in blocks of this many, then the block sums: small fp32 error
_NO_STEPS = np.empty(0, np.int64)
_NO_SCRATCH = {"f32": np.empty(0, np.float32), "int": np.empty(0, np.int64)}

# -- rows (Note [Rows]) -----------------------------------------------------------------


class Rows(NamedTuple):
    starts: np.ndarray  # int64 offset of each row's first element (before storage_offset)
    steps: np.ndarray  # int64 offset of each element in a row; empty when `stride` is used
    stride: int  # element stride along a row when the row is one strided run
    n: int  # row length
    by_column: bool  # rows are closer together than a row's elements: walk them side by side
    run: int = 0  # with steps: rows are contiguous runs of this many elements, a multiple of
    # SUM_LANES (so every lane group of Note [Sum order] is one run's slice), else 0


_rows_cache: dict = {}
_ROWS_CACHE_BYTES = 64 << 20  # (its offset tables grow with the shapes: a decoding loop's
_rows_cache_bytes = [0]       # lengthening rows held ~1 GB when only entries were counted)


def _offsets(shape, strides) -> np.ndarray:
    off = np.zeros(1, np.int64)
    for n, s in zip(shape, strides):
        off = (off[:, None] + np.arange(n, dtype=np.int64) * s).reshape(-1)
    return off


def rows(x: torch.Tensor, dims) -> Rows:
    """How the elements of `x` split into rows when `dims` (sorted, wrapped) are reduced."""
    key = (tuple(x.shape), x.stride(), dims)
    r = _rows_cache.get(key)
    if r is None:
        shape, stride = x.shape, x.stride()
        keep = [d for d in range(x.dim()) if d not in dims]
        oshape, (ostride,) = kernelgen.coalesce([shape[d] for d in keep],
                                                [[stride[d] for d in keep]])
        ishape, (istride,) = kernelgen.coalesce([shape[d] for d in dims],
                                                [[stride[d] for d in dims]])
        n = T.numel(ishape)
        starts = _offsets(oshape, ostride)
        if len(ishape) == 1:
            by_column = starts.size > 1 and len(oshape) == 1 and 0 < ostride[0] < istride[0]
            r = Rows(starts, _NO_STEPS, istride[0], n, by_column)
        else:
            run = ishape[-1] if istride[-1] == 1 and ishape[-1] % SUM_LANES == 0 else 0
            r = Rows(starts, _offsets(ishape, istride), 0, n, False, run)
        size = r.starts.nbytes + r.steps.nbytes
        if len(_rows_cache) > 4096 or _rows_cache_bytes[0] + size > _ROWS_CACHE_BYTES:
            _rows_cache.clear()
            _rows_cache_bytes[0] = 0
        _rows_cache[key] = r
        _rows_cache_bytes[0] += size
    return r


def flat(x: torch.Tensor) -> np.ndarray:
    """x's storage as a flat array of stored elements, up to the last one x reaches."""
    extent = T.storage_extent(x.shape, x.stride(), x.storage_offset())
    return T.nd_view(x._storage, (extent,), (1,), 0, x.dtype)


def launch(kernel, x: torch.Tensor, dims, outs, *params, engine: str = "vector") -> None:
    """Run a row kernel over `x` into the contiguous outputs `outs`, and account for it."""
    r = rows(x, dims)
    arrays = [o._nd.reshape(-1) for o in outs]
    kernel(flat(x), x.storage_offset(), r.starts, r.steps, r.stride, r.n, *arrays, *params)
    core.launch(engine, x.numel(), x._nd.nbytes + sum(a.nbytes for a in arrays))


def by_rows(run, r: Rows, elements: int) -> None:
    """run(lo, hi) over all rows of `r`: large inputs a share of rows per core (each row's
    result does not depend on the share it falls in). Rows walked side by side need two a
    share; stochastic kernels seed their noise per launch on the calling thread."""
    rows_n = r.starts.size
    shared = rows_n >= 2 * workers.COUNT and not config.stochastic_rounding
    workers.share_rows(run, rows_n, elements if shared else 0, [])


# -- dims, dtypes, errors ---------------------------------------------------------------


def wrap_dims(x: torch.Tensor, dim, empty_means_all: bool = True) -> tuple:
    """Wrapped, sorted reduced dims. None (and [] unless told otherwise) mean all dims."""
    nd = x.dim()
    if dim is None:
        return tuple(range(nd))
    if isinstance(dim, int):
        dim = (dim,)
    if len(dim) == 0:
        return tuple(range(nd)) if empty_means_all else ()
    bound = max(nd, 1)
    seen = []
    for d in dim:
        if not -bound <= d < bound:
            raise IndexError(f"Dimension out of range (expected to be in range of "
                             f"[{-bound}, {bound - 1}], but got {d})")
        d %= bound
        if d in seen:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
        seen.append(d)
    return tuple(sorted(seen)) if nd else ()


def out_shape(x: torch.Tensor, dims, keepdim: bool) -> list[int]:
    if keepdim:
        return [1 if d in dims else n for d, n in enumerate(x.shape)]
    return [n for d, n in enumerate(x.shape) if d not in dims]


def code(dtype: torch.dtype, op) -> str:
    c = numerics.CODE.get(dtype)
    if c is None:
        raise NotImplementedError(f"{op} has no neuron kernel for {dtype}")
    return c


def on_empty(op, x, *args, **kwargs):
    """An empty input: the result depends on shapes alone; take it (or the error) from the CPU."""
    result = op(torch.empty(x.shape, dtype=x.dtype), *args, **kwargs)
    if isinstance(result, torch.Tensor):
        return T.from_cpu(result)
    return tuple(T.from_cpu(r) for r in result)


def accumulated(x: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.dtype]:
    """sum/prod/cumsum's input and result dtype. `dtype=` converts the input first, as the CPU
    does (1.003 is 1.0 in bf16, so a bf16 sum of 1000 of them is 1000, not 1003); without it,
    integers and bools accumulate into int64."""
    if dtype is not None:
        if dtype != x.dtype and x.numel():
            x = E.copy_into(T.empty(x.shape, dtype), x)
        return x, dtype
    return x, (x.dtype if x.dtype.is_floating_point else torch.int64)


def _require_float(x, what: str) -> None:
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{what} only support floating point and complex dtypes")


# -- kernels ----------------------------------------------------------------------------
# Note [Kernel templates]: kernels are plain module-level functions that call `load`,
# `store` and `cast`. `specialize` compiles a copy whose globals bind those names to one
# storage format's converters, wrapped as small ordinary jitted functions: LLVM inlines them,
# and that compiles several times faster than Numba's IR-level inlining at each call site.
# Each kernel is one flat function (no jitted helpers of its own), again for compile time,
# but for `stage`, which copies a row into fp32 out of line (stage_kernel).
# `kernel.py_func` runs the same loop as plain Python, which pdb can step.


def load(v):
    """Placeholder (Note [Kernel templates]): stored element -> compute value."""
    raise NotImplementedError


def store(v):
    """Placeholder (Note [Kernel templates]): compute value -> stored element."""
    raise NotImplementedError


def cast(v):
    """Placeholder (Note [Kernel templates]): a number -> the compute type."""
    raise NotImplementedError


def stage(row, src, s0, steps, stride, n):
    """Placeholder (Note [Kernel templates]): stage_kernel for the input's format."""
    raise NotImplementedError


_CAST = {"f32": np.float32, "int": np.int64}
_kernels: dict = {}
_parts: dict = {}


def specialize(fn, **bindings):
    """A jitted copy of the template `fn` with some of its global names rebound."""
    namespace = dict(fn.__globals__)
    namespace.update(bindings)
    copy = FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__)
    return njit(**JIT)(copy)


def _part(kind: str, *key):
    """The load/store/cast converters of one format, shared by all kernel families."""
    part = _parts.get((kind, *key))
    if part is None:
        if kind == "load":
            part = njit(_wrap(numerics.loader(*key)))
        elif kind == "store":
            part = njit(_wrap(_noisy(key[0]) if key[1] else numerics.storer(key[0])))
        else:  # cast
            part = njit(_wrap(_CAST[key[0]]))
        _parts[(kind, *key)] = part
    return part


def _stager(in_code: str, compute: str, load):
    key = ("stage", in_code, compute)
    stage = _parts.get(key)
    if stage is None:
        stage = _parts[key] = specialize(stage_kernel, load=load)
    return stage


def _wrap(fn):
    return lambda v: fn(v)


def _noisy(out_code: str):
    rounder = numerics.storer(out_code, True)
    return njit(inline="always")(lambda v: rounder(v, np.random.randint(0, 4294967296)))


def kernel(family: str, in_dtype: torch.dtype, out_dtype: torch.dtype, compute: str, op=None,
           exact: bool = False):
    """The jitted row kernel of `family` for one storage format / output / compute type
    (`exact`: int64 results stored whole, for numerics.wrap_int64)."""
    in_code, out_code = code(in_dtype, op or family), code(out_dtype, op or family)
    if exact and out_code == "i64":
        out_code = "i64x"
    stochastic = config.stochastic_rounding and out_code in ("bf16", "f16")
    key = (family, in_code, out_code, compute, stochastic)
    k = _kernels.get(key)
    if k is None:
        load = _part("load", in_code, compute)
        k = _kernels[key] = specialize(
            FAMILIES[family], load=load, store=_part("store", out_code, stochastic),
            cast=_part("cast", compute), stage=_stager(in_code, compute, load))
        if stochastic:
            k = _kernels[key] = numerics.with_noise(k)
        kernelgen.stats["compiled"] += 1
    return k


def sum_kernel(src, base, starts, steps, stride, n, out, mean, divisor, lanes, total, run):
    """Row sums in the lane order of Note [Sum order] (ops/numerics.py); `lanes` is scratch
    of SUM_LANES slots, or SUM_LANES per row when `total` has a slot per row: then the rows
    are walked side by side, which reads memory in order when rows are adjacent and a row's
    elements are far apart (sum over dim 0 of a contiguous matrix, as a bias gradient is).
    Offsets are unsigned: a signed index makes Numba select for negative wraparound, and
    that alone keeps LLVM from vectorising."""
    gathered = steps.size > 0
    rows_n = starts.size
    u_stride = np.uint64(stride)
    u_lanes = np.uint64(SUM_LANES)
    if total.size:  # side by side; rows are evenly spaced (one kept dim), lanes lane-major
        spacing = np.uint64(starts[1] - starts[0])
        u_rows = np.uint64(rows_n)
        for r in range(rows_n):
            total[r] = cast(0)
        for b0 in range(0, n, SUM_BLOCK):
            end = min(b0 + SUM_BLOCK, n)
            for k in range(lanes.size):
                lanes[k] = cast(0)
            for q in range(SUM_LANES):  # lane by lane: its rows' partial sums stay in cache
                at = np.uint64(q) * u_rows
                for i in range(b0 + q, end, SUM_LANES):
                    p = np.uint64(base + starts[0]) + np.uint64(i) * u_stride
                    if spacing == 1:  # (adjacent rows: a unit-stride loop vectorizes)
                        for r in range(rows_n):
                            lanes[at + np.uint64(r)] += load(src[p + np.uint64(r)])
                    else:
                        for r in range(rows_n):
                            lanes[at + np.uint64(r)] += load(src[p + np.uint64(r) * spacing])
            h = SUM_LANES // 2
            while h >= end - b0 and h > 0:
                h //= 2
            while h > 0:
                for k in range(h * rows_n):
                    lanes[k] += lanes[k + h * rows_n]
                h //= 2
            for r in range(rows_n):
                total[r] += lanes[r]
        for r in range(rows_n):
            out[r] = store(total[r] / divisor) if mean else store(total[r])
        return
    width = lanes.size
    for r in range(rows_n):
        s0 = np.uint64(base + starts[r])
        acc_total = cast(0)
        for b0 in range(0, n, SUM_BLOCK):
            end = min(b0 + SUM_BLOCK, n)
            for q in range(SUM_LANES):
                lanes[q] = cast(0)
            whole = b0 + (end - b0) // SUM_LANES * SUM_LANES
            # a loop per layout, each vectorized over the lanes; `width` (SUM_LANES) is read
            # from the array: a constant trip count is unrolled, and the unrolled adds stay
            # scalar (LLVM cannot tell `lanes` from `src`), a loop is vectorized. Runs and
            # unit strides take four lane groups a pass (Note [Lanes in registers]).
            quads = b0 + (end - b0) // SUM_QUAD * SUM_QUAD if run or stride == 1 else b0
            for c0 in range(b0, quads, SUM_QUAD):
                if run:
                    a0, a1 = s0 + np.uint64(steps[c0]), s0 + np.uint64(steps[c0 + SUM_LANES])
                    a2 = s0 + np.uint64(steps[c0 + 2 * SUM_LANES])
                    a3 = s0 + np.uint64(steps[c0 + 3 * SUM_LANES])
                else:
                    a0 = s0 + np.uint64(c0)
                    a1 = a0 + u_lanes
                    a2 = a1 + u_lanes
                    a3 = a2 + u_lanes
                for q in range(width):
                    u_q = np.uint64(q)
                    acc = lanes[q]
                    acc += load(src[a0 + u_q])
                    acc += load(src[a1 + u_q])
                    acc += load(src[a2 + u_q])
                    acc += load(src[a3 + u_q])
                    lanes[q] = acc
            for c0 in range(quads, whole, SUM_LANES):
                if run:  # (a mean over (0, 2, 3) of NCHW: 14x faster than gathering)
                    at = s0 + np.uint64(steps[c0])
                    for q in range(width):
                        lanes[q] += load(src[at + np.uint64(q)])
                elif gathered:
                    for q in range(width):
                        lanes[q] += load(src[s0 + np.uint64(steps[c0 + q])])
                elif stride == 1:
                    at = s0 + np.uint64(c0)
                    for q in range(width):
                        lanes[q] += load(src[at + np.uint64(q)])
                else:
                    at = s0 + np.uint64(c0) * u_stride
                    for q in range(width):
                        lanes[q] += load(src[at + np.uint64(q) * u_stride])
            for c in range(whole, end):
                i = np.uint64(c)
                lanes[c - whole] += load(src[s0 + (np.uint64(steps[i]) if gathered
                                                   else i * u_stride)])
            acc_total += fold_lanes(lanes, min(end - b0, SUM_LANES))
        if mean:
            out[r] = store(acc_total / divisor)
        else:
            out[r] = store(acc_total)


def extreme_kernel(src, base, starts, steps, stride, n, vals, idxs, want_max):
    """max/min with the index of its first occurrence; NaN wins, as on CPU."""
    gathered = steps.size > 0
    for r in range(starts.size):
        s0 = base + starts[r]
        best = load(src[s0])
        at = 0
        if best == best:
            for i in range(1, n):
                v = load(src[s0 + (steps[i] if gathered else i * stride)])
                if v != v:
                    best, at = v, i
                    break
                if (v > best) if want_max else (v < best):
                    best, at = v, i
        vals[r] = store(best)
        idxs[r] = at


def extreme_index_kernel(src, base, starts, steps, stride, n, vals, idxs, want_max):
    """extreme_kernel's results for float rows, faster: each row staged in fp32, its extreme
    found by numerics.row_extreme (vectorized), then its index as the first element equal to
    it (the first NaN when it is NaN), where the compare-and-keep loop took it. The value
    is that element, so a zero keeps its sign."""
    row = np.empty(n, np.float32)
    for r in range(starts.size):
        stage(row, src, np.uint64(base + starts[r]), steps, stride, n)
        # (constant flags: with want_max passed through, LLVM kept the flag's select inside
        # row_extreme's loop and it ran 4x slower)
        m = row_extreme(row, n, True) if want_max else row_extreme(row, n, False)
        at = first_equal(row, n, m)
        vals[r] = store(row[at])
        idxs[r] = at


def extreme_values_kernel(src, base, starts, steps, stride, n, vals, want_max):
    """Float max/min values without indices: the row staged in fp32, then numerics.row_extreme
    (vectorized keys; the first NaN and the first zero's sign, as extreme_kernel keeps them)."""
    row = np.empty(n, np.float32)
    for r in range(starts.size):
        s0 = np.uint64(base + starts[r])
        stage(row, src, s0, steps, stride, n)
        vals[r] = store(row_extreme(row, n, want_max))


def stage_kernel(row, src, s0, steps, stride, n):
    """row[0:n] = the row at offset s0, in the compute type. (Called, not inlined: a kernel
    holding these loops and its own vectorized ones ran those 3x slower.)"""
    if steps.size:
        for i in range(n):
            row[i] = load(src[s0 + np.uint64(steps[i])])
    elif stride == 1:
        for i in range(n):
            row[i] = load(src[s0 + np.uint64(i)])
    else:
        for i in range(n):
            row[i] = load(src[s0 + np.uint64(i) * np.uint64(stride)])


def var_kernel(src, base, starts, steps, stride, n, var_out, mean_out, dof, take_sqrt):
    """Each row staged in fp32, then its statistics as layer norm's (Note [Corrected two-pass
    statistics] in ops/norm.py): a lane-sum mean, then one pass summing d and d * d for its
    deviations d. Data far from zero keep their precision (a sequential sum of 1e5 values
    near 1e4 misplaced the mean by 0.05, and the variance of noise of 0.01 came out 20x)."""
    row = np.empty(n, np.float32)
    lanes = np.empty(SUM_LANES, np.float32)
    lanes2 = np.empty(SUM_LANES, np.float32)
    count = cast(n)
    for r in range(starts.size):
        stage(row, src, np.uint64(base + starts[r]), steps, stride, n)
        mu0 = lane_sum(row, n, lanes) / count
        s1, s2 = deviation_sums(row, n, mu0, lanes, lanes2)
        m2 = s2 - s1 * (s1 / count)
        if not m2 >= 0:  # rounding below 0; or NaN: from NaN data, or inf - inf on overflow
            m2 = s2 if s2 != s2 or s2 == np.inf else cast(0)
        var = m2 / dof
        if take_sqrt:
            var = np.sqrt(var)
        var_out[r] = store(var)
        mean_out[r] = store(mu0 + s1 / count)


def ordered_kernel(partials, out, mean, divisor):
    """out[0] = the block sums added in order from 0 (Note [Blocks side by side])."""
    total = cast(0)
    for b in range(partials.size):
        total += partials[b]
    out[0] = store(total / divisor) if mean else store(total)


FAMILIES = {"sum": sum_kernel, "extreme": extreme_kernel, "var": var_kernel,
            "extreme_index": extreme_index_kernel,
            "extreme_values": extreme_values_kernel, "ordered": ordered_kernel}  # (and
# scan.py's, folds.py's)


# -- sum, mean ----------------------------------------------------------------------------


def _sum(op, x, dim, keepdim, dtype, mean=False):
    dims = wrap_dims(x, dim)
    if mean:
        if not (dtype or x.dtype).is_floating_point:
            which = "Optional dtype" if dtype is not None else "Input dtype"
            raise RuntimeError(f"mean(): could not infer output dtype. {which} must be either a "
                               f"floating point or complex dtype. Got: "
                               f"{T.dtype_name(dtype or x.dtype)}")
        out_dtype = dtype or x.dtype
    else:
        x, out_dtype = accumulated(x, dtype)
    if x.numel() == 0:
        return on_empty(op, x, *([] if op in ALL_DIMS else [dim, keepdim]), dtype=dtype)
    out = T.empty(out_shape(x, dims, keepdim), out_dtype)
    compute = "f32" if out_dtype.is_floating_point else "int"
    k = kernel("sum", x.dtype, out_dtype, compute, op, exact=True)
    n = x.numel() // max(out.numel(), 1)
    r = rows(x, dims)
    kind = _CAST[compute]
    src, base, vals = flat(x), x.storage_offset(), out._nd.reshape(-1)

    def run(lo, hi):
        if r.by_column:  # (Note [Sum order]: SUM_LANES partial sums per row)
            lanes, total = np.empty(SUM_LANES * (hi - lo), kind), np.empty(hi - lo, kind)
        else:
            lanes, total = np.empty(SUM_LANES, kind), _NO_SCRATCH[compute]
        k(src, base, r.starts[lo:hi], r.steps, r.stride, r.n, vals[lo:hi], mean, kind(n), lanes,
          total, r.run)

    if r.starts.size == 1 and not r.steps.size and n >= 2 * SUM_BLOCK and \
            x.numel() >= BLOCKS_SPLIT_MIN and not config.stochastic_rounding:
        _blocks_side_by_side(x, r, op, compute, vals, out_dtype, mean)
    else:
        by_rows(run, r, x.numel())
    core.launch("vector", x.numel(), x._nd.nbytes + vals.nbytes)
    if out_dtype == torch.int64:
        numerics.wrap_int64(out._nd, "sum")
    return out


# Elements from which a whole-tensor sum shares its blocks between cores (Note [Blocks side by
# side]): below, the second core's share cost more than it saved (1M fp32: 115 us shared,
# 95 us on one core; 2M: 154 and 167).
BLOCKS_SPLIT_MIN = 1 << 21


# Note [Blocks side by side]
# A whole-tensor sum is one row: its blocks of SUM_BLOCK (Note [Sum order]) are summed one
# after another, each from 0, and the block sums added in order. The block sums do not
# depend on each other, so a long row's are computed a share per core (each block read as a
# row of its own, its sum kept in fp32, or int64) and then added in order on one core: the
# same additions, so the same bits. `x.sum()` of 1M fp32 ran on one core.
def _blocks_side_by_side(x, r: Rows, op, compute: str, vals, out_dtype, mean: bool) -> None:
    kind = _CAST[compute]
    wide = torch.float32 if compute == "f32" else torch.int64
    block_sum = kernel("sum", x.dtype, wide, compute, op, exact=True)
    src, base, n = flat(x), x.storage_offset(), r.n
    whole = n // SUM_BLOCK
    starts = r.starts[0] + np.arange(whole + 1, dtype=np.int64) * (SUM_BLOCK * r.stride)
    partials = np.empty(whole + (n % SUM_BLOCK > 0), kind)

    def blocks(lo, hi, length=SUM_BLOCK):
        block_sum(src, base, starts[lo:hi], r.steps, r.stride, length, partials[lo:hi], False,
                  kind(1), np.empty(SUM_LANES, kind), _NO_SCRATCH[compute], 0)

    workers.share_rows(blocks, whole, x.numel(), [])
    if n % SUM_BLOCK:
        blocks(whole, whole + 1, n % SUM_BLOCK)
    kernel("ordered", x.dtype, out_dtype, compute, op, exact=True)(partials, vals, mean, kind(n))


@register(aten.sum.default)
def sum_(x, *, dtype=None):
    return _sum(aten.sum.default, x, None, False, dtype)


@register(aten.sum.dim_IntList)
def sum_dim(x, dim, keepdim=False, *, dtype=None):
    return _sum(aten.sum.dim_IntList, x, dim, keepdim, dtype)


@register(aten.mean.default)
def mean(x, *, dtype=None):
    return _sum(aten.mean.default, x, None, False, dtype, mean=True)


@register(aten.mean.dim)
def mean_dim(x, dim, keepdim=False, *, dtype=None):
    return _sum(aten.mean.dim, x, dim, keepdim, dtype, mean=True)


# -- max, min, argmax, argmin -----------------------------------------------------------


def extreme(op, x, dims, keepdim, want_max, values=True, indices=True):
    """(values, indices) of the max or min over `dims`; an empty input errors as on CPU."""
    out = T.empty(out_shape(x, dims, keepdim), x.dtype) if values else None
    idx = T.empty(out_shape(x, dims, keepdim), torch.int64) if indices else None
    compute = "f32" if x.dtype.is_floating_point else "int"
    if compute == "f32" and not indices:
        k = kernel("extreme_values", x.dtype, x.dtype, compute, op)
        r = rows(x, dims)
        src, base, vals = flat(x), x.storage_offset(), out._nd.reshape(-1)
        by_rows(lambda lo, hi: k(src, base, r.starts[lo:hi], r.steps, r.stride, r.n,
                                  vals[lo:hi], want_max), r, x.numel())
        core.launch("vector", x.numel(), x._nd.nbytes + vals.nbytes)
        return out, idx
    k = kernel("extreme" if compute == "int" else "extreme_index", x.dtype, x.dtype, compute, op)
    n = max(T.numel(out_shape(x, dims, False)), 1)
    vals = out._nd.reshape(-1) if values else np.empty(n, T.STORAGE_DTYPE[x.dtype])
    where = idx._nd.reshape(-1) if indices else np.empty(n, np.int64)
    r = rows(x, dims)
    src, base = flat(x), x.storage_offset()
    by_rows(lambda lo, hi: k(src, base, r.starts[lo:hi], r.steps, r.stride, r.n, vals[lo:hi],
                             where[lo:hi], want_max), r, x.numel())
    core.launch("vector", x.numel(), x._nd.nbytes + vals.nbytes + where.nbytes)
    return out, idx


def _amax(op, x, dim, keepdim, want_max):
    dims = wrap_dims(x, dim)
    if x.numel() == 0:
        return on_empty(op, x, dim, keepdim)
    return extreme(op, x, dims, keepdim, want_max, indices=False)[0]


@register(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return _amax(aten.amax.default, x, dim, keepdim, True)


@register(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return _amax(aten.amin.default, x, dim, keepdim, False)


@register(aten.max.default)
def max_(x):
    if x.numel() == 0:
        return on_empty(aten.max.default, x)
    return extreme(aten.max.default, x, wrap_dims(x, None), False, True, indices=False)[0]


@register(aten.min.default)
def min_(x):
    if x.numel() == 0:
        return on_empty(aten.min.default, x)
    return extreme(aten.min.default, x, wrap_dims(x, None), False, False, indices=False)[0]


@register(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    dims = wrap_dims(x, dim)
    if x.numel() == 0:
        return on_empty(aten.max.dim, x, dim, keepdim)
    return extreme(aten.max.dim, x, dims, keepdim, True)


@register(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    dims = wrap_dims(x, dim)
    if x.numel() == 0:
        return on_empty(aten.min.dim, x, dim, keepdim)
    return extreme(aten.min.dim, x, dims, keepdim, False)


def _arg(op, x, dim, keepdim, want_max):
    if x.dtype == torch.bool:
        raise RuntimeError(f"{'argmax' if want_max else 'argmin'}(): does not support bool input")
    dims = wrap_dims(x, dim)
    if x.numel() == 0:
        return on_empty(op, x, dim, keepdim)
    return extreme(op, x, dims, keepdim, want_max, values=False)[1]


@register(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False):
    if x.numel() == 0:  # (the decomposition's amin would word the CPU's error otherwise)
        return on_empty(aten.aminmax.default, x, dim=dim, keepdim=keepdim)
    return decomposition_table[aten.aminmax.default](x, dim=dim, keepdim=keepdim)


@register(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg(aten.argmax.default, x, dim, keepdim, True)


@register(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg(aten.argmin.default, x, dim, keepdim, False)


# -- var, std ---------------------------------------------------------------------------


def _var(op, x, dim, correction, keepdim, take_sqrt, with_mean):
    _require_float(x, "std and var")
    dims = wrap_dims(x, dim)
    if x.numel() == 0:
        return on_empty(op, x, dim, correction=correction, keepdim=keepdim)
    shape = out_shape(x, dims, keepdim)
    var, mean = T.empty(shape, x.dtype), T.empty(shape, x.dtype)
    n = x.numel() // max(var.numel(), 1)
    correction = 1 if correction is None else correction
    dof = np.float32(max(0, n - correction))
    if dof == 0:  # the CPU's warning
        name = ("std" if take_sqrt else "var") + ("_mean" if with_mean else "")
        warn_at_user_line(f"{name}(): degrees of freedom is <= 0. "
                          f"Correction should be strictly less than the reduction factor "
                          f"(input numel divided by output numel).")
    launch(kernel("var", x.dtype, x.dtype, "f32", op), x, dims, [var, mean], dof, take_sqrt)
    return (var, mean) if with_mean else var


@register(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var(aten.var.correction, x, dim, correction, keepdim, False, False)


@register(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return _var(aten.std.correction, x, dim, correction, keepdim, True, False)


@register(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var(aten.var_mean.correction, x, dim, correction, keepdim, False, True)


@register(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var(aten.std_mean.correction, x, dim, correction, keepdim, True, True)


# ops whose CPU form for an empty input takes no dim arguments
ALL_DIMS = {aten.sum.default, aten.mean.default, aten.any.default, aten.all.default}
