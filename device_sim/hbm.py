"""HBM of one simulated NeuronCore, owned by a caching allocator.

Every device storage is one `Block`: a byte buffer (NumPy) plus a simulated
address. Freed blocks stay reserved in a per-size-class cache and are handed
out again; `empty_cache` returns them. Requests are rounded to size classes
(at least 256 B) as the Neuron runtime does. Invariants: reserved >= allocated,
reserved <= capacity, and a failed allocation changes no statistic but
`num_ooms`.
"""
from __future__ import annotations

import threading
from collections import defaultdict

import numpy as np

SMALL_LIMIT = 1 << 20  # blocks below 1 MiB belong to the small pool
LARGE_ROUND = 2 << 20  # requests of 16 MiB and more round to 2 MiB
MIN_BLOCK = 256


class OutOfMemory(Exception):
    """The simulated HBM cannot hold a request, even after releasing its cache."""

    def __init__(self, requested: int, free: int, capacity: int, allocated: int, reserved: int):
        self.requested, self.free, self.capacity = requested, free, capacity
        self.allocated, self.reserved = allocated, reserved
        super().__init__(
            f"Neuron out of memory. Tried to allocate {format_bytes(requested)}; the simulated HBM "
            f"has a capacity of {format_bytes(capacity)} of which {format_bytes(free)} is free. "
            f"{format_bytes(allocated)} is allocated by tensors and {format_bytes(reserved)} reserved "
            f"by the caching allocator. Free tensors, call torch.neuron.empty_cache(), or set "
            f"NEURON_EAGER_HBM_BYTES to simulate a larger HBM.")


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

    __slots__ = ("address", "size", "requested", "buffer", "in_use")

    def __init__(self, address: int, size: int):
        self.address = address
        self.size = size
        self.requested = 0
        self.buffer = np.empty(size, dtype=np.uint8)
        self.in_use = False

    @property
    def pool(self) -> str:
        return "small_pool" if self.size < SMALL_LIMIT else "large_pool"


class _Stat:
    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def add(self, n: int):
        self.current += n
        self.allocated += n
        if self.current > self.peak:
            self.peak = self.current

    def sub(self, n: int):
        self.current -= n
        self.freed += n


# Tracked per pool; "active" equals "allocated" here because blocks are never split.
_METRICS = ("allocated_bytes", "reserved_bytes", "requested_bytes", "allocation", "segment")
_POOLS = ("all", "small_pool", "large_pool")


class CachingAllocator:
    """A caching allocator over `capacity` bytes of simulated HBM.

    >>> hbm = CachingAllocator(1 << 20)
    >>> b = hbm.malloc(1000); hbm.free(b); hbm.malloc(1000) is b
    True
    """

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._lock = threading.Lock()
        self._cache: dict[int, list[Block]] = defaultdict(list)
        self._next_address = 0x1000
        self._stats = {(m, p): _Stat() for m in _METRICS for p in _POOLS}
        self._counters = {"num_alloc_retries": 0, "num_ooms": 0, "num_device_alloc": 0,
                          "num_device_free": 0}
        # (allocated_bytes, requested_bytes, allocation) of "all" and of the block's pool,
        # indexed by "is the block small": the hot path updates these six counters only.
        self._live_stats = {
            small: [[self._stats[m, p] for m in ("allocated_bytes", "requested_bytes",
                                                 "allocation")]
                    for p in ("all", "small_pool" if small else "large_pool")]
            for small in (False, True)}

    # -- public interface -------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block:
        size = round_size(nbytes) if nbytes > MIN_BLOCK else MIN_BLOCK
        with self._lock:
            cached = self._cache.get(size)
            if cached:
                block = cached.pop()
            else:
                block = self._new_block(size, nbytes)
            block.requested = nbytes
            block.in_use = True
            for allocated, requested, count in self._live_stats[size < SMALL_LIMIT]:
                allocated.current += size
                allocated.allocated += size
                if allocated.current > allocated.peak:
                    allocated.peak = allocated.current
                requested.current += nbytes
                requested.allocated += nbytes
                if requested.current > requested.peak:
                    requested.peak = requested.current
                count.current += 1
                count.allocated += 1
                if count.current > count.peak:
                    count.peak = count.current
            return block

    def free(self, block: Block) -> None:
        with self._lock:
            if not block.in_use:
                raise RuntimeError(f"double free of HBM block at {block.address:#x}")
            block.in_use = False
            size = block.size
            requested_bytes = block.requested
            for allocated, requested, count in self._live_stats[size < SMALL_LIMIT]:
                allocated.current -= size
                allocated.freed += size
                requested.current -= requested_bytes
                requested.freed += requested_bytes
                count.current -= 1
                count.freed += 1
            self._cache[size].append(block)

    def empty_cache(self) -> None:
        with self._lock:
            self._release_cached()

    def set_capacity(self, capacity: int) -> None:
        """Change the simulated HBM size; fails if more is reserved now than fits."""
        with self._lock:
            self._release_cached()
            reserved = self._stats["reserved_bytes", "all"].current
            if reserved > capacity:
                raise ValueError(f"cannot shrink HBM to {format_bytes(capacity)}: "
                                 f"{format_bytes(reserved)} is in use")
            self.capacity = int(capacity)

    def stats(self) -> dict[str, int]:
        out = {}
        for (metric, pool), s in self._stats.items():
            for field in ("current", "peak", "allocated", "freed"):
                value = getattr(s, field)
                out[f"{metric}.{pool}.{field}"] = value
                if metric in ("allocated_bytes", "allocation"):
                    active = "active_bytes" if metric == "allocated_bytes" else "active"
                    out[f"{active}.{pool}.{field}"] = value
        out.update(self._counters)
        return dict(sorted(out.items()))

    def reset_peak_stats(self) -> None:
        for s in self._stats.values():
            s.peak = s.current

    def reset_accumulated_stats(self) -> None:
        for s in self._stats.values():
            s.allocated = s.freed = 0
        for k in self._counters:
            self._counters[k] = 0

    @property
    def allocated(self) -> int:
        return self._stats["allocated_bytes", "all"].current

    @property
    def reserved(self) -> int:
        return self._stats["reserved_bytes", "all"].current

    # -- internals --------------------------------------------------------------------
    def _new_block(self, size: int, requested: int) -> Block:
        if self._stats["reserved_bytes", "all"].current + size > self.capacity:
            self._counters["num_alloc_retries"] += 1
            self._release_cached()
            reserved = self._stats["reserved_bytes", "all"].current
            if reserved + size > self.capacity:
                self._counters["num_ooms"] += 1
                allocated = self._stats["allocated_bytes", "all"].current
                raise OutOfMemory(requested, self.capacity - reserved, self.capacity, allocated,
                                  reserved)
        try:
            block = Block(self._next_address, size)
        except MemoryError:
            self._counters["num_ooms"] += 1
            reserved = self._stats["reserved_bytes", "all"].current
            raise OutOfMemory(requested, self.capacity - reserved, self.capacity,
                              self._stats["allocated_bytes", "all"].current, reserved) from None
        self._next_address += size
        self._counters["num_device_alloc"] += 1
        for p in ("all", block.pool):
            self._stats["reserved_bytes", p].add(size)
            self._stats["segment", p].add(1)
        return block

    def _release_cached(self) -> None:
        for blocks in self._cache.values():
            for block in blocks:
                self._counters["num_device_free"] += 1
                for p in ("all", block.pool):
                    self._stats["reserved_bytes", p].sub(block.size)
                    self._stats["segment", p].sub(1)
        self._cache.clear()
