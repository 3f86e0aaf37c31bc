"""Ctrl-C lands in the user's code, not inside the simulator.

Note [Interrupts]
A KeyboardInterrupt raised between two bytecodes of the recorder or of a flush left its
state half made: an in-place op whose tensor had handed its memory to the region but had no
node yet, a region whose first groups ran and the rest never did. The tensors then read as
"never computed", or an accumulator silently lost the update its line had made (a notebook's
interrupt during a kernel's compile); one landing in a storage's finalizer was swallowed
("Exception ignored in NeuronStorage.__del__"), or cut the allocator's bookkeeping short
(in plain eager too: HBM stayed counted as allocated). So from the import on (or the first
enable() on the main thread, when imported on another), SIGINT goes through `_handler`:
while the main thread runs neuron-eager's code (any of its frames on the stack, or the
recorder's lock held) the signal waits, and a helper thread signals again a moment later;
the handler that was installed before (Python's raises KeyboardInterrupt) runs when the
main thread is back in other code, with every op it issued done as plain eager would have
done it. Nothing is added to the ops' own path. Only SIGINT: a handler of another signal
that raises still lands anywhere, as does SIGINT once the user installs a handler of theirs.
"""
from __future__ import annotations

import _thread
import os
import signal
import threading
import time

from neuron_eager.ops.sourceline import ours_on_stack

_chained = None  # the SIGINT handler installed before ours
_lock_of = None  # the recorder's lock (an RLock), asked for anew (a forked child makes one)
_again = threading.Event()  # set by a held SIGINT: signal once more, a moment later
_RETRY_S = 0.002


def install(lock_of) -> None:
    """Route SIGINT through `_handler`, holding it while the main thread runs our code or
    holds the lock `lock_of()` returns (from the main thread, over a Python handler only:
    SIG_DFL and SIG_IGN stay as they are)."""
    global _chained, _lock_of
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if current is _handler or not callable(current):
        return
    _chained, _lock_of = current, lock_of
    signal.signal(signal.SIGINT, _handler)
    _start_signalling()


def _start_signalling() -> None:
    threading.Thread(target=_signal_again, name="neuron-eager-interrupts", daemon=True).start()


def _inside(frame) -> bool:
    """Whether the main thread (whose current frame the handler gets) is in our code."""
    return _lock_of()._is_owned() or ours_on_stack(frame)


def _handler(signum, frame):
    if _inside(frame):
        _again.set()
        return
    _chained(signum, frame)


def _signal_again() -> None:
    while True:
        _again.wait()
        _again.clear()
        time.sleep(_RETRY_S)
        _thread.interrupt_main(signal.SIGINT)


def _after_fork_in_child() -> None:
    if signal.getsignal(signal.SIGINT) is _handler:  # (the thread that signals again is gone)
        _start_signalling()


os.register_at_fork(after_in_child=_after_fork_in_child)
