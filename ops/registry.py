"""The one op table: aten OpOverload -> Python kernel.

Kernels are registered with `@register(aten.add.Tensor, aten.add.Scalar)`.
Passing an OpOverloadPacket registers every overload of it. Registering an
overload twice is an error, so two families can never silently disagree.
"""
from __future__ import annotations

from typing import Callable

import torch

KERNELS: dict[torch._ops.OpOverload, Callable] = {}


def _overloads(op) -> list[torch._ops.OpOverload]:
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    if isinstance(op, torch._ops.OpOverload):
        return [op]
    raise TypeError(f"register() takes aten ops, not {op!r}")


def register(*ops) -> Callable[[Callable], Callable]:
    """Register the decorated function as the kernel of every op in `ops`.

    >>> @register(torch.ops.aten.abs.default)        # doctest: +SKIP
    ... def abs_(x): ...
    """

    def decorate(fn: Callable) -> Callable:
        for op in ops:
            for overload in _overloads(op):
                if overload in KERNELS:
                    raise ValueError(f"{overload} already has a kernel: {KERNELS[overload]}")
                KERNELS[overload] = fn
        return fn

    return decorate


def lookup(op: torch._ops.OpOverload) -> Callable | None:
    return KERNELS.get(op)
