"""Simulated HBM seen through torch.neuron: accounting, release, OOM and recovery."""
import gc
import os
import subprocess
import sys

import pytest
import torch

import neuron_eager
from neuron_eager.device_sim import core


def test_tensor_storage_is_accounted_and_returned():
    gc.collect()
    base = torch.neuron.memory_allocated()
    x = torch.empty(1024, 1024, device="neuron")
    assert torch.neuron.memory_allocated() - base >= 4 * 1024 * 1024
    view = x[10:20]
    del x
    assert torch.neuron.memory_allocated() - base >= 4 * 1024 * 1024  # the view keeps it alive
    del view
    assert torch.neuron.memory_allocated() == base
    assert torch.neuron.memory_reserved() >= base + 4 * 1024 * 1024  # cached, not returned
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()


def test_peak_tracking_and_summary():
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.max_memory_allocated()
    x = torch.empty(256, 1024, device="neuron")
    del x
    assert torch.neuron.max_memory_allocated() >= base + 1024 * 1024
    assert torch.neuron.max_memory_reserved() >= torch.neuron.max_memory_allocated()
    summary = torch.neuron.memory_summary()
    assert "Allocated memory" in summary and "Reserved memory" in summary
    stats = torch.neuron.memory_stats()
    for key in ["allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "active_bytes.all.current", "num_ooms",
                "allocation.all.allocated", "allocation.all.freed"]:
        assert key in stats


def test_model_and_optimizer_memory_returns_to_baseline():
    gc.collect()
    base = torch.neuron.memory_allocated()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32, device="neuron")
    for _ in range(2):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    assert torch.neuron.memory_allocated() > base
    del model, opt, x
    gc.collect()
    assert torch.neuron.memory_allocated() == base


def test_out_of_memory_then_recovery():
    hbm = core.hbm
    gc.collect()
    hbm.empty_cache()
    old = hbm.capacity
    hbm.set_capacity(hbm.reserved + 8 * 2**20)
    try:
        keep = torch.empty(6 * 2**20 // 4, device="neuron")
        before = torch.neuron.memory_stats()
        with pytest.raises(torch.OutOfMemoryError) as err:
            torch.empty(4 * 2**20 // 4, device="neuron")
        assert isinstance(err.value, neuron_eager.NeuronOutOfMemoryError)
        assert isinstance(err.value, torch.neuron.OutOfMemoryError)  # (torch.cuda's name)
        assert "Tried to allocate 4.00 MiB" in str(err.value)
        after = torch.neuron.memory_stats()
        assert after["num_ooms"] == before["num_ooms"] + 1
        assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
        del keep
        again = torch.empty(4 * 2**20 // 4, device="neuron")  # fits once memory is freed
        assert again.numel() == 2**20
        del again
    finally:
        gc.collect()
        hbm.empty_cache()
        hbm.set_capacity(old)


def test_per_process_memory_fraction_limits_reservations_as_on_cuda():
    hbm = core.hbm
    gc.collect()
    hbm.empty_cache()
    assert torch.neuron.get_per_process_memory_fraction() == 1.0
    with pytest.raises(TypeError, match="must be `float`"):
        torch.neuron.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError, match="Invalid fraction value: 1.5. Allowed range: 0~1"):
        torch.neuron.set_per_process_memory_fraction(1.5)
    fraction = (hbm.reserved + 8 * 2**20) / hbm.capacity
    torch.neuron.set_per_process_memory_fraction(fraction)
    try:
        keep = torch.empty(6 * 2**20 // 4, device="neuron")
        with pytest.raises(torch.OutOfMemoryError, match="set_per_process_memory_fraction"):
            torch.empty(4 * 2**20 // 4, device="neuron")
        assert torch.neuron.mem_get_info()[1] == hbm.capacity  # (the total is unchanged)
        del keep
    finally:
        torch.neuron.set_per_process_memory_fraction(1.0)
        gc.collect()
        hbm.empty_cache()
    assert torch.empty(4 * 2**20 // 4, device="neuron").numel() == 2**20


def test_cudas_deprecated_memory_names_warn_and_answer():
    x = torch.empty(1000, device="neuron")  # noqa: F841
    with pytest.warns(FutureWarning, match="renamed to torch.neuron.memory_reserved"):
        assert torch.neuron.memory_cached() == torch.neuron.memory_reserved()
    with pytest.warns(FutureWarning, match="renamed to torch.neuron.max_memory_reserved"):
        assert torch.neuron.max_memory_cached() == torch.neuron.max_memory_reserved()
    with pytest.warns(FutureWarning, match="resets /all/ peak memory stats"):
        torch.neuron.reset_max_memory_allocated()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()


def test_hbm_size_from_environment():
    code = ("import torch, neuron_eager\n"
            "print(torch.neuron.get_device_properties().total_memory)\n"
            "try:\n"
            "    torch.empty(2**20, device='neuron')\n"
            "except torch.OutOfMemoryError as e:\n"
            "    print('OOM', 'capacity of 1.00 MiB' in str(e))\n")
    env = dict(os.environ, NEURON_EAGER_HBM_BYTES="1MiB")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(2**20), "OOM", "True"]


def test_memory_stats_has_every_key_cuda_scripts_read():
    stats = torch.neuron.memory_stats()
    for key in ("inactive_split.all.current", "inactive_split_bytes.large_pool.peak",
                "oversize_allocations.current", "oversize_segments.freed",
                "num_sync_all_streams", "num_device_alloc", "num_device_free",
                "max_split_size", "requested_bytes.all.current", "num_alloc_retries",
                "num_ooms", "active_bytes.all.peak", "reserved_bytes.small_pool.allocated"):
        assert key in stats, key
    assert stats["max_split_size"] == -1 and stats["inactive_split_bytes.all.current"] == 0
