"""Histograms on the GpSimd engine: histc, bincount and histogram (bin count or bin edges).

Bins are chosen as CPU chooses them (histc's interpolation runs in the input's own dtype,
histogram's upper bound over its edges); counts and weights accumulate in fp32 and round
once into the output dtype.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import numerics
from neuron_eager.ops import reduction as R
from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit
from neuron_eager.ops.meta import as_cpu_kernels
from neuron_eager.ops.reduction import load, store  # template placeholders
from neuron_eager.ops.registry import register

aten = torch.ops.aten
JIT = R.JIT

# -- kernels (Note [Kernel templates] in reduction.py) ------------------------------------------


def histc_kernel(src, base, starts, steps, stride, n, out, acc, lo, hi, nbins):
    """Counts by linear interpolation, as CPU's histc, whose bin arithmetic runs in the
    input's own dtype (bf16/fp16 round after each step: `rnd`); the last bin keeps its right
    edge. Counts accumulate in fp32 and round once."""
    gathered = steps.size > 0
    for j in range(nbins):
        acc[j] = np.float32(0)
    width, bins = load(store(hi - lo)), load(store(np.float32(nbins)))
    for r in range(starts.size):
        s0 = base + starts[r]
        for i in range(n):
            v = load(src[s0 + (steps[i] if gathered else i * stride)])
            if v >= lo and v <= hi:
                pos = np.int64(load(store(load(store(load(store(v - lo)) * bins)) / width)))
                acc[min(pos, nbins - 1)] += np.float32(1)
    for j in range(nbins):
        out[j] = store(acc[j])


def histogram_kernel(src, weights, edges, eoff, out, acc, lo, hi, make_edges, local_search,
                     density):
    """histogramdd over points of N = eoff.size - 1 coordinates (dim d's edges are
    edges[eoff[d]:eoff[d + 1]]): edges made as CPU's linspace (or given), then each
    coordinate's bin by an upper bound over its edges (near its interpolated bin with
    `local_search`); a point outside any range is skipped."""
    nd = eoff.size - 1
    if make_edges:
        for d in range(nd):
            e0, ne = eoff[d], eoff[d + 1] - eoff[d]
            step = (hi[d] - lo[d]) / np.float32(ne - 1)
            for j in range(ne):
                edges[e0 + j] = store(lo[d] + step * np.float32(j) if j < ne // 2
                                      else hi[d] - step * np.float32(ne - 1 - j))
    for j in range(acc.size):
        acc[j] = np.float32(0)
    for i in range(src.size // max(nd, 1)):
        flat = 0
        for d in range(nd):
            e0, ne = eoff[d], eoff[d + 1] - eoff[d]
            left, right = load(edges[e0]), load(edges[e0 + ne - 1])
            v = load(src[i * nd + d])
            if not (v >= left and v <= right):
                flat = -1
                break
            a, b = 0, ne
            if local_search:
                pos = np.int64((v - left) * np.float32(ne - 1) / (right - left))
                pos = min(max(pos, 0), ne - 1)
                a, b = max(0, pos - 1), min(pos + 2, ne)
            while a < b:
                mid = (a + b) >> 1
                if load(edges[e0 + mid]) > v:
                    b = mid
                else:
                    a = mid + 1
            flat = flat * (ne - 1) + min(a - 1, ne - 2)
        if flat >= 0:
            acc[flat] += load(weights[i]) if weights.size else np.float32(1)
    if density:  # as CPU: divide by the total, then by each dim's bin lengths in turn
        total = np.float32(0)
        for j in range(acc.size):
            total += acc[j]
        inner = acc.size
        for j in range(acc.size):
            acc[j] = acc[j] / total
        for d in range(nd):
            e0, nb = eoff[d], eoff[d + 1] - eoff[d] - 1
            inner //= nb
            for j in range(acc.size):
                c = (j // inner) % nb
                acc[j] = acc[j] / (load(edges[e0 + c + 1]) - load(edges[e0 + c]))
    for j in range(acc.size):
        out[j] = store(acc[j])


def bincount_kernel(src, weights, out, acc):
    """Weighted counts in fp32 (rounded once into the float output)."""
    for j in range(acc.size):
        acc[j] = np.float32(0)
    for i in range(src.size):
        acc[src[i]] += load(weights[i])
    for j in range(acc.size):
        out[j] = store(acc[j])


@njit(**JIT)
def _count(src, out):
    for i in range(src.size):
        out[src[i]] += 1


@njit(**JIT)
def _int_range(src):
    lo, hi = 0, -1
    if src.size:
        lo = hi = np.int64(src[0])
        for i in range(src.size):
            v = np.int64(src[i])
            lo, hi = min(lo, v), max(hi, v)
    return lo, hi


def extrema_kernel(src, base, starts, steps, stride, n, out):
    """(min, max) of each row into out[2r], out[2r + 1]; NaN propagates."""
    gathered = steps.size > 0
    for r in range(starts.size):
        s0 = base + starts[r]
        lo = hi = load(src[s0])
        for i in range(n):
            v = load(src[s0 + (steps[i] if gathered else i * stride)])
            if v != v or lo != lo:
                lo = hi = v if v != v else lo
            elif v < lo:
                lo = v
            elif v > hi:
                hi = v
        out[2 * r] = lo
        out[2 * r + 1] = hi


R.FAMILIES.update(histc=histc_kernel, histogram_counts=histogram_kernel,
                  bincount=bincount_kernel, hist_extrema=extrema_kernel)


def _kernel(family: str, dtype: torch.dtype, out_dtype: torch.dtype | None = None, op=None):
    return R.kernel(family, dtype, out_dtype or dtype, "f32", op)


def _run(kernel, x, *arrays, dims=None):
    """A row kernel over x (all of it one row by default; Note [Rows]); count its launch."""
    r = R.rows(x, R.wrap_dims(x, dims))
    kernel(R.flat(x), x.storage_offset(), r.starts, r.steps, r.stride, r.n, *arrays)
    core.launch("gpsimd", x.numel(), x._nd.nbytes + sum(a.nbytes for a in arrays
                                                        if isinstance(a, np.ndarray)))


def _nd(t: torch.Tensor) -> np.ndarray:
    return t._nd.reshape(-1)


def _extrema(x) -> tuple[float, float]:
    """min and max of all of x."""
    ext = np.empty(2, np.float32)
    _run(_kernel("hist_extrema", x.dtype), x, ext)
    return float(ext[0]), float(ext[1])


# -- ops ------------------------------------------------------------------------------------------


def _as_dtype(value: float, dtype: torch.dtype) -> np.float32:
    """A Python float rounded to `dtype`, as an fp32 engine value."""
    bits = numerics.encode_scalar(value, dtype)
    if dtype == torch.bfloat16:
        return (np.uint32(bits) << np.uint32(16)).view(np.float32)
    if dtype == torch.float16:
        return np.float32(np.uint16(bits).view(np.float16))
    return np.float32(bits)


def _check_bin_count(n: int, dim: int) -> None:
    if n <= 0:  # (the CPU's words for histc, histogram and histogramdd alike)
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {n} for dimension "
                           f"{dim}")


def _require_float(x, name):
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f'"{name}" not implemented for \'{T.dtype_name(x.dtype)}\'')


@register(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    if not x.dtype.is_floating_point and x.dtype != torch.bool:
        return _int_histc(x, bins, min, max)
    _require_float(x, "histogram_cpu")
    _check_bin_count(bins, 0)  # (before the meta kernel: its words differ)
    if float(min) > float(max):
        raise RuntimeError("torch.histc: max must be larger than min")
    meta = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    with as_cpu_kernels():
        aten.histc.default(meta, bins, min, max)  # CPU's errors for bad bins
    lo, hi = float(min), float(max)
    if lo == hi and x.numel():
        lo, hi = _extrema(x)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise RuntimeError(f"torch.histc: range of [{lo:g}, {hi:g}] is not finite")
    if not lo < hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    out = T.empty((bins,), x.dtype)
    if x.numel():
        _run(_kernel("histc", x.dtype, op=aten.histc.default), x, _nd(out),
             np.empty(bins, np.float32), _as_dtype(lo, x.dtype), _as_dtype(hi, x.dtype), bins)
    else:
        _nd(out)[:] = 0
    return out


def _int_histc(x, bins, min, max):
    """Integer inputs, as CUDA takes them (transformers' MoE routing counts int32 expert ids
    so on every device but the CPU): counted as fp32 values, which hold every integer up to
    2**24 exactly; the counts come back in x's dtype."""
    values = x._nd
    if values.size and np.abs(values.astype(np.int64)).max() > 1 << 24:
        raise NotImplementedError("torch.histc on neuron counts integers as fp32 values: "
                                  "inputs beyond 2**24 would be binned inexactly; convert "
                                  "them to float64 on the CPU")
    return histc(x.to(torch.float32), bins, min, max).to(x.dtype)


@register(aten.bincount.default)
def bincount(x, weights=None, minlength=0):
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if x.dim() == 1 and x.numel() == 0:
        out = T.empty((minlength,), torch.int64)
        _nd(out)[:] = 0
        return out
    src = _nd(x.contiguous()) if x.dim() == 1 else None
    lo, hi = _int_range(src) if src is not None else (-1, -1)
    if x.dim() != 1 or lo < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != x.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    size = max(int(hi) + 1, minlength)
    if weights is None:
        out = T.empty((size,), torch.int64)
        counts = _nd(out)
        counts[:] = 0
        _count(src, counts)
    else:
        out_dtype = torch.float32 if weights.dtype == torch.float32 else torch.float64
        out = T.empty((size,), out_dtype)
        k = _kernel("bincount", weights.dtype, out_dtype, aten.bincount.default)
        k(src, _nd(weights.contiguous()), _nd(out), np.empty(size, np.float32))
    core.launch("gpsimd", x.numel(), x._nd.nbytes + out._nd.nbytes)
    return out




def _histogramdd(op, x, bins, rng, weight, density, want_edges=True):
    """(hist, [edges per dim]) of the points x[..., :] (the last dim holds coordinates)."""
    _require_float(x, "histogram_cpu")
    nd = x.shape[-1] if x.dim() else 1
    points = x.reshape(-1, nd)
    if weight is not None and (weight.dtype != x.dtype or tuple(weight.shape) != tuple(
            x.shape[:-1] if x.dim() > 1 else x.shape)):
        raise RuntimeError("torch.histogramdd(): if weight tensor is provided it should have the "
                           "same shape as the input tensor excluding its innermost dimension")
    src = _nd(points.contiguous())
    w = _nd(weight.contiguous()) if weight is not None else np.empty(0, src.dtype)
    make = isinstance(bins[0], int)
    lo, hi = np.zeros(nd, np.float32), np.zeros(nd, np.float32)
    if make:
        if len(bins) != nd:
            raise RuntimeError(f"torch.histogramdd(): expected {nd} sequences of bin edges for "
                               f"each of the {nd} input dimensions, but got {len(bins)} bin counts")
        ext = None
        if rng is None and points.numel():
            ext = np.empty(2 * nd, np.float32)
            _run(_kernel("hist_extrema", x.dtype), points, ext, dims=0)
        for d, n in enumerate(bins):
            _check_bin_count(n, d)
            left, right = (float(rng[2 * d]), float(rng[2 * d + 1])) if rng is not None else \
                (float(ext[2 * d]), float(ext[2 * d + 1])) if ext is not None else (0.0, 1.0)
            if not (np.isfinite(left) and np.isfinite(right)):
                raise RuntimeError(f"torch.histogramdd: dimension {d}'s range [{left:g}, "
                                   f"{right:g}] is not finite")
            if left > right:
                raise RuntimeError(f"torch.histogramdd: min should not exceed max, but got min "
                                   f"{left:g} max {right:g} for dimension {d}")
            if left == right:
                left, right = left - 0.5, right + 0.5
            lo[d], hi[d] = _as_dtype(left, x.dtype), _as_dtype(right, x.dtype)
        counts = list(bins)
        edges = [T.empty((n + 1,), x.dtype) for n in counts]
    else:
        for d, b in enumerate(bins):
            if b.dim() != 1 or b.numel() < 1:
                raise RuntimeError("torch.histogramdd(): bins tensor should have one dimension "
                                   "and at least 1 element")
            if b.dtype != x.dtype:
                raise RuntimeError(
                    f"torch.histogramdd: input tensor and bins tensors should have the same "
                    f"dtype, but got input with dtype {T.CPP_NAMES[x.dtype]} and bins for "
                    f"dimension {d} with dtype {T.CPP_NAMES.get(b.dtype, b.dtype)}")
            _check_bin_count(b.numel() - 1, d)
        edges = [b.to(x.dtype).contiguous().clone() for b in bins]
        counts = [e.numel() - 1 for e in edges]
    flat_edges = np.empty(sum(n + 1 for n in counts), src.dtype)
    eoff = np.cumsum([0] + [n + 1 for n in counts]).astype(np.int64)
    if not make:
        for e, a in zip(edges, eoff):
            flat_edges[a:a + e.numel()] = _nd(e)
    hist = T.empty(counts, x.dtype)
    k = _kernel("histogram_counts", x.dtype, op=op)
    k(src, w, flat_edges, eoff, _nd(hist), np.empty(hist.numel(), np.float32), lo, hi, make,
      make, density)
    core.launch("gpsimd", x.numel(), x._nd.nbytes + hist._nd.nbytes)
    if make and want_edges:
        for e, a in zip(edges, eoff):
            _nd(e)[:] = flat_edges[a:a + e.numel()]
    return hist, edges


@register(aten.histogram.bin_ct)
def histogram(x, bins=100, *, range=None, weight=None, density=False):
    hist, edges = _histogramdd(aten.histogram.bin_ct, x.reshape(-1, 1), [bins], range,
                               None if weight is None else weight.reshape(-1), density)
    return hist, edges[0]


@register(aten.histogram.bins_tensor)
def histogram_bins(x, bins, *, weight=None, density=False):
    hist, edges = _histogramdd(aten.histogram.bins_tensor, x.reshape(-1, 1), [bins], None,
                               None if weight is None else weight.reshape(-1), density)
    return hist, edges[0]


@register(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    return _histogramdd(aten._histogramdd_bin_edges.default, x, bins, range, weight, density)[1]


@register(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    return _histogramdd(aten._histogramdd_from_bin_cts.default, x, bins, range, weight, density,
                        want_edges=False)[0]


@register(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return _histogramdd(aten._histogramdd_from_bin_tensors.default, x, bins, None, weight,
                        density)[0]
