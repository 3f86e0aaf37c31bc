"""What the device refuses by design, with errors that say so: sparse layouts, nested and
quantized tensors (TorchNeuron supports dense strided tensors only). Complex dtypes are refused
where tensors are made (tensor.check_dtype).
"""
from __future__ import annotations

import torch

from neuron_eager.ops import tensor as T
from neuron_eager.ops.registry import register
from neuron_eager.ops.sourceline import warn_at_user_line

aten = torch.ops.aten
_impl = torch.library.Library("aten", "IMPL")
_fallback = torch.library.Library("_", "IMPL")

SPARSE = ("sparse tensors are not supported on neuron: only dense (strided) tensors live on the "
          "device. Keep sparse tensors on the CPU, or call .to_dense() before moving them.")
NESTED = ("nested tensors are not supported on neuron. Keep nested tensors on the CPU, or pad "
          "them into a dense tensor (torch.nested.to_padded_tensor) before moving them.")


def refuse_sparse_gradient(weight, what: str) -> None:
    """Embedding(sparse=True) and EmbeddingBag(sparse=True) refused where they are called:
    their backward would make a sparse gradient inside autograd's engine, where a refusal
    aborts the process instead of raising."""
    if weight.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError(f"{what}(sparse=True): sparse gradients are not supported "
                                  f"on neuron (only dense tensors live on the device). Use "
                                  f"sparse=False: the gradient is then a dense tensor of the "
                                  f"weight's shape.")


def _refuse(message):
    def refuse(*args, **kwargs):
        raise NotImplementedError(message)

    return refuse


for _key, _message in [("SparsePrivateUse1", SPARSE), ("SparseCsrPrivateUse1", SPARSE),
                       ("NestedTensorPrivateUse1", NESTED)]:
    _impl.impl("_to_copy", _refuse(_message), _key)
_fallback.fallback(lambda op, *args, **kwargs: _refuse(NESTED)(), "NestedTensorPrivateUse1")


def _refuse_quantized(op, *args, **kwargs):
    """Any op making a quantized neuron tensor (empty(dtype=torch.qint8), a quantized CPU
    tensor's .to("neuron") through empty_quantized)."""
    for a in (*args, *kwargs.values()):
        dtype = a if isinstance(a, torch.dtype) else getattr(a, "dtype", None)
        if isinstance(dtype, torch.dtype):
            T.check_dtype(dtype)  # (raises for a quantized dtype)
    T.check_dtype(torch.qint8)  # (no dtype among the arguments: say what the key means)


_fallback.fallback(_refuse_quantized, "QuantizedPrivateUse1")

register(aten._sparse_coo_tensor_with_dims_and_tensors, aten._sparse_coo_tensor_with_dims,
         aten._sparse_compressed_tensor_unsafe, aten.to_sparse, aten._to_sparse,
         aten._to_sparse_csr, aten._to_sparse_csc, aten._to_sparse_bsr, aten._to_sparse_bsc,
         aten.sparse_resize_, aten.sparse_resize_and_clear_)(_refuse(SPARSE))
# nn.TransformerEncoder takes this path by itself (eval mode, src_key_padding_mask given)
ENCODER = (NESTED + " nn.TransformerEncoder converts its input to a nested tensor in eval mode "
           "when given a src_key_padding_mask: build it with enable_nested_tensor=False, or "
           "call torch.backends.mha.set_fastpath_enabled(False), to run it on neuron.")
register(aten._nested_view_from_jagged, aten._nested_tensor_from_tensor_list,
         aten._nested_from_padded, aten._nested_view_from_buffer)(_refuse(NESTED))
register(aten._nested_tensor_from_mask)(_refuse(ENCODER))


_encoder_warned = False


@register(aten._nested_tensor_from_mask_left_aligned)
def nested_mask_left_aligned(t, mask):
    """nn.TransformerEncoder's question before it nests (eval mode, src_key_padding_mask
    given): "no", so that it runs its regular path (Note [Encoder without nesting])."""
    global _encoder_warned
    # (asked before the encoder's other checks: with grad enabled its parameters, which
    # require grad, keep the CPU off the fast path too, so nothing differs to warn of)
    if not _encoder_warned and not torch.is_grad_enabled():
        _encoder_warned = True
        warn_at_user_line(
            "nn.TransformerEncoder's nested-tensor fast path (eval mode with a "
            "src_key_padding_mask) is not available on neuron, which has no nested tensors: "
            "it runs its regular path, so its outputs at padded positions hold computed "
            "values where the fast path gives zeros (the other positions are the same, "
            "but a decoder reading them, as nn.Transformer's does without a "
            "memory_key_padding_mask, sees the difference). "
            "Build it with enable_nested_tensor=False to say so and silence this.")
    return False


# Note [Encoder without nesting]
# In eval mode with a padding mask, nn.TransformerEncoder first asks whether the mask is
# left-aligned and, if so, packs the unpadded positions into a nested tensor, runs the
# layers on it and pads the result with zeros. Answering "not left-aligned" sends it down
# the path it takes in training: the same attention (padded keys masked), every position
# computed. With mask_check=False it nests without asking, and gets ENCODER's error.
