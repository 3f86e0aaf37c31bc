"""The HBM caching allocator, without torch."""
import numpy as np
import pytest

from neuron_eager.device_sim.hbm import MIN_BLOCK, CachingAllocator, OutOfMemory, round_size


def test_round_size_classes():
    assert round_size(1) == MIN_BLOCK
    assert round_size(MIN_BLOCK) == MIN_BLOCK
    for n in [257, 1000, 4097, 123_456, 15 << 20, 16 << 20, (16 << 20) + 1, 100_000_000]:
        size = round_size(n)
        assert size >= n
        assert size <= n * 1.25 + (2 << 20)
    assert round_size((16 << 20) + 1) % (2 << 20) == 0


def test_cache_reuses_blocks_and_stats_balance():
    hbm = CachingAllocator(1 << 20)
    a = hbm.malloc(1000)
    assert hbm.allocated == round_size(1000) == hbm.reserved
    hbm.free(a)
    assert hbm.allocated == 0 and hbm.reserved == round_size(1000)
    b = hbm.malloc(900)  # same size class: the cached block comes back
    assert b is a
    stats = hbm.stats()
    assert stats["allocation.all.allocated"] == 2 and stats["allocation.all.freed"] == 1
    assert stats["requested_bytes.all.current"] == 900
    assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"]
    assert stats["num_device_alloc"] == 1
    hbm.free(b)
    hbm.empty_cache()
    assert hbm.reserved == 0 and hbm.stats()["num_device_free"] == 1


def test_pools_split_at_one_mebibyte():
    hbm = CachingAllocator(64 << 20)
    small, large = hbm.malloc(1000), hbm.malloc(2 << 20)
    stats = hbm.stats()
    assert stats["allocated_bytes.small_pool.current"] == small.size
    assert stats["allocated_bytes.large_pool.current"] == large.size
    assert stats["allocated_bytes.all.current"] == small.size + large.size


def test_peak_and_reset():
    hbm = CachingAllocator(1 << 20)
    blocks = [hbm.malloc(10_000) for _ in range(4)]
    peak = hbm.stats()["allocated_bytes.all.peak"]
    for b in blocks:
        hbm.free(b)
    assert hbm.stats()["allocated_bytes.all.peak"] == peak
    hbm.reset_peak_stats()
    assert hbm.stats()["allocated_bytes.all.peak"] == 0
    hbm.reset_accumulated_stats()
    assert hbm.stats()["allocated_bytes.all.allocated"] == 0


def test_accumulated_counts_restart_from_zero_with_live_memory_kept():
    # as CUDA's resetAccumulatedStats: allocated and freed restart at 0, current stays
    hbm = CachingAllocator(64 << 20)
    kept, big = hbm.malloc(10_000), hbm.malloc(2 << 20)
    hbm.reset_accumulated_stats()
    stats = hbm.stats()
    for name in ("allocated_bytes", "allocation", "reserved_bytes", "segment"):
        assert stats[f"{name}.all.allocated"] == stats[f"{name}.all.freed"] == 0, name
    assert stats["allocated_bytes.all.current"] == kept.size + big.size
    extra = hbm.malloc(10_000)
    hbm.free(extra)
    hbm.free(big)
    stats = hbm.stats()
    assert stats["allocated_bytes.all.allocated"] == extra.size
    assert stats["allocated_bytes.all.freed"] == extra.size + big.size
    assert stats["allocation.all.allocated"] == 1 and stats["allocation.all.freed"] == 2
    assert stats["allocated_bytes.all.current"] == kept.size


def test_out_of_memory_releases_cache_first_then_raises_and_stays_consistent():
    hbm = CachingAllocator(1 << 20)
    a = hbm.malloc(600_000)
    hbm.free(a)  # cached, not in use
    b = hbm.malloc(700_000)  # needs the cache released to fit
    assert hbm.stats()["num_alloc_retries"] == 1
    before = hbm.stats()
    with pytest.raises(OutOfMemory) as err:
        hbm.malloc(700_000)
    message = str(err.value)
    assert "Tried to allocate" in message and "capacity of 1.00 MiB" in message
    assert err.value.requested == 700_000 and err.value.capacity == 1 << 20
    after = hbm.stats()
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert {k: v for k, v in after.items() if k not in ("num_ooms", "num_alloc_retries")} == \
        {k: v for k, v in before.items() if k not in ("num_ooms", "num_alloc_retries")}
    hbm.free(b)
    c = hbm.malloc(700_000)  # recovery
    assert c.in_use


def test_double_free_is_an_error():
    hbm = CachingAllocator(1 << 20)
    a = hbm.malloc(10)
    hbm.free(a)
    with pytest.raises(RuntimeError, match="double free"):
        hbm.free(a)


def test_set_capacity_refuses_to_shrink_below_use():
    hbm = CachingAllocator(1 << 20)
    hbm.malloc(500_000)
    with pytest.raises(ValueError):
        hbm.set_capacity(100_000)
    hbm.set_capacity(2 << 20)
    assert hbm.capacity == 2 << 20


def test_a_free_inside_malloc_does_not_deadlock():
    # The garbage collector can free a storage while malloc holds the lock (same thread).
    import threading

    alloc = CachingAllocator(1 << 20)
    held = alloc.malloc(1024)
    done = []

    def nested():
        with alloc._lock:  # as malloc holds it
            alloc.free(held)  # as a __del__ run by the collector would
            done.append(alloc.malloc(2048))

    t = threading.Thread(target=nested)
    t.start()
    t.join(5)
    assert done and not t.is_alive()


def test_a_freed_block_still_seen_by_an_array_is_not_handed_out():
    """Note [Blocks still seen]: an array made from a freed block's buffer keeps the block
    from being reused, so what it reads is not overwritten by the next allocation."""
    hbm = CachingAllocator(1 << 20)
    block = hbm.malloc(1000)
    view = np.ndarray((250,), np.float32, block.buffer)
    view[:] = 7.0
    hbm.free(block)
    again = hbm.malloc(1000)
    assert again is not block
    again.buffer.fill(0)
    assert (view == 7.0).all()
    del view
    hbm.free(again)
    assert hbm.malloc(1000) in (block, again)  # unseen now: both reusable


def test_a_cache_of_other_sizes_is_released_before_it_outgrows_the_working_set(monkeypatch):
    # Note [A bounded cache]: shapes that keep changing left blocks of every size cached
    from neuron_eager.device_sim import hbm as module

    monkeypatch.setattr(module, "CACHE_KEEP", 4 << 20)
    hbm = CachingAllocator(1 << 30)
    for step in range(40):  # one 20-40 MiB activation a step, a new size each time
        hbm.free(hbm.malloc((20 << 20) + step * (512 << 10)))
        assert hbm.reserved <= 2 * (40 << 20) + (4 << 20)
    kept = hbm.malloc(1 << 20)
    hbm.free(kept)
    assert hbm.malloc(1 << 20) is kept  # (a size found in the cache is still reused)
