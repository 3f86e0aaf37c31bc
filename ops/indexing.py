"""Indexing ops: gathers and scatters along a dimension, embedding (embedding_bag in bags.py;
advanced indexing, put and index_reduce in advanced_indexing.py).

All of them run on the GpSimd engine through two data-movement kernels over raw
element bits (`take`: out[i] = src[idx[i]], `put`: out[idx[i]] = src[i]) and one
accumulating kernel (`put_reduce`: fp32 accumulation, rounded once on store; index_put
and put with accumulate=True add into the destination dtype instead, as the CPU does).
Indices are validated on the whole index tensor before anything is written.
"""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import torch
from torch._decomp import decomposition_table

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import kernelgen, numerics, workers
from neuron_eager.ops.meta import as_cpu_kernels, in_cpu_words
from neuron_eager.ops import overlap
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import clone, fill
from neuron_eager.ops.jit import fma, njit
from neuron_eager.ops.registry import on_autograd_key, register
from neuron_eager.ops.unsupported import refuse_sparse_gradient
from neuron_eager.ops.views import meta_like

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor
_RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_JIT = kernelgen.JIT_OPTIONS


# -- memory helpers ------------------------------------------------------------------------
def flat(t: NeuronTensor, raw: bool = True) -> np.ndarray:
    """A 1-D array over t's storage, starting at t's first element (raw bits by default).

    Kernels address it with t's strides, so any layout works without a copy.
    """
    dtype = T.STORAGE_DTYPE[t.dtype]
    extent = max(T.storage_extent(t.shape, t.stride(), 0), 1)
    avail = t._storage.nbytes // dtype.itemsize - t.storage_offset()
    return np.ndarray((min(extent, max(avail, 0)),), _RAW[dtype.itemsize] if raw else dtype,
                      t._storage.buffer, t.storage_offset() * dtype.itemsize)


def view(t: NeuronTensor, shape, stride, extra_offset: int = 0) -> NeuronTensor:
    return T.make(t._storage, tuple(shape), tuple(stride), t.storage_offset() + extra_offset,
                  t.dtype)


def on_device(t: torch.Tensor) -> NeuronTensor:
    """Index tensors may come from the host (as CUDA allows): copy them over."""
    return t if isinstance(t, NeuronTensor) else T.from_cpu(t.contiguous())


def as_long(t: torch.Tensor) -> NeuronTensor:
    t = on_device(t)
    return t if t.dtype == torch.int64 else t.to(torch.int64)


class Meta(NamedTuple):
    shape: tuple
    stride: tuple
    dtype: torch.dtype


_meta_cache: dict = {}
meta_stats = {"hits": 0, "misses": 0, "size": 0}


def _freeze(v):
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.stride(), v.dtype)
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(u) for u in v)
    return (type(v), v)


def _melt(v):
    if isinstance(v, torch.Tensor):
        return meta_like(v)
    if isinstance(v, (list, tuple)):
        return [_melt(u) for u in v]
    return v


_SIZE = re.compile(r"torch\.Size\((\[[^\]]*\])\)")


def meta_call(op, *args, **kwargs) -> Meta:
    """Run `op` on meta stand-ins: the CPU's argument errors, and the result's layout.

    Successful results are cached by the arguments' shapes, strides, dtypes and values,
    since the meta kernels (often Python references) cost far more than the data movement.
    """
    try:
        key = (op, _freeze(args), _freeze(tuple(sorted(kwargs.items()))))
        hit = _meta_cache.get(key)
    except TypeError:  # an unhashable argument
        key, hit = None, None
    if hit is not None:
        meta_stats["hits"] += 1
        return hit
    meta_stats["misses"] += 1
    try:
        with as_cpu_kernels():
            out = op(*_melt(args), **{k: _melt(v) for k, v in kwargs.items()})
    except RuntimeError as e:  # the meta kernels print torch.Size([..]) where the CPU says [..]
        in_cpu_words(op, args, kwargs)  # (Note [Errors in the CPU's words] in ops/meta.py)
        raise type(e)(_SIZE.sub(r"\1", str(e))) from None
    result = Meta(tuple(out.shape), out.stride(), out.dtype)
    if key is not None:
        if len(_meta_cache) > 20000:
            _meta_cache.clear()
        _meta_cache[key] = result
        meta_stats["size"] = len(_meta_cache)
    return result


def check_bounds(idx: NeuronTensor, n: int, dim: int, negative_ok: bool, style: str) -> None:
    """Raise as the CPU does if any index is outside [-n, n) (or [0, n)), before any write."""
    a = idx._nd
    if a.size == 0:
        return
    lo = -n if negative_ok else 0
    if a.min() >= lo and a.max() < n:
        return
    flat = a.reshape(-1)
    at = np.flatnonzero((flat < lo) | (flat >= n))[0]
    raise _BOUNDS_ERRORS[style](flat[at], at, n, dim)


# check_bounds' styles: the error each CPU kernel raises for an index out of range
_BOUNDS_ERRORS = {
    "select": lambda bad, at, n, dim: IndexError("index out of range in self"),
    "select_dim1": lambda bad, at, n, dim: RuntimeError(  # (the CPU's index_select along dim 1)
        f"INDICES element is out of DATA bounds, id={bad} axis_dim={n}"),
    "index": lambda bad, at, n, dim: IndexError(
        f"index {bad} is out of bounds for dimension {dim} with size {n}"),
    "scatter": lambda bad, at, n, dim: RuntimeError(
        f"index {bad} is out of bounds for dimension {dim} with size {n}"),
    "index_copy": lambda bad, at, n, dim: IndexError(
        f"index_copy_(): index {bad} is out of bounds for dimension {dim} with size {n}"),
    "take": lambda bad, at, n, dim: IndexError(
        f"out of range: tried to access index {bad} on a tensor of {n} elements."),
    "bag": lambda bad, at, n, dim: RuntimeError(
        f"Index {at} of input takes value {bad} which is not in the valid range [0, {n})"),
}


def _bstrides(t: torch.Tensor, shape) -> list[int]:
    return E.broadcast_strides(t, shape)


# -- kernels -------------------------------------------------------------------------------
@njit(**_JIT)
def _take(out, src, idx, shape, ostr, sstr, istr, sdim, n):
    # (offsets are made unsigned once computed: a signed index makes Numba test it for
    # negative wraparound at every access, and the gather ran 3x slower)
    d0, d1, d2, d3 = shape
    os3, ss3, is3 = ostr[3], sstr[3], istr[3]
    for i0 in range(d0):
        for i1 in range(d1):
            for i2 in range(d2):
                o = i0 * ostr[0] + i1 * ostr[1] + i2 * ostr[2]
                s = i0 * sstr[0] + i1 * sstr[1] + i2 * sstr[2]
                j = i0 * istr[0] + i1 * istr[1] + i2 * istr[2]
                if is3 == 0:  # one index for the whole row (embedding, index_select): a row copy
                    k = idx[j]
                    s += (k + n if k < 0 else k) * sdim
                    uo, us = np.uint64(o), np.uint64(s)
                    if os3 == 1 and ss3 == 1:
                        for i3 in range(d3):
                            out[uo + np.uint64(i3)] = src[us + np.uint64(i3)]
                    else:
                        for i3 in range(d3):
                            out[np.uint64(o + i3 * os3)] = src[np.uint64(s + i3 * ss3)]
                else:
                    for i3 in range(d3):
                        k = idx[np.uint64(j + i3 * is3)]
                        k = k + n if k < 0 else k
                        out[np.uint64(o + i3 * os3)] = src[np.uint64(s + i3 * ss3 + k * sdim)]


@njit(**_JIT)
def _put(out, src, idx, shape, ostr, sstr, istr, odim, n):
    d0, d1, d2, d3 = shape
    os3, ss3, is3 = ostr[3], sstr[3], istr[3]
    for i0 in range(d0):
        for i1 in range(d1):
            for i2 in range(d2):
                o = i0 * ostr[0] + i1 * ostr[1] + i2 * ostr[2]
                s = i0 * sstr[0] + i1 * sstr[1] + i2 * sstr[2]
                j = i0 * istr[0] + i1 * istr[1] + i2 * istr[2]
                if is3 == 0:  # one index for the whole row: a row copy
                    k = idx[j]
                    o += (k + n if k < 0 else k) * odim
                    for i3 in range(d3):
                        out[o + i3 * os3] = src[s + i3 * ss3]
                else:
                    for i3 in range(d3):
                        k = idx[j + i3 * is3]
                        out[o + i3 * os3 + (k + n if k < 0 else k) * odim] = src[s + i3 * ss3]


def _make_put_reduce(combine, load, lacc, sacc):
    @njit(**_JIT)
    def put_reduce(acc, src, idx, shape, astr, sstr, istr, adim, n, alpha, skip):
        # (unsigned offsets, as in _take; one index for a whole inner run, as index_add_ over
        # rows and scatter_add_ with an expanded index give, updates the run as a row)
        d0, d1, d2, d3 = shape
        as3, ss3, is3 = astr[3], sstr[3], istr[3]
        for i0 in range(d0):
            for i1 in range(d1):
                for i2 in range(d2):
                    a = i0 * astr[0] + i1 * astr[1] + i2 * astr[2]
                    s = i0 * sstr[0] + i1 * sstr[1] + i2 * sstr[2]
                    j = i0 * istr[0] + i1 * istr[1] + i2 * istr[2]
                    if is3 == 0:
                        k = idx[np.uint64(j)]
                        k = k + n if k < 0 else k
                        if k == skip:
                            continue
                        ua, us = np.uint64(a + k * adim), np.uint64(s)
                        if as3 == 1 and ss3 == 1:
                            for i3 in range(d3):
                                p = ua + np.uint64(i3)
                                acc[p] = sacc(combine(lacc(acc[p]), load(src[us + np.uint64(i3)]),
                                                      alpha))
                        else:
                            for i3 in range(d3):
                                p = np.uint64(a + k * adim + i3 * as3)
                                acc[p] = sacc(combine(lacc(acc[p]),
                                                      load(src[np.uint64(s + i3 * ss3)]), alpha))
                        continue
                    for i3 in range(d3):
                        k = idx[np.uint64(j + i3 * is3)]
                        k = k + n if k < 0 else k
                        if k == skip:
                            continue
                        p = np.uint64(a + i3 * as3 + k * adim)
                        acc[p] = sacc(combine(lacc(acc[p]), load(src[np.uint64(s + i3 * ss3)]),
                                              alpha))

    return put_reduce


@njit(inline="always")
def _max_nan(a, b):
    return a if (a != a or a > b) else b


@njit(inline="always")
def _min_nan(a, b):
    return a if (a != a or a < b) else b


COMBINE = {
    # (one rounding, as the CPU's add_(alpha=) of a slice: Note [Fused multiply-adds])
    "sum": njit(inline="always")(lambda a, v, alpha: fma(alpha, v, a)),
    "prod": njit(inline="always")(lambda a, v, alpha: a * v),
    "amax": njit(inline="always")(lambda a, v, alpha: _max_nan(a, v)),
    "amin": njit(inline="always")(lambda a, v, alpha: _min_nan(a, v)),
    "set": njit(inline="always")(lambda a, v, alpha: v),
}
_reducers: dict = {}


def _reducer(op: str, src_code: str, acc_code: str, compute: str):
    key = (op, src_code, acc_code, compute)
    fn = _reducers.get(key)
    if fn is None:
        fn = _reducers[key] = _make_put_reduce(
            COMBINE[op], numerics.loader(src_code, compute), numerics.loader(acc_code, compute),
            numerics.storer(acc_code))
    return fn


def launch4(kernel, arrays, shape, strides, *extra) -> None:
    """Run a 4-deep strided kernel over `shape` (any rank: dims merged, or sliced past 4)."""
    shape, strides = kernelgen.coalesce(list(shape), [list(s) for s in strides])
    if len(shape) > 4:
        for i in range(shape[0]):
            launch4(kernel, [a[i * st[0]:] for a, st in zip(arrays, strides)], shape[1:],
                    [st[1:] for st in strides], *extra)
        return
    pad = 4 - len(shape)
    kernel(*arrays, tuple([1] * pad + shape), *(tuple([0] * pad + st) for st in strides), *extra)


def _zero_dim(strides, dim):
    strides = list(strides)
    strides[dim] = 0
    return strides


def take(out: NeuronTensor, src: NeuronTensor, dim: int, idx: NeuronTensor,
         istrides) -> NeuronTensor:
    """out[..., i, ...] = src[..., idx[..i..], ...] iterating over out's shape."""
    if out.numel():
        launch4(_take, [flat(out), flat(src), flat(idx, raw=False)], out.shape,
                [out.stride(), _zero_dim(src.stride(), dim), istrides], src.stride(dim),
                src.shape[dim])
        core.launch("gpsimd", out.numel(), 2 * out._nd.nbytes + idx._nd.nbytes)
    return out


def put(out: NeuronTensor, src: NeuronTensor, dim: int, idx: NeuronTensor, shape,
        sstrides, istrides) -> NeuronTensor:
    """out[..., idx[..i..], ...] = src[..., i, ...] iterating over `shape` (the index's)."""
    if T.numel(shape):
        launch4(_put, [flat(out), flat(src), flat(idx, raw=False)], shape,
                [_zero_dim(out.stride(), dim), sstrides, istrides], out.stride(dim),
                out.shape[dim])
        core.launch("gpsimd", T.numel(shape), 2 * T.numel(shape) * out.element_size())
    return out


def put_reduce(acc: NeuronTensor, src: NeuronTensor, dim: int, idx: NeuronTensor, shape,
               sstrides, istrides, op: str = "sum", alpha=1, skip: int = -(1 << 62)) -> None:
    """acc[..., idx[..i..], ...] = op(acc[...], src[..., i, ...]) over `shape`, in order."""
    if not T.numel(shape):
        return
    compute = numerics.compute_type(acc.dtype)
    kernel = _reducer(op, numerics.CODE[src.dtype], numerics.CODE[acc.dtype], compute)
    arrays = [flat(acc, raw=False), flat(src, raw=False), flat(idx, raw=False)]
    strides = [_zero_dim(acc.stride(), dim), sstrides, istrides]
    extra = (acc.stride(dim), acc.shape[dim], numerics.scalar_for(alpha, compute), skip)
    if _rows_apart(acc, src, idx, dim, shape):
        def rows(lo, hi):
            launch4(kernel, [a[lo * st[0]:] for a, st in zip(arrays, strides)],
                    [hi - lo, *shape[1:]], strides, *extra)

        workers.split_rows(rows, shape[0], [])
    else:
        launch4(kernel, arrays, shape, strides, *extra)
    core.launch("gpsimd", T.numel(shape), 3 * T.numel(shape) * acc.element_size())


def _rows_apart(acc, src, idx, dim: int, shape) -> bool:
    """Whether a large put_reduce may run a share of its first dim per core: that dim is one
    of acc's own (not the one indexed), and acc is contiguous and shares no memory with the
    operands, so each share updates only its own rows of acc, in the order it would alone."""
    return (dim != 0 and len(shape) > 1 and shape[0] > 1 and T.numel(shape) >= workers.SPLIT_MIN
            and type(src) is NeuronTensor and acc.is_contiguous()
            and src._storage is not acc._storage and idx._storage is not acc._storage)


def accumulator(x: NeuronTensor) -> NeuronTensor:
    """A fresh copy of x to accumulate into: fp32 for 16-bit floats (rounded once later)."""
    dtype = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    return E.copy_into(T.empty(x.shape, dtype), x)


def finish(acc: NeuronTensor, dtype: torch.dtype) -> NeuronTensor:
    return acc if acc.dtype == dtype else E.copy_into(T.empty(acc.shape, dtype), acc)


def _dim_only(t: torch.Tensor, ndim: int, dim: int) -> list[int]:
    strides = [0] * ndim
    strides[dim] = t.stride(0) if t.dim() else 0
    return strides


def _as1d(t: NeuronTensor) -> NeuronTensor:
    """0-dim tensors act as 1-element vectors (undone by `_shaped`)."""
    return view(t, (1,), (1,)) if t.dim() == 0 else t


def _shaped(t: NeuronTensor, like: torch.Tensor) -> NeuronTensor:
    return view(t, (), ()) if like.dim() == 0 else t


def contiguous(t: NeuronTensor) -> NeuronTensor:
    return t if t.is_contiguous() else t.contiguous()


# -- argument checks the meta kernels leave out ------------------------------------------------
# The kernels trust these (a 2-D index or a source of another shape made them read and write
# outside their tensors); the wording and error types are the CPU's.
def check_index_select(x, dim, index) -> None:
    T.wrap_dim(dim, x.dim())
    if index.dim() > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if index.dtype not in (torch.int32, torch.int64):
        raise RuntimeError("index_select(): Expected dtype int32 or int64 for index")
    if x.dim() == 0 and index.numel() != 1:
        raise RuntimeError(f"index_select(): Index to scalar can have only 1 value, got "
                           f"{index.numel()} value(s)")


def check_index_func(func: str, x, dim, index, source) -> None:
    """index_add_ / index_reduce_ (`func`): index a vector of int32/int64, one per slice of
    `source` along `dim`, whose other sizes are those of `x`."""
    dim = T.wrap_dim(dim, x.dim())
    if index.dim() > 1:
        raise IndexError(f"{func}(): Index is supposed to be a vector, but got dim: "
                         f"{index.dim()} with type: {T.dtype_name(index.dtype)} and size: "
                         f"{list(index.shape)}")
    if index.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"{func}(): Expected dtype int32/int64 for index but got: "
                           f"{T.dtype_name(index.dtype)}")
    if x.dtype != source.dtype:
        raise RuntimeError(f"{func}(): self ({T.dtype_name(x.dtype)}) and source "
                           f"({T.dtype_name(source.dtype)}) must have the same scalar type")
    if not (dim == 0 or dim < source.dim()):
        raise IndexError(f"{func}(): Indexing dim {dim} is out of bounds of the source tensor "
                         f"with dim {source.dim()}")
    count = 1 if source.dim() == 0 else source.shape[dim]
    if index.numel() != count:
        if source.dim() == 0:  # (the CPU's message asks a scalar for its size, which raises)
            raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
        raise RuntimeError(f"{func}(): Number of indices ({index.numel()}) should be equal to "
                           f"source.size(dim): ({count}), for dim: {dim}")
    xs, ss = list(x.shape), list(source.shape)
    if x.dim() and source.dim():
        del xs[dim], ss[dim]
    if xs != ss:
        raise RuntimeError(f"source tensor shape must match self tensor shape, excluding the "
                           f"specified dimension. Got self.shape = {list(x.shape)} "
                           f"source.shape = {list(source.shape)}")


# -- index_select, embedding, index_add ------------------------------------------------------
@register(aten.index_select.default)
def index_select(x, dim, index):
    check_index_select(x, dim, index)
    meta = meta_call(aten.index_select.default, x, dim, index)
    index = as_long(index)
    x1 = _as1d(x)
    dim = dim % x1.dim()
    check_bounds(index, x1.shape[dim], dim, False, "select_dim1" if dim == 1 else "select")
    out = T.empty(meta.shape, x.dtype)
    o1 = _as1d(out)
    take(o1, x1, dim, index, _dim_only(index, o1.dim(), dim))
    return out


@register(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if sparse:
        refuse_sparse_gradient(weight, "Embedding")
    if weight.dim() != 2:
        raise RuntimeError("'weight' must be 2-D")
    if indices.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the "
                           f"following scalar types: Long, Int; but got "
                           f"torch.{T.dtype_name(indices.dtype)}Tensor instead (while checking "
                           f"arguments for embedding)")
    index = contiguous(as_long(indices))
    check_bounds(index, weight.shape[0], 0, False, "select")
    out = T.empty(tuple(indices.shape) + (weight.shape[1],), weight.dtype)
    rows = view(out, (index.numel(), weight.shape[1]), (weight.shape[1], 1))
    take(rows, weight, 0, index, [1, 0])
    return out


@register(aten.embedding_renorm_.default)
def embedding_renorm_(weight, indices, max_norm, norm_type):
    """nn.Embedding(max_norm=...): each row looked up whose norm exceeds max_norm is scaled
    by max_norm / (norm + 1e-7), in place (rows counted once)."""
    if weight.dim() != 2:
        raise RuntimeError("embedding_renorm_: weight must be 2-D")
    rows = aten._unique2.default(aten.reshape.default(as_long(indices), [-1]))[0]
    picked = aten.index_select.default(weight, 0, rows)
    norms = aten.linalg_vector_norm.default(picked, norm_type, [1], True)
    scale = aten.where.ScalarOther(aten.gt.Scalar(norms, max_norm),
                                   aten.reciprocal.default(aten.div.Tensor(
                                       aten.add.Scalar(norms, 1e-7), max_norm)), 1.0)
    aten.index_copy_.default(weight, 0, rows, aten.mul.Tensor(picked, scale))
    return weight


@register(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    index = contiguous(as_long(indices))
    d = grad.shape[-1]
    rows = grad.reshape(index.numel(), d)
    acc = fill(T.empty((num_weights, d), torch.float32), 0)
    skip = padding_idx if padding_idx >= 0 else -(1 << 62)
    put_reduce(acc, rows, 0, index, rows.shape, rows.stride(), [1, 0], skip=skip)
    if scale_grad_by_freq:
        counts = fill(T.empty((num_weights, 1), torch.float32), 0)
        put_reduce(counts, _one(torch.float32), 0, index, (index.numel(), 1), [0, 0], [1, 0])
        acc = aten.div.Tensor(acc, aten.clamp_min.default(counts, 1))
    return finish(acc, grad.dtype)


def _one(dtype):
    return T.from_cpu(torch.ones((), dtype=dtype))


def _index_add(x, dim, index, source, alpha):
    check_index_func("index_add_", x, dim, index, source)
    meta_call(aten.index_add.default, x, dim, index, source, alpha=alpha)
    index = as_long(index)
    x1, s1 = _as1d(x), _as1d(source)
    dim = dim % x1.dim()
    # (the CPU's 1-D kernel raises its own error, its strided one the scatter's)
    check_bounds(index, x1.shape[dim], dim, False, "select" if x.dim() <= 1 else "scatter")
    if x.dim() <= 1 and alpha != 1 and x.dtype == torch.float32:
        s1 = aten.mul.Tensor(s1, alpha)  # (the CPU's 1-D loop rounds source * alpha first)
        alpha = 1
    return x1, s1, dim, index, alpha


@register(aten.index_copy_.default)
def index_copy_(x, dim, index, source):
    overlap.check_no_internal_overlap(x)  # (the CPU's checks; PyTorch's decomposition has none)
    if T.shares_memory([x], [index, source]):  # Note [Writes into their own inputs]
        T.run_on_cpu(aten.index_copy_.default, (x, dim, index, source), {})
    _check_index_copy(x, dim, index, source)
    return _index_copy_into(x, dim, index, source)


@register(aten.index_copy.default)
def index_copy(x, dim, index, source):
    _check_index_copy(x, dim, index, source)
    return _index_copy_into(_clone(x), dim, index, source)


def _index_copy_into(x, dim, index, source):
    """x's slices along dim at `index` = source's, in index order (a repeated index: the last
    wins, as the CPU's loop): one scatter launch (a KV cache's write of a step)."""
    x1, s1, index = _as1d(x), _as1d(source), on_device(index).reshape(-1)
    dim = dim % x1.dim()
    shape = list(x1.shape)
    shape[dim] = index.numel()
    put(x1, s1, dim, index, shape, s1.stride(), _dim_only(index, len(shape), dim))
    return x


def require_long(index, op_name: str) -> None:
    """The CPU's refusal of an index that is not int64 (take, put_, index_copy_)."""
    if index.dtype != torch.int64:
        raise RuntimeError(f"{op_name}(): Expected a long tensor for index, but got "
                           f"{T.dtype_name(index.dtype)}")


def _check_index_copy(x, dim, index, source) -> None:
    require_long(index, "index_copy_")
    if source.dtype != x.dtype:
        raise RuntimeError(f"index_copy_(): self and source expected to have the same dtype, "
                           f"but got (self) {T.dtype_name(x.dtype)} and (source) "
                           f"{T.dtype_name(source.dtype)}")
    meta_call(aten.index_copy.default, x, dim, index, source)  # (shapes: the CPU's errors)
    if isinstance(index, NeuronTensor):  # (a 0-dim x has one slot)
        check_bounds(index, x.shape[dim] if x.dim() else 1, dim, False, "index_copy")


@register(aten.take.default)
def take_elements(x, index):
    require_long(index, "take")  # (the decomposition would index with any integers)
    if isinstance(index, NeuronTensor):
        check_bounds(index, x.numel(), 0, True, "take")
    return decomposition_table[aten.take.default](x, index)


@register(aten.index_add.default)
def index_add(x, dim, index, source, *, alpha=1):
    x1, s1, dim, index, alpha = _index_add(x, dim, index, source, alpha)
    acc = accumulator(x1)
    put_reduce(acc, s1, dim, index, s1.shape, s1.stride(), _dim_only(index, s1.dim(), dim),
               alpha=alpha)
    return _shaped(finish(acc, x.dtype), x)


@register(aten.index_add_.default)
def index_add_(x, dim, index, source, *, alpha=1):
    x1, s1, dim, index, alpha = _index_add(x, dim, index, source, alpha)
    overlap.check_no_internal_overlap(x)
    if T.shares_memory([x], [index, source]):  # Note [Writes into their own inputs]
        T.run_on_cpu(aten.index_add_.default, (x, dim, index, source), {"alpha": alpha})
    if x.dtype in (torch.bfloat16, torch.float16) or s1._storage is x1._storage:
        acc = accumulator(x1)  # fp32 (or a copy safe from aliasing), written back once
        put_reduce(acc, s1, dim, index, s1.shape, s1.stride(), _dim_only(index, s1.dim(), dim),
                   alpha=alpha)
        return E.copy_into(x, _shaped(acc, x))
    put_reduce(x1, s1, dim, index, s1.shape, s1.stride(), _dim_only(index, s1.dim(), dim),
               alpha=alpha)
    return x


# -- gather, scatter ------------------------------------------------------------------------
@register(aten.gather.default)
def gather(x, dim, index, *, sparse_grad=False):
    meta_call(aten.gather.default, x, dim, index)
    index = on_device(index)
    x1, i1 = _as1d(x), _as1d(index)
    dim = dim % x1.dim()
    check_bounds(index, x1.shape[dim], dim, False, "scatter")
    out = T.empty(index.shape, x.dtype)
    take(_as1d(out), x1, dim, i1, i1.stride())
    return out


def _scatter_prep(op, x, dim, index, src, *extra, **kwargs):
    meta_call(op, x, dim, index, src, *extra, **kwargs)
    index = on_device(index)
    x1, i1 = _as1d(x), _as1d(index)
    dim = dim % x1.dim()
    check_bounds(index, x1.shape[dim], dim, False, "scatter")
    if isinstance(src, torch.Tensor):
        s1 = _as1d(on_device(src))
        sstr = s1.stride()
    else:  # a scalar value, broadcast from one element
        numerics.check_fits(src, x.dtype)
        s1 = T.from_cpu(torch.tensor(src, dtype=x.dtype))
        sstr = [0] * i1.dim()
    return x1, i1, s1, sstr, dim


def _clone(x: NeuronTensor) -> NeuronTensor:
    """A contiguous copy (what the CPU's structured index_copy and scatter return)."""
    return E.copy_into(T.empty(x.shape, x.dtype), x)


@register(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    x1, i1, s1, sstr, dim = _scatter_prep(aten.scatter.src if isinstance(src, torch.Tensor)
                                          else aten.scatter.value, x, dim, index, src)
    out = _clone(x1)
    if s1.dtype != x.dtype:
        s1 = s1.to(x.dtype)
    put(out, s1, dim, i1, i1.shape, sstr, i1.stride())
    return _shaped(out, x)


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, dim, index, value):
    index, value = check_index_fill(x, dim, index, value)
    # (the CPU's is x.clone(preserve_format).index_fill_(...): x's layout)
    return _shaped(index_fill_into(clone(_as1d(x)), dim, index, value), x)


def check_index_fill(x, dim, index, value):
    """The CPU's checks of index_fill(_): (the index on the device as int64, the value as a
    Python scalar)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got "
                               f"tensor with {value.dim()} dimension(s).")
        value = value.item()
    if index.dtype != torch.int64:
        raise IndexError("index_fill_(): Expected dtype int64 for index.")
    numerics.check_fits(value, x.dtype)
    if index.dim() > 1:
        raise RuntimeError("Index has to be a vector/scalar")
    meta_call(aten.index_fill.int_Scalar, x, dim, index, value)
    index = as_long(index)
    check_bounds(index, x.shape[dim] if x.dim() else 1, dim, True, "index")
    return index, value


def index_fill_into(out, dim, index, value):
    """`value` into out's slices along dim at `index` (checked), in place."""
    x1 = _as1d(out)
    dim = dim % x1.dim()
    shape = list(x1.shape)
    shape[dim] = index.numel()
    put(x1, T.from_cpu(torch.tensor(value, dtype=out.dtype)), dim, index.reshape(-1), shape,
        [0] * len(shape), _dim_only(index.reshape(-1), len(shape), dim))
    return out


_REDUCE_NAMES = {"add": "sum", "multiply": "prod", "sum": "sum", "prod": "prod", "mean": "mean",
                 "amax": "amax", "amin": "amin"}


@register(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    if reduce not in ("add", "multiply"):
        raise RuntimeError(f"reduce argument must be either add or multiply. Got {reduce}")
    op = aten.scatter.reduce if isinstance(src, torch.Tensor) else aten.scatter.value_reduce
    x1, i1, s1, sstr, dim = _scatter_prep(op, x, dim, index, src, reduce=reduce)
    acc = accumulator(x1)
    put_reduce(acc, s1, dim, i1, i1.shape, sstr, i1.stride(), _REDUCE_NAMES[reduce])
    return _shaped(finish(acc, x.dtype), x)


@register(aten.scatter_add.default)
def scatter_add(x, dim, index, src):
    x1, i1, s1, sstr, dim = _scatter_prep(aten.scatter_add.default, x, dim, index, src)
    acc = accumulator(x1)
    put_reduce(acc, s1, dim, i1, i1.shape, sstr, i1.stride())
    return _shaped(finish(acc, x.dtype), x)


_IDENTITY = {"sum": 0, "mean": 0, "prod": 1, "amax": float("-inf"), "amin": float("inf")}


def _identity(op: str, dtype: torch.dtype) -> NeuronTensor:
    ident = _IDENTITY[op]
    if not dtype.is_floating_point and ident in (float("inf"), float("-inf")):
        # int64 computes in 32 bits on the engines (numerics.py)
        if dtype == torch.bool:
            ident = ident > 0
        else:
            info = torch.iinfo(torch.int32 if dtype == torch.int64 else dtype)
            ident = info.max if ident > 0 else info.min
    return T.from_cpu(torch.tensor(ident, dtype=dtype))


@register(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    reduce = {"max": "amax", "min": "amin"}.get(reduce, reduce)  # the CPU's aliases (not meta's)
    x1, i1, s1, sstr, dim = _scatter_prep(aten.scatter_reduce.two, x, dim, index, src, reduce,
                                          include_self=include_self)
    op = _REDUCE_NAMES[reduce]
    acc = accumulator(x1)
    ishape, istr = i1.shape, i1.stride()
    if not include_self:  # scattered positions start from the reduction's identity
        put_reduce(acc, _identity(op, acc.dtype), dim, i1, ishape, [0] * len(ishape), istr,
                   "set")
    put_reduce(acc, s1, dim, i1, ishape, sstr, istr, "sum" if op == "mean" else op)
    if op == "mean":
        counts = fill(T.empty(acc.shape, acc.dtype), int(include_self))
        put_reduce(counts, _one(acc.dtype), dim, i1, ishape, [0] * len(ishape), istr)
        counts = aten.clamp_min.default(counts, 1)
        mode = None if acc.dtype.is_floating_point else "floor"
        acc = aten.div.Tensor_mode(acc, counts, rounding_mode=mode)
    return _shaped(finish(acc, x.dtype), x)


# -- one_hot ----------------------------------------------------------------------------------
# one_hot is CompositeImplicitAutograd, and ATen skips its value checks on PrivateUse1 (as on
# CUDA, where the scatter it uses asserts on the device; the arange == x path it takes here
# has no such check): out-of-range classes gave rows of zeros. So it has a kernel on the
# autograd key, checking as the CPU does (the host reads min and max).
def one_hot(x, num_classes=-1):
    if x.dtype != torch.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if x.numel() == 0:
        if num_classes <= 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        return T.empty(tuple(x.shape) + (num_classes,), torch.int64)
    low, high = (int(v) for v in aten.aminmax.default(x))
    if low < 0:
        raise RuntimeError("Class values must be non-negative.")
    if num_classes == -1:
        num_classes = high + 1
    elif num_classes <= high:
        raise RuntimeError("Class values must be smaller than num_classes.")
    classes = aten.arange.default(num_classes, dtype=torch.int64, device=x.device)
    return aten._to_copy.default(aten.eq.Tensor(aten.unsqueeze.default(x, -1), classes),
                                 dtype=torch.int64, memory_format=torch.contiguous_format)


on_autograd_key("one_hot", one_hot)
