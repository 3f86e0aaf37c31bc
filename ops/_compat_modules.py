"""Touches of torch.nn's internals (Module._apply, DataParallel's comm functions,
TorchScript's load and save, the Tensor.data setter, lazy modules' placeholders), kept apart
from ops/_compat.py, whose rule they follow: tests/test_compat.py checks each, so a torch
upgrade that breaks one fails loudly."""
from __future__ import annotations

import copy as _copy
import copyreg
import functools

import torch

from neuron_eager.ops._compat import BACKEND


# Note [DataParallel on one NeuronCore]
# nn.DataParallel looks for an available device through torch._utils, which asks the
# PrivateUse1 backend, so once neuron_eager is imported it moves the module to neuron:0 (as
# on a machine with one GPU) and moves inputs with torch.nn.parallel.comm's scatter and
# gather. Those call torch._C._scatter/_gather, which a CPU build of torch lacks: every
# DataParallel model failed, CPU ones too. Without CUDA, comm's two functions split or
# concatenate and move with .to() instead, what CUDA's do for the devices they are given.
def install_data_parallel_shim() -> None:
    from torch.nn.parallel import comm

    if hasattr(torch._C, "_scatter") or getattr(comm.scatter, "__wrapped__", None):
        return
    scatter, gather = comm.scatter, comm.gather
    device_index = torch._utils._get_device_index

    @functools.wraps(scatter)
    def scatter_by_moving(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *,
                          out=None):
        if out is not None or devices is None:
            return scatter(tensor, devices, chunk_sizes, dim, streams, out=out)
        devices = [device_index(d, True) for d in devices]
        parts = tensor.split(list(chunk_sizes), dim) if chunk_sizes is not None else \
            tensor.chunk(len(devices), dim)
        return tuple(part.to(torch.device(BACKEND, d)) for part, d in zip(parts, devices))

    @functools.wraps(gather)
    def gather_by_moving(tensors, dim=0, destination=None, *, out=None):
        if out is not None:
            return gather(tensors, dim, destination, out=out)
        if destination == -1 or str(destination) == "cpu":
            destination = torch.device("cpu")
        else:
            index = device_index(destination, True, optional=True)
            destination = torch.device(BACKEND, 0 if index is None else index)
        return torch.cat([t.to(destination) for t in tensors], dim)

    comm.scatter, comm.gather = scatter_by_moving, gather_by_moving


# Note [Setting .data across devices]
# On CUDA `t.data = t.data.to(device)` moves a tensor in place (the snippets that move an
# optimizer's state after loading a checkpoint rely on it): set_data accepts another device.
# Between a CPU tensor and a Python device's wrapper tensor torch refuses ("incompatible
# tensor type"), so such a move swaps the tensor's contents with a replacement instead
# (torch.utils.swap_tensors, as Module.to does): the object keeps its identity, requires_grad,
# Parameter kind and user attributes, and a .grad moves along to stay usable.
def install_cross_device_data_setter(crosses) -> None:
    """`torch.Tensor.data = new` swaps where `crosses(t, new)` (a neuron tensor on one side
    only)."""
    base = torch._C.TensorBase.data
    if getattr(torch.Tensor.__dict__.get("data"), "fset", None) is not None:
        return

    def set_data(t, new):
        if crosses(t, new):
            move_data(t, new)
        else:
            base.__set__(t, new)

    torch.Tensor.data = property(base.__get__, set_data, doc=base.__doc__)


def move_data(t, new) -> None:
    """`t.data = new` for a `new` on another kind of device (Note [Setting .data across
    devices]); its hooks and attributes go back on `t` as after Module.to's swaps."""
    from neuron_eager.ops.tensor import user_state

    replacement = new.detach()
    if isinstance(t, torch.nn.Parameter) or getattr(t, "_is_param", False):
        replacement = torch.nn.Parameter(replacement, requires_grad=t.requires_grad)
    elif t.requires_grad and t.is_leaf:
        replacement.requires_grad_()
    grad = t.grad if t.is_leaf else None
    if grad is not None and grad.shape == new.shape:
        replacement.grad = grad.detach().to(new.device, new.dtype)
    pre, post = t._backward_hooks, getattr(t, "_post_accumulate_grad_hooks", None)
    attributes = user_state(t)
    try:
        torch.utils.swap_tensors(t, replacement)
    except RuntimeError as e:
        raise RuntimeError(f"cannot set .data of a {t.device} tensor to a {new.device} "
                           f"tensor: {e} (make the tensor on {new.device} instead, or move "
                           f"the module with .to())") from None
    _restore_user_state(t, pre, post, attributes)


# Note [Parameters keep their identity]
# On CPU and CUDA, Module.to / .half() keep each Parameter object and give it the converted
# data (`param.data = ...`), so an optimizer made before `model.to(device)` still holds the
# model's parameters, and a parameter shared by two modules (an embedding tied to the output
# layer) stays one. torch does that only for tensors with "compatible shallow-copy types",
# which a Python tensor subclass and a CPU tensor never are: each module got a new Parameter,
# untying tied weights and leaving such an optimizer on stale CPU tensors. So after
# Module._apply, each replaced Parameter takes its converted data back into the old object
# (torch.utils.swap_tensors, as torch does for traceable tensor subclasses); where a swap is
# refused (something else holds the old tensor: a saved autograd graph, weak references), the
# new objects stay but tied ones are made one again. Conversions that kept the objects, or
# that involve no neuron tensor (`.to("meta")`), are left as torch does them.
_plain_apply = None


_identity_warned = False


def _keep_identity(old: torch.nn.Parameter, new: torch.nn.Parameter, where: str):
    """`old` holding `new`'s data if torch lets the two swap, else `new` (said once: an
    optimizer made before the conversion would go on updating `old`)."""
    global _identity_warned
    # swap_tensors moves the tensors' hooks and __dict__ along with their data: what the user
    # put on `old` (hooks, attributes such as _no_weight_decay) goes back on it afterwards
    pre, post = old._backward_hooks, getattr(old, "_post_accumulate_grad_hooks", None)
    attributes = dict(old.__dict__)
    kind = type(old)
    try:
        torch.utils.swap_tensors(old, new)
    except RuntimeError as e:
        if type(old) is not kind:  # refused after swapping the Python halves (a profiler that
            _swap_python_halves(old, new)  # recorded shapes holds the C++ tensor): put back
        if not _identity_warned:
            _identity_warned = True
            from neuron_eager.ops.sourceline import warn_at_user_line

            warn_at_user_line(f"Module.to(): {where} is held elsewhere ({e}), so it is a new "
                              f"Parameter now; build optimizers after moving the model")
        return new
    _restore_user_state(old, pre, post, attributes)
    return old


def _swap_python_halves(t1, t2) -> None:
    """Swap the class, __dict__ and slots of two tensors, as swap_tensors does before it
    swaps their C++ tensors (so doing it again undoes it)."""
    for name in ("__class__", "__dict__"):
        held = getattr(t1, name)
        setattr(t1, name, getattr(t2, name))
        setattr(t2, name, held)
    for slot in copyreg._slotnames(type(t1)):
        one, two = hasattr(t1, slot), hasattr(t2, slot)
        held = getattr(t1, slot) if one else None
        if two:
            setattr(t1, slot, getattr(t2, slot))
        elif one:
            delattr(t1, slot)
        if one:
            setattr(t2, slot, held)
        elif two:
            delattr(t2, slot)


def _restore_user_state(p, pre, post, attributes) -> None:
    from neuron_eager.ops.tensor import DEVICE_ATTRS

    if pre or post:  # (assigning the dicts registers them again; their handles stay valid)
        p._backward_hooks = p._post_accumulate_grad_hooks = None
        p._backward_hooks, p._post_accumulate_grad_hooks = pre or None, post or None
    for name, value in attributes.items():
        if name not in DEVICE_ATTRS:
            p.__dict__.setdefault(name, value)


def install_tied_parameters_shim() -> None:
    global _plain_apply
    if _plain_apply is not None:
        return
    _plain_apply = torch.nn.Module._apply

    def _apply(self, fn, recurse=True):
        if isinstance(self, torch.jit.RecursiveScriptModule):  # (each child: its own _apply)
            _parameters_as_parameters(self)
        if not recurse:
            return _plain_apply(self, fn, recurse)
        before = [(m, name, p) for m in self.modules() for name, p in m._parameters.items()
                  if p is not None]
        lazy = [(table, name, t) for table in (self._parameters, self._buffers)
                for name, t in table.items() if isinstance(t, _UNINITIALIZED)]  # (children:
        # their own _apply)
        out = _plain_apply(self, fn, recurse)
        _keep_uninitialized(lazy)
        kept: dict = {}  # id(old parameter) -> the object every module now uses
        for m, name, p in before:
            table = m._parameters  # (a ScriptModule's is a wrapper with no .get)
            now = table[name] if name in table else None
            if now is None or now is p or BACKEND not in (p.device.type, now.device.type) \
                    or isinstance(p, _UNINITIALIZED) or isinstance(m, torch.jit.ScriptModule):
                continue  # kept, or another device's conversion, or a ScriptModule's (its
                # C++ module holds every parameter too): torch's own behaviour
            if id(p) not in kept:
                kept[id(p)] = _keep_identity(p, now, f"{type(m).__name__}.{name}")
            m._parameters[name] = kept[id(p)]
        return out

    torch.nn.Module._apply = _apply
    _materialize = torch.nn.parameter.UninitializedTensorMixin.materialize

    def materialize(self, shape, device=None, dtype=None):
        target = self.__dict__.pop("_materialize_on", None)
        if target is None or device is not None:
            return _materialize(self, shape, device, dtype)
        _materialize(self, shape, None, dtype)  # on the host, then moved: the same object
        with torch.no_grad():
            moved = self.to(target)
        if isinstance(self, torch.nn.Parameter):
            moved = torch.nn.Parameter(moved, self.requires_grad)
        torch.utils.swap_tensors(self, moved)

    torch.nn.parameter.UninitializedTensorMixin.materialize = materialize
    for placeholder in _UNINITIALIZED:
        placeholder.__new__ = _made_on_host(placeholder.__new__)


# Note [TorchScript on neuron]
# A ScriptModule loaded with torch.jit.load holds its parameters as plain tensors, and
# Module._apply, for a conversion it cannot do in place (a CPU tensor and a neuron tensor are
# not shallow-copy compatible), asserts that each is a Parameter: `.to("neuron")` failed.
# They become Parameters (the same memory) first. torch.jit.load(map_location="neuron")
# loads onto the CPU and moves the module (the C++ loader made tensors Python could not
# run), and torch.jit.save writes a CPU copy of a module holding neuron tensors (C++ cannot
# read them): load it with map_location="neuron" again.
def _parameters_as_parameters(script_module) -> None:
    table = script_module._parameters
    for name in list(table.keys()):
        p = table[name]
        if p is not None and not isinstance(p, torch.nn.Parameter):
            table[name] = torch.nn.Parameter(p, requires_grad=p.requires_grad)


def install_torchscript_shim() -> None:
    """Note [TorchScript on neuron]."""
    import torch.jit._serialization as serialization

    load, save = serialization.load, serialization.save
    if getattr(load, "_neuron_wrapped", False):
        return

    @functools.wraps(load)
    def load_onto_neuron(f, map_location=None, *args, **kwargs):
        target = map_location
        if isinstance(target, (str, torch.device)) and torch.device(target).type == BACKEND:
            return load(f, "cpu", *args, **kwargs).to(target)
        return load(f, map_location, *args, **kwargs)

    @functools.wraps(save)
    def save_from_host(m, f, *args, **kwargs):
        tensors = [*m.parameters(), *m.buffers()] if isinstance(m, torch.nn.Module) else []
        if any(t.device.type == BACKEND for t in tensors):
            m = _copy.deepcopy(m).cpu()
        return save(m, f, *args, **kwargs)

    load_onto_neuron._neuron_wrapped = True
    torch.jit.load = serialization.load = load_onto_neuron
    torch.jit.save = serialization.save = save_from_host


def _made_on_host(new):
    """A lazy module's placeholder asked for on neuron (`LazyLinear(4, device="neuron")`,
    `with torch.device("neuron")`, set_default_device) is made on the host and materializes
    on neuron (Note [Lazy modules on the device])."""

    @functools.wraps(new)
    def __new__(cls, *args, **kwargs):
        device = kwargs.get("device")
        target = torch.device(device) if device is not None else torch.get_default_device()
        if target.type != BACKEND:
            return new(cls, *args, **kwargs)
        placeholder = new(cls, *args, **{**kwargs, "device": "cpu"})
        placeholder._materialize_on = target
        return placeholder

    return staticmethod(__new__)


# Note [Lazy modules on the device]
# An UninitializedParameter cannot hold neuron memory (its class is a plain Tensor subclass;
# a neuron tensor is a wrapper subclass), so `LazyLinear(4).to("neuron")` made its weight an
# ordinary empty neuron Parameter and the first forward failed. Instead the placeholder
# stays on the host, remembers the device (and takes the dtype) it was sent to, and
# `materialize` (the first forward) makes it there, keeping the object modules hold. One
# asked for on neuron at construction is made the same way (`_made_on_host`).
_UNINITIALIZED = (torch.nn.parameter.UninitializedParameter,
                  torch.nn.parameter.UninitializedBuffer)


def _keep_uninitialized(lazy) -> None:
    for table, name, placeholder in lazy:
        now = table.get(name)
        if now is not None and now.device.type == BACKEND:
            if now.dtype != placeholder.dtype:
                placeholder.data = torch.empty(0, dtype=now.dtype)
            placeholder._materialize_on = now.device
            table[name] = placeholder
        elif isinstance(now, _UNINITIALIZED):  # sent to the host (or kept there)
            now.__dict__.pop("_materialize_on", None)
