"""Grid sampling (aten.grid_sampler_2d / grid_sampler_3d and their backwards) on GpSimd.

Forwards follow the CPU's kernels step by step, including their 16-bit arithmetic (the CPU
computes 16-bit grid sampling in the input dtype, rounding after every operation), so
16-bit results match the CPU bit for bit; backwards compute in fp32 and round once.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit
from neuron_eager.ops.matmul import meta_check, narrow_into, result_buffer, widen
from neuron_eager.ops.registry import register

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor
F32 = np.float32


def _fallback(op, args):
    from neuron_eager.ops.router import cpu_fallback

    return cpu_fallback(op, args, {})


# Modes: interpolation 0 bilinear, 1 nearest, 2 bicubic; padding 0 zeros, 1 border,
# 2 reflection. The forward follows the CPU's vectorised kernel (GridSamplerKernel.cpp) step
# by step; for 16-bit inputs that kernel computes in the input dtype, rounding after every
# operation, and `rnd` reproduces that rounding (it is the identity for fp32). The backward
# (fp32) follows the CPU's reference formulas (GridSampler.h).
_grid_forward: dict = {}


def _grid_forward_kernel(code: str):
    kernel = _grid_forward.get(code)
    if kernel is not None:
        return kernel
    if code in ("bf16", "f16"):
        load, store = numerics.loader(code, "f32"), numerics.storer(code)
        # a call, not inlined: inlining ~60 f16 roundings makes the compile explode
        rnd = njit(lambda v: load(store(np.float32(v))))
    else:
        rnd = njit(inline="always")(lambda v: np.float32(v))

    @njit(inline="always")
    def locate(v, size, padding, align, unnormalize_only):
        one, half = F32(1), F32(0.5)
        if align:
            x = rnd(rnd(v + one) * rnd(rnd(F32(size - 1)) / F32(2)))
        else:
            x = rnd(rnd(rnd(v + one) * rnd(rnd(F32(size)) / F32(2))) - half)
        if unnormalize_only:
            return x
        return coordinates(x, size, padding, align)

    @njit(inline="always")
    def coordinates(x, size, padding, align):
        max_val = rnd(F32(size - 1))
        if padding == 2:
            low = F32(0) if align else F32(-0.5)
            span = rnd(F32((size - 1) * 2)) if align else rnd(F32(size * 2))
            if span == 0:
                x = F32(0)
            else:
                a = abs(rnd(x - low))
                flips = np.trunc(rnd(a / span))
                extra = rnd(a - rnd(flips * span))
                x = rnd(min(extra, rnd(span - extra)) + low)
        if padding != 0:
            x = _clip(x, max_val)
        return x

    @njit(inline="always")
    def bounded(x, base, sh, sw, ix, iy, H, W, padding, align):
        fx = coordinates(F32(ix), W, padding, align)
        fy = coordinates(F32(iy), H, padding, align)
        if fx > -1 and fx < W and fy > -1 and fy < H:
            return x[base + np.int64(fy) * sh + np.int64(fx) * sw]
        return F32(0)

    @njit(inline="always")
    def cubic(t):
        a, one = F32(-0.75), F32(1)
        c = np.empty(4, np.float32)
        u = rnd(t + one)
        c[0] = rnd(rnd(rnd(rnd(rnd(rnd(a * u) - rnd(F32(5) * a)) * u) + rnd(F32(8) * a)) * u)
                   - rnd(F32(4) * a))
        c[1] = rnd(rnd(rnd(rnd(rnd(rnd(a + F32(2)) * t) - rnd(a + F32(3))) * t) * t) + one)
        u = rnd(one - t)
        c[2] = rnd(rnd(rnd(rnd(rnd(rnd(a + F32(2)) * u) - rnd(a + F32(3))) * u) * u) + one)
        u = rnd(F32(2) - t)
        c[3] = rnd(rnd(rnd(rnd(rnd(rnd(a * u) - rnd(F32(5) * a)) * u) + rnd(F32(8) * a)) * u)
                   - rnd(F32(4) * a))
        return c

    @njit(error_model="numpy", nogil=True)
    def kernel(out, x, grid, g, mode, padding, align):
        N, C, H, W, sn, sc, sh, sw, Ho, Wo, gn, gh, gw, gk = g[0], g[1], g[2], g[3], g[4], \
            g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13]
        for n in range(N):
            for oh in range(Ho):
                for ow in range(Wo):
                    at = n * gn + oh * gh + ow * gw
                    ix = locate(grid[at], W, padding, align, mode == 2)
                    iy = locate(grid[at + gk], H, padding, align, mode == 2)
                    for c in range(C):
                        base = n * sn + c * sc
                        o = ((n * C + c) * Ho + oh) * Wo + ow
                        if mode == 1:
                            rx, ry = np.rint(ix), np.rint(iy)
                            v = F32(0)
                            if rx > -1 and rx < W and ry > -1 and ry < H:
                                v = x[base + np.int64(ry) * sh + np.int64(rx) * sw]
                            out[o] = v
                        elif mode == 0:
                            xw, yn = np.floor(ix), np.floor(iy)
                            w_, n_ = rnd(ix - xw), rnd(iy - yn)
                            e, s = rnd(F32(1) - w_), rnd(F32(1) - n_)
                            x0, y0 = np.int64(xw), np.int64(yn)
                            v = F32(0)
                            for dy in range(2):
                                for dx in range(2):
                                    px, py = x0 + dx, y0 + dy
                                    wt = rnd((n_ if dy else s) * (w_ if dx else e))
                                    val = F32(0)
                                    if 0 <= px < W and 0 <= py < H:
                                        val = x[base + py * sh + px * sw]
                                    term = rnd(val * wt)
                                    v = term if dx + dy == 0 else rnd(v + term)
                            out[o] = v
                        else:
                            fx, fy = np.floor(ix), np.floor(iy)
                            cx, cy = cubic(rnd(ix - fx)), cubic(rnd(iy - fy))
                            # (taps stay floats until clipped, as the CPU's: an int64 of a
                            # coordinate past 2^63 wrapped to the other border)
                            x0, y0 = rnd(fx - F32(1)), rnd(fy - F32(1))
                            v = F32(0)
                            for i in range(4):
                                r = F32(0)
                                for j in range(4):
                                    term = rnd(cx[j] * bounded(x, base, sh, sw, rnd(x0 + j),
                                                               rnd(y0 + i), H, W, padding, align))
                                    r = term if j == 0 else rnd(r + term)
                                term = rnd(cy[i] * r)
                                v = term if i == 0 else rnd(v + term)
                            out[o] = v

    _grid_forward[code] = kernel
    return kernel


@njit(inline="always")
def _clip(x, top):
    """x clipped to [0, top], NaN to 0 (CUDA's fmaxf; the CPU lands on the same pixel)."""
    if x > top:
        return top
    return x if x > F32(0) else F32(0)


@njit(inline="always")
def _source_grad(v, size, padding, align):
    """grid_sampler_compute_source_index_set_grad: the pixel coordinate and d(it)/d(v)."""
    if align:
        mult = F32(size - 1) / F32(2)
        x = (v + F32(1)) / F32(2) * F32(size - 1)
    else:
        mult = F32(size) / F32(2)
        x = ((v + F32(1)) * F32(size) - F32(1)) / F32(2)
    if padding == 2:
        lo2, hi2 = (0, 2 * (size - 1)) if align else (-1, 2 * size - 1)
        if lo2 == hi2:
            x, mult = F32(0), F32(0)
        else:
            lo, span = F32(lo2) / F32(2), F32(hi2 - lo2) / F32(2)
            x = x - lo
            sign = F32(1)
            if x < 0:
                sign, x = F32(-1), -x
            extra = np.fmod(x, span)
            flips = np.int64(np.floor(x / span))
            if flips % 2 == 0:
                x = extra + lo
            else:
                x, sign = span - extra + lo, -sign
            mult *= sign
    if padding != 0:
        if x <= 0:
            x, mult = F32(0), F32(0)
        elif x >= F32(size - 1):
            x, mult = F32(size - 1), F32(0)
    return x, mult


@njit(inline="always")
def _reflect_clip(x, size, padding, align):
    if padding == 2:
        lo2, hi2 = (0, 2 * (size - 1)) if align else (-1, 2 * size - 1)
        if lo2 == hi2:
            return F32(0)
        lo, span = F32(lo2) / F32(2), F32(hi2 - lo2) / F32(2)
        a = abs(x - lo)
        extra = np.fmod(a, span)
        x = extra + lo if np.int64(np.floor(a / span)) % 2 == 0 else span - extra + lo
    if padding != 0:
        x = _clip(x, F32(size - 1))
    return x


@njit(inline="always")
def _cubic_coeffs(t):
    a, one = F32(-0.75), F32(1)
    c, d = np.empty(4, np.float32), np.empty(4, np.float32)
    u = t + one
    c[0] = ((a * u - F32(5) * a) * u + F32(8) * a) * u - F32(4) * a
    c[1] = ((a + F32(2)) * t - (a + F32(3))) * t * t + one
    u = one - t
    c[2] = ((a + F32(2)) * u - (a + F32(3))) * u * u + one
    u = F32(2) - t
    c[3] = ((a * u - F32(5) * a) * u + F32(8) * a) * u - F32(4) * a
    u = -one - t
    d[0] = (F32(-3) * a * u - F32(10) * a) * u - F32(8) * a
    u = -t
    d[1] = (F32(-3) * (a + F32(2)) * u - F32(2) * (a + F32(3))) * u
    u = one - t
    d[2] = (F32(3) * (a + F32(2)) * u - F32(2) * (a + F32(3))) * u
    u = F32(2) - t
    d[3] = (F32(3) * a * u - F32(10) * a) * u + F32(8) * a
    return c, d


@njit(error_model="numpy", nogil=True)
def grid_sample_backward(gin, ggrid, go, x, grid, g, mode, padding, align):
    """gin (contiguous N, C, H, W) and ggrid (contiguous N, Ho, Wo, 2), both fp32."""
    N, C, H, W, sn, sc, sh, sw, Ho, Wo, gn, gh, gw, gk = g[0], g[1], g[2], g[3], g[4], g[5], \
        g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13]
    on, oc, oh_, ow_ = g[14], g[15], g[16], g[17]
    for n in range(N):
        for oh in range(Ho):
            for ow in range(Wo):
                at = n * gn + oh * gh + ow * gw
                gx, gy = F32(0), F32(0)
                if mode == 2:
                    ix, mx = _source_grad(grid[at], W, 0, align)
                    iy, my = _source_grad(grid[at + gk], H, 0, align)
                else:
                    ix, mx = _source_grad(grid[at], W, padding, align)
                    iy, my = _source_grad(grid[at + gk], H, padding, align)
                for c in range(C):
                    gv = go[n * on + c * oc + oh * oh_ + ow * ow_]
                    xbase = n * sn + c * sc
                    gbase = (n * C + c) * H * W
                    if mode == 1:
                        rx, ry = np.int64(np.rint(ix)), np.int64(np.rint(iy))
                        if 0 <= rx < W and 0 <= ry < H:
                            gin[gbase + ry * W + rx] += gv
                    elif mode == 0:
                        x0, y0 = np.int64(np.floor(ix)), np.int64(np.floor(iy))
                        fx0, fy0 = np.floor(ix), np.floor(iy)
                        for dy in range(2):
                            for dx in range(2):
                                px, py = x0 + dx, y0 + dy
                                if not (0 <= px < W and 0 <= py < H):
                                    continue
                                wx = (ix - fx0) if dx else (fx0 + F32(1) - ix)
                                wy = (iy - fy0) if dy else (fy0 + F32(1) - iy)
                                gin[gbase + py * W + px] += wx * wy * gv
                                val = x[xbase + py * sh + px * sw]
                                gx += val * wy * gv * (F32(1) if dx else F32(-1))
                                gy += val * wx * gv * (F32(1) if dy else F32(-1))
                    else:
                        fx, fy = np.floor(ix), np.floor(iy)
                        cx, dcx = _cubic_coeffs(ix - fx)
                        cy, dcy = _cubic_coeffs(iy - fy)
                        x0, y0 = F32(fx - F32(1)), F32(fy - F32(1))  # (floats: as forward)
                        for i in range(4):
                            for j in range(4):
                                px = _reflect_clip(F32(x0 + F32(i)), W, padding, align)
                                py = _reflect_clip(F32(y0 + F32(j)), H, padding, align)
                                if px > -1 and px < W and py > -1 and py < H:
                                    qx, qy = np.int64(px), np.int64(py)
                                    gin[gbase + qy * W + qx] += gv * cx[i] * cy[j]
                                    val = x[xbase + qy * sh + qx * sw]
                                    gx -= val * dcx[i] * cy[j] * gv
                                    gy -= val * dcy[j] * cx[i] * gv
                if mode != 1:
                    ggrid[((n * Ho + oh) * Wo + ow) * 2] = mx * gx
                    ggrid[((n * Ho + oh) * Wo + ow) * 2 + 1] = my * gy


def _grid_geometry(x, grid, out=None):
    return np.array([*x.shape, *x.stride(), grid.shape[1], grid.shape[2], grid.stride(0),
                     grid.stride(1), grid.stride(2), grid.stride(3),
                     *(out.stride() if out is not None else (0, 0, 0, 0))], np.int64)


def _grid_native(x, grid, mode):
    return isinstance(x, NeuronTensor) and isinstance(grid, NeuronTensor) and \
        x.dim() == 4 and grid.dim() == 4 and x.dtype.is_floating_point and \
        grid.dtype == x.dtype and mode in (0, 1, 2)


def _check_grid(grid, coords: int) -> None:
    """The CPU's error for a grid whose last dim is not (x, y) or (x, y, z) (the meta kernel
    asserts instead)."""
    if grid.dim() == coords + 2 and grid.shape[-1] != coords:
        raise RuntimeError(f"grid_sampler(): expected grid to have size {coords} in last "
                           f"dimension, but got grid with sizes {list(grid.shape)}")


@register(aten.grid_sampler_2d.default)
def grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    args = (x, grid, interpolation_mode, padding_mode, align_corners)
    _check_grid(grid, 2)
    meta_check(aten.grid_sampler_2d.default, args)
    if not _grid_native(x, grid, interpolation_mode):
        return _fallback(aten.grid_sampler_2d.default, args)
    N, C = x.shape[:2]
    out = T.empty((N, C, grid.shape[1], grid.shape[2]), x.dtype)
    if out.numel():
        res = result_buffer(out)
        kernel = _grid_forward_kernel(numerics.CODE[x.dtype])
        kernel(res, widen(x), widen(grid), _grid_geometry(x, grid), interpolation_mode,
               padding_mode, bool(align_corners))
        narrow_into(out, res)
        core.launch("gpsimd", out.numel(), x._nd.nbytes + grid._nd.nbytes + out._nd.nbytes)
    return out


@register(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners,
                             output_mask):
    args = (grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask)
    if not _grid_native(x, grid, interpolation_mode) or not isinstance(grad, NeuronTensor) or \
            tuple(grad.shape) != (*x.shape[:2], *grid.shape[1:3]):
        return _fallback(aten.grid_sampler_2d_backward.default, args)
    gin = T.empty(x.shape, x.dtype) if output_mask[0] else None
    ggrid = T.empty(grid.shape, grid.dtype)
    gin_v = np.zeros(x.numel(), F32)
    ggrid_v = np.zeros(grid.numel(), F32)
    if grad.numel():
        grid_sample_backward(gin_v, ggrid_v, widen(grad), widen(x), widen(grid),
                             _grid_geometry(x, grid, grad), interpolation_mode, padding_mode,
                             bool(align_corners))
        core.launch("gpsimd", grad.numel(), x._nd.nbytes + grid._nd.nbytes + grad._nd.nbytes)
    if gin is not None:
        narrow_into(gin, gin_v)
    narrow_into(ggrid, ggrid_v)
    return gin, ggrid


# 3-D grid sampling (bilinear = trilinear, nearest) follows the CPU's scalar reference
# (GridSampler.cpp). Its 16-bit forward computes in the input dtype, every operation rounded
# (c10's Half/BFloat16 arithmetic), which `rnd` reproduces; the backward is fp32.
# g: N, C, D, H, W, input strides (5), Do, Ho, Wo, grid strides (n, d, h, w, k), grad strides.
_grid3_forward: dict = {}


def _grid3_forward_kernel(code: str):
    kernel = _grid3_forward.get(code)
    if kernel is not None:
        return kernel
    if code in ("bf16", "f16"):
        load, store = numerics.loader(code, "f32"), numerics.storer(code)
        rnd = njit(lambda v: load(store(np.float32(v))))
    else:
        rnd = njit(inline="always")(lambda v: np.float32(v))

    @njit(inline="always")
    def locate(v, size, padding, align):
        one, two = F32(1), F32(2)
        if align:
            x = rnd(rnd(rnd(v + one) / two) * rnd(F32(size - 1)))
        else:
            x = rnd(rnd(rnd(rnd(v + one) * rnd(F32(size))) - one) / two)
        if padding == 2:
            lo2, hi2 = (0, 2 * (size - 1)) if align else (-1, 2 * size - 1)
            if lo2 == hi2:
                return F32(0)
            lo, span = rnd(F32(lo2) / two), rnd(F32(hi2 - lo2) / two)
            a = abs(rnd(x - lo))
            extra = rnd(np.fmod(a, span))
            if np.int64(np.floor(rnd(a / span))) % 2 == 0:
                x = rnd(extra + lo)
            else:
                x = rnd(rnd(span - extra) + lo)
        if padding != 0:
            x = _clip(x, F32(size - 1))
        return x

    @njit(error_model="numpy", nogil=True)
    def kernel(out, x, grid, g, mode, padding, align):
        N, C, D, H, W = g[0], g[1], g[2], g[3], g[4]
        sn, sc, sd, sh, sw = g[5], g[6], g[7], g[8], g[9]
        Do, Ho, Wo, gn, gd, gh, gw, gk = g[10], g[11], g[12], g[13], g[14], g[15], g[16], g[17]
        for n in range(N):
            for od in range(Do):
                for oh in range(Ho):
                    for ow in range(Wo):
                        at = n * gn + od * gd + oh * gh + ow * gw
                        ix = locate(grid[at], W, padding, align)
                        iy = locate(grid[at + gk], H, padding, align)
                        iz = locate(grid[at + 2 * gk], D, padding, align)
                        fx, fy, fz = np.floor(ix), np.floor(iy), np.floor(iz)
                        x0, y0, z0 = np.int64(fx), np.int64(fy), np.int64(fz)
                        for c in range(C):
                            xb = n * sn + c * sc
                            o = (((n * C + c) * Do + od) * Ho + oh) * Wo + ow
                            if mode == 1:
                                rx, ry = np.int64(np.rint(ix)), np.int64(np.rint(iy))
                                rz = np.int64(np.rint(iz))
                                v = F32(0)
                                if 0 <= rx < W and 0 <= ry < H and 0 <= rz < D:
                                    v = x[xb + rz * sd + ry * sh + rx * sw]
                                out[o] = v
                                continue
                            s = F32(0)
                            for dz in range(2):
                                wz = rnd(iz - fz) if dz else rnd(fz + F32(1) - iz)
                                for dy in range(2):
                                    wy = rnd(iy - fy) if dy else rnd(fy + F32(1) - iy)
                                    for dx in range(2):
                                        wx = rnd(ix - fx) if dx else rnd(fx + F32(1) - ix)
                                        px, py, pz = x0 + dx, y0 + dy, z0 + dz
                                        if 0 <= px < W and 0 <= py < H and 0 <= pz < D:
                                            w = rnd(rnd(wx * wy) * wz)
                                            val = x[xb + pz * sd + py * sh + px * sw]
                                            s = rnd(s + rnd(val * w))
                            out[o] = s

    _grid3_forward[code] = kernel
    return kernel


@njit(error_model="numpy", nogil=True)
def grid_sample_3d_backward(gin, ggrid, go, x, grid, g, mode, padding, align):
    """gin (contiguous N, C, D, H, W) and ggrid (contiguous N, Do, Ho, Wo, 3), both fp32."""
    N, C, D, H, W = g[0], g[1], g[2], g[3], g[4]
    sn, sc, sd, sh, sw = g[5], g[6], g[7], g[8], g[9]
    Do, Ho, Wo, gn, gd, gh, gw, gk = g[10], g[11], g[12], g[13], g[14], g[15], g[16], g[17]
    on, oc, od_, oh_, ow_ = g[18], g[19], g[20], g[21], g[22]
    for n in range(N):
        for od in range(Do):
            for oh in range(Ho):
                for ow in range(Wo):
                    at = n * gn + od * gd + oh * gh + ow * gw
                    ix, mx = _source_grad(grid[at], W, padding, align)
                    iy, my = _source_grad(grid[at + gk], H, padding, align)
                    iz, mz = _source_grad(grid[at + 2 * gk], D, padding, align)
                    fx, fy, fz = np.floor(ix), np.floor(iy), np.floor(iz)
                    x0, y0, z0 = np.int64(fx), np.int64(fy), np.int64(fz)
                    gx, gy, gz = F32(0), F32(0), F32(0)
                    for c in range(C):
                        xb = n * sn + c * sc
                        gv = go[n * on + c * oc + od * od_ + oh * oh_ + ow * ow_]
                        gb = (n * C + c) * D * H * W
                        if mode == 1:
                            rx, ry = np.int64(np.rint(ix)), np.int64(np.rint(iy))
                            rz = np.int64(np.rint(iz))
                            if 0 <= rx < W and 0 <= ry < H and 0 <= rz < D:
                                gin[gb + (rz * H + ry) * W + rx] += gv
                            continue
                        for dz in range(2):
                            wz = (iz - fz) if dz else (fz + F32(1) - iz)
                            for dy in range(2):
                                wy = (iy - fy) if dy else (fy + F32(1) - iy)
                                for dx in range(2):
                                    wx = (ix - fx) if dx else (fx + F32(1) - ix)
                                    px, py, pz = x0 + dx, y0 + dy, z0 + dz
                                    if not (0 <= px < W and 0 <= py < H and 0 <= pz < D):
                                        continue
                                    val = x[xb + pz * sd + py * sh + px * sw]
                                    gin[gb + (pz * H + py) * W + px] += wx * wy * wz * gv
                                    gx += val * wy * wz * gv * (F32(1) if dx else F32(-1))
                                    gy += val * wx * wz * gv * (F32(1) if dy else F32(-1))
                                    gz += val * wx * wy * gv * (F32(1) if dz else F32(-1))
                    if mode != 1:
                        q = (((n * Do + od) * Ho + oh) * Wo + ow) * 3
                        ggrid[q], ggrid[q + 1], ggrid[q + 2] = mx * gx, my * gy, mz * gz


def _grid3_native(x, grid, mode):
    return isinstance(x, NeuronTensor) and isinstance(grid, NeuronTensor) and \
        x.dim() == 5 and grid.dim() == 5 and x.dtype.is_floating_point and \
        grid.dtype == x.dtype and mode in (0, 1) and grid.shape[-1] == 3 and \
        grid.shape[0] == x.shape[0]


def _grid3_geometry(x, grid, grad=None):
    return np.array([*x.shape, *x.stride(), *grid.shape[1:4], *grid.stride(),
                     *(grad.stride() if grad is not None else (0,) * 5)], np.int64)


@register(aten.grid_sampler_3d.default)
def grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    args = (x, grid, interpolation_mode, padding_mode, align_corners)
    _check_grid(grid, 3)
    if not _grid3_native(x, grid, interpolation_mode):
        return _fallback(aten.grid_sampler_3d.default, args)
    out = T.empty((*x.shape[:2], *grid.shape[1:4]), x.dtype)
    if out.numel():
        res = result_buffer(out)
        kernel = _grid3_forward_kernel(numerics.CODE[x.dtype])
        kernel(res, widen(x), widen(grid), _grid3_geometry(x, grid), interpolation_mode,
               padding_mode, bool(align_corners))
        narrow_into(out, res)
        core.launch("gpsimd", out.numel(), x._nd.nbytes + grid._nd.nbytes + out._nd.nbytes)
    return out


@register(aten.grid_sampler_3d_backward.default)
def grid_sampler_3d_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners,
                             output_mask):
    args = (grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask)
    if not _grid3_native(x, grid, interpolation_mode) or not isinstance(grad, NeuronTensor) or \
            tuple(grad.shape) != (*x.shape[:2], *grid.shape[1:4]):
        return _fallback(aten.grid_sampler_3d_backward.default, args)
    gin_v, ggrid_v = np.zeros(x.numel(), F32), np.zeros(grid.numel(), F32)
    if grad.numel():
        grid_sample_3d_backward(gin_v, ggrid_v, widen(grad), widen(x), widen(grid),
                                _grid3_geometry(x, grid, grad), interpolation_mode, padding_mode,
                                bool(align_corners))
        core.launch("gpsimd", grad.numel(), x._nd.nbytes + grid._nd.nbytes + grad._nd.nbytes)
    gin = None
    if output_mask[0]:
        gin = T.empty(x.shape, x.dtype)
        narrow_into(gin, gin_v)
    ggrid = T.empty(grid.shape, grid.dtype)
    narrow_into(ggrid, ggrid_v)
    return gin, ggrid


# -- affine_grid -------------------------------------------------------------------------
# Note [affine_grid as ATen builds it]
# PyTorch's Python decomposition makes the base grid as linspace(-a, a) with a = (n-1)/n;
# ATen scales linspace(-1, 1) by (n-1), then divides by n, and multiplies by theta with a
# bmm. The coordinates differ by an ulp, which flips grid_sample's gradient at a pixel centre
# (a spatial transformer starting at the identity sits on them all): so ATen's steps here.
def _steps(like, n: int, align_corners: bool):
    if n <= 1:
        return aten.zeros.default([1], dtype=like.dtype, device=like.device)
    steps = aten.linspace.default(-1, 1, n, dtype=like.dtype, device=like.device)
    return steps if align_corners else aten.div.Tensor(aten.mul.Tensor(steps, n - 1), n)


def _base_grid(like, size, align_corners: bool):
    """(N, prod(spatial), dims + 1) points (x, y[, z], 1), x varying fastest."""
    spatial = list(size[2:])
    base = aten.empty.memory_format([size[0], *spatial, len(spatial) + 1], dtype=like.dtype,
                                    device=like.device)
    for d in range(len(spatial)):  # coordinate d runs along spatial dim -1 - d
        axis = [1] * len(spatial)
        axis[len(spatial) - 1 - d] = spatial[len(spatial) - 1 - d]
        aten.copy_.default(aten.select.int(base, -1, d), aten.view.default(
            _steps(like, axis[len(spatial) - 1 - d], align_corners), axis))
    aten.fill_.Scalar(aten.select.int(base, -1, len(spatial)), 1)
    return aten.view.default(base, [size[0], -1, len(spatial) + 1])


@register(aten.affine_grid_generator.default)
def affine_grid_generator(theta, size, align_corners):
    grid = aten.bmm.default(_base_grid(theta, size, align_corners),
                            aten.transpose.int(theta, 1, 2))
    return aten.view.default(grid, [*size[:1], *size[2:], len(size) - 2])


@register(aten.affine_grid_generator_backward.default)
def affine_grid_generator_backward(grad, size, align_corners):
    base = _base_grid(grad, size, align_corners)
    grad_theta = aten.bmm.default(aten.transpose.int(base, 1, 2),
                                  aten.view.default(grad, [size[0], -1, len(size) - 2]))
    return aten.transpose.int(grad_theta, 1, 2)
