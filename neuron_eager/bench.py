"""`neuron-eager bench`: plain eager against adaptive eager (and torch on the CPU), side by side.

    neuron-eager bench                           # --quick: the small sizes, ~20 s on 2 cores
    neuron-eager bench --full                    # small and medium sizes, more steps
    neuron-eager bench --workloads gelu,mlp --sizes medium
    neuron-eager bench --script my_model.py:make_step

Built-in workloads (neuron_eager/workloads.py): GELU, LayerNorm and softmax chains written
out as research code writes them (small: 1K elements, medium: 1M), an AdamW step over four
tensors, an MLP training step and a nanoGPT transformer-block training step. `--script
path.py[:NAME]` measures your own (NAME defaults to `step`): NAME(device) is called once per
mode, after torch.manual_seed(0); if it returns a callable, that callable runs one step, else
NAME(device) itself is called for every step. Each mode keeps its own random stream, so
dropout draws the same masks in every mode.

Per workload and mode, over the measured steps after warm-up: host wall time per step
(median, min, max, interquartile range; each step ends with torch.neuron.synchronize()),
the first step's time and adaptive eager's compile seconds apart, kernels launched per step,
simulated device time per step, HBM bytes moved per step and peak HBM, all read from the
runtime's own counters; then the ratios adaptive/plain. The modes take turns step by step,
so load from elsewhere on the machine falls on all of them alike. Output: a table, a JSON
file with every figure and a PNG plot (--out, default ./neuron-eager-bench/).
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numba
import torch

import neuron_eager  # noqa: F401  (the device)
from neuron_eager import adaptive, outputs, workloads
from neuron_eager.device_sim import core
from neuron_eager.progress import Progress

MODES = ("cpu", "plain", "adaptive")
DEVICE_MODES = ("plain", "adaptive")
SIZES = ("small", "medium")
_CHAIN_SIZES = {"small": "1K", "medium": "1M"}  # the chains' element counts per size
QUICK = dict(sizes=("small",), warmup=3, repeat=5)
FULL = dict(sizes=SIZES, warmup=4, repeat=11)


@dataclass(frozen=True)
class Job:
    """One workload at one size: `make(device)` builds it and returns its step function."""

    name: str
    size: str
    kind: str  # "chain", "training" or "script"
    make: Callable[[torch.device], Callable[[], object]]


def builtin_jobs(names: list[str] | None, sizes) -> list[Job]:
    jobs = []
    for name in names or workloads.names():
        for size in sizes:
            found = [w for (n, _), w in workloads.WORKLOADS.items() if n == name]
            if not found:
                raise SystemExit(f"neuron-eager bench: no workload {name!r}; known: "
                                 f"{', '.join(workloads.names())}")
            label = _CHAIN_SIZES[size] if found[0].kind == "chain" else size
            w = workloads.get(name, label)
            jobs.append(Job(w.name, label, w.kind, w.make))
    return jobs


def script_job(spec: str) -> Job:
    """`path.py[:NAME]` (NAME defaults to `step`) as a Job (see the module docstring)."""
    path, _, name = spec.partition(":")
    name = name or "step"
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"neuron-eager bench: no script {path!r}")
    module_spec = importlib.util.spec_from_file_location(f"neuron_eager_bench_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise SystemExit(f"neuron-eager bench: {path} has no function {name!r}")

    def make(device):
        built = fn(device)
        return built if callable(built) else (lambda: fn(device))

    return Job(f"{file.stem}:{name}", "-", "script", make)


class Side:
    """One mode's build of a job and what its steps measured."""

    def __init__(self, job: Job, mode: str):
        self.mode, self.on = mode, mode == "adaptive"
        self.device = torch.device("cpu" if mode == "cpu" else "neuron")
        self.times: list[float] = []
        self.launched = self.moved = self.peak = self.device_ps = 0
        self.compile_s, self.first_s = 0.0, None
        self.warmup_compile_s = 0.0  # of compile_s: during warm-up (the rest: while measuring)
        self.outputs: list = []
        before = self._allocated()
        with adaptive.adaptive_eager(self.on):
            torch.manual_seed(0)  # (Note [Each mode its own random stream])
            self.step = job.make(self.device)
        self.rng = _rng_state()
        self.resident = self._allocated() - before

    def _allocated(self) -> int:
        return torch.neuron.memory_allocated()

    def once(self, measured: bool) -> None:
        _set_rng_state(self.rng)
        if self.device.type == "cpu":
            start = time.perf_counter()
            out = self.step()
            seconds = time.perf_counter() - start
        else:
            out, seconds = self._device_step(measured)
        self.rng = _rng_state()
        self.first_s = seconds if self.first_s is None else self.first_s
        if measured:
            self.times.append(seconds)
            self.outputs.append(_host_copy(out))

    def _device_step(self, measured: bool):
        before = self._allocated()
        clock = core.clock
        with adaptive.adaptive_eager(self.on):
            compiled = adaptive.stats()["compile_seconds"]
            torch.neuron.reset_peak_memory_stats()
            k, b, sim = core.kernels_launched, core.hbm_bytes_moved, clock.synchronize()
            start = time.perf_counter()
            out = self.step()
            torch.neuron.synchronize()
            seconds = time.perf_counter() - start
            launches, moved = core.kernels_launched - k, core.hbm_bytes_moved - b
            device_ps = clock.synchronize() - sim
            peak = torch.neuron.max_memory_allocated() - (before - self.resident)
            compile_s = adaptive.stats()["compile_seconds"] - compiled
            self.compile_s += compile_s
            if not measured:
                self.warmup_compile_s += compile_s
            out = _host_copy(out)  # not timed: the copy is the same in both modes
        self.resident += self._allocated() - before  # after leaving the mode (Note [Peak])
        if measured:
            self.launched += launches
            self.moved += moved
            self.device_ps += device_ps
            self.peak = max(self.peak, peak)
        return out, seconds

    def figures(self) -> dict:
        t = sorted(self.times)
        q = statistics.quantiles(t, n=4) if len(t) > 1 else [t[0]] * 3
        n = len(t)
        device = self.device.type != "cpu"
        return {
            "steps": n,
            "wall_ms": {"median": statistics.median(t) * 1e3, "min": t[0] * 1e3,
                        "max": t[-1] * 1e3, "iqr": (q[2] - q[0]) * 1e3},
            "first_step_s": self.first_s,
            "compile_s": self.compile_s if self.on else None,
            "launches_per_step": self.launched / n if device else None,
            "device_ms_per_step": self.device_ps / n / 1e9 if device else None,
            "hbm_mb_moved_per_step": self.moved / n / 2**20 if device else None,
            "peak_hbm_mb": self.peak / 2**20 if device else None,
        }


# Note [Each mode its own random stream]
# A script's model is built once per mode and the modes step in turn, so with one global
# generator each build drew other weights and each mode's dropout other masks: different
# bits for any script that does not seed itself. So every build starts from seed 0 and each
# mode keeps its own CPU and device generator states between its steps.
def _rng_state():
    return torch.get_rng_state(), torch.neuron.get_rng_state()


def _set_rng_state(state) -> None:
    torch.set_rng_state(state[0])
    torch.neuron.set_rng_state(state[1])


# Note [Peak]
# All device builds live in the one simulated HBM. While one side steps, the others' tensors
# stay put, so what this side holds at its peak is the allocator's peak less what was
# allocated when its step began that is not its own (its build and earlier steps' leftovers,
# counted once the mode is left: leaving adaptive eager runs what is still recorded).


def _host_copy(out):
    if isinstance(out, torch.Tensor):
        return out.detach().cpu()
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def same_bits(a: Side, b: Side) -> bool | None:
    """Whether two sides computed the same bits (outputs, and the state a built-in workload
    updates); None if there is nothing to compare."""
    pairs = [(x, y) for x, y in zip(a.outputs, b.outputs) if x is not None and y is not None]
    state = getattr(a.step, "state", None)
    if state is not None:
        pairs += zip([t.detach().cpu() for t in a.step.state()],
                     [t.detach().cpu() for t in b.step.state()])
    if not pairs:
        return None
    return all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(_bits(x), _bits(y))
               for x, y in pairs)


def run_job(job: Job, modes=MODES, warmup: int = 3, repeat: int = 5,
            progress: Progress | None = None) -> dict[str, Side]:
    """Build `job` once per mode and step the modes in turn: `warmup` + `repeat` steps."""
    gc.collect()  # the previous job's tensors go back to the allocator first
    sides = {mode: Side(job, mode) for mode in modes}
    device_sides = [side for mode, side in sides.items() if mode != "cpu"]
    for k in range(warmup + repeat):
        for side in device_sides:
            side.once(k >= warmup)
        if progress is not None and device_sides:
            progress.step(f"{job.name} {job.size}")
    if "cpu" in sides:  # apart: torch's OpenMP threads spin after its ops (Note [CPU last])
        for k in range(warmup + repeat):
            sides["cpu"].once(k >= warmup)
            if progress is not None and not device_sides:
                progress.step(f"{job.name} {job.size}")
        time.sleep(_SPIN_S)  # the next job's device steps start on idle cores
    return sides


_SPIN_S = 0.3


# Note [CPU last]
# After a parallel region torch's OpenMP workers keep spinning for a while. Stepped in turn
# with the device modes, they took a core from the next device step (a small transformer's
# plain step went from 14 to 28 ms on 2 cores), so the CPU mode's steps run after them, and
# the next job waits a moment before its device steps.


def _ratio(a, b):
    return a / b if a is not None and b else None


def result(job: Job, sides: dict[str, Side]) -> dict:
    """Every figure of one job, as written to the JSON file."""
    modes = {mode: side.figures() for mode, side in sides.items()}
    out = {"workload": job.name, "size": job.size, "kind": job.kind, "modes": modes,
           "ratios": {}}
    if "plain" in modes and "adaptive" in modes:
        p, a = modes["plain"], modes["adaptive"]
        out["ratios"]["adaptive_vs_plain"] = {
            "wall": _ratio(a["wall_ms"]["median"], p["wall_ms"]["median"]),
            "launches": _ratio(a["launches_per_step"], p["launches_per_step"]),
            "device": _ratio(a["device_ms_per_step"], p["device_ms_per_step"]),
            "hbm_moved": _ratio(a["hbm_mb_moved_per_step"], p["hbm_mb_moved_per_step"]),
            "peak_hbm": _ratio(a["peak_hbm_mb"], p["peak_hbm_mb"])}
        out["same_bits"] = same_bits(sides["plain"], sides["adaptive"])
    if "cpu" in modes:
        for mode in DEVICE_MODES:
            if mode in modes:
                out["ratios"][f"{mode}_vs_cpu"] = {"wall": _ratio(
                    modes[mode]["wall_ms"]["median"], modes["cpu"]["wall_ms"]["median"])}
    return out


def describe(info: dict) -> str:
    """One line naming the machine and versions of `machine()`."""
    return (f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} "
            f"({info['torch_threads']} threads), numba {info['numba']} "
            f"({info['numba_threads']} threads), simulated {info['simulated']}, adaptive "
            f"compile_after={info['compile_after']}")


def machine() -> dict:
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "numba": numba.__version__,
            "numba_threads": numba.config.NUMBA_NUM_THREADS, "simulated": core.spec.name,
            "compile_after": adaptive.options.compile_after}


# -- output ---------------------------------------------------------------------------------
def _f(value, spec: str, width: int, unit: str = "") -> str:
    if value is None:
        return f"{'-':>{width + len(unit)}}"
    text = f"{value:{width}{spec}}{unit}"
    return text if text.startswith(" ") else " " + text  # (a wider value: still apart)


def table(results: list[dict]) -> str:
    width = max([13] + [len(r["workload"]) for r in results])
    head = (f"{'workload':<{width}}{'size':>6} |{'cpu ms':>8}{'plain ms':>9}{'adapt ms':>9}"
            f"{'a/p':>7} |{'launches p/a':>14}{'a/p':>7} |{'device ms p/a':>16}{'a/p':>7} |"
            f"{'MB moved p/a':>15} |{'peak MB p/a':>13} |{'compile':>8} | bits")
    lines = [head]
    for r in results:
        m, ratio = r["modes"], r["ratios"].get("adaptive_vs_plain", {})
        cpu, plain, fast = (m.get(k) for k in MODES)

        def get(side, key):
            return side[key] if side else None

        def wall(side):
            return side["wall_ms"]["median"] if side else None

        bits = {True: "same", False: "DIFFERENT", None: "-"}[r.get("same_bits")]
        lines.append(
            f"{r['workload']:<{width}}{r['size']:>6} |{_f(wall(cpu), '.2f', 8)}"
            f"{_f(wall(plain), '.2f', 9)}{_f(wall(fast), '.2f', 9)}"
            f"{_f(ratio.get('wall'), '.2f', 6, 'x')} |"
            f"{_f(get(plain, 'launches_per_step'), '.0f', 7)}"
            f"{_f(get(fast, 'launches_per_step'), '.0f', 7)}"
            f"{_f(ratio.get('launches'), '.2f', 6, 'x')} |"
            f"{_f(get(plain, 'device_ms_per_step'), '.3f', 8)}"
            f"{_f(get(fast, 'device_ms_per_step'), '.3f', 8)}"
            f"{_f(ratio.get('device'), '.2f', 6, 'x')} |"
            f"{_f(get(plain, 'hbm_mb_moved_per_step'), '.2f', 8)}"
            f"{_f(get(fast, 'hbm_mb_moved_per_step'), '.2f', 7)} |"
            f"{_f(get(plain, 'peak_hbm_mb'), '.2f', 7)}{_f(get(fast, 'peak_hbm_mb'), '.2f', 6)} |"
            f"{_f(get(fast, 'compile_s'), '.2f', 7, 's')} | {bits}")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> bool:
    """Bars per workload: host wall time per mode, launches and simulated device time per
    device mode. False (and nothing written) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r['workload']}\n{r['size']}" for r in results]
    panels = [("host wall time per step (ms, median)", lambda s: s["wall_ms"]["median"], MODES),
              ("kernels launched per step", lambda s: s["launches_per_step"], DEVICE_MODES),
              ("simulated device time per step (ms)", lambda s: s["device_ms_per_step"],
               DEVICE_MODES)]
    panels = [(title, value, [m for m in modes if any(m in r["modes"] for r in results)])
              for title, value, modes in panels]
    panels = [panel for panel in panels if panel[2]]  # e.g. no device panels for --modes cpu
    colors = {"cpu": "#9e9e9e", "plain": "#1f77b4", "adaptive": "#ff7f0e"}
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(max(8, 1.1 * len(labels) + 2), 3.4 * len(panels)))
    for ax, (title, value, present) in zip(axes[:, 0], panels):
        width = 0.8 / max(len(present), 1)
        for k, mode in enumerate(present):
            xs = [i + (k - (len(present) - 1) / 2) * width for i in range(len(results))]
            ys = [value(r["modes"][mode]) if mode in r["modes"] else 0 for r in results]
            ax.bar(xs, [y or 0 for y in ys], width, label=mode, color=colors[mode])
        ax.set_title(title, fontsize=10)
        ax.set_yscale("log")
        ax.set_xticks(range(len(results)), labels, fontsize=8)
        ax.legend(fontsize=8)
    fig.suptitle("neuron-eager: plain vs adaptive eager (and torch CPU)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="neuron-eager bench",
        description="Plain vs adaptive eager (and torch CPU) on built-in workloads or yours.")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--quick", action="store_true",
                     help="the default: small sizes, 3 warm-up + 5 measured steps per mode")
    how.add_argument("--full", action="store_true",
                     help="small and medium sizes, 4 warm-up + 11 measured steps per mode")
    parser.add_argument("--workloads", default="",
                        help=f"comma-separated, from {', '.join(workloads.names())} (default all)")
    parser.add_argument("--sizes", default="", help="comma-separated: small, medium (for the "
                        "chains 1K and 1M elements; also accepted as 1K, 1M)")
    parser.add_argument("--script", action="append", default=[], metavar="PATH[:NAME]",
                        help="your own workload (repeatable): NAME(device) (default `step`) "
                        "builds it, seeded with 0 per mode, and returns a function running "
                        "one step (or is itself called for every step)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: cpu, plain, "
                        "adaptive (default all)")
    parser.add_argument("--warmup", type=int, help="steps per mode before measuring")
    parser.add_argument("--repeat", type=int, help="measured steps per mode")
    parser.add_argument("--out", default="neuron-eager-bench",
                        help="folder for bench.json and bench.png (default ./neuron-eager-bench)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.description = __doc__.splitlines()[0]
    args = parser.parse_args(argv)

    preset = FULL if args.full else QUICK
    aliases = {label: size for size, label in _CHAIN_SIZES.items()}  # 1K -> small, 1M -> medium
    sizes = tuple(aliases.get(s, s) for s in args.sizes.split(",") if s) or preset["sizes"]
    if any(s not in SIZES for s in sizes):
        parser.error(f"--sizes takes {', '.join(SIZES)} (the chains' 1K and 1M)")
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes {', '.join(MODES)}")
    warmup = preset["warmup"] if args.warmup is None else args.warmup
    repeat = preset["repeat"] if args.repeat is None else args.repeat
    if warmup < 0 or repeat < 1:
        parser.error("--warmup must be >= 0 and --repeat >= 1")
    out = outputs.folder(parser, "--out", args.out)
    names = [n for n in args.workloads.split(",") if n]
    jobs = [script_job(s) for s in args.script]
    if names or not jobs:
        jobs = builtin_jobs(names, sizes) + jobs

    info = machine()
    print(describe(info))
    print(f"{warmup} warm-up + {repeat} measured steps per mode; per step: "
          f"wall time (median), launches, simulated device time, HBM moved; peak HBM")
    progress = Progress(len(jobs) * (warmup + repeat))
    results = []
    for job in jobs:
        results.append(result(job, run_job(job, modes, warmup, repeat, progress)))
    progress.close()
    print(table(results))

    report = {"machine": info, "settings": {"warmup": warmup, "repeat": repeat,
                                            "modes": list(modes), "sizes": list(sizes)},
              "results": results}
    (out / "bench.json").write_text(json.dumps(report, indent=1))
    written = [str(out / "bench.json")]
    if not args.no_plot:
        if plot(results, out / "bench.png"):
            written.append(str(out / "bench.png"))
        else:
            print("(no plot: matplotlib is not installed)")
    print("wrote " + ", ".join(written))
    if any(r.get("same_bits") is False for r in results):
        print("plain and adaptive eager computed different bits: please report this")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
