"""repr() of neuron tensors, in PyTorch's own format plus `device='neuron:0'`.

Printing reads the values back from the device (a sync point) and formats
them with PyTorch's formatter, so numbers look exactly as on the CPU.
"""
from __future__ import annotations

import torch
from torch._tensor_str import _add_suffixes, _tensor_str
from torch.autograd import forward_ad

from neuron_eager.ops import tensor as T

_DEFAULT_DTYPES = (torch.int64, torch.bool)


def tensor_repr(t, tensor_contents: str | None = None) -> str:
    """`tensor_contents`: the body to print instead of the values (a subclass's own)."""
    prefix = "Parameter containing:\n" if getattr(t, "_is_param", False) else ""
    # a subclass made with as_subclass prints its class's name, as on the CPU
    head = "tensor(" if type(t) is T.NeuronTensor else f"{type(t).__name__}("
    with torch.no_grad():  # (a summary reads the edges only: no copy of a large tensor)
        summarized = t.numel() > torch._tensor_str.PRINT_OPTS.threshold
        cpu = T.cpu_alias(t) if summarized else T.to_cpu(t)
    suffixes = [f"device='{t.device}'"]
    if t.numel() == 0 and t.dim() != 1 or t.numel() and not torch._tensor_str.PRINT_OPTS.edgeitems:
        suffixes.append(f"size={tuple(t.shape)}")  # (edgeitems=0 shows no values)
    # PyTorch names int64/bool only when the tensor is empty (the values can't show it)
    implied = t.dtype == torch.get_default_dtype() or (t.dtype in _DEFAULT_DTYPES and t.numel())
    if not implied:
        suffixes.append(f"dtype={t.dtype}")
    try:
        grad_fn = t.grad_fn
        grad_fn = grad_fn and type(grad_fn).__name__
    except RuntimeError:  # (a no_grad view of a base changed in place: torch prints this)
        grad_fn = "Invalid"
    if grad_fn:
        suffixes.append(f"grad_fn=<{grad_fn}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    tangent = forward_ad.unpack_dual(t).tangent  # (None outside a dual level)
    if tangent is not None:
        suffixes.append(f"tangent={tangent}")
    body = tensor_contents if tensor_contents is not None else \
        "[]" if t.numel() == 0 else _tensor_str(cpu, len(head))
    return prefix + _add_suffixes(head + body, suffixes, len(head), False)
