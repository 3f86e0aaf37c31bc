"""View ops: new metadata over the same storage, computed by PyTorch's meta kernels.

A view op runs on a meta tensor with the input's exact layout; the meta result
gives size, stride and offset, which then wrap the input's storage. Results
are cached by (op, layout, arguments), so a repeated view costs one lookup.
In-place metadata ops (t_, unsqueeze_, resize_, set_, ...) edit the wrapper.
"""
from __future__ import annotations

import contextlib
import gc
import sys

import torch
from torch._decomp import decomposition_table

from neuron_eager.ops import _compat
from neuron_eager.ops import tensor as T
from neuron_eager.ops.meta import in_cpu_words, meta_run
from neuron_eager.ops.registry import register
from neuron_eager.ops.sourceline import warn_at_user_line

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor

VIEW_OPS = [
    aten.view.default, aten._unsafe_view.default, aten.t.default, aten.transpose.int,
    aten.permute.default, aten.expand.default, aten.unsqueeze.default, aten.squeeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.select.int, aten.slice.Tensor,
    aten.as_strided.default, aten.diagonal.default, aten.unfold.default, aten.alias.default,
    aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, aten.narrow.default,
    aten.view.dtype, aten.unflatten.int, aten.movedim.int, aten.chunk.default,
    aten.tensor_split.sections, aten.tensor_split.indices,
    aten.swapaxes.default, aten.swapdims.default,
    aten._reshape_alias.default, aten.lift_fresh.default,
]
_INPLACE_VIEW_OPS = [
    aten.t_.default, aten.transpose_.default, aten.unsqueeze_.default, aten.squeeze_.default,
    aten.squeeze_.dim, aten.squeeze_.dims, aten.as_strided_.default, aten.swapdims_.default,
    aten.swapaxes_.default,
]
_cache: dict = {}
_CACHE_LIMIT = 20000


def _freeze(v):
    """A hashable stand-in for one view argument; TypeError for tensors (not cached)."""
    kind = type(v)
    if kind is list or kind is tuple:
        return tuple([_freeze(u) for u in v])
    if isinstance(v, torch.Tensor):
        raise TypeError
    return v


def _key(func, x, args, kwargs):
    # ints and lists of ints are nearly all a view op takes: one hashable tuple, no sorting
    # unless there are keyword arguments; the op by id (OpOverload hashes in Python, and
    # overloads live as long as the process)
    key = (id(func), x.shape, x.stride(), x.storage_offset(), x.dtype, *[
        a if type(a) is int else _freeze(a) for a in args])
    if kwargs:
        key += (tuple(sorted((k, _freeze(v)) for k, v in kwargs.items())),)
    return key


def meta_like(x: torch.Tensor) -> torch.Tensor:
    """A meta tensor with exactly x's size, stride, offset and dtype, on a storage as large
    as x's (as_strided may reach past x into the rest of its memory)."""
    extent = T.storage_extent(x.shape, x.stride(), x.storage_offset())
    memory = x.__dict__.get("_storage")  # (a pending tensor has none: its own extent)
    if memory is not None:
        extent = max(extent, memory.nbytes // x.element_size())
    base = torch.empty(max(extent, 1), dtype=x.dtype, device="meta")
    return base.as_strided(x.shape, x.stride(), x.storage_offset())


def check_in_storage(x, meta) -> None:
    """Refuse a view layout (shape, stride, offset, ...) reaching past the memory of `x` (as
    as_strided can)."""
    memory = x.__dict__.get("_storage")  # (pending: a result's memory is its own extent)
    if memory is not None:
        check_fits(memory, *meta[:3], x.element_size())


def check_fits(memory, size, stride, offset, itemsize) -> None:
    """The CPU's error for a layout that does not fit in `memory` (a NeuronStorage)."""
    need = T.storage_extent(size, stride, offset) * itemsize
    if need > memory.nbytes:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, "
            f"and itemsize {itemsize} requiring a storage size of {need} are out of bounds for "
            f"storage of size {memory.nbytes}")


def view_metadata(func, x, args, kwargs):
    """[(shape, stride, offset, dtype, C-contiguous), ...] of what `func` returns, plus whether
    it was a list."""
    try:
        key = _key(func, x, args, kwargs)
        hit = _cache.get(key)
    except TypeError:
        key, hit = None, None
    if hit is not None:
        return hit
    try:
        out = func(meta_like(x), *args, **kwargs)
    except RuntimeError:  # the meta kernel names a MetaFloatType where the CPU names its type
        in_cpu_words(func, (x, *args), kwargs)
        raise
    many = isinstance(out, (list, tuple))
    metas = out if many else [out]
    hit = ([(tuple(m.shape), m.stride(), m.storage_offset(), m.dtype,
             T.c_contiguous(m.shape, m.stride())) for m in metas], many)
    if key is not None:
        if len(_cache) > _CACHE_LIMIT:
            _cache.clear()
        _cache[key] = hit
    return hit


def normal_views_of(x):
    """A context for making views of `x`: a view is an inference tensor exactly when x is, as
    on the CPU. Inside torch.inference_mode a view of a normal tensor is normal (autograd gives
    it x's version counter, which an inference tensor cannot take); outside, a view of an
    inference tensor is one (so autograd refuses to save it, and in-place updates raise)."""
    inference = x.is_inference()
    if torch.is_inference_mode_enabled() != inference:
        return torch.inference_mode(inference)
    return contextlib.nullcontext()


def make_view(func):
    reaches_out = func is aten.as_strided.default
    is_alias = func is aten.alias.default

    def view(x, *args, **kwargs):
        if type(x) is not NeuronTensor:
            T.check_foreign(x)
        metas, many = view_metadata(func, x, args, kwargs)
        if reaches_out:
            check_in_storage(x, metas[0])
        storage = x._storage
        kind = getattr(T._alias_class, "kind", None) if is_alias else None  # (per thread)
        if kind is not None:  # in as_subclass
            return T.make_lazy(storage, *metas[0], cls=kind)
        with normal_views_of(x):
            outs = [T.make_lazy(storage, *meta) for meta in metas]
        return outs if many else outs[0]

    # x is checked above: the router need not look at the arguments when it is the only tensor
    view.checks_devices = [str(a.type) for a in func._schema.arguments].count("Tensor") == 1
    return view


for _op in VIEW_OPS:
    register(_op)(make_view(_op))


@register(aten.expand_as.default)
def expand_as(x, other):
    # (reached in inference mode, where the composite does not decompose first) other's
    # sizes alone, wherever it lies, as on the CPU: a meta stand-in of x next to a neuron
    # `other` was refused as two devices
    return aten.expand.default(x, list(other.shape))


expand_as.checks_devices = True


@register(aten.reshape.default)
def reshape(x, shape):
    # (reached from kernels only: Note [Composite ops inside kernels] in copy.py) a view
    # where the layout allows one, else a contiguous copy, as the decomposition
    if type(x) is not NeuronTensor:
        T.check_foreign(x)
    try:
        metas, _ = view_metadata(aten.view.default, x, (shape,), {})
    except RuntimeError:
        copy = aten.clone.default(x, memory_format=torch.contiguous_format)
        return aten._unsafe_view.default(copy, shape)
    with normal_views_of(x):
        return T.make_lazy(x._storage, *metas[0])


@register(aten.detach.default)
def detach(x):
    stride = x.stride()
    contiguous = x._key is not None or T.c_contiguous(x.shape, stride)
    with normal_views_of(x):
        return T.make_lazy(x._storage, x.shape, stride, x.storage_offset(), x.dtype, contiguous)


def make_inplace_view(func):
    reaches_out = func is aten.as_strided_.default

    def view_(x, *args, **kwargs):
        (meta,), _ = view_metadata(func, x, args, kwargs)
        if reaches_out:
            check_in_storage(x, meta)
        _compat.set_metadata(x, meta[0], meta[1], meta[2])
        T.refresh(x)
        return x

    return view_


for _op in _INPLACE_VIEW_OPS:
    register(_op)(make_inplace_view(_op))


def resize_(x: NeuronTensor, shape, memory_format=None) -> NeuronTensor:
    """Resize in place, as the CPU: the same shape keeps its strides, another is made
    contiguous, then a memory format given restrides; grows the storage (keeping the old
    bytes) when it must."""
    shape = tuple(shape)
    if memory_format == torch.preserve_format:
        raise RuntimeError("Unsupported memory formatPreserve")
    if memory_format is None and shape == tuple(x.shape):
        return x  # (a transposed tensor stays transposed: its values stay where they are)
    stride = T.memory_format_strides(shape, memory_format) or T.contiguous_strides(shape)
    need = T.storage_extent(shape, stride, x.storage_offset()) * x.element_size()
    if need > x._storage.nbytes:
        _grow(x._storage, need)
    _compat.set_metadata(x, shape, stride, x.storage_offset())
    T.refresh(x)
    return x


def _grow(storage: T.NeuronStorage, nbytes: int) -> None:
    """Give `storage` a larger block, keeping its bytes, as the CPU reallocates a StorageImpl
    in place: views of the tensor see the new memory (their cached arrays and addresses are
    made again). Finding them costs a garbage-collector search, done only when other
    objects hold the storage (a rare case: resize_ of a tensor with live views)."""
    holders = _tensors_holding(storage) if sys.getrefcount(storage) > _HELD_ALONE else ()
    grown = T.NeuronStorage(nbytes)
    grown.buffer[:storage.nbytes] = storage.buffer[:storage.nbytes]
    storage.block, grown.block = grown.block, storage.block  # (`grown` frees the old block)
    storage.buffer, grown.buffer = grown.buffer, storage.buffer
    storage.nbytes, grown.nbytes = grown.nbytes, storage.nbytes
    del grown
    for t in holders:
        T.refresh(t)


_HELD_ALONE = 3  # the resized tensor's reference, _grow's argument and getrefcount's


def _tensors_holding(storage) -> list:
    """The neuron tensors whose `_storage` is `storage` (their __dict__ holds it)."""
    found = []
    for holder in gc.get_referrers(storage):
        if type(holder) is dict and holder.get("_storage") is storage:
            found += [t for t in gc.get_referrers(holder)
                      if isinstance(t, NeuronTensor) and t.__dict__ is holder]
    return found


register(aten.resize_.default)(resize_)


def resize_output(x: NeuronTensor, shape, stride=None) -> None:
    """PyTorch's resize_output: an out= tensor of another shape takes the result's, with a
    deprecation warning when it held elements; then the dense `stride` given, if any."""
    if tuple(x.shape) == tuple(shape):
        return
    if x.numel() != 0:
        warn_at_user_line(f"An output with one or more elements was resized since it had "
                          f"shape {list(x.shape)}, which does not match the required "
                          f"output shape {list(shape)}. This behavior is deprecated, "
                          f"and in a future PyTorch release outputs will not be resized "
                          f"unless they have zero elements. You can explicitly reuse an out "
                          f"tensor t by resizing it, inplace, to zero elements with "
                          f"t.resize_(0).")
    resize_(x, shape)
    if stride is not None and tuple(stride) != x.stride():  # (a permutation: the same extent)
        _compat.set_metadata(x, tuple(shape), tuple(stride), x.storage_offset())
        T.refresh(x)


@register(aten._resize_output_.default)  # (PyTorch's Python out= wrappers call it)
def _resize_output_(x, size, device):
    device = torch.device(device)
    if device.type != x.device.type or device.index not in (None, x.device.index):
        raise RuntimeError("out Tensor doesn't have the correct device set")
    resize_output(x, size)
    return x


@register(aten.set_.source_Tensor)
def set_source_tensor(x, source):
    if not isinstance(source, NeuronTensor):
        raise T.device_error(source.device)
    x._storage = source._storage
    _compat.set_metadata(x, source.shape, source.stride(), source.storage_offset())
    T.refresh(x)
    return x


@register(aten.set_.source_Tensor_storage_offset)
def set_source_tensor_offset(x, source, storage_offset, size, stride=()):
    return _set_memory(x, source._storage, storage_offset, size, stride)


def _set_memory(x, memory, storage_offset, size, stride):
    """x becomes a view of `memory` (a NeuronStorage) with this layout."""
    x._storage = memory
    _compat.set_metadata(x, size, tuple(stride) or T.contiguous_strides(size), storage_offset)
    T.refresh(x)
    return x


@register(aten.set_.source_Storage)
def set_source_storage(x, storage):
    return set_source_storage_offset(x, storage, 0, (storage.nbytes() // x.element_size(),))


@register(aten.set_.source_Storage_storage_offset)
def set_source_storage_offset(x, storage, storage_offset, size, stride=()):
    """x.set_(storage, ...): `storage` from a neuron tensor's untyped_storage() (torch's own
    indexing and printing of storages go through this)."""
    memory = getattr(storage, "_neuron_memory", None)
    if memory is None:
        raise T.device_error(storage.device)
    stride = tuple(stride) or T.contiguous_strides(size)
    check_fits(memory, size, stride, storage_offset, x.element_size())
    return _set_memory(x, memory, storage_offset, size, stride)


@register(aten.set_.default)
def set_empty(x):
    x._storage = T.NeuronStorage(0)
    _compat.set_metadata(x, (0,), (1,), 0)
    T.refresh(x)
    return x


def _make_scatter(view_op):
    """x.select_scatter(src, ...) etc.: a copy of x with src written into the view."""
    view = make_view(view_op)

    def scatter(x, src, *args, **kwargs):
        from neuron_eager.ops.copy import clone
        from neuron_eager.ops.elementwise import copy_into

        out = clone(x)  # (in x's layout, as the CPU's)
        target = view(out, *args, **kwargs)
        if tuple(target.shape) != tuple(src.shape):
            raise RuntimeError(f"expected src to have a size equal to the slice of self. src "
                               f"size = {list(src.shape)}, slice size = {list(target.shape)}")
        copy_into(target, src)
        return out

    return scatter


for _scatter, _view in [(aten.select_scatter.default, aten.select.int),
                        (aten.slice_scatter.default, aten.slice.Tensor),
                        (aten.diagonal_scatter.default, aten.diagonal.default),
                        (aten.as_strided_scatter.default, aten.as_strided.default)]:
    register(_scatter)(_make_scatter(_view))


# -- copying forms of the views (what functionalization emits): the view, made contiguous --
def _make_view_copy(view_op):
    view = make_view(view_op)

    def view_copy(x, *args, **kwargs):
        from neuron_eager.ops.copy import clone

        out = view(x, *args, **kwargs)
        if isinstance(out, list):
            return [clone(o, memory_format=torch.contiguous_format) for o in out]
        return clone(out, memory_format=torch.contiguous_format)

    return view_copy


_VIEW_COPIES = [  # (copying op, its view op): resolved once, at import
    (aten.view_copy.default, aten.view.default), (aten.view_copy.dtype, aten.view.dtype),
    (aten.expand_copy.default, aten.expand.default), (aten.alias_copy.default, aten.alias.default),
    (aten.as_strided_copy.default, aten.as_strided.default),
    (aten.permute_copy.default, aten.permute.default), (aten.t_copy.default, aten.t.default),
    (aten.transpose_copy.int, aten.transpose.int),
    (aten.squeeze_copy.default, aten.squeeze.default), (aten.squeeze_copy.dim, aten.squeeze.dim),
    (aten.squeeze_copy.dims, aten.squeeze.dims),
    (aten.unsqueeze_copy.default, aten.unsqueeze.default),
    (aten.unfold_copy.default, aten.unfold.default), (aten.unbind_copy.int, aten.unbind.int),
    (aten.diagonal_copy.default, aten.diagonal.default),
    (aten.select_copy.int, aten.select.int), (aten.slice_copy.Tensor, aten.slice.Tensor),
    (aten.split_copy.Tensor, aten.split.Tensor),
    (aten.split_with_sizes_copy.default, aten.split_with_sizes.default),
    (aten.narrow_copy.default, aten.narrow.default),
    (aten.detach_copy.default, aten.alias.default),
]
for _copy_op, _view_op in _VIEW_COPIES:
    register(_copy_op)(_make_view_copy(_view_op))


@register(aten.diag_embed.default)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    from neuron_eager.ops.copy import fill
    from neuron_eager.ops.elementwise import copy_into

    meta = meta_run(aten.diag_embed.default, x, offset, dim1, dim2)  # (a Python ref: cached)
    out = fill(T.empty(meta.shape, x.dtype), 0)
    copy_into(make_view(aten.diagonal.default)(out, offset, dim1, dim2), x)
    return out


def _shuffle(x, shape, order, final):
    """Reshape, permute, and copy into the final shape: pixel/channel shuffles are data moves
    (a channels-last input gives a channels-last result, as on the CPU)."""
    from neuron_eager.ops.copy import channels_last_like, clone

    moved = make_view(aten.permute.default)(aten.reshape.default(x, shape), order)
    result = aten.view.default(clone(moved, memory_format=torch.contiguous_format), final)
    return channels_last_like(x, result)


def _cpu_checks(op, x, *args) -> None:
    """op's argument errors in the CPU's words: checked on a meta stand-in, and if that
    raises, once more on a CPU stand-in with no memory (whose kernel raises before any work),
    where the meta kernel words its checks otherwise."""
    stand_in = _cpu_stand_in(x)
    if any(isinstance(a, int) and a <= 0 for a in args):
        op(stand_in, *args)  # (the meta kernel lets a factor of 0 through)
    try:
        op(meta_like(x), *args)
    except RuntimeError as meta_error:
        op(stand_in, *args)
        raise meta_error


def unusual_column_arguments(args) -> bool:
    """For im2col/col2im (F.unfold/F.fold) args after the input: a negative padding, or a
    stride or size of 0, which PyTorch's decomposition takes without a word."""
    *sizes, padding, stride = args
    return min(padding) < 0 or min(stride) <= 0 or any(min(s) <= 0 for s in sizes[-2:])


def decomposed(op, x, *args):
    """im2col/col2im through PyTorch's decomposition, with argument errors in the CPU's
    words: a CPU stand-in with no memory raises them before any work (unusual arguments go
    to it first)."""
    if unusual_column_arguments(args):
        op(_cpu_stand_in(x), *args)
    try:
        return decomposition_table[op](x, *args)
    except RuntimeError as error:
        op(_cpu_stand_in(x), *args)
        raise error


def _cpu_stand_in(x):
    """A CPU tensor of x's shape and dtype over one element (no memory to speak of)."""
    return torch.empty((), dtype=x.dtype).expand(x.shape)


@register(aten.pixel_shuffle.default)
def pixel_shuffle(x, upscale_factor):
    _cpu_checks(torch.pixel_shuffle, x, upscale_factor)
    r, lead = upscale_factor, list(x.shape[:-3])
    c, h, w = x.shape[-3:]
    n = len(lead)
    order = list(range(n)) + [n, n + 3, n + 1, n + 4, n + 2]
    return _shuffle(x, lead + [c // (r * r), r, r, h, w], order, lead + [c // (r * r), h * r,
                                                                       w * r])


@register(aten.pixel_unshuffle.default)
def pixel_unshuffle(x, downscale_factor):
    _cpu_checks(torch.pixel_unshuffle, x, downscale_factor)
    r, lead = downscale_factor, list(x.shape[:-3])
    c, h, w = x.shape[-3:]
    n = len(lead)
    order = list(range(n)) + [n, n + 2, n + 4, n + 1, n + 3]
    return _shuffle(x, lead + [c, h // r, r, w // r, r], order, lead + [c * r * r, h // r,
                                                                       w // r])


@register(aten.channel_shuffle.default, aten.native_channel_shuffle.default)
def channel_shuffle(x, groups):
    torch.nn.functional.channel_shuffle(meta_like(x), groups)
    n, c = x.shape[0], x.shape[1]
    rest = list(x.shape[2:])
    order = [0, 2, 1] + list(range(3, 3 + len(rest)))
    return _shuffle(x, [n, groups, c // groups] + rest, order, [n, c] + rest)


@register(aten.is_set_to.default)
def is_set_to(x, other):
    """Whether x and other are the same view of the same memory (their storage, offset,
    sizes and strides), as the CPU answers it."""
    return type(other) is NeuronTensor and x._storage is other._storage and \
        x.storage_offset() == other.storage_offset() and x.shape == other.shape and \
        x.stride() == other.stride()
