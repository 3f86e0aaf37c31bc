"""Mask-driven ops: masked_fill / masked_select / masked_scatter, nonzero(_static), tril / triu.

Part of the indexing family (imported by ops/indexing.py). Selections whose size
depends on the data (masked_select, nonzero) first count on the device and read
the count back, as the real runtime must; then one GpSimd kernel compacts.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import indexing as I
from neuron_eager.ops import kernelgen
from neuron_eager.ops import numerics
from neuron_eager.ops import overlap
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import fill
from neuron_eager.ops.jit import njit
from neuron_eager.ops.registry import register

aten = torch.ops.aten
_JIT = I._JIT


# -- kernels -------------------------------------------------------------------------------
@njit(**_JIT)
def _nonzero(out, x, shape, strides, keep):
    """Row-major coordinates of elements with (bits & keep) != 0, into out[c, :]; returns
    how many. With `out` of 0 rows it only counts. The last dim is walked in a plain loop
    (unsigned offsets: the count vectorizes; a random mask's branch per element was
    mispredicted half the time), the others advanced once per row."""
    nd = shape.shape[0]
    inner = shape[nd - 1] if nd else 1
    step = np.uint64(strides[nd - 1]) if nd else np.uint64(0)
    rows = 1
    for d in range(nd - 1):
        rows *= shape[d]
    coord = np.zeros(max(nd, 1), np.int64)
    hits = np.empty(inner + 1, np.int64)
    cap = out.shape[0]
    c = 0
    off = 0
    for _ in range(rows):
        base = np.uint64(off)
        if cap == 0:
            for j in range(inner):
                c += np.int64((x[base + np.uint64(j) * step] & keep) != 0)
        else:  # the row's hits gathered without a branch per element, then written
            k = 0
            for j in range(inner):
                hits[k] = j
                k += np.int64((x[base + np.uint64(j) * step] & keep) != 0)
            for t in range(max(min(k, cap - c), 0)):
                for d in range(nd - 1):
                    out[c + t, d] = coord[d]
                if nd:  # (a 0-dim x has no coordinates)
                    out[c + t, nd - 1] = hits[t]
            c += k
        d = nd - 2
        while d >= 0:
            coord[d] += 1
            off += strides[d]
            if coord[d] < shape[d]:
                break
            off -= strides[d] * shape[d]
            coord[d] = 0
            d -= 1
    return c


@njit(**_JIT)
def _compact(out, src, mask, shape, sstr, mstr):
    """out[c++] = src[i] for each i (row-major) where mask[i]."""
    d0, d1, d2, d3 = shape
    c = 0
    for i0 in range(d0):
        for i1 in range(d1):
            for i2 in range(d2):
                s = i0 * sstr[0] + i1 * sstr[1] + i2 * sstr[2]
                m = i0 * mstr[0] + i1 * mstr[1] + i2 * mstr[2]
                for i3 in range(d3):
                    if mask[m + i3 * mstr[3]]:
                        out[c] = src[s + i3 * sstr[3]]
                        c += 1


@njit(**_JIT)
def _expand(out, src, mask, shape, ostr, mstr):
    """out[i] = src[c++] for each i (row-major) where mask[i]."""
    d0, d1, d2, d3 = shape
    c = 0
    for i0 in range(d0):
        for i1 in range(d1):
            for i2 in range(d2):
                o = i0 * ostr[0] + i1 * ostr[1] + i2 * ostr[2]
                m = i0 * mstr[0] + i1 * mstr[1] + i2 * mstr[2]
                for i3 in range(d3):
                    if mask[m + i3 * mstr[3]]:
                        out[o + i3 * ostr[3]] = src[c]
                        c += 1


@njit(**_JIT)
def _triangle(out, x, nb, rows, cols, xs0, xs1, xs2, diagonal, lower, zero):
    p = 0
    for b in range(nb):
        for r in range(rows):
            for c in range(cols):
                keep = (c - r <= diagonal) if lower else (c - r >= diagonal)
                out[p] = x[b * xs0 + r * xs1 + c * xs2] if keep else zero
                p += 1


# -- nonzero -------------------------------------------------------------------------------
def _keep_bits(x) -> np.generic:
    """Bits that make an element nonzero: all but the sign bit for floats (-0.0 is zero)."""
    raw = I._RAW[x.element_size()]
    bits = 8 * x.element_size()
    keep = (1 << bits) - 1
    if x.dtype.is_floating_point:
        keep ^= 1 << (bits - 1)
    return raw(keep)


def count_nonzero(x: T.NeuronTensor) -> int:
    shape = np.array(x.shape, np.int64)
    strides = np.array(x.stride(), np.int64)
    n = _nonzero(np.empty((0, x.dim()), np.int64), I.flat(x), shape, strides, _keep_bits(x))
    core.launch("gpsimd", x.numel(), x._nd.nbytes)
    return int(n)


@register(aten.nonzero.default)
def nonzero(x):
    n = count_nonzero(x) if x.numel() else 0  # the host read: the size depends on the data
    if n == 0:
        # Storage for one row, so that views of the empty result (where() unbinds it) can
        # carry offsets: tensor.nd_view refuses offsets past a zero-byte storage.
        return T.make(T.NeuronStorage(8 * max(x.dim(), 1)), (0, x.dim()), (1, 0), 0,
                      torch.int64)
    # The CPU's result is column-major, strides (1, n): one coordinate's column is dense.
    columns = T.empty((x.dim(), n), torch.int64)
    _nonzero(columns._nd.T, I.flat(x), np.array(x.shape, np.int64),
             np.array(x.stride(), np.int64), _keep_bits(x))
    core.launch("gpsimd", x.numel(), x._nd.nbytes + columns._nd.nbytes)
    return T.make(columns._storage, (n, x.dim()), (1, n), 0, torch.int64)


# -- masked ops ----------------------------------------------------------------------------
_MASKED_FILL = E.Elementwise("masked_fill", njit(lambda x, m, v: v if m else x), nparams=1,
                             dense_result=True)  # (the CPU fills a contiguous clone)


def _check_mask(mask):
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{T.CPP_NAMES.get(mask.dtype, mask.dtype)}")


def _fill_value(value, dtype):
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got "
                               f"tensor with {value.dim()} dimension(s).")
        value = value.item()
    numerics.check_fits(value, dtype)
    return value


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    _check_mask(mask)
    shape = E.broadcast_shape([mask.shape, x.shape])  # (the CPU's order, for its message)
    return E.run(_MASKED_FILL, [x, mask], [_fill_value(value, x.dtype)],
                 out=T.empty(shape, x.dtype))


@register(aten.masked_fill_.Scalar, aten.masked_fill_.Tensor)
def masked_fill_(x, mask, value):
    _check_mask(mask)
    value = _fill_value(value, x.dtype)
    if overlap.has_internal_overlap(x):
        _deprecated_on_expanded("masked_fill_")
        return fill_shared(x, aten.expand.default(mask, list(x.shape)), value)
    return E.run(_MASKED_FILL, [x, mask], [value], out=x)


def recordable_fill(x, mask, value):
    """The fill value (checked, a number) of a masked fill that adaptive eager records, or
    None to run it eagerly: a float tensor and a bool mask on the device, a value on the host
    (a device value would be read in the middle of recording; the kernel checks the rest)."""
    if type(x) is not T.NeuronTensor or type(mask) is not T.NeuronTensor or \
            mask.dtype != torch.bool or not x.dtype.is_floating_point or \
            type(value) is T.NeuronTensor:
        return None
    return _fill_value(value, x.dtype)


@E.fusible_inplace(aten.masked_fill_.Scalar, aten.masked_fill_.Tensor)
def _plan_masked_fill_(x, mask, value):
    """The in-place fill adaptive eager records (it runs a tensor whose elements share
    memory eagerly)."""
    value = recordable_fill(x, mask, value)
    return None if value is None else (_MASKED_FILL, [x, mask], [value])


# Note [Fills of expanded tensors]
# The CPU lets masked_fill_, index_fill_, tril_ and triu_ write a tensor whose elements share
# memory (an expanded view: stride 0), deprecated but allowed, since each writes one value:
# a memory location ends with it if any element over it was written. Those ops compute which
# elements they write, fold that over the stride-0 dims, and fill the memory once through a
# view without them (the one-element-per-location view).
def _deprecated_on_expanded(name: str) -> None:
    from neuron_eager.ops.sourceline import warn_at_user_line

    warn_at_user_line(f"Use of {name} on expanded tensors is deprecated. Please clone() the "
                      f"tensor before performing this operation. This also applies to advanced "
                      f"indexing e.g. tensor[mask] = scalar")


def fill_shared(x, written, value):
    """`value` into every memory location of x under an element where `written` (x's shape,
    bool) is true (Note [Fills of expanded tensors])."""
    shared = [d for d, (n, st) in enumerate(zip(x.shape, x.stride())) if st == 0 and n > 1]
    locations = x.as_strided([1 if d in shared else n for d, n in enumerate(x.shape)],
                             x.stride(), x.storage_offset())
    E.run(_MASKED_FILL, [locations, aten.any.dims(written, shared, True)], [value],
          out=locations)
    return x


@register(aten.index_fill_.int_Scalar, aten.index_fill_.int_Tensor)
def index_fill_(x, dim, index, value):
    if T.shares_memory([x], [index]):  # (Note [Writes into their own inputs]: the CPU's error)
        op = aten.index_fill_.int_Tensor if isinstance(value, torch.Tensor) else \
            aten.index_fill_.int_Scalar
        T.run_on_cpu(op, (x, dim, index, value), {})
    elif not overlap.has_internal_overlap(x):
        return I.index_fill_into(x, dim, *I.check_index_fill(x, dim, index, value))
    result = I.index_fill(x, dim, index, value)  # (its checks and errors)
    if not overlap.has_internal_overlap(x):
        return E.copy_into(x, result)
    _deprecated_on_expanded("index_fill_")
    none = aten.zeros_like.default(x, dtype=torch.bool, memory_format=torch.contiguous_format)
    value = value.item() if isinstance(value, torch.Tensor) else value
    return fill_shared(x, I.index_fill(none, dim, index, True), value)


@register(aten.tril_.default)
def tril_(x, diagonal=0):
    return _triangle_(x, diagonal, True, aten.tril.default)


@register(aten.triu_.default)
def triu_(x, diagonal=0):
    return _triangle_(x, diagonal, False, aten.triu.default)


def _triangle_(x, diagonal, lower, op):
    if not overlap.has_internal_overlap(x):
        return E.copy_into(x, _triangle_op(x, diagonal, lower, op))
    ones = aten.ones_like.default(x, dtype=torch.bool, memory_format=torch.contiguous_format)
    kept = _triangle_op(ones, diagonal, lower, op)  # the elements the triangle keeps
    return fill_shared(x, aten.logical_not.default(kept), 0)


@register(aten.masked_select.default)
def masked_select(x, mask):
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    shape = E.broadcast_shape([mask.shape, x.shape])  # (the CPU's words: mask is tensor a)
    # an expanded mask repeats each element equally often
    n = count_nonzero(mask) * (T.numel(shape) // max(mask.numel(), 1)) if mask.numel() else 0
    out = T.empty((n,), x.dtype)
    if n:
        if _merged_rank(shape, [I._bstrides(x, shape), I._bstrides(mask, shape)]) > 4:
            x, mask = _dense(x, shape), _dense(mask, shape)
        I.launch4(_compact, [I.flat(out), I.flat(x), I.flat(mask)], shape,
                  [I._bstrides(x, shape), I._bstrides(mask, shape)])
        core.launch("gpsimd", T.numel(shape), out._nd.nbytes + x._nd.nbytes + mask._nd.nbytes)
    return out


# Note [Compaction past 4 dims]
# The compaction kernels walk 4 strided dims in order, counting the elements taken; launch4
# slices the leading dims of a deeper layout into separate launches, which would restart the
# count (and drop the mask's strides). Operands whose layouts do not merge to 4 dims are made
# dense first: one dim, and the count runs through.
def _merged_rank(shape, strides) -> int:
    return len(kernelgen.coalesce(list(shape), [list(s) for s in strides])[0])


def _dense(t, shape):
    """t broadcast to `shape`, as a contiguous tensor."""
    return E.copy_into(T.empty(shape, t.dtype), t)


def _masked_scatter_into(out, mask, source):
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype "
                           f"{T.dtype_name(mask.dtype)}")
    if source.dtype != out.dtype:
        raise RuntimeError(f"masked_scatter: expected self and source to have same dtypes but got"
                           f"{T.dtype_name(out.dtype)} and {T.dtype_name(source.dtype)}")  # (sic)
    shape = tuple(out.shape)
    n = count_nonzero(mask) * (T.numel(shape) // max(mask.numel(), 1)) if mask.numel() else 0
    if n > source.numel():
        raise RuntimeError("Number of elements of source < number of ones in mask")
    if n:
        src = source.contiguous()
        if src._storage is out._storage:
            src = I._clone(src)
        dst = out
        if _merged_rank(shape, [out.stride(), I._bstrides(mask, shape)]) > 4:
            dst, mask = _dense(out, shape), _dense(mask, shape)
        I.launch4(_expand, [I.flat(dst), I.flat(src), I.flat(mask)], shape,
                  [dst.stride(), I._bstrides(mask, shape)])
        if dst is not out:
            E.copy_into(out, dst)
        core.launch("gpsimd", T.numel(shape), 2 * n * out.element_size() + mask._nd.nbytes)
    return out


@register(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    shape = tuple(torch.broadcast_shapes(x.shape, mask.shape))
    out = E.copy_into(T.empty(shape, x.dtype), x)
    return _masked_scatter_into(out, mask, source)


@register(aten.masked_scatter_.default)
def masked_scatter_(x, mask, source):
    if tuple(torch.broadcast_shapes(x.shape, mask.shape)) != tuple(x.shape):
        raise RuntimeError(f"masked_scatter_: expected mask of shape broadcastable to "
                           f"{list(x.shape)}, got {list(mask.shape)}")
    overlap.check_no_internal_overlap(x)
    return _masked_scatter_into(x, mask, source)


@register(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad, mask, sizes):
    selected = masked_select(grad, mask)
    missing = T.numel(sizes) - selected.numel()
    if missing > 0:  # positions the mask never chose get no gradient
        from neuron_eager.ops.arrange import cat

        selected = cat([selected, fill(T.empty((missing,), grad.dtype), 0)])
    return selected.view(sizes)


# -- tril / triu ---------------------------------------------------------------------------
def _triangle_op(x, diagonal, lower, op):
    I.meta_call(op, x, diagonal)
    out = T.empty(x.shape, x.dtype)
    if not x.numel():
        return out
    rows, cols = x.shape[-2:]
    nb = x.numel() // (rows * cols)
    batch_shape, (batch_strides,) = I.kernelgen.coalesce(list(x.shape[:-2]), [x.stride()[:-2]])
    if len(batch_shape) > 1:
        x = x.contiguous()
        batch_strides = [rows * cols]
    raw = I._RAW[x.element_size()]
    _triangle(I.flat(out), I.flat(x), nb, rows, cols, batch_strides[0], x.stride(-2),
              x.stride(-1), diagonal, lower, raw(0))
    core.launch("gpsimd", x.numel(), 2 * out._nd.nbytes)
    return out


@register(aten.tril.default)
def tril(x, diagonal=0):
    return _triangle_op(x, diagonal, True, aten.tril.default)


@register(aten.triu.default)
def triu(x, diagonal=0):
    return _triangle_op(x, diagonal, False, aten.triu.default)


@register(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    """nonzero with a fixed row count: the first `size` coordinates, padded with fill_value."""
    if size < 0:
        raise RuntimeError("nonzero_static: 'size' must be an non-negative integer")
    out = T.empty((size, x.dim()), torch.int64)
    if not out.numel():
        return out
    n = 0
    if x.numel():  # coordinates past `size` are counted, not written
        n = _nonzero(out._nd, I.flat(x), np.array(x.shape, np.int64),
                     np.array(x.stride(), np.int64), _keep_bits(x))
        core.launch("gpsimd", x.numel(), x._nd.nbytes + out._nd.nbytes)
    if n < size:
        out._nd[n:] = fill_value  # a memset of the tail rows
        core.launch("dma", (size - n) * x.dim(), (size - n) * x.dim() * 8)
    return out
