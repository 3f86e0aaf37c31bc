"""nn.TransformerEncoder inference with a padding mask: PyTorch's nested-tensor fast path."""
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import neuron_eager

N = torch.device("neuron")


def _encoder(nested: bool):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested).eval()


def _inputs():
    x = torch.randn(4, 10, 32)
    pad = torch.zeros(4, 10, dtype=torch.bool)
    pad[1, 7:] = True
    return x, pad


def test_the_default_encoder_runs_its_regular_path_and_says_so():
    # (Note [Encoder without nesting]) the CPU nests and pads with zeros; neuron computes
    # every position: the same values where the mask keeps them, the CPU's regular path's
    # values everywhere
    x, pad = _inputs()
    cpu, ours = _encoder(nested=True), _encoder(nested=True).to(N)
    neuron_eager.ops.unsupported._encoder_warned = False
    with warnings.catch_warnings():  # (with grad on the CPU's path is the regular one too:
        warnings.simplefilter("error")  # no warning, and the one warning is kept for later)
        ours(x.to(N), src_key_padding_mask=pad.to(N))
    with torch.no_grad(), pytest.warns(UserWarning, match="enable_nested_tensor=False"):
        got = ours(x.to(N), src_key_padding_mask=pad.to(N)).cpu()
    with torch.no_grad():
        fast = cpu(x, src_key_padding_mask=pad)
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            regular = cpu(x, src_key_padding_mask=pad)
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
    keep = ~pad
    torch.testing.assert_close(got[keep], fast[keep], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, regular, rtol=1e-4, atol=1e-5)
    assert fast[pad].eq(0).all() and not got[pad].eq(0).all()


def test_an_encoder_that_skips_the_mask_check_is_refused_with_the_way_out():
    x, pad = _inputs()
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2,
                                mask_check=False).eval().to(N)
    with torch.no_grad(), pytest.raises(NotImplementedError, match="enable_nested_tensor=False"):
        enc(x.to(N), src_key_padding_mask=pad.to(N))


def test_without_nesting_it_matches_the_cpu():
    x, pad = _inputs()
    cpu = _encoder(nested=False)
    ours = _encoder(nested=False).to(N)
    with torch.no_grad():
        expected = cpu(x, src_key_padding_mask=pad)
        got = ours(x.to(N), src_key_padding_mask=pad.to(N))
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


def _masks(B, L):
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[1, 4:] = True
    pad[-1, :] = True  # a sequence masked out entirely (NaN rows, on the CPU as here)
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
    return [{}, {"key_padding_mask": pad}, {"attn_mask": causal},
            {"attn_mask": causal, "key_padding_mask": pad},
            {"attn_mask": causal.float() * -1e9}, {"need_weights": False},
            {"average_attn_weights": False}]


def _on(device, kwargs):
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


@pytest.mark.parametrize("case", range(len(_masks(3, 6))))
def test_multihead_attention_fast_path_runs_natively(case):
    neuron_eager.clear_op_tracking()
    torch.manual_seed(0)
    cpu = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ours = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ours.load_state_dict(cpu.state_dict())
    ours.to(N)
    x, kv = torch.randn(3, 6, 16), torch.randn(3, 6, 16)
    kwargs = _masks(3, 6)[case]
    with torch.no_grad():
        for args in ((x, x, x), (x, kv, kv)):  # self- and cross-attention
            expected = cpu(*args, **kwargs)
            got = ours(*[a.to(N) for a in args], **_on(N, kwargs))
            for g, e in zip(got, expected):
                if e is None:
                    assert g is None
                else:
                    torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert neuron_eager.get_fallback_ops() == {}


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_fast_path_runs_natively(norm_first, activation):
    neuron_eager.clear_op_tracking()
    torch.manual_seed(0)

    def layer():
        return nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, norm_first=norm_first,
                                          activation=activation).eval()

    cpu, ours = layer(), layer()
    ours.load_state_dict(cpu.state_dict())
    ours.to(N)
    x = torch.randn(2, 6, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
    with torch.no_grad():
        for kwargs in ({}, {"src_key_padding_mask": pad}, {"src_mask": causal},
                       {"src_mask": causal, "is_causal": True}):
            torch.testing.assert_close(ours(x.to(N), **_on(N, kwargs)).cpu(), cpu(x, **kwargs),
                                       rtol=1e-5, atol=2e-6)
    assert neuron_eager.get_fallback_ops() == {}


@pytest.mark.parametrize("need_weights", [True, False])
def test_a_batch_row_of_padding_only_is_nan_as_on_the_cpu(need_weights):
    torch.manual_seed(0)
    cpu = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    ours = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    ours.load_state_dict(cpu.state_dict())
    ours.to(N)
    x = torch.randn(2, 3, 8)
    y = x.to(N)  # (self-attention, one tensor: the fast path)
    pad = torch.tensor([[False, False, True], [True, True, True]])
    with torch.no_grad():
        expected = cpu(x, x, x, key_padding_mask=pad, need_weights=need_weights)
        got = ours(y, y, y, key_padding_mask=pad.to(N), need_weights=need_weights)
    assert expected[0][1].isnan().all()
    for g, e in zip(got, expected):
        if e is not None:
            torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("mask", [torch.randn(5, 5), torch.rand(2, 3, 5, 5) > 0.3])
def test_sdpa_applies_an_explicit_and_a_causal_mask_together(mask):
    # (the CPU's flash kernel takes both; the math path other devices take refused them)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, requires_grad=True) for _ in range(3))
    ours = [t.detach().to(N).requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    got = F.scaled_dot_product_attention(*ours, attn_mask=mask.to(N), is_causal=True)
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)
    expected.sum().backward()
    got.sum().backward()
    for a, b in zip((q, k, v), ours):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-5, atol=1e-6)
