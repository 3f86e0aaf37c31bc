"""Normalisation layers: layer, group and batch norm, forward and backward.

Statistics are computed and kept in fp32 (mean/rstd outputs are float32 for 16-bit
inputs, as PyTorch's meta kernels and CUDA give them); inputs are widened on load and
each output is rounded once on store. Batch norm in training updates the running
statistics in place as the CPU does: momentum-weighted, with the unbiased variance.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import config, core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import numerics, workers
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import finish, keeps_channels_last, staged
from neuron_eager.ops.jit import njit
from neuron_eager.ops.kernelgen import JIT_OPTIONS
from neuron_eager.ops.meta import meta_run
from neuron_eager.ops.numerics import SUM_LANES, deviation_sums, lane_sum
from neuron_eager.ops.registry import register

aten = torch.ops.aten
F32 = torch.float32
_kernels: dict = {}


# -- shared plumbing -------------------------------------------------------------------
def kernel_for(build, load_code: str, store_code: str):
    """The kernel `build(load, store)` for one storage format pair, compiled once."""
    key = (build, load_code, store_code)
    kernel = _kernels.get(key)
    if kernel is None:
        kernel = _kernels[key] = build(numerics.loader(load_code, "f32"),
                                       numerics.storer(store_code))
    return kernel


def f32_vector(t: T.NeuronTensor | None, n: int, fill: float) -> T.NeuronTensor:
    """A contiguous fp32 copy of a parameter vector (widening is exact), or `fill`s."""
    if t is None:
        out = T.empty((n,), F32)
        out._nd[...] = fill
        return out
    if t.dtype == F32 and t._key is not None:  # already one: a flat view, no dispatch
        return t if t.dim() == 1 else T.make_lazy(t._storage, (n,), (1,), t.storage_offset(),
                                                  F32, True)
    return t.to(F32).contiguous().reshape(n)


def dense(t: T.NeuronTensor) -> T.NeuronTensor:
    """t when C-contiguous (what row kernels read), else a contiguous copy; skips the
    dispatcher round trip of t.contiguous() on the common path."""
    return t if t._key is not None else t.contiguous()


def _code(dtype: torch.dtype) -> str:
    return numerics.CODE[dtype]


# -- lane sums ---------------------------------------------------------------------------
# Note [Lane sums]: a sum over a contiguous run is accumulated in 8 fp32 lanes (element j
# goes to lane j % 8) that are then added as a tree, the way a SIMD engine keeps partial
# sums. The order is fixed, so results are deterministic, and LLVM can vectorise it, which
# it may not do for a strict left-to-right fp32 sum (3x faster here).
@njit(inline="always")
def _tree(acc):
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))


def lane_total(load):
    """Jitted `total(v, start, stop)`: the lane sum of v[start:stop]."""
    @njit(inline="always")
    def total(v, start, stop):
        head = np.float32(0)
        end = start
        if stop - start >= 16:  # short runs (e.g. [N, C] batch norm) skip the lanes
            acc = np.zeros(8, np.float32)
            end = start + (stop - start) // 8 * 8
            for j in range(start, end, 8):
                for lane in range(8):
                    acc[lane] += load(v[j + lane])
            head = _tree(acc)
        tail = np.float32(0)
        for j in range(end, stop):
            tail += load(v[j])
        return head + tail

    return total


def _lane_pair(first, second):
    """Jitted `pair(a, x, start, stop, mu)`: the lane sums of first(a[j], x[j], mu) and of
    second(a[j], x[j], mu), side by side in one pass."""
    @njit(inline="always")
    def pair(a, x, start, stop, mu):
        head1 = np.float32(0)
        head2 = np.float32(0)
        end = start
        if stop - start >= 16:
            acc1 = np.zeros(8, np.float32)
            acc2 = np.zeros(8, np.float32)
            end = start + (stop - start) // 8 * 8
            for j in range(start, end, 8):
                for lane in range(8):
                    acc1[lane] += first(a[j + lane], x[j + lane], mu)
                    acc2[lane] += second(a[j + lane], x[j + lane], mu)
            head1, head2 = _tree(acc1), _tree(acc2)
        t1 = np.float32(0)
        t2 = np.float32(0)
        for j in range(end, stop):
            t1 += first(a[j], x[j], mu)
            t2 += second(a[j], x[j], mu)
        return head1 + t1, head2 + t2

    return pair


def lane_dual(load_a, load_x):
    """Jitted `dual(a, x, start, stop, mu)`: (sum of a[j], sum of a[j] * (x[j] - mu))."""
    @njit(inline="always")
    def value(a, x, mu):
        return load_a(a)

    @njit(inline="always")
    def moment(a, x, mu):
        return load_a(a) * (load_x(x) - mu)

    return _lane_pair(value, moment)


# Note [Corrected two-pass statistics]
# Mean and variance come from two passes: a plain sum gives a first mean mu0, then one
# pass over d = x - mu0 sums d and d * d; mean = mu0 + sum(d) / n and
# M2 = sum(d * d) - sum(d)^2 / n. Shifting by the first element instead (sums of
# x - x[0]) kept large-mean data exact but cost zero-mean data, the common case after a
# conv, its precision: each lane's running sum grows to n * |x[0] - mean|. Measured over a
# train-mode ResNet-18 step, the saved statistics' largest error (against fp64, relative to
# the largest of each) was 1.5e-5 that way and is 2.0e-6 now (the CPU's: 9e-8). The
# correction pass keeps large-mean data (1000 + noise) as exact as before.


def lane_moments(load):
    """Jitted `moments(v, start, stop, mu)`: (sum of d, sum of d * d) for d = v[j] - mu."""
    @njit(inline="always")
    def deviation(v, _, mu):
        return load(v) - mu

    @njit(inline="always")
    def square(v, _, mu):
        d = load(v) - mu
        return d * d

    pair = _lane_pair(deviation, square)

    @njit(inline="always")
    def moments(v, start, stop, mu):
        return pair(v, v, start, stop, mu)

    return moments


_AS_F32 = numerics.loader("f32", "f32")


# -- row norms: layer norm and group norm ---------------------------------------------
# A row of `length` elements is normalised over itself. Affine parameters are indexed
# by channel: row r uses w[(r % groups) * nw + c] for its c-th block of `per_w` elements
# (layer norm: groups = per_w = 1; group norm: a row is one group, per_w = H*W).
# A row is staged in fp32 and walked in passes that each vectorize; its sums are lane sums
# in the order of Note [Sum order] (ops/numerics.py). Kernels take a range of rows: large
# inputs run a share per core (workers.share_rows).
def _build_row_norm(load, store):
    @njit(**JIT_OPTIONS)
    def row_norm(lo, hi, x, w, b, out, mean, rstd, groups, per_w, eps):
        length = x.shape[1]
        nw = length // per_w
        n = np.float32(length)
        xs = np.empty(length, np.float32)  # the row
        lanes = np.empty(SUM_LANES, np.float32)
        lanes2 = np.empty(SUM_LANES, np.float32)
        for r in range(lo, hi):
            src, dst = x[r], out[r]
            for j in range(length):
                xs[j] = load(src[j])
            mu0 = lane_sum(xs, length, lanes) / n
            # Note [Corrected two-pass statistics]
            s1, s2 = deviation_sums(xs, length, mu0, lanes, lanes2)
            mu = mu0 + s1 / n
            rs = np.float32(1) / np.sqrt(max(s2 - s1 * (s1 / n), np.float32(0)) / n + eps)
            base = (r % groups) * nw
            if per_w == 1:  # (slices: a signed `base + j` index kept this loop scalar, 2x)
                wr, br = w[base:base + length], b[base:base + length]
                for j in range(length):
                    dst[j] = store((xs[j] - mu) * (rs * wr[j]) + br[j])
            else:
                for c in range(nw):  # (unsigned: a signed j would be wrapped, gathered)
                    scale, bias = rs * w[base + c], b[base + c]
                    for j in range(c * per_w, (c + 1) * per_w):
                        u = np.uint64(j)
                        dst[u] = store((xs[u] - mu) * scale + bias)
            mean[r] = mu
            rstd[r] = rs

    return row_norm


def _build_row_norm_backward(load, store):
    @njit(**JIT_OPTIONS)
    def row_norm_backward(lo, hi, g, x, mean, rstd, w, gx, gw, gb, groups, per_w, want_gx):
        # gw, gb: this range's own fp32 sums (its chunk's: the caller adds the chunks)
        length = x.shape[1]
        nw = length // per_w
        n = np.float32(length)
        gw[:] = 0
        gb[:] = 0
        gy = np.empty(length, np.float32)  # one row of grad_out (then times the weight)
        xh = np.empty(length, np.float32)  # x - mean
        gx_c = np.empty(length, np.float32)  # gy * (x - mean), for the sums
        lanes = np.empty(SUM_LANES, np.float32)
        for r in range(lo, hi):
            mu, rs = mean[r], rstd[r]
            base = (r % groups) * nw
            xr, gr = x[r], g[r]
            for j in range(length):
                gy[j] = load(gr[j])
                xh[j] = load(xr[j]) - mu
            if per_w == 1:  # one weight per element (slices: see row_norm)
                if gw.shape[0]:
                    gwr, gbr = gw[base:base + length], gb[base:base + length]
                    for j in range(length):
                        gwr[j] += gy[j] * (xh[j] * rs)
                        gbr[j] += gy[j]
                wr = w[base:base + length]
                for j in range(length):
                    gy[j] *= wr[j]
                    gx_c[j] = gy[j] * xh[j]
                s_gy, s_gyxc = lane_sum(gy, length, lanes), lane_sum(gx_c, length, lanes)
            else:  # one weight per block of per_w elements
                s_gy = np.float32(0)
                s_gyxc = np.float32(0)
                for j in range(length):
                    gx_c[j] = gy[j] * xh[j]
                for c in range(nw):
                    lo_c, hi_c = c * per_w, (c + 1) * per_w
                    s_g = lane_sum(gy[lo_c:hi_c], per_w, lanes)
                    s_gxc = lane_sum(gx_c[lo_c:hi_c], per_w, lanes)
                    if gw.shape[0]:
                        gw[base + c] += s_gxc * rs
                        gb[base + c] += s_g
                    wc = w[base + c]
                    s_gy += wc * s_g
                    s_gyxc += wc * s_gxc
                    for j in range(lo_c, hi_c):
                        gy[np.uint64(j)] *= wc
            if want_gx:  # rstd * (gy - mean(gy) - xhat * mean(gy * xhat))
                a = s_gy / n
                k = s_gyxc * rs / n
                dst = gx[r]
                for j in range(length):
                    dst[j] = store(rs * (gy[j] - a - xh[j] * rs * k))

    return row_norm_backward


def row_norm(x, weight, bias, stat_shape, stat_dtype, rows, length, groups, per_w, eps):
    """Shared forward: returns (out, mean, rstd)."""
    out, out_stage = staged(x.shape, x.dtype)
    mean, mean_stage = staged(stat_shape, stat_dtype, stat=True)
    rstd, rstd_stage = staged(stat_shape, stat_dtype, stat=True)
    nparams = groups * (length // per_w) if length else 0
    x = dense(x)
    w, b = f32_vector(weight, nparams, 1.0), f32_vector(bias, nparams, 0.0)
    if x.numel():
        kernel = kernel_for(_build_row_norm, _code(x.dtype), _code(out_stage.dtype))
        args = [x._nd.reshape(rows, length), w._nd, b._nd, out_stage._nd.reshape(rows, length),
                mean_stage._nd.reshape(rows), rstd_stage._nd.reshape(rows), groups, per_w,
                np.float32(eps)]
        workers.share_rows(kernel, rows, x.numel(), args)
        core.launch("vector", x.numel(), 2 * x._nd.nbytes + 8 * rows)
    elif rows:  # empty rows: mean 0 and rstd NaN, as on CPU
        mean_stage._nd[...] = 0
        rstd_stage._nd[...] = np.nan
    return finish(out, out_stage), finish(mean, mean_stage), finish(rstd, rstd_stage)


GRAD_CHUNK = 64


def _chunked(kernel):
    """A split_rows kernel running `kernel` over chunks lo..hi-1 of rows: chunk k takes rows
    bounds[k]:bounds[k + 1] and accumulates into gws[k], gbs[k]."""
    def run(lo, hi, bounds, args, gws, gbs, groups, per_w, want_gx):
        for k in range(lo, hi):
            kernel(bounds[k], bounds[k + 1], *args, gws[k], gbs[k], groups, per_w, want_gx)
    return run


def row_norm_backward(g, x, mean, rstd, weight, rows, length, groups, per_w, want_gx, want_gw,
                      want_gb):
    """Shared backward: returns (grad_input, grad_weight as fp32, grad_bias as fp32)."""
    want_params = want_gw or want_gb
    nparams = groups * (length // per_w) if length else 0
    g, x = dense(g), dense(x)
    w = f32_vector(weight, nparams, 1.0)
    mean = f32_vector(mean, rows, 0.0)
    rstd = f32_vector(rstd, rows, 1.0)
    gx, gx_stage = staged(x.shape, x.dtype) if want_gx else (None, None)
    gw = T.empty((nparams if want_params else 0,), F32)
    gb = T.empty((nparams if want_params else 0,), F32)
    if x.numel():
        kernel = kernel_for(_build_row_norm_backward, _code(x.dtype),
                            _code(gx_stage.dtype if want_gx else x.dtype))
        dummy = np.empty((0, 0), x._nd.dtype)
        args = [g._nd.reshape(rows, length), x._nd.reshape(rows, length), mean._nd, rstd._nd,
                w._nd, gx_stage._nd.reshape(rows, length) if want_gx else dummy]
        # rows in chunks of GRAD_CHUNK, each with its own weight and bias gradient sums, added
        # in chunk order: the same bits on any number of cores (large inputs: a share each)
        bounds = list(range(0, rows, GRAD_CHUNK)) + [rows]
        chunks = len(bounds) - 1
        gws = np.empty((chunks, gw._nd.shape[0]), np.float32)
        gbs = np.empty_like(gws)
        workers.share_rows(_chunked(kernel), chunks, x.numel(),
                           [bounds, args, gws, gbs, groups, per_w, want_gx])
        gw._nd[...] = gws[0]
        gb._nd[...] = gbs[0]
        for k in range(1, chunks):
            gw._nd[...] += gws[k]
            gb._nd[...] += gbs[k]
        core.launch("vector", x.numel(), 3 * x._nd.nbytes)
    else:
        gw._nd[...] = 0
        gb._nd[...] = 0
    return (finish(gx, gx_stage) if want_gx else None,
            gw if want_params and want_gw else None, gb if want_params and want_gb else None)


def to_param(acc: T.NeuronTensor | None, like: T.NeuronTensor | None):
    """An fp32 gradient accumulator rounded once into its parameter's dtype and shape
    (None when no such parameter exists)."""
    if acc is None or like is None:
        return None
    if acc.shape != like.shape:  # (acc is fresh and contiguous: a view, no dispatch)
        acc = T.make_lazy(acc._storage, like.shape, T.contiguous_strides(like.shape), 0, F32,
                          True)
    return acc if like.dtype == F32 else acc.to(like.dtype)


def _rows(x, normalized_shape) -> tuple[int, int]:
    """(rows, row length) of `x` normalised over its trailing `normalized_shape`."""
    length = T.numel(normalized_shape)
    return T.numel(x.shape[:x.dim() - len(normalized_shape)]), length


@register(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    meta = meta_run(aten.native_layer_norm.default, input, normalized_shape, weight, bias, eps)
    rows, length = _rows(input, normalized_shape)
    return row_norm(input, weight, bias, meta[1].shape, meta[1].dtype, rows, length, 1, 1, eps)


@register(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                               output_mask):
    rows, length = _rows(input, normalized_shape)
    gx, gw, gb = row_norm_backward(grad_out, input, mean, rstd, weight, rows, length, 1, 1,
                                   *output_mask)
    return gx, to_param(gw, weight), to_param(gb, bias)


@register(aten.native_group_norm.default)
@keeps_channels_last(0)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    meta = meta_run(aten.native_group_norm.default, input, weight, bias, N, C, HxW, group, eps)
    return row_norm(input, weight, bias, meta[1].shape, meta[1].dtype, N * group,
                    (C // group) * HxW, group, HxW, eps)


@register(aten.native_group_norm_backward.default)
@keeps_channels_last(1)  # (the CPU's grad_input layout)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                               output_mask):
    rows, length = N * group, (C // group) * HxW
    gx, gw, gb = row_norm_backward(grad_out, input, mean, rstd, weight, rows, length, group,
                                   HxW, *output_mask)
    return gx, to_param(gw, weight), to_param(gb, weight)


# -- batch norm --------------------------------------------------------------------------
# The input is viewed as [N, C, S]; statistics are per channel over N*S elements, summed
# run by run (lane sums over each S-run) in memory order into per-channel fp32
# accumulators. In training `var` receives the sum of squared deviations (M2); in
# evaluation it holds the running variance.
def _build_batch_norm(load, store):
    total = lane_total(load)
    moments = lane_moments(load)

    @njit(**JIT_OPTIONS)
    def batch_norm(lo, hi, x, w, b, out, mean, var, invstd, eps, train):
        # channels lo..hi-1: each channel's sums run over n in order, on whichever core
        n_, channels, s_ = x.shape
        m = np.float32(n_ * s_)
        if train:
            acc = np.zeros(channels, np.float32)  # Note [Corrected two-pass statistics]
            acc2 = np.zeros(channels, np.float32)
            for n in range(n_):
                for c in range(lo, hi):
                    acc[c] += total(x[n, c], 0, s_)
            for c in range(lo, hi):
                mean[c] = acc[c] / m  # the first mean, mu0
                acc[c] = 0
            for n in range(n_):
                for c in range(lo, hi):
                    s1, s2 = moments(x[n, c], 0, s_, mean[c])
                    acc[c] += s1
                    acc2[c] += s2
            for c in range(lo, hi):
                mean[c] += acc[c] / m
                var[c] = max(acc2[c] - acc[c] * (acc[c] / m), np.float32(0))
                invstd[c] = np.float32(1) / np.sqrt(var[c] / m + eps)
        else:
            for c in range(lo, hi):
                invstd[c] = np.float32(1) / np.sqrt(var[c] + eps)
        for n in range(n_):
            for c in range(lo, hi):
                mu, scale, shift = mean[c], invstd[c] * w[c], b[c]
                src, dst = x[n, c], out[n, c]
                for s in range(s_):
                    dst[s] = store((load(src[s]) - mu) * scale + shift)

    return batch_norm


def _build_running_update(load, store):
    @njit(**JIT_OPTIONS)
    def running_update(running_mean, running_var, mean, m2, momentum, count):
        keep = np.float32(1) - momentum
        for c in range(mean.shape[0]):
            running_mean[c] = store(momentum * mean[c] + keep * load(running_mean[c]))
            running_var[c] = store(momentum * (m2[c] / (count - np.float32(1))) +
                                   keep * load(running_var[c]))

    return running_update


def _build_batch_norm_backward(load, store):
    dual = lane_dual(load, load)

    @njit(**JIT_OPTIONS)
    def batch_norm_backward(lo, hi, g, x, w, mean, stat, eps, train, gx, gw, gb, want_gx):
        # channels lo..hi-1 (as batch_norm)
        n_, channels, s_ = x.shape
        m = np.float32(n_ * s_)
        inv = np.empty(channels, np.float32)
        for c in range(lo, hi):
            inv[c] = stat[c] if train else np.float32(1) / np.sqrt(stat[c] + eps)
            gb[c] = 0
            gw[c] = 0  # holds sum(g * (x - mean)) until the end
        for n in range(n_):
            for c in range(lo, hi):
                p_g, p_gxc = dual(g[n, c], x[n, c], 0, s_, mean[c])
                gb[c] += p_g
                gw[c] += p_gxc
        if want_gx:
            for n in range(n_):
                for c in range(lo, hi):
                    mu, scale = mean[c], inv[c] * w[c]
                    g_mean = gb[c] / m if train else np.float32(0)
                    k = gw[c] * inv[c] * inv[c] / m if train else np.float32(0)
                    gr, xr, dst = g[n, c], x[n, c], gx[n, c]
                    for s in range(s_):
                        dst[s] = store((load(gr[s]) - g_mean - (load(xr[s]) - mu) * k) * scale)
        for c in range(lo, hi):
            gw[c] *= inv[c]

    return batch_norm_backward


def _ncs(t: T.NeuronTensor) -> np.ndarray:
    return t._nd.reshape(t.shape[0], t.shape[1], -1) if t.numel() else \
        np.empty((t.shape[0], t.shape[1], 0), t._nd.dtype)


@keeps_channels_last(0)
def batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd); updates the running statistics when training."""
    meta = meta_run(aten.native_batch_norm.default, input, weight, bias, running_mean,
                    running_var, training, momentum, eps)
    stat_dtype, channels = meta[1].dtype, input.shape[1]
    use_batch_stats = training or running_mean is None or running_var is None
    if use_batch_stats and input.numel() == 0:
        raise RuntimeError("input tensor must have at least one element, but got input_sizes "
                           f"= {list(input.shape)}")
    x = input.contiguous()
    out, out_stage = staged(x.shape, x.dtype)
    w, b = f32_vector(weight, channels, 1.0), f32_vector(bias, channels, 0.0)
    if use_batch_stats:
        mean, var = T.empty((channels,), F32), T.empty((channels,), F32)
    else:
        mean, var = f32_vector(running_mean, channels, 0), f32_vector(running_var, channels, 1)
    invstd = T.empty((channels,), F32)
    if x.numel():
        kernel = kernel_for(_build_batch_norm, _code(x.dtype), _code(out_stage.dtype))
        workers.share_rows(kernel, channels, x.numel(), [
            _ncs(x), w._nd, b._nd, _ncs(out_stage), mean._nd, var._nd, invstd._nd,
            np.float32(eps), use_batch_stats])
        core.launch("vector", x.numel(), (3 if use_batch_stats else 2) * x._nd.nbytes)
    finish(out, out_stage)
    if not use_batch_stats:  # evaluation: CPU returns empty statistics
        return out, T.empty((0,), stat_dtype), T.empty((0,), stat_dtype)
    if training and running_mean is not None and running_var is not None:
        count = input.numel() // max(channels, 1)
        update = kernel_for(_build_running_update, _code(running_mean.dtype),
                            _code(running_mean.dtype))
        update(running_mean._nd, running_var._nd, mean._nd, var._nd, np.float32(momentum),
               np.float32(count))
        core.launch("vector", 2 * channels, 6 * running_mean._nd.nbytes)
    if stat_dtype != F32:
        mean, invstd = mean.to(stat_dtype), invstd.to(stat_dtype)
    return out, mean, invstd


@register(aten.native_batch_norm.default)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@register(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training,
                            momentum, eps):
    return batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@register(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return batch_norm(input, weight, bias, None, None, training, momentum, eps)


@register(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
                                        momentum, eps):
    return batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)


@register(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var,
                                       training, momentum, eps):
    running_mean, running_var = running_mean.clone(), running_var.clone()
    out = batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return (*out, running_mean, running_var)


@register(aten._batch_norm_with_update.default)
def batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out = batch_norm(input, weight, bias, running_mean, running_var, True, momentum, eps)
    return (*out, T.empty((0,), torch.uint8))


@register(aten._batch_norm_no_update.default)
def batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out = batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)
    return (*out, T.empty((0,), torch.uint8))


@register(aten.native_batch_norm_backward.default)
@keeps_channels_last(1)  # (the CPU's grad_input layout)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    channels = input.shape[1]
    use_batch_stats = train or running_mean is None or running_var is None
    if use_batch_stats:
        mean, stat = f32_vector(save_mean, channels, 0), f32_vector(save_invstd, channels, 1)
    else:
        mean, stat = f32_vector(running_mean, channels, 0), f32_vector(running_var, channels, 1)
    g, x = grad_out.contiguous(), input.contiguous()
    w = f32_vector(weight, channels, 1.0)
    gx, gx_stage = staged(x.shape, x.dtype) if output_mask[0] else (None, None)
    gw, gb = T.empty((channels,), F32), T.empty((channels,), F32)
    if x.numel():
        kernel = kernel_for(_build_batch_norm_backward, _code(x.dtype),
                            _code(gx_stage.dtype if output_mask[0] else x.dtype))
        workers.share_rows(kernel, channels, x.numel(), [
            _ncs(g), _ncs(x), w._nd, mean._nd, stat._nd, np.float32(eps), use_batch_stats,
            _ncs(gx_stage) if output_mask[0] else np.empty((0, 0, 0), x._nd.dtype),
            gw._nd, gb._nd, output_mask[0]])
        core.launch("vector", x.numel(), 3 * x._nd.nbytes)
    else:
        gw._nd[...], gb._nd[...] = 0, 0
    like = weight if weight is not None else \
        torch.empty((channels,), dtype=input.dtype, device="meta")
    return (finish(gx, gx_stage) if output_mask[0] else None,
            to_param(gw, like) if output_mask[1] else None,
            to_param(gb, like) if output_mask[2] else None)


@register(aten.batch_norm_backward.default)
def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                        save_var, update, eps, output_mask, reserve):
    return native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
                                      save_mean, save_var, update, eps, output_mask)


# Weight norm computes in fp32 and rounds its results once, as the CPU's and CUDA's fused
# kernels do (torch's decomposition rounds g / |v| to a bf16 weight's dtype first: 1 ulp
# off in a third of the weights); |v| is fp32 for every dtype, as theirs.
def _in_fp32(t):
    return t if t.dtype == torch.float32 else aten._to_copy.default(t, dtype=torch.float32)


def _rounded_to(t, dtype):
    return t if t.dtype == dtype else aten._to_copy.default(t, dtype=dtype)


def _all_but(dim, v) -> list:
    return [d for d in range(v.dim()) if d != dim % v.dim()]


@register(aten._weight_norm_interface.default)
def weight_norm_interface(v, g, dim=0):
    """w = g v / |v|, norms over every dim but `dim`; returns (w, |v|)."""
    v32 = _in_fp32(v)
    norms = aten.linalg_vector_norm.default(v32, 2, _all_but(dim, v), True)
    w = aten.mul.Tensor(v32, aten.div.Tensor(_in_fp32(g), norms))
    return _rounded_to(w, v.dtype), norms


@register(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """grad_g = sum(grad_w v) / |v|, grad_v = (g / |v|) (grad_w - v grad_g / |v|)."""
    grad32, v32, norms = _in_fp32(grad_w), _in_fp32(saved_v), _in_fp32(saved_norms)
    sums = aten.sum.dim_IntList(aten.mul.Tensor(grad32, v32), _all_but(dim, saved_v), True)
    grad_g = aten.div.Tensor(sums, norms)
    inner = aten.sub.Tensor(grad32, aten.mul.Tensor(v32, aten.div.Tensor(grad_g, norms)))
    grad_v = aten.mul.Tensor(aten.div.Tensor(_in_fp32(saved_g), norms), inner)
    return (_rounded_to(grad_v, saved_v.dtype),
            _rounded_to(aten.reshape.default(grad_g, list(saved_g.shape)), saved_g.dtype))
