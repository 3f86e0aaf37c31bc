"""HBM of one simulated NeuronCore, owned by a caching allocator.

Every device storage is one `Block`: a byte buffer (NumPy) plus a simulated
address. Freed blocks stay reserved in a per-size-class cache and are handed
out again; `empty_cache` returns them. Requests are rounded to size classes
(at least 256 B) as the Neuron runtime does. Invariants: reserved >= allocated,
reserved <= capacity, and a failed allocation changes no statistic but
`num_ooms`.
"""
from __future__ import annotations

import os
import sys
import threading
from collections import defaultdict

import numpy as np

from .forks import renew_after_fork

SMALL_LIMIT = 1 << 20  # blocks below 1 MiB belong to the small pool
LARGE_ROUND = 2 << 20  # requests of 16 MiB and more round to 2 MiB
MIN_BLOCK = 256
CACHE_KEEP = 1 << 30  # cached bytes always kept (Note [A bounded cache])


class OutOfMemory(Exception):
    """The simulated HBM cannot hold a request, even after releasing its cache."""

    def __init__(self, requested: int, free: int, capacity: int, allocated: int, reserved: int,
                 fraction: float = 1.0):
        self.requested, self.free, self.capacity = requested, free, capacity
        self.allocated, self.reserved = allocated, reserved
        limit = "" if fraction == 1.0 else (
            f" This process may use {fraction:g} of it "
            f"(torch.neuron.set_per_process_memory_fraction).")
        super().__init__(
            f"Neuron out of memory. Tried to allocate {format_bytes(requested)}; the simulated HBM "
            f"has a capacity of {format_bytes(capacity)} of which {format_bytes(free)} is free."
            f"{limit} {format_bytes(allocated)} is allocated by tensors and "
            f"{format_bytes(reserved)} reserved by the caching allocator. Free tensors, call "
            f"torch.neuron.empty_cache(), or set NEURON_EAGER_HBM_BYTES to simulate a larger "
            f"HBM.")


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} bytes"


def round_size(nbytes: int) -> int:
    """The size class of a request: four classes per power of two below 16 MiB."""
    if nbytes <= MIN_BLOCK:
        return MIN_BLOCK
    if nbytes >= 16 << 20:
        return -(-nbytes // LARGE_ROUND) * LARGE_ROUND
    power = 1 << (nbytes - 1).bit_length()  # next power of two >= nbytes
    quarter = power // 8  # classes at 4/8, 5/8, 6/8, 7/8 and 8/8 of `power`
    return -(-nbytes // quarter) * quarter


class Block:
    """One allocation of simulated HBM: `buffer` holds its bytes."""

    __slots__ = ("address", "size", "requested", "buffer", "memory", "in_use", "pointer")

    def __init__(self, address: int, size: int):
        self.address = address
        self.size = size
        self.requested = 0
        # 64-byte aligned, as a device allocator aligns (NumPy's own buffers are 16-byte
        # aligned): a 64-byte vector load then stays within one cache line, and oneDNN's AMX
        # bf16 GEMM took twice as long on 16-byte-aligned operands. `memory` owns the bytes.
        self.memory = np.empty(size + ALIGN, dtype=np.uint8)
        start = -self.memory.ctypes.data % ALIGN
        self.buffer = self.memory[start:start + size]
        self.pointer = self.memory.ctypes.data + start  # host address (multi-tensor kernels)
        self.in_use = False

    @property
    def pool(self) -> str:
        return "small_pool" if self.size < SMALL_LIMIT else "large_pool"


# Note [Blocks still seen]
# A freed block waits in the cache, but code may still hold a NumPy array made from its
# buffer: a kernel's argument taken from a temporary (`x.contiguous()._nd`) whose tensor has
# died. Handing that block out again would let the next allocation overwrite what the array
# still reads. Every array made from a block's buffer holds a reference to it (NumPy points
# views at the array that owns the memory), so a block whose buffer has references other
# than the block's own is skipped until they are gone. (Arrays made from `buffer`, an aligned
# slice, point at `memory`, which owns the bytes: that is the count to read.)
def _unseen(cached: list) -> Block | None:
    """Pop the most recently freed block of `cached` that no array still sees, if any."""
    for k in range(len(cached) - 1, -1, -1):
        if sys.getrefcount(cached[k].memory) <= _OWN_REFS:
            return cached.pop(k)
    return None


_OWN_REFS = 3  # Block.memory, Block.buffer's base, and getrefcount's argument
ALIGN = 64


# "active" equals "allocated" here because blocks are never split.
# Live counters, per pool (0 = large, 1 = small), in a flat list for the hot path:
# allocated bytes, requested bytes, allocations; each as (current, cumulative, peak).
_LIVE = ("allocated_bytes", "requested_bytes", "allocation")
_FIELDS = 9
_STAT_FIELDS = ("current", "peak", "allocated", "freed")


class CachingAllocator:
    """A caching allocator over `capacity` bytes of simulated HBM.

    >>> hbm = CachingAllocator(1 << 20)
    >>> b = hbm.malloc(1000); hbm.free(b); hbm.malloc(1000) is b
    True
    """

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.fraction = 1.0  # of the capacity this process may reserve (as CUDA's setting)
        # Reentrant: the garbage collector may run inside malloc (while a block's buffer is
        # made) and free a storage there, on the same thread; free's updates are complete
        # increments, so malloc continues consistently.
        self._lock = threading.RLock()
        renew_after_fork(self, "_lock", threading.RLock)  # (Note [Forking with threads])
        self._cache: dict[int, list[Block]] = defaultdict(list)
        self._next_address = 0x1000
        self._live = [0] * (2 * _FIELDS)  # see _LIVE
        self._live_peak_all = [0, 0, 0]  # peaks of the pool sums
        # per pool: reserved bytes, segments, and the peaks of both
        self._segments = [[0, 0, 0, 0], [0, 0, 0, 0]]
        self._segments_cum = [[0, 0], [0, 0]]  # per pool: bytes reserved ever, segments ever
        # what was live at the last reset_accumulated_stats (as _live's and _segments_cum's
        # layouts): "allocated" counts from there, "freed" is cumulative - current
        self._live_base, self._segments_base = [0] * (2 * _FIELDS), [[0, 0], [0, 0]]
        self._reserved_peak_all = 0
        self._segment_peak_all = 0
        self._counters = {"num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 0,
                          "num_device_free": 0}
        # A debugging aid (tests turn it on): every block handed out is filled with 0xFF
        # bytes (NaN for floats, -1 for ints), so a kernel that leaves part of its output
        # unwritten shows garbage instead of the values a cached block happened to hold.
        self.poison = os.environ.get("NEURON_EAGER_HBM_POISON", "0") == "1"

    # -- public interface -------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block:
        size = round_size(nbytes) if nbytes > MIN_BLOCK else MIN_BLOCK
        with self._lock:
            cached = self._cache.get(size)
            block = _unseen(cached) if cached else None
            if block is None:
                block = self._new_block(size, nbytes)
            block.requested = nbytes
            block.in_use = True
            if self.poison:
                block.buffer.fill(0xFF)
            v = self._live
            i = _FIELDS if size < SMALL_LIMIT else 0
            j = _FIELDS - i
            v[i] += size
            v[i + 1] += size
            if v[i] > v[i + 2]:
                v[i + 2] = v[i]
            v[i + 3] += nbytes
            v[i + 4] += nbytes
            if v[i + 3] > v[i + 5]:
                v[i + 5] = v[i + 3]
            v[i + 6] += 1
            v[i + 7] += 1
            if v[i + 6] > v[i + 8]:
                v[i + 8] = v[i + 6]
            peaks = self._live_peak_all
            if v[i] + v[j] > peaks[0]:
                peaks[0] = v[i] + v[j]
            if v[i + 3] + v[j + 3] > peaks[1]:
                peaks[1] = v[i + 3] + v[j + 3]
            if v[i + 6] + v[j + 6] > peaks[2]:
                peaks[2] = v[i + 6] + v[j + 6]
            return block

    def free(self, block: Block) -> None:
        with self._lock:
            if not block.in_use:
                raise RuntimeError(f"double free of HBM block at {block.address:#x}")
            block.in_use = False
            size = block.size
            v = self._live
            i = _FIELDS if size < SMALL_LIMIT else 0
            v[i] -= size
            v[i + 3] -= block.requested
            v[i + 6] -= 1
            self._cache[size].append(block)

    def empty_cache(self) -> None:
        with self._lock:
            self._release_cached()

    def set_capacity(self, capacity: int) -> None:
        """Change the simulated HBM size; fails if more is reserved now than fits."""
        with self._lock:
            self._release_cached()
            reserved = self.reserved
            if reserved > capacity:
                raise ValueError(f"cannot shrink HBM to {format_bytes(capacity)}: "
                                 f"{format_bytes(reserved)} is in use")
            self.capacity = int(capacity)

    def stats(self) -> dict[str, int]:
        """`torch.cuda.memory_stats`-style keys: METRIC.POOL.{current,peak,allocated,freed}."""
        out = {}
        v = self._live
        for k, metric in enumerate(_LIVE):
            rows = {}
            for pool, i in (("large_pool", 0), ("small_pool", _FIELDS)):
                current, cumulative, peak = v[i + 3 * k], v[i + 3 * k + 1], v[i + 3 * k + 2]
                rows[pool] = (current, peak, cumulative - self._live_base[i + 3 * k + 1],
                              cumulative - current)
            large, small = rows["large_pool"], rows["small_pool"]
            rows["all"] = (large[0] + small[0], self._live_peak_all[k], large[2] + small[2],
                           large[3] + small[3])
            names = [metric] + (["active_bytes"] if metric == "allocated_bytes" else
                                ["active"] if metric == "allocation" else [])
            for name in names:
                for pool, row in rows.items():
                    for field, value in zip(_STAT_FIELDS, row):
                        out[f"{name}.{pool}.{field}"] = value
        for k, metric in enumerate(("reserved_bytes", "segment")):
            rows = {}
            for pool, p in (("large_pool", 0), ("small_pool", 1)):
                current, cumulative = self._segments[p][k], self._segments_cum[p][k]
                rows[pool] = [current, self._segments[p][2 + k],
                              cumulative - self._segments_base[p][k], cumulative - current]
            large, small = rows["large_pool"], rows["small_pool"]
            rows["all"] = [large[0] + small[0],
                           self._reserved_peak_all if k == 0 else self._segment_peak_all,
                           large[2] + small[2], large[3] + small[3]]
            for pool, row in rows.items():
                for field, value in zip(_STAT_FIELDS, row):
                    out[f"{metric}.{pool}.{field}"] = value
        # CUDA's keys that stay zero here: no block is ever split or oversize
        for name in ("inactive_split", "inactive_split_bytes"):
            for pool in ("all", "large_pool", "small_pool"):
                out.update({f"{name}.{pool}.{field}": 0 for field in _STAT_FIELDS})
        for name in ("oversize_allocations", "oversize_segments"):
            out.update({f"{name}.{field}": 0 for field in _STAT_FIELDS})
        out.update(self._counters, num_sync_all_streams=0, max_split_size=-1)  # (-1: no limit)
        return dict(sorted(out.items()))

    def reset_peak_stats(self) -> None:
        v = self._live
        for i in (0, _FIELDS):
            for k in range(3):
                v[i + 3 * k + 2] = v[i + 3 * k]
        for k in range(3):
            self._live_peak_all[k] = v[3 * k] + v[_FIELDS + 3 * k]
        for p in (0, 1):
            self._segments[p][2:] = self._segments[p][:2]
        self._reserved_peak_all = self.reserved
        self._segment_peak_all = self._segments[0][1] + self._segments[1][1]

    def reset_accumulated_stats(self) -> None:
        v = self._live
        for i in (0, _FIELDS):
            for k in range(3):
                # as CUDA's: allocated and freed read 0 (the live memory stays current)
                v[i + 3 * k + 1] = self._live_base[i + 3 * k + 1] = v[i + 3 * k]
        for p in (0, 1):
            self._segments_cum[p] = [self._segments[p][0], self._segments[p][1]]
            self._segments_base[p] = list(self._segments_cum[p])
        for k in self._counters:
            self._counters[k] = 0

    @property
    def allocated(self) -> int:
        return self._live[0] + self._live[_FIELDS]

    @property
    def reserved(self) -> int:
        return self._segments[0][0] + self._segments[1][0]

    # -- internals --------------------------------------------------------------------
    # Note [A bounded cache]
    # Blocks are never split, and a cached block serves only its own size class, so a run whose
    # shapes keep changing (dynamic padding) left ever more blocks of other sizes cached:
    # reserved memory, which is host RAM here, climbed toward the HBM capacity (2 GiB for a
    # 128 MiB working set), where CUDA's allocator would split a larger cached block. So when
    # a request finds no block of its size and more is cached than is allocated (and than
    # CACHE_KEEP), the cache is released first. A run of steady shapes always finds its sizes.
    def _new_block(self, size: int, requested: int) -> Block:
        allocated = self.allocated
        if self.reserved - allocated > max(allocated, CACHE_KEEP):
            self._release_cached()
        limit = self.capacity if self.fraction == 1.0 else int(self.capacity * self.fraction)
        if self.reserved + size > limit:
            self._counters["num_alloc_retries"] += 1
            self._release_cached()
            if self.reserved + size > limit:
                self._raise_oom(requested)
        try:
            block = Block(self._next_address, size)
        except MemoryError:
            self._raise_oom(requested)
        self._next_address += size
        self._counters["num_device_alloc"] += 1
        seg = self._segments[size < SMALL_LIMIT]
        cum = self._segments_cum[size < SMALL_LIMIT]
        seg[0] += size
        seg[1] += 1
        seg[2] = max(seg[2], seg[0])
        seg[3] = max(seg[3], seg[1])
        cum[0] += size
        cum[1] += 1
        self._reserved_peak_all = max(self._reserved_peak_all, self.reserved)
        self._segment_peak_all = max(self._segment_peak_all,
                                     self._segments[0][1] + self._segments[1][1])
        return block

    def _raise_oom(self, requested: int):
        self._counters["num_ooms"] += 1
        reserved = self.reserved
        raise OutOfMemory(requested, self.capacity - reserved, self.capacity, self.allocated,
                          reserved, self.fraction) from None

    def _release_cached(self) -> None:
        for blocks in self._cache.values():
            for block in blocks:
                self._counters["num_device_free"] += 1
                seg = self._segments[block.size < SMALL_LIMIT]
                seg[0] -= block.size
                seg[1] -= 1
        self._cache.clear()
