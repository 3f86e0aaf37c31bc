"""Train a small MLP on the simulated NeuronCore: the CPU training loop, with `.to('neuron')`.

    python examples/train_mlp.py [--steps 20] [--batch 64] [--compare-cpu]

Prints the loss per step, the kernels the device launched, and peak HBM. With
--compare-cpu it runs the same loop on the CPU and prints the largest loss difference.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import neuron_eager
from neuron_eager.device_sim import core


def make_data(n: int, features: int, classes: int, seed: int = 0):
    """A synthetic classification task: labels from a fixed random linear teacher."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def make_model(features: int, hidden: int, classes: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, classes))


def train(device: str, steps: int, batch: int, log: bool) -> list[float]:
    x, y = make_data(steps * batch, 32, 10)
    model = make_model(32, 128, 10).to(device)  # the only change a script needs
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    criterion = nn.CrossEntropyLoss()
    losses, times = [], []
    for step in range(steps):
        start = time.perf_counter()
        inputs = x[step * batch:(step + 1) * batch].to(device)
        targets = y[step * batch:(step + 1) * batch].to(device)
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
        if log:
            print(f"step {step:3d}  loss {losses[-1]:.4f}  {times[-1] * 1e3:8.1f} ms")
    if log and steps > 1:
        later = sorted(times[1:])[len(times[1:]) // 2]
        print(f"\nfirst step {times[0]:.2f} s (compiling the kernels, or loading them from "
              f"the disk cache), "
              f"later steps {later * 1e3:.1f} ms (median)")
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--compare-cpu", action="store_true")
    args = parser.parse_args()

    torch.neuron.reset_peak_memory_stats()
    core.reset_counters()
    neuron_eager.clear_op_tracking()
    losses = train("neuron", args.steps, args.batch, log=True)
    fallbacks = neuron_eager.get_fallback_ops()
    print(f"device: {torch.neuron.get_device_name()}")
    print(f"kernels launched: {core.kernels_launched} "
          f"({core.kernels_launched / args.steps:.0f} per step; by engine: "
          f"{dict(sorted(core.launches_by_engine.items()))})")
    print(f"peak HBM: {torch.neuron.max_memory_allocated() / 2**20:.2f} MiB allocated, "
          f"{torch.neuron.max_memory_reserved() / 2**20:.2f} MiB reserved")
    print(f"ops that fell back to CPU: {fallbacks or 'none'}")
    cache = neuron_eager.kernel_cache_stats()
    print(f"kernels: {cache['compiled']} compiled, {cache['loaded']} loaded from the disk "
          f"cache ({cache['folder'] or 'off'})")
    if args.compare_cpu:
        cpu = train("cpu", args.steps, args.batch, log=False)
        worst = max(abs(a - b) for a, b in zip(losses, cpu))
        print(f"largest |loss(neuron) - loss(cpu)| over {args.steps} steps: {worst:.2e}")


if __name__ == "__main__":
    main()
