"""Adaptive eager vs plain eager on the built-in workloads, in one run (issue 4's targets).

    python benchmarks/adaptive_eager.py [--repeat 11] [--warmup 4] [--only NAME ...]

For each workload (neuron_eager.workloads) and size, two fresh builds, one in plain and one in
adaptive eager, take turns: `--warmup` steps each, then `--repeat` measured steps each. Per
step: wall time (median; each step ends with torch.neuron.synchronize()), kernels launched,
HBM bytes moved; peak HBM over the measured steps; seconds adaptive eager spent compiling
fused kernels (adaptive.stats(); in warm-up, "!" if also while measuring; a kernel cached by
an earlier workload or on disk costs nothing again). Every step's output and the final
state must be the same bits in both modes. Targets: adaptive <= 0.25x plain time on the 1M
chains, <= 1.05x on the 1K chains, <= 0.6x on the training steps; <= 1/3 of plain's
launches per transformer step.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time

import numba
import torch

import neuron_eager  # noqa: F401  (the device)
from neuron_eager import adaptive, workloads
from neuron_eager.device_sim import core

DEVICE = torch.device("neuron")


def time_target(w: workloads.Workload) -> float:
    if w.kind == "training":
        return 0.6
    return 0.25 if w.size == "1M" else 1.05


def launch_target(w: workloads.Workload) -> float | None:
    return 1 / 3 if w.name == "transformer" else None


class Side:
    """One mode's build of a workload and what its steps measured. The two sides step in
    turn (plain, adaptive, plain, ...), so load from other processes on the machine falls on
    both alike; HBM is counted per side (Note [Peak per side])."""

    def __init__(self, w: workloads.Workload, adaptive_on: bool):
        self.on = adaptive_on
        self.times: list[float] = []  # measured steps' wall times
        self.launched = self.moved = self.peak = 0  # totals over them; peak: max
        self.compile_s = self.compile_measured = 0.0
        self.outputs: list[torch.Tensor] = []  # every step's output, on the CPU
        before = torch.neuron.memory_allocated()
        with adaptive.adaptive_eager(self.on):
            self.step = w.make(DEVICE)
        self.resident = torch.neuron.memory_allocated() - before

    def once(self, measured: bool) -> None:
        """One step (followed by a synchronize), counted if `measured`."""
        before = torch.neuron.memory_allocated()
        with adaptive.adaptive_eager(self.on):
            compiled = adaptive.stats()["compile_seconds"]
            torch.neuron.reset_peak_memory_stats()
            k, b = core.kernels_launched, core.hbm_bytes_moved
            start = time.perf_counter()
            out = self.step()
            torch.neuron.synchronize()
            seconds = time.perf_counter() - start
            launches, moved = core.kernels_launched - k, core.hbm_bytes_moved - b
            peak = torch.neuron.max_memory_allocated() - (before - self.resident)
            compile_s = adaptive.stats()["compile_seconds"] - compiled
            self.outputs.append(out.cpu())  # not timed: the copy is the same in both modes
            del out
        self.resident += torch.neuron.memory_allocated() - before  # after leaving the mode
        self.compile_s += compile_s
        if measured:
            self.times.append(seconds)
            self.launched += launches
            self.moved += moved
            self.peak = max(self.peak, peak)
            self.compile_measured += compile_s

    def state(self) -> list[torch.Tensor]:
        return [t.detach().cpu() for t in self.step.state()]

    @property
    def ms(self) -> float:
        """Median wall time of a measured step."""
        return statistics.median(self.times) * 1e3

    @property
    def launches(self) -> float:
        return self.launched / len(self.times)

    @property
    def moved_per_step(self) -> float:
        return self.moved / len(self.times)


# Note [Peak per side]
# Both builds live in the one simulated HBM. While one side steps, the other's tensors stay
# put, so the HBM this side holds at its peak is the allocator's peak less what the other
# side (and anything older) held when the step began: that is, less (allocated before the
# step - this side's resident bytes), where resident bytes are what its build and its earlier
# steps left allocated, counted once the mode is left (leaving adaptive eager runs and frees
# what is still recorded).


def compare(w: workloads.Workload, warmup: int, repeat: int) -> tuple[Side, Side]:
    """Plain and adaptive eager on fresh builds of `w`: `warmup` + `repeat` steps each."""
    gc.collect()  # the previous workload's tensors go back to the allocator first
    plain, fast = Side(w, False), Side(w, True)
    for k in range(warmup + repeat):
        plain.once(k >= warmup)
        fast.once(k >= warmup)
    return plain, fast


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's stored bits (NaN and -0.0 compare exactly)."""
    if t.dtype.is_floating_point:
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def same_bits(a: Side, b: Side) -> bool:
    state_a, state_b = a.state(), b.state()
    pairs = list(zip(a.outputs, b.outputs)) + list(zip(state_a, state_b))
    return len(state_a) == len(state_b) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(bits(x), bits(y))
        for x, y in pairs)


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"numba {numba.__version__} ({numba.config.NUMBA_NUM_THREADS} threads), "
            f"simulated {core.spec.name}, adaptive compile_after="
            f"{adaptive.options.compile_after}")


def _mb(n: float) -> str:
    return f"{n / 2**20:8.2f}"


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
        parser.error(f"no workload matches {args.only}")
    print(machine())
    print(f"{args.warmup} warm-up + {args.repeat} measured steps per mode; ms: median wall "
          f"time per step; launches and MB moved: per step; peak: HBM allocated")
    print(f"{'workload':12s}{'size':>7s} |{'plain ms':>9s}{'adapt ms':>9s}{'ratio':>7s}"
          f"{'target':>8s} |{'launches':>16s}{'ratio':>8s} |{'MB moved':>16s} |"
          f"{'peak MB':>16s} |{'compile':>9s} | bits")
    missed = []
    for w in chosen:
        plain, fast = compare(w, args.warmup, args.repeat)
        ratio, target = fast.ms / plain.ms, time_target(w)
        if ratio > target:
            missed.append(f"{w.name} {w.size}: time {ratio:.2f}x > {target:.2f}x")
        launches = fast.launches / plain.launches
        if launch_target(w) is not None and launches > launch_target(w):
            missed.append(f"{w.name} {w.size}: launches {launches:.2f}x > "
                          f"{launch_target(w):.2f}x")
        same = same_bits(plain, fast)
        if not same:
            missed.append(f"{w.name} {w.size}: results differ between the modes")
        if fast.compile_measured > 0:
            missed.append(f"{w.name} {w.size}: {fast.compile_measured:.2f}s of compiles while "
                          f"measuring (raise --warmup)")
        print(f"{w.name:12s}{w.size:>7s} |{plain.ms:9.2f}{fast.ms:9.2f}{ratio:6.2f}x"
              f"{_miss(ratio, target)}{target:6.2f}x |{plain.launches:8.0f}{fast.launches:8.0f}"
              f"{launches:6.2f}x{_miss(launches, launch_target(w))} |"
              f"{_mb(plain.moved_per_step)}{_mb(fast.moved_per_step)} |"
              f"{_mb(plain.peak)}{_mb(fast.peak)} |{fast.compile_s:8.2f}s"
              f"{'!' if fast.compile_measured > 0 else ' '}| {'same' if same else 'DIFFERENT'}",
              flush=True)
    print("targets: time 0.25x (1M chains), 1.05x (1K chains), 0.60x (training); launches "
          "0.33x (transformer); * marks a miss")
    for line in missed:
        print(f"  missed: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
