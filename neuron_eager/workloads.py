"""Built-in workloads: elementwise chains and training steps written as research code writes
them (math spelled out, nanoGPT-style modules), shared by benchmarks/adaptive_eager.py and
the tests. Each registered (name, size) builds everything on a device from fixed seeds, so
two builds run the same bits; it never touches the global RNGs.

>>> from neuron_eager import workloads
>>> step = workloads.get("gelu", "1K").make("neuron")
>>> step().shape
torch.Size([1024])
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


class Step:
    """One step of a workload: `step()` runs it and returns the tensor to read (the output
    or the loss); `step.state()` lists the tensors the steps update (parameters, optimizer
    moments), for comparing runs bit for bit. Chains update nothing: state() is []."""

    def __init__(self, run: Callable[[], torch.Tensor],
                 state: Callable[[], list[torch.Tensor]] = list):
        self._run, self.state = run, state

    def __call__(self) -> torch.Tensor:
        return self._run()


@dataclass(frozen=True)
class Workload:
    name: str
    size: str  # "1K"/"1M" for chains, "small"/"medium" for models
    kind: str  # "chain" or "training"
    make: Callable[[torch.device | str], Step]


WORKLOADS: dict[tuple[str, str], Workload] = {}


def workload(name: str, kind: str, sizes: dict[str, dict]):
    """Register `builder(device, **params)` under `name` once per size: `sizes` maps each
    size label to its params."""

    def register(builder):
        for size, params in sizes.items():
            key = (name, size)
            if key in WORKLOADS:
                raise ValueError(f"workload {key} registered twice")
            WORKLOADS[key] = Workload(key[0], key[1], kind,
                                      lambda device, p=params: builder(torch.device(device), **p))
        return builder

    return register


def get(name: str, size: str) -> Workload:
    try:
        return WORKLOADS[(name, size)]
    except KeyError:
        raise KeyError(f"no workload {name!r} of size {size!r}; known: "
                       f"{sorted(WORKLOADS)}") from None


def names() -> list[str]:
    return list(dict.fromkeys(name for name, _ in WORKLOADS))


def _randn(*shape, seed: int, device, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """Seeded normal values, made on the CPU: building records nothing in adaptive eager."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + shift).to(device)


# -- elementwise chains -----------------------------------------------------------------------
def new_gelu(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU (minGPT/nanoGPT's NewGELU), spelled out."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5):
    """LayerNorm over the last dim, spelled out (biased variance, as F.layer_norm)."""
    mean = x.mean(-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(-1, keepdim=True)
    return xc / torch.sqrt(var + eps) * w + b


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim, spelled out (max-subtracted)."""
    m = x.amax(-1, keepdim=True)
    e = (x - m).exp()
    return e / e.sum(-1, keepdim=True)


@workload("gelu", "chain", {"1K": dict(shape=(1024,)), "1M": dict(shape=(1024 * 1024,))})
def _gelu(device, shape):
    x = _randn(*shape, seed=1, device=device)
    return Step(lambda: new_gelu(x))


@workload("layernorm", "chain", {"1K": dict(rows=1), "1M": dict(rows=1024)})
def _layernorm(device, rows, cols=1024):
    x = _randn(rows, cols, seed=2, device=device, scale=2.0)
    w = _randn(cols, seed=3, device=device, scale=0.1, shift=1.0)
    b = _randn(cols, seed=4, device=device, scale=0.1)
    return Step(lambda: layer_norm(x, w, b))


@workload("softmax", "chain", {"1K": dict(rows=1), "1M": dict(rows=1024)})
def _softmax(device, rows, cols=1024):
    x = _randn(rows, cols, seed=5, device=device, scale=3.0)
    return Step(lambda: softmax(x))


# 1K: 1,024 elements in all; 1M: 1,050,624 (a weight, a bias, another weight, a bias)
_ADAMW_1K = [(16, 48), (48,), (4, 48), (16,)]
_ADAMW_1M = [(768, 1024), (1024,), (256, 1024), (1024,)]


@workload("adamw", "chain", {"1K": dict(shapes=_ADAMW_1K), "1M": dict(shapes=_ADAMW_1M)})
def _adamw(device, shapes, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """AdamW as hand-written optimizers spell it (torch's single-tensor AdamW before lerp):
    in-place updates of the parameters and both moments, gradients fixed."""
    params = [_randn(*s, seed=10 + k, device=device) for k, s in enumerate(shapes)]
    grads = [_randn(*s, seed=20 + k, device=device, scale=0.01) for k, s in enumerate(shapes)]
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    b1, b2 = betas
    t = [0]

    def run():
        t[0] += 1
        bias_correction1 = 1 - b1 ** t[0]
        bias_correction2 = 1 - b2 ** t[0]
        step_size = lr / bias_correction1
        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            p.mul_(1 - lr * weight_decay)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / math.sqrt(bias_correction2)).add_(eps)
            p.addcdiv_(m, denom, value=-step_size)
        return params[0]

    return Step(run, lambda: params + exp_avgs + exp_avg_sqs)


# -- training steps ---------------------------------------------------------------------------
def _init(module: nn.Module, seed: int) -> None:
    """GPT-2's init (normal(0, 0.02) weights, zero biases, unit norm scales) from a private
    generator, so building a model leaves torch's global RNG alone."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def _train_step(model: nn.Module, optimizer, batch, loss_fn) -> Step:
    def run():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, *batch)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def state():
        moments = [v for s in optimizer.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor) and v.dim() > 0]
        return list(model.parameters()) + moments

    return Step(run, state)


@workload("mlp", "training", {"small": dict(batch=32, features=64, hidden=256, classes=10),
                              "medium": dict(batch=128, features=256, hidden=1024, classes=10)})
def _mlp(device, batch, features, hidden, classes):
    model = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, classes))
    _init(model, seed=30)
    model.to(device)
    x = _randn(batch, features, seed=31, device=device)
    y = (torch.arange(batch) % classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return _train_step(model, optimizer, (x, y), lambda m, x, y: F.cross_entropy(m(x), y))


class NewGELU(nn.Module):
    def forward(self, x):
        return new_gelu(x)


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm: F.layer_norm with an optional bias."""

    def __init__(self, ndim: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention without flash: explicit q@k^T * scale, masked_fill, softmax, @v."""

    def __init__(self, n_embd: int, n_head: int, block_size: int):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", mask)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = NewGELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """A nanoGPT model (token and position embeddings, blocks, final LayerNorm, tied head)."""

    def __init__(self, vocab: int, block_size: int, n_layer: int, n_head: int, n_embd: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, block_size) for _ in range(n_layer))
        self.ln_f = LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as nanoGPT

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@workload("transformer", "training", {
    "small": dict(batch=2, block=32, n_embd=64, n_head=4, n_layer=1, vocab=128),
    "medium": dict(batch=4, block=64, n_embd=128, n_head=4, n_layer=2, vocab=256)})
def _transformer(device, batch, block, n_embd, n_head, n_layer, vocab):
    model = GPT(vocab, block, n_layer, n_head, n_embd)
    _init(model, seed=40)
    model.to(device)
    g = torch.Generator().manual_seed(41)
    tokens = torch.randint(0, vocab, (batch, block + 1), generator=g)
    idx, targets = tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)
    # nanoGPT's optimizer: AdamW, decay on matrices only (the default, foreach, implementation)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=6e-4, betas=(0.9, 0.95))
    return _train_step(model, optimizer, (idx, targets), lambda m, i, t: m(i, t))
