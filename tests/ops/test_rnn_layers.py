"""nn.LSTM / nn.GRU as whole-sequence kernels (Note [Whole-sequence RNN layers])."""
import pytest
import torch

import neuron_eager
from checks import NEURON
from neuron_eager.device_sim import core
from neuron_eager.ops import rnn_layers


_CLASSES = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}


def _pair(kind, **kw):
    torch.manual_seed(0)
    cls = _CLASSES[kind]
    cpu, dev = cls(5, 12, **kw), cls(5, 12, **kw)
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev.to(NEURON)


def _run(layer, x, states):
    """Forward and backward through every output (the sequence and the last states)."""
    x = x.to(next(layer.parameters()).device).requires_grad_()
    states = tuple(s.to(x.device).requires_grad_() for s in states)
    out, last = layer(x, states if len(states) > 1 else states[0])
    last = last if isinstance(last, tuple) else (last,)
    loss = (out * out).sum() + sum((s * (k + 2)).sum() for k, s in enumerate(last))
    loss.backward()
    grads = [x.grad, *(s.grad for s in states), *(p.grad for p in layer.parameters())]
    return [out, *last], grads


def _close(ours, cpu):
    for a, b in zip(ours, cpu):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-4, atol=2e-5)


def _variant(kind, kw=None):
    """A test's kind as _pair's kind and keywords: "rnn_relu" and "lstm_proj" (proj_size 4)."""
    extra = {"rnn_relu": ("rnn", dict(nonlinearity="relu")),
             "lstm_proj": ("lstm", dict(proj_size=4))}.get(kind, (kind, {}))
    return extra[0], dict(kw or {}, **extra[1])


def _states(kind, kw, layers, batch, generator=None):
    """Random initial states: h (proj_size wide with a projection), and an LSTM's c."""
    widths = [kw.get("proj_size") or 12, 12] if kind == "lstm" else [12]
    return [torch.randn(layers, batch, w, generator=generator) for w in widths]


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn", "rnn_relu", "lstm_proj"])
@pytest.mark.parametrize("kw", [dict(num_layers=2), dict(bidirectional=True, batch_first=True),
                                dict(bias=False), dict(num_layers=2, bidirectional=True,
                                                       dropout=0.5)])
def test_layers_match_the_cpu_with_every_gradient(kind, kw):
    kind, kw = _variant(kind, kw)
    cpu, dev = _pair(kind, **kw)
    dev.eval(), cpu.eval()  # (dropout between layers: off in eval, on the whole-sequence path)
    layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 7, 5, generator=g)  # 7 steps (or a batch of 7 with batch_first)
    batch = 4 if kw.get("batch_first") else 7
    states = _states(kind, kw, layers, batch, g)
    launches = core.kernels_launched
    ours = _run(dev, x, states)
    launches = core.kernels_launched - launches
    want = _run(cpu, x, states)
    _close(ours[0], want[0])
    _close(ours[1], want[1])
    assert launches < 40 * layers  # not a cell and two matmuls per step and direction


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn", "lstm_proj"])
def test_the_whole_sequence_is_the_per_step_path_up_to_sum_order(kind, monkeypatch):
    kind, kw = _variant(kind, dict(num_layers=2))
    cpu, dev = _pair(kind, **kw)
    x = torch.randn(9, 3, 5)
    states = _states(kind, kw, 2, 3)
    whole = _run(dev, x, states)
    dev.zero_grad()
    monkeypatch.setattr(rnn_layers, "WHOLE_SEQUENCE", False)
    per_step = _run(dev, x, states)
    for a, b in zip(whole[0], per_step[0]):  # forward: the same fp32 operations
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=2e-6, atol=1e-7)
    _close(whole[1], [g.cpu() for g in per_step[1]])


def test_what_it_does_not_cover_runs_step_by_step_and_matches_the_cpu():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 2, 5, generator=g)
    cpu, dev = (m.bfloat16() for m in _pair("lstm", proj_size=4))  # 16-bit: rounds per op
    states = [torch.randn(1, 2, 4, generator=g), torch.randn(1, 2, 12, generator=g)]
    ours, want = (_run(m, x.bfloat16(), [s.bfloat16() for s in states]) for m in (dev, cpu))
    _close(ours[0] + ours[1], want[0] + want[1])
    cpu, dev = _pair("gru", num_layers=2, dropout=0.5)  # dropout while training
    torch.manual_seed(5)
    out, _ = dev(x.to(NEURON))
    assert out.shape == (6, 2, 12) and torch.isfinite(out.cpu()).all()
    with torch.autocast("neuron", dtype=torch.bfloat16):  # 16-bit cells, as the CPU's
        out, _ = dev.eval()(x.to(NEURON))
    assert torch.isfinite(out.cpu()).all()


def test_updating_the_output_in_place_breaks_backward_as_on_the_cpu():
    for layer in _pair("lstm"):  # the CPU's oneDNN layer saves its output too
        out, _ = layer(torch.randn(5, 2, 5).to(next(layer.parameters()).device))
        out.add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
    grads, x = [], torch.randn(5, 2, 5)
    for layer in _pair("lstm", proj_size=4):  # the CPU's native layer, which runs
        out, _ = layer(x.to(next(layer.parameters()).device))  # projections, does not
        out.add_(1.0)
        out.sum().backward()
        grads.append([p.grad.cpu() for p in layer.parameters()])
    _close(grads[1], grads[0])


def test_inference_and_adaptive_eager():
    cpu, dev = _pair("gru", num_layers=2, bidirectional=True)
    x = torch.randn(6, 3, 5)
    with torch.no_grad():
        want, _ = cpu(x)
        ours, _ = dev(x.to(NEURON))
    _close([ours], [want])
    with neuron_eager.adaptive_eager():
        y = x.to(NEURON) * 2  # pending when the layer reads it
        ours, h = dev(y)
        (ours.sum() + h.sum()).backward()
    want, h = cpu(x * 2)
    (want.sum() + h.sum()).backward()
    _close([ours, *(p.grad for p in dev.parameters())], [want, *(p.grad for p in cpu.parameters())])


def test_unbatched_and_empty_inputs_as_on_the_cpu():
    cpu, dev = _pair("lstm", num_layers=2)
    x = torch.randn(6, 5)  # unbatched: nn.LSTM adds the batch dim
    want, (h, c) = cpu(x)
    ours, (dh, dc) = dev(x.to(NEURON))
    _close([ours, dh, dc], [want, h, c])
    empty_batch = torch.randn(3, 0, 5)
    want, (h, _) = cpu(empty_batch)
    ours, (dh, _) = dev(empty_batch.to(NEURON))
    assert ours.shape == want.shape and dh.shape == h.shape
    with pytest.raises(RuntimeError, match="Expected sequence length to be larger than 0"):
        dev(torch.randn(0, 2, 5, device=NEURON))


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn", "lstm_proj"])
def test_packed_sequences_run_whole_with_every_gradient(kind):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    kind, kw = _variant(kind, dict(num_layers=2, bidirectional=True, batch_first=True))
    cpu, dev = _pair(kind, **kw)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 7, 5, generator=g)
    lengths = torch.tensor([3, 7, 1, 5])  # unsorted: packing sorts, the states come back
    states = _states(kind, kw, 4, 4, g)
    results = []
    for layer in (cpu, dev):
        device = next(layer.parameters()).device
        xs = x.to(device).detach().requires_grad_()  # (a leaf on each device)
        hs = [s.to(device).detach().requires_grad_() for s in states]
        packed = pack_padded_sequence(xs, lengths, batch_first=True, enforce_sorted=False)
        launches = core.kernels_launched
        out, last = layer(packed, tuple(hs) if kind == "lstm" else hs[0])
        launches = core.kernels_launched - launches
        padded, _ = pad_packed_sequence(out, batch_first=True)
        last = last if isinstance(last, tuple) else (last,)
        (padded.square().sum() + sum((s * (k + 2)).sum() for k, s in enumerate(last))).backward()
        if device.type == "neuron":
            assert launches < 40  # forward: not a cell per step and direction (~100)
        results.append([padded, *last, xs.grad, *(h.grad for h in hs),
                        *(p.grad for p in layer.parameters())])
    _close(results[1], results[0])


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_a_second_derivative_raises_whichever_way_it_is_taken(kind):
    """Note [No second derivative]: a gradient penalty through a layer raises, by backward or
    by autograd.grad toward the input or weights (a sweep found the penalty on the gradient
    of out.sum() silently disconnected: its gradients None); first-order values stay the
    CPU's."""
    torch.manual_seed(0)
    layer = getattr(torch.nn, kind)(3, 4, batch_first=True)
    x_cpu = torch.randn(2, 5, 3, requires_grad=True)
    expected, = torch.autograd.grad(layer(x_cpu)[0].sum(), x_cpu)
    layer.to(NEURON)
    for second in ("backward", "grad"):
        x = x_cpu.detach().to(NEURON).requires_grad_()
        g, = torch.autograd.grad(layer(x)[0].sum(), x, create_graph=True)
        torch.testing.assert_close(g.detach().cpu(), expected)
        penalty = g.pow(2).sum()
        with pytest.raises(RuntimeError, match="second derivative through nn.LSTM"):
            if second == "backward":
                penalty.backward()
            else:
                torch.autograd.grad(penalty, [x, *layer.parameters()], allow_unused=True)


def _two_layers_by_hand(layer, x, p):
    """`layer` (2 layers, dropout p) as two 1-layer copies with F.dropout between them."""
    first, second = (getattr(torch.nn, type(layer).__name__)(
        layer.input_size if i == 0 else layer.hidden_size * (2 if layer.bidirectional else 1),
        layer.hidden_size, num_layers=1, bidirectional=layer.bidirectional)
        .to(next(layer.parameters()).dtype).to(NEURON) for i in range(2))
    state = layer.state_dict()
    for i, half in enumerate((first, second)):
        half.load_state_dict({k.replace(f"_l{i}", "_l0"): v for k, v in state.items()
                              if f"_l{i}" in k})
    hidden = first(x)[0]
    if isinstance(hidden, torch.nn.utils.rnn.PackedSequence):
        dropped = torch.nn.functional.dropout(hidden.data, p, True)
        return second(hidden._replace(data=dropped))[0]
    return second(torch.nn.functional.dropout(hidden, p, True))[0]


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("case", ["fp32", "bf16 (per step)", "bidirectional", "packed"])
def test_dropout_between_layers_is_applied_while_training(kind, case):
    """Note [Dropout between layers]: PyTorch's decomposition never applies it (a sweep
    found nn.LSTM(dropout=0.5) training without it); each path now does, with the masks a
    1-layer stack with F.dropout between draws."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if case.startswith("bf16") else torch.float32
    layer = getattr(torch.nn, kind)(5, 12, num_layers=2, dropout=0.5,
                                    bidirectional=case == "bidirectional").to(dtype).to(NEURON)
    x = torch.randn(9, 4, 5).to(dtype).to(NEURON)
    if case == "packed":
        x = torch.nn.utils.rnn.pack_padded_sequence(x, [9, 7, 7, 2])
    out = (lambda y: y.data if case == "packed" else y)
    layer.eval()
    without = out(layer(x)[0]).cpu()
    layer.train()
    torch.neuron.manual_seed(3)
    trained = out(layer(x)[0]).cpu()
    torch.neuron.manual_seed(3)
    by_hand = out(_two_layers_by_hand(layer, x, 0.5)).cpu()
    assert not torch.equal(trained, without)
    assert torch.equal(trained, by_hand)


@pytest.mark.parametrize("kind", ["lstm", "lstm_proj", "gru"])
def test_training_steps_free_their_memory_without_the_garbage_collector(kind):
    """The layer's node holds its buffers, never its own output (that would be a cycle
    that only the garbage collector breaks)."""
    import gc

    kind, kw = _variant(kind)
    _, layer = _pair(kind, num_layers=2, **kw)
    x = torch.randn(6, 3, 5).to(NEURON)

    def step():
        out, _ = layer(x)
        out.sum().backward()
        layer.zero_grad(set_to_none=True)

    gc.collect()
    gc.disable()
    try:
        step()
        step()
        before = torch.neuron.memory_allocated()
        for _ in range(3):
            step()
        assert torch.neuron.memory_allocated() == before
    finally:
        gc.enable()
