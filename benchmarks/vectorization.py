"""Which elementwise ops' loops vectorise: every registered op's scalar function in a flat
float32 loop, its time per element (one thread) and the vector instructions LLVM emitted.

    python benchmarks/vectorization.py [--n 1048576] [--only NAME,...] [--all]

A loop with no vector instructions runs one element at a time: either its op calls libm (a
scalar call each element: expected for the rarer special functions) or something stopped
LLVM (a body too large to inline, a branch, a signed index). This audit found gelu_backward
and the softplus family scalar (Note [Inlined op bodies] in ops/elementwise.py). By default
only the scalar loops are listed, slowest first.
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np

import neuron_eager  # noqa: F401  (registers every op)
from neuron_eager.ops import elementwise as E
from neuron_eager.ops.kernelgen import JIT_OPTIONS


def flat_loop(fn, arity: int):
    """A jitted `loop(a0, ..., out)` computing out[i] = fn(a0[i], ...)."""
    names = [f"a{j}" for j in range(arity)]
    source = (f"def loop({', '.join(names)}, out):\n"
              f"    for i in range(out.size):\n"
              f"        out[i] = fn({', '.join(n + '[i]' for n in names)})\n")
    namespace = {"fn": fn}
    exec(source, namespace)  # a fixed template over registered ops, never user text
    return numba.njit(**JIT_OPTIONS)(namespace["loop"])


def measure(op: E.Elementwise, n: int) -> tuple[float, int] | None:
    """(ns per element, vector instructions) of op's loop on inputs in [0.5, 1.5); None when
    the op does not take float32 (bitwise ops)."""
    fn = op.fn
    arity = fn.py_func.__code__.co_argcount
    rng = np.random.default_rng(0)
    inputs = [rng.random(n, np.float32) + np.float32(0.5) for _ in range(arity)]
    out = np.empty(n, np.float32)
    try:
        loop = flat_loop(fn, arity)
        loop(*inputs, out)
    except numba.core.errors.TypingError:
        return None
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        loop(*inputs, out)
        best = min(best, time.perf_counter() - start)
    llvm = loop.inspect_llvm(loop.signatures[0])
    vector = sum(llvm.count(f"x {kind}>") for kind in ("float", "i32", "i64", "double"))
    return best / n * 1e9, vector


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1 << 20, help="elements per loop")
    parser.add_argument("--only", default="", help="comma-separated op names")
    parser.add_argument("--all", action="store_true", help="list vectorised loops too")
    args = parser.parse_args(argv)
    wanted = set(filter(None, args.only.split(",")))
    rows = []
    for name, op in sorted(E.OPS_BY_NAME.items()):
        if (wanted and name not in wanted) or not hasattr(op.fn, "py_func"):
            continue
        result = measure(op, args.n)
        if result is not None:
            rows.append((name, *result))
    rows.sort(key=lambda r: -r[1])
    scalar = [r for r in rows if r[2] == 0]
    print(f"{len(rows)} ops, {len(scalar)} with scalar loops; one thread, {args.n} elements")
    print(f"{'op':32s} {'ns/element':>10s} {'vector instrs':>14s}")
    for name, ns, vector in rows if (args.all or wanted) else scalar:
        print(f"{name:32s} {ns:10.2f} {vector:14d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
