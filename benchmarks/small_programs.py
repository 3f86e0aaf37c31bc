"""Small research programs, plain against adaptive eager, in one run: where recording pays.

    python benchmarks/small_programs.py [NAME ...] [--rounds 10]

Each program is built once per mode (same seed), warmed up for 6 steps, then stepped in
turn, plain and adaptive, `--rounds` times; the table gives each mode's median host time per
step, their ratio, and whether every step's result was the same in both modes. The tensors
are small (a few thousand elements), where recording an op costs about what running it
does: adaptive eager's gains here are in launches and device time, not host time.
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from neuron_eager import adaptive

N = "neuron"


def mlp_adamw():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                      nn.Linear(256, 10)).to(N)
    opt = torch.optim.AdamW(m.parameters(), 1e-3)
    x, y = torch.randn(32, 64).to(N), torch.randint(0, 10, (32,)).to(N)
    def step():
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step

def grad_accum():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(N)
    opt = torch.optim.SGD(m.parameters(), 0.1, momentum=0.9)
    xs = [torch.randn(16, 64).to(N) for _ in range(4)]; y = torch.randint(0, 10, (16,)).to(N)
    def step():
        for x in xs:
            (F.cross_entropy(m(x), y) / 4).backward()
        opt.step(); opt.zero_grad()
        return m[0].weight.sum().item()
    return step

def cnn():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(N)
    opt = torch.optim.SGD(m.parameters(), 0.01)
    x, y = torch.randn(8, 3, 16, 16).to(N), torch.randint(0, 10, (8,)).to(N)
    def step():
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step

def lstm():
    torch.manual_seed(0)
    m = nn.LSTM(32, 64, batch_first=True).to(N); head = nn.Linear(64, 1).to(N)
    opt = torch.optim.Adam(list(m.parameters()) + list(head.parameters()), 1e-3)
    x, y = torch.randn(4, 12, 32).to(N), torch.randn(4, 1).to(N)
    def step():
        opt.zero_grad()
        out, _ = m(x)
        loss = F.mse_loss(head(out[:, -1]), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step

def varlen():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).to(N)
    opt = torch.optim.Adam(layer.parameters(), 1e-3)
    lens = [7, 9, 12, 16, 5]; xs = [torch.randn(2, L, 64).to(N) for L in lens]; i = [0]
    def step():
        x = xs[i[0] % len(xs)]; i[0] += 1
        opt.zero_grad()
        loss = layer(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.item()
    return step

def sgd_nosync():
    torch.manual_seed(0)
    ws = [torch.randn(256, 256).to(N) for _ in range(4)]
    gs = [torch.randn(256, 256).to(N) * 0.01 for _ in range(4)]
    bufs = [torch.zeros_like(w) for w in ws]
    def step():
        for _ in range(5):
            for w, g, b in zip(ws, gs, bufs):
                b.mul_(0.9).add_(g); w.add_(b, alpha=-0.01)
        return ws[0][0, 0].item()
    return step

def focal():
    torch.manual_seed(0)
    logits = torch.randn(256, 20).to(N); target = torch.randint(0, 20, (256,)).to(N)
    def step():
        logp = F.log_softmax(logits, -1); p = logp.exp()
        oh = F.one_hot(target, 20).float()
        loss = -(oh * (1 - p) ** 2 * logp).sum(-1).mean()
        return loss.item()
    return step

def infer_print():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(128, 512), nn.SiLU(), nn.Linear(512, 128),
                      nn.LayerNorm(128)).to(N).eval()
    x = torch.randn(16, 128).to(N)
    def step():
        with torch.no_grad():
            for _ in range(10):
                x2 = m(x)
            return x2.mean().item()
    return step

def causal_attn():
    torch.manual_seed(0)
    B, H, T, D = 2, 4, 32, 16
    q, k, v = (torch.randn(B, H, T, D).to(N).requires_grad_() for _ in range(3))
    mask = torch.tril(torch.ones(T, T)).to(N)
    def step():
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(mask == 0, float("-inf")).softmax(-1)
        out = att @ v; loss = out.square().mean(); loss.backward()
        for t in (q, k, v): t.grad = None
        return loss.item()
    return step

def many_norms():
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.LayerNorm(32) for _ in range(30)]).to(N)
    opt = torch.optim.AdamW(m.parameters(), 1e-3)
    x = torch.randn(8, 32).to(N)
    def step():
        opt.zero_grad(); loss = m(x).sum(); loss.backward(); opt.step(); return loss.item()
    return step

def rmsnorm_chain():
    torch.manual_seed(0)
    x = torch.randn(64, 512).to(N); w = torch.randn(512).to(N)
    def step():
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        y = F.silu(y) * y
        return y.sum().item()
    return step

PROGRAMS = dict(mlp_adamw=mlp_adamw, grad_accum=grad_accum, cnn=cnn, lstm=lstm, varlen=varlen,
                sgd_nosync=sgd_nosync, focal=focal, infer_print=infer_print,
                causal_attn=causal_attn, many_norms=many_norms, rmsnorm_chain=rmsnorm_chain)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"programs to run (default: all): {', '.join(PROGRAMS)}")
    parser.add_argument("--rounds", type=int, default=10, help="measured steps per mode")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in PROGRAMS]
    if unknown:
        parser.error(f"unknown program(s) {', '.join(unknown)}; known: {', '.join(PROGRAMS)}")
    print(f"{'program':14s} {'plain ms':>9s} {'adapt ms':>9s} {'ratio':>6s}  results")
    for name in args.names or PROGRAMS:
        steps, values = {}, {}
        for mode in (False, True):
            with adaptive.adaptive_eager(mode):
                steps[mode] = PROGRAMS[name]()
                values[mode] = [steps[mode]() for _ in range(6)]
        times = {False: [], True: []}
        for _ in range(args.rounds):
            for mode in (False, True):
                with adaptive.adaptive_eager(mode):
                    start = time.perf_counter()
                    values[mode].append(steps[mode]())
                    times[mode].append(time.perf_counter() - start)
        plain, fused = (np.median(times[m]) * 1e3 for m in (False, True))
        same = "same" if values[False] == values[True] else "DIFFERENT"
        print(f"{name:14s} {plain:9.2f} {fused:9.2f} {fused / plain:5.2f}x  {same}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
