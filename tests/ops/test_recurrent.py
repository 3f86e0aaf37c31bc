import pytest
import torch

from checks import NEURON, check_op


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("bias", [True, False])
def test_rnn_layers_match_cpu_with_gradients(cell, bias, seed):
    layer_cls = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
    torch.manual_seed(0)
    cpu_layer = layer_cls(6, 8, num_layers=2, batch_first=True, bias=bias)
    dev_layer = layer_cls(6, 8, num_layers=2, batch_first=True, bias=bias)
    dev_layer.load_state_dict(cpu_layer.state_dict())
    dev_layer.to("neuron")
    x = torch.randn(3, 5, 6, requires_grad=True)

    def run(layer, inp):
        out = layer(inp)[0]
        return out

    check_op(lambda inp: run(dev_layer if inp.device.type == "neuron" else cpu_layer, inp), x,
             grad=True, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(cpu_layer.named_parameters(), dev_layer.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5)


def test_lstm_cell_with_initial_state(seed):
    torch.manual_seed(0)
    cpu = torch.nn.LSTM(4, 5)
    dev = torch.nn.LSTM(4, 5)
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    x, h0, c0 = torch.randn(7, 2, 4), torch.randn(1, 2, 5), torch.randn(1, 2, 5)
    out, (h, c) = cpu(x, (h0, c0))
    dout, (dh, dc) = dev(x.to("neuron"), (h0.to("neuron"), c0.to("neuron")))
    for a, b in [(dout, out), (dh, h), (dc, c)]:
        torch.testing.assert_close(a.cpu(), b.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch_first", [True, False])
def test_packed_sequences_through_a_bidirectional_lstm(batch_first, seed):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    x = torch.randn(3, 6, 5) if batch_first else torch.randn(6, 3, 5)
    lengths = torch.tensor([2, 6, 4])  # unsorted: pack_padded_sequence sorts them
    lstm = torch.nn.LSTM(5, 7, batch_first=batch_first, bidirectional=True)
    layers = {"cpu": lstm, "neuron": torch.nn.LSTM(5, 7, batch_first=batch_first,
                                                   bidirectional=True)}
    layers["neuron"].load_state_dict(lstm.state_dict())
    layers["neuron"].to(NEURON)

    def run(inp, module):
        packed = pack_padded_sequence(inp, lengths, batch_first=batch_first,
                                      enforce_sorted=False)
        out, _ = module(packed)
        padded, out_lengths = pad_packed_sequence(out, batch_first=batch_first)
        sizes[inp.device.type] = packed.batch_sizes, out_lengths  # CPU tensors, as on CUDA
        return packed.data, padded

    sizes = {}
    check_op(lambda inp: run(inp, layers[inp.device.type]), x.requires_grad_(), grad=True,
             rtol=1e-5, atol=1e-6)
    for ours, cpu in zip(sizes["neuron"], sizes["cpu"]):
        assert ours.device.type == "cpu" and torch.equal(ours, cpu)
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order"):
        pack_padded_sequence(x.detach().to(NEURON), torch.tensor([2, 6, 4]),
                             batch_first=batch_first)
    with pytest.raises(RuntimeError) as cpu_error:  # (ATen's words for a tensor)
        torch._VF._pack_padded_sequence(x.detach(), torch.tensor([[6, 4]], dtype=torch.int32),
                                        batch_first)
    with pytest.raises(RuntimeError) as error:  # (lengths on the device: refused as on CUDA)
        pack_padded_sequence(x.detach().to(NEURON), torch.tensor([[6, 4]], device=NEURON),
                             batch_first=batch_first)
    assert str(error.value) == str(cpu_error.value).replace("cpu Int", "neuron Long")


def _sig_grad(s):
    return s * (1 - s)


# Note [Fused RNN cells]: the one-launch fp32 cells give the bits of the same ops run one
# by one on the device
@pytest.mark.parametrize("grads", ["both", "hy", "cy"])
def test_fused_lstm_cell_is_the_elementwise_composition(grads):
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(1)
    B, H = 5, 7
    ig, hg = (torch.randn(B, 4 * H, generator=g).to(NEURON) for _ in range(2))
    ib, hb = (torch.randn(4 * H, generator=g).to(NEURON) for _ in range(2))
    cx = torch.randn(B, H, generator=g).to(NEURON)
    hy, cy, ws = aten._thnn_fused_lstm_cell(ig, hg, cx, ib, hb)
    i, f, c, o = ((ig + ib) + (hg + hb)).chunk(4, 1)
    i, f, c, o = i.sigmoid(), f.sigmoid(), c.tanh(), o.sigmoid()
    want_cy = f * cx + i * c
    assert torch.equal(cy.cpu(), want_cy.cpu())
    assert torch.equal(hy.cpu(), (o * want_cy.tanh()).cpu())
    assert torch.equal(ws.cpu(), torch.cat([i, f, c, o], 1).cpu())
    grad_hy = torch.randn(B, H, generator=g).to(NEURON) if grads != "cy" else None
    grad_cy = torch.randn(B, H, generator=g).to(NEURON) if grads != "hy" else None
    grad_gates, grad_cx, grad_bias = aten._thnn_fused_lstm_cell_backward_impl(
        grad_hy, grad_cy, cx, cy, ws, True)
    tanh_cy = cy.tanh()
    gc = grad_cy if grad_cy is not None else torch.zeros_like(cy)
    go = torch.zeros_like(o)
    if grad_hy is not None:
        gc = gc + (grad_hy * o) * (1 - tanh_cy * tanh_cy)
        go = (grad_hy * tanh_cy) * _sig_grad(o)
    want = torch.cat([(gc * c) * _sig_grad(i), (gc * cx) * _sig_grad(f),
                      (gc * i) * (1 - c * c), go], 1)
    assert torch.equal(grad_gates.cpu(), want.cpu())
    assert torch.equal(grad_cx.cpu(), (gc * f).cpu())
    assert torch.equal(grad_bias.cpu(), want.sum(0).cpu())


def test_fused_gru_cell_is_the_elementwise_composition():
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(2)
    B, H = 4, 6
    ig, hg = (torch.randn(B, 3 * H, generator=g).to(NEURON) for _ in range(2))
    ib, hb = (torch.randn(3 * H, generator=g).to(NEURON) for _ in range(2))
    hx = torch.randn(B, H, generator=g).to(NEURON)
    hy, ws = aten._thnn_fused_gru_cell(ig, hg, hx, ib, hb)
    ir, ii, in_ = (ig + ib).chunk(3, 1)
    hr, hi, hn = (hg + hb).chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    assert torch.equal(hy.cpu(), (n + z * (hx - n)).cpu())
    assert torch.equal(ws.cpu(), torch.cat([r, z, n, hx, hn], 1).cpu())
    grad_hy = torch.randn(B, H, generator=g).to(NEURON)
    grad_in, grad_hidden, grad_hx, grad_ib, grad_hb = aten._thnn_fused_gru_cell_backward(
        grad_hy, ws, True)
    gn = (grad_hy * (1 - z)) * (1 - n * n)
    gr = (gn * hn) * _sig_grad(r)
    gz = (grad_hy * (hx - n)) * _sig_grad(z)
    assert torch.equal(grad_in.cpu(), torch.cat([gr, gz, gn], 1).cpu())
    assert torch.equal(grad_hidden.cpu(), torch.cat([gr, gz, gn * r], 1).cpu())
    assert torch.equal(grad_hx.cpu(), (grad_hy * z).cpu())
    assert torch.equal(grad_ib.cpu(), grad_in.sum(0).cpu())
