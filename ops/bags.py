"""Reductions over data-dependent runs of rows: embedding_bag and segment_reduce.

Both take offsets (or lengths) from the device and reduce each bag or segment of rows in one
GpSimd kernel; their backward kernels read the bookkeeping the forward returned.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import indexing as I
from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import fill
from neuron_eager.ops.copy import stage_dtype
from neuron_eager.ops.indexing import as_long, check_bounds, contiguous, finish
from neuron_eager.ops.jit import njit
from neuron_eager.ops.registry import register
from neuron_eager.ops.unsupported import refuse_sparse_gradient

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor
_JIT = I._JIT


# -- embedding_bag ---------------------------------------------------------------------------
# Note [embedding_bag outputs]: besides the bags we return offset2bag (the bag of every
# index), bag_size and max_indices, with the CPU's values (torch.embedding_bag returns them):
# mode sum: zeros for both; mean: the non-padding indices per bag, twice; max: that count and
# the row that won each output element (0 in an empty bag, whose count says it has none).
# Our backward reads exactly these.
def _make_bag_forward(load, store):
    @njit(**_JIT)
    def bag_forward(out, offset2bag, bag_size, max_idx, weight, idx, starts, ends, mode, psw,
                    padding_idx):
        dim = weight.shape[1]
        acc = np.zeros(dim, np.float32)
        for b in range(out.shape[0]):
            acc[:] = 0
            count = 0
            for i in range(starts[b], ends[b]):
                offset2bag[i] = b
                k = idx[i]
                if k == padding_idx:
                    continue
                count += 1
                if mode == 2:
                    for d in range(dim):
                        v = load(weight[k, d])
                        if count == 1 or v > acc[d]:
                            acc[d] = v
                            max_idx[b, d] = k
                else:
                    scale = load(psw[i]) if psw.shape[0] else np.float32(1)
                    for d in range(dim):
                        acc[d] += load(weight[k, d]) * scale
            bag_size[b] = count
            if mode == 1 and count:
                for d in range(dim):
                    acc[d] /= np.float32(count)
            for d in range(dim):
                out[b, d] = store(acc[d])

    return bag_forward


def _make_bag_backward(load):
    @njit(**_JIT)
    def bag_backward(gw, grad, idx, offset2bag, bag_size, max_idx, mode, psw, padding_idx,
                     freq):
        if mode == 2:
            for b in range(max_idx.shape[0]):
                for d in range(max_idx.shape[1]):
                    k = max_idx[b, d]
                    if bag_size[b]:
                        gw[k, d] += load(grad[b, d]) / freq[k]
            return
        for i in range(idx.shape[0]):
            k = idx[i]
            if k == padding_idx:
                continue
            b = offset2bag[i]
            scale = load(psw[i]) if psw.shape[0] else np.float32(1)
            if mode == 1:
                scale /= np.float32(bag_size[b])
            scale /= freq[k]
            for d in range(gw.shape[1]):
                gw[k, d] += load(grad[b, d]) * scale

    return bag_backward


_bag_kernels: dict = {}


def _bag_kernel(which: str, code: str, out_code: str = ""):
    key = (which, code, out_code)
    fn = _bag_kernels.get(key)
    if fn is None:
        load = numerics.loader(code, "f32")
        fn = _bag_kernels[key] = (_make_bag_forward(load, numerics.storer(out_code or code))
                                  if which == "forward" else _make_bag_backward(load))
    return fn


# (the CPU's words: an internal check of its kernel, which walks the bags' ends)
_DECREASING_OFFSETS = ("Expected i < index_size to be true, but got false.  (Could this error "
                       "message be improved?  If so, please report an enhancement request to "
                       "PyTorch.)")


def _bags(indices, offsets, include_last_offset):
    idx = contiguous(as_long(indices)).reshape(-1)
    offs = as_long(offsets)._nd.reshape(-1)
    n = idx.numel()
    if offs.size and offs[0] != 0:  # (the host reads both ends, as the CPU's kernel does)
        raise RuntimeError(f"offsets[0] has to be 0, i.e., the first sequence in the "
                           f"mini-batch has to start from position 0. However, got {offs[0]}")
    if offs.size and offs[-1] > n:
        raise RuntimeError(f"offsets[-1] can not be greater than input's length {n} but got "
                           f"offsets[-1] of {offs[-1]}")
    if (np.diff(offs) < 0).any():  # (bags would overlap or turn negative)
        raise RuntimeError(_DECREASING_OFFSETS)
    starts = offs[:-1] if include_last_offset else offs
    ends = offs[1:] if include_last_offset else np.append(offs[1:], n)
    return idx, np.minimum(starts, n), np.minimum(ends, n)


def _embedding_bag_impl(weight, indices, offsets, mode=0, per_sample_weights=None,
                        include_last_offset=False, padding_idx=-1):
    if indices.dim() != 1 or offsets.dim() != 1:
        raise ValueError("input has to be 1D Tensor") if indices.dim() != 1 else \
            ValueError("offsets has to be a 1D Tensor")
    if per_sample_weights is not None and mode != 0:
        raise NotImplementedError("embedding_bag: per_sample_weights was not None. "
                                  "per_sample_weights is only supported for mode='sum'")
    idx, starts, ends = _bags(indices, offsets, include_last_offset)
    check_bounds(idx, weight.shape[0], 0, False, "bag")
    nbags = starts.shape[0]
    w = contiguous(weight)
    out = T.empty((nbags, weight.shape[1]), stage_dtype(weight.dtype))  # (stochastic rounding)
    offset2bag = fill(T.empty((idx.numel(),), torch.int64), 0)
    bag_size = T.empty((nbags,), torch.int64)
    max_idx = T.empty((nbags, weight.shape[1]) if mode == 2 else (nbags,), torch.int64)
    psw = (contiguous(per_sample_weights).reshape(-1)._nd if per_sample_weights is not None
           else np.empty(0, T.STORAGE_DTYPE[weight.dtype]))
    if nbags:
        mi = max_idx._nd if mode == 2 else np.empty((0, 0), np.int64)
        _bag_kernel("forward", numerics.CODE[weight.dtype], numerics.CODE[out.dtype])(
            out._nd, offset2bag._nd, bag_size._nd, mi, w._nd, idx._nd, starts, ends, mode, psw,
            padding_idx)
        core.launch("gpsimd", idx.numel() * weight.shape[1], out._nd.nbytes + idx._nd.nbytes)
    if mode == 0:  # (Note [embedding_bag outputs])
        bag_size._nd[:] = 0
        max_idx._nd[:] = 0
    elif mode == 1:
        max_idx._nd[:] = bag_size._nd
    else:
        max_idx._nd[bag_size._nd == 0] = 0
    return finish(out, weight.dtype), offset2bag, bag_size, max_idx


@register(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    if sparse:
        refuse_sparse_gradient(weight, "EmbeddingBag")
    if indices.is_floating_point() or offsets.is_floating_point() or (
            per_sample_weights is not None and (
                per_sample_weights.dtype != weight.dtype or per_sample_weights.dim() != 1
                or per_sample_weights.numel() != indices.numel())):  # (the CPU's checks)
        T.cpu_refusal(aten._embedding_bag.default, weight, indices, offsets,
                      scale_grad_by_freq, mode, sparse, per_sample_weights,
                      include_last_offset, padding_idx)
    return _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights,
                               include_last_offset, padding_idx)


@register(aten._embedding_bag_backward.default)
def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                            num_weights, scale_grad_by_freq, mode, sparse,
                            per_sample_weights=None, padding_idx=-1):
    if sparse:
        raise NotImplementedError("embedding_bag: sparse gradients are not supported on neuron")
    return _bag_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                         scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@register(aten._embedding_bag_dense_backward.default)
def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
                                  num_weights, scale_grad_by_freq, mode, per_sample_weights=None,
                                  padding_idx=-1):
    return _bag_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                         scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@njit(**_JIT)
def _bag_sample_weights(out, grad, weight, idx, offset2bag, padding_idx):
    for i in range(idx.shape[0]):
        k = idx[i]
        acc = np.float32(0)
        if k != padding_idx:
            b = offset2bag[i]
            for d in range(grad.shape[1]):
                acc += grad[b, d] * weight[k, d]
        out[i] = acc


@register(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
                                               padding_idx=-1):
    """d out[b] / d w_i = grad[b] . weight[idx[i]] (mode sum only)."""
    idx = contiguous(as_long(indices)).reshape(-1)
    g32 = E.copy_into(T.empty(grad.shape, torch.float32), grad)
    w32 = E.copy_into(T.empty(weight.shape, torch.float32), weight)
    out = T.empty((idx.numel(),), torch.float32)
    _bag_sample_weights(out._nd, g32._nd, w32._nd, idx._nd,
                        contiguous(offset2bag)._nd.reshape(-1), padding_idx)
    core.launch("vector", idx.numel() * grad.shape[1], g32._nd.nbytes + w32._nd.nbytes)
    return finish(out, grad.dtype)


def _bag_backward(grad, indices, offset2bag, bag_size, max_indices, num_weights,
                  scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    idx = contiguous(as_long(indices)).reshape(-1)
    gw = fill(T.empty((num_weights, grad.shape[1]), torch.float32), 0)
    freq = np.ones(num_weights, np.float32)
    if scale_grad_by_freq:
        counts = np.bincount(idx._nd, minlength=num_weights).astype(np.float32)
        freq = np.maximum(counts, 1)
    psw = (contiguous(per_sample_weights).reshape(-1)._nd if per_sample_weights is not None
           else np.empty(0, T.STORAGE_DTYPE[grad.dtype]))
    g = contiguous(grad)
    mi = contiguous(max_indices)._nd if mode == 2 else np.empty((0, 0), np.int64)
    _bag_kernel("backward", numerics.CODE[grad.dtype])(
        gw._nd, g._nd, idx._nd, contiguous(offset2bag)._nd.reshape(-1),
        contiguous(bag_size)._nd.reshape(-1), mi, mode, psw, padding_idx, freq)
    core.launch("gpsimd", idx.numel() * grad.shape[1], gw._nd.nbytes + g._nd.nbytes)
    return finish(gw, grad.dtype)


# -- segment_reduce ------------------------------------------------------------------------
# data is viewed as (B, M, K): B the batch dims before `axis`, M the segmented axis, K the
# rest; segment s of batch b covers rows offsets[b, s] .. offsets[b, s + 1] - 1.
_SEGMENT_OPS = {"max": 0, "mean": 1, "min": 2, "sum": 3, "prod": 4}


def _make_segment_forward(load, store):
    @njit(**_JIT)
    def segment_forward(out, data, offsets, op, initial, has_initial):
        for b in range(out.shape[0]):
            for s in range(out.shape[1]):
                start, end = offsets[b, s], offsets[b, s + 1]
                for k in range(out.shape[2]):
                    if op == 0:
                        acc = initial if has_initial else np.float32(-np.inf)
                    elif op == 2:
                        acc = initial if has_initial else np.float32(np.inf)
                    elif op == 4:
                        acc = initial if has_initial else np.float32(1)
                    else:
                        acc = initial if has_initial else np.float32(0)
                    for j in range(start, end):
                        v = load(data[b, j, k])
                        if op == 0:
                            acc = v if (v != v or v > acc) else acc
                        elif op == 2:
                            acc = v if (v != v or v < acc) else acc
                        elif op == 4:
                            acc *= v
                        else:
                            acc += v
                    if op == 1:
                        if end > start:
                            acc /= np.float32(end - start)
                        elif not has_initial:
                            acc = np.float32(np.nan)
                    out[b, s, k] = store(np.float32(acc))

    return segment_forward


def _make_segment_backward(load, store):
    @njit(**_JIT)
    def segment_backward(grad_in, grad, output, data, offsets, op, initial, has_initial):
        for b in range(grad.shape[0]):
            for s in range(grad.shape[1]):
                start, end = offsets[b, s], offsets[b, s + 1]
                for k in range(grad.shape[2]):
                    g = load(grad[b, s, k])
                    out = load(output[b, s, k])
                    if op == 0 or op == 2:
                        # the winners: elements equal to the result, and NaNs (as the CPU)
                        ties = 0
                        for j in range(start, end):
                            v = load(data[b, j, k])
                            if v != v or v == out:
                                ties += 1
                        # ties share a positive gradient; a negative one goes whole to each
                        # (the CPU kernel divides only values > 0)
                        share = g / np.float32(ties) if g > 0 else g
                        for j in range(start, end):
                            v = load(data[b, j, k])
                            hit = v != v or v == out
                            grad_in[b, j, k] = store(share if hit else np.float32(0))
                    elif op == 4:
                        # g * out / v, where v is 0 or NaN: g times the product of the others
                        for j in range(start, end):
                            v = load(data[b, j, k])
                            if v == 0 or v != v:
                                rest = initial if has_initial else np.float32(1)
                                for i in range(start, end):
                                    if i != j:
                                        rest *= load(data[b, i, k])
                                r = g * rest
                            else:
                                r = g * out / v
                            grad_in[b, j, k] = store(r)
                    else:
                        if op == 1:
                            g = g / np.float32(max(end - start, 1))
                        for j in range(start, end):
                            grad_in[b, j, k] = store(g)

    return segment_backward


_segment_kernels: dict = {}


def _segment_kernel(which, code):
    fn = _segment_kernels.get((which, code))
    if fn is None:
        make = _make_segment_forward if which == "forward" else _make_segment_backward
        fn = _segment_kernels[(which, code)] = make(numerics.loader(code, "f32"),
                                                    numerics.storer(code))
    return fn


def _segments(data, lengths, offsets, axis):
    """(B, S + 1) int64 segment offsets, the (B, M, K) data view shape, the output shape."""
    if (lengths is None) == (offsets is None):
        raise RuntimeError("Either lengths or offsets must be defined" if lengths is None else
                           "Only one of lengths or offsets can be defined")
    axis = axis % data.dim()
    B = T.numel(data.shape[:axis])
    K = T.numel(data.shape[axis + 1:])
    if lengths is not None:
        lens = I.as_long(lengths)._nd.reshape(B, -1)
        offs = np.zeros((B, lens.shape[1] + 1), np.int64)
        np.cumsum(lens, axis=1, out=offs[:, 1:])  # a scan on the host-visible lengths
    else:
        offs = np.ascontiguousarray(I.as_long(offsets)._nd.reshape(B, -1))
    S = offs.shape[1] - 1
    shape = tuple(data.shape[:axis]) + (S,) + tuple(data.shape[axis + 1:])
    return offs, (B, data.shape[axis], K), (B, S, K), shape


@register(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
    if reduce not in _SEGMENT_OPS:
        raise RuntimeError(f"unsupported reduction given! {reduce}")
    offs, dshape, oshape, shape = _segments(data, lengths, offsets, axis)
    if (np.diff(offs, axis=1) < 0).any() or \
            lengths is not None and not unsafe and (offs[:, -1] != dshape[1]).any():
        T.cpu_refusal(aten.segment_reduce.default, data, reduce, lengths=lengths, indices=indices,
                      offsets=offsets, axis=axis, unsafe=unsafe, initial=initial)
    src = data.contiguous()
    out = T.empty(shape, data.dtype)
    if out.numel():
        _segment_kernel("forward", numerics.CODE[data.dtype])(
            out._nd.reshape(oshape), src._nd.reshape(dshape), offs, _SEGMENT_OPS[reduce],
            np.float32(0 if initial is None else initial), initial is not None)
        core.launch("vector", data.numel(), src._nd.nbytes + out._nd.nbytes)
    return out


@register(aten._segment_reduce_backward.default)
def _segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0,
                             initial=None):
    offs, dshape, oshape, _ = _segments(data, lengths, offsets, axis)
    grad_in = fill(T.empty(data.shape, data.dtype), 0)  # rows in no segment get nothing
    if data.numel():
        _segment_kernel("backward", numerics.CODE[data.dtype])(
            grad_in._nd.reshape(dshape), grad.contiguous()._nd.reshape(oshape),
            output.contiguous()._nd.reshape(oshape), data.contiguous()._nd.reshape(dshape),
            offs, _SEGMENT_OPS[reduce], np.float32(0 if initial is None else initial),
            initial is not None)
        core.launch("vector", 2 * data.numel(), 3 * grad_in._nd.nbytes)
    return grad_in
