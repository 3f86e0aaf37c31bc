"""nn.LSTM, nn.GRU and nn.RNN training steps: whole-sequence kernels vs per-step cells vs torch CPU.

    python benchmarks/recurrent.py [--repeat 7] [--steps 50] [--batch 16]

Each row is one forward + backward of a recurrent layer stack (input 64, hidden 128),
median of `--repeat` runs after three warm-ups, the three sides in one run: the CPU, neuron
with the per-step decomposition (ops/rnn_layers.WHOLE_SEQUENCE off: a cell and two matmuls
a step, as before 2026-12-06) and neuron with the whole-sequence kernels
(Note [Whole-sequence RNN layers]). Also the kernel launches per run on neuron.
"""
from __future__ import annotations

import argparse

import torch

import neuron_eager  # noqa: F401
from neuron_eager.device_sim import core
from large_kernels import median_ms  # (benchmarks/ is on the path of a script run here)
from neuron_eager.ops import rnn_layers

CONFIGS = [("LSTM", dict(num_layers=2)), ("LSTM", dict(num_layers=2, dropout=0.2)),
           ("LSTM", dict(num_layers=1, bidirectional=True)),
           ("GRU", dict(num_layers=2)), ("RNN", dict(num_layers=2, nonlinearity="relu"))]


def _step(model, x):
    out, _ = model(x)
    out.float().pow(2).mean().backward()
    if x.device.type == "neuron":
        torch.neuron.synchronize()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--steps", type=int, default=50, help="sequence length")
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args(argv)
    print(f"forward + backward, sequence {args.steps}, batch {args.batch}, input 64, "
          f"hidden 128; ms (median of {args.repeat})")
    print(f"{'layer':38s}{'cpu':>9s}{'per step':>10s}{'whole':>9s}{'whole/cpu':>11s}"
          f"{'per step/whole':>16s}{'launches':>16s}")
    for name, kw in CONFIGS:
        torch.manual_seed(0)
        cpu = getattr(torch.nn, name)(64, 128, **kw)
        dev = getattr(torch.nn, name)(64, 128, **kw).to("neuron")
        dev.load_state_dict(cpu.state_dict())
        x_cpu = torch.randn(args.steps, args.batch, 64)
        x_dev = x_cpu.to("neuron")
        t_cpu = median_ms(lambda: _step(cpu, x_cpu), args.repeat)
        times, launches = {}, {}
        for whole in (False, True):
            rnn_layers.WHOLE_SEQUENCE = whole
            times[whole] = median_ms(lambda: _step(dev, x_dev), args.repeat)
            before = core.kernels_launched
            _step(dev, x_dev)
            launches[whole] = core.kernels_launched - before
        rnn_layers.WHOLE_SEQUENCE = True
        label = f"{name} " + ", ".join(f"{k}={v}" for k, v in kw.items())
        print(f"{label:38s}{t_cpu:9.2f}{times[False]:10.2f}{times[True]:9.2f}"
              f"{times[True] / t_cpu:10.2f}x{times[False] / times[True]:15.1f}x"
              f"{launches[False]:8d}{launches[True]:8d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
