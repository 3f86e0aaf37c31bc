"""PyTorch's inference fast paths for attention, composed from device kernels.

nn.MultiheadAttention and nn.TransformerEncoderLayer call `_native_multi_head_attention` /
`_transformer_encoder_layer_fwd` in eval mode without autograd on any device they consider
fast (PrivateUse1 included); the CPU has the only kernels. They are composed here from
linear, bmm, masked softmax and layer norm, in the CPU kernels' order of operations (q is
scaled by 1/sqrt(head_dim) after its bias, masks mean "masked out" wherever nonzero, a row
masked out entirely gives NaN), so results match the CPU's to rounding.
"""
from __future__ import annotations

import math

import torch

from neuron_eager.ops.copy import like_strides
from neuron_eager.ops.registry import on_autograd_key, register

aten = torch.ops.aten


def _as_scores_mask(mask, scores, mask_type):
    """A boolean mask that broadcasts over (B, H, L, S) scores."""
    if mask.dtype != torch.bool:
        mask = aten.ne.Scalar(mask, 0)  # as the CPU: a float mask is read as "masked"
    B, H, L, S = scores.shape
    if mask_type == 1:  # key padding: (B, S)
        return aten.view.default(mask, [B, 1, 1, S])
    if mask_type == 0 or mask.dim() == 2:  # attention mask: (L, S)
        return aten.view.default(mask, [1, 1, L, S])
    return mask


def _masked(scores, mask):
    """Softmax over the last dim with masked scores left out; all-masked rows give NaN, as the
    CPU's _masked_softmax (a batch row whose keys are all padding is NaN there too)."""
    filled = aten.masked_fill.Scalar(scores, mask, float("-inf"))
    return aten._softmax.default(filled, -1, False)


@register(aten._masked_softmax.default)
def masked_softmax(x, mask, dim=None, mask_type=None):
    if dim is not None and dim not in (-1, x.dim() - 1):
        x_last = aten.transpose.int(x, dim, -1)
        mask_last = aten.transpose.int(aten.expand.default(mask, list(x.shape)), dim, -1)
        return aten.transpose.int(masked_softmax(x_last, mask_last, -1, 2), dim, -1)
    if mask_type == 1 and x.dim() == 4:
        mask = aten.view.default(mask, [x.shape[0], 1, 1, x.shape[-1]])
    elif mask_type == 0 and x.dim() == 4:
        mask = aten.view.default(mask, [1, 1, *x.shape[-2:]])
    return _masked(x, mask)


def _heads(t, num_head):
    B, T_, D = t.shape
    return aten.transpose.int(aten.view.default(t, [B, T_, num_head, D // num_head]), 1, 2)


@register(aten._native_multi_head_attention.default)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                                proj_weight, proj_bias, mask=None, need_weights=True,
                                average_attn_weights=True, mask_type=None):
    B, L, _ = query.shape
    wq, wk, wv = aten.chunk.default(qkv_weight, 3, 0)
    bq, bk, bv = aten.chunk.default(qkv_bias, 3, 0)
    q = aten.div.Tensor(aten.linear.default(query, wq, bq), math.sqrt(embed_dim // num_head))
    k = aten.linear.default(key, wk, bk)
    v = aten.linear.default(value, wv, bv)
    q, k, v = _heads(q, num_head), _heads(k, num_head), _heads(v, num_head)
    scores = aten.matmul.default(q, aten.transpose.int(k, -2, -1))
    if mask is not None:
        attn = _masked(scores, _as_scores_mask(mask, scores, mask_type))
    else:
        attn = aten._softmax.default(scores, -1, False)
    ctx = aten.matmul.default(attn, v)
    ctx = aten.reshape.default(aten.transpose.int(ctx, 1, 2), [B, L, embed_dim])
    out = aten.linear.default(ctx, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    if average_attn_weights:
        attn = aten.div.Tensor(aten.sum.dim_IntList(attn, [1]), num_head)
    return out, attn


def _norm(x, weight, bias, eps):
    return aten.layer_norm.default(x, [x.shape[-1]], weight, bias, eps)


@register(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                  proj_bias, use_gelu, norm_first, eps, norm_weight_1,
                                  norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                                  ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    x = _norm(src, norm_weight_1, norm_bias_1, eps) if norm_first else src
    x = native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias,
                                    proj_weight, proj_bias, mask, False, True, mask_type)[0]
    x = aten.add.Tensor(x, src)
    if not norm_first:
        x = _norm(x, norm_weight_1, norm_bias_1, eps)
    residual = x
    if norm_first:
        x = _norm(x, norm_weight_2, norm_bias_2, eps)
    hidden = aten.linear.default(x, ffn_weight_1, ffn_bias_1)
    hidden = aten.gelu.default(hidden) if use_gelu else aten.relu.default(hidden)
    x = aten.add.Tensor(aten.linear.default(hidden, ffn_weight_2, ffn_bias_2), residual)
    if not norm_first:
        x = _norm(x, norm_weight_2, norm_bias_2, eps)
    return x


# Note [Causal and explicit masks]
# The CPU's scaled_dot_product_attention (its flash kernel) applies an explicit attn_mask and
# is_causal together; the math path that other devices take refuses the pair. So on neuron a
# causal mask is folded into the explicit one first (kept out of a bool mask, -inf added to a
# float one), at the autograd key, above the math path.
_SDPA = aten.scaled_dot_product_attention.default


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
          enable_gqa=False):
    if attn_mask is not None and is_causal:
        causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool,
                            device=query.device).tril()
        attn_mask = attn_mask & causal if attn_mask.dtype == torch.bool else \
            attn_mask.masked_fill(~causal, float("-inf"))
        is_causal = False
    flash = _flash_on_cpu(query, key, value, attn_mask, dropout_p, enable_gqa)
    if not flash and not torch.backends.cuda.math_sdp_enabled():  # (sdpa_kernel's choice)
        raise RuntimeError(
            "No available kernel.  Aborting execution." if torch.backends.cuda.flash_sdp_enabled()
            else "No viable backend for scaled_dot_product_attention was found. This is likely "
                 "due to turning off both the math kernel and the fused kernels.")
    out = _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                          enable_gqa=enable_gqa)
    strides = like_strides(query, None) if flash else None
    if strides is None:
        return out
    laid_out = torch.empty_strided(out.shape, strides, dtype=out.dtype, device=out.device)
    return laid_out.copy_(out)


# Note [The layout of attention's output]
# The CPU's flash kernel writes its output in the query's memory order: for nanoGPT's
# q = x.view(B, T, H, E).transpose(1, 2) that is (B, T, H, E), so `y.transpose(1, 2).view(B,
# T, C)` works there; the math path returns a contiguous (B, H, T, E) and that view failed.
# The CPU takes the flash kernel for 4-D inputs of one head size, without dropout, with as many
# key as query heads; elsewhere its math path returns a contiguous result too.
def _flash_on_cpu(query, key, value, attn_mask, dropout_p, enable_gqa) -> bool:
    """Whether the CPU would run its flash kernel on these inputs (torch 2.13's checks, seen
    from the outside: 4-D inputs of one head size, as many key heads as query heads or a
    divisor of them with enable_gqa, a unit last stride, keys, no dropout, no 3-D mask or
    mask that requires grad, and the flash switch of torch.nn.attention.sdpa_kernel on)."""
    return query.dim() == 4 and not dropout_p and key.dim() == value.dim() == 4 and \
        (query.shape[1] == key.shape[1] or enable_gqa and key.shape[1] and
         query.shape[1] % key.shape[1] == 0) and \
        query.shape[-1] == key.shape[-1] == value.shape[-1] and query.stride(-1) == 1 and \
        key.shape[-2] > 0 and torch.backends.cuda.flash_sdp_enabled() and (
            attn_mask is None or attn_mask.dim() != 3 and not attn_mask.requires_grad)


on_autograd_key("scaled_dot_product_attention", _sdpa)
