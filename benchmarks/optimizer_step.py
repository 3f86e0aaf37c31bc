"""An optimizer step and clip_grad_norm_ over many parameters: address tables vs one kernel
call per tensor vs torch CPU.

    python benchmarks/optimizer_step.py [--repeat 21] [--layers 12] [--width 64]

The parameters are a GPT-2-style stack's (per layer: two LayerNorms, attention and MLP
weights and biases), so the foreach ops run over lists of 12 * layers + 2 tensors of mixed
sizes; from width 256 the MLP matrices have 256K elements or more and run their own loops
beside the table (Note [Large tensors in a table]). Rows: AdamW's foreach step (weight decay on matrices, two param groups, as
nanoGPT configures it), clip_grad_norm_(1.0) with foreach, and both. Sides, in one run:
torch CPU; neuron plain eager with each foreach op calling the per-tensor kernel once per
tensor (multitensor's table path off: the code before 2026-12-07's fifth session); neuron
plain eager with address tables (Note [Address tables] in ops/multitensor.py). Median
milliseconds of `--repeat` steps after three warm-ups, each neuron step synchronized.
"""
from __future__ import annotations

import argparse

import torch

import neuron_eager  # noqa: F401
from large_kernels import median_ms  # (benchmarks/ is on the path of a script run here)
from neuron_eager.ops import folds, multitensor


def _parameters(layers: int, width: int, device) -> list[torch.Tensor]:
    shapes = [(width,), (width,), (3 * width, width), (3 * width,), (width, width), (width,),
              (width,), (width,), (4 * width, width), (4 * width,), (width, 4 * width),
              (width,)] * layers + [(width,), (width,)]
    gen = torch.Generator().manual_seed(0)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.02).to(device))
        p.grad = (torch.randn(shape, generator=gen) * 0.01).to(device)
        params.append(p)
    return params


def _steps(params):
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-3, foreach=True)
    sync = torch.neuron.synchronize if params[0].device.type == "neuron" else (lambda: None)

    def clip():
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        sync()

    def adamw():
        opt.step()
        sync()

    def both():
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        sync()

    return {"AdamW step": adamw, "clip_grad_norm_": clip, "clip + AdamW": both}


class _PerTensor:
    """multitensor's table path off, for the 'per tensor' side."""

    def __enter__(self):
        self.saved = multitensor._run_table, folds.norms_of
        multitensor._run_table = lambda *args: None
        folds.norms_of = lambda *args: None

    def __exit__(self, *exc):
        multitensor._run_table, folds.norms_of = self.saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args(argv)
    n = len(_parameters(args.layers, args.width, "cpu"))
    print(f"{n} parameter tensors ({args.layers} layers, width {args.width}); median ms of "
          f"{args.repeat} steps")
    print(f"{'step':18s}{'torch CPU':>11s}{'per tensor':>12s}{'tables':>9s}"
          f"{'tables vs per tensor':>23s}{'tables vs CPU':>15s}")
    cpu = _steps(_parameters(args.layers, args.width, "cpu"))
    per_tensor = _steps(_parameters(args.layers, args.width, "neuron"))
    tables = _steps(_parameters(args.layers, args.width, "neuron"))
    for name in cpu:
        c = median_ms(cpu[name], args.repeat)
        with _PerTensor():
            p = median_ms(per_tensor[name], args.repeat)
        t = median_ms(tables[name], args.repeat)
        print(f"{name:18s}{c:11.2f}{p:12.2f}{t:9.2f}{t / p:22.2f}x{t / c:14.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
