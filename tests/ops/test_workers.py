"""ops/workers.py: large kernels split across cores give whole results, errors and all."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from numba import njit

import neuron_eager  # noqa: F401
from neuron_eager.ops import workers

N = torch.device("neuron")


@njit(nogil=True)
def _scaled_add(out, a, b, scale):
    for i in range(out.shape[0]):
        out[i] = a[i] + scale * b[i]


def _inputs(n):
    rng = np.random.default_rng(0)
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("n", [1, 7, 1 << 18 | 3])
def test_every_element_is_computed_once(n):
    a, b = _inputs(n)
    out = np.full(n, np.nan, np.float32)
    workers.split_call(_scaled_add, out, [a, b, np.float32(0.5)])
    np.testing.assert_array_equal(out, a + np.float32(0.5) * b)


def test_jobs_after_the_workers_went_to_sleep():
    a, b = _inputs(1 << 12)
    for pause in (0, 0.05, 0):  # 50 ms: past the spinning, the worker sleeps and is woken
        out = np.zeros_like(a)
        time.sleep(pause)
        workers.split_call(_scaled_add, out, [a, b, np.float32(2)])
        np.testing.assert_array_equal(out, a + np.float32(2) * b)


def test_an_error_in_any_slice_is_raised_and_the_next_call_works():
    calls = []

    def failing(out, a):  # a Python kernel: each slice raises on its own thread
        calls.append(threading.current_thread().name)
        raise ValueError("slice failed")

    a, b = _inputs(64)
    with pytest.raises(ValueError, match="slice failed"):
        workers.split_call(failing, np.zeros_like(a), [a])
    assert len(calls) == workers.COUNT  # no slice was skipped, none still running
    out = np.zeros_like(a)
    workers.split_call(_scaled_add, out, [a, b, np.float32(1)])
    np.testing.assert_array_equal(out, a + b)


def test_two_threads_at_once():
    a, b = _inputs(1 << 16)
    results, errors = {}, []

    def run(k):
        try:
            for _ in range(20):
                out = np.zeros_like(a)
                workers.split_call(_scaled_add, out, [a, b, np.float32(k)])
                assert np.array_equal(out, a + np.float32(k) * b)
            results[k] = True
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in (1, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and results == {1: True, 3: True}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_splits_with_its_own_workers():
    # (the child checks with NumPy: torch's own parallel CPU ops may hang after a fork)
    script = (
        "import os, numpy as np, torch, neuron_eager\n"
        "x = torch.randn(1 << 19)\n"
        "(x.to('neuron') * 2).cpu()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    got = (x.to('neuron') + 1).cpu().numpy()\n"
        "    os._exit(0 if np.array_equal(got, x.numpy() + np.float32(1)) else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert "child 0" in done.stdout, done.stderr


def test_the_caller_takes_back_a_slice_no_worker_has_started():
    # Note [Taking back a slice]: a busy (or starved) worker does not hold up the caller
    worker = workers._Worker(99)
    release, started, ran = threading.Event(), threading.Event(), []

    def blocking():
        started.set()
        release.wait(30)
        ran.append(("first", threading.current_thread().name))

    worker.post(blocking, [])
    assert started.wait(30)
    worker.post(lambda: ran.append(("second", threading.current_thread().name)), [])
    worker.join()  # the second job is taken back and run here, while the first still runs
    assert ran == [("second", threading.current_thread().name)]
    release.set()
    assert workers._wait(worker.done, worker.seq, 1 << 40)  # the worker reports both done
    assert ran[1] == ("first", "neuron-engine-99")


def test_a_freed_result_of_a_split_kernel_is_handed_out_again():
    # a worker drops its slices after its job: held, they would mark the result's HBM block
    # as still seen, and the allocator would reserve a new block for every large result
    x, y = torch.randn(1 << 20, device=N), torch.randn(1 << 20, device=N)
    (x + y).cpu()
    reserved = torch.neuron.memory_reserved()
    for _ in range(3):
        (x + y).cpu()
    assert torch.neuron.memory_reserved() == reserved


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int8])
def test_large_copies_split_across_cores_give_the_cpus_bytes(dtype):
    n = workers.SPLIT_COPY_BYTES + 3  # at least 2 MB in every dtype, an odd length
    x = (torch.randn(n) * 100).to(dtype)
    xd = x.to(N)
    assert torch.equal(xd.clone().cpu(), x)
    out = torch.zeros(n, dtype=dtype, device=N)
    out.copy_(xd)
    assert torch.equal(out.cpu(), x)
    shifted = x.clone()
    shifted[1:] = x[:-1]
    xd[1:] = xd[:-1].clone()  # another storage: split; a view of the same one: NumPy's copy
    assert torch.equal(xd.cpu(), shifted)
    assert torch.equal(xd.cpu(), shifted.to(N).cpu())  # both host copies, split too


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32])
def test_large_dtype_conversions_split_across_cores_give_the_cpus_bits(dtype):
    n = workers.SPLIT_MIN + 5
    x = torch.randn(n) * 1e3
    if dtype.is_floating_point:  # specials where the CPU defines the result
        x[:7] = torch.tensor([float("inf"), -float("inf"), 1e-40, -0.0, 65520.0, 3.5,
                              float("nan")])
    xd = x.to(N)
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
    for got, want in [(xd.to(dtype).cpu(), x.to(dtype)),
                      (xd.to(dtype).to(torch.float32).cpu(), x.to(dtype).to(torch.float32))]:
        view = bits.get(want.dtype, want.dtype)
        assert torch.equal(got.view(view), want.view(view))


def test_large_strided_loops_split_across_cores_give_the_cpus_bits(monkeypatch):
    # Note [Strided loops in slices] in ops/kernelgen.py: plain eager's ops, a conversion
    # and adaptive eager's fused loops over transposed operands
    from neuron_eager import adaptive

    rows = workers.SPLIT_MIN // 256 + 3
    x, y = torch.randn(256, rows), torch.randn(rows, 256)
    xd, yd = x.to(N), y.to(N)
    calls, split = [], workers.split_call

    def spy(kernel, out, args):
        calls.append(out.ndim)
        return split(kernel, out, args)

    monkeypatch.setattr(workers, "split_call", spy)
    assert torch.equal((xd.t() * yd).cpu(), x.t() * y)
    assert torch.equal(xd.t().to(torch.bfloat16).cpu().view(torch.int16),
                       x.t().to(torch.bfloat16).view(torch.int16))
    t = xd.t()
    t.mul_(0.5)  # in place through a transpose
    assert torch.equal(xd.cpu(), x * 0.5)
    with adaptive.adaptive_eager():
        for _ in range(3):  # fused from the second sighting
            got = ((xd.t() + yd) * 2 - 1).cpu()
            assert torch.equal(got, (x * 0.5).t().add(y).mul(2).sub(1))
    # every one ran in slices but the first fused run (it compiles, on one core): 4-D
    # strided loops, or 1-D where a transposed tensor's loop merges
    assert len(calls) == 7 and calls.count(4) >= 3
