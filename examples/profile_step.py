"""Profile one training step on the simulated NeuronCore: a Chrome trace with the device
timeline (open it in https://ui.perfetto.dev) and the metrics tables.

    python examples/profile_step.py [--out profile_out]
"""
from __future__ import annotations

import argparse
import os

import torch

import neuron_eager
from neuron_eager import profiler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="profile_out")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 10)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(64, 256, device="neuron")
    target = torch.randint(0, 10, (64,), device="neuron")

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        return loss

    step()  # compile the kernels before profiling
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    with torch.profiler.profile(record_shapes=True) as prof:
        start.record()
        step()
        end.record()
    end.synchronize()
    os.makedirs(args.out, exist_ok=True)
    trace = os.path.join(args.out, "trace.json")
    prof.export_chrome_trace(trace)
    tables = profiler.export_metrics(os.path.join(args.out, "metrics"), prof)
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12))
    print(f"simulated step time on {neuron_eager.device_sim.core.spec.name}: "
          f"{start.elapsed_time(end):.3f} ms")
    print(f"trace: {trace}")
    for name, path in tables.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
