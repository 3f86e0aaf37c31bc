"""uint8 image resizing (bilinear and bicubic, with or without antialias) with the CPU's
integer arithmetic, so torchvision pipelines on uint8 images give the CPU's pixels.

Note [uint8 resampling]
The CPU does not interpolate uint8 images in floating point: it follows PIL-SIMD. Per axis,
the filter weights are computed in double (the antialias windows of resampling.aa_taps,
also used for antialias=False with a fixed 2- or 4-tap window), then scaled to int16 with
the largest precision p that keeps the largest weight below 2^15. A pass sums int16
weight times uint8 pixel in integers, adds 2^(p-1), shifts right by p and clamps to
[0, 255]. The width is resampled first, into a uint8 image, then the height: two roundings,
as on the CPU (a float lerp rounded once differed by one in 12-19% of pixels).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import channels_last_like
from neuron_eager.ops.jit import njit


def _scale(size: int, out: int, align_corners: bool, scale) -> float:
    """area_pixel_compute_scale, in double."""
    if align_corners:
        return (size - 1) / (out - 1) if out > 1 else 0.0
    if scale is not None and scale > 0:
        return 1.0 / scale
    return size / out


def _triangle(x: float) -> float:
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _keys(a: float):
    def cubic(x: float) -> float:
        x = abs(x)
        if x < 1.0:
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        if x < 2.0:
            return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
        return 0.0
    return cubic


def _window_aa(i, size, s, support, taps, kernel):
    """The antialiased window of output i: a filter widened by the downscale factor, cut to
    the image and normalised to sum 1."""
    center = s * (i + 0.5)
    invscale = 1.0 / s if s >= 1.0 else 1.0
    xmin = max(int(center - support + 0.5), 0)  # int(): C's truncation
    xsize = min(max(min(int(center + support + 0.5), size) - xmin, 0), taps)
    w = [kernel((j + xmin - center + 0.5) * invscale) for j in range(xsize)]
    total = 0.0
    for v in w:
        total += v
    if total != 0.0:
        w = [v / total for v in w]
    return xmin, w, max([0.0] + w) if total != 0.0 else 0.0


def _window(i, size, s, taps, kernel, align_corners):
    """The fixed window of output i (antialias=False): the float path's taps around the
    source position, taps falling outside the image added to the border pixel's weight."""
    src = s * i if align_corners else s * (i + 0.5) - 0.5
    if taps == 2 and src < 0:
        src = 0.0  # linear clamps the source position, cubic does not
    index = min(math.floor(src), size - 1)
    lam = min(max(src - index, 0.0), 1.0)
    half = taps // 2
    lo = index - half + 1
    xmin = max(lo, 0)
    xsize = min(max(min(index + half + 1, size) - xmin, 0), taps)
    w = [0.0] * taps
    k, w_max = 0, 0.0
    for j in range(taps):
        v = kernel((j + 1 - half) - lam)
        if lo + j <= 0:
            k = 0
        elif lo + j >= size - 1:
            k = xsize - 1
        w[k] += v
        w_max = max(w_max, w[k])  # (partial sums count, as on the CPU)
        k += 1
    return xmin, w[:xsize], w_max


def int16_taps(size: int, out: int, align_corners: bool, scale, antialias: bool,
               cubic: bool):
    """Per output index: first input index, tap count, and int16 weights (out, taps); and
    the weights' precision p (their unit is 2^p)."""
    s = _scale(size, out, align_corners, scale)
    width = 4 if cubic else 2
    # the antialiased bicubic filter is PIL's (a = -0.5); without antialias, a = -0.75
    kernel = _keys(-0.5 if antialias else -0.75) if cubic else _triangle
    if antialias:
        support = width * 0.5 * s if s >= 1.0 else width * 0.5
        taps = int(math.ceil(support)) * 2 + 1
    else:
        taps = width
    first = np.zeros(out, np.int64)
    count = np.zeros(out, np.int64)
    weights = np.zeros((out, taps), np.float64)
    w_max = 0.0
    for i in range(out):
        xmin, w, top = _window_aa(i, size, s, support, taps, kernel) if antialias else \
            _window(i, size, s, taps, kernel, align_corners)
        first[i], count[i] = xmin, len(w)
        weights[i, :len(w)] = w
        w_max = max(w_max, top)
    precision = 0
    while precision < 22 and int(0.5 + w_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    fixed = weights * float(1 << precision)
    fixed = np.where(fixed < 0, -0.5 + fixed, 0.5 + fixed)
    return first, count, np.trunc(fixed).astype(np.int64), precision


@njit(nogil=True)
def _pass(out, x, first, count, w, precision):
    """out[n, c, r, o] = clamp((2^(p-1) + sum_k w[o, k] x[n, c, r, first[o] + k]) >> p)."""
    half = 1 << (precision - 1) if precision > 0 else 0
    for n in range(out.shape[0]):
        for c in range(out.shape[1]):
            for r in range(out.shape[2]):
                for o in range(out.shape[3]):
                    acc = half
                    base = first[o]
                    for k in range(count[o]):
                        acc += w[o, k] * np.int64(x[n, c, r, base + k])
                    acc >>= precision
                    out[n, c, r, o] = 0 if acc < 0 else (255 if acc > 255 else acc)


def resize_uint8(x: T.NeuronTensor, size, align_corners: bool, scales, antialias: bool,
                 cubic: bool) -> T.NeuronTensor:
    """A 4-D uint8 image resized to `size` (H, W) as the CPU resizes it (Note [uint8
    resampling]); channels-last in, channels-last out."""
    N, C, H, W = x.shape
    Ho, Wo = size
    out = T.empty((N, C, Ho, Wo), torch.uint8)
    if out.numel() == 0:
        return channels_last_like(x, out)
    src = x._nd
    if Wo != W:
        wide = np.empty((N, C, H, Wo), np.uint8)
        _pass(wide, src, *int16_taps(W, Wo, align_corners, scales[1], antialias, cubic))
        src = wide
    result = out._nd
    if Ho != H:  # the height pass sees the image transposed: the interpolated axis last
        _pass(np.swapaxes(result, 2, 3), np.swapaxes(src, 2, 3),
              *int16_taps(H, Ho, align_corners, scales[0], antialias, cubic))
    else:
        result[...] = src
    core.launch("vector", out.numel(), x._nd.nbytes + out._nd.nbytes)
    return channels_last_like(x, out)
