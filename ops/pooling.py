"""2-D pooling (Vector engine): max and average, plain and adaptive, with their gradients.

Each output takes one window of its input plane; windows are given per axis as (first
in-range tap, number of taps, divisor), so one kernel serves plain, padded, dilated and
adaptive pooling. Values are widened to fp32 (int64 for integer max pooling), sums and
gradient scatters accumulate in fp32, and each result is rounded once.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit

from neuron_eager.device_sim import core
from neuron_eager.ops import tensor as T
from neuron_eager.ops.matmul import flat, narrow_into, raise_like_cpu, result_buffer, widen
from neuron_eager.ops.registry import register

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor


# -- kernels ---------------------------------------------------------------------------------
# g: planes P, channels C, input strides (n, c, h, w), H, W, Ho, Wo, dilation (h, w),
#    then strides (n, c, h, w) of the second tensor operand (grad or indices) where used.
@njit(error_model="numpy", nogil=True)
def max_pool(out, idx, x, g, h0, hn, w0, wn):
    P, C, sn, sc, sh, sw, H, W, Ho, Wo, dh, dw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], \
        g[7], g[8], g[9], g[10], g[11]
    o = 0
    for p in range(P):
        base = (p // C) * sn + (p % C) * sc
        for oh in range(Ho):
            for ow in range(Wo):
                best = x[base + h0[oh] * sh + w0[ow] * sw]
                at = h0[oh] * W + w0[ow]
                for a in range(hn[oh]):
                    h = h0[oh] + a * dh
                    for b in range(wn[ow]):
                        w = w0[ow] + b * dw
                        v = x[base + h * sh + w * sw]
                        if v > best or v != v:  # the last NaN wins, as on the CPU
                            best, at = v, h * W + w
                out[o] = best
                idx[o] = at
                o += 1


@njit(error_model="numpy", nogil=True)
def scatter_grad(gin, grad, idx, g):
    """gin[p, idx[p, o]] += grad[p, o]: the gradient of max pooling, summed in fp32."""
    P, C, H, W, Ho, Wo = g[0], g[1], g[6], g[7], g[8], g[9]
    gn, gc, gh, gw, i_n, i_c, i_h, i_w = g[12], g[13], g[14], g[15], g[16], g[17], g[18], g[19]
    for p in range(P):
        n, c = p // C, p % C
        for oh in range(Ho):
            for ow in range(Wo):
                at = idx[n * i_n + c * i_c + oh * i_h + ow * i_w]
                gin[p * H * W + at] += grad[n * gn + c * gc + oh * gh + ow * gw]


@njit(error_model="numpy", nogil=True)
def avg_pool(out, x, g, h0, hn, hd, w0, wn, wd, divisor):
    """Window sums in fp32 divided by hd*wd (or by `divisor` when it is not 0)."""
    P, C, sn, sc, sh, sw, Ho, Wo = g[0], g[1], g[2], g[3], g[4], g[5], g[8], g[9]
    o = 0
    for p in range(P):
        base = (p // C) * sn + (p % C) * sc
        for oh in range(Ho):
            for ow in range(Wo):
                s = np.float32(0)
                for h in range(h0[oh], h0[oh] + hn[oh]):
                    for w in range(w0[ow], w0[ow] + wn[ow]):
                        s += x[base + h * sh + w * sw]
                d = divisor if divisor != 0 else hd[oh] * wd[ow]
                out[o] = s / np.float32(d)
                o += 1


@njit(error_model="numpy", nogil=True)
def avg_pool_backward(gin, grad, g, h0, hn, hd, w0, wn, wd, divisor):
    P, C, H, W, Ho, Wo = g[0], g[1], g[6], g[7], g[8], g[9]
    gn, gc, gh, gw = g[12], g[13], g[14], g[15]
    for p in range(P):
        n, c = p // C, p % C
        for oh in range(Ho):
            for ow in range(Wo):
                d = divisor if divisor != 0 else hd[oh] * wd[ow]
                v = grad[n * gn + c * gc + oh * gh + ow * gw] / np.float32(d)
                for h in range(h0[oh], h0[oh] + hn[oh]):
                    for w in range(w0[ow], w0[ow] + wn[ow]):
                        gin[p * H * W + h * W + w] += v


# -- windows ---------------------------------------------------------------------------------
def _windows(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int = 1):
    """Per output position: first in-range tap, in-range tap count (max pooling)."""
    start = np.arange(out, dtype=np.int64) * stride - pad
    taps = start[:, None] + np.arange(kernel, dtype=np.int64)[None, :] * dilation
    inside = (taps >= 0) & (taps < size)
    first = np.where(inside.any(1), taps[np.arange(out), inside.argmax(1)], 0)
    return first, inside.sum(1).astype(np.int64)


def _avg_windows(size, out, kernel, stride, pad, count_include_pad):
    """(first, count, divisor) per output position, the CPU's avg_pool2d arithmetic."""
    start = np.arange(out, dtype=np.int64) * stride - pad
    end = np.minimum(start + kernel, size + pad)
    pool = end - start
    first, last = np.maximum(start, 0), np.minimum(end, size)
    return first, last - first, pool if count_include_pad else last - first


def _adaptive_windows(size, out):
    i = np.arange(out, dtype=np.int64)
    first = (i * size) // out
    last = ((i + 1) * size + out - 1) // out
    return first, last - first, last - first


def _nchw(t: torch.Tensor):
    if t.dim() == 3:
        return (1, *t.shape), (0, *t.stride())
    return tuple(t.shape), t.stride()


def _geometry(x, out, other=None, dilation=(1, 1)):
    (N, C, H, W), xs = _nchw(x)
    _, os_ = _nchw(other) if other is not None else (None, (0, 0, 0, 0))
    (_, _, Ho, Wo), _ = _nchw(out)
    return np.array([N * C, C, *xs, H, W, Ho, Wo, *dilation, *os_, 0, 0, 0, 0], np.int64), \
        (H, W, Ho, Wo)


def _meta(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _shape_of(op, args):
    """Output metadata from the meta kernel; CPU's error when the arguments are bad."""
    try:
        return op(*[_meta(a) if isinstance(a, torch.Tensor) else a for a in args])
    except RuntimeError:
        raise_like_cpu(op, *args)


def _pair(v, default=None):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if not v:
        v = list(default)
    return tuple(v * 2) if len(v) == 1 else tuple(v)


def _launch(*tensors):
    core.launch("vector", max(t.numel() for t in tensors),
                sum(t._nd.nbytes for t in tensors))


def _fallback(op, args):
    from neuron_eager.ops.router import cpu_fallback

    return cpu_fallback(op, args, {})


def _native(x, *others, floating=False) -> bool:
    ok = x.dim() in (3, 4) and all(isinstance(t, NeuronTensor) for t in (x, *others))
    return ok and (x.dtype.is_floating_point or (not floating and x.dtype != torch.bool))


# -- max pooling -----------------------------------------------------------------------------
def _max(x, out_meta, windows_h, windows_w, dilation=(1, 1)):
    out = T.empty(out_meta.shape, x.dtype)
    idx = T.empty(out_meta.shape, torch.int64)
    if out.numel():
        g, _ = _geometry(x, out, dilation=dilation)
        res = result_buffer(out)
        max_pool(res, idx._nd.reshape(-1), widen(x), g, *windows_h, *windows_w)
        narrow_into(out, res)
        _launch(x, out, idx)
    return out, idx


@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    args = (x, kernel_size, stride, padding, dilation, ceil_mode)
    meta, _ = _shape_of(aten.max_pool2d_with_indices.default, args)
    if not _native(x):
        return _fallback(aten.max_pool2d_with_indices.default, args)
    (kh, kw), (sh, sw) = _pair(kernel_size), _pair(stride, kernel_size)
    (ph, pw), (dh, dw) = _pair(padding), _pair(dilation)
    (_, _, H, W), _ = _nchw(x)
    Ho, Wo = meta.shape[-2:]
    return _max(x, meta, _windows(H, Ho, kh, sh, ph, dh), _windows(W, Wo, kw, sw, pw, dw),
                (dh, dw))


@register(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(x, output_size):
    meta, _ = _shape_of(aten.adaptive_max_pool2d.default, (x, output_size))
    if not _native(x, floating=True):
        return _fallback(aten.adaptive_max_pool2d.default, (x, output_size))
    (_, _, H, W), _ = _nchw(x)
    Ho, Wo = meta.shape[-2:]
    return _max(x, meta, _adaptive_windows(H, Ho)[:2], _adaptive_windows(W, Wo)[:2])


def _max_backward(op, args, grad, x, indices):
    _shape_of(op, args)
    if not _native(x, grad, indices, floating=True):
        return _fallback(op, args)
    gin = T.empty(x.shape, x.dtype)
    if gin.numel():
        values = np.zeros(gin.numel(), np.float32)
        if grad.numel():
            g, _ = _geometry(x, grad, grad)
            g[16:20] = _nchw(indices)[1]
            scatter_grad(values, widen(grad), flat(indices), g)
        narrow_into(gin, values)
        _launch(gin, grad, indices)
    return gin


@register(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_backward(aten.max_pool2d_with_indices_backward.default,
                         (grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices),
                         grad, x, indices)


@register(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad, x, indices):
    return _max_backward(aten.adaptive_max_pool2d_backward.default, (grad, x, indices), grad, x,
                         indices)


# -- average pooling -------------------------------------------------------------------------
def _avg(x, out_meta, wh, ww, divisor):
    out = T.empty(out_meta.shape, x.dtype)
    if out.numel():
        g, _ = _geometry(x, out)
        res = result_buffer(out)
        avg_pool(res, widen(x), g, *wh, *ww, divisor)
        narrow_into(out, res)
        _launch(x, out)
    return out


def _avg_backward(grad, x, wh, ww, divisor):
    gin = T.empty(x.shape, x.dtype)
    if gin.numel():
        values = np.zeros(gin.numel(), np.float32)
        if grad.numel():
            g, _ = _geometry(x, grad, grad)
            avg_pool_backward(values, widen(grad), g, *wh, *ww, divisor)
        narrow_into(gin, values)
        _launch(gin, grad)
    return gin


def _avg_params(x, out_meta, kernel_size, stride, padding, count_include_pad):
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel_size), _pair(stride, kernel_size), \
        _pair(padding)
    (_, _, H, W), _ = _nchw(x)
    Ho, Wo = out_meta.shape[-2:]
    return (_avg_windows(H, Ho, kh, sh, ph, count_include_pad),
            _avg_windows(W, Wo, kw, sw, pw, count_include_pad))


@register(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    args = (x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    meta = _shape_of(aten.avg_pool2d.default, args)
    if not _native(x, floating=True):
        return _fallback(aten.avg_pool2d.default, args)
    wh, ww = _avg_params(x, meta, kernel_size, stride, padding, count_include_pad)
    return _avg(x, meta, wh, ww, divisor_override or 0)


@register(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    args = (grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    _shape_of(aten.avg_pool2d_backward.default, args)
    if not _native(x, grad, floating=True):
        return _fallback(aten.avg_pool2d_backward.default, args)
    wh, ww = _avg_params(x, grad, kernel_size, stride, padding, count_include_pad)
    return _avg_backward(grad, x, wh, ww, divisor_override or 0)


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    meta = _shape_of(aten._adaptive_avg_pool2d.default, (x, output_size))
    if not _native(x, floating=True):
        return _fallback(aten._adaptive_avg_pool2d.default, (x, output_size))
    (_, _, H, W), _ = _nchw(x)
    Ho, Wo = meta.shape[-2:]
    return _avg(x, meta, _adaptive_windows(H, Ho), _adaptive_windows(W, Wo), 0)


@register(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad, x):
    _shape_of(aten._adaptive_avg_pool2d_backward.default, (grad, x))
    if not _native(x, grad, floating=True):
        return _fallback(aten._adaptive_avg_pool2d_backward.default, (grad, x))
    (_, _, H, W), _ = _nchw(x)
    Ho, Wo = grad.shape[-2:]
    return _avg_backward(grad, x, _adaptive_windows(H, Ho), _adaptive_windows(W, Wo), 0)
