"""Advanced indexing (`x[idx]`, `x[mask]`, index_put with and without accumulate), put and
index_reduce: part of the indexing family, on its kernels (ops/indexing.py).

An index block becomes one tensor of element offsets into the indexed tensor; a read is a
`take` along it, a write a `put`, an accumulating write a `put_reduce` in the destination
dtype, as the CPU adds.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import indexing as I
from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import clone, fill
from neuron_eager.ops.jit import njit
from neuron_eager.ops.overlap import has_internal_overlap
from neuron_eager.ops.registry import register
from neuron_eager.ops.sourceline import warn_at_user_line

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor


# -- advanced indexing (index.Tensor, index_put) ---------------------------------------------
_LINEAR_FIRST = E.Elementwise("index_offset0", njit(lambda i, n, st: (i + n if i < 0 else i) * st),
                              nparams=2)
_LINEAR_NEXT = E.Elementwise("index_offset", njit(
    lambda acc, i, n, st: acc + (i + n if i < 0 else i) * st), nparams=2)


def _expand_masks(x, indices):
    """Bool/byte masks -> long index tensors (one per masked dim); checks like the CPU."""
    out = []
    for k, idx in enumerate(indices):
        if idx is None:
            out.append(None)
            continue
        if idx.dtype in (torch.bool, torch.uint8):
            d = len(out)
            if tuple(idx.shape) != tuple(x.shape[d:d + idx.dim()]):
                raise IndexError(f"The shape of the mask {list(idx.shape)} at index {k} does not "
                                 f"match the shape of the indexed tensor {list(x.shape)} at "
                                 f"index {d}")
            mask = I.on_device(idx)
            if mask.dtype == torch.uint8:
                warn_at_user_line("indexing with dtype torch.uint8 is now deprecated, please use "
                                  "a dtype torch.bool instead.")
                mask = mask.to(torch.bool)
            if idx.dim() == 0:
                mask = mask.reshape(1)
            coords = aten.nonzero.default(mask)
            # an empty selection: separate tensors (views of a 0-byte storage cannot be offset)
            out.extend([T.empty((0,), torch.int64)] * mask.dim() if not coords.numel() else
                       coords.unbind(1))
        elif idx.dtype in (torch.int64, torch.int32):
            out.append(I.as_long(idx))
        else:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    return out


def _plan(x, indices):
    """Where advanced indexing reads: (rest shape/strides with the index block, offsets, pos).

    Returns the result shape, the strides of x for that shape (0 on index dims), the
    element-offset tensor L (the broadcast shape of the indices) and its strides.
    """
    if not any(i is not None for i in indices):
        raise IndexError("at least one index must be provided")
    indices = _expand_masks(x, indices)
    if len(indices) > x.dim():
        raise IndexError(f"too many indices for tensor of dimension {x.dim()} "
                         f"(got {len(indices)})")
    indices += [None] * (x.dim() - len(indices))
    dims = [d for d, i in enumerate(indices) if i is not None]
    try:
        bshape = tuple(torch.broadcast_shapes(*[indices[d].shape for d in dims]))
    except RuntimeError:
        shapes = ", ".join(str(list(indices[d].shape)) for d in dims)
        raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together "
                         f"with shapes {shapes}") from None
    for d in dims:  # (the CPU checks the rest in its loop: a result without elements, never)
        if x.shape[d] == 0 and indices[d].numel():
            raise IndexError("index is out of bounds for dimension with size 0")
    if math.prod(bshape) * math.prod(x.shape[d] for d in range(x.dim()) if d not in dims):
        for d in dims:
            I.check_bounds(indices[d], x.shape[d], d, True, "index")
    offsets = None
    for d in dims:
        params = [x.shape[d], x.stride(d)]
        offsets = (E.run(_LINEAR_FIRST, [indices[d]], params) if offsets is None
                   else E.run(_LINEAR_NEXT, [offsets, indices[d]], params))
    rest = [d for d in range(x.dim()) if d not in dims]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    pos = sum(1 for d in rest if d < dims[0]) if adjacent else 0
    shape = [x.shape[d] for d in rest]
    xstr = [x.stride(d) for d in rest]
    shape[pos:pos] = bshape
    xstr[pos:pos] = [0] * len(bshape)
    ostr = [0] * len(rest)
    ostr[pos:pos] = offsets.stride()
    return tuple(shape), xstr, offsets, ostr


def _take_offsets(out, x, xstr, offsets, ostr):
    """out = x at offsets: a take along a virtual dim of stride 1 and unbounded size."""
    if out.numel():
        I.launch4(I._take, [I.flat(out), I.flat(x), I.flat(offsets, raw=False)], out.shape,
                  [out.stride(), xstr, ostr], 1, 0)
        core.launch("gpsimd", out.numel(), 2 * out._nd.nbytes + offsets._nd.nbytes)
    return out


@register(aten.index.Tensor)
def index(x, indices):
    _check_indexed_here(x)
    shape, xstr, offsets, ostr = _plan(x, list(indices))
    return _take_offsets(T.empty(shape, x.dtype), x, xstr, offsets, ostr)


def _check_indexed_here(x) -> None:
    """A host tensor indexed by neuron indices: refused in CUDA's words (indices follow the
    tensor they index, or stay on the host)."""
    if not isinstance(x, NeuronTensor):
        raise RuntimeError(f"indices should be either on cpu or on the same device as the "
                           f"indexed tensor ({x.device})")


def _index_put_into(dst, indices, values, accumulate):
    """dst[indices] = values (or += with accumulate), written in place into dst."""
    if not isinstance(dst, NeuronTensor) and isinstance(values, NeuronTensor) and \
            values.dim() == 0 and not any(isinstance(i, NeuronTensor) for i in indices):
        # a host tensor written with a neuron 0-dim value (cpu_x[mask] = loss): the value
        # comes to the host, as CUDA's index_put_ takes a 0-dim value of another device
        return aten.index_put_.default(dst, indices, values.cpu(), accumulate)
    _check_indexed_here(dst)
    mask = indices[0] if len(indices) == 1 else None
    if (not accumulate and isinstance(mask, NeuronTensor) and mask.dtype == torch.bool
            and mask.shape == dst.shape and values.numel() == 1 and dst.is_contiguous()):
        # x[mask] = v as the CPU runs it: a masked fill with the value as a scalar (so of any
        # dtype that fits); optimizers write these (Rprop: three per parameter a step)
        from neuron_eager.ops.masking import masked_fill_

        return masked_fill_(dst, mask, values.item())
    if values.dtype != dst.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{T.dtype_name(dst.dtype)} for the destination and "
                           f"{T.dtype_name(values.dtype)} for the source.")
    if not isinstance(values, NeuronTensor):
        T.check_foreign(values)  # (a 0-dim value from the host only, as CUDA's index_put_)
        values = T.from_cpu(values)
    indices = _expand_masks(dst, list(indices))
    shape, xstr, offsets, ostr = _plan(dst, indices)
    try:
        fits = tuple(torch.broadcast_shapes(values.shape, shape)) == tuple(shape)
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot "
                           f"be broadcast to indexing result of shape {list(shape)}")
    if values._storage is dst._storage:
        values = I._clone(values)
    vstr = I._bstrides(values, shape)  # (the clone's: a dense copy of a sparse layout)
    if not T.numel(shape):
        return dst
    if not accumulate:
        I.launch4(I._put, [I.flat(dst), I.flat(values), I.flat(offsets, raw=False)], shape,
                  [xstr, vstr, ostr], 1, 0)
        core.launch("gpsimd", T.numel(shape), 2 * T.numel(shape) * dst.element_size())
        return dst
    # Duplicates accumulate straight into the destination, rounding after each add: the
    # DMA engine's accumulate-on-write works in the destination dtype, and the CPU kernel
    # does the same (fp32 partial sums would differ from it once duplicates pile up).
    acc = dst
    compute = numerics.compute_type(acc.dtype)
    kernel = I._reducer("sum", numerics.CODE[values.dtype], numerics.CODE[acc.dtype], compute)
    arrays = [I.flat(acc, raw=False), I.flat(values, raw=False), I.flat(offsets, raw=False)]
    I.launch4(kernel, arrays, shape, [xstr, vstr, ostr], 1, 0, numerics.scalar_for(1, compute),
              -(1 << 62))
    core.launch("gpsimd", T.numel(shape), 3 * T.numel(shape) * acc.element_size())
    return dst


@register(aten.index_put.default)
def index_put(x, indices, values, accumulate=False):
    # (the CPU's is x.clone(preserve_format).index_put_(...): x's layout)
    return _index_put_into(clone(x), indices, values, accumulate)


@register(aten.index_put_.default)
def index_put_(x, indices, values, accumulate=False):
    _warn_if_expanded(x)
    if T.shares_memory([x], [values, *indices]):  # Note [Writes into their own inputs]
        T.run_on_cpu(aten.index_put_.default, (x, indices, values, accumulate), {})
    return _index_put_into(x, indices, values, accumulate)


def _warn_if_expanded(x) -> None:
    if has_internal_overlap(x):
        warn_at_user_line("Use of index_put_ on expanded tensors is deprecated. Please clone() "
                          "the tensor before performing this operation. This also applies to "
                          "advanced indexing e.g. tensor[indices] = tensor")


@register(aten._index_put_impl_.default)
def _index_put_impl_(x, indices, values, accumulate=False, unsafe=False):
    _warn_if_expanded(x)
    if T.shares_memory([x], [values, *indices]):
        T.run_on_cpu(aten._index_put_impl_.default, (x, indices, values, accumulate,
                                                            unsafe), {})
    return _index_put_into(x, indices, values, accumulate)


# -- put, index_reduce -----------------------------------------------------------------------
@register(aten.put.default)
def put_flat(x, index, source, accumulate=False):
    """x.flatten()[index] = source (+= with accumulate), on a copy of x."""
    I.require_long(index, "put_")
    if source.dtype != x.dtype:
        raise RuntimeError(f"put_(): self and source expected to have the same dtype, but got "
                           f"self.dtype = {T.dtype_name(x.dtype)} and source.dtype = "
                           f"{T.dtype_name(source.dtype)}")
    if source.numel() != index.numel():
        raise IndexError(f"put_(): Expected source and index to have the same number of "
                         f"elements, but got source.numel() = {source.numel()}, index.numel() = "
                         f"{index.numel()}")
    n = x.numel()
    idx = I.contiguous(I.on_device(index)).reshape(-1)
    a = idx._nd
    if a.size and (a.min() < -n or a.max() >= n):
        bad = a[np.flatnonzero((a < -n) | (a >= n))[0]]
        raise IndexError(f"out of range: tried to access index {bad} on a tensor of {n} "
                         "elements.")
    out = clone(x)  # (x.clone(preserve_format).put_(...) on the CPU: dense, in x's layout)
    flat_out = I.view(out, (n,), (1,))
    if not out.is_contiguous() and a.size:  # (x's element order: where each one lies)
        pos = np.unravel_index(np.where(a < 0, a + n, a), out.shape)
        idx = T.from_cpu(torch.from_numpy(sum(p * s for p, s in zip(pos, out.stride()))))
    src = I.contiguous(I.on_device(source)).reshape(-1)
    k = idx.numel()
    if accumulate:  # into the output dtype, as index_put does (see _index_put_into)
        I.put_reduce(flat_out, src, 0, idx, (k,), [1], [1])
    else:
        I.put(flat_out, src, 0, idx, (k,), [1], [1])
    return out


@register(aten.index_reduce.default)
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or "
                           f"amin but got {reduce}.")
    I.check_index_func("index_reduce_", x, dim, index, source)
    I.meta_call(aten.index_reduce.default, x, dim, index, source, reduce,
              include_self=include_self)
    index = I.as_long(index)
    x1, s1 = I._as1d(x), I._as1d(source)
    dim = dim % x1.dim()
    I.check_bounds(index, x1.shape[dim], dim, False, "select")
    acc = I.accumulator(x1)
    istr = I._dim_only(index, s1.dim(), dim)
    if not include_self:  # indexed slices start from the reduction's identity
        I.put_reduce(acc, I._identity(reduce, acc.dtype), dim, index, s1.shape,
                     [0] * s1.dim(), istr, "set")
    I.put_reduce(acc, s1, dim, index, s1.shape, s1.stride(), istr,
                 "sum" if reduce == "mean" else reduce)
    if reduce == "mean":
        counts = fill(T.empty(acc.shape, acc.dtype), int(include_self))
        I.put_reduce(counts, I._one(acc.dtype), dim, index, s1.shape, [0] * s1.dim(), istr)
        counts = aten.clamp_min.default(counts, 1)
        mode = None if acc.dtype.is_floating_point else "floor"
        acc = aten.div.Tensor_mode(acc, counts, rounding_mode=mode)
    return I._shaped(I.finish(acc, x.dtype), x)
