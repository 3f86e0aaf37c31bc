"""Ctrl-C waits while adaptive eager records an op or runs a region.

Note [Interrupts]
A KeyboardInterrupt raised between two bytecodes of the recorder or of a flush left its
state half made: an in-place op whose tensor had handed its memory to the region but had no
node yet, a region whose first groups ran and the rest never did. The tensors then read as
"never computed", or an accumulator silently lost the update its line had made (a notebook's
interrupt during a kernel's compile). So SIGINT goes through `_handler` once adaptive eager
is on: while the main thread is inside `Guard` (recording, flushing) it only notes the
signal, and the outermost exit hands it to the handler that was installed before (Python's
raises KeyboardInterrupt there, at the user's line, with every recorded op done as plain
eager would have done it). Other threads are not interrupted by Python anyway. Only SIGINT:
a handler of another signal that raises still lands anywhere.
"""
from __future__ import annotations

import signal
import threading

_MAIN = threading.main_thread().ident
_depth = 0  # the main thread's nesting inside Guard
_pending = None  # (signum, frame) of a SIGINT that came while inside
_chained = None  # the SIGINT handler installed before ours


def install() -> None:
    """Route SIGINT through `_handler` (from the main thread, over a Python handler only:
    SIG_DFL and SIG_IGN stay as they are)."""
    global _chained
    if threading.get_ident() != _MAIN:
        return
    current = signal.getsignal(signal.SIGINT)
    if current is _handler or not callable(current):
        return
    _chained = current
    signal.signal(signal.SIGINT, _handler)


def _handler(signum, frame):
    global _pending
    if _depth:
        _pending = (signum, frame)
        return
    _chained(signum, frame)


class Guard:
    """`with guard:` holds `lock`; a SIGINT meanwhile is delivered at the outermost exit."""

    __slots__ = ("lock",)

    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        global _depth
        self.lock.acquire()
        if threading.get_ident() == _MAIN:
            _depth += 1

    def __exit__(self, *exc_info):
        global _depth, _pending
        deliver = None
        if threading.get_ident() == _MAIN:
            _depth -= 1
            if not _depth and _pending is not None:
                deliver, _pending = _pending, None
        self.lock.release()
        if deliver is not None:
            _chained(*deliver)
        return False
