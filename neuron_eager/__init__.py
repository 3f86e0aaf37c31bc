"""neuron-eager: a simulated AWS Trainium NeuronCore as the PyTorch device `neuron`.

>>> import torch, neuron_eager
>>> x = torch.ones(3, device="neuron")
>>> (x + 1).cpu()
tensor([2., 2., 2.])
"""
from __future__ import annotations

import sys

import torch

if torch.distributed.is_available():  # (torch's C++ imports it at the first op on a tensor
    import torch.distributed.tensor  # noqa: F401  subclass, where a Ctrl-C landed in sympy's
    # import and left it broken: Note [Interrupts])

from neuron_eager.device_sim import config
from neuron_eager.ops import _compat, _compat_modules, backward_errors, jit, router
from neuron_eager.ops.tensor import NO_DLPACK, NOT_SHARED, NeuronOutOfMemoryError, NeuronTensor

import neuron_eager.ops  # noqa: E402,F401  (fills the op table)
import neuron_eager.autocast  # noqa: E402,F401  (autocast kernels on AutocastPrivateUse1)
from neuron_eager import device as _device  # noqa: E402
from neuron_eager import profiler  # noqa: E402
from neuron_eager import serialization  # noqa: E402
from neuron_eager.adaptive import adaptive_eager  # noqa: E402,F401  (NEURON_EAGER_ADAPTIVE)

__version__ = "0.1.0"

_compat.register_device_module(_device)
_compat.ensure_foreach_support(NeuronTensor)
_compat.ensure_fx_tracing(NeuronTensor)
_compat.install_accelerator_functions(_device.ACCELERATOR_FUNCTIONS)
_compat.install_pinned_memory_shim()
_compat_modules.install_data_parallel_shim()  # (Note [DataParallel on one NeuronCore])
_compat_modules.install_cross_device_data_setter(  # (Note [Setting .data across devices])
    lambda t, new: isinstance(new, NeuronTensor) and not isinstance(t, NeuronTensor))
_compat.refuse_process_sharing(NeuronTensor, NOT_SHARED)
_compat.refuse_dlpack_export(NeuronTensor, NO_DLPACK)
_compat_modules.install_tied_parameters_shim()
_compat_modules.install_torchscript_shim()  # (Note [TorchScript on neuron])
_compat.refuse_bare_storages()  # (Note [No bare neuron storages])
_compat.install_compile_shim()
_compat.install_control_flow_shim()  # (Note [Control flow ops in eager])
_compat.install_backward_errors(backward_errors)
serialization.install()  # torch.load(..., map_location="neuron")
profiler.install()  # torch.profiler shows neuron kernels with their simulated device time
sys.modules.setdefault("torch.neuron", _device)
# Trainium's fast type is bf16 (the Neuron compiler's --auto-cast-type default), so a bare
# torch.autocast("neuron") casts to bf16 rather than PyTorch's fp16 default.
torch.set_autocast_dtype(_compat.BACKEND, torch.bfloat16)


def get_executed_ops() -> dict[str, int]:
    """Ops run by a neuron kernel since the last clear, with counts."""
    return router.executed_counts()


def get_fallback_ops() -> dict[str, int]:
    """Ops that fell back to the CPU since the last clear, with counts."""
    return dict(router.fallback_ops)


def kernel_cache_stats() -> dict:
    """Plain eager's kernels in this process: how many were `loaded` from the disk cache and
    how many `compiled`, and the cache `folder` (None: NEURON_EAGER_CACHE_DIR=off). Adaptive
    eager's fused kernels are counted in `neuron_eager.adaptive.stats()`."""
    return dict(jit.stats(), folder=jit.plain_folder())


def clear_op_tracking() -> None:
    """Reset both op counters (and re-arm the one-time fallback warnings)."""
    router.clear_op_tracking()


__all__ = ["config", "NeuronTensor", "NeuronOutOfMemoryError", "get_executed_ops",
           "get_fallback_ops", "kernel_cache_stats", "clear_op_tracking", "profiler"]
