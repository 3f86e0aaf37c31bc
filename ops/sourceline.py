"""The user's source line behind an op: for warnings, errors and (later) profiles.

The user's frame is the innermost Python frame outside torch and neuron-eager;
C++ dispatch adds no Python frames, so it is found by walking up the stack.
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

_PACKAGES = ("neuron_eager", "neuron_eager.ops", "neuron_eager.adaptive", "neuron_eager.device_sim")


_internal: tuple[str, ...] = ()


def _internal_dirs() -> tuple[str, ...]:
    """torch's and our package folders; cached once every package is imported."""
    global _internal
    if _internal:
        return _internal
    dirs = [os.path.dirname(torch.__file__)]
    for name in _PACKAGES:
        module = sys.modules.get(name)
        dirs.extend(getattr(module, "__path__", ()))
    found = tuple(os.path.join(d, "") for d in dirs)
    if len(found) == 1 + len(_PACKAGES):
        _internal = found
    return found


def user_frame() -> tuple[str, int]:
    """(file, line) of the innermost frame outside torch and neuron-eager.

    Ops that autograd runs on its worker thread have no user frame: they are reported as
    coming from "<autograd backward>".
    """
    internal = _internal_dirs()
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(internal) and not filename.startswith("<frozen"):
            return filename, frame.f_lineno
        frame = frame.f_back
    return "<autograd backward>", 0


def warn_at_user_line(message: str, category=UserWarning) -> None:
    filename, lineno = user_frame()
    warnings.warn_explicit(message, category, filename, lineno)
