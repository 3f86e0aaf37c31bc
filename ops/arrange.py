"""Ops that rearrange whole blocks of a tensor: cat, stack, constant_pad_nd, repeat, flip, roll.

Part of the indexing family (imported by ops/indexing.py). Each is a handful of
strided DMA transfers between views (a DMA descriptor may walk any stride,
negative ones included), or a Vector-engine copy where the dtype changes.
Shapes, dtypes and argument errors come from the same op on meta tensors.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import fill
from neuron_eager.ops.registry import register
from neuron_eager.ops.indexing import meta_call

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor


def dma(dst: np.ndarray, src: np.ndarray) -> None:
    """One DMA transfer between two strided views of device memory (same dtype)."""
    if dst.size:
        np.copyto(dst, src)
        core.launch("dma", dst.size, 2 * dst.nbytes)


def _copy(dst: NeuronTensor, src: NeuronTensor) -> None:
    if src.dtype == dst.dtype:
        dma(dst._nd, src._nd)
    elif dst.numel():
        E.copy_into(dst, src)


def _check_devices(tensors):
    for t in tensors:
        if not isinstance(t, NeuronTensor):
            from neuron_eager.ops.router import device_error

            raise device_error(t.device)


def _check_sizes(live, dim):
    """The CPU's wording for mismatched sizes (the meta kernel words it differently)."""
    first = live[0]
    for k, t in enumerate(live[1:], 1):
        if t.dim() != first.dim():
            return
        for d in range(t.dim()):
            if d != dim and t.shape[d] != first.shape[d]:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {dim}. "
                                   f"Expected size {first.shape[d]} but got size {t.shape[d]} "
                                   f"for tensor number {k} in the list.")


@register(aten.cat.default)
def cat(tensors, dim=0):
    live = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]  # legacy: skipped
    if live and live[0].dim() and -live[0].dim() <= dim < live[0].dim():
        _check_sizes(live, dim % live[0].dim())
    _check_devices(tensors)
    meta = meta_call(aten.cat.default, tensors, dim)
    out = T.empty(meta.shape, meta.dtype, meta.stride)
    if not live or not out.numel():
        return out
    dim = dim % live[0].dim()
    pos = 0
    for t in live:
        dst = T.make(out._storage, t.shape, out.stride(), pos * out.stride(dim), out.dtype)
        _copy(dst, t)
        pos += t.shape[dim]
    return out


@register(aten.stack.default)
def stack(tensors, dim=0):
    _check_devices(tensors)
    meta = meta_call(aten.stack.default, tensors, dim)
    out = T.empty(meta.shape, meta.dtype, meta.stride)
    dim = dim % len(meta.shape)
    shape = [s for d, s in enumerate(meta.shape) if d != dim]
    stride = [s for d, s in enumerate(out.stride()) if d != dim]
    for i, t in enumerate(tensors):
        _copy(T.make(out._storage, shape, stride, i * out.stride(dim), out.dtype), t)
    return out


@register(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    meta = meta_call(aten.constant_pad_nd.default, x, pad, value)
    out = fill(T.empty(meta.shape, x.dtype), value)
    dst, src = [slice(None)] * x.dim(), [slice(None)] * x.dim()
    for k in range(len(pad) // 2):
        d = x.dim() - 1 - k
        left, right = pad[2 * k], pad[2 * k + 1]
        n = x.shape[d] - max(-left, 0) - max(-right, 0)
        if n <= 0:
            return out
        src[d] = slice(max(-left, 0), max(-left, 0) + n)
        dst[d] = slice(max(left, 0), max(left, 0) + n)
    dma(out._nd[tuple(dst)], x._nd[tuple(src)])
    return out


@register(aten.repeat.default)
def repeat(x, repeats):
    meta = meta_call(aten.repeat.default, x, repeats)
    out = T.empty(meta.shape, x.dtype)
    if out.numel():
        sizes = [1] * (len(repeats) - x.dim()) + list(x.shape)
        dst = out._nd.reshape([n for r, s in zip(repeats, sizes) for n in (r, s)])
        src = x._nd.reshape([n for s in sizes for n in (1, s)])
        dma(dst, np.broadcast_to(src, dst.shape))
    return out


@register(aten.flip.default)
def flip(x, dims):
    meta_call(aten.flip.default, x, dims)
    out = T.empty(x.shape, x.dtype)
    axes = tuple(d % max(x.dim(), 1) for d in dims) if x.dim() else ()
    dma(out._nd, np.flip(x._nd, axes) if axes else x._nd)
    return out


@register(aten.roll.default)
def roll(x, shifts, dims=()):
    meta_call(aten.roll.default, x, shifts, dims)
    if not dims:
        flat = x.contiguous().view(-1)
        return roll(flat, shifts, [0]).view(x.shape)
    out = T.empty(x.shape, x.dtype)
    if not x.numel():
        return out
    total: dict[int, int] = {}
    for shift, d in zip(shifts, dims):
        total[d % x.dim()] = total.get(d % x.dim(), 0) + shift
    pieces = []
    for d, shift in total.items():
        n = x.shape[d]
        s = shift % n
        pieces.append((d, [(slice(s, n), slice(0, n - s)), (slice(0, s), slice(n - s, n))]))
    for combo in itertools.product(*[p for _, p in pieces]):
        dst, src = [slice(None)] * x.dim(), [slice(None)] * x.dim()
        for (d, _), (ds, ss) in zip(pieces, combo):
            dst[d], src[d] = ds, ss
        dma(out._nd[tuple(dst)], x._nd[tuple(src)])
    return out
