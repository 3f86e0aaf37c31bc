"""The kernels of torch.amp.GradScaler on the device: unscale-and-check, update the scale."""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.ops import tensor as T
from neuron_eager.ops.registry import register

aten = torch.ops.aten


def _check_scalar_tensor(t, name: str) -> None:
    if t.dtype != torch.float32:
        raise RuntimeError(f"{name} must be a float tensor.")
    if t.numel() != 1:
        raise RuntimeError(f"{name} must be a 1-element tensor.")


@register(aten._amp_foreach_non_finite_check_and_unscale_.default)
def amp_unscale_(grads, found_inf, inv_scale):
    """found_inf = 1 if any gradient holds an inf or NaN (checked before unscaling, as on
    CUDA); every gradient is multiplied by inv_scale in place."""
    _check_scalar_tensor(found_inf, "found_inf")
    _check_scalar_tensor(inv_scale, "inv_scale")
    if not grads:
        return
    for g in grads:
        if not g.dtype.is_floating_point:
            raise RuntimeError("_amp_foreach_non_finite_check_and_unscale_: grads must be "
                               f"floating point, got {T.dtype_name(g.dtype)}")
    finite = aten.all.default(aten.stack.default(
        [aten.all.default(aten.isfinite.default(g)) for g in grads]))
    seen = aten._to_copy.default(aten.logical_not.default(finite), dtype=torch.float32)
    aten.copy_.default(found_inf, aten.maximum.default(found_inf, aten.reshape.default(
        seen, list(found_inf.shape))))
    # (a list of the one-element scale: the Tensor overload takes a 0-dim scalar only, and a
    # 0-dim one would be rounded to a bf16 gradient's dtype; the CPU multiplies in fp32)
    aten._foreach_mul_.List(list(grads), [inv_scale] * len(grads))


@register(aten._amp_update_scale_.default)
def amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                      growth_interval):
    """GradScaler.update: back off after an inf/NaN, grow after growth_interval clean steps
    (a scale that would overflow stays). Three scalars: computed on the host."""
    _check_scalar_tensor(scale, "current_scale")
    _check_scalar_tensor(found_inf, "found_inf")
    if growth_tracker.dtype != torch.int32 or growth_tracker.numel() != 1:
        raise RuntimeError("growth_tracker must be a 1-element int tensor.")
    current = scale.reshape(()).item()
    if found_inf.reshape(()).item():
        new, tracker = current * backoff_factor, 0
    else:
        tracker = int(growth_tracker.reshape(()).item()) + 1
        new = current
        if tracker == growth_interval:
            grown = float(np.float32(current) * np.float32(growth_factor))  # fp32, as the kernel
            new, tracker = (grown if math.isfinite(grown) else current), 0
    aten.fill_.Scalar(scale, new)  # rounded to the scale's fp32
    aten.fill_.Scalar(growth_tracker, tracker)
    return scale
