"""Adaptive eager: record short elementwise op sequences and run them as fused, cached kernels.

Results are bit-identical to plain eager; print, `.item()`, `.cpu()`, `bool()` and any
non-fusible op are sync points. Off by default: `enable()`, `with adaptive_eager():`, or
NEURON_EAGER_ADAPTIVE=1. Off, the router's dispatcher is installed unwrapped.

>>> import torch, neuron_eager
>>> x = torch.ones(4, device="neuron")
>>> with neuron_eager.adaptive_eager():
...     y = (x * 2 + 1).relu()
...     print(y.cpu())
tensor([3., 3., 3., 3.])
"""
from __future__ import annotations

import contextlib
import sys
import threading
from math import prod

from neuron_eager.device_sim import config, forks
from neuron_eager.device_sim.config import read_at_import

from . import codegen, fusion, interrupts, launch, recording
from .recording import flush, options

__all__ = ["enable", "disable", "is_enabled", "adaptive_eager", "flush", "stats", "explain",
           "reset_stats", "options"]


def enable() -> None:
    """Record fusible ops from now on (all threads)."""
    recording.install()
    interrupts.install(_recorders_lock)  # (done at import, unless imported off the main thread)


def disable() -> None:
    """Run what is pending and go back to plain eager."""
    recording.uninstall()


def is_enabled() -> bool:
    return recording.active


# Note [Blocks from many threads]
# The mode is process-wide (autograd's backward records on its own thread), so blocks opened
# by several threads overlap: the mode is the one asked for by the block opened last that is
# still open, and when none is, the mode from before the first. A block that closes out of
# order (thread A's while thread B's is still open) leaves B's mode in force.
_blocks: list = []  # [token, enabled] of the open blocks, oldest first
_mode_before_blocks = [False]
_blocks_lock = threading.Lock()
forks.renew_after_fork(sys.modules[__name__], "_blocks_lock", threading.Lock)


def _set(enabled: bool) -> None:
    if enabled:
        enable()
    else:
        disable()


@contextlib.contextmanager
def adaptive_eager(enabled: bool = True):
    """Adaptive eager inside the block; the previous mode after it (pending ops run first).
    Blocks in several threads combine as Note [Blocks from many threads] says."""
    block = [object(), enabled]
    with _blocks_lock:
        if not _blocks:
            _mode_before_blocks[0] = is_enabled()
        _blocks.append(block)
        try:
            _set(enabled)  # (leaving adaptive eager runs what is pending, which may fail)
        except BaseException:
            _blocks.remove(block)  # not entered: the mode stays as it was
            _set(_current())
            raise
    try:
        yield
    finally:
        with _blocks_lock:
            _blocks.remove(block)
            _set(_current())  # (switched even when what was pending fails)


def _current() -> bool:
    """The mode of the open block opened last, or the one from before the blocks."""
    return _blocks[-1][1] if _blocks else _mode_before_blocks[0]


def stats() -> dict:
    """Counters since the last reset: ops recorded, regions flushed, kernels launched by
    them (fused and op by op), fused kernels, cache hits/misses, compile seconds and
    failures, HBM bytes moved and not moved (intermediates kept in registers), flushes by
    reason, the fused-kernel cache size, and of the new kernels how many Numba compiled and
    how many it loaded from the disk cache (disk_hits; disk_writes: kernel files written,
    disk_fallbacks: kernels made in memory because the disk cache failed), and ops run
    eagerly because they ran alone before (ops_run_alone: Note [Ops that run alone] in
    recording.py) or because they were foreach ops over small tensors, each one multi-tensor
    launch (foreach_ops_run_eagerly: Note [Foreach in adaptive eager] in ops/foreach.py)."""
    return dict(fusion.stats, **codegen.stats, **recording.counts,
                flush_reasons=dict(fusion.flush_reasons),
                cached_kernels=codegen.cache_size())


def reset_stats() -> None:
    fusion.stats.update(fusion.STATS_ZERO)
    codegen.stats.update(codegen.STATS_ZERO)
    recording.counts.update(ops_run_alone=0, foreach_ops_run_eagerly=0)
    fusion.flush_reasons.clear()
    fusion.history.clear()


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def explain(last: int = 5) -> str:
    """The `last` regions run (the latest 16 are kept): why each was flushed, and per group
    its ops, the user lines they were recorded at, how it ran (op by op, fused: compiled,
    loaded from the disk cache or a cache hit) and its elements."""
    if type(last) is not int:
        raise TypeError(f"explain(last): the number of regions to show, not {last!r}")
    lines = []
    if last <= 0:
        return ""  # (a slice [-0:] would be every region)
    for reason, count, plan, modes, wheres, site in list(fusion.history)[-last:]:
        unused = count - sum(len(g.all_nodes()) for g in plan.groups)
        skipped = f" ({unused} not run: nothing read their results)" if unused else ""
        lines.append(f"region of {_count(count, 'op')}{skipped}, flushed by "
                     f"{_REASONS.get(reason, reason)} at {launch.place(*site)}:")
        for g, mode in zip(plan.groups, modes):
            name = lambda j: plan.names[j].removesuffix("_plain")  # noqa: E731  (add_plain: add)
            ops = " | ".join(" -> ".join(name(j) for j in member.nodes)
                             for member in g.batch)  # (a batch: each member's loop in turn)
            by_line: dict = {}
            for j in g.all_nodes():
                by_line.setdefault(wheres[j], []).append(name(j))
            at = ", ".join(f"{launch.place(f, n)} ({', '.join(dict.fromkeys(names))})"
                           for (f, n), names in sorted(by_line.items()))
            elements = sum(prod(member.shape) for member in g.batch)
            lines.append(f"  {ops}  [{mode}, {_count(elements, 'element')}]  at {at}")
    return "\n".join(lines) if lines else "no regions run yet"


_REASONS = {"aten::_local_scalar_dense": ".item() or bool() (aten::_local_scalar_dense)",
            "aten::_to_copy": ".cpu() or .to() (aten::_to_copy)",
            "data read": "a read of its data (print, .tolist(), .numpy())"}


def _recorders_lock():
    return recording._lock


# Ctrl-C waits while the simulator's code runs, plain eager's too (Note [Interrupts])
interrupts.install(_recorders_lock)
if config.adaptive:
    enable()
read_at_import("adaptive")
