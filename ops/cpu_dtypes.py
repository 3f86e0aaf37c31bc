"""Integer and bool inputs that the CPU's (and CUDA's) kernels refuse, refused here too.

neuron's kernels are written once for every dtype, so an integer tensor given to a loss, a
pooling or a norm computed something where the CPU says the op has no kernel for that
dtype: a mistake (class indices passed as logits) went unnoticed. Each op below checks its
first tensor argument against the dtypes the CPU's kernel takes and raises the CPU's error.
Only refusals CUDA shares are copied: where the CPU alone lacks a kernel (bf16 avg_pool3d,
fp16 rrelu, integer histc and max_unpool), neuron computes, as CUDA does.
(tests/test_cpu_dtypes.py checks the table against the CPU in every dtype.)
"""
from __future__ import annotations

import functools

import torch

from neuron_eager.ops import tensor as T
from neuron_eager.ops.registry import KERNELS

aten = torch.ops.aten

FLOATS = frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16})
NOT_BOOL = frozenset(T.STORAGE_DTYPE) - {torch.bool}

# (ops, the CPU kernel's name in its error, the dtypes it takes)
REFUSALS = [
    ((aten.avg_pool2d.default,), "avg_pool2d", FLOATS | {torch.int64}),
    ((aten.avg_pool3d.default,), "avg_pool3d_out_frame", FLOATS | {torch.int64}),
    ((aten.im2col.default,), "im2col_out_cpu", FLOATS | {torch.bool}),
    ((aten.col2im.default,), "col2im_out_cpu", FLOATS | {torch.bool}),
    ((aten.index_reduce.default,), "index_func_", NOT_BOOL),
    ((aten.bernoulli.default,), "bernoulli_tensor_cpu_p_", FLOATS),
    ((aten.smooth_l1_loss.default,), "smooth_l1_cpu", FLOATS),
    ((aten.huber_loss.default,), "huber_cpu", FLOATS),
    ((aten.binary_cross_entropy.default,), "binary_cross_entropy", FLOATS),
    ((aten.nll_loss_forward.default,), "nll_loss_out_frame", FLOATS),
    ((aten.nll_loss2d_forward.default,), "nll_loss2d_forward_out_frame", FLOATS),
    ((aten.segment_reduce.default,), "_segment_reduce_cpu", FLOATS),
    ((aten.linalg_cross.default,), "cross", NOT_BOOL),
    ((aten.reflection_pad1d.default,), "reflection_pad1d", NOT_BOOL),
    ((aten.reflection_pad2d.default,), "reflection_pad2d", NOT_BOOL),
    ((aten.reflection_pad3d.default,), "reflection_pad3d", NOT_BOOL),
    ((aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
      aten._native_batch_norm_legit.no_stats, aten._native_batch_norm_legit_no_training.default,
      aten._batch_norm_with_update.default, aten._batch_norm_no_update.default),
     "batch_norm", FLOATS),
    ((aten.native_group_norm.default,), "GroupNormKernelImpl", FLOATS),
    ((aten.bincount.default,), "bincount_cpu",
     frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})),
]


def _embedding_bag_check(weight) -> None:
    if weight.dtype not in FLOATS:
        raise RuntimeError(
            "Expected tensor for argument #1 'weight' to have one of the following scalar "
            f"types: Half, BFloat16, Float, Double; but got torch.neuron."
            f"{T.dtype_name(weight.dtype)}Tensor instead "
            "(while checking arguments for embedding_bag)")


def _dtype_check(name: str, takes: frozenset):
    def check(x) -> None:
        if x.dtype not in takes:
            raise NotImplementedError(f"\"{name}\" not implemented for '{T.dtype_name(x.dtype)}'")
    return check


def _checked(kernel, check):
    @functools.wraps(kernel)
    def run(x, *args, **kwargs):
        check(x)
        return kernel(x, *args, **kwargs)

    run.checks_devices = getattr(kernel, "checks_devices", False)
    return run


def install() -> None:
    """Wrap each listed op's kernel in the op table with its check (once, after the families
    registered theirs)."""
    checks = [(ops, _dtype_check(name, takes)) for ops, name, takes in REFUSALS]
    checks.append(((aten._embedding_bag.default, aten._embedding_bag_forward_only.default),
                   _embedding_bag_check))
    for ops, check in checks:
        for op in ops:
            KERNELS[op] = _checked(KERNELS[op], check)
