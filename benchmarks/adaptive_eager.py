"""Adaptive eager vs plain eager on the built-in workloads, against issue 4's targets.

    python benchmarks/adaptive_eager.py [--repeat 11] [--warmup 4] [--only NAME[:SIZE] ...]

The measuring is `neuron-eager bench`'s (neuron_eager/bench.py: fresh builds per mode,
plain and adaptive stepping in turn, each step ending with torch.neuron.synchronize(),
counters read from the runtime); this script runs every size of every workload and marks
the targets: adaptive <= 0.25x plain time on the 1M chains, <= 1.05x on the 1K chains,
<= 0.6x on the training steps; <= 1/3 of plain's launches per transformer step. Every
step's output and the final state must be the same bits in both modes, and no compile may
fall into the measured steps.
"""
from __future__ import annotations

import argparse

from neuron_eager import bench, workloads


def time_target(w: workloads.Workload) -> float:
    if w.kind == "training":
        return 0.6
    return 0.25 if w.size == "1M" else 1.05


def launch_target(w: workloads.Workload) -> float | None:
    return 1 / 3 if w.name == "transformer" else None


def _miss(ratio: float, target: float | None) -> str:
    return "*" if target is not None and ratio > target else " "


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=11, help="measured steps per mode")
    parser.add_argument("--warmup", type=int, default=4,
                        help="steps before measuring (adaptive compiles happen here)")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help=f"only this workload, or NAME:SIZE (repeatable); one of "
                             f"{', '.join(workloads.names())}")
    args = parser.parse_args(argv)
    chosen = [w for w in workloads.WORKLOADS.values()
              if not args.only or w.name in args.only or f"{w.name}:{w.size}" in args.only]
    if not chosen:
        parser.error(f"no workload matches {args.only}; known: "
                     f"{', '.join(f'{n}:{size}' for n, size in workloads.WORKLOADS)}")
    print(bench.describe(bench.machine()))
    print(f"{args.warmup} warm-up + {args.repeat} measured steps per mode; ms: median wall "
          f"time per step; launches and MB moved: per step; peak: HBM allocated")
    print(f"{'workload':12s}{'size':>7s} |{'plain ms':>9s}{'adapt ms':>9s}{'ratio':>7s}"
          f"{'target':>8s} |{'launches':>16s}{'ratio':>8s} |{'MB moved':>16s} |"
          f"{'peak MB':>16s} |{'compile':>9s} | bits")
    missed = []
    for w in chosen:
        job = bench.Job(w.name, w.size, w.kind, w.make)
        sides = bench.run_job(job, ("plain", "adaptive"), args.warmup, args.repeat)
        r = bench.result(job, sides)
        p, a = r["modes"]["plain"], r["modes"]["adaptive"]
        ratios = r["ratios"]["adaptive_vs_plain"]
        ratio, target = ratios["wall"], time_target(w)
        launches, launch_goal = ratios["launches"], launch_target(w)
        fast = sides["adaptive"]
        compiled_late = fast.compile_s - fast.warmup_compile_s
        if ratio > target:
            missed.append(f"{w.name} {w.size}: time {ratio:.2f}x > {target:.2f}x")
        if launch_goal is not None and launches > launch_goal:
            missed.append(f"{w.name} {w.size}: launches {launches:.2f}x > {launch_goal:.2f}x")
        if not r["same_bits"]:
            missed.append(f"{w.name} {w.size}: results differ between the modes")
        if compiled_late > 0:
            missed.append(f"{w.name} {w.size}: {compiled_late:.2f}s of compiles while "
                          f"measuring (raise --warmup)")
        print(f"{w.name:12s}{w.size:>7s} |{p['wall_ms']['median']:9.2f}"
              f"{a['wall_ms']['median']:9.2f}{ratio:6.2f}x{_miss(ratio, target)}{target:6.2f}x |"
              f"{p['launches_per_step']:8.0f}{a['launches_per_step']:8.0f}"
              f"{launches:6.2f}x{_miss(launches, launch_goal)} |"
              f"{p['hbm_mb_moved_per_step']:8.2f}{a['hbm_mb_moved_per_step']:8.2f} |"
              f"{p['peak_hbm_mb']:8.2f}{a['peak_hbm_mb']:8.2f} |{a['compile_s']:8.2f}s"
              f"{'!' if compiled_late > 0 else ' '}| {'same' if r['same_bits'] else 'DIFFERENT'}",
              flush=True)
    print("targets: time 0.25x (1M chains), 1.05x (1K chains), 0.60x (training); launches "
          "0.33x (transformer); * marks a miss")
    for line in missed:
        print(f"  missed: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
