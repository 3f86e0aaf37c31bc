"""Errors raised by neuron ops inside autograd's backward reach `backward()` intact.

Note [Errors on autograd's thread]
Backward of neuron tensors runs on autograd's device thread, inside a stream guard whose
methods call the Python device guard (ops/_compat.py). When `__torch_dispatch__` raises
there, torch throws its C++ python_error without first saving the Python exception, and
the guard's destructor calls into Python with the exception still pending: the process
aborted ("terminate called without an active exception") or `backward()` raised
SystemError ("returned NULL without setting an exception"), for an out-of-memory error,
a kernel's refusal, or check_ops(raise_first=True) alike. So on that thread the dispatcher
hands the exception to `carry`, which keeps it and returns a stand-in result that torch
cannot convert: torch then raises a plain C++ error (nothing Python is pending while the
guard unwinds), the engine carries it to the thread that called backward, and the wrapper
of torch's backward entry point (_compat.install_backward_errors) raises the kept
exception there, with its own type, message and traceback. Errors of user Python hooks
in backward go through torch's same path and are not helped: torch's bug, not ours.
"""
from __future__ import annotations

import atexit
import functools
import itertools
import re
import threading
import time

import torch

_kept: dict[int, BaseException] = {}  # token -> exception raised on autograd's thread
_tokens = itertools.count(1)
_lock = threading.Lock()
KEEP = 64  # at most this many unclaimed (a backward whose error nobody caught)
_TOKEN = re.compile(r"\[neuron backward error #(\d+)\]")


def in_backward() -> bool:
    """Whether this thread is running an autograd graph task (Note [Errors on autograd's
    thread])."""
    return torch._C._current_graph_task_id() != -1


class _Carrier(tuple):
    """A result torch refuses to convert, whose text names the kept exception: one element
    (itself a carrier) so that ops returning several tensors refuse it with the same text."""

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


def carry(error: BaseException, func) -> _Carrier:
    """Keep `error` and return what makes torch raise a C++ error naming it."""
    with _lock:
        token = next(_tokens)
        _kept[token] = error
        while len(_kept) > KEEP:
            _kept.pop(next(iter(_kept)))
    text = f"{type(error).__name__}: {error} (in {func}) [neuron backward error #{token}]"
    inner = tuple.__new__(_Carrier, ())
    inner.text = text
    outer = tuple.__new__(_Carrier, (inner,))
    outer.text = text
    return outer


def claim(error: BaseException) -> BaseException | None:
    """The kept exception an error of torch's backward names, removed; None if none."""
    match = _TOKEN.search(str(error))
    if match is None:
        return None
    with _lock:
        return _kept.pop(int(match.group(1)), None)


# Note [Hook errors in backward]
# A tensor or module hook that raises on autograd's thread aborts the process the same way
# (torch calls it inside the same guards), and no result of the hook's own makes torch raise
# cleanly. So hooks of neuron tensors and modules' backward hooks are wrapped: in backward,
# with neuron gradients, an exception is kept and the hook returns None (the gradient
# unchanged); backward runs to its end and the wrapper of its entry point raises the kept
# exception there. Unlike the CPU, the rest of backward runs first (gradients of other
# leaves accumulate). A saved tensor's unpack hook (torch.utils.checkpoint recomputes the
# forward in one, and a neuron op failing there raises in it) must return a tensor, so it
# returns a stand-in instead: torch refuses it with a TypeError of its own, which stops
# backward at once, and the wrapper raises the kept exception in its place.
# torch's checks of what a hook returned (a tuple where a tensor goes) raise the same way, so
# the guards make them first, in torch's words. Guarded too: the node hooks BackwardHook
# registers for full module hooks (a warning there, made an error by the filters, aborted)
# and legacy `register_backward_hook` hooks. A hook a user puts on a grad_fn directly is
# not: torch's node types cannot be patched.
_from_hooks: dict[int, BaseException] = {}


def guarded_hook(hook, check=None):
    """`hook` for a neuron tensor (Note [Hook errors in backward]); `check(out, args)` raises
    what torch raises after the hook for a result it refuses (that check, outside the hook,
    aborted the process too): by default a tensor hook's, a gradient or None."""

    @functools.wraps(hook)
    def run(*args, **kwargs):
        try:
            out = hook(*args, **kwargs)
            if out is not None:
                (check or _one_gradient)(out, args)
            return out
        except Exception as e:
            if not (in_backward() and _on_neuron(args)):
                raise
            _keep_hook_error(e)
            return None

    return run


def _one_gradient(out, args=None) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"expected Variable, but hook returned '{type(out).__name__}'")


def _gradients(out, grads, count_error: str, sequence=tuple) -> None:
    """torch's check of the gradients a hook returned for `grads`, in its words
    (`count_error` takes the counts as {got} and {expected}; a module's full hook may return
    any sequence, `sequence=object`)."""
    if not isinstance(out, sequence):
        raise TypeError(f"expected tuple, but hook returned '{type(out).__name__}'")
    if len(out) != len(grads):
        raise RuntimeError(count_error.format(got=len(out), expected=len(grads)))
    for new, old in zip(out, grads):
        if new is not None:
            if old is None:
                raise RuntimeError("can't replace a None gradient with a non-None value")
            _one_gradient(new)


def guarded_module_hook(hook, pre: bool):
    """A module's full backward (pre) hook for BackwardHook, guarded as `guarded_hook`, with
    the checks of what it returns that BackwardHook and the engine make after it."""
    words = "Backward pre hook returned an invalid number of grad_output" if pre else \
        "Backward hook returned an invalid number of grad_input"
    return guarded_hook(hook, lambda out, args: _gradients(
        out, args[1], words + ", got {got}, but expected {expected}", object))


def guarded_node_hook(hook, legacy_module_hook: bool = False):
    """A hook on an autograd node (grad_fn.register_hook: the hooks BackwardHook registers, a
    module's legacy register_backward_hook) guarded as `guarded_hook`; what it returns must
    be a tuple of gradients for the node's grad_inputs."""
    at = 1 if legacy_module_hook else 0  # (a legacy hook's first argument is its module)
    name = getattr(hook, "__name__", hook)
    return guarded_hook(hook, lambda out, args: _gradients(
        out, args[at], f"hook '{name}' has returned an incorrect number of values (got "
                       "{got}, but expected {expected})"))


def guarded_unpack(hook):
    """A saved_tensors_hooks unpack hook (checkpoint's recomputation runs in one) whose
    exception in backward is kept and answered with a stand-in that torch refuses, so torch
    raises its own TypeError at once and backward()'s wrapper raises the kept exception
    (Note [Hook errors in backward])."""

    @functools.wraps(hook)
    def run(packed):
        try:
            return hook(packed)
        except Exception as e:
            if not in_backward():
                raise
            _keep_hook_error(e)
            stand_in = tuple.__new__(_Carrier, ())
            stand_in.text = f"{type(e).__name__}: {e} (in a saved tensor's unpack hook)"
            return stand_in

    return run


def _keep_hook_error(error: BaseException) -> None:
    error = claim(error) or error  # a neuron op's error that reached the hook as torch's
    with _lock:
        _from_hooks[next(_tokens)] = error
        while len(_from_hooks) > KEEP:
            _from_hooks.pop(next(iter(_from_hooks)))


def _on_neuron(values) -> bool:
    """Whether a hook's arguments hold a neuron tensor (the tuples of gradients included)."""
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
    """A mark before a backward starts, for `claim_hook_error`."""
    with _lock:
        return next(_tokens)


def claim_hook_error(since: int) -> BaseException | None:
    """The first exception a neuron tensor's hook kept after `since`, removed with any
    later ones; None if none."""
    with _lock:
        kept = [_from_hooks.pop(t) for t in sorted(t for t in _from_hooks if t > since)]
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
