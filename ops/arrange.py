"""Ops that rearrange whole blocks of a tensor: cat, stack, constant_pad_nd, repeat, flip, roll,
rot90, resize_as_; and linspace / logspace given tensor bounds (arange-like generators).

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
from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops import workers
from neuron_eager.ops.copy import channels_last_strides, fill
from neuron_eager.ops.jit import njit
from neuron_eager.ops.registry import register
from neuron_eager.ops.sourceline import warn_at_user_line
from neuron_eager.ops.indexing import meta_call

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor


def dma(dst: np.ndarray, src: np.ndarray) -> None:
    """One DMA transfer between two strided views of device memory (same dtype)."""
    if dst.size:
        np.copyto(dst, src)
        core.launch("dma", dst.size, 2 * dst.nbytes)


def _join(out: NeuronTensor, tensors, dim: int, numpy_join, parts) -> None:
    """out = cat or stack of `tensors` along `dim`: one DMA launch of many descriptors.
    Small results of one dtype are one NumPy call (`numpy_join`: np.concatenate or
    np.stack); larger ones, or parts to convert, go part by part through `parts()`, a list
    of (src, shape, stride, offset) views of out. (A tensor and a launch per part cost ~25
    us each: a cat of 100 small tensors took 2.6 ms.)"""
    dtype = out.dtype
    if out.nbytes < workers.SPLIT_COPY_BYTES and all(t.dtype == dtype for t in tensors):
        numpy_join([t._nd for t in tensors], axis=dim, out=out._nd)
        core.launch("dma", out.numel(), 2 * out.nbytes)
        return
    storage, moved = out._storage, 0
    for src, shape, stride, offset in parts():
        if src.dtype != dtype:  # type promotion: a Vector-engine conversion
            E.copy_into(T.make(storage, shape, stride, offset, dtype), src)
        elif src.numel():
            dst = T.nd_view(storage, shape, stride, offset, dtype)
            workers.copy(dst, src._nd)
            moved += dst.size
    if moved:
        core.launch("dma", moved, 2 * moved * out.element_size())


def _check_devices(tensors):
    for t in tensors:
        if not isinstance(t, NeuronTensor):
            from neuron_eager.ops.router import device_error

            raise device_error(t.device)


def _check_sizes(shapes, dim):
    """The CPU's wording for mismatched sizes (the meta kernel words it differently)."""
    first = shapes[0]
    head, tail = first[:dim], first[dim + 1:]
    for k, shape in enumerate(shapes[1:], 1):
        if len(shape) != len(first) or (shape[:dim] == head and shape[dim + 1:] == tail):
            continue
        d = next(d for d in range(len(shape)) if d != dim and shape[d] != first[d])
        raise RuntimeError(f"Sizes of tensors must match except in dimension {dim}. "
                           f"Expected size {first[d]} but got size {shape[d]} "
                           f"for tensor number {k} in the list.")


def _cat_layout(tensors, shapes, dim):
    """The result's (shape, stride, dtype) where it is plainly contiguous: inputs of one
    dtype and rank (at most 3: no memory format to follow), all contiguous. Else None: the
    meta kernel decides (type promotion, channels-last, legacy empty inputs, errors)."""
    rank, dtype = len(shapes[0]), tensors[0].dtype
    if rank > 3 or not -rank <= dim < rank or any(
            len(s) != rank or t.dtype != dtype or not t.is_contiguous()
            for t, s in zip(tensors, shapes)):
        return None
    dim %= rank
    shape = (*shapes[0][:dim], sum(s[dim] for s in shapes), *shapes[0][dim + 1:])
    return shape, T.contiguous_strides(shape), dtype


@register(aten.cat.default)
def cat(tensors, dim=0):
    shapes = [tuple(t.shape) for t in tensors]
    for k, shape in enumerate(shapes):
        if not shape:
            raise RuntimeError(f"zero-dimensional tensor (at position {k}) cannot be "
                               f"concatenated")
    live = [k for k, shape in enumerate(shapes) if shape != (0,)]  # legacy: (0,) skipped
    rank = len(shapes[live[0]]) if live else 0
    if live and -rank <= dim < rank:
        _check_sizes([shapes[k] for k in live], dim % rank)
    _check_devices(tensors)
    layout = len(live) == len(tensors) and live and _cat_layout(tensors, shapes, dim)
    shape, stride, dtype = layout or meta_call(aten.cat.default, tensors, dim)
    out = T.empty(shape, dtype, stride)
    if not live or not out.numel():
        return out
    dim = dim % rank
    step = stride[dim]

    def parts():
        offsets = itertools.accumulate((shapes[k][dim] * step for k in live[:-1]), initial=0)
        return [(tensors[k], shapes[k], stride, offset) for k, offset in zip(live, offsets)]

    _join(out, [tensors[k] for k in live], dim, np.concatenate, parts)
    return out


@register(aten.stack.default)
def stack(tensors, dim=0):
    _check_devices(tensors)
    meta = meta_call(aten.stack.default, tensors, dim)
    out = T.empty(meta.shape, meta.dtype, meta.stride)
    dim = dim % len(meta.shape)
    shape = [s for d, s in enumerate(meta.shape) if d != dim]
    stride = [s for d, s in enumerate(meta.stride) if d != dim]
    step = meta.stride[dim]
    if out.numel():
        _join(out, tensors, dim, np.stack,
              lambda: [(t, shape, stride, i * step) for i, t in enumerate(tensors)])
    return out


@register(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    meta = meta_call(aten.constant_pad_nd.default, x, pad, value)
    out = fill(T.empty(meta.shape, x.dtype, meta.stride), value)  # (the CPU's layout)
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
    meta = meta_call(aten.flip.default, x, dims)
    out = T.empty(x.shape, x.dtype, meta.stride)  # x's layout where it is dense, as the CPU's
    axes = tuple(d % max(x.dim(), 1) for d in dims) if x.dim() else ()
    dma(out._nd, np.flip(x._nd, axes) if axes else x._nd)
    return out


@register(aten.roll.default)
def roll(x, shifts, dims=()):
    if x.dim() == 0 and len(dims):  # (its meta kernel names the dim it wrapped)
        raise IndexError(f"Dimension specified as {dims[0]} but tensor has no dimensions")
    meta_call(aten.roll.default, x, shifts, dims)
    if not dims:
        flat = x.contiguous().view(-1)
        return roll(flat, shifts, [0]).view(x.shape)
    out = T.empty(x.shape, x.dtype, channels_last_strides(x))  # (the CPU's; not its meta's)
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


@register(aten.rot90.default)
def rot90(x, k=1, dims=(0, 1)):
    meta_call(aten.rot90.default, x, k, dims)  # the CPU's checks of dims
    d0, d1 = dims
    k %= 4  # the CPU's results: transposed views of flips, or a contiguous clone
    if k == 1:
        return flip(x, [d1]).transpose(d0, d1)
    if k == 2:
        return flip(x, [d0, d1])
    if k == 3:
        return flip(x, [d0]).transpose(d0, d1)
    return x.clone(memory_format=torch.contiguous_format)


@register(aten.resize_as_.default)
def resize_as_(x, template, *, memory_format=None):
    # (the template's sizes alone, wherever it lies: a CPU or meta template, as on the CPU)
    if not isinstance(x, T.NeuronTensor):
        return aten.resize_.default(x, list(template.shape), memory_format=memory_format)
    from neuron_eager.ops.views import resize_

    return resize_(x, template.shape, memory_format)


resize_as_.checks_devices = True


# -- linspace / logspace with tensor bounds, and logspace -----------------------------------
@njit(error_model="numpy", nogil=True)
def _logspace(out, start, end, step, base, store):
    n = out.shape[0]
    half = n // 2
    for i in range(n):
        e = start + step * i if i < half else end - step * (n - 1 - i)
        out[i] = store(base ** e)


_F64_STORE = {}


def _store64(code):
    fn = _F64_STORE.get(code)
    if fn is None:
        store = numerics.storer(code)
        if code == "f64":
            fn = njit(inline="always")(lambda v: np.float64(v))
        elif code in numerics.FLOAT_CODES:
            fn = njit(inline="always")(lambda v: store(np.float32(v)))
        else:  # a C++ cast: truncation toward zero
            fn = njit(inline="always")(lambda v: store(np.int64(v)))
        _F64_STORE[code] = fn
    return fn


def _in_dtype(value, dtype):
    """A bound as the CPU kernel holds it: truncated for integers, rounded for floats."""
    if not dtype.is_floating_point:
        return float(int(value))
    code = numerics.CODE[dtype]
    if code in ("bf16", "f16"):
        bits = numerics.storer(code)(np.float32(value))
        return float(numerics.loader(code, "f32")(bits))
    return float(np.float32(value)) if code == "f32" else float(value)


def _logspace_into(out, start, end, steps, base):
    if steps == 1:
        return fill(out, float(base) ** float(start))
    if steps:  # the GpSimd engine computes the exponents and powers in float64, as the CPU
        start, end = _in_dtype(start, out.dtype), _in_dtype(end, out.dtype)
        step = _in_dtype(end - start, out.dtype) / (steps - 1)
        _logspace(out._nd.reshape(-1), start, end, step, float(base),
                  _store64(numerics.CODE[out.dtype]))
        core.launch("gpsimd", steps, out._nd.nbytes)
    return out


# out= forms (torch.fft.fftfreq writes aranges into slices of its result): computed in the
# out tensor's dtype, resized silently as the CPU resizes (arange warns when a non-empty
# out changes size), then copied in
@register(aten.logspace.out)
def logspace_out(start, end, steps, base=10.0, *, out):
    meta = torch.logspace(start, end, steps, base, dtype=out.dtype, device="meta")
    return _into(out, _logspace_into(T.empty(meta.shape, out.dtype), start, end, steps, base))


@register(aten.linspace.out)
def linspace_out(start, end, steps, *, out):
    from neuron_eager.ops.factories import linspace

    return _into(out, linspace(start, end, steps, dtype=out.dtype))


@register(aten.arange.out, aten.arange.start_out)
def arange_out(*args, out):
    from neuron_eager.ops.factories import arange_start_step

    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    result = arange_start_step(start, end, step, dtype=out.dtype)
    if out.numel() not in (0, result.numel()):
        warn_at_user_line(f"The number of elements in the out tensor of shape {list(out.shape)} "
                          f"is {out.numel()} which does not match the computed number of "
                          f"elements {result.numel()}. Note that this may occur as a result of "
                          f"rounding error. The out tensor will be resized to a tensor of shape "
                          f"({result.numel()},).")
    return _into(out, result)


@register(aten.range.out, aten.range.out_)
def range_out(start, end, step=1, *, out):
    from neuron_eager.ops.factories import range_inclusive

    return _into(out, range_inclusive(start, end, step, dtype=out.dtype))


def _into(out, result):
    from neuron_eager.ops.views import resize_

    if tuple(out.shape) != tuple(result.shape):
        resize_(out, result.shape)
    return aten.copy_.default(out, result)


def _bound(t, which, name):
    if not isinstance(t, torch.Tensor):
        return t
    if t.dim() != 0:
        raise RuntimeError(f"{name} only supports 0-dimensional start and end tensors, but got "
                           f"{which} with {t.dim()} dimension(s).")
    return t.item()  # the host reads the bound back


def _logspace_tensor(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None,
                     pin_memory=None):
    start, end = _bound(start, "start", "logspace"), _bound(end, "end", "logspace")
    meta = torch.logspace(start, end, steps, base, dtype=dtype, layout=layout, device="meta")
    return _logspace_into(T.empty(meta.shape, meta.dtype), start, end, steps, base)


def _linspace_tensor(start, end, steps, *, dtype=None, layout=None, device=None,
                     pin_memory=None):
    from neuron_eager.ops.factories import linspace

    start, end = _bound(start, "start", "linspace"), _bound(end, "end", "linspace")
    meta = torch.linspace(start, end, steps, dtype=dtype, layout=layout, device="meta")
    if not meta.dtype.is_floating_point:  # the CPU truncates integer bounds first
        start, end = int(start), int(end)
    return linspace(start, end, steps, dtype=meta.dtype)


register(aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar,
         aten.logspace.Scalar_Tensor)(_logspace_tensor)
register(aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar,
         aten.linspace.Scalar_Tensor)(_linspace_tensor)


@njit(nogil=True)
def _repeat_indices(out, counts):
    k = 0
    for i in range(counts.shape[0]):
        for _ in range(counts[i]):
            out[k] = i
            k += 1


@register(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats, *, output_size=None):
    """Indices i repeated repeats[i] times: the counts come to the host to size the output
    (CUDA synchronizes here too, unless given output_size)."""
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        raise NotImplementedError(f"\"repeat_interleave_cpu\" not implemented for "
                                  f"'{T.dtype_name(repeats.dtype)}'")
    counts = repeats._nd.astype(np.int64)
    core.launch("dma", counts.size, counts.nbytes)
    if (counts < 0).any():
        raise RuntimeError("repeats can not be negative")
    total = int(counts.sum())
    if output_size is not None and output_size != total:
        raise RuntimeError("allocated size does not match required size")
    out = T.empty((total,), repeats.dtype)
    _repeat_indices(out._nd, counts)
    core.launch("vector", total, out._nd.nbytes)
    return out
