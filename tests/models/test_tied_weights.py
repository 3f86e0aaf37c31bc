"""Weight tying survives Module.to (Note [Parameters keep their identity] in
ops/_compat_modules.py)."""
import pytest
import torch

import neuron_eager

N = torch.device("neuron")


class TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.mix = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight  # GPT-2 style


def _train(device, steps=3):
    torch.manual_seed(0)
    model = TiedLM()
    original = model.emb.weight
    model.to(device)
    assert model.head.weight is model.emb.weight is original  # kept, as on CUDA
    assert len(list(model.parameters())) == 3  # the tied weight once
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    tokens = torch.randint(0, 11, (4, 5)).to(device)
    losses = []
    for _ in range(steps):
        logits = model.head(torch.tanh(model.mix(model.emb(tokens))))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), tokens.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model


def test_tied_weights_train_like_the_cpu():
    ours, model = _train(N)
    cpu, cpu_model = _train("cpu")
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(cpu), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.emb.weight.detach().cpu(), cpu_model.emb.weight.detach(),
                               rtol=1e-5, atol=1e-6)


def test_dtype_changes_keep_the_tie():
    model = TiedLM().to(N)
    model.to(torch.bfloat16)
    assert model.head.weight is model.emb.weight
    assert model.emb.weight.dtype == torch.bfloat16 and model.emb.weight.device.type == "neuron"
    model.float()
    assert model.head.weight is model.emb.weight and model.emb.weight.dtype == torch.float32


def test_back_to_the_cpu_keeps_the_tie_and_held_tensors_do_not_block_moves():
    model = TiedLM()
    out = model.head(model.emb(torch.tensor([1, 2])))  # a graph holding the CPU weights
    model.to(N)
    model.cpu()
    assert model.head.weight is model.emb.weight and model.emb.weight.device.type == "cpu"
    lstm = torch.nn.LSTM(4, 3)  # keeps weak references to its weights
    lstm.to(N)
    assert all(p.device.type == "neuron" for p in lstm.parameters())
    out.sum().backward()  # the CPU graph still works


def test_an_optimizer_made_before_the_move_trains_the_moved_model():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    weight = model.weight
    model.to(N)
    assert model.weight is weight and weight.device.type == "neuron"
    before = model.weight.detach().cpu().clone()
    model(torch.randn(3, 4, device=N)).sum().backward()
    opt.step()
    assert not torch.equal(model.weight.detach().cpu(), before)


def test_other_devices_conversions_are_left_to_torch():
    model = TiedLM()
    weight = model.emb.weight
    model.to("meta")  # torch gives new Parameters here; nothing neuron is involved
    assert model.emb.weight is not weight and weight.device.type == "cpu"


def test_a_parameter_held_by_a_saved_graph_moves_with_a_warning():
    lstm = torch.nn.LSTM(4, 3)
    out, _ = lstm(torch.randn(2, 1, 4))  # the graph holds the CPU weights
    neuron_eager.ops._compat_modules._identity_warned = False
    with pytest.warns(UserWarning, match="build optimizers after moving the model"):
        lstm.to(N)
    assert all(p.device.type == "neuron" for p in lstm.parameters())
    out.sum().backward()  # the CPU graph still works on the old tensors


def test_a_model_profiled_on_the_cpu_moves_and_runs():
    # a profiler that recorded shapes holds the C++ tensors: torch refuses the swap after
    # swapping the Python halves, which must be put back (the moved Linear was unusable)
    lin = torch.nn.Linear(8, 8)
    with torch.profiler.profile(record_shapes=True):
        lin(torch.randn(2, 8))
    neuron_eager.ops._compat_modules._identity_warned = False
    with pytest.warns(UserWarning, match="build optimizers after moving the model"):
        lin.to(N)
    x = torch.randn(2, 8)
    torch.testing.assert_close(lin(x.to(N)).cpu(), lin.cpu()(x))
