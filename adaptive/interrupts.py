"""Ctrl-C lands in the user's code, not inside the simulator, once adaptive eager is on.

Note [Interrupts]
A KeyboardInterrupt raised between two bytecodes of the recorder or of a flush left its
state half made: an in-place op whose tensor had handed its memory to the region but had no
node yet, a region whose first groups ran and the rest never did. The tensors then read as
"never computed", or an accumulator silently lost the update its line had made (a notebook's
interrupt during a kernel's compile); one landing in a storage's finalizer was swallowed
("Exception ignored in NeuronStorage.__del__"), or cut the allocator's bookkeeping short.
So once adaptive eager is on, SIGINT goes through `_handler`: while the main thread runs
neuron-eager's code (any of its frames on the stack, or the recorder's lock held) the signal
waits, and a helper thread signals again a moment later; the handler that was installed
before (Python's raises KeyboardInterrupt) runs when the main thread is back in other code,
with every op it issued done as plain eager would have done it. Nothing is added to the
ops' own path. Only SIGINT: a handler of another signal that raises still lands anywhere.
"""
from __future__ import annotations

import _thread
import signal
import threading
import time

from neuron_eager.ops.sourceline import ours_on_stack

_chained = None  # the SIGINT handler installed before ours
_lock = None  # the recorder's lock (an RLock)
_again = threading.Event()  # set by a held SIGINT: signal once more, a moment later
_RETRY_S = 0.002


def install(lock) -> None:
    """Route SIGINT through `_handler`, holding it while the main thread runs our code or
    holds `lock` (from the main thread, over a Python handler only: SIG_DFL and SIG_IGN stay
    as they are)."""
    global _chained, _lock
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if current is _handler or not callable(current):
        return
    _chained, _lock = current, lock
    signal.signal(signal.SIGINT, _handler)
    threading.Thread(target=_signal_again, name="neuron-eager-interrupts", daemon=True).start()


def _inside(frame) -> bool:
    """Whether the main thread (whose current frame the handler gets) is in our code."""
    return _lock._is_owned() or ours_on_stack(frame)


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
