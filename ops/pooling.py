"""Pooling (Vector engine): max, average, adaptive and fractional, 2-D and 3-D, with gradients.

Every tensor is seen as planes (N*C) of D x H x W (D = 1 for 2-D). Each output takes one
window per axis, given as (first in-range tap, tap count, divisor) per output position, so
one kernel serves plain, padded, dilated, adaptive and fractional pooling (fractional
windows differ per plane: window tables have one row per plane, or one row for all).
Values are widened to fp32 (int64 for integers), sums and gradient scatters accumulate in
fp32, and each result is rounded once.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import numerics, workers
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import keeps_channels_last
from neuron_eager.ops.jit import njit
from neuron_eager.ops.matmul import flat, meta_check, narrow_into, result_buffer, widen
from neuron_eager.ops.registry import register

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor


# -- kernels ---------------------------------------------------------------------------------
# g: planes P, channels C, input strides (n, c, d, h, w), D, H, W, Do, Ho, Wo,
#    dilation (d, h, w), then strides (n, c, d, h, w) of the grad and of the indices.
# Window tables (first, count[, divisor]) are 2-D: (planes or 1, outputs along the axis).
@njit(error_model="numpy", nogil=True)
def max_pool(lo, hi, out, idx, x, g, lowest, d0, dn, h0, hn, w0, wn):
    """Window maxima and their flat positions, for planes lo..hi-1 (loads unsigned); a
    window with no tap inside gives `lowest` (Note [Windows in the padding])."""
    C, sn, sc, sd, sh, sw = g[1], g[2], g[3], g[4], g[5], g[6]
    H, W, Do, Ho, Wo, ddl, dhl, dwl = g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]
    o = lo * Do * Ho * Wo
    for p in range(lo, hi):
        base = (p // C) * sn + (p % C) * sc
        rd, rh, rw = p % d0.shape[0], p % h0.shape[0], p % w0.shape[0]
        for od in range(Do):
            fd = d0[rd, od]
            for oh in range(Ho):
                fh = h0[rh, oh]
                for ow in range(Wo):
                    fw = w0[rw, ow]
                    at = (fd * H + fh) * W + fw
                    if dn[rd, od] == 0 or hn[rh, oh] == 0 or wn[rw, ow] == 0:
                        out[o] = lowest
                        idx[o] = at
                        o += 1
                        continue
                    best = x[np.uint64(base + fd * sd + fh * sh + fw * sw)]
                    for a in range(dn[rd, od]):
                        d = fd + a * ddl
                        for b in range(hn[rh, oh]):
                            h = fh + b * dhl
                            for c in range(wn[rw, ow]):
                                w = fw + c * dwl
                                v = x[np.uint64(base + d * sd + h * sh + w * sw)]
                                if v > best or v != v:  # the last NaN wins, as on the CPU
                                    best, at = v, (d * H + h) * W + w
                    out[o] = best
                    idx[o] = at
                    o += 1


@njit(error_model="numpy", nogil=True)
def scatter_grad(lo, hi, gin, grad, idx, g):
    """gin[p, idx[p, o]] += grad[p, o]: the gradient of max pooling, summed in fp32, for
    planes lo..hi-1 (each adds to its own plane only)."""
    C, D, H, W, Do, Ho, Wo = g[1], g[7], g[8], g[9], g[10], g[11], g[12]
    gn, gc, gd, gh, gw = g[16], g[17], g[18], g[19], g[20]
    i_n, i_c, i_d, i_h, i_w = g[21], g[22], g[23], g[24], g[25]
    plane = D * H * W
    for p in range(lo, hi):
        n, c = p // C, p % C
        for od in range(Do):
            for oh in range(Ho):
                for ow in range(Wo):
                    at = idx[n * i_n + c * i_c + od * i_d + oh * i_h + ow * i_w]
                    if 0 <= at < plane:  # (a window in the padding may point past the plane)
                        gin[p * plane + at] += grad[n * gn + c * gc + od * gd + oh * gh +
                                                    ow * gw]


@njit(error_model="numpy", nogil=True)
def avg_pool(lo, hi, out, x, g, d0, dn, dd, h0, hn, hd, w0, wn, wd, divisor, integer):
    """Window sums (fp32, or int64 for integers) over the product of the axis divisors (or
    `divisor` when it is not 0), for planes lo..hi-1; integer means truncate toward zero, as
    C++ division does. (Loads index unsigned: no negative-index wraparound per tap.)"""
    C, sn, sc, sd, sh, sw = g[1], g[2], g[3], g[4], g[5], g[6]
    Do, Ho, Wo = g[10], g[11], g[12]
    o = lo * Do * Ho * Wo
    zero = x[0] - x[0]
    for p in range(lo, hi):
        base = (p // C) * sn + (p % C) * sc
        for od in range(Do):
            for oh in range(Ho):
                for ow in range(Wo):
                    s = zero
                    for d in range(d0[0, od], d0[0, od] + dn[0, od]):
                        for h in range(h0[0, oh], h0[0, oh] + hn[0, oh]):
                            for w in range(w0[0, ow], w0[0, ow] + wn[0, ow]):
                                s += x[np.uint64(base + d * sd + h * sh + w * sw)]
                    k = divisor if divisor != 0 else dd[0, od] * hd[0, oh] * wd[0, ow]
                    if integer:
                        q = abs(s) // k
                        out[o] = q if s >= 0 else -q
                    else:
                        out[o] = s / np.float32(k)
                    o += 1


@njit(error_model="numpy", nogil=True)
def avg_pool_backward(lo, hi, gin, grad, g, d0, dn, dd, h0, hn, hd, w0, wn, wd, divisor):
    """For planes lo..hi-1 (each writes only its own plane of gin)."""
    C, D, H, W, Do, Ho, Wo = g[1], g[7], g[8], g[9], g[10], g[11], g[12]
    gn, gc, gd, gh, gw = g[16], g[17], g[18], g[19], g[20]
    for p in range(lo, hi):
        n, c = p // C, p % C
        for od in range(Do):
            for oh in range(Ho):
                for ow in range(Wo):
                    k = divisor if divisor != 0 else dd[0, od] * hd[0, oh] * wd[0, ow]
                    v = grad[n * gn + c * gc + od * gd + oh * gh + ow * gw] / np.float32(k)
                    for d in range(d0[0, od], d0[0, od] + dn[0, od]):
                        for h in range(h0[0, oh], h0[0, oh] + hn[0, oh]):
                            for w in range(w0[0, ow], w0[0, ow] + wn[0, ow]):
                                gin[np.uint64((p * D + d) * H * W + h * W + w)] += v


_fractional_kernels: dict = {}


def _fractional_kernel(code: str):
    """Fractional windows: starts from the CPU's formula in the samples' dtype, each operation
    rounded to it as c10's 16-bit arithmetic does; tables are (planes, outputs)."""
    kernel = _fractional_kernels.get(code)
    if kernel is None:
        load, store = numerics.loader(code, "f32"), numerics.storer(code)
        rnd = numerics.identity if code in ("f32", "f64") else \
            njit(inline="always")(lambda v: load(store(v)))

        @njit(error_model="numpy", nogil=True)
        def kernel(first, samples, k, size, out, pool):
            for p in range(first.shape[0]):
                s = load(samples[p * k])
                if out > 1:
                    alpha = rnd(np.float32(size - pool) / np.float32(out - 1))
                    shift = np.int64(rnd(s * alpha))
                    for i in range(out - 1):
                        first[p, i] = np.int64(rnd(rnd(np.float32(i) + s) * alpha)) - shift
                first[p, out - 1] = size - pool

        _fractional_kernels[code] = kernel
    return kernel


# -- windows ---------------------------------------------------------------------------------
def _rows(*arrays):
    return tuple(np.ascontiguousarray(a, dtype=np.int64).reshape(1, -1) for a in arrays)


# Note [Windows in the padding]
# With dilation, a window can lie wholly in the padding (a size-1 dim, kernel 2, padding 1,
# dilation 2: taps at -1 and 1). The CPU then gives the dtype's lowest value (-inf) and, as
# its index, its first tap at or past 0 (its start stepped by the dilation), which may lie
# outside the input; its backward writes there (past the plane: memory it does not own).
# Here the same value and index; the backward skips an index outside the plane.
def _windows(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int = 1):
    """Per output position: first tap at or past 0 (the first in range when any is),
    in-range tap count (max pooling)."""
    start = np.arange(out, dtype=np.int64) * stride - pad
    taps = start[:, None] + np.arange(kernel, dtype=np.int64)[None, :] * dilation
    inside = (taps >= 0) & (taps < size)
    first = np.where(start < 0, start + (-start + dilation - 1) // dilation * dilation, start)
    # taps past the first in-range one step by `dilation`; count those still inside
    return _rows(first, inside.sum(1))


def _avg_windows(size, out, kernel, stride, pad, count_include_pad):
    """(first, count, divisor) per output position, the CPU's avg_pool arithmetic."""
    start = np.arange(out, dtype=np.int64) * stride - pad
    end = np.minimum(start + kernel, size + pad)
    pool = end - start
    first, last = np.maximum(start, 0), np.minimum(end, size)
    return _rows(first, last - first, pool if count_include_pad else last - first)


def _adaptive_windows(size, out):
    i = np.arange(out, dtype=np.int64)
    first = (i * size) // out
    last = ((i + 1) * size + out - 1) // out
    return _rows(first, last - first, last - first)


_UNIT = _rows([0], [1], [1])  # the D axis of 2-D pooling


def _spatial(t: torch.Tensor, k: int):
    """(N, C, D, H, W) sizes and strides of a tensor with k spatial dims (batch optional)."""
    shape, stride = list(t.shape), list(t.stride())
    if t.dim() == k + 1:
        shape, stride = [1] + shape, [0] + stride
    if k == 2:
        shape, stride = shape[:2] + [1] + shape[2:], stride[:2] + [0] + stride[2:]
    return tuple(shape), tuple(stride)


def _geometry(x, out, k, grad=None, indices=None, dilation=(1, 1, 1)):
    (N, C, D, H, W), xs = _spatial(x, k)
    (_, _, Do, Ho, Wo), _ = _spatial(out, k)
    gs = _spatial(grad, k)[1] if grad is not None else (0,) * 5
    is_ = _spatial(indices, k)[1] if indices is not None else (0,) * 5
    return np.array([N * C, C, *xs, D, H, W, Do, Ho, Wo, *dilation, *gs, *is_], np.int64)


def _axes(v, k, default=None):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if not v:
        v = list(default)
    return tuple(v * k) if len(v) == 1 else tuple(v)


def _launch(*tensors):
    core.launch("vector", max(t.numel() for t in tensors),
                sum(t._nd.nbytes for t in tensors))


def _fallback(op, args):
    from neuron_eager.ops.router import cpu_fallback

    return cpu_fallback(op, args, {})


def _native(x, k, *others, floating=False) -> bool:
    ok = x.dim() in (k + 1, k + 2) and all(isinstance(t, NeuronTensor) for t in (x, *others))
    return ok and (x.dtype.is_floating_point or (not floating and x.dtype != torch.bool))


def _sizes(x, meta, k):
    (_, _, D, H, W), _ = _spatial(x, k)
    (_, _, Do, Ho, Wo), _ = _spatial(meta, k)
    return (D, H, W)[3 - k:], (Do, Ho, Wo)[3 - k:]


# -- max pooling -----------------------------------------------------------------------------
def _max(x, out_meta, k, windows, dilation=(1, 1, 1)):
    """windows: ((first, count) for d, h, w), 2-D pooling with the unit D window."""
    out = T.empty(out_meta.shape, x.dtype)
    idx = T.empty(out_meta.shape, torch.int64)
    if out.numel():
        g = _geometry(x, out, k, dilation=dilation)
        res = result_buffer(out)
        wide = widen(x)
        lowest = wide.dtype.type(-np.inf if x.dtype.is_floating_point else
                                 torch.iinfo(x.dtype).min)
        workers.share_rows(max_pool, g[0], x.numel(), [
            res, idx._nd.reshape(-1), wide, g, lowest,
            *[a for w in windows for a in w[:2]]])
        narrow_into(out, res)
        _launch(x, out, idx)
    return out, idx


def _max_pool(op, k, x, kernel_size, stride, padding, dilation, ceil_mode):
    args = (x, kernel_size, stride, padding, dilation, ceil_mode)
    meta, _ = meta_check(op, args)
    if not _native(x, k):
        return _fallback(op, args)
    ks, ss = _axes(kernel_size, k), _axes(stride, k, kernel_size)
    ps, ds = _axes(padding, k), _axes(dilation, k)
    sizes, outs = _sizes(x, meta, k)
    windows = [_windows(*a) for a in zip(sizes, outs, ks, ss, ps, ds)]
    return _max(x, meta, k, [_UNIT] * (3 - k) + windows, (1,) * (3 - k) + ds)


@register(aten.max_pool2d_with_indices.default)
@keeps_channels_last(0)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(aten.max_pool2d_with_indices.default, 2, x, kernel_size, stride, padding,
                     dilation, ceil_mode)


@register(aten.max_pool3d_with_indices.default)
@keeps_channels_last(0)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(aten.max_pool3d_with_indices.default, 3, x, kernel_size, stride, padding,
                     dilation, ceil_mode)


def _adaptive_max(op, k, x, output_size):
    meta, _ = meta_check(op, (x, output_size))
    if not _native(x, k, floating=True):
        return _fallback(op, (x, output_size))
    sizes, outs = _sizes(x, meta, k)
    windows = [_adaptive_windows(s, o) for s, o in zip(sizes, outs)]
    return _max(x, meta, k, [_UNIT] * (3 - k) + windows)


@register(aten.adaptive_max_pool2d.default)
@keeps_channels_last(0)
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max(aten.adaptive_max_pool2d.default, 2, x, output_size)


@register(aten.adaptive_max_pool3d.default)
# (contiguous for a channels-last input: the CPU has no channels-last kernel for it)
def adaptive_max_pool3d(x, output_size):
    return _adaptive_max(aten.adaptive_max_pool3d.default, 3, x, output_size)


def _fractional(op, k, x, kernel_size, output_size, samples):
    args = (x, kernel_size, output_size, samples)
    meta, _ = meta_check(op, args)
    if not _native(x, k, samples, floating=True) or samples.dtype != x.dtype:
        return _fallback(op, args)
    sizes, outs = _sizes(x, meta, k)
    (N, C, *_), _ = _spatial(x, k)
    samples = samples.contiguous()
    kernel = _fractional_kernel(numerics.CODE[samples.dtype])
    windows = []
    for axis, (size, out, pool) in enumerate(zip(sizes, outs, _axes(kernel_size, k))):
        first = np.zeros((N * C, max(out, 1)), np.int64)
        if N * C:
            # the CPU's sample order per plane: (w, h) for 2-D, (t, h, w) for 3-D
            kernel(first, flat(samples)[1 - axis if k == 2 else axis:], k, size, out, pool)
        windows.append((first, np.full(first.shape, pool, np.int64)))
    return _max(x, meta, k, [_UNIT] * (3 - k) + windows)


@register(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional(aten.fractional_max_pool2d.default, 2, x, kernel_size, output_size,
                       random_samples)


@register(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional(aten.fractional_max_pool3d.default, 3, x, kernel_size, output_size,
                       random_samples)


def _max_backward(op, k, args, grad, x, indices):
    meta_check(op, args)
    if not _native(x, k, grad, indices, floating=True):
        return _fallback(op, args)
    gin = T.empty(x.shape, x.dtype)
    if gin.numel():
        values = np.zeros(gin.numel(), np.float32)
        if grad.numel():
            g = _geometry(x, grad, k, grad, indices)
            workers.share_rows(scatter_grad, g[0], values.size,
                               [values, widen(grad), flat(indices), g])
        narrow_into(gin, values)
        _launch(gin, grad, indices)
    return gin


@register(aten.max_pool2d_with_indices_backward.default)
@keeps_channels_last(1)  # (the CPU's grad_input layout)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_backward(aten.max_pool2d_with_indices_backward.default, 2,
                         (grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices),
                         grad, x, indices)


@register(aten.max_pool3d_with_indices_backward.default)
@keeps_channels_last(1)  # (the CPU's grad_input layout)
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_backward(aten.max_pool3d_with_indices_backward.default, 3,
                         (grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices),
                         grad, x, indices)


@register(aten.adaptive_max_pool2d_backward.default)
@keeps_channels_last(1)  # (the CPU's grad_input layout)
def adaptive_max_pool2d_backward(grad, x, indices):
    return _max_backward(aten.adaptive_max_pool2d_backward.default, 2, (grad, x, indices), grad,
                         x, indices)


@register(aten.adaptive_max_pool3d_backward.default)
# (contiguous, as the CPU's: its forward has no channels-last kernel either)
def adaptive_max_pool3d_backward(grad, x, indices):
    return _max_backward(aten.adaptive_max_pool3d_backward.default, 3, (grad, x, indices), grad,
                         x, indices)


@register(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad, x, kernel_size, output_size, indices):
    return _max_backward(aten.fractional_max_pool2d_backward.default, 2,
                         (grad, x, kernel_size, output_size, indices), grad, x, indices)


@register(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad, x, kernel_size, output_size, indices):
    return _max_backward(aten.fractional_max_pool3d_backward.default, 3,
                         (grad, x, kernel_size, output_size, indices), grad, x, indices)


# -- average pooling -------------------------------------------------------------------------
def _avg(x, out_meta, k, windows, divisor):
    out = T.empty(out_meta.shape, x.dtype)
    if out.numel():
        g = _geometry(x, out, k)
        res = result_buffer(out)
        integer = not x.dtype.is_floating_point
        workers.share_rows(avg_pool, g[0], x.numel(), [res, widen(x), g, *[
            a for w in windows for a in w], divisor, integer])
        narrow_into(out, res)
        _launch(x, out)
    return out


def _avg_backward(grad, x, k, windows, divisor):
    gin = T.empty(x.shape, x.dtype)
    if gin.numel():
        values = np.zeros(gin.numel(), np.float32)
        if grad.numel():
            g = _geometry(x, grad, k, grad)
            workers.share_rows(avg_pool_backward, g[0], values.size, [
                values, widen(grad), g, *[a for w in windows for a in w], divisor])
        narrow_into(gin, values)
        _launch(gin, grad)
    return gin


def _avg_params(x, out_meta, k, kernel_size, stride, padding, count_include_pad):
    ks, ss, ps = _axes(kernel_size, k), _axes(stride, k, kernel_size), _axes(padding, k)
    sizes, outs = _sizes(x, out_meta, k)
    windows = [_avg_windows(*a, count_include_pad) for a in zip(sizes, outs, ks, ss, ps)]
    return [_UNIT] * (3 - k) + windows


def _avg_pool(op, k, args):
    x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override = args
    meta = meta_check(op, args)
    if not _native(x, k):
        return _fallback(op, args)
    windows = _avg_params(x, meta, k, kernel_size, stride, padding, count_include_pad)
    return _avg(x, meta, k, windows, divisor_override or 0)


@register(aten.avg_pool2d.default)
@keeps_channels_last(0)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(aten.avg_pool2d.default, 2, (x, kernel_size, stride, padding, ceil_mode,
                                                  count_include_pad, divisor_override))


@register(aten.avg_pool3d.default)
# (contiguous for a channels-last input: the CPU has no channels-last kernel for it)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(aten.avg_pool3d.default, 3, (x, kernel_size, stride, padding, ceil_mode,
                                                  count_include_pad, divisor_override))


def _avg_pool_backward(op, k, args):
    grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override = args
    meta_check(op, args)
    if not _native(x, k, grad, floating=True):
        return _fallback(op, args)
    windows = _avg_params(x, grad, k, kernel_size, stride, padding, count_include_pad)
    return _avg_backward(grad, x, k, windows, divisor_override or 0)


@register(aten.avg_pool2d_backward.default)
@keeps_channels_last(1)  # (the CPU's grad_input layout)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _avg_pool_backward(aten.avg_pool2d_backward.default, 2,
                              (grad, x, kernel_size, stride, padding, ceil_mode,
                               count_include_pad, divisor_override))


@register(aten.avg_pool3d_backward.default)
# (contiguous, as the CPU's: its forward has no channels-last kernel either)
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _avg_pool_backward(aten.avg_pool3d_backward.default, 3,
                              (grad, x, kernel_size, stride, padding, ceil_mode,
                               count_include_pad, divisor_override))


def _adaptive_avg(op, k, x, output_size):
    meta = meta_check(op, (x, output_size))
    if not _native(x, k, floating=True):
        return _fallback(op, (x, output_size))
    sizes, outs = _sizes(x, meta, k)
    windows = [_adaptive_windows(s, o) for s, o in zip(sizes, outs)]
    return _avg(x, meta, k, [_UNIT] * (3 - k) + windows, 0)


@register(aten._adaptive_avg_pool2d.default)
@keeps_channels_last(0)
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(aten._adaptive_avg_pool2d.default, 2, x, output_size)


@register(aten._adaptive_avg_pool3d.default)
# (contiguous for a channels-last input: the CPU has no channels-last kernel for it)
def adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg(aten._adaptive_avg_pool3d.default, 3, x, output_size)


def _adaptive_avg_backward(op, k, grad, x):
    meta_check(op, (grad, x))
    if not _native(x, k, grad, floating=True):
        return _fallback(op, (grad, x))
    sizes, outs = _sizes(x, grad, k)
    windows = [_adaptive_windows(s, o) for s, o in zip(sizes, outs)]
    return _avg_backward(grad, x, k, [_UNIT] * (3 - k) + windows, 0)


@register(aten._adaptive_avg_pool2d_backward.default)
@keeps_channels_last(1)  # (the CPU's grad_input layout)
def adaptive_avg_pool2d_backward(grad, x):
    return _adaptive_avg_backward(aten._adaptive_avg_pool2d_backward.default, 2, grad, x)


@register(aten._adaptive_avg_pool3d_backward.default)
# (contiguous, as the CPU's: its forward has no channels-last kernel either)
def adaptive_avg_pool3d_backward(grad, x):
    return _adaptive_avg_backward(aten._adaptive_avg_pool3d_backward.default, 3, grad, x)


# max_unpool runs PyTorch's decomposition (a scatter into zeros), after the CPU's check of the
# indices (the scatter would wrap -1 to the last element); the CPU keeps a channels-last
# input's layout in 2-D (its 3-D form does not)
def _unpool(op, x, indices, output_size, *rest):
    from torch._decomp import decomposition_table

    plane = math.prod(output_size)
    # (an empty output takes any index: the CPU checks the ones it writes)
    if plane and indices.numel() and type(indices) is T.NeuronTensor and \
            indices.dtype == torch.int64 and (indices._nd.min() < 0 or indices._nd.max() >= plane):
        T.cpu_refusal(op, x, indices, output_size, *rest)
    return decomposition_table[op](x, indices, output_size, *rest)


@register(aten.max_unpool2d.default)
@keeps_channels_last(0)
def max_unpool2d(x, indices, output_size):
    return _unpool(aten.max_unpool2d.default, x, indices, output_size)


@register(aten.max_unpool3d.default)
def max_unpool3d(x, indices, output_size, stride, padding):
    return _unpool(aten.max_unpool3d.default, x, indices, output_size, stride, padding)
