"""torch.load(..., map_location="neuron"): checkpoints load onto the device.

Note [Loading onto neuron]
torch restores a storage mapped to a PrivateUse1 device by allocating an UntypedStorage on
that device, which needs a C++ allocator that this Python device does not have: the process
crashed. So a storage mapped to neuron stays the CPU storage torch read, marked with its
target device, and each tensor torch rebuilds on a marked storage moves to neuron. The
storage moves once, as bytes, and its tensors are views of that copy, so tensors that shared
memory in the checkpoint (a parameter and a view of it) share it on the device too.
(Checkpoints saved from neuron hold CPU storages tagged "neuron:0", Note [Saving
storages] in ops/tensor.py, and load back onto neuron without a map_location.)
"""
from __future__ import annotations

import functools

import torch
import torch._utils
import torch.serialization

from neuron_eager import device as _device
from neuron_eager.ops import saving

# before the CPU's (10): our tagger must see the CPU copies of neuron memory first, and our
# deserializer runs before torch's PrivateUse1 one (23) either way
_PRIORITY = 9


def _target(location: str) -> torch.device | None:
    """The neuron device a location tag names, or None for another device."""
    if not isinstance(location, str) or not location.startswith("neuron"):
        return None
    device = torch.device(location)
    index = device.index or 0
    if index >= _device.device_count():
        raise RuntimeError(f"Attempting to deserialize object on neuron device {index} but "
                           f"torch.neuron.device_count() is {_device.device_count()}. Please "
                           f"use torch.load with map_location to map your storages to an "
                           f"existing device.")
    return torch.device("neuron", index)


def _deserialize(storage, location):
    device = _target(location)
    if device is None:
        return None
    storage._neuron_target = device  # Note [Loading onto neuron]
    return storage


def _tag(storage) -> str | None:
    """The location torch.save writes for a storage: "neuron:0" for the CPU copies of neuron
    memory that the current save made (Note [Saving storages] in ops/saving.py)."""
    return "neuron:0" if saving.saved_here(storage) else None


def _sharing_storages(save):
    @functools.wraps(save)
    def save_sharing_storages(*args, **kwargs):
        saving.begin_save()
        try:
            return save(*args, **kwargs)
        finally:
            saving.end_save()

    save_sharing_storages.__wrapped_by_neuron__ = True
    return save_sharing_storages


def _move(tensor: torch.Tensor) -> torch.Tensor:
    if type(tensor) is not torch.Tensor or tensor.device.type != "cpu":
        return tensor
    storage = tensor.untyped_storage()
    device = getattr(storage, "_neuron_target", None)
    if device is None:
        return tensor
    base = getattr(storage, "_neuron_bytes", None)
    if base is None:
        base = storage._neuron_bytes = _bytes(storage).to(device)
        if getattr(storage, "_torch_load_uninitialized", False):
            _unfilled.append((storage, base))  # Note [Legacy checkpoints]
    moved = base.view(tensor.dtype).as_strided(tensor.shape, tensor.stride(),
                                               tensor.storage_offset())
    return moved.requires_grad_(tensor.requires_grad)


# Note [Legacy checkpoints]
# The legacy format (torch.save(..., _use_new_zipfile_serialization=False)) unpickles every
# tensor before it reads the storages' bytes into them, so a tensor moved to neuron as it is
# rebuilt copied uninitialized memory. Such storages are noted when moved, and copied again
# once torch.load has read them.
_unfilled: list = []  # (CPU storage, its neuron bytes) moved before their data was read


def _bytes(storage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage, 0, (storage.nbytes(),),
                                                                (1,))


_loading = [0]  # torch.load calls under way (a map_location callable may call .neuron())


def _storage_neuron(storage, device=None, non_blocking=False):
    """`UntypedStorage.neuron()`: inside torch.load (the CUDA idiom `map_location=lambda s,
    loc: s.cuda()`), the storage is marked for neuron as map_location="neuron" marks it
    (Note [Loading onto neuron]). Elsewhere no storage can be made on neuron: the error
    says so."""
    if not _loading[0]:
        torch.UntypedStorage(0, device="neuron")  # raises (Note [No bare neuron storages])
    storage._neuron_target = _target(str(torch.device("neuron", device)
                                         if isinstance(device, int) else device or "neuron"))
    return storage


def _filling_moved(load):
    @functools.wraps(load)
    def load_then_fill(*args, **kwargs):
        start = len(_unfilled)
        _loading[0] += 1
        try:
            return load(*args, **kwargs)
        finally:
            _loading[0] -= 1
            pending = _unfilled[start:]
            del _unfilled[start:]
            for storage, base in pending:
                base.copy_(_bytes(storage))

    load_then_fill.__wrapped_by_neuron__ = True
    return load_then_fill


def install() -> None:
    torch.serialization.register_package(_PRIORITY, _tag, _deserialize)
    if not getattr(torch.save, "__wrapped_by_neuron__", False):
        torch.save = torch.serialization.save = _sharing_storages(torch.serialization.save)
    if not getattr(torch.load, "__wrapped_by_neuron__", False):
        torch.load = torch.serialization.load = _filling_moved(torch.serialization.load)
    torch.UntypedStorage.neuron = _storage_neuron
    restore = torch._utils._restore_device_fake_mode  # every rebuild of a tensor ends here

    def restore_then_move(tensor):
        return _move(restore(tensor))

    torch._utils._restore_device_fake_mode = restore_then_move
