"""NeuronTensor: a wrapper subclass whose data is a block of simulated HBM.

A tensor is metadata (size, stride, offset, dtype) over a `NeuronStorage`;
views share the storage, so in-place writes through any view are seen by all.
The storage returns its block to the caching allocator when the last tensor
using it dies. `tensor._nd` is a NumPy view of exactly the tensor's elements in
the kernel dtype (16-bit floats as uint16 bit patterns), which kernels use.
"""
from __future__ import annotations

import copy as _copy
import sys
import threading
from collections import OrderedDict
from math import prod

import numpy as np
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._pytree import tree_map

from neuron_eager.device_sim import OutOfMemory, core
from neuron_eager.ops import _compat, _compat_modules, saving, storages, workers
from neuron_eager.ops.sourceline import debugger_tracing, untraced

_compat.rename_backend()
DEVICE = torch.device(_compat.BACKEND, 0)

# torch dtype -> NumPy dtype of the stored elements, as kernels see them.
STORAGE_DTYPE = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.bfloat16: np.dtype(np.uint16),
    torch.float16: np.dtype(np.uint16),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8),
    torch.bool: np.dtype(np.bool_),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
}
_EMPTY = np.empty(0, dtype=np.uint8)
_make_wrapper = torch.Tensor._make_wrapper_subclass

# dtype -> the C++ type name PyTorch's messages print for it (caffe2::TypeMeta)
CPP_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
             torch.bfloat16: "c10::BFloat16", torch.int8: "signed char",
             torch.uint8: "unsigned char", torch.int16: "short int", torch.int32: "int",
             torch.int64: "long int", torch.bool: "bool"}


class NeuronOutOfMemoryError(torch.OutOfMemoryError):
    """Raised when the simulated HBM cannot hold an allocation."""


_DTYPE_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
                torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
                torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
                torch.uint16: "UInt16", torch.uint32: "UInt32", torch.uint64: "UInt64"}


def dtype_name(dtype: torch.dtype) -> str:
    """PyTorch's own name for a dtype in error messages ('Float', 'Long', ...)."""
    return _DTYPE_NAMES.get(dtype, str(dtype))


# (torch's own export made a capsule of a device pointer no library can read, and a tensor
# torch could not run an op on when imported back)
NO_DLPACK = ("neuron tensors cannot be exported through DLPack: their memory is the simulated "
             "device's, which no other library can read. Use Tensor.cpu() to copy the tensor "
             "to host memory first.")

NOT_SHARED = (
    "neuron tensors cannot be shared with or sent to another process: each process simulates "
    "its own NeuronCore and alone holds its memory (run one process per core, as torchrun "
    "does). Share CPU tensors instead (model.cpu().share_memory()) and move them to neuron in "
    "each process.")


class UnsupportedDtypeError(RuntimeError):
    """A dtype neuron cannot hold. Not a TypeError: torch's binary operators turn a TypeError
    into NotImplemented, and `x * 1j` would end in Python's "unsupported operand type(s)"."""


QUANTIZED = ("quantized tensors ({}) are not supported on neuron. Keep them on the CPU; "
             "x.dequantize() (a float tensor) or x.int_repr() (its integers) can move.")


def check_dtype(dtype: torch.dtype) -> None:
    if dtype not in STORAGE_DTYPE:
        if dtype.is_complex:
            raise UnsupportedDtypeError(f"{dtype} is not supported on neuron: Trainium has no "
                                        "complex dtypes. Keep complex tensors on the CPU.")
        if str(dtype).startswith(("torch.qint", "torch.quint")):
            raise UnsupportedDtypeError(QUANTIZED.format(dtype))
        kept = ", ".join(str(d).removeprefix("torch.") for d in STORAGE_DTYPE)
        raise UnsupportedDtypeError(
            f"{dtype} is not supported on neuron: neuron tensors hold {kept}. Keep "
            f"{str(dtype).removeprefix('torch.')} tensors on the CPU, or convert them there "
            f"first (e.g. x.to(torch.bfloat16))")


def device_error(other: torch.device) -> RuntimeError:
    return RuntimeError("Expected all tensors to be on the same device, but found at least two "
                        f"devices, {DEVICE} and {other}!")


def check_foreign(t: torch.Tensor) -> None:
    """A non-neuron tensor among an op's arguments: only CPU scalars may mix, as on CUDA."""
    if t.device.type == "cpu" and t.dim() == 0:
        return
    if t.device.type != DEVICE.type:
        raise device_error(t.device)


class NeuronStorage:
    """One HBM block (or none, for zero bytes) shared by a tensor and its views."""

    __slots__ = ("block", "buffer", "nbytes", "__weakref__")

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        if nbytes == 0:
            self.block, self.buffer = None, _EMPTY
            return
        try:
            self.block = core.hbm.malloc(nbytes)
        except OutOfMemory as e:
            self.block = None
            if nbytes >= 1 << 63:  # no device has that: the size itself is wrong
                raise RuntimeError(f"Storage size calculation overflowed: {nbytes} bytes is "
                                   f"more than int64 holds") from None
            raise NeuronOutOfMemoryError(str(e)) from None
        self.buffer = self.block.buffer

    def __del__(self):
        block = getattr(self, "block", None)  # unset if __init__ raised before malloc returned
        if block is not None:
            self.block = None
            if core is not None:  # None when the interpreter is tearing modules down
                core.hbm.free(block)


def check_device_index(device) -> None:
    """Refuse `neuron:k` for k > 0, as CUDA refuses an ordinal it does not have."""
    index = device.index if isinstance(device, torch.device) else device
    if index not in (None, 0):
        raise RuntimeError(f"neuron:{index} does not exist: this process simulates one "
                           "NeuronCore (neuron:0); run one process per core, as torchrun does")


def wrap_dim(dim: int, ndim: int) -> int:
    """`dim` as a non-negative index, with PyTorch's error when out of range."""
    lo, hi = -max(ndim, 1), max(ndim, 1) - 1
    if not lo <= dim <= hi:
        raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], "
                         f"but got {dim})")
    return dim % max(ndim, 1)


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


_RANKS = ((torch.channels_last, 4, "channels_last"),
          (torch.channels_last_3d, 5, "channels_last_3d"))


def memory_format_strides(shape, memory_format):
    """Strides of a memory format (None: contiguous); the CPU's error for a rank it needs."""
    for fmt, rank, name in _RANKS:
        if memory_format == fmt and len(shape) != rank:
            raise RuntimeError(f"required rank {rank} tensor to use {name} format")
    if memory_format == torch.channels_last and len(shape) == 4:
        n, c, h, w = shape
        return (h * w * c, 1, w * c, c)
    if memory_format == torch.channels_last_3d and len(shape) == 5:
        n, c, d, h, w = shape
        return (d * h * w * c, 1, h * w * c, w * c, c)
    return None


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def storage_extent(shape, stride, offset: int) -> int:
    """How many elements from the storage's start a view with this layout reaches."""
    if any(s == 0 for s in shape):
        return offset
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride))


_DEEPCOPY_NON_LEAF = (
    "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol "
    "at the moment.  If you were attempting to deepcopy a module, this may be because of a "
    "torch.nn.utils.weight_norm usage, see https://github.com/pytorch/pytorch/pull/103001")


class _DataField:
    """A neuron tensor's data attribute (`_storage`, `_nd`, `_flat`, `_key`) where its
    __dict__ lacks it (Note [Data fields]): `_nd` of a tensor made by new_contiguous or
    make_lazy is made on first use; data that adaptive eager has not computed yet is
    computed (or its region's error raised); else AttributeError, as for any attribute."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, t, owner=None):
        if t is None:
            return self
        name, d = self.name, t.__dict__
        if name == "_nd":
            view = d.get("_flat")
            if view is not None:
                nd = d["_nd"] = view.reshape(t.shape)
                return nd
            storage = d.get("_storage")
            if storage is not None:  # a view made by make_lazy
                nd = d["_nd"] = nd_view(storage, t.shape, t.stride(), t.storage_offset(),
                                        t.dtype)
                return nd
        if _pending_hook is not None and "_storage" not in d:
            _pending_hook(t)  # computes the data or raises
            return getattr(t, name)
        raise AttributeError(f"'{type(t).__name__}' object has no attribute '{name}'")


# Note [Data fields]
# The data attributes live in each tensor's __dict__, which a non-data descriptor on the
# class does not shadow: the descriptor runs only where the dict lacks the name. A
# `__getattr__` did the same, but its presence puts a Python-level hook in front of every
# attribute lookup on the class: `t.dim()` took ~300 ns more, on every op's hot path.
class NeuronTensor(torch.Tensor):
    """A tensor on the simulated NeuronCore (device `neuron:0`).

    Besides torch's metadata it holds `_storage`, `_nd` (see the module docstring) and, for
    the elementwise fast path, `_key` = (shape, dtype, host address of the first element)
    when it is C-contiguous (else None)
    and `_flat`, a 1-D view of its elements made on first use. `refresh` keeps them in step
    when the metadata changes in place.
    """

    _storage: NeuronStorage = _DataField()
    _nd: np.ndarray = _DataField()
    _key: tuple | None = _DataField()
    _flat: np.ndarray | None = _DataField()

    @staticmethod
    def __new__(cls, storage, shape=None, stride=None, offset=None, dtype=None,
                requires_grad=None, **attributes):
        if isinstance(storage, torch.Tensor) and shape is None:
            # type(p)(data, requires_grad=..., **vars(p)) re-wraps a Parameter (accelerate's
            # idiom): a neuron Parameter's type is this class, not nn.Parameter
            return torch.nn.Parameter(storage, True if requires_grad is None else requires_grad)
        return make(storage, shape, stride, offset, dtype, bool(requires_grad))

    def __init__(self, *args, **kwargs):
        pass

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if _gettrace() is not None and debugger_tracing(_gettrace()):
            return untraced(cls.__torch_dispatch__, func, types, args, kwargs)
        if cls is not NeuronTensor:  # (Note [Subclasses of neuron tensors])
            args, kwargs = tree_map(plain, (args, kwargs or {}))
        if _function_modes() or _tracing_state() is not None:  # (Note [Host tensors under
            with _device_side():  # a default device] in _compat.py)
                return _dispatcher(func, args, kwargs or {})
        return _dispatcher(func, args, kwargs or {})

    def as_subclass(self, cls):
        # (Note [Subclasses of neuron tensors])
        if issubclass(cls, torch.nn.parameter.UninitializedTensorMixin):
            return self  # a lazy module's placeholder sent here (Note [Lazy modules on the device])
        kind = subclass_with_neuron(cls)
        if kind is None:
            return super().as_subclass(cls)
        self._storage  # noqa: B018  (a pending result of adaptive eager is computed first)
        _alias_class.kind = kind
        try:
            return super().as_subclass(kind)
        finally:
            _alias_class.kind = None

    def __repr__(self, *, tensor_contents=None):
        from neuron_eager.ops.printing import tensor_repr

        return tensor_repr(self, tensor_contents)

    def record_stream(self, stream) -> None:
        """Accepted, as on CUDA: kernels run at once on the host, so memory freed on one
        stream is never still in use by another (torch.neuron.Stream is a Python object,
        which the C++ method would refuse)."""
        if getattr(stream, "device", None) is None or torch.device(stream.device).type != \
                DEVICE.type:
            raise RuntimeError(f"record_stream: expected a neuron stream, got {stream!r}")

    def share_memory_(self):
        raise RuntimeError(NOT_SHARED)

    def is_shared(self) -> bool:  # (CUDA says True: its IPC shares device memory)
        return False

    def __reduce_ex__(self, protocol):
        user = getattr(type(self), "_user_class", None)
        state = user_state(self)
        if user is not None or state and not getattr(self, "_is_param", False):
            # a subclass (Note [Subclasses of neuron tensors]), or a plain tensor with the
            # user's attributes, saved as the CPU saves them (a rebuilt neuron tensor stays
            # one: its as_subclass(torch.Tensor) is a neuron tensor)
            func, args = self._reduce_plain()
            return torch._tensor._rebuild_from_type_v2, (func, user or torch.Tensor, args, state)
        return self._reduce_plain()

    def _reduce_plain(self):
        # torch.save and pickle: the data travels in CPU storages, through rebuild functions
        # that torch.load(weights_only=True) accepts; loading moves it back to neuron (Note
        # [Saving storages]).
        # A Parameter keeps the attributes a user set, as on the CPU.
        if getattr(self, "_is_param", False):
            return (torch._utils._rebuild_parameter_with_state,
                    (self.detach(), self.requires_grad, OrderedDict(), user_state(self)))
        saved = getattr(saving.state, "storages", None)
        if saved is None:
            return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                    (to_cpu_in_layout(self.detach()), self.dtype, str(self.device),
                     self.requires_grad))
        memory = self._storage
        entry = saved.get(id(memory))
        if entry is None:  # the whole memory once, however many tensors view it
            copy = storages.to_host(memory)
            entry = saved[id(memory)] = (copy, memory)  # (memory kept: its id stays unique)
            saving.state.tagged.add(copy._cdata)
        typed = torch.storage.TypedStorage(wrap_storage=entry[0], dtype=self.dtype,
                                           _internal=True)
        return (torch._utils._rebuild_tensor_v2, (typed, self.storage_offset(),
                                                   tuple(self.shape), self.stride(),
                                                   self.requires_grad, OrderedDict()))

    @property
    def data(self):
        return _TENSOR_DATA.__get__(self)

    @data.setter
    def data(self, new):
        # `p.data = new` (Module.to(dtype), .half(), user code) swaps the C++ metadata only;
        # the memory behind it lives in our attributes, so they follow.
        storage = new._storage if type(new) is NeuronTensor else None  # computed first
        if storage is None and isinstance(new, torch.Tensor) and new.device.type != DEVICE.type:
            return _compat_modules.move_data(self, new)  # as CUDA's, to another device
        _TENSOR_DATA.__set__(self, new)
        if storage is not None:
            self.__dict__.pop("_node", None)
            self._storage = storage
            refresh(self)

    def tolist(self):
        return to_cpu(self).tolist()

    def data_ptr(self):
        """The simulated HBM address of the first element (0 for no memory), so code that
        compares pointers to detect aliasing sees what aliases (torch's own answer is 0 for
        every tensor of a Python device)."""
        block = self._storage.block
        return 0 if block is None else block.address + self.storage_offset() * self.itemsize

    def untyped_storage(self):
        """torch's storage object for this tensor, answering for its HBM memory: `data_ptr()`
        is the simulated address where the memory begins and `nbytes()` its size, the same
        for every view of it. safetensors and transformers' save_pretrained find tensors that
        share memory this way (a Python device's storage would raise on data_ptr)."""
        memory = self._storage
        storage = _UNTYPED_STORAGE(self)
        if _STORAGE_NBYTES(storage) != memory.nbytes:  # (a view's reaches only as far as it)
            storage = _UNTYPED_STORAGE(_make_wrapper(NeuronTensor, (memory.nbytes,),
                                                     dtype=torch.uint8, device=DEVICE))
        return storages.answer_for(storage, memory)

    def __format__(self, format_spec):
        if self.dim() == 0:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __deepcopy__(self, memo):
        # as on the CPU: views of one memory stay views of one new memory, and a Parameter's
        # copy is a new Parameter without .grad (a plain tensor's copy keeps its grad)
        if not self.is_leaf:
            raise RuntimeError(_DEEPCOPY_NON_LEAF)
        if id(self) in memo:
            return memo[id(self)]
        memory = self._storage
        new = memo.get(id(memory))
        if new is None:
            new = memo[id(memory)] = NeuronStorage(memory.nbytes)
            new.buffer[:memory.nbytes] = memory.buffer[:memory.nbytes]
            memo.setdefault(id(memo), []).append(memory)  # (copy.deepcopy's keep-alive list)
            core.launch("dma", memory.nbytes, 2 * memory.nbytes)
        copy = make(new, self.shape, self.stride(), self.storage_offset(), self.dtype)
        if getattr(self, "_is_param", False):  # (a Parameter's attributes are not copied)
            copy = torch.nn.Parameter(copy, requires_grad=self.requires_grad)
        else:
            copy.requires_grad_(self.requires_grad)
            if self.grad is not None:
                copy.grad = self.grad.__deepcopy__(memo)
            copy.__dict__.update(_copy.deepcopy(user_state(self), memo))
        memo[id(self)] = copy
        return copy

    def __copy__(self):
        # as the CPU's copy.copy (a rebuild on the same storage): the same memory, a new leaf
        copy = make(self._storage, self.shape, self.stride(), self.storage_offset(), self.dtype)
        if getattr(self, "_is_param", False):
            copy = torch.nn.Parameter(copy, requires_grad=self.requires_grad)
        else:
            copy.requires_grad_(self.requires_grad)
        copy.__dict__.update(user_state(self))
        return copy

    def numpy(self, *, force: bool = False):
        if force:
            return to_cpu_in_layout(self.detach()).numpy()
        raise TypeError("can't convert neuron:0 device type tensor to numpy. "
                        "Use Tensor.cpu() to copy the tensor to host memory first.")

    def __array__(self, dtype=None, copy=None):
        return self.numpy()

    def __dlpack__(self, *args, **kwargs):
        raise BufferError(NO_DLPACK)

    def __dlpack_device__(self):
        raise BufferError(NO_DLPACK)


# Note [torch.compile]
# TorchDynamo traced into __torch_dispatch__ as if the simulator were user code, and failed
# inside it (a Numba kernel handed a traced 0-dim array for a Python scalar). Skipped there
# with all it calls, Dynamo breaks the graph at each op on neuron tensors, which then run as
# in eager mode: `torch.compile(model)` gives eager's results (a backend of our own later).
_compat.keep_dynamo_out(NeuronTensor.__torch_dispatch__.__func__)
# Python's and torch's messages name a value's type ("unsupported operand type(s) for
# divmod(): 'Tensor' and 'int'", "Expected value argument (Tensor of shape (3,))"): the CPU's
# and CUDA's words. type(t) still prints neuron_eager.ops.tensor.NeuronTensor (its qualname).
NeuronTensor.__name__ = "Tensor"
for _name in ("__repr__", "__format__", "__reduce_ex__", "__deepcopy__", "tolist", "numpy",
              "untyped_storage"):
    setattr(NeuronTensor, _name, _compat.host_side(vars(NeuronTensor)[_name]))
_function_modes, _tracing_state, _device_side = (_compat.function_modes, _compat.tracing_state,
                                                  _compat.device_side)
_gettrace = sys.gettrace
_TENSOR_DATA = torch._C.TensorBase.data  # the C++ `data` descriptor NeuronTensor.data wraps
_UNTYPED_STORAGE = torch._C.TensorBase.untyped_storage
_STORAGE_NBYTES = torch._C.StorageBase.nbytes  # (the C++ size: len(), indexing, printing)


def _dispatch_not_ready(func, args, kwargs):
    raise RuntimeError("neuron_eager.ops.router has not been imported")


_dispatcher = _dispatch_not_ready


# Note [Subclasses of neuron tensors]
# `t.as_subclass(Image)` (torchvision's tv_tensors, any Tensor subclass that only overrides
# __torch_function__) makes torch alias `t` and give the alias the class Image. A neuron
# tensor's alias is already a NeuronTensor object, which torch refuses to turn into an
# Image, so the alias is made as an instance of a class deriving from both, (Image,
# NeuronTensor): an Image by isinstance and by its methods, stored and dispatched as a
# neuron tensor. Kernels take plain neuron tensors, so __torch_dispatch__ hands them aliases
# of such operands (the same memory and layout); results are plain neuron tensors, which
# Image's __torch_function__ wraps as it does on the CPU.
_alias_class = threading.local()  # .kind: the class aten.alias gives its result in as_subclass
_with_neuron: dict = {}


def subclass_with_neuron(cls):
    """The class of `as_subclass(cls)` of a neuron tensor; None where torch's own answer
    holds (torch.Tensor and NeuronTensor, non-Tensor classes, a class with its own
    __torch_dispatch__)."""
    if not (isinstance(cls, type) and issubclass(cls, torch.Tensor)) or \
            issubclass(NeuronTensor, cls):
        return None
    if issubclass(cls, NeuronTensor):
        return cls
    if any("__torch_dispatch__" in vars(k) for k in cls.__mro__
           if k not in (torch.Tensor, torch._C.TensorBase)):
        return None
    kind = _with_neuron.get(cls)
    if kind is None:
        kind = _with_neuron[cls] = type(cls.__name__, (cls, NeuronTensor),
                                        {"__module__": cls.__module__, "_user_class": cls})
        # (set after creation: torch's metaclass disables a dispatching class's own)
        kind.__torch_function__ = classmethod(_user_torch_function)
    return kind


def _user_torch_function(kind, func, types, args=(), kwargs=None):
    """The user class's __torch_function__, run as for that class: it wraps results as the
    user class, which a neuron result turns into `kind` through as_subclass and a CPU one
    (`.cpu()`) stays, as on the CPU."""
    user = kind._user_class
    types = tuple([getattr(t, "_user_class", t) for t in types])
    return user.__torch_function__(func, types, args, kwargs)


def plain(x):
    """A subclass instance's data as a plain NeuronTensor (the same memory and layout)."""
    if type(x) is NeuronTensor or not isinstance(x, NeuronTensor):
        return x
    if "_storage" not in x.__dict__ and x.device != DEVICE:
        raise TypeError(f"a {x.device} tensor of class {type(x).__name__}, which is for neuron "
                        f"tensors: call as_subclass({type(x)._user_class.__name__}) instead")
    stride = x.stride()
    return make_lazy(x._storage, x.shape, stride, x.storage_offset(), x.dtype,
                     c_contiguous(x.shape, stride))


# Note [Foreach versions]
# Autograd learns of an in-place write from the tensor's version counter, bumped in C++ (the
# ADInplaceOrView kernel) before an op reaches Python. The in-place foreach ops have no such
# kernel; the CPU's own kernels bump each tensor of `self`, and so must we, or an optimizer
# step (foreach by default) on weights saved for backward is not seen: backward would
# silently use the updated weights instead of raising "modified by an inplace operation".
# The router wraps these ops' kernels and plans once (off the hot path): ops/router.py.
def _foreach_inplace_ops() -> frozenset:
    ids = set()
    for full in torch._C._dispatch_get_all_op_names():  # "aten::_foreach_add_.Scalar"
        name, _, overload = full.partition(".")
        if name.startswith("aten::_foreach_") and name.endswith("_"):
            packet = getattr(torch.ops.aten, name[len("aten::"):])
            ids.add(id(getattr(packet, overload or "default")))
    return frozenset(ids)


FOREACH_INPLACE = _foreach_inplace_ops()  # ids of the in-place foreach overloads


def set_dispatcher(fn) -> None:
    """The router installs itself here; adaptive eager may wrap it."""
    global _dispatcher
    _dispatcher = fn


_DATA_ATTRS = frozenset(("_storage", "_nd", "_flat", "_key"))
DEVICE_ATTRS = _DATA_ATTRS | {"_is_param"}  # what a tensor's __dict__ holds for the device


_pending_hook = None


def user_state(t) -> dict:
    """The attributes of t's __dict__ that are the user's, not the device's."""
    return {k: v for k, v in t.__dict__.items() if k not in DEVICE_ATTRS and k != "_node"}


def set_pending_hook(fn) -> None:
    """Adaptive eager installs `fn(tensor)` here: called when code reads the data of a tensor
    that has none yet (a recorded result); it must give the tensor its storage or raise."""
    global _pending_hook
    _pending_hook = fn


def nd_view(storage: NeuronStorage, shape, stride, offset: int, dtype: torch.dtype) -> np.ndarray:
    npdtype = STORAGE_DTYPE.get(dtype)
    if npdtype is None:
        check_dtype(dtype)  # raises the clear error (complex views, ...)
    size = npdtype.itemsize
    if 0 in shape:  # an empty view may point past its storage's (possibly zero) bytes
        return np.empty(shape, npdtype)
    return np.ndarray(shape, npdtype, storage.buffer, offset * size, [s * size for s in stride])


def make(storage, shape, stride, offset, dtype, requires_grad=False) -> NeuronTensor:
    """Wrap `storage` as a tensor with the given layout (no copy)."""
    t = _compat.make_wrapper(NeuronTensor, shape, stride, offset, dtype, DEVICE, requires_grad)
    t._storage = storage
    nd = t._nd = nd_view(storage, shape, stride, offset, dtype)
    t._key = (t.shape, dtype, _address(storage, offset, dtype)) if nd.flags.c_contiguous \
        else None
    t._flat = None
    return t


def make_lazy(storage, shape, stride, offset, dtype, c_contiguous: bool,
              cls=NeuronTensor) -> NeuronTensor:
    """`make` for views: `_nd` is made on first use (many views are never read on the host:
    autograd's saved transposes, reshapes fed to the next view), and C-contiguity comes
    from the caller, which caches it with the layout."""
    if dtype not in STORAGE_DTYPE:  # (x.view(torch.cfloat), a complex tensor loaded here)
        check_dtype(dtype)
    t = _make_wrapper(cls, shape, strides=stride, storage_offset=offset, dtype=dtype,
                      device=DEVICE)
    d = t.__dict__
    d["_storage"], d["_flat"] = storage, None
    d["_key"] = (t.shape, dtype, _address(storage, offset, dtype)) if c_contiguous else None
    return t


def c_contiguous(shape, stride) -> bool:
    """NumPy's C-contiguity flag for this layout (sizes 1 and empty tensors are contiguous
    whatever their strides)."""
    if 0 in shape:
        return True
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride)):
        if size != 1:
            if step != expected:
                return False
            expected *= size
    return True


def requested_shape(size) -> tuple:
    """A size asked of a factory, refused as the CPU refuses a negative dimension (the
    wrapper subclass would say "numel: integer multiplication overflow")."""
    size = tuple(size)
    for n in size:
        if n < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {n}: "
                               f"{list(size)}")
    return size


def empty(shape, dtype: torch.dtype, stride=None) -> NeuronTensor:
    """A new tensor in fresh HBM (contiguous unless `stride` is given)."""
    shape = tuple(shape)
    check_dtype(dtype)
    if stride is None:
        return new_contiguous(shape, dtype)
    nbytes = storage_extent(shape, stride, 0) * STORAGE_DTYPE[dtype].itemsize
    return make(NeuronStorage(nbytes), shape, tuple(stride), 0, dtype)


def new_contiguous(shape: tuple, dtype: torch.dtype) -> NeuronTensor:
    """The hot path of `empty`: a contiguous tensor of a supported dtype (not checked)."""
    return attach_storage(_make_wrapper(NeuronTensor, shape, dtype=dtype, device=DEVICE),
                          shape, dtype)


def attach_storage(t: NeuronTensor, shape: tuple, dtype: torch.dtype) -> NeuronTensor:
    """Give a contiguous tensor without data (new, or pending in adaptive eager) fresh HBM."""
    npdtype = STORAGE_DTYPE[dtype]
    storage = NeuronStorage(prod(shape) * npdtype.itemsize)
    t._storage = storage
    t._flat = np.ndarray((storage.nbytes // npdtype.itemsize,), npdtype, storage.buffer)
    t._key = (shape, dtype, 0 if storage.block is None else storage.block.pointer)  # (`_nd`
    # is made on first use, by _DataField)
    return t


def refresh(t: NeuronTensor) -> None:
    """Re-derive the cached views after the tensor's metadata changed in place."""
    nd = t._nd = nd_view(t._storage, t.shape, t.stride(), t.storage_offset(), t.dtype)
    t._key = (t.shape, t.dtype, address(t)) if nd.flags.c_contiguous else None
    t._flat = None


def address(t: NeuronTensor) -> int:
    """The host address of t's first element (0 for a tensor without bytes); `_key[2]` of a
    contiguous tensor, where multi-tensor kernels read it."""
    return _address(t._storage, t.storage_offset(), t.dtype)


def _address(storage: NeuronStorage, offset: int, dtype: torch.dtype) -> int:
    block = storage.block
    return 0 if block is None else block.pointer + offset * STORAGE_DTYPE[dtype].itemsize


def flat(t: NeuronTensor) -> np.ndarray:
    """A 1-D view of a C-contiguous tensor's elements (cached)."""
    view = t._flat
    if view is None:
        view = t._flat = t._nd.reshape(-1)
    return view


def cpu_refusal(op, *args, **kwargs):
    """Raise the error the CPU raises for this call of an op, found by running it on copies of
    the device tensors (their values too: some checks read them). For calls a cheap test
    found bad: the CPU raises before it works, or works once on an error path."""
    run_on_cpu(op, args, kwargs)
    raise RuntimeError(f"{op}: these arguments are not supported on neuron")


def shares_memory(written, others) -> bool:
    """Whether a tensor of `others` lies in the memory of one of `written` (tensors pending in
    adaptive eager have no memory yet: they share none)."""
    storages = {id(w.__dict__.get("_storage")) for w in written if type(w) is NeuronTensor}
    storages.discard(id(None))
    return any(type(a) is NeuronTensor and id(a.__dict__.get("_storage")) in storages
               for a in others)


def cpu_mirror(values):
    """CPU copies of the neuron tensors in the pytree `values` that overlap one another as the
    device tensors do: one copy of each storage's bytes, each tensor a view of its copy. (For
    asking the CPU what it makes of aliasing arguments without touching device memory.)"""
    copies: dict = {}

    def down(x):
        if type(x) is not NeuronTensor:
            return x
        storage = x._storage
        if not storage.nbytes:
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
        base = copies.get(id(storage))
        if base is None:
            raw = np.frombuffer(storage.buffer, np.uint8, storage.nbytes)
            # (torch's own memory, not NumPy's: an out= the CPU grows must be resizable)
            base = copies[id(storage)] = torch.empty(storage.nbytes, dtype=torch.uint8)
            base.copy_(torch.from_numpy(raw))  # (base.numpy() would pin its size)
        return base.view(x.dtype).as_strided(x.shape, x.stride(), x.storage_offset())

    return tree_map(down, values)


# Note [Writes into their own inputs]
# Elementwise ops check the overlap of what they write with what they read as TensorIterator
# does (the router's _check_overlap). Other ops check it their own way on the CPU: gather,
# index_select, cat and the index writes (index_copy_, scatter_, put_, x[idx] = x[:2]) refuse
# any overlap, scans a partial one, mm and sum none. So where an op writes memory that another
# argument lies in, the CPU runs the call once on copies that overlap the same way
# (run_on_cpu), and its error, if it has one, is ours; else our kernel runs as usual.
def run_on_cpu(op, args, kwargs) -> None:
    """Run a call once on the CPU, over copies of its device tensors that overlap as they do
    (cpu_mirror): its error, if it has one, is raised; device memory is not touched."""
    cpu_args, cpu_kwargs = cpu_mirror((args, kwargs))
    with torch._C._DisableTorchDispatch():
        op(*cpu_args, **cpu_kwargs)


def cpu_alias(t: NeuronTensor) -> torch.Tensor:
    """A CPU tensor that shares the HBM bytes of `t` (no copy): writes go to the device."""
    arr = t._nd
    if t.dtype in (torch.bfloat16, torch.float16):
        return torch.from_numpy(arr).view(t.dtype) if arr.ndim else \
            torch.from_numpy(arr.reshape(1)).view(t.dtype).reshape(())
    if arr.dtype == np.bool_ or arr.ndim:
        return torch.from_numpy(arr)
    return torch.from_numpy(arr.reshape(1)).reshape(())


# Note [Host copies]
# Copies between host and HBM go through NumPy, on the calling thread: torch's own copy
# would wake its OpenMP workers, which then spin for a while on the cores that the engines'
# kernel threads (ops/elementwise.py) need next (a 1M-element fused softmax ran 1.5x slower
# after each `.cpu()` of its result).
def host_array(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor's elements in the storage format of STORAGE_DTYPE."""
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def to_cpu(t: NeuronTensor, stride=None) -> torch.Tensor:
    """A CPU copy of `t`, contiguous unless `stride` is given (Note [Host copies])."""
    out = torch.empty(t.shape, dtype=t.dtype) if stride is None else \
        torch.empty_strided(t.shape, stride, dtype=t.dtype)
    workers.copy(host_array(out), t._nd)
    return out


def to_cpu_in_layout(t: NeuronTensor) -> torch.Tensor:
    """A CPU copy of `t` in its own layout where that is dense (as .cpu() copies), else
    contiguous: what pickling and numpy(force=True) give on the CPU."""
    return to_cpu(t, t.stride() if is_non_overlapping_and_dense_or_false(t) else None)


def from_cpu(src: torch.Tensor, stride=None) -> NeuronTensor:
    """A new neuron tensor holding a copy of the CPU tensor `src` (contiguous unless
    `stride` is given)."""
    out = empty(src.shape, src.dtype, stride)
    workers.copy(out._nd, host_array(src))
    return out
