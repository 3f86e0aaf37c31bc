"""Separable resampling (Vector engine): upsampling gradients, antialiased bilinear upsampling
and replication-padding gradients (grid sampling is in grid_sampling.py).

Each of these maps output positions to input positions axis by axis, so each axis is a tap
table: per output index, a few (input index, fp32 weight) pairs computed with the CPU's
formulas (fp32 arithmetic, as its opmath does). One forward kernel gathers the weighted
taps and one backward kernel scatters them (the adjoint), accumulating in fp32 and
rounding once. Tensors are seen as planes (N*C) of D x H x W, unit tables padding 1-D/2-D.
"""
from __future__ import annotations

from functools import partial

import math

import numpy as np
import torch
from torch._decomp import decomposition_table

from neuron_eager.device_sim import core
from neuron_eager.ops import tensor as T
from neuron_eager.ops import indexing, workers
from neuron_eager.ops.copy import keeps_channels_last
from neuron_eager.ops.jit import fma, njit
from neuron_eager.ops.matmul import meta_check, narrow_into, result_buffer, widen
from neuron_eager.ops.meta import in_cpu_words
from neuron_eager.ops.registry import register
from neuron_eager.ops.resample_uint8 import resize_uint8

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor
F32 = np.float32


# -- kernels ---------------------------------------------------------------------------------
# g: planes P, channels C, strides (n, c, d, h, w) of the source, D, H, W (input side),
#    Do, Ho, Wo (output side). Tables: index (out, taps) int64, weight (out, taps) fp32.
@njit(error_model="numpy", nogil=True)
def gather(out, x, g, id_, wd, ih, wh, iw, ww):
    """out[p, od, oh, ow] = sum of x[p, id, ih, iw] * wd * wh * ww over the taps."""
    P, C, sn, sc, sd, sh, sw = g[0], g[1], g[2], g[3], g[4], g[5], g[6]
    Do, Ho, Wo = g[10], g[11], g[12]
    o = 0
    for p in range(P):
        base = (p // C) * sn + (p % C) * sc
        for od in range(Do):
            for oh in range(Ho):
                for ow in range(Wo):
                    s = F32(0)
                    for a in range(id_.shape[1]):
                        for b in range(ih.shape[1]):
                            wab = wd[od, a] * wh[oh, b]
                            row = base + id_[od, a] * sd + ih[oh, b] * sh
                            for c in range(iw.shape[1]):
                                s += x[row + iw[ow, c] * sw] * (wab * ww[ow, c])
                    out[o] = s
                    o += 1


@njit(inline="always")
def _blend(t0, w0, t1, w1, taps):
    """t0 * w0 + t1 * w1 as the CPU's compiled expression rounds it: t1 * w1, then a fused
    multiply-add of t0 * w0 into it; t0 * w0 alone for one tap (a dim of size 1)."""
    return fma(t0, w0, t1 * w1) if taps == 2 else t0 * w0


@njit(error_model="numpy", nogil=True)
def interpolate(lo, hi, out, x, g, id_, wd, ih, wh, iw, ww):
    """gather's values (two taps an axis, or one) for planes lo..hi-1, nested as the CPU's
    separable interpolation: the d taps' blend of the h taps' blends of the w taps' (Note
    [Linear interpolation]), axis by axis (each input row's w blends once, then whole rows
    blended: the same operations, vectorized). So a tap of weight 0 on an infinite value
    gives NaN where the CPU's does, and nowhere else."""
    C, sn, sc, sd, sh, sw = g[1], g[2], g[3], g[4], g[5], g[6]
    D, H, Do, Ho, Wo = g[7], g[8], g[10], g[11], g[12]
    nd, nh, nw = id_.shape[1], ih.shape[1], iw.shape[1]
    rows = np.empty((D, H, Wo), np.float32)  # blended along w
    planes = np.empty((D, Ho, Wo), np.float32)  # then along h
    for p in range(lo, hi):
        base = (p // C) * sn + (p % C) * sc
        for d in range(D):
            for h in range(H):
                src = base + d * sd + h * sh
                for ow in range(Wo):
                    rows[d, h, ow] = _blend(x[src + iw[ow, 0] * sw], ww[ow, 0],
                                            x[src + iw[ow, nw - 1] * sw], ww[ow, nw - 1], nw)
            for oh in range(Ho):
                a, b, w0, w1 = ih[oh, 0], ih[oh, nh - 1], wh[oh, 0], wh[oh, nh - 1]
                for ow in range(Wo):
                    planes[d, oh, ow] = _blend(rows[d, a, ow], w0, rows[d, b, ow], w1, nh)
        o = p * Do * Ho * Wo
        for od in range(Do):
            a, b, w0, w1 = id_[od, 0], id_[od, nd - 1], wd[od, 0], wd[od, nd - 1]
            for oh in range(Ho):
                for ow in range(Wo):
                    out[o] = _blend(planes[a, oh, ow], w0, planes[b, oh, ow], w1, nd)
                    o += 1


@njit(nogil=True)
def pick(lo, hi, out, x, g, id_, ih, iw):
    """Nearest: out[p, od, oh, ow] = x[p, id_[od], ih[oh], iw[ow]] for planes lo..hi-1,
    elements copied as raw bits (any dtype, NaN payloads and -0.0 kept, as the CPU copies)."""
    C, sn, sc, sd, sh, sw = g[1], g[2], g[3], g[4], g[5], g[6]
    Do, Ho, Wo = g[10], g[11], g[12]
    o = lo * Do * Ho * Wo
    for p in range(lo, hi):
        base = (p // C) * sn + (p % C) * sc
        for od in range(Do):
            for oh in range(Ho):
                row = base + id_[od] * sd + ih[oh] * sh
                for ow in range(Wo):
                    out[o] = x[row + iw[ow] * sw]
                    o += 1


@njit(error_model="numpy", nogil=True)
def scatter(gin, grad, g, id_, wd, ih, wh, iw, ww):
    """The adjoint of gather: gin (contiguous planes of D x H x W) += grad * weights."""
    P, C, sn, sc, sd, sh, sw = g[0], g[1], g[2], g[3], g[4], g[5], g[6]
    D, H, W, Do, Ho, Wo = g[7], g[8], g[9], g[10], g[11], g[12]
    for p in range(P):
        src = (p // C) * sn + (p % C) * sc
        dst = p * D * H * W
        for od in range(Do):
            for oh in range(Ho):
                for ow in range(Wo):
                    v = grad[src + od * sd + oh * sh + ow * sw]
                    for a in range(id_.shape[1]):
                        for b in range(ih.shape[1]):
                            vab = v * wd[od, a] * wh[oh, b]
                            row = dst + (id_[od, a] * H + ih[oh, b]) * W
                            for c in range(iw.shape[1]):
                                gin[row + iw[ow, c]] += vab * ww[ow, c]


# -- tap tables (the CPU's index arithmetic, UpSample.h) ------------------------------------
def _unit():
    return np.zeros((1, 1), np.int64), np.ones((1, 1), F32)


def _scale(size: int, out: int, align_corners: bool, scale) -> np.float32:
    """area_pixel_compute_scale in fp32."""
    if align_corners:
        return F32(size - 1) / F32(out - 1) if out > 1 else F32(0)
    if scale is not None and scale > 0:
        return F32(1.0 / scale)
    return F32(size) / F32(out)


def _source(scale, out, align_corners, cubic):
    i = np.arange(out).astype(F32)
    if align_corners:
        return scale * i
    # scale * (i + 0.5) - 0.5 with one rounding, as the CPU's compiled code fuses it (FMA):
    # the product is exact in float64, and so is the sum for these magnitudes
    src = (np.float64(scale) * (i + F32(0.5)) - 0.5).astype(F32)
    return src if cubic else np.maximum(src, F32(0))


def _guard(src, size):
    """guard_index_and_lambda: floor index (at most size - 1) and the fraction in [0, 1]."""
    index = np.minimum(np.floor(src).astype(np.int64), size - 1)
    lam = np.clip(src - index.astype(F32), F32(0), F32(1)).astype(F32)
    return index, lam


def nearest_taps(size, out, scale, exact=False, shortcuts=True):
    """Source index per output; `shortcuts`: as the CPU's 2-D forward and every backward, an
    output of the input's size (or twice it) copies (or doubles) whatever the scale; its 1-D
    and 3-D forward kernels always step by 1/scale."""
    i = np.arange(out, dtype=np.int64)
    if not exact and shortcuts and out == size:
        index = i
    elif not exact and shortcuts and out == 2 * size:
        index = i >> 1
    else:
        s = F32(1.0 / scale) if scale is not None and scale > 0 else F32(size) / F32(out)
        # nearest: floorf(i * s); exact: floorf((i + 0.5) * s), the product in double
        pos = (i.astype(F32) * s) if not exact else (i + 0.5) * np.float64(s)
        index = np.minimum(np.floor(pos.astype(F32)).astype(np.int64), size - 1)
    return index.reshape(-1, 1), np.ones((out, 1), F32)


def linear_taps(size, out, align_corners, scale):
    if out == size:
        return np.arange(out, dtype=np.int64).reshape(-1, 1), np.ones((out, 1), F32)
    src = _source(_scale(size, out, align_corners, scale), out, align_corners, False)
    i0, lam = _guard(src, size)
    i1 = i0 + (i0 < size - 1)
    return np.stack([i0, i1], 1), np.stack([F32(1) - lam, lam], 1).astype(F32)


def _cubic1(x, a):
    return ((a + F32(2)) * x - (a + F32(3))) * x * x + F32(1)


def _cubic2(x, a):
    return ((a * x - F32(5) * a) * x + F32(8) * a) * x - F32(4) * a


def cubic_taps(size, out, align_corners, scale):
    src = _source(_scale(size, out, align_corners, scale), out, align_corners, True)
    i0, t = _guard(src, size)
    a, one = F32(-0.75), F32(1)
    weights = np.stack([_cubic2(t + one, a), _cubic1(t, a), _cubic1(one - t, a),
                        _cubic2(one - t + one, a)], 1).astype(F32)
    index = np.clip(i0[:, None] - 1 + np.arange(4)[None, :], 0, size - 1)
    return index, weights


def _keys_cubic(x):
    """The antialiased bicubic filter: Keys' cubic with a = -0.5 (PIL's), in fp32."""
    x, a = np.abs(x).astype(F32), F32(-0.5)
    near = ((a + F32(2)) * x - (a + F32(3))) * x * x + F32(1)
    far = (((x - F32(5)) * x + F32(8)) * x - F32(4)) * a
    return np.where(x < 1, near, np.where(x < 2, far, F32(0))).astype(F32)


def aa_taps(size, out, align_corners, scale, cubic=False, copy_same_size=False):
    """Antialiased windows (_compute_weights_aa): a triangle filter (bilinear) or Keys' cubic
    (bicubic) widened by the downscaling factor, weights normalised to sum 1.
    `copy_same_size`: an axis that keeps its size is copied whatever the scale, as the CPU's
    separable forward kernel skips it (its backward does not)."""
    if copy_same_size and out == size:
        return np.arange(out, dtype=np.int64).reshape(-1, 1), np.ones((out, 1), F32)
    s = _scale(size, out, align_corners, scale)
    half = F32(2) if cubic else F32(1)  # half the filter's width
    support = half * F32(s) if s >= 1 else half
    taps = int(math.ceil(support)) * 2 + 1
    invscale = F32(1) / s if s >= 1 else F32(1)
    index = np.zeros((out, taps), np.int64)
    weights = np.zeros((out, taps), F32)
    for i in range(out):
        center = F32(np.float64(s) * (i + 0.5))
        xmin = max(int(np.float64(center - support) + 0.5), 0)
        xsize = min(int(np.float64(center + support) + 0.5), size) - xmin
        xsize = min(max(xsize, 0), taps)
        j = np.arange(xsize)
        arg = ((np.float64((j + xmin).astype(F32) - center) + 0.5) * np.float64(invscale)
               ).astype(F32)
        w = _keys_cubic(arg) if cubic else np.maximum(F32(1) - np.abs(arg), F32(0)).astype(F32)
        total = F32(w.sum(dtype=F32))
        if total != 0:
            w = (w / total).astype(F32)
        index[i, :xsize] = xmin + j
        weights[i, :xsize] = w
    return index, weights


def pad_taps(size, out, left):
    """Replication padding: output o reads input clamp(o - left) (negative pads crop)."""
    index = np.clip(np.arange(out, dtype=np.int64) - left, 0, size - 1)
    return index.reshape(-1, 1), np.ones((out, 1), F32)


def reflect_taps(size, out, left):
    """Reflection padding: output o reads input o - left mirrored at both edges, the edge
    itself not repeated (pads are narrower than the dim: the CPU's check)."""
    index = np.abs(np.arange(out, dtype=np.int64) - left)
    if size > 1:
        index %= 2 * (size - 1)
        index = np.where(index >= size, 2 * (size - 1) - index, index)
    else:
        index[:] = 0
    return index.reshape(-1, 1), np.ones((out, 1), F32)


# -- running ---------------------------------------------------------------------------------
def _planes(t: torch.Tensor, k: int):
    """(N, C, D, H, W) sizes and strides of a tensor with k spatial dims and a batch dim
    (or with the batch dim missing when it has k + 1 dims)."""
    shape, stride = list(t.shape), list(t.stride())
    if len(shape) == k + 1:
        shape, stride = [1] + shape, [0] + stride
    while len(shape) < 5:
        shape.insert(2, 1)
        stride.insert(2, 0)
    return shape, stride


def _fallback(op, args):
    from neuron_eager.ops.router import cpu_fallback

    return cpu_fallback(op, args, {})


def _tables(tables):
    tables = [_unit()] * (3 - len(tables)) + list(tables)
    return [np.ascontiguousarray(a) for tw in tables for a in tw]


def resample_backward(grad: NeuronTensor, input_shape, k: int, tables) -> NeuronTensor:
    """The adjoint of a separable resampling: grad (output side) -> input-side gradient."""
    gin = T.empty(tuple(input_shape), grad.dtype)
    if gin.numel():
        values = np.zeros(gin.numel(), F32)
        if grad.numel():
            (N, C, *_), gs = _planes(grad, k)
            (_, _, D, H, W), _ = _planes(gin, k)
            (_, _, Do, Ho, Wo), _ = _planes(grad, k)
            g = np.array([N * C, C, *gs, D, H, W, Do, Ho, Wo], np.int64)
            scatter(values, widen(grad), g, *_tables(tables))
        narrow_into(gin, values)
        core.launch("vector", grad.numel(), grad._nd.nbytes + gin._nd.nbytes)
    return gin


def resample(x: NeuronTensor, out_shape, k: int, tables, blend: bool = False) -> NeuronTensor:
    """x resampled by the tap tables: weighted taps summed (gather), or with `blend` the
    linear modes' nested blends (interpolate, a share of planes per core)."""
    out = T.empty(tuple(out_shape), x.dtype)
    if out.numel():
        (N, C, D, H, W), xs = _planes(x, k)
        (_, _, Do, Ho, Wo), _ = _planes(out, k)
        g = np.array([N * C, C, *xs, D, H, W, Do, Ho, Wo], np.int64)
        res = result_buffer(out)
        args = [res, widen(x), g, *_tables(tables)]
        if blend:
            workers.share_rows(interpolate, N * C, out.numel(), args)
        else:
            gather(*args)
        narrow_into(out, res)
        core.launch("vector", out.numel(), x._nd.nbytes + out._nd.nbytes)
    return out


def nearest(x: NeuronTensor, out_shape, k: int, tables) -> NeuronTensor:
    """x's elements at the index tables' positions (pick), a share of planes per core."""
    out = T.empty(tuple(out_shape), x.dtype)
    if out.numel():
        (N, C, D, H, W), xs = _planes(x, k)
        (_, _, Do, Ho, Wo), _ = _planes(out, k)
        g = np.array([N * C, C, *xs, D, H, W, Do, Ho, Wo], np.int64)
        unit = np.zeros(1, np.int64)
        tables = [unit] * (3 - k) + [np.ascontiguousarray(t) for t in tables]
        workers.share_rows(pick, N * C, out.numel(),
                           [indexing.flat(out), indexing.flat(x), g, *tables])
        core.launch("vector", out.numel(), x._nd.nbytes + out._nd.nbytes)
    return out


def _upsample_backward(op, args, scales, make_taps):
    """args: grad, output_size, input_size, then the mode's arguments and scales."""
    meta_check(op, args)
    grad, output_size, input_size = args[:3]
    if not isinstance(grad, NeuronTensor) or not grad.dtype.is_floating_point:
        return _fallback(op, args)
    k = len(output_size)
    scales = list(scales) + [None] * (k - len(scales))
    tables = [make_taps(input_size[2 + a], output_size[a], scales[a]) for a in range(k)]
    return resample_backward(grad, input_size, k, tables)


# The CPU's gradients of 2-D nearest and bilinear (also antialiased) and of trilinear
# upsampling are channels-last for a channels-last grad_output; bicubic's and 3-D nearest's
# are contiguous.
_CHANNELS_LAST_GRADS = {aten.upsample_nearest2d_backward.default,
                        aten._upsample_nearest_exact2d_backward.default,
                        aten.upsample_bilinear2d_backward.default,
                        aten._upsample_bilinear2d_aa_backward.default,
                        aten.upsample_trilinear3d_backward.default}


def _register_backward(op, kernel):
    register(op)(keeps_channels_last(0)(kernel) if op in _CHANNELS_LAST_GRADS else kernel)


def _register_nearest(op, exact):
    def kernel(grad, output_size, input_size, *scales):
        args = (grad, output_size, input_size, *scales)
        return _upsample_backward(op, args, scales,
                                  lambda n, m, s: nearest_taps(n, m, s, exact))

    _register_backward(op, kernel)


for _op, _exact in ((aten.upsample_nearest1d_backward.default, False),
                    (aten.upsample_nearest2d_backward.default, False),
                    (aten.upsample_nearest3d_backward.default, False),
                    (aten._upsample_nearest_exact1d_backward.default, True),
                    (aten._upsample_nearest_exact2d_backward.default, True),
                    (aten._upsample_nearest_exact3d_backward.default, True)):
    _register_nearest(_op, _exact)


def _register_interp(op, taps):
    def kernel(grad, output_size, input_size, align_corners, *scales):
        args = (grad, output_size, input_size, align_corners, *scales)
        return _upsample_backward(op, args, scales,
                                  lambda n, m, s: taps(n, m, align_corners, s))

    _register_backward(op, kernel)


for _op, _taps in ((aten.upsample_linear1d_backward.default, linear_taps),
                   (aten.upsample_bilinear2d_backward.default, linear_taps),
                   (aten.upsample_trilinear3d_backward.default, linear_taps),
                   (aten.upsample_bicubic2d_backward.default, cubic_taps),
                   (aten._upsample_bilinear2d_aa_backward.default, aa_taps),
                   (aten._upsample_bicubic2d_aa_backward.default,
                    partial(aa_taps, cubic=True))):
    _register_interp(_op, _taps)


# Integer upsampling the CPU computes: uint8 images, except linear 1-D and trilinear.
_UINT8_UPSAMPLING = {aten.upsample_nearest1d.default, aten.upsample_nearest2d.default,
                     aten.upsample_nearest3d.default, aten._upsample_nearest_exact1d.default,
                     aten._upsample_nearest_exact2d.default, aten._upsample_nearest_exact3d.default,
                     aten.upsample_bilinear2d.default, aten.upsample_bicubic2d.default,
                     aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default}


def _sizes_checked(op, kernel):
    """`kernel` after the CPU's checks: input and output sizes positive (a size of 0 divides
    by zero in the tap tables and in PyTorch's decompositions), and a dtype it upsamples
    (other integer types raise its NotImplementedError, which names its kernel)."""
    uint8 = op in _UINT8_UPSAMPLING  # (once: an OpOverload hashes in Python)

    def checked(x, output_size, *rest):
        if min(output_size, default=1) <= 0 or min(x.shape[2:], default=1) <= 0 or not (
                x.dtype.is_floating_point or uint8 and x.dtype == torch.uint8):
            T.cpu_refusal(op, x, output_size, *rest)
        if x.numel() == 0:  # (an empty batch; torch's meta kernels of nearest fail on it)
            in_cpu_words(op, (x, output_size, *rest), {})  # (no channels: the CPU refuses)
            return T.empty((*x.shape[:2], *output_size), x.dtype)
        return kernel(x, output_size, *rest)

    return checked


def _register_nearest_forward(op, k, exact):
    """Nearest upsampling of any dtype the CPU upsamples: an index table per axis (the CPU's
    formulas, as the backward's) and one copying kernel (PyTorch's decomposition, the path
    before, ran ~10 ops a call: ~0.6 ms for a 16 x 16 image here)."""
    @keeps_channels_last(0)
    def kernel(x, output_size, *scales):
        meta = meta_check(op, (x, output_size, *scales))
        if not isinstance(x, NeuronTensor):
            return decomposition_table[op](x, output_size, *scales)
        scales = list(scales) + [None] * (k - len(scales))
        sizes = x.shape[x.dim() - k:]
        tables = [nearest_taps(sizes[a], output_size[a], scales[a], exact, k == 2)[0].reshape(-1)
                  for a in range(k)]
        return nearest(x, meta.shape, k, tables)

    register(op)(_sizes_checked(op, kernel))


for _k, _op, _exact in ((1, aten.upsample_nearest1d.default, False),
                        (2, aten.upsample_nearest2d.default, False),
                        (3, aten.upsample_nearest3d.default, False),
                        (1, aten._upsample_nearest_exact1d.default, True),
                        (2, aten._upsample_nearest_exact2d.default, True),
                        (3, aten._upsample_nearest_exact3d.default, True)):
    _register_nearest_forward(_op, _k, _exact)


def _register_aa(op, cubic):
    def kernel(x, output_size, align_corners, scales_h=None, scales_w=None):
        args = (x, output_size, align_corners, scales_h, scales_w)
        meta = meta_check(op, args)
        if isinstance(x, NeuronTensor) and tuple(meta.shape) == tuple(x.shape):
            return aten.clone.default(x)  # (the CPU copies an unresized input, any dtype)
        if x.dtype in (torch.bfloat16, torch.float16):  # as the CPU: no 16-bit weights
            raise NotImplementedError(f'"compute_index_ranges_weights" not implemented for '
                                      f'\'{T.dtype_name(x.dtype)}\'')
        if isinstance(x, NeuronTensor) and x.dtype == torch.uint8 and x.dim() == 4:
            return resize_uint8(x, meta.shape[2:], align_corners, (scales_h, scales_w),
                                True, cubic)
        if not isinstance(x, NeuronTensor) or not x.dtype.is_floating_point or x.dim() != 4:
            return _fallback(op, args)
        tables = [aa_taps(x.shape[2 + a], output_size[a], align_corners, s, cubic, True)
                  for a, s in enumerate((scales_h, scales_w))]
        return resample(x, meta.shape, 2, tables)

    register(op)(keeps_channels_last(0)(_sizes_checked(op, kernel)))


_register_aa(aten._upsample_bilinear2d_aa.default, False)
_register_aa(aten._upsample_bicubic2d_aa.default, True)


# Note [Linear interpolation]
# Linear, bilinear and trilinear upsampling of floats run `interpolate` on the CPU's tap
# tables, a share of planes per core. PyTorch's decomposition (the path before) blends
# neighbours as x0 + (x1 - x0) * t: four gathers for bilinear, and NaN wherever a neighbour
# is infinite (a score map masked with -inf became all NaN). The CPU weighs each tap and
# nests the sums (UpSampleKernel.cpp's Interpolate), which `interpolate` does in its order.
def _register_linear(op, k):
    def kernel(x, output_size, align_corners, *scales):
        args = (x, output_size, align_corners, *scales)
        meta = meta_check(op, args)
        scales = list(scales) + [None] * (k - len(scales))
        if isinstance(x, NeuronTensor) and x.dtype == torch.uint8 and x.dim() == 4 and k == 2:
            # uint8 images take the CPU's fixed-point path (Note [uint8 resampling])
            return resize_uint8(x, meta.shape[2:], align_corners, scales, False, False)
        if not isinstance(x, NeuronTensor) or not x.dtype.is_floating_point:
            return decomposition_table[op](*args)
        tables = [linear_taps(x.shape[2 + a], output_size[a], align_corners, scales[a])
                  for a in range(k)]
        return resample(x, meta.shape, k, tables, blend=True)

    register(op)(keeps_channels_last(0)(_sizes_checked(op, kernel)))


_register_linear(aten.upsample_linear1d.default, 1)
_register_linear(aten.upsample_bilinear2d.default, 2)
_register_linear(aten.upsample_trilinear3d.default, 3)


def _register_bicubic(op):
    """uint8 images take the CPU's fixed-point path (Note [uint8 resampling]); float images
    the weighted sums of the CPU's 4 x 4 taps (gather, as the antialiased modes: PyTorch's
    decomposition, the path before, ran ~175 ops a call, ~17 ms for a 4x4 image here, and
    was no closer to the CPU's bits); others the decomposition."""
    @keeps_channels_last(0)
    def floats(x, output_size, align_corners, scales_h=None, scales_w=None):
        meta = meta_check(op, (x, output_size, align_corners, scales_h, scales_w))
        tables = [cubic_taps(x.shape[2 + a], output_size[a], align_corners, s)
                  for a, s in enumerate((scales_h, scales_w))]
        return resample(x, meta.shape, 2, tables)

    def kernel(x, output_size, align_corners, scales_h=None, scales_w=None):
        args = (x, output_size, align_corners, scales_h, scales_w)
        if isinstance(x, NeuronTensor) and x.dim() == 4 and x.dtype.is_floating_point:
            return floats(*args)
        if isinstance(x, NeuronTensor) and x.dtype == torch.uint8 and x.dim() == 4:
            meta = meta_check(op, args)
            return resize_uint8(x, meta.shape[2:], align_corners, (scales_h, scales_w),
                                False, True)
        return decomposition_table[op](*args)

    register(op)(_sizes_checked(op, kernel))


_register_bicubic(aten.upsample_bicubic2d.default)


def _pad_tables(taps, k, sizes, outs, padding):
    # padding lists (left, right) pairs from the last dim backwards
    return [taps(sizes[a], outs[a], padding[2 * (k - 1 - a)]) for a in range(k)]


def _register_pad_backward(op, k, taps):
    def kernel(grad, x, padding):
        args = (grad, x, padding)
        meta_check(op, args)
        if not isinstance(grad, NeuronTensor) or not grad.dtype.is_floating_point:
            return _fallback(op, args)
        tables = _pad_tables(taps, k, x.shape[-k:], grad.shape[-k:], padding)
        return resample_backward(grad, x.shape, k, tables)

    register(op)(keeps_channels_last(1)(kernel))


for _k in (1, 2, 3):
    _register_pad_backward(getattr(aten, f"replication_pad{_k}d_backward").default, _k,
                           pad_taps)
    _register_pad_backward(getattr(aten, f"reflection_pad{_k}d_backward").default, _k,
                           reflect_taps)


# Note [Reflection pads]
# A reflection pad picks its elements along each padded dim by the taps' indices, one copy
# launch, and its gradient scatters through the tap tables, as replication pads' do;
# PyTorch's decomposition of the backward took 144 small ops for a 2-D pad (28x the CPU's
# time in a style-transfer network). The decomposition wraps a pad as wide as its dim
# around where the CPU refuses it: the CPU's checks run first.
def _register_reflection_pad(op, k):
    def kernel(x, padding):
        for a in range(k):
            size, (left, right) = x.shape[-1 - a], padding[2 * a:2 * a + 2]
            if left >= size or right >= size or size + left + right < 1:
                in_cpu_words(op, (x, padding), {})  # (an empty result may be allowed)
        if not isinstance(x, NeuronTensor):
            return decomposition_table[op](x, padding)
        meta = meta_check(op, (x, padding))
        out = T.empty(meta.shape, x.dtype)
        if out.numel() == 0:
            return out
        picked = x._nd  # (the elements, any dtype: a copy, nothing computed)
        for a, (index, _) in enumerate(_pad_tables(reflect_taps, k, x.shape[-k:],
                                                   meta.shape[-k:], padding)):
            picked = np.take(picked, index.reshape(-1), axis=a - k)
        out._nd[...] = picked
        core.launch("dma", out.numel(), x._nd.nbytes + out._nd.nbytes)
        return out

    register(op)(keeps_channels_last(0)(kernel))


for _k in (1, 2, 3):
    _register_reflection_pad(getattr(aten, f"reflection_pad{_k}d").default, _k)


def _register_replication_pad(op, k):
    """PyTorch's decomposition, after the CPU's check of the result's size (an output of no
    elements is refused in 1-D, allowed in 2-D and 3-D while another dim is left)."""
    def kernel(x, padding):
        if any(x.shape[-1 - a] + padding[2 * a] + padding[2 * a + 1] < 1 for a in range(k)):
            in_cpu_words(op, (x, padding), {})
        return decomposition_table[op](x, padding)

    register(op)(kernel)


for _k in (1, 2, 3):
    _register_replication_pad(getattr(aten, f"replication_pad{_k}d").default, _k)


# Grid sampling has its own file; importing it here registers it with the resampling ops.
from neuron_eager.ops import grid_sampling  # noqa: E402,F401
