"""nn.TransformerEncoder inference with a padding mask: PyTorch's nested-tensor fast path."""
import pytest
import torch
from torch import nn

import neuron_eager  # noqa: F401

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


def test_the_nested_path_is_refused_with_the_way_out():
    x, pad = _inputs()
    enc = _encoder(nested=True).to(N)
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
