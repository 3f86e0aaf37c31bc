"""Measure the device's fp32 transcendentals in ulp over dense sweeps; write docs/numerics.md.

    python -m neuron_eager.numerics_report [--points 2000000] [--out docs/numerics.md]

Inputs are spread evenly over the fp32 bit patterns of each domain (so every binade gets
its share, tiny values included). Each function runs as a real `neuron` op and is compared
with torch's fp32 CPU result (distance in representable floats) and with the exact value
(a float64 reference, error divided by the fp32 spacing at the exact value). torch's own
error against the exact value is shown beside it.
"""
from __future__ import annotations

import argparse
import math
import platform
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from scipy import special

import neuron_eager  # noqa: F401  (registers the device)

TARGET_ULP = 4


@dataclass
class Spec:
    name: str
    op: Callable  # torch function, run on neuron and on the CPU
    exact: Callable  # float64 numpy reference
    domain: tuple  # (lo, hi) of the sweep
    ulp_domain: tuple | None = None  # where the ulp columns are judged (None: all of it)
    note: str = ""
    extra: Callable | None = None  # () -> more inputs where errors concentrate


def _near_multiples_of_pio2() -> np.ndarray:
    """The 9 floats around each nonzero multiple of pi/2 below 8192 (Note [Trigonometric
    reduction] in ops/fastmath.py: the remainder is tiny there, its error relatively large)."""
    n = np.concatenate([np.arange(-5215, 0), np.arange(1, 5216)])
    centers = (n * (np.pi / 2)).astype(np.float32).view(np.int32)
    return np.concatenate([(centers + d).view(np.float32) for d in range(-4, 5)])


SPECS = [
    Spec("exp", torch.exp, np.exp, (-103.9, 88.72)),
    Spec("log", torch.log, np.log, (1e-45, 3.4e38)),
    Spec("log1p", torch.log1p, np.log1p, (-0.99999994, 3.4e38)),
    Spec("tanh", torch.tanh, np.tanh, (-20.0, 20.0)),
    Spec("sigmoid", torch.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-100.0, 100.0),
         (-87.0, 100.0), "below -87 both give 0 where the exact value is subnormal"),
    Spec("erf", torch.erf, special.erf, (-6.0, 6.0)),
    Spec("sin", torch.sin, np.sin, (-8192.0, 8192.0), None,
         "and the 9 floats around each multiple of pi/2 (Note [Trigonometric reduction]); "
         "|x| >= 8192 reduces through a float64 table (Note [Large trigonometric "
         "arguments]), not measured here", _near_multiples_of_pio2),
    Spec("cos", torch.cos, np.cos, (-8192.0, 8192.0), None, "as sin", _near_multiples_of_pio2),
    Spec("rsqrt", torch.rsqrt, lambda x: 1 / np.sqrt(x), (1e-45, 3.4e38)),
    Spec("gelu", torch.nn.functional.gelu,
         lambda x: 0.5 * x * special.erfc(-x / math.sqrt(2)), (-10.0, 10.0), (-1.0, 10.0),
         "x Phi(x) with Phi's own polynomials (ops/fastmath.py, Note [gelu's CDF]); below -1, "
         "where torch's x/2 (1 + erf(x/sqrt 2)) cancels, judged by the largest absolute "
         "error: {abs_err:.2g} (torch {torch_abs_err:.2g})"),
    Spec("silu", torch.nn.functional.silu, lambda x: x / (1 + np.exp(-x)), (-88.0, 88.0)),
]


def _ordinal(x: np.ndarray) -> np.ndarray:
    """fp32 values -> integers in the same order, adjacent floats adjacent (+0 == -0)."""
    i = x.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def sweep(lo: float, hi: float, points: int) -> np.ndarray:
    """About `points` fp32 values in [lo, hi], evenly spaced in bit patterns."""
    parts = []
    if lo < 0:
        a, b = np.float32(max(-hi, 0) if hi < 0 else 0), np.float32(-lo)
        parts.append(-_span(a, b, points // 2 if hi > 0 else points))
    if hi > 0:
        parts.append(_span(np.float32(max(lo, 0)), np.float32(hi),
                           points // 2 if lo < 0 else points))
    return np.unique(np.concatenate(parts))


def _span(a: np.float32, b: np.float32, n: int) -> np.ndarray:
    ia, ib = int(np.float32(a).view(np.int32)), int(np.float32(b).view(np.int32))
    step = max(1, (ib - ia) // n)
    return np.arange(ia, ib + 1, step, dtype=np.int64).astype(np.int32).view(np.float32)


def ulp_vs_exact(values: np.ndarray, exact: np.ndarray) -> np.ndarray:
    spacing = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    err = np.abs(values.astype(np.float64) - exact) / spacing
    both_nan = np.isnan(values) & np.isnan(exact)
    same_inf = np.isinf(values) & (values == exact)
    return np.where(both_nan | same_inf, 0.0, err)


def measure(spec: Spec, points: int) -> dict:
    x = sweep(*spec.domain, points)
    if spec.extra is not None:
        x = np.unique(np.concatenate([x, spec.extra()]))
    xt = torch.from_numpy(x)
    ours = spec.op(xt.to("neuron")).cpu().numpy()
    theirs = spec.op(xt).numpy()
    with np.errstate(all="ignore"):
        exact = spec.exact(x.astype(np.float64))
    judged = np.ones(x.shape, bool)
    if spec.ulp_domain:
        judged = (x >= spec.ulp_domain[0]) & (x <= spec.ulp_domain[1])
    vs_torch = np.abs(_ordinal(ours) - _ordinal(theirs))
    vs_torch = np.where(np.isnan(ours) & np.isnan(theirs), 0, vs_torch)
    ours_err, torch_err = ulp_vs_exact(ours, exact), ulp_vs_exact(theirs, exact)
    worst = int(np.argmax(np.where(judged, ours_err, 0)))
    rest = ~judged if spec.ulp_domain else judged  # the note's absolute errors
    return {
        "name": spec.name, "domain": spec.domain, "ulp_domain": spec.ulp_domain or spec.domain,
        "points": int(x.size), "vs_torch": int(vs_torch[judged].max()),
        "vs_exact": float(ours_err[judged].max()), "torch_vs_exact": float(torch_err[judged].max()),
        "worst_x": float(x[worst]),
        "note": spec.note.format(abs_err=np.nanmax(np.abs(ours - exact)[rest]),
                                 torch_abs_err=np.nanmax(np.abs(theirs - exact)[rest])),
    }


def _fmt_domain(d) -> str:
    return f"[{d[0]:g}, {d[1]:g}]"


def markdown(rows: list[dict], points: int) -> str:
    lines = [
        "# Numerics",
        "",
        "Generated by `python -m neuron_eager.numerics_report` "
        f"({points:,} points per function; {platform.machine()}, torch {torch.__version__}, "
        f"torch's CPU kernels: {torch.backends.cpu.get_cpu_capability()}).",
        "",
        "## Rules",
        "",
        "- Engines compute in fp32. bf16/fp16 inputs widen exactly to fp32; every op rounds its",
        "  result once to its output dtype, to nearest-even (stochastically with",
        "  `NEURON_RT_STOCHASTIC_ROUNDING_EN=1`). float64 computes as fp32, int64 as int32.",
        "- fp32 <-> bf16/fp16 conversions are bit-exact against `torch.Tensor.to` (NaN, inf,",
        "  subnormals and ties included; tests/test_tensor.py).",
        "- Stochastic rounding adds 16 random low bits before truncating (bf16), or rounds "
        "away from",
        "  the nearest fp16 with probability equal to the distance (fp16, 24 random bits): "
        "unbiased",
        "  (tests/test_numerics.py measures the mean error), reproducible under",
        "  `torch.neuron.manual_seed` (and `get/set_rng_state`, whose state carries the noise's),",
        "  and not shifting the device's other random numbers (the",
        "  noise has its own stream, see Note [stochastic rounding noise] in ops/numerics.py).",
        "- Matmul: fp32 products summed in fp32 per K-chunk of 128 (one BLAS sgemm per staged",
        "  chunk), chunk sums added in order into an fp32 accumulator, `alpha*acc + beta*C`",
        "  formed in fp32 and rounded once (Note [PSUM accumulation] in ops/matmul.py). Large",
        "  bf16 products on a CPU with AVX512-BF16 or AMX sum each chunk on those units through",
        "  MKL (the same chunk sums, ~3x faster), except where a product or partial sum could be",
        "  subnormal, which those units flush (Note [bf16 chunks on MKL] in ops/bf16_chunks.py);",
        "  so do fp32 products that auto-cast rounds to bf16, and bf16 convolutions.",
        "  `torch.mm`/`bmm`/`addmm`/`baddbmm(..., out_dtype=torch.float32)` on bf16/fp16",
        "  inputs return the fp32 accumulator unrounded (Note [PSUM out_dtype]).",
        "  `neuron_eager.config.bf16_gemm = \"cpu\"` (`NEURON_EAGER_BF16_GEMM=cpu`) trades the",
        "  chunking for speed on large bf16 products without C: torch's CPU bf16 GEMM, still fp32",
        "  sums rounded once, over the whole K and with subnormal products flushed "
        "(Note [bf16 GEMM]).",
        "- Sums: fp32 (integers: int64, wrapping to the output), in one order whatever the layout",
        "  and in plain and adaptive eager alike: blocks of 4096 elements, each element of a block",
        "  added to lane i % 64 in order, the 64 lanes folded pairwise (32, 16, ..., 1), the block",
        "  sums added in order (Note [Sum order] in ops/numerics.py); mean divides that sum once.",
        "  Softmax and log-softmax over the last dim and layer/group norm statistics sum that "
        "way too.",
        "  A NaN sum is the quiet +nan (two NaNs meeting would otherwise keep whichever the",
        "  kernel's operand order picks).",
        "- Scans (cumsum, cumprod, logcumsumexp): each prefix in fp32, one element after another,",
        "  as a Vector-engine scan carries it. torch's CPU carries float32 scans in float64, so",
        "  over long rows ours drift further: cumsum of 100k uniform values 9e-6 relative (the",
        "  CPU's 6e-8), cumprod of 300k values near 1 1e-5, logcumsumexp of 300k normal values",
        "  2.3e-4 absolute (the CPU's 5e-7).",
        "- Auto-cast, as the Neuron compiler's `--auto-cast`: `neuron_eager.config.auto_cast` in",
        "  {none, matmult, all} (environment `NEURON_EAGER_AUTO_CAST`, default none) with",
        "  `auto_cast_type` in {bf16, fp16, tf32} (`NEURON_EAGER_AUTO_CAST_TYPE`, default bf16).",
        "  `matmult` rounds fp32 operands of matmuls and convolutions to that type "
        "(to nearest-even)",
        "  before the fp32-accumulated product; `all` also rounds the fp32 inputs of "
        "elementwise ops.",
        "  Outputs keep their dtype.",
        "",
        "## Transcendentals",
        "",
        "exp, log, tanh, sigmoid, erf, sin and cos are in-kernel approximations (ops/fastmath.py:",
        "range reduction and polynomials in fp32, as the Scalar engine approximates them);",
        "log1p is log of 1 + x corrected by x / ((1 + x) - 1); gelu is x times the normal CDF,",
        "one polynomial either side of |x| = 1.5; silu is built from exp (softplus, mish,",
        "logsigmoid and BCE-with-logits from exp and log1p); rsqrt is",
        "fp32 `1/sqrt(x)`. Errors:",
        "",
        "- *vs torch*: largest distance, in representable fp32 values, from torch's fp32 CPU "
        "result;",
        "- *vs exact*: largest |ours - exact| / fp32 spacing at the exact value (float64",
        "  reference); *torch vs exact*: the same for torch, for scale.",
        f"- Target: at most {TARGET_ULP} ulp.",
        "",
        "",
        "Against torch a function's error adds to torch's own, which depends on the vector",
        "instructions torch's CPU kernels use (the header names them): torch's own gelu is 4.6",
        "ulp from the exact value near x = -1 with AVX-512 kernels and 9.0 ulp with AVX2 ones.",
        "The vs-exact column is what holds ours to the target.",
        "",
        "| function | sweep | ulp judged on | vs torch (ulp) | vs exact (ulp) "
        "| torch vs exact (ulp) | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {_fmt_domain(r['domain'])} | {_fmt_domain(r['ulp_domain'])} "
            f"| {r['vs_torch']} | {r['vs_exact']:.2f} | {r['torch_vs_exact']:.2f} | {r['note']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=2_000_000, help="inputs per function")
    parser.add_argument("--out", default="", help="write the markdown table here")
    args = parser.parse_args(argv)
    rows = []
    for spec in SPECS:
        row = measure(spec, args.points)
        rows.append(row)
        flag = "" if row["vs_torch"] <= TARGET_ULP and row["vs_exact"] <= TARGET_ULP else "  <-"
        print(f"{row['name']:8s} vs torch {row['vs_torch']:3d} ulp  vs exact "
              f"{row['vs_exact']:6.2f} ulp  (torch {row['torch_vs_exact']:5.2f})  "
              f"worst x {row['worst_x']:.7g}{flag}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(markdown(rows, args.points))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
