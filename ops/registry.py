"""The one op table: aten OpOverload -> Python kernel.

Kernels are registered with `@register(aten.add.Tensor, aten.add.Scalar)`.
Passing an OpOverloadPacket registers every overload of it. Registering an
overload twice is an error, so two families can never silently disagree.
"""
from __future__ import annotations

from typing import Callable

import torch

from neuron_eager.ops import _compat

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


# Note [Kernels before decompositions]
# A CompositeImplicitAutograd op decomposes on the autograd key, above the Python key our
# tensors dispatch on: its kernel here would run only for calls made inside other kernels,
# and users get the decomposition (silu_backward: five kernels, each rounding to the dtype,
# where the CPU rounds once). A kernel on AutogradPrivateUse1 sends calls that need no graph
# below autograd, to the Python key and the kernel; calls that do (double backward) keep the
# differentiable decomposition.
_autograd_library = torch.library.Library("aten", "IMPL")


def on_autograd_key(name: str, kernel: Callable) -> None:
    """Run the aten op `name` ("ctc_loss.Tensor") as `kernel` on neuron tensors, above
    autograd (AutogradPrivateUse1): for CompositeImplicitAutograd ops that must decompose
    another way than PyTorch's for tensor subclasses, or not at all."""
    _compat.keep_dynamo_out(kernel)  # (called from C++ while a compiled graph runs)
    _autograd_library.impl(name, kernel, "AutogradPrivateUse1")


def before_decomposition(*ops) -> None:
    """Route the CompositeImplicitAutograd `ops` to their kernels when no graph is needed."""
    for op in ops:
        for overload in _overloads(op):
            on_autograd_key(overload.name(), _below_autograd(overload))


def _below_autograd(op: torch._ops.OpOverload) -> Callable:
    def kernel(*args, **kwargs):
        if torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad
                for a in (*args, *kwargs.values())):
            return op.decompose(*args, **kwargs)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)

    return kernel


def around_decomposition(wrap: Callable, *ops, first: Callable | None = None) -> None:
    """Run the CompositeImplicitAutograd `ops` as they decompose, inside `wrap()` (a context
    manager): for what must hold while their inner ops run, such as a warning that belongs to
    the user's tensors and not to temporaries the decomposition makes. `first`, if given,
    maps the first argument before the decomposition sees it."""
    for op in ops:
        for overload in _overloads(op):
            if not torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(),
                                                                  "CompositeImplicitAutograd"):
                continue  # (pinv with tensor tolerances has a kernel and a derivative)

            def kernel(x, *args, _op=overload, **kwargs):
                with wrap():
                    result = _op.decompose(first(x) if first else x, *args, **kwargs)
                out = kwargs.get("out")
                if isinstance(out, torch.Tensor) and result is not out:
                    _into_out(out, result)
                    return out
                return result

            on_autograd_key(overload.name(), kernel)


# Note [Composite out= on tensor subclasses]
# Some of torch's composite out= kernels (linalg_matrix_rank's) take the functional path for
# tensor subclasses, ours included, and rebind their C++ `result` to its value: the caller's
# out tensor is returned unwritten. The value is written into it here, as resize_output and
# copy_ would (the composite has already checked out's device and dtype).
def _into_out(out: torch.Tensor, result: torch.Tensor) -> None:
    torch.ops.aten._resize_output_.default(out, result.shape, out.device)
    out.copy_(result)

