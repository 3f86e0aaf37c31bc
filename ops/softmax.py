"""Softmax and log-softmax over any dim, forward and backward (hot: attention, cross-entropy).

A tensor is seen as rows of (outer, n, inner) with strides, so transposed, sliced and
expanded inputs need no copy when their outer and inner dims each merge into one. The row max
and sum are fp32 and each output is rounded once. Each op is one launch: Scalar engine where
it exponentiates, Vector engine for softmax's backward.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import kernelgen, numerics, workers
from neuron_eager.ops import tensor as T
from neuron_eager.ops.activation import exp_f32, log_f32
from neuron_eager.ops.copy import finish, staged
from neuron_eager.ops.jit import njit
from neuron_eager.ops.numerics import SUM_LANES, lane_sum, row_max
from neuron_eager.ops.tensor import dtype_name as _dtype_label
from neuron_eager.ops.registry import register

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor
_NEG_INF = np.float32(-np.inf)
_0, _1 = np.float32(0), np.float32(1)
_kernels: dict = {}

# Kernel modes. "safe" is softmax whose fully masked rows (max = -inf) give zeros.
SOFTMAX, LOG_SOFTMAX, SAFE_SOFTMAX = "softmax", "log_softmax", "safe_softmax"


# Note [Softmax kernels]: each layout has its own kernel, compiled on first use, and each
# calls load/store at as few sites as possible: they inline, and every site adds compile time.
# A row along the last dim is staged in fp32 and walked in passes that each vectorize: the
# max (numerics.row_max), the exponentials, their sum (Note [Sum order] in numerics.py),
# then the outputs, scaled by the sum's reciprocal as the CPU's kernel scales them (a
# fused loop that summed as it exponentiated ran one element at a time: 9 ns an element).
def _forward_lastdim(mode: str, load, store):
    log, safe = mode == LOG_SOFTMAX, mode == SAFE_SOFTMAX

    def kernel(lo, hi, out, x, so, sn, n):
        # Rows lo..hi-1 along the last (merged) dim. out: contiguous, flat; x: flat from the
        # first element.
        row = np.empty(n, np.float32)  # x, then x - max (log) or exp(x - max)
        exps = np.empty(n if log else 0, np.float32)
        lanes = np.empty(SUM_LANES, np.float32)
        for o in range(lo, hi):
            start, at = np.uint64(o) * np.uint64(so), np.uint64(o) * np.uint64(n)
            if sn == 1:
                for j in range(n):
                    row[j] = load(x[start + np.uint64(j)])
            else:
                for j in range(n):
                    row[j] = load(x[start + np.uint64(j) * np.uint64(sn)])
            m = row_max(row, n)
            if log:
                for j in range(n):
                    v = row[j] - m
                    row[j] = v
                    exps[j] = exp_f32(v)
                total = log_f32(lane_sum(exps, n, lanes))
                for j in range(n):
                    out[at + np.uint64(j)] = store(row[j] - total)
                continue
            if safe and m == _NEG_INF:  # a row masked whole: zeros
                for j in range(n):
                    out[at + np.uint64(j)] = store(_0)
                continue
            for j in range(n):
                row[j] = exp_f32(row[j] - m)
            scale = _1 / lane_sum(row, n, lanes)
            for j in range(n):
                out[at + np.uint64(j)] = store(row[j] * scale)

    return njit(**kernelgen.JIT_OPTIONS)(kernel)


def _forward_inner(mode: str, load, store):
    log, safe = mode == LOG_SOFTMAX, mode == SAFE_SOFTMAX

    def kernel(lo, hi, out, x, so, sn, si, n, inner):
        # Rows along a dim with `inner` > 1 elements after it: statistics per inner position,
        # each pass a loop over the inner positions (vectorized; unsigned offsets).
        row = np.empty(n * inner, np.float32)
        mx = np.empty(inner, np.float32)
        total = np.empty(inner, np.float32)
        for o in range(lo, hi):
            mx[:] = _NEG_INF
            total[:] = _0
            for j in range(n):
                src = np.uint64(o * so + j * sn)
                at = np.uint64(j * inner)
                for i in range(inner):
                    v = load(x[src + np.uint64(i * si)])
                    row[at + np.uint64(i)] = v
                    m = mx[i]
                    mx[i] = v if (v > m or v != v) and m == m else m
            for j in range(n):
                at = np.uint64(j * inner)
                for i in range(inner):
                    v = row[at + np.uint64(i)] - mx[i]
                    e = exp_f32(v)
                    total[i] += e
                    row[at + np.uint64(i)] = v if log else e
            if log:
                for i in range(inner):
                    total[i] = log_f32(total[i])
            for j in range(n):
                at = np.uint64(j * inner)
                dst = np.uint64((o * n + j) * inner)
                for i in range(inner):
                    r = row[at + np.uint64(i)]
                    if log:
                        v = r - total[i]
                    else:
                        v = _0 if safe and mx[i] == _NEG_INF else r / total[i]
                    out[dst + np.uint64(i)] = store(v)

    return njit(**kernelgen.JIT_OPTIONS)(kernel)


def _backward_lastdim(log: bool, load_g, load_y, store):
    def kernel(lo, hi, out, g, y, g0, g1, y0, y1, n):
        # softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g); passes as forward
        terms = np.empty(n, np.float32)
        lanes = np.empty(SUM_LANES, np.float32)
        dense = g1 == 1 and y1 == 1
        for o in range(lo, hi):
            gb, yb = np.uint64(o) * np.uint64(g0), np.uint64(o) * np.uint64(y0)
            at = np.uint64(o) * np.uint64(n)
            for j in range(n):
                gj = gb + (np.uint64(j) if dense else np.uint64(j) * np.uint64(g1))
                yj = yb + (np.uint64(j) if dense else np.uint64(j) * np.uint64(y1))
                gv = load_g(g[gj])
                terms[j] = gv if log else gv * load_y(y[yj])
            total = lane_sum(terms, n, lanes)
            for j in range(n):
                gj = gb + (np.uint64(j) if dense else np.uint64(j) * np.uint64(g1))
                yj = yb + (np.uint64(j) if dense else np.uint64(j) * np.uint64(y1))
                gv, yv = load_g(g[gj]), load_y(y[yj])
                out[at + np.uint64(j)] = store(gv - exp_f32(yv) * total if log
                                               else yv * (gv - total))

    return njit(**kernelgen.JIT_OPTIONS)(kernel)


def _backward_inner(log: bool, load_g, load_y, store):
    def kernel(lo, hi, out, g, y, g0, g1, g2, y0, y1, y2, n, inner):
        # as _forward_inner: passes over the inner positions, unsigned offsets
        total = np.empty(inner, np.float32)
        for o in range(lo, hi):
            total[:] = _0
            for j in range(n):
                gb, yb = np.uint64(o * g0 + j * g1), np.uint64(o * y0 + j * y1)
                for i in range(inner):
                    gv = load_g(g[gb + np.uint64(i * g2)])
                    total[i] += gv if log else gv * load_y(y[yb + np.uint64(i * y2)])
            for j in range(n):
                gb, yb = np.uint64(o * g0 + j * g1), np.uint64(o * y0 + j * y1)
                base = np.uint64((o * n + j) * inner)
                for i in range(inner):
                    gv, yv = load_g(g[gb + np.uint64(i * g2)]), load_y(y[yb + np.uint64(i * y2)])
                    t = total[i]
                    out[base + np.uint64(i)] = store(gv - exp_f32(yv) * t if log
                                                     else yv * (gv - t))

    return njit(**kernelgen.JIT_OPTIONS)(kernel)


def _kernel(key, make):
    kernel = _kernels.get(key)
    if kernel is None:
        kernel = _kernels[key] = make()
        kernelgen.stats["compiled"] += 1
    else:
        kernelgen.stats["hits"] += 1
    return kernel


# -- layout ------------------------------------------------------------------------------
def _merge(shape, stride):
    """(size, stride) of dims that merge into one, or None."""
    sizes, (strides,) = kernelgen.coalesce(list(shape), [list(stride)])
    return (sizes[0], strides[0]) if len(sizes) == 1 else None


def _rows(t: NeuronTensor, dim: int):
    """(flat array from the first element, (outer, n, inner) strides, sizes), copying if needed."""
    if t.dim() == 0:
        return t._nd.reshape(1), (0, 0, 0), (1, 1, 1)
    shape, stride = t.shape, t.stride()
    if t.is_contiguous():
        n, inner = shape[dim], T.numel(shape[dim + 1:])
        return t._nd.reshape(-1), (n * inner, inner, 1), (T.numel(shape[:dim]), n, inner)
    outer, inner = _merge(shape[:dim], stride[:dim]), _merge(shape[dim + 1:], stride[dim + 1:])
    if outer is None or inner is None:
        return _rows(t.contiguous(), dim)
    nd = t._nd
    extent = T.storage_extent(shape, stride, 0)
    flat = np.ndarray((extent,), nd.dtype, t._storage.buffer, t.storage_offset() * nd.itemsize)
    return flat, (outer[1], stride[dim], inner[1]), (outer[0], shape[dim], inner[0])


def _out_dtype(x: NeuronTensor, half_to_float: bool, dim: int = -1,
               name: str = "softmax") -> torch.dtype:
    if not x.dtype.is_floating_point:  # (the CPU names its kernel: last dim or not)
        kernel = "lastdim_kernel_impl" if T.wrap_dim(dim, x.dim()) == x.dim() - 1 or \
            x.dim() == 0 else "kernel_impl"
        raise NotImplementedError(f"\"{name}_{kernel}\" not implemented for "
                                  f"'{_dtype_label(x.dtype)}'")
    if half_to_float:
        if x.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError("conversion is supported for Half type only")
        return torch.float32
    return x.dtype


def _forward(mode: str, x: NeuronTensor, dim: int, out_dtype: torch.dtype) -> NeuronTensor:
    dim = T.wrap_dim(dim, x.dim())
    out, stage = staged(x.shape, out_dtype)  # (stochastic rounding: by the convert kernel)
    if out.numel() == 0:
        return out
    flat, (so, sn, si), (outer, n, inner) = _rows(x, dim)
    make = _forward_lastdim if inner == 1 else _forward_inner
    codes = (numerics.CODE[x.dtype], numerics.CODE[stage.dtype])
    kernel = _kernel((make, mode) + codes, lambda: make(
        mode, numerics.loader(codes[0], "f32"), numerics.storer(codes[1])))
    out_flat = stage._nd.reshape(-1)
    if inner == 1:
        workers.share_rows(kernel, outer, out.numel(), [out_flat, flat, so, sn, n])
    else:
        workers.share_rows(kernel, outer, out.numel(), [out_flat, flat, so, sn, si, n, inner])
    core.launch("scalar", out.numel(), x._nd.nbytes + out._nd.nbytes)
    return finish(out, stage)


def _backward(log: bool, grad: NeuronTensor, output: NeuronTensor, dim: int,
              input_dtype: torch.dtype) -> NeuronTensor:
    if grad.shape != output.shape:
        raise RuntimeError(f"grad_output shape {list(grad.shape)} does not match output shape "
                           f"{list(output.shape)}")
    dim = T.wrap_dim(dim, grad.dim())
    out, stage = staged(grad.shape, input_dtype)
    if out.numel() == 0:
        return out
    g, gs, sizes = _rows(grad, dim)
    y, ys, _ = _rows(output, dim)
    make = _backward_lastdim if sizes[2] == 1 else _backward_inner
    codes = (numerics.CODE[grad.dtype], numerics.CODE[output.dtype], numerics.CODE[stage.dtype])
    kernel = _kernel((make, log) + codes, lambda: make(
        log, numerics.loader(codes[0], "f32"), numerics.loader(codes[1], "f32"),
        numerics.storer(codes[2])))
    out_flat = stage._nd.reshape(-1)
    if sizes[2] == 1:
        workers.share_rows(kernel, sizes[0], out.numel(), [out_flat, g, y, gs[0], gs[1], ys[0],
                                                           ys[1], sizes[1]])
    else:
        workers.share_rows(kernel, sizes[0], out.numel(),
                           [out_flat, g, y, *gs, *ys, sizes[1], sizes[2]])
    core.launch("scalar" if log else "vector", out.numel(),
                grad._nd.nbytes + output._nd.nbytes + out._nd.nbytes)
    return finish(out, stage)


# -- ops ---------------------------------------------------------------------------------
@register(aten._softmax.default)
def _softmax(x, dim, half_to_float):
    return _forward(SOFTMAX, x, dim, _out_dtype(x, half_to_float, dim))


@register(aten._log_softmax.default)
def _log_softmax(x, dim, half_to_float):
    return _forward(LOG_SOFTMAX, x, dim, _out_dtype(x, half_to_float, dim, "log_softmax"))


@register(aten._safe_softmax.default)
def _safe_softmax(x, dim, dtype=None):
    # Used by scaled_dot_product_attention: a row masked entirely to -inf gives zeros, not NaN.
    if dtype is not None and dtype != x.dtype:
        x = x.to(dtype)
    return _forward(SAFE_SOFTMAX, x, dim, _out_dtype(x, False, dim))


@register(aten._softmax_backward_data.default)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    return _backward(False, grad_output, output, dim, input_dtype)


@register(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    return _backward(True, grad_output, output, dim, input_dtype)
