"""Large kernels, neuron plain eager vs torch CPU, in one run (issue 3's targets).

    python benchmarks/large_kernels.py [--repeat 9]

4M-element fp32 add, mul and GELU (target: neuron at most 1.0x torch CPU's time) and
1024x1024x1024 matmuls in fp32 and bf16 (target: at most 1.2x), the bf16 one also with
`neuron_eager.config.bf16_gemm = "cpu"`; then row kernels over a 1024 x 1024 fp32 matrix
(sums, amax, softmax, cross-entropy, LayerNorm: no target, where a transformer spends its
non-matmul time). Times are medians of
`--repeat` runs after a warm-up (compiles excluded), in `--rounds` rounds that alternate
which side goes first (this shared VM's speed drifts, and whichever side follows the other
meets its threads still spinning); the table gives the median of the rounds' medians and the
range of the rounds' ratios. Both sides use every core torch uses.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import neuron_eager  # noqa: F401

ELEMENTS = 4 * 1024 * 1024
N = 1024


def median_ms(fn, repeat: int) -> float:
    """Median of `repeat` runs after three warm-up runs (compiles, allocator blocks, and time
    for the other side's worker threads to stop spinning: the sides run apart, since
    interleaving them makes OpenMP's and BLAS's spinning threads slow each other)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def cases():
    x, y = torch.randn(ELEMENTS), torch.randn(ELEMENTS)
    yield "add 4M fp32", (lambda a, b: a + b), (x, y), 1.0
    yield "mul 4M fp32", (lambda a, b: a * b), (x, y), 1.0
    yield "gelu 4M fp32", (lambda a: F.gelu(a)), (x,), 1.0
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(N, N, dtype=dtype), torch.randn(N, N, dtype=dtype)
        yield f"matmul 1024^3 {str(dtype)[6:]}", (lambda p, q: p @ q), (a, b), 1.2
        if dtype == torch.bfloat16:
            yield "  with bf16_gemm=cpu", _cpu_bf16_gemm(lambda p, q: p @ q), (a, b), 1.2
    m, w = torch.randn(N, N), torch.randn(N)
    labels = torch.randint(0, N, (N,))
    yield "sum(-1) 1024^2", (lambda t: t.sum(-1)), (m,), None
    yield "sum(0) 1024^2", (lambda t: t.sum(0)), (m,), None
    yield "amax(-1) 1024^2", (lambda t: t.amax(-1)), (m,), None
    yield "softmax(-1) 1024^2", (lambda t: F.softmax(t, -1)), (m,), None
    yield "cross_entropy 1024^2", (lambda t, y: F.cross_entropy(t, y)), (m, labels), None
    yield "layer_norm 1024^2", (lambda t, g: F.layer_norm(t, (N,), g, g)), (m, w), None


def _cpu_bf16_gemm(fn):
    """fn under neuron_eager.config.bf16_gemm = "cpu" (torch's CPU bf16 GEMM: Note [bf16 GEMM]
    in ops/matmul.py); the CPU side ignores the setting."""
    def run(*args):
        previous, neuron_eager.config.bf16_gemm = neuron_eager.config.bf16_gemm, "cpu"
        try:
            return fn(*args)
        finally:
            neuron_eager.config.bf16_gemm = previous
    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"{'kernel':22s} {'torch CPU':>10s} {'neuron':>10s} {'ratio':>7s} {'target':>7s}"
          f"  rounds' ratios")
    for name, fn, inputs, target in cases():
        on_device = [t.to("neuron") for t in inputs]
        sides = {"cpu": lambda: fn(*inputs), "neuron": lambda: fn(*on_device)}
        times: dict = {"cpu": [], "neuron": []}
        for r in range(args.rounds):
            for side in (("cpu", "neuron") if r % 2 == 0 else ("neuron", "cpu")):
                times[side].append(median_ms(sides[side], args.repeat))
        cpu, neuron = statistics.median(times["cpu"]), statistics.median(times["neuron"])
        ratios = [n / c for n, c in zip(times["neuron"], times["cpu"])]
        ratio = neuron / cpu
        mark = "" if target is None or ratio <= target else "  (missed)"
        goal = "-" if target is None else f"{target:.1f}x"
        print(f"{name:22s} {cpu:8.2f}ms {neuron:8.2f}ms {ratio:6.2f}x {goal:>7s}"
              f"  {min(ratios):.2f}-{max(ratios):.2f}x{mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
