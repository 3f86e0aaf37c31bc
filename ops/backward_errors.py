"""Errors raised inside autograd's backward on neuron reach `backward()` intact.

Note [Errors on autograd's thread]
Backward of neuron tensors runs on autograd's device thread, each node inside a stream
guard whose methods call the Python device guard (ops/_compat.py). When Python code fails
there (a neuron op: out of memory, a kernel's refusal, check_ops(raise_first=True); a
user's hook of any kind: a tensor's, a module's, a grad_fn's own, a saved tensor's unpack
hook, where torch.utils.checkpoint recomputes; or a hook's result torch refuses), torch
throws its C++ python_error without first saving the Python exception, and the guard's
destructor calls into Python with the exception still pending: the process aborted
("terminate called without an active exception") or `backward()` raised SystemError
("returned NULL without setting an exception"). Neither the node types nor torch's C++ can
be patched, so the guard itself takes the pending exception and `keep`s it (Note [An
exception pending in the device guard] in ops/_compat.py); the engine stops as the CPU's
does, and the wrapper of torch's backward entry point (_compat.install_backward_errors)
raises the kept exception with its own type, message and traceback in place of torch's
SystemError. Python code inside backward (a custom Function's) sees an op's error as
raised, as on the CPU.
"""
from __future__ import annotations

import atexit
import itertools
import sys
import threading
import time

import torch

from neuron_eager.device_sim import forks

_kept: dict[int, BaseException] = {}  # token -> exception raised on autograd's thread
_tokens = itertools.count(1)
_lock = threading.Lock()
forks.renew_after_fork(sys.modules[__name__], "_lock", threading.Lock)
KEEP = 64  # at most this many unclaimed (a backward whose error nobody caught)


def keep(error: BaseException) -> None:
    """Keep `error`, raised on autograd's thread, for `claim` (Note [Errors on autograd's
    thread])."""
    with _lock:
        _kept[next(_tokens)] = error
        while len(_kept) > KEEP:
            _kept.pop(next(iter(_kept)))


def _on_neuron(values) -> bool:
    """Whether `values` hold a neuron tensor (tuples and lists of them included)."""
    for v in values:
        if isinstance(v, (tuple, list)) and _on_neuron(v):
            return True
        if isinstance(v, torch.Tensor) and v.device.type == "neuron":
            return True
    return False


# Note [Exit after backward]
# When backward() returns, autograd's device thread may still be releasing the graph, whose
# saved tensors are Python objects: it takes the GIL to drop them. If the interpreter is
# finalizing by then, CPython ends that thread from inside torch's C++ frames and the process
# aborts at exit ("terminate called without an active exception", SIGABRT) after the script
# has done all its work: 7-9 of 90 runs of a 2-step training script, three at a time on two
# cores. So the first backward of neuron tensors registers an exit hook that gives the GIL
# away for a moment, before finalization, for that thread to finish (0 of 90).
EXIT_WAIT_S = 0.05
_exit_wait: list = []


def wait_at_exit_after(outputs) -> None:
    """Before a backward from `outputs`: Note [Exit after backward]."""
    if not _exit_wait and _on_neuron(outputs):
        _exit_wait.append(atexit.register(time.sleep, EXIT_WAIT_S))


def mark() -> int:
    """A mark before a backward starts, for `claim`."""
    with _lock:
        return next(_tokens)


def claim(since: int) -> BaseException | None:
    """The first exception kept after `since`, removed with any later ones; None if none."""
    with _lock:
        kept = [_kept.pop(t) for t in sorted(t for t in _kept if t > since)]
    return kept[0] if kept else None


# Note [Gradients on another device]
# torch's engine checks that a gradient lies on its tensor's device only for tensors of C++
# devices (validate_outputs skips Python subclasses), so a CPU gradient given to
# `y.backward()` / `autograd.grad()` for a neuron `y`, or returned by a custom Function's
# backward, reached the leaves as a CPU `.grad`, and the error came at optimizer.step().
# The two entry points check as the engine does for CUDA, in its words; a 0-dim gradient
# is a scalar there too.
def _wrong_device(grad, device) -> bool:
    return isinstance(grad, torch.Tensor) and grad.dim() > 0 and grad.device != device and \
        "neuron" in (grad.device.type, device.type)


def check_root_gradients(outputs, gradients) -> None:
    """The engine's check of the gradients given for `outputs`."""
    if gradients is None:
        return
    for i, (out, grad) in enumerate(zip(outputs, gradients)):
        if isinstance(out, torch.Tensor) and _wrong_device(grad, out.device):
            raise RuntimeError(f"invalid gradient at index {i} - expected device {out.device} "
                               f"but got {grad.device}")


def check_function_gradients(node, grads) -> None:
    """The engine's check of what a custom Function's backward (`node`) returned. Its edges
    are those of the forward's tensor arguments only: with other arguments too (their
    gradients are None) each gradient is checked against the edges' one device, if one."""
    if not isinstance(grads, tuple):
        grads = (grads,)
    devices = [None if edge is None else edge._input_metadata[nr].device
               for edge, nr in node.next_functions]
    if len(grads) != len(devices):
        known = {d for d in devices if d is not None}
        if len(known) != 1:
            return
        devices = [known.pop()] * len(grads)
    for i, (device, grad) in enumerate(zip(devices, grads)):
        if device is not None and _wrong_device(grad, device):
            raise RuntimeError(f"Function {type(node).__name__} returned an invalid gradient "
                               f"at index {i} - expected device {device} but got {grad.device}")
