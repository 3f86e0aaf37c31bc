"""The simulated NeuronCore: its spec, its HBM and its launch counters.

One process simulates one NeuronCore (as torchrun runs one process per core).
Kernels report each launch here; the counters are what tests and benchmarks
read to prove that the device, not the host, did the work.
"""
from __future__ import annotations

from .config import config
from .hbm import CachingAllocator
from .spec import CHIPS, ChipSpec

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


class NeuronCore:
    def __init__(self, spec: ChipSpec, hbm_bytes: int | None = None):
        self.spec = spec
        self.hbm = CachingAllocator(hbm_bytes if hbm_bytes is not None else spec.hbm_per_core)
        self.kernels_launched = 0
        self.hbm_bytes_moved = 0
        self.launches_by_engine: dict[str, int] = dict.fromkeys(ENGINES, 0)
        self.elements_by_engine: dict[str, int] = dict.fromkeys(ENGINES, 0)

    def launch(self, engine: str, elements: int, nbytes: int) -> None:
        """Account one kernel launch: its engine, the elements it computed, HBM bytes moved."""
        self.kernels_launched += 1
        self.hbm_bytes_moved += nbytes
        self.launches_by_engine[engine] += 1
        self.elements_by_engine[engine] += elements

    def reset_counters(self) -> None:
        self.kernels_launched = 0
        self.hbm_bytes_moved = 0
        self.launches_by_engine.update(dict.fromkeys(ENGINES, 0))
        self.elements_by_engine.update(dict.fromkeys(ENGINES, 0))


def _make_core() -> NeuronCore:
    if config.chip not in CHIPS:
        raise ValueError(f"NEURON_EAGER_CHIP={config.chip!r} is not one of {sorted(CHIPS)}")
    return NeuronCore(CHIPS[config.chip], config.hbm_bytes)


core = _make_core()
