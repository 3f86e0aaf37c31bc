"""Where a plain-eager step's host time goes: ops adaptive eager can record, foreach ops
(whose per-tensor steps it records over large tensors, else runs as one launch each), and the
ops that stay eager.

    python benchmarks/step_breakdown.py [--workload transformer] [--size small] [--steps 20]
                                        [--adaptive]

Every op reaching the neuron dispatcher is timed from entry to return (nested dispatches
count once, in their outermost op), on the main thread and autograd's. What adaptive eager
can save is bounded by the recordable and foreach shares: the rest runs in both modes.
With --adaptive the same split is taken in adaptive eager (flushes fall in the op that
triggers them).
"""
from __future__ import annotations

import argparse
import threading
import time
from collections import Counter

import torch

import neuron_eager  # noqa: F401
from neuron_eager import adaptive, workloads
from neuron_eager.adaptive import recording
from neuron_eager.ops import tensor as T


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="transformer")
    parser.add_argument("--size", default="small")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--adaptive", action="store_true", help="measure adaptive eager")
    args = parser.parse_args(argv)
    adaptive.enable()  # fills recording's op table
    if not args.adaptive:
        adaptive.disable()
    step = workloads.get(args.workload, args.size).make("neuron")
    for _ in range(5):
        step()
        torch.neuron.synchronize()

    inner, depth = T._dispatcher, threading.local()
    seconds, calls = Counter(), Counter()

    def kind(func) -> str:
        action = recording._ACTIONS.get(id(func))
        if action is None:
            return "stays eager"
        return "foreach" if action[0] is None else "recordable"

    def timed(func, args_, kwargs):
        level = getattr(depth, "level", 0)
        depth.level = level + 1
        start = time.perf_counter()
        try:
            return inner(func, args_, kwargs)
        finally:
            depth.level = level
            if level == 0:
                spent, k = time.perf_counter() - start, kind(func)
                seconds[k] += spent
                calls[k] += 1
                if k == "stays eager":
                    seconds[func.name()] += spent
                    calls[func.name()] += 1

    T.set_dispatcher(timed)
    try:
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
            torch.neuron.synchronize()
        total = (time.perf_counter() - start) / args.steps
    finally:
        T.set_dispatcher(inner)
        adaptive.disable()
    n = args.steps
    mode = "adaptive eager" if args.adaptive else "plain eager"
    print(f"{args.workload} {args.size}, {mode}: {total * 1e3:.2f} ms per step (timed)")
    print(f"{'part':<40}{'ms/step':>9}{'share':>8}{'calls':>7}")
    inside = sum(seconds[k] for k in ("recordable", "foreach", "stays eager")) / n
    rows = [(k, seconds[k] / n, calls[k] / n) for k in ("recordable", "foreach", "stays eager")]
    rows.append(("outside the dispatcher (Python, autograd)", total - inside, 0))
    for name, ms, count in rows:
        print(f"{name:<40}{ms * 1e3:9.2f}{ms / total:8.0%}{count:7.0f}")
    print("largest ops that stay eager:")
    ops = [k for k in seconds if k not in ("recordable", "foreach", "stays eager")]
    for name in sorted(ops, key=lambda k: -seconds[k])[:8]:
        print(f"  {name:<38}{seconds[name] / n * 1e3:9.2f}{seconds[name] / n / total:8.0%}"
              f"{calls[name] / n:7.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
