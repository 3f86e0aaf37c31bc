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
