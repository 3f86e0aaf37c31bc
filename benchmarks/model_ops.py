"""Ops at the sizes models use, neuron plain eager vs torch CPU, side by side in one run.

    python benchmarks/model_ops.py [--backward] [--repeat 7] [--rounds 3] [NAME ...]

Each op runs on ~1M-element inputs (a 1024 x 1024 matrix, an 8 x 64 x 32 x 32 or larger
image batch, 8 heads of 256 x 64 for attention): the forward alone, or with --backward the
forward and the gradients of every float input. Times are medians of `--repeat` runs after
two warm-up runs (compiles excluded), neuron synchronized, in `--rounds` rounds that
alternate which side goes first (this VM's speed drifts); the table gives the median of the
rounds' medians and the range of the rounds' ratios. NAMEs keep the rows whose name
contains one of them. The last lines list the rows furthest behind the CPU: where a model's
time goes that adaptive eager cannot fuse away.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import neuron_eager  # noqa: F401


def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _i(high, *shape):
    return torch.randint(0, high, shape)


def cases() -> dict:
    """name -> (function, CPU inputs); integer and bool inputs get no gradient."""
    m = _t(1024, 1024)
    img = _t(16, 64, 32, 32)
    return {
        "t().contiguous()": (lambda x: x.t().contiguous(), [m]),
        "permute(0,2,1,3).contiguous()": (lambda x: x.permute(0, 2, 1, 3).contiguous(),
                                          [_t(16, 128, 8, 64)]),
        "cat dim 1": (lambda x, y: torch.cat([x, y], 1), [_t(1024, 512), _t(1024, 512)]),
        "embedding": (lambda w, i: F.embedding(i, w), [_t(50000, 256), _i(50000, 16, 256)]),
        "gather": (lambda x, i: x.gather(1, i), [m, _i(1024, 1024, 256)]),
        "scatter_add": (lambda x, i, s: x.scatter_add(1, i, s),
                        [m, _i(1024, 1024, 256), _t(1024, 256)]),
        "x[mask]": (lambda x, k: x[k], [m, torch.rand(1024, 1024) > 0.5]),
        "sort(-1)": (lambda x: x.sort(-1)[0], [_t(256, 1024)]),
        "topk(10)": (lambda x: x.topk(10, -1)[0], [m]),
        "cumsum(-1)": (lambda x: x.cumsum(-1), [m]),
        "sum(0)": (lambda x: x.sum(0), [m]),
        "mean()": (lambda x: x.mean(), [m]),
        "mean((0,2,3))": (lambda x: x.mean((0, 2, 3)), [img]),
        "x * w + b": (lambda x, w, b: x * w + b, [m, _t(1024), _t(1024)]),
        "x * s(1,)": (lambda x, s: x * s, [m, _t(1)]),
        "gelu": (lambda x: F.gelu(x), [m]),
        "softmax(-1)": (lambda x: F.softmax(x, -1), [m]),
        "log_softmax(-1)": (lambda x: F.log_softmax(x, -1), [m]),
        "cross_entropy": (lambda x, t: F.cross_entropy(x, t), [m, _i(1024, 1024)]),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (1024,), w, b), [m, _t(1024), _t(1024)]),
        "rms_norm": (lambda x, w: F.rms_norm(x, (1024,), w), [m, _t(1024)]),
        "group_norm": (lambda x: F.group_norm(x, 8), [img]),
        "batch_norm (training)": (lambda x, w, b: F.batch_norm(x, None, None, w, b,
                                                               training=True),
                                  [img, _t(64), _t(64)]),
        "conv2d 3x3": (lambda x, w: F.conv2d(x, w, padding=1), [_t(8, 64, 32, 32),
                                                               _t(64, 64, 3, 3)]),
        "max_pool2d": (lambda x: F.max_pool2d(x, 2), [img]),
        "avg_pool2d": (lambda x: F.avg_pool2d(x, 2), [img]),
        "adaptive_avg_pool2d(1)": (lambda x: F.adaptive_avg_pool2d(x, 1), [img]),
        "linear": (lambda x, w, b: F.linear(x, w, b), [_t(256, 1024), m, _t(1024)]),
        "bmm 32x128x64": (lambda a, b: a @ b, [_t(32, 128, 64), _t(32, 64, 128)]),
        "sdpa causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                        [_t(8, 8, 256, 64), _t(8, 8, 256, 64), _t(8, 8, 256, 64)]),
    }


def _step(fn, inputs, backward: bool):
    out = fn(*inputs)
    if backward:
        wanted = [x for x in inputs if x.requires_grad]
        torch.autograd.grad(out, wanted, torch.ones_like(out))


def median_ms(fn, inputs, backward: bool, repeat: int) -> float:
    sync = torch.neuron.synchronize if inputs[0].device.type == "neuron" else (lambda: None)
    for _ in range(2):
        _step(fn, inputs, backward)
        sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        _step(fn, inputs, backward)
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--backward", action="store_true", help="forward and gradients")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads); "
          f"{'forward + backward' if args.backward else 'forward'}, median of {args.repeat} "
          f"in {args.rounds} rounds")
    print(f"{'op':30s} {'torch CPU':>10s} {'neuron':>10s} {'ratio':>7s}  rounds' ratios")
    rows = []
    for name, (fn, inputs) in cases().items():
        if args.names and not any(n in name for n in args.names):
            continue
        grads = [args.backward and x.is_floating_point() for x in inputs]
        cpu = [x.clone().requires_grad_(g) for x, g in zip(inputs, grads)]
        dev = [x.to("neuron").requires_grad_(g) for x, g in zip(inputs, grads)]
        cs, ns = [], []
        for k in range(args.rounds):
            sides = [(cs, cpu), (ns, dev)][::1 if k % 2 == 0 else -1]
            for times, inputs in sides:
                times.append(median_ms(fn, inputs, args.backward, args.repeat))
        ratios = sorted(n / c for c, n in zip(cs, ns))
        c, n = statistics.median(cs), statistics.median(ns)
        rows.append((n / c, name))
        print(f"{name:30s} {c:8.3f}ms {n:8.3f}ms {n / c:6.2f}x  "
              f"{ratios[0]:.2f}-{ratios[-1]:.2f}x", flush=True)
    behind = sorted(rows, reverse=True)[:5]
    print("furthest behind: " + ", ".join(f"{name} {r:.2f}x" for r, name in behind))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
