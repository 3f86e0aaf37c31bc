"""Unchanged PyTorch training loops: the same losses and weights on neuron as on the CPU,
with every op run by a device kernel (no CPU fallback)."""
import pytest
import torch
from torch import nn

import neuron_eager

STEPS = 4


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=1, padding=1, groups=2), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=50, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, dropout=0.0,
                                                batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.out(self.norm(self.layer(self.embed(tokens))))


def _mlp():
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(),
                         nn.Linear(64, 3))


def _batches(kind):
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        if kind == "mlp":
            yield torch.randn(16, 20, generator=g), torch.randint(0, 3, (16,), generator=g)
        elif kind == "cnn":
            yield torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 5, (4,), generator=g)
        else:
            tokens = torch.randint(0, 50, (2, 10), generator=g)
            yield tokens, torch.roll(tokens, -1, dims=1)


def _train(make, kind, device, optimizer_cls):
    torch.manual_seed(0)
    model = make().to(device)
    optimizer = optimizer_cls(model.parameters())
    criterion = nn.CrossEntropyLoss()
    losses = []
    for batch, targets in _batches(kind):
        batch, targets = batch.to(device), targets.to(device)
        optimizer.zero_grad()
        out = model(batch)
        loss = criterion(out.reshape(-1, out.shape[-1]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


# Adam-family optimizers turn rounding noise in a gradient that is zero in exact arithmetic
# (a conv bias before BatchNorm, attention's key bias) into full-size steps, so those runs
# compare losses only; SGD runs compare every weight too.
@pytest.mark.parametrize("kind,make,optimizer_cls,compare_weights", [
    ("mlp", _mlp, lambda p: torch.optim.AdamW(p, lr=1e-2), True),
    ("mlp", _mlp, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), True),
    ("cnn", SmallCNN, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), True),
    ("cnn", SmallCNN, lambda p: torch.optim.Adam(p, lr=1e-2), False),
    ("transformer", TinyTransformer, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), True),
    ("transformer", TinyTransformer, lambda p: torch.optim.AdamW(p, lr=1e-2), False),
], ids=["mlp-adamw", "mlp-sgd", "cnn-sgd", "cnn-adam", "transformer-sgd", "transformer-adamw"])
def test_training_matches_cpu(kind, make, optimizer_cls, compare_weights):
    cpu_losses, cpu_state = _train(make, kind, "cpu", optimizer_cls)
    neuron_eager.clear_op_tracking()
    dev_losses, dev_state = _train(make, kind, "neuron", optimizer_cls)
    fallbacks = neuron_eager.get_fallback_ops()
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=1e-4,
                               atol=1e-5)
    for name, value in cpu_state.items():
        if compare_weights or not value.is_floating_point():
            torch.testing.assert_close(dev_state[name], value, rtol=1e-3, atol=1e-4,
                                       msg=lambda m, name=name: f"{name}: {m}")
    assert fallbacks == {}, f"ops fell back to CPU: {fallbacks}"
