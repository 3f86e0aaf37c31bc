"""What a neuron tensor's `untyped_storage()` answers for: its HBM memory.

torch's storage object for a Python device is a data-less C++ storage whose own methods
refuse to run ("invalid python storage"), so the methods programs call on it are answered
here from the memory (a NeuronStorage: a byte buffer and its HBM block) and set on the
object by NeuronTensor.untyped_storage().
"""
from __future__ import annotations

from functools import partial

import numpy as np
import torch

from neuron_eager.device_sim import core


def answer_for(storage, memory):
    """`storage` answering for `memory`: address, size, copies, fills and moves."""
    storage._neuron_memory = memory  # for set_(storage): ops/views.py
    storage.data_ptr = partial(address, memory)
    storage.nbytes = storage.size = partial(nbytes, memory)
    storage.cpu = partial(to_host, memory)
    storage.copy_ = partial(_copy, storage, memory)
    storage.fill_ = partial(_fill, storage, memory)
    storage.to = partial(_to, storage, memory)
    storage.new = _new
    storage.resize_ = _resize
    return storage


def address(memory) -> int:
    return 0 if memory.block is None else memory.block.address


def nbytes(memory) -> int:
    return memory.nbytes


def to_host(memory) -> torch.UntypedStorage:
    return torch.from_numpy(memory.buffer[:memory.nbytes].copy()).untyped_storage()


def _copy(storage, memory, source, non_blocking=None):
    torch.neuron.synchronize()  # (adaptive eager's pending writes land first)
    n = memory.nbytes
    if source.nbytes() != n:
        raise RuntimeError(f"size does not match, self was {n} bytes but src was "
                           f"{source.nbytes()} bytes")
    other = getattr(source, "_neuron_memory", None)
    if other is not None:
        memory.buffer[:n] = other.buffer[:n]
    elif source.device.type == "cpu":
        memory.buffer[:n] = torch.empty(0, dtype=torch.uint8).set_(source).numpy()
    else:
        raise RuntimeError(f"copy_ of a neuron storage from a {source.device.type} storage is "
                           f"not supported")
    core.launch("dma", n, 2 * n)
    return storage


def _fill(storage, memory, value):
    torch.neuron.synchronize()
    memory.buffer[:memory.nbytes] = int(value) & 0xFF  # (bytes: 300 is 44, as on the CPU)
    core.launch("dma", memory.nbytes, memory.nbytes)
    return storage


def _to(storage, memory, *, device, non_blocking=False):
    device = torch.device(device)
    if device.type == "cpu":
        return to_host(memory)
    if device.type == storage.device.type and device.index in (None, storage.device.index):
        return storage
    raise RuntimeError(f"a neuron storage cannot be moved to {device}: move its tensor")


def _new():
    return torch.empty(0, dtype=torch.uint8, device="neuron").untyped_storage()


def _resize(size):
    raise NotImplementedError(
        "resize_() of a neuron storage is not supported: tensors keep views of its memory "
        "(FSDP frees parameters this way; neuron_eager has no distributed backend yet)")
