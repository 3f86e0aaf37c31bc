"""Engine worker threads: a large kernel runs in slices on every core this process may use.

`split_call(kernel, out, args)` runs `kernel(out, *args)` over flat arrays, one slice per
core: the calling thread takes the first, one worker thread each of the others (the kernels
release the GIL), as a NeuronCore's 128 partitions work side by side.

Note [Spinning workers]
A worker that sleeps on a lock or a queue takes tens of microseconds to wake on a VM (the
idle vCPU halts), and so does the caller waiting for it: a thread-pool hand-off cost ~10%
of a 4M-element add. So the hand-off goes through two int64 flags per worker instead: the
caller publishes a job and raises `go`; the worker, spinning on `go` in a nogil Numba loop,
runs its slice, raises `done` (from nogil code, so the GIL is free when the caller sees it)
and spins for the next job. Spinning yields the core (sched_yield) on every turn, and gives up
after about a millisecond without work: the worker then sleeps on a condition until the next
job. The caller spins on `done` the same way. An external call (sched_yield) in the loop also
keeps the compiler from hoisting the flag loads out of it.

Note [Taking back a slice]
A worker may not get a core for milliseconds: on two vCPUs, torch's OpenMP threads spin
after a CPU matmul, and an SGD step's split foreach kernel waited ~2 ms for a half it could
have run in 0.1 ms. So a posted slice sits in a one-item list until the worker pops it (a
single call under the GIL, so exactly one thread gets it); the caller, done with its own
slice, pops any slice not yet taken and runs it itself. The worker then finds nothing, and
reports done for that job all the same.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
from neuron_eager.ops.jit import native_call, njit

COUNT = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1, 8)  # the cores this process may run on
SPINS = 4000  # sched_yield turns before an idle worker sleeps (about a millisecond)

_sched_yield = native_call(  # (Note [Native calls by symbol] in ops/jit.py)
    "neuron_eager_sched_yield",
    ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value, 0)


@njit(nogil=True)
def _wait(flag, value, spins):
    """Spin until flag[0] >= value (True), or `spins` turns pass (False)."""
    for _ in range(spins):
        if flag[0] >= value:
            return True
        _sched_yield()
    return flag[0] >= value


@njit(nogil=True)
def _finish_and_wait(done, seq, go, value, spins):
    done[0] = seq  # inside the nogil call: the caller finds the GIL free
    return _wait(go, value, spins)


_FOREVER = 1 << 62


def _compile_spinning() -> None:
    """Compile the spin loops here, before any worker runs them: a worker compiling one
    holds Numba's compiler lock, and a fork then (the caller need not wait for a worker: Note
    [Taking back a slice]) would leave the child that lock held forever."""
    flag = np.ones(1, np.int64)
    _wait(flag, 0, 1)
    _finish_and_wait(np.zeros(1, np.int64), 0, flag, 0, 1)


class _Worker:
    def __init__(self, index: int):
        self.go = np.zeros(1, np.int64)
        self.done = np.zeros(1, np.int64)
        self.seq = 0
        self.slot: list = []  # the posted (kernel, args) until a thread pops it
        self.error: BaseException | None = None
        self.sleeping = False
        self.wake = threading.Condition()
        threading.Thread(target=self._loop, name=f"neuron-engine-{index}", daemon=True).start()

    def post(self, kernel, args) -> None:
        self.slot.append((kernel, args))
        self.seq += 1
        self.go[0] = self.seq
        if self.sleeping:
            with self.wake:
                self.wake.notify()

    def join(self) -> None:
        try:
            kernel, args = self.slot.pop()  # not started yet: run it here
        except IndexError:
            _wait(self.done, self.seq, _FOREVER)
        else:
            kernel(*args)
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def _loop(self) -> None:
        expected = 1
        ready = _wait(self.go, expected, SPINS)
        while True:
            if not ready:
                with self.wake:  # post() notifies only after raising go: no lost wake-up
                    self.sleeping = True
                    while self.go[0] < expected:
                        self.wake.wait()
                    self.sleeping = False
            try:
                kernel, args = self.slot.pop()
            except IndexError:
                pass  # the caller took it back
            else:
                try:
                    kernel(*args)
                except BaseException as e:  # the caller raises it
                    self.error = e
                # the slices see their HBM blocks: held until the next job, they would keep
                # the allocator from handing the blocks out again (Note [Blocks still seen])
                kernel = args = None
            ready = _finish_and_wait(self.done, expected, self.go, expected + 1, SPINS)
            expected += 1


_workers: list[_Worker] = []
_busy = threading.Lock()  # one split at a time; a second thread runs its kernel alone


# Below 2 MB one thread copies as fast; a 16 MB copy took 0.74 ms in one, 0.40 ms in two
# (np.copyto against this loop split over the workers, one process, alternating rounds).
SPLIT_COPY_BYTES = 1 << 21


@njit(nogil=True)
def _copy_bytes(out, a):
    for i in range(out.shape[0]):
        out[i] = a[i]


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """np.copyto(dst, src) for arrays whose memory does not overlap; a large copy between
    C-contiguous arrays of one shape and dtype runs one slice per core."""
    if dst.nbytes >= SPLIT_COPY_BYTES and dst.shape == src.shape and dst.dtype == src.dtype \
            and dst.flags.c_contiguous and src.flags.c_contiguous:
        split_call(_copy_bytes, dst.reshape(-1).view(np.uint8), [src.reshape(-1).view(np.uint8)])
    else:
        np.copyto(dst, src)


def _reset_after_fork() -> None:
    global _busy
    _workers.clear()  # the child has none of the parent's threads
    _busy = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def split_call(kernel, out: np.ndarray, args: list) -> None:
    """kernel(out, *args) in COUNT slices of `out`'s first dim run side by side: arrays of
    out's rank are sliced with it; scalars and arrays of a lower rank (a vector every row
    reads: Note [Broadcast rows] in kernelgen.py) pass whole."""
    rank = out.ndim
    sliced = [isinstance(a, np.ndarray) and a.ndim == rank for a in args]
    _run_sliced(kernel, out.shape[0], lambda lo, hi: [
        out[lo:hi], *[a[lo:hi] if cut else a for a, cut in zip(args, sliced)]])


# Kernels from this many elements run in slices, one per core: below, the hand-off costs more
# than the second core saves. Stochastic kernels don't split: their noise is seeded per
# launch on the calling thread (Note [stochastic rounding noise]).
SPLIT_MIN = 1 << 18


def share_rows(kernel, rows: int, elements: int, args: list) -> None:
    """kernel(lo, hi, *args) over rows 0..rows-1: a share of rows per core when there are
    `elements` >= SPLIT_MIN of them and more than one row, else all on the calling thread."""
    if rows > 1 and elements >= SPLIT_MIN:
        split_rows(kernel, rows, args)
    else:
        kernel(0, rows, *args)


def split_rows(kernel, rows: int, args: list) -> None:
    """kernel(lo, hi, *args) for COUNT ranges [lo, hi) of `rows` run side by side: for row
    kernels that index their arrays themselves (softmax, norms, sums over strided rows)."""
    _run_sliced(kernel, rows, lambda lo, hi: [lo, hi, *args])


def _run_sliced(kernel, n: int, slice_args) -> None:
    """kernel(*slice_args(lo, hi)) for COUNT ranges [lo, hi) of n: the caller runs the first,
    one worker each of the others."""
    if COUNT == 1 or hasattr(kernel, "py_kernel") or not _busy.acquire(blocking=False):
        kernel(*slice_args(0, n))
        return
    try:
        if not _workers:
            _compile_spinning()
        while len(_workers) < COUNT - 1:
            _workers.append(_Worker(len(_workers) + 1))
        bounds = [n * i // COUNT for i in range(COUNT + 1)]
        for worker, lo, hi in zip(_workers, bounds[1:-1], bounds[2:]):
            worker.post(kernel, slice_args(lo, hi))
        try:
            kernel(*slice_args(0, bounds[1]))
        finally:
            errors = []
            for worker in _workers:  # every one, so none is still busy after an error
                try:
                    worker.join()
                except BaseException as e:
                    errors.append(e)
            if errors:
                raise errors[0]
    finally:
        _busy.release()
