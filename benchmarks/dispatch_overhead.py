"""Per-op cost of a 64-element float32 add: torch CPU, a bare pass-through wrapper
subclass, and neuron plain eager, side by side in one run (medians of repeated blocks).

    python benchmarks/dispatch_overhead.py [--n 64] [--reps 20000]

Target (issue: the `neuron` device): neuron at most 1.5x the bare wrapper.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import neuron_eager


class PassThrough(torch.Tensor):
    """The cheapest honest wrapper subclass: unwrap, run the CPU op, wrap."""

    @staticmethod
    def __new__(cls, inner):
        t = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                dtype=inner.dtype, device=inner.device)
        t.inner = inner
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args = [a.inner if type(a) is cls else a for a in args]
        out = func(*args, **(kwargs or {}))
        return cls(out) if isinstance(out, torch.Tensor) else out


def per_op_us(fn, reps: int, blocks: int = 7) -> float:
    for _ in range(200):
        fn()
    times = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--reps", type=int, default=20000)
    args = parser.parse_args()
    a, b = torch.randn(args.n), torch.randn(args.n)
    wa, wb = PassThrough(a), PassThrough(b)
    na, nb = a.to("neuron"), b.to("neuron")
    assert torch.equal((na + nb).cpu(), a + b)
    launched = neuron_eager.device_sim.core.kernels_launched
    rows = [("torch CPU", per_op_us(lambda: a + b, args.reps)),
            ("bare wrapper subclass", per_op_us(lambda: wa + wb, args.reps)),
            ("neuron plain eager", per_op_us(lambda: na + nb, args.reps))]
    assert neuron_eager.device_sim.core.kernels_launched > launched
    bare = rows[1][1]
    print(f"{args.n}-element float32 add, us per op (median of 7 blocks of {args.reps})")
    print(f"{'path':<24}{'us/op':>8}{'vs bare':>9}")
    for name, us in rows:
        print(f"{name:<24}{us:>8.2f}{us / bare:>8.2f}x")


if __name__ == "__main__":
    main()
