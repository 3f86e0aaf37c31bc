"""Copies between host and device and within the device (DMA), dtype conversion,
fills, clones and reading one element back (`.item()`).

Host <-> device copies move bytes as they are; a dtype change runs on the
device with Trainium rounding, as the runtime would.
"""
from __future__ import annotations

import contextlib
from functools import partial, wraps

import numpy as np
import torch
from torch._prims_common import compute_elementwise_output_strides
from torch._prims_common import \
    is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from neuron_eager.device_sim import config, core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import numerics, workers
from neuron_eager.ops.numerics import warn_int64_range
from neuron_eager.ops import overlap
from neuron_eager.ops import tensor as T
from neuron_eager.ops.registry import register
from neuron_eager.ops.sourceline import called_from_torch_file, warn_at_user_line

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor
_float64_warned = False
_float64_inside = [0]  # > 0 while an op makes float64 temporaries of its own


@contextlib.contextmanager
def float64_temporaries():
    """No float64 warning inside: torch.linalg.matrix_rank makes its float64 tolerances
    itself (in C++), whatever the user's dtype."""
    _float64_inside[0] += 1
    try:
        yield
    finally:
        _float64_inside[0] -= 1


def warn_float64(dtype: torch.dtype) -> None:
    global _float64_warned
    if dtype == torch.float64 and not _float64_warned and not _float64_inside[0]:
        if called_from_torch_file("amp", "grad_scaler.py"):
            return  # unscale_ takes 1/scale through float64 on every device: not the user's
        if called_from_torch_file("nn", "functional.py"):
            return  # batch norm of an empty batch: float64 statistics on any device but CUDA
        _float64_warned = True
        warn_at_user_line("float64 on neuron is stored as float64 but computed in float32, as "
                          "on Trainium (TorchNeuron's policy); expect float32 precision.")


_FROM_META = ("Cannot copy out of meta tensor; no data! Please use torch.nn.Module.to_empty() "
              "instead of torch.nn.Module.to() when moving module from meta to a different "
              "device.")


def _plain(src: torch.Tensor) -> torch.Tensor:
    """A host tensor as a plain Tensor over its memory: a subclass's Python attributes (an
    UninitializedParameter's `shape` raises, LazyLinear moved before its first forward)
    have no say in what is copied."""
    if type(src) is torch.Tensor or type(src) is torch.nn.Parameter:
        return src
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.as_subclass(src, torch.Tensor)


def host_to_device(src: torch.Tensor, dtype: torch.dtype | None = None,
                   memory_format=None) -> NeuronTensor:
    src = _plain(src)
    if src.device.type == "meta":
        raise NotImplementedError(_FROM_META)
    dtype = dtype or src.dtype
    T.check_dtype(src.dtype)
    warn_float64(dtype)
    stride = like_strides(src, memory_format)  # (None: contiguous)
    staged = T.from_cpu(src.detach().resolve_conj().resolve_neg(), stride)
    if src.dtype == torch.int64:
        warn_int64_range(staged._nd)
    core.launch("dma", src.numel(), staged._nd.nbytes)
    if dtype == src.dtype:
        return staged
    out = T.empty(src.shape, dtype, stride)
    return E.copy_into(out, staged)


def device_to_host(src: NeuronTensor, dtype: torch.dtype | None = None,
                   memory_format=None) -> torch.Tensor:
    """`src` on the host, in the layout `memory_format` gives (preserve_format: dense
    layouts kept, as `.to()` does on every device)."""
    stride = like_strides(src, memory_format)
    if dtype is not None and dtype != src.dtype:
        converted = T.empty(src.shape, dtype, stride)
        E.copy_into(converted, src)
        src = converted
    core.launch("dma", src.numel(), src._nd.nbytes)
    return T.to_cpu(src, stride)


@register(aten.copy_.default)
def copy_(dst, src, non_blocking=False):
    if not isinstance(src, torch.Tensor):  # x.copy_(2): the number as a host 0-dim tensor
        src = torch.tensor(src)
    if isinstance(dst, NeuronTensor):
        if _same_data(dst, src):  # (the CPU returns first: no overlap error, nothing to do)
            return dst
        overlap.check_no_internal_overlap(dst)
        if isinstance(src, NeuronTensor):
            if src.shape != dst.shape:
                _check_copy_shapes(dst, src)
            overlap.check_no_partial_overlap(dst, src)
            E.copy_into(dst, src)
        else:  # host -> device
            src = _plain(src)
            if src.device.type == "meta":
                raise NotImplementedError(_FROM_META)
            if src.dtype == dst.dtype:
                if src.shape == dst.shape:  # Note [Host copies]
                    workers.copy(dst._nd, T.host_array(src))
                    if dst.dtype == torch.int64:
                        warn_int64_range(dst._nd)
                else:  # broadcast, with torch's checks and errors
                    T.cpu_alias(dst).copy_(src)
                core.launch("dma", dst.numel(), dst._nd.nbytes)
            else:
                E.copy_into(dst, host_to_device(src))
        return dst
    # device -> host
    dst.copy_(device_to_host(src, dst.dtype if dst.dtype in T.STORAGE_DTYPE else None))
    return dst


def _same_data(dst, src) -> bool:
    return src is dst or (type(src) is NeuronTensor and src._storage is dst._storage
                          and src.dtype == dst.dtype and src.shape == dst.shape
                          and src.storage_offset() == dst.storage_offset()
                          and src.stride() == dst.stride())


def _check_copy_shapes(dst, src) -> None:
    """The CPU's errors for a source that does not broadcast to the destination."""
    shape = E.broadcast_shape([dst.shape, src.shape])
    if shape != tuple(dst.shape):
        raise RuntimeError(f"output with shape {list(dst.shape)} doesn't match the broadcast "
                           f"shape {list(shape)}")


@register(aten._copy_from.default)
def _copy_from(src, dst, non_blocking=False):
    return copy_(dst, src)


@register(aten._to_copy.default)
def _to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if layout not in (None, torch.strided):
        raise RuntimeError(f"{layout} tensors are not supported on neuron")
    target = torch.device(device) if device is not None else x.device
    if target.type == "cpu":
        if not isinstance(x, NeuronTensor):
            return x.to(dtype=dtype, copy=True, memory_format=memory_format or
                        torch.preserve_format)
        return device_to_host(x, dtype, memory_format)
    if target.type == "meta":  # shape, dtype and layout only, as from any device
        return torch.empty_strided(x.shape, like_strides(x, memory_format) or
                                   T.contiguous_strides(x.shape), dtype=dtype or x.dtype,
                                   device="meta")
    if target.type != T.DEVICE.type:
        raise RuntimeError(f"cannot copy a neuron tensor to {target} directly; use .cpu() first")
    T.check_device_index(target)
    if not isinstance(x, NeuronTensor):
        return host_to_device(x, dtype, memory_format)
    dtype = dtype or x.dtype
    T.check_dtype(dtype)
    warn_float64(dtype)
    if dtype != x.dtype and (dtype in E.BAREBONES or x.dtype in E.BAREBONES):
        # no engine kernel converts PyTorch's storage-only unsigned types: the host does
        return host_to_device(device_to_host(x).to(dtype), None, memory_format)
    if dtype == torch.int64 and x.dtype in (torch.float32, torch.float64) and \
            not numerics.int64_warned:
        warn_int64_range(x._nd)  # .long() past int32 (bf16, stored as bits, is not checked)
    out = T.empty(x.shape, dtype, like_strides(x, memory_format))
    return E.copy_into(out, x)


# Note [Composite ops inside kernels]: kernels call x.to(dtype) and x.reshape(...) on neuron
# tensors below autograd, where these CompositeImplicitAutograd ops reach our dispatcher and
# would run their decomposition, a second round trip (~80 us each, 4 ms of a small
# transformer's training step). Users' calls decompose above our key as before.
@register(aten.to.dtype)
def to_dtype(x, dtype, non_blocking=False, copy=False, memory_format=None):
    if dtype == x.dtype and not copy and memory_format in (None, torch.preserve_format):
        return x  # as the decomposition: the tensor itself
    return _to_copy(x, dtype=dtype, memory_format=memory_format)


@register(aten.clone.default)
def clone(x, *, memory_format=None):
    return E.copy_into(T.empty(x.shape, x.dtype, like_strides(x, memory_format)), x)


# Functional forms of in-place ops (what functionalization, export and TorchScript call):
# a copy of self, updated as the in-place op updates it. They fell back to the CPU.
register(aten.lift_fresh_copy.default)(lambda x: clone(x, memory_format=torch.contiguous_format))
register(aten.zero.default)(lambda x: zeros_like(x))  # (clone's layout, no copy to overwrite)


@register(aten.copy.default)
def copy(x, src, non_blocking=False):
    """The CPU's: a copy of x keeping its strides (gaps too) unless its elements overlap."""
    kept = clone(x) if overlap.has_internal_overlap(x) else \
        E.copy_into(T.empty(x.shape, x.dtype, x.stride()), x)
    return aten.copy_.default(kept, src)


def stage_dtype(dtype: torch.dtype) -> torch.dtype:
    """What a kernel that rounds to nearest writes a `dtype` result as: fp32 for a 16-bit
    result when rounding is stochastic, so that the convert kernel does the rounding."""
    if config.stochastic_rounding and dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return dtype


def staged(shape, dtype: torch.dtype, stat: bool = False):
    """(result, what a row kernel writes into; `finish` then fills the result): an fp32
    stage for norms' statistics (`stat`) and where `stage_dtype` says."""
    out = T.empty(shape, dtype)
    if (stat and dtype != torch.float32) or stage_dtype(dtype) != dtype:
        return out, T.empty(shape, torch.float32)
    return out, out


def finish(out: T.NeuronTensor, stage: T.NeuronTensor) -> T.NeuronTensor:
    if stage is not out:
        E.copy_into(out, stage)
    return out


@register(aten._reshape_copy.default)
def reshape_copy(x, size):
    return clone(aten.reshape.default(x, size), memory_format=torch.contiguous_format)


def _preserved_strides(x):
    """PyTorch's preserve_format: a dense layout (any dim order) is kept; any other (expanded,
    sliced, overlapping) is made dense in its dims' stride order, as TensorIterator orders an
    output (ties and stride-0 dims keep their place)."""
    if is_non_overlapping_and_dense(x):
        return x.stride()
    meta = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return tuple(compute_elementwise_output_strides(meta))


def channels_last_strides(x):
    """Channels-last strides for a result of x's shape where x is channels-last (PyTorch's
    suggest_memory_format), else None (contiguous)."""
    if not _channels_last(x):
        return None
    return T.memory_format_strides(x.shape, torch.channels_last if x.dim() == 4
                                  else torch.channels_last_3d)


# Note [Channels-last results]
# On the CPU a convolution, pooling or batch/group norm of a channels-last input (or a
# convolution with a channels-last weight) returns a channels-last result. The kernels here
# compute NCHW, so such results are laid out again before they are returned: a host copy
# inside the op's launch, not a launch of its own.
def keeps_channels_last(*positions):
    """Decorate a kernel whose 4-D/5-D results are channels-last when one of the arguments at
    `positions` is (Note [Channels-last results])."""
    def decorate(kernel):
        @wraps(kernel)
        def run(*args, **kwargs):
            result = kernel(*args, **kwargs)
            for i in positions:
                if i < len(args) and _channels_last(args[i]):
                    break
            else:
                return result
            if isinstance(result, tuple):
                return tuple(_as_channels_last(r) for r in result)
            return _as_channels_last(result)
        return run
    return decorate


def channels_last_like(source, result):
    """`result` laid out channels-last if `source` is (Note [Channels-last results])."""
    return _as_channels_last(result) if _channels_last(source) else result


_CHANNELS_LAST_ORDER = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}  # dims from fastest to slowest


def _channels_last(t) -> bool:
    """PyTorch's suggest_memory_format (which Python cannot call): strides ordered as
    channels-last, so a crop of a channels-last activation and a 1 x 1 weight whose strides
    fit both layouts count, and a contiguous tensor wins a tie."""
    order = _CHANNELS_LAST_ORDER.get(t.dim()) if isinstance(t, torch.Tensor) else None
    if order is None:
        return False
    shape, strides = t.shape, t.stride()
    if strides[1] == 0:
        return False
    least = 0
    for d in order:
        if shape[d] == 0 or strides[d] < least or (d == 0 and least == strides[1]):
            return False
        least = strides[d] * shape[d]
    return True


def _as_channels_last(t):
    if not isinstance(t, NeuronTensor) or t.dim() not in (4, 5) or t.numel() == 0:
        return t
    fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
    strides = T.memory_format_strides(t.shape, fmt)
    if t.is_contiguous(memory_format=fmt):
        # the same memory order; size-1 dims take the format's strides, as the CPU gives them
        return t if t.stride() == strides else \
            T.make(t._storage, t.shape, strides, t.storage_offset(), t.dtype)
    out = T.empty(t.shape, t.dtype, strides)
    np.copyto(out._nd, t._nd)
    return out


@register(aten.contiguous.default)
def contiguous(x, memory_format=torch.contiguous_format):
    if x.is_contiguous(memory_format=memory_format):
        return x
    out = T.empty(x.shape, x.dtype, T.memory_format_strides(x.shape, memory_format))
    return E.copy_into(out, x)


@register(aten._local_scalar_dense.default)
def local_scalar_dense(x):
    if x.numel() != 1:
        raise RuntimeError(f"a Tensor with {x.numel()} elements cannot be converted to Scalar")
    core.launch("dma", 1, x.element_size())
    return T.cpu_alias(x).reshape(()).item()


@register(aten._assert_async.default)
def assert_async(x, assert_msg=None):
    """torch._assert_async: a device's check of a one-element tensor, here on the host (the
    ATen composites of one_hot, multinomial and others call it on non-CPU devices)."""
    if x.numel() != 1:
        raise RuntimeError(f"Boolean value of Tensor with "
                           f"{'no values' if x.numel() == 0 else 'more than one value'} is "
                           f"ambiguous")
    if not local_scalar_dense(x):
        raise RuntimeError(assert_msg if assert_msg is not None else
                           "Expected Tensor with single nonzero value, but got zero")


@register(aten._assert_async.msg)
def assert_async_msg(x, assert_msg):
    assert_async(x, assert_msg)


def fill(x: NeuronTensor, value) -> NeuronTensor:
    if x.dtype == torch.int64:  # kept whole, but ops read it as int32: say so once
        warn_int64_range(value)
    if x.numel():
        x._nd[...] = numerics.encode_scalar(value, x.dtype)
        core.launch("gpsimd", x.numel(), x._nd.nbytes)
    return x


@register(aten.fill_.Scalar)
def fill_(x, value):
    return fill(x, value)


@register(aten.fill_.Tensor)
def fill_tensor_(x, value):
    if value.dim() != 0:
        raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                           f"{value.dim()} dimensions.")
    if isinstance(value, NeuronTensor):  # (the CPU copies a same-device value: its check)
        overlap.check_no_internal_overlap(x)
    if value.dtype != x.dtype:
        # the CPU copies a tensor's value in: cast as a copy casts (300 wraps to 44 in int8,
        # 1e6 is inf in fp16), not range-checked as a Python number is; one element, cast
        # by the CPU itself (exact for any int64)
        if isinstance(value, NeuronTensor):
            core.launch("dma", 1, value.element_size())
            value = T.cpu_alias(value)
        value = value.to(x.dtype)
    return fill(x, value.item())


@register(aten.zero_.default)
def zero_(x):
    return fill(x, 0)


@register(aten.fill.Scalar)
def fill_functional(x, value):
    return fill(uninitialized_like(x), value)  # (empty_like: x's layout, as on the CPU)


@register(aten.fill.Tensor)
def fill_tensor_functional(x, value):
    return fill_tensor_(uninitialized_like(x), value)


def _like_dtype(x, dtype):
    dtype = dtype or x.dtype
    T.check_dtype(dtype)
    return dtype


def like_strides(x, memory_format):
    """The strides a copy of `x` in `memory_format` gets (None: contiguous)."""
    if memory_format in (None, torch.preserve_format):
        stride = x.stride()  # (exactly: size-1 dims keep their strides, as on the CPU)
        return None if stride == T.contiguous_strides(x.shape) else _preserved_strides(x)
    return T.memory_format_strides(x.shape, memory_format)


def honours_device(*ops):
    """Register the kernel of `ops`, which makes a neuron tensor from a neuron tensor `x`;
    given `device=` elsewhere (cpu, meta), the op runs there on a meta stand-in of `x`, as a
    `*_like` or `new_*` call on a CUDA tensor makes its result on the device asked for."""
    def decorate(kernel):
        for op in ops:
            register(op)(partial(_on_device_asked, op, kernel))
        return kernel

    return decorate


def _on_device_asked(op, kernel, x, *args, device=None, **kwargs):
    if device is not None:
        device = torch.device(device)
        if device.type != T.DEVICE.type:
            stand_in = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
            return op(stand_in, *args, device=device, **kwargs)
        T.check_device_index(device)
    check_layout(kwargs.get("layout"), kwargs.get("pin_memory"))
    return kernel(x, *args, **kwargs)


def check_layout(layout, pin_memory=None) -> None:
    """A factory's layout= and pin_memory= for a result on the device: dense, not pinned."""
    if layout not in (None, torch.strided):
        raise RuntimeError(f"{layout} tensors are not supported on neuron: only strided (dense) "
                           "tensors live on the device")
    if pin_memory:
        raise RuntimeError("Only dense CPU tensors can be pinned")


def filled_if_deterministic(t: NeuronTensor) -> NeuronTensor:
    """A new, uninitialized tensor for the user (empty and its kin): under
    torch.use_deterministic_algorithms(True) with torch.utils.deterministic.
    fill_uninitialized_memory (its default) it holds NaN, or the dtype's largest value (True
    for bools), as on the CPU and CUDA."""
    if not (torch.are_deterministic_algorithms_enabled() and
            torch.utils.deterministic.fill_uninitialized_memory) or not t.numel():
        return t
    value = float("nan") if t.dtype.is_floating_point else \
        True if t.dtype == torch.bool else torch.iinfo(t.dtype).max
    T.cpu_alias(t).fill_(value)  # (in place, as the CPU writes it: no int64-range warning)
    return t


def uninitialized_like(x, dtype=None, memory_format=None) -> NeuronTensor:
    return T.empty(x.shape, _like_dtype(x, dtype), like_strides(x, memory_format))


@honours_device(aten.empty_like.default)
def empty_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return filled_if_deterministic(uninitialized_like(x, dtype, memory_format))


@honours_device(aten.zeros_like.default)
def zeros_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return fill(uninitialized_like(x, dtype, memory_format), 0)


@honours_device(aten.ones_like.default)
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return fill(uninitialized_like(x, dtype, memory_format), 1)


@honours_device(aten.full_like.default)
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    return fill(uninitialized_like(x, dtype, memory_format), fill_value)


@honours_device(aten.new_empty.default)
def new_empty(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return filled_if_deterministic(T.empty(T.requested_shape(size), _like_dtype(x, dtype)))


@honours_device(aten.new_empty_strided.default)
def new_empty_strided(x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    check_strides(size, stride)
    return filled_if_deterministic(T.empty(size, _like_dtype(x, dtype), stride))


def check_strides(size, stride) -> None:
    """Refuse a negative stride along a dim of 2+ elements, as c10 does when it sizes the
    storage (it multiplies strides as unsigned numbers)."""
    if 0 not in size and any(st < 0 and n > 1 for n, st in zip(size, stride)):
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(size)} and "
                           f"strides={list(stride)}")


@honours_device(aten.new_zeros.default)
def new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return fill(T.empty(T.requested_shape(size), _like_dtype(x, dtype)), 0)


@honours_device(aten.new_ones.default)
def new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return fill(T.empty(T.requested_shape(size), _like_dtype(x, dtype)), 1)


@honours_device(aten.new_full.default)
def new_full(x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return fill(T.empty(T.requested_shape(size), _like_dtype(x, dtype)), fill_value)


@register(aten.record_stream.default)
def record_stream(x, stream):
    return None


@register(aten.is_pinned.default)
def is_pinned(x, device=None):
    return False


@register(aten._pin_memory.default)
def pin_memory(x, device=None):
    """Pinning is for host memory: a device tensor is refused in CUDA's words (it ran on the
    CPU as a fallback, a copy that stayed on neuron)."""
    raise RuntimeError(f"cannot pin '{x.type()}' only dense CPU tensors can be pinned")


@register(aten.is_same_size.default)
def is_same_size(x, other):
    return x.shape == other.shape


@register(aten._has_same_storage_numel.default)
def has_same_storage_numel(x, other):
    """Forward-mode AD's question (make_dual): do both memories hold as many elements?"""
    return x._storage.nbytes // x.element_size() == \
        other._storage.nbytes // other.element_size()
