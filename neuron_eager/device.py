"""`torch.neuron`: the device module, with TorchNeuron's names for devices,
RNG, memory, streams and events (streams.py). One process simulates one
NeuronCore, so there is one device.

>>> import torch, neuron_eager
>>> torch.neuron.is_available(), torch.neuron.device_count()
(True, 1)
"""
from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import torch

from neuron_eager.device_sim import core
from neuron_eager.device_sim.hbm import format_bytes
from neuron_eager.ops import random as _random
from neuron_eager.ops import tensor as _tensor
from neuron_eager import adaptive as _adaptive
from neuron_eager import streams as _streams
from neuron_eager.streams import (Event, Stream, StreamContext, current_stream,  # noqa: F401
                                  default_stream, is_current_stream_capturing, set_stream,
                                  stream)

# (torch.cuda.OutOfMemoryError's place: ported scripts catch it there; it is a
# torch.OutOfMemoryError, so `except torch.OutOfMemoryError` catches it too)
OutOfMemoryError = _tensor.NeuronOutOfMemoryError


@dataclass(frozen=True)
class NeuronDeviceProperties:
    name: str
    total_memory: int
    chip: str
    sbuf_bytes: int
    psum_bytes: int
    hbm_bandwidth: float
    # (CUDA's fields that ported scripts read: a NeuronCore is one core of four engines)
    major: int = 1
    minor: int = 0
    multi_processor_count: int = 1

    def __repr__(self) -> str:
        return (f"NeuronDeviceProperties(name='{self.name}', total_memory="
                f"{self.total_memory // (1 << 20)}MB, chip='{self.chip}')")


# -- devices -----------------------------------------------------------------------------
def is_available() -> bool:
    return True


# torch.utils.checkpoint saves and restores a device's RNG state only when its module says
# it is initialized: without this, dropout in a recomputed forward drew another mask.
_initialized = True


def is_initialized() -> bool:
    return True


def init() -> None:
    pass


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def _index(device) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != _tensor.DEVICE.type:
            raise ValueError(f"expected a neuron device, got {device}")
        index = device.index or 0
    _tensor.check_device_index(index)
    return index


def set_device(device) -> None:
    if not (isinstance(device, int) and device < 0):  # (CUDA ignores a negative index)
        _index(device)


@contextlib.contextmanager
def device(device):
    set_device(device)  # (one device: nothing to restore after the block)
    yield


def get_device_name(device=None) -> str:
    _index(device)
    return f"NeuronCore ({core.spec.name}, simulated)"


def get_device_properties(device=None) -> NeuronDeviceProperties:
    _index(device)
    spec = core.spec
    return NeuronDeviceProperties(get_device_name(), core.hbm.capacity, spec.name, spec.sbuf_bytes,
                                  spec.psum_bytes, spec.hbm_bandwidth / spec.cores_per_chip)


@contextlib.contextmanager
def device_of(obj):
    """torch.cuda.device_of: the device of tensor `obj` current inside the block (a CPU
    tensor leaves it)."""
    with device(obj.get_device() if obj.device.type == _tensor.DEVICE.type else -1):
        yield


def synchronize(device=None) -> None:
    """Wait for all queued work. Kernels have already run on the host; the simulated
    clock's host time moves to the end of the last queued kernel."""
    _index(device)
    _streams.synchronize()  # runs what adaptive eager recorded first: the clock includes it


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float32, torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# -- random numbers ----------------------------------------------------------------------
def manual_seed(seed: int) -> None:
    _random.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    _random.default_generator.seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return _random.default_generator.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    _index(device)
    return _random.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    _index(device)
    _random.default_generator.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(states) -> None:
    set_rng_state(states[0])


# -- memory ------------------------------------------------------------------------------
def memory_stats(device=None) -> OrderedDict:
    _index(device)
    _adaptive.flush("memory query")  # recorded work allocates when it runs
    return OrderedDict(core.hbm.stats())


def memory_stats_as_nested_dict(device=None) -> dict:
    """memory_stats() with its dotted keys as nested dicts, as torch.cuda's."""
    nested: dict = {}
    for key, value in memory_stats(device).items():
        *path, last = key.split(".")
        table = nested
        for part in path:
            table = table.setdefault(part, {})
        table[last] = value
    return nested


def memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    _index(device)
    _adaptive.flush("memory query")
    core.hbm.reset_peak_stats()


def reset_accumulated_memory_stats(device=None) -> None:
    _index(device)
    core.hbm.reset_accumulated_stats()


def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Let this process reserve at most `fraction` of the simulated HBM (as CUDA's: an
    allocation past it raises the out-of-memory error)."""
    _index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    core.hbm.fraction = fraction


def get_per_process_memory_fraction(device=None) -> float:
    _index(device)
    return core.hbm.fraction


def _deprecated(name: str, replacement, message: str):
    def call(device=None):
        warnings.warn(f"torch.neuron.{name} {message}", FutureWarning, stacklevel=2)
        return replacement(device)

    call.__name__ = name
    call.__doc__ = f"Deprecated, as torch.cuda.{name}: {replacement.__name__}."
    return call


# CUDA's deprecated names, which ported scripts still call
memory_cached = _deprecated("memory_cached", memory_reserved,
                            "has been renamed to torch.neuron.memory_reserved")
max_memory_cached = _deprecated("max_memory_cached", max_memory_reserved,
                                "has been renamed to torch.neuron.max_memory_reserved")
reset_max_memory_allocated = _deprecated(
    "reset_max_memory_allocated", reset_peak_memory_stats,
    "now calls torch.neuron.reset_peak_memory_stats, which resets /all/ peak memory stats.")
reset_max_memory_cached = _deprecated(
    "reset_max_memory_cached", reset_peak_memory_stats,
    "now calls torch.neuron.reset_peak_memory_stats, which resets /all/ peak memory stats.")


def empty_cache() -> None:
    _adaptive.flush("memory query")
    core.hbm.empty_cache()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the simulated HBM."""
    _index(device)
    _adaptive.flush("memory query")
    return core.hbm.capacity - core.hbm.reserved, core.hbm.capacity


def memory_summary(device=None, abbreviated: bool = False) -> str:
    stats = memory_stats(device)
    rows = [("Allocated memory", "allocated_bytes"), ("Active memory", "active_bytes"),
            ("Requested memory", "requested_bytes"), ("Reserved memory", "reserved_bytes"),
            ("Allocations", "allocation"), ("Segments", "segment")]
    width = 75
    lines = ["=" * width,
             f" neuron-eager memory summary, device 0 ({get_device_name()})".ljust(width),
             f" capacity {format_bytes(core.hbm.capacity)}".ljust(width),
             "-" * width,
             f"{'Metric':<20}|{'Cur Usage':>13} |{'Peak Usage':>13} |{'Tot Alloc':>11} |"
             f"{'Tot Freed':>11}",
             "-" * width]
    for label, key in rows:
        pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
        for pool in pools:
            name = label if pool == "all" else f"  from {pool.replace('_', ' ')}"
            fmt = format_bytes if key.endswith("bytes") else str
            values = [fmt(stats[f"{key}.{pool}.{f}"]) for f in ("current", "peak", "allocated",
                                                                 "freed")]
            lines.append(f"{name:<20}|{values[0]:>13} |{values[1]:>13} |{values[2]:>11} |"
                         f"{values[3]:>11}")
    lines.append("-" * width)
    lines.append(f"OOMs: {stats['num_ooms']}   alloc retries: {stats['num_alloc_retries']}   "
                 f"device allocs: {stats['num_device_alloc']}   device frees: "
                 f"{stats['num_device_free']}")
    lines.append("=" * width)
    return "\n".join(lines)


def set_memory_capacity(nbytes: int) -> None:
    """Resize the simulated HBM (tests and experiments; NEURON_EAGER_HBM_BYTES at start-up)."""
    core.hbm.set_capacity(int(nbytes))


# -- torch.accelerator --------------------------------------------------------------------------
def _empty_host_cache() -> None:
    """Pinning is a plain host copy here (ops/_compat.install_pinned_memory_shim): no pinned
    host cache to release."""


def _capability(device=None) -> dict:
    _index(device)
    return {"supported_dtypes": set(_tensor.STORAGE_DTYPE)}


def _set_stream(stream) -> None:
    if not isinstance(stream, Stream):
        raise TypeError(f"torch.accelerator.set_stream on neuron takes a torch.neuron.Stream "
                        f"(torch.neuron.Stream(), torch.accelerator.current_stream()), got "
                        f"{stream!r}")
    _streams.set_stream(stream)


# The torch.accelerator calls that need C++ hooks a Python backend cannot register, answered
# for neuron by these (ops/_compat.install_accelerator_functions).
ACCELERATOR_FUNCTIONS = dict(
    synchronize=synchronize, memory_stats=memory_stats, empty_cache=empty_cache,
    empty_host_cache=_empty_host_cache, reset_peak_memory_stats=reset_peak_memory_stats,
    reset_accumulated_memory_stats=reset_accumulated_memory_stats, get_memory_info=mem_get_info,
    get_device_capability=_capability, set_device_index=set_device,
    current_stream=current_stream, set_stream=_set_stream)
