"""The user's source line behind an op: for warnings, errors and (later) profiles.

The user's frame is the innermost Python frame outside torch, Numba and neuron-eager;
C++ dispatch adds no Python frames, so it is found by walking up the stack.
"""
from __future__ import annotations

import bdb
import contextlib
import os
import sys
import threading
import warnings

import numba
import torch

_PACKAGES = ("neuron_eager", "neuron_eager.ops", "neuron_eager.adaptive", "neuron_eager.device_sim")


_internal: tuple[str, ...] = ()


def _internal_dirs() -> tuple[str, ...]:
    """torch's and our package folders; cached once every package is imported."""
    global _internal
    if _internal:
        return _internal
    # (numba's and contextlib's frames too: a warning raised inside a kernel's compile)
    dirs = [os.path.dirname(torch.__file__), os.path.dirname(numba.__file__)]
    for name in _PACKAGES:
        module = sys.modules.get(name)
        dirs.extend(getattr(module, "__path__", ()))
    found = (*(os.path.join(d, "") for d in dirs), contextlib.__file__)
    if len(found) == 3 + len(_PACKAGES):
        _internal = found
    return found


_is_internal: dict = {}  # code object -> whether it belongs to torch or neuron-eager


def user_frame(skip: int = 0) -> tuple[str, int]:
    """(file, line) of the innermost frame outside torch and neuron-eager.

    Ops that autograd runs on its worker thread have no user frame: they are reported as
    coming from "<autograd backward: NodeName>" (the autograd node that runs them). Adaptive
    eager asks for every recorded op, so each code object is classified once; `skip`
    internal frames above the caller are not looked at.
    """
    try:
        frame = sys._getframe(1 + skip)
    except ValueError:  # fewer frames than skipped: a thread that C++ started (autograd's)
        return _in_backward(), 0
    while frame is not None:
        code = frame.f_code
        try:
            internal = _is_internal.get(code)
        except TypeError:  # a code object TorchDynamo made, with a slice among its constants
            internal = _classify(code, cache=False)
        if internal is None:
            internal = _classify(code)
        if not internal:
            return code.co_filename, frame.f_lineno
        frame = frame.f_back
    return _in_backward(), 0


def _in_backward() -> str:
    """The stand-in for a backward op's user line, naming the autograd node running it (its
    forward op: MulBackward0 came from a mul)."""
    node = torch._C._current_autograd_node()
    return f"<autograd backward: {node.name()}>" if node is not None else "<autograd backward>"


# The built-in workloads are model code, written as a user writes it: their lines are the
# ones to name (explain(), errors), and the walk stops there as it would in a user's script.
_MODEL_CODE = os.path.join("neuron_eager", "workloads.py")


def _classify(code, cache: bool = True) -> bool:
    dirs = _internal_dirs()
    name = code.co_filename
    internal = (name.startswith(dirs) or name.startswith("<frozen")) and \
        not name.endswith(_MODEL_CODE)
    if cache and dirs is _internal:  # complete: the answer is final
        _is_internal[code] = internal
    return internal


_replaying = threading.local()  # .where: the recorded op adaptive eager is running now


def replay_at(where: tuple[str, int] | None) -> tuple[str, int] | None:
    """While adaptive eager runs a recorded op at a later sync point, warnings point at the
    line that recorded it (`where`), not at the sync point; returns the previous setting."""
    outer = getattr(_replaying, "where", None)
    _replaying.where = where
    return outer


def warn_at_user_line(message: str, category=UserWarning) -> None:
    where = getattr(_replaying, "where", None)
    filename, lineno = where if where is not None else user_frame()
    warnings.warn_explicit(message, category, filename, lineno)


def called_from_torch_file(*parts: str) -> bool:
    """Whether the innermost frame outside neuron-eager runs torch's file torch/<parts>."""
    tail = os.path.join("torch", *parts)
    ours = _internal_dirs()[1:]
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(ours):
            return name.endswith(tail)
        frame = frame.f_back
    return False


def ours_on_stack(frame) -> bool:
    """Whether `frame` or any frame it was called from runs neuron-eager's code."""
    ours = _internal_dirs()[1:]  # (torch's folder comes first)
    while frame is not None:
        if frame.f_code.co_filename.startswith(ours):
            return True
        frame = frame.f_back
    return False


# Note [Debuggers step over the device]
# pdb's `s` on a line with one op stepped through the dispatcher, the kernels and torch's
# Python helpers they call (206 steps to the next line with warm kernels), and post-mortem
# frames were ours: on the CPU an op is one C++ call. So while a debugger (a bdb.Bdb: pdb,
# IPython's) traces the thread, an op runs with tracing off, and the debugger skips our
# modules' frames (the dispatcher's own call event; from the first op it sees on). A `b`
# breakpoint set inside neuron-eager's code is not hit then; `breakpoint()` written there
# still is.
_SKIPPED = {"neuron_eager.*", "torch._library.*"}  # (torch's C++ asks its op registry for
# a dispatch rule of a subclass's op before calling __torch_dispatch__)


def debugger_tracing(trace) -> bool:
    """Whether `trace` (sys.gettrace()) is a debugger's; it is told to skip our modules."""
    debugger = getattr(trace, "__self__", None)
    if not isinstance(debugger, bdb.Bdb):
        return False
    if not debugger.skip or not _SKIPPED <= debugger.skip:
        debugger.skip = set(debugger.skip or ()) | _SKIPPED
    return True


def untraced(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` with the thread's tracing off (Note [Debuggers step over the
    device])."""
    trace = sys.gettrace()
    sys.settrace(None)
    try:
        return fn(*args, **kwargs)
    finally:
        sys.settrace(trace)
