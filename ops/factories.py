"""Factories: tensors made on the device from nothing (empty, arange, linspace, eye, full).

These arrive on the PrivateUse1 dispatch key (no tensor argument carries the
subclass), so they are registered there with torch.library. Shapes, dtypes and
argument errors come from the same op on the meta device, so they match CPU.
Value generators (iota) run on the GpSimd engine in float64, as PyTorch's CPU
kernels accumulate, then round once to the output dtype.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import _compat
from neuron_eager.ops import copy as C
from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit
from neuron_eager.ops.meta import meta_run
from neuron_eager.ops.registry import register
from neuron_eager.ops.router import write_result

aten = torch.ops.aten
_lib = torch.library.Library("aten", "IMPL")
_STORE64 = {}


def _iota_kernels(fn):
    """arange's and linspace's loops around the rounding `fn` (jitted with ops.jit: kept on
    disk, keyed by `fn`, so a later process loads them)."""

    @njit
    def arange(out, start, step):
        for i in range(out.shape[0]):
            out[i] = fn(start + i * step)

    @njit
    def linspace(out, start, end, step):
        n = out.shape[0]
        half = n // 2
        for i in range(n):
            if i < half:
                out[i] = fn(start + step * i)
            else:
                out[i] = fn(end - step * (n - 1 - i))

    return arange, linspace


def _storer64(code: str):
    kernels = _STORE64.get(code)
    if kernels is None:
        store = numerics.storer(code)
        if code == "f64":
            fn = njit(lambda x: np.float64(x))
        elif code in numerics.FLOAT_CODES:
            fn = njit(lambda x: store(np.float32(x)))
        else:
            fn = njit(lambda x: store(np.int64(x)))
        kernels = _STORE64[code] = _iota_kernels(fn)
    return kernels


def _meta(op, args, kwargs):
    """The factory's result on meta (cached: arange's meta kernel is a Python reference, ~1
    ms a call here): its metadata only; a refusal in the CPU's words (the stand-in call
    makes its result on the CPU)."""
    kwargs = dict(kwargs)
    kwargs["device"] = torch.device("meta")
    kwargs.pop("pin_memory", None)
    return meta_run(op, *args, **kwargs)


def _empty_for(meta) -> T.NeuronTensor:
    if meta.layout != torch.strided:
        raise RuntimeError(f"{meta.layout} tensors are not supported on neuron")
    C.warn_float64(meta.dtype)
    return T.empty(meta.shape, meta.dtype, meta.stride())


def empty_memory_format(size, *, dtype=None, layout=None, device=None, pin_memory=None,
                        memory_format=None):
    C.check_layout(layout, pin_memory)
    size = T.requested_shape(size)
    dtype = dtype or torch.get_default_dtype()
    T.check_dtype(dtype)
    C.warn_float64(dtype)
    return C.filled_if_deterministic(
        T.empty(size, dtype, T.memory_format_strides(tuple(size), memory_format)))


def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    C.check_layout(layout, pin_memory)
    dtype = dtype or torch.get_default_dtype()
    T.check_dtype(dtype)
    C.warn_float64(dtype)
    size = T.requested_shape(size)
    C.check_strides(size, stride)
    return C.filled_if_deterministic(T.empty(size, dtype, stride))


def _arange(op):
    def arange(*args, **kwargs):
        bounds = (0, args[0]) if len(args) == 1 else args[:2]
        if any(isinstance(v, float) and not math.isfinite(v) for v in bounds):
            raise RuntimeError(f"unsupported range: {bounds[0]} -> {bounds[1]}")
        meta = _meta(op, args, kwargs)
        if meta.dtype == torch.bool:  # (as linspace below)
            raise NotImplementedError("\"arange_cpu\" not implemented for 'Bool'")
        out = _empty_for(meta)
        values = list(args[:3])
        start, step = (0, 1) if len(values) == 1 else (values[0], values[2] if len(values) > 2
                                                        else kwargs.get("step", 1))
        if meta.dtype == torch.int64:
            C.warn_int64_range(*[v for v in values if isinstance(v, int)])
        if out.numel():
            kernel = _storer64(numerics.CODE[out.dtype])[0]
            kernel(out._nd, float(start) if meta.dtype.is_floating_point else int(start),
                   float(step) if meta.dtype.is_floating_point else int(step))
            core.launch("gpsimd", out.numel(), out._nd.nbytes)
        return out

    return arange


arange_start_step = _arange(aten.arange.start_step)


def range_inclusive(start, end, step=1, *, dtype=None, layout=None, device=None,
                    pin_memory=None):
    """torch.range (deprecated, end included): the CPU's values, stepped in double on the
    host as its kernel steps them, then copied (its fallback had a fixed-size out= to grow)."""
    meta = _meta(aten.range.step, (start, end, step), dict(dtype=dtype, layout=layout))
    out = _empty_for(meta)
    if out.numel():
        C.copy_(out, aten.range.step(start, end, step, dtype=meta.dtype))
    return out


def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    meta = _meta(aten.linspace.default, (start, end, steps), dict(dtype=dtype, layout=layout))
    if meta.dtype == torch.bool:
        raise NotImplementedError("\"linspace_cpu\" not implemented for 'Bool'")
    out = _empty_for(meta)
    if steps == 1:
        return C.fill(out, start)
    if steps:
        _linspace_into(out, start, end, steps)
        core.launch("gpsimd", out.numel(), out._nd.nbytes)
    return out


# Note [linspace as the CPU computes it]
# PyTorch's CPU kernel first converts both bounds to the output's dtype (c10's checked
# conversion: an int8 bound of 300 raises, an integer -5 wraps into uint8), then steps from
# the nearer end: start + step * i for the first half, end - step * (n - 1 - i) after. A bf16
# or fp16 output computes in its own type, rounding every operation (the index too) as c10's
# 16-bit arithmetic does; fp32 steps in fp32 with each value a fused multiply-add (exact in
# doubles, then rounded once); integer outputs step in doubles.
def _linspace_into(out, start, end, steps) -> None:
    dtype = out.dtype
    numerics.check_fits(start, dtype)
    numerics.check_fits(end, dtype)
    code = numerics.CODE[dtype]
    if code in ("bf16", "f16"):
        def rnd(v):
            return np.float32(numerics.reduced_scalar(float(v), dtype))

        start, end = rnd(start), rnd(end)
        step = rnd(rnd(end - start) / rnd(steps - 1))
        _linspace_16bit(code)(out._nd, start, end, step)
        return
    if dtype == torch.float32:
        start, end = np.float32(start), np.float32(end)
        step = np.float32(end - start) / np.float32(steps - 1)
    else:
        if not dtype.is_floating_point:  # (a float truncates toward zero; an integer wraps
            wrap = numerics.scalar_cast("int", dtype)  # into an unsigned type)
            start, end = (int(wrap(int(v))) for v in (start, end))
            if dtype == torch.int64:
                C.warn_int64_range(start, end)
        start, end = float(start), float(end)
        step = (end - start) / (steps - 1)
    _storer64(code)[1](out._nd, start, end, step)


_LINSPACE16: dict = {}


def _linspace_16bit(code: str):
    kernel = _LINSPACE16.get(code)
    if kernel is None:
        store = numerics.storer(code)
        rnd = numerics.round_to_bf16 if code == "bf16" else numerics.round_to_f16

        @njit
        def kernel(out, start, end, step):
            n = out.shape[0]
            for i in range(n):
                if i < n // 2:
                    out[i] = store(rnd(start + rnd(step * rnd(np.float32(i)))))
                else:
                    out[i] = store(rnd(end - rnd(step * rnd(np.float32(n - 1 - i)))))

        kernel = _LINSPACE16[code] = kernel
    return kernel


def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    args = (n,) if m is None else (n, m)
    meta = _meta(aten.eye.default if m is None else aten.eye.m, args,
                 dict(dtype=dtype, layout=layout))
    out = C.fill(_empty_for(meta), 0)
    k = min(out.shape)
    if k:
        cols = out.shape[1]
        out._nd.reshape(-1)[: k * (cols + 1): cols + 1] = numerics.encode_scalar(1, out.dtype)
    return out


@register(aten.eye.out, aten.eye.m_out)  # (nn.init.eye_): an out tensor reaches the dispatcher
def eye_out(n, m=None, *, out):
    write_result(out, eye(n, m, dtype=out.dtype))
    return out


def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    meta = _meta(aten.full.default, (size, fill_value), dict(dtype=dtype, layout=layout))
    if T.numel(meta.shape) == 1:
        fill_value = _past_16_bits(fill_value, meta.dtype)
    return C.fill(_empty_for(meta), fill_value)


def _past_16_bits(value, dtype):
    """A one-element full (scalar_tensor too) rounds a value past fp16's or bf16's largest one
    as a cast does on the CPU (to it, or to inf), where larger fills raise: `x16[mask] = 70000`
    and `where(mask, half_scores, -1e9)` write inf, -inf."""
    if dtype in (torch.float16, torch.bfloat16) and type(value) in (int, float) and \
            abs(value) > torch.finfo(dtype).max:
        return torch.tensor(value, dtype=torch.float64).to(dtype).item()
    return value


def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    if any(n < 0 for n in size):  # (the CPU's zeros words its refusal apart)
        raise RuntimeError("zeros: Dimension size must be non-negative.")
    return full(size, 0, dtype=dtype or torch.get_default_dtype(), layout=layout)


def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return full(size, 1, dtype=dtype or torch.get_default_dtype(), layout=layout)


def efficient_zero_tensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    # autograd's "known zero" gradients; a plain zero tensor has the same values
    return full(size, 0, dtype=dtype or torch.get_default_dtype(), layout=layout)


@register(aten._new_zeros_with_same_feature_meta.default)
def new_zeros_with_same_feature_meta(x, other, *, self_num_batch_dims=0):
    """Forward-mode AD's zero tangent: `other`'s sizes, strides and offset over zeroed memory
    as large as other's, with x's first `self_num_batch_dims` sizes in front, each batch slice
    a copy of that memory laid end to end (the layout PyTorch's own kernel gives)."""
    k = self_num_batch_dims
    sizes = [*x.shape[:k], *other.shape]
    span = other._storage.nbytes // other.element_size()  # other's whole memory, in elements
    batch_strides = []
    for n in reversed(sizes[:k]):
        batch_strides.insert(0, span)
        span *= n
    memory = full((span,), 0, dtype=other.dtype)
    return memory.as_strided(sizes, [*batch_strides, *other.stride()], other.storage_offset())


def _tri_indices(op, lower):
    def tri_indices(row, col, offset=0, *, dtype=None, layout=None, device=None,
                    pin_memory=None):
        meta = _meta(op, (row, col, offset), dict(dtype=dtype or torch.int64, layout=layout))
        out = _empty_for(meta)
        if out.numel():
            rows, cols = (np.tril_indices if lower else np.triu_indices)(row, offset, col)
            out._nd[0] = rows  # an iota pattern on the GpSimd engine
            out._nd[1] = cols
            core.launch("gpsimd", out.numel(), out._nd.nbytes)
        return out

    return tri_indices


def kaiser_window(window_length, periodic=True, beta=12.0, *, dtype=None, layout=None,
                  device=None, pin_memory=None):
    """As the CPU's kernel: i0(beta * sqrt(|1 - ((n - a) / a) ** 2|)) / i0(beta) in fp32 over n
    = arange(window_length (+1 if periodic)) in the dtype, a = (length - 1) / 2, rounded once."""
    try:
        meta = _meta(aten.kaiser_window.beta, (window_length, periodic, beta),
                     dict(dtype=dtype, layout=layout))
    except RuntimeError as e:  # (its dtype check, asked of the CPU, prints the options)
        raise RuntimeError(str(e).replace("device=cpu", f"device={device}").replace(
            "pinned_memory=false (default)", "pinned_memory=false")) from None
    if window_length <= 1:
        return full(meta.shape, 1, dtype=meta.dtype)
    length = window_length + 1 if periodic else window_length
    n = torch.arange(length, dtype=meta.dtype, device=T.DEVICE).float()
    alpha = float(np.float32((length - 1) / 2.0))
    x = (n - alpha) / alpha
    i0_beta = torch.special.i0(full((), beta, dtype=torch.float32))
    window = torch.special.i0(beta * (1 - x * x).abs().sqrt()) / i0_beta
    return window[:window_length].to(meta.dtype)


def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return full((), s, dtype=dtype or torch.get_default_dtype(), layout=layout)


def _local_scalar_dense(x):
    return C.local_scalar_dense(x)


def _copy_from(src, dst, non_blocking=False):
    return C.copy_(dst, src)


def _copy_(dst, src, non_blocking=False):
    return C.copy_(dst, src)


def on_device_zero(factory):
    """`factory`, refusing neuron:k for k > 0 (torch dispatches any index here)."""
    def run(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None:
            T.check_device_index(torch.device(device))
        return factory(*args, **kwargs)

    _compat.keep_dynamo_out(run)  # (called from C++ while a compiled graph runs)
    return run


for _name, _fn in [
    ("empty.memory_format", empty_memory_format), ("empty_strided", empty_strided),
    ("arange", _arange(aten.arange.default)), ("arange.start", _arange(aten.arange.start)),
    ("arange.start_step", arange_start_step), ("linspace", linspace),
    ("range", range_inclusive), ("range.step", range_inclusive),
    ("eye", eye), ("eye.m", eye), ("full", full), ("zeros", zeros), ("ones", ones),
    ("scalar_tensor", scalar_tensor), ("_efficientzerotensor", efficient_zero_tensor),
    ("kaiser_window", kaiser_window), ("kaiser_window.periodic", kaiser_window),
    ("kaiser_window.beta", kaiser_window),
    ("tril_indices", _tri_indices(aten.tril_indices.default, True)),
    ("triu_indices", _tri_indices(aten.triu_indices.default, False)),
    ("_local_scalar_dense", _local_scalar_dense),
    ("_copy_from", _copy_from), ("copy_", _copy_),
]:
    _lib.impl(_name, on_device_zero(_fn), "PrivateUse1")
