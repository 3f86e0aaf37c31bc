"""Results take the CPU's strides where a program can tell: `.view()` after an op works on
neuron exactly when it works on the CPU."""
import pytest
import torch

import neuron_eager


def _broadcast_with_odd_strides(device):
    z = torch.arange(64.0, device=device).view(4, 4, 4)
    a = z[..., :1].transpose(1, 2).unsqueeze(-1)  # (4, 1, 4, 1), strides (16, 1, 4, 1)
    b = torch.arange(12.0, device=device).view(3, 4).t()  # (4, 3), strides (1, 4)
    return a * b


def _attention_heads_merged(device, **kwargs):
    # nanoGPT's attention, its heads merged with view (Note [The layout of attention's
    # output] in ops/attention.py)
    B, T, H, E = 2, 5, 3, 4
    x = torch.arange(2 * B * T * H * E, device=device).float().sin().view(2, B, T, H, E)
    q, k = (t.transpose(1, 2) for t in x)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, k, **kwargs)
    return y.transpose(1, 2).view(B, T, H * E) if y.stride() == (60, 4, 12, 1) else y


def _grouped_query_attention(device):
    B, T, H, E = 2, 5, 4, 8  # (4 query heads share 2 key/value heads)
    q = torch.arange(B * T * H * E, device=device).float().sin().view(B, T, H, E)
    kv = torch.arange(B * T * 2 * E, device=device).float().cos().view(B, T, 2, E)
    q, kv = q.transpose(1, 2), kv.transpose(1, 2)
    return torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)


def _attention_on_the_math_path(device):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # (the CPU's math path: contiguous)
        return _attention_heads_merged(device)


def _channels_last(device):
    return torch.arange(120.0, device=device).sin().view(2, 3, 4, 5).contiguous(
        memory_format=torch.channels_last)


F = torch.nn.functional
CASES = {"broadcast of a size-1 dim's stride": _broadcast_with_odd_strides,
         # (contiguous on the CPU whatever the input's layout)
         "logsigmoid of channels-last": lambda d: F.logsigmoid(_channels_last(d)),
         "rrelu in eval of channels-last": lambda d: F.rrelu(_channels_last(d)),
         "one_hot of transposed indices": lambda d: F.one_hot(
             torch.arange(12, device=d).view(4, 3).t() % 5, 5),
         "out= resized for add of channels-last": lambda d: torch.add(
             _channels_last(d), 1, out=torch.empty(0, device=d)),
         "out= resized for exp of a transpose": lambda d: torch.exp(
             _channels_last(d).transpose(0, 1), out=torch.empty(0, device=d)),
         "attention in the query's memory order": _attention_heads_merged,
         "causal attention": lambda d: _attention_heads_merged(d, is_causal=True),
         "grouped-query attention": _grouped_query_attention,
         "attention on the math path": _attention_on_the_math_path,
         "attention with a 3-D mask": lambda d: _attention_heads_merged(
             d, attn_mask=torch.zeros(3, 5, 5, device=d)),
         "attention with dropout (the CPU's math path)": lambda d: _attention_heads_merged(
             d, dropout_p=1.0),
         # x.clone(preserve_format) and an in-place write, on the CPU: x's layout
         "index_fill of a transpose": lambda d: _transposed(d).index_fill(0, _i(d, 1), 1.0),
         "index_fill of channels-last by a tensor": lambda d: _channels_last(d).index_fill(
             1, _i(d, 0), torch.tensor(0.0, device=d)),
         "put of a transpose": lambda d: _transposed(d).put(_i(d, 1, -3), _i(d, 7.0, 8.0)),
         "put of channels-last, accumulated": lambda d: _channels_last(d).put(
             _i(d, 0, 5, 5, -1), _i(d, 1.0, 2.0, 3.0, 4.0), accumulate=True),
         "index_put of a transpose": lambda d: _transposed(d).index_put(
             (_i(d, 1),), _i(d, 1.0)),
         "index_put of channels-last, accumulated": lambda d: _channels_last(d).index_put(
             (_i(d, 1), _i(d, 2)), _i(d, 1.0), accumulate=True),
         "slice_scatter of a transpose": lambda d: torch.slice_scatter(
             _transposed(d), torch.zeros(1, 4, device=d), 0, 0, 1),
         "select_scatter of channels-last": lambda d: torch.select_scatter(
             _channels_last(d), torch.zeros(3, 4, 5, device=d), 0, 1),
         "diagonal_scatter of a transpose": lambda d: torch.diagonal_scatter(
             _transposed(d), torch.zeros(4, device=d)),
         "fill of a transpose": lambda d: torch.fill(_transposed(d), 2.0),
         # (structured kernels: contiguous whatever x's layout)
         "index_copy of a transpose": lambda d: _transposed(d).index_copy(
             0, _i(d, 1), torch.ones(1, 4, device=d)),
         "scatter of channels-last": lambda d: _channels_last(d).scatter(
             0, torch.zeros(1, 3, 4, 5, dtype=torch.long, device=d), 2.0),
         # TensorIterator over (self, vec1, vec2): self's layout, with beta 0 too
         "addr of a transpose": lambda d: torch.addr(
             _transposed(d), torch.arange(6.0, device=d), torch.arange(4.0, device=d)),
         "addr of a transpose, beta 0": lambda d: torch.addr(
             _transposed(d), torch.arange(6.0, device=d), torch.arange(4.0, device=d), beta=0)}


def _transposed(device):
    return torch.arange(24.0, device=device).view(4, 6).t()


def _i(device, *values):
    return torch.tensor(values, device=device)


@pytest.mark.parametrize("adaptive", [False, True], ids=["plain", "adaptive"])
@pytest.mark.parametrize("name", CASES)
def test_layouts_as_on_cpu(name, adaptive):
    want = CASES[name]("cpu")
    with neuron_eager.adaptive_eager(adaptive):
        got = CASES[name]("neuron")
        assert got.stride() == want.stride()
        torch.testing.assert_close(got.reshape(-1).cpu(), want.reshape(-1))


@pytest.mark.parametrize("train", [True, False])
def test_dropout_keeps_the_inputs_layout(train):
    # (channels-last stopped at a dropout: its results were contiguous; the CPU keeps x's)
    x = torch.randn(4, 8, 16, 16).contiguous(memory_format=torch.channels_last)
    want_out, want_mask = torch.native_dropout(x, 0.5, train)
    out, mask = torch.native_dropout(x.to("neuron"), 0.5, train)
    assert out.stride() == want_out.stride() and mask.stride() == want_mask.stride()
    out, mask = out.cpu(), mask.cpu()
    assert torch.equal(out, x * mask * (2.0 if train else 1.0))  # (mask and output agree)
    kept = mask.float().mean().item()
    assert 0.45 < kept < 0.55 if train else kept == 1.0


@pytest.mark.parametrize("backends, kwargs", [
    (("EFFICIENT_ATTENTION",), {}), (("CUDNN_ATTENTION",), {}),
    (("FLASH_ATTENTION",), {"dropout_p": 0.3}), (("FLASH_ATTENTION",), {"enable_gqa": False})])
def test_attention_honours_sdpa_kernel_as_the_cpu(backends, kwargs):
    # (neuron ran whatever torch.nn.attention.sdpa_kernel allowed)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    outcomes = []
    for device in ("cpu", "neuron"):
        q = torch.randn(2, 3, 4, 8, device=device)
        with sdpa_kernel([getattr(SDPBackend, b) for b in backends]):
            try:
                torch.nn.functional.scaled_dot_product_attention(q, q, q, **kwargs)
                outcomes.append("ran")
            except RuntimeError as error:
                outcomes.append(str(error))
    assert outcomes[0] == outcomes[1]
