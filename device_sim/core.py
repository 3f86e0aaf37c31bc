"""The simulated NeuronCore: its spec, its HBM, its clock and its launch counters.

One process simulates one NeuronCore (as torchrun runs one process per core).
Kernels report each launch here: the cost model (cost.py) prices it, the clock
(clock.py) places it on the current stream, and the counters are what tests and
benchmarks read to prove that the device, not the host, did the work.
"""
from __future__ import annotations

from .clock import ENGINES, Clock
from .config import config, read_at_import
from .cost import CostModel
from .hbm import CachingAllocator
from .spec import CHIPS, ChipSpec

_CACHE_LIMIT = 4096  # distinct launch kinds kept priced


class NeuronCore:
    def __init__(self, spec: ChipSpec, hbm_bytes: int | None = None):
        self.spec = spec
        self.hbm = CachingAllocator(hbm_bytes if hbm_bytes is not None else spec.hbm_per_core)
        self.cost_model = CostModel(spec)
        self.clock = Clock()
        self._priced: dict = {}
        self.launches_by_engine: dict[str, int] = dict.fromkeys(ENGINES, 0)
        self.elements_by_engine: dict[str, int] = dict.fromkeys(ENGINES, 0)
        self.reset_counters()

    def launch(self, engine: str, elements: int, nbytes: int, *, bytes_read: int | None = None,
               bytes_written: int | None = None, matmul: tuple | None = None,
               tiles: int | None = None, dtype: str | None = None):
        """Account one kernel launch: its engine, the elements it computed (MACs on the
        Tensor engine), the HBM bytes it moved; optionally the bytes read and written, the
        matmul shape (batch, m, k, n) or instruction count, and the input dtype ("fp32",
        "bf16", ...). Returns its `Cost`.

        >>> from neuron_eager.device_sim import core
        >>> core.launch("vector", 64, 768).duration_ns > 0
        True
        """
        self.kernels_launched += 1
        self.hbm_bytes_moved += nbytes
        self.launches_by_engine[engine] += 1
        self.elements_by_engine[engine] += elements
        if bytes_read is not None or bytes_written is not None or type(matmul) is list:
            cost = self.cost_model.cost(engine, elements, nbytes, bytes_read=bytes_read,
                                        bytes_written=bytes_written, matmul=matmul,
                                        tiles=tiles, dtype=dtype)
            start, end = self.clock.schedule(engine, cost.duration_ps)
        else:  # the hot path: launch kinds repeat (a model's matmuls too), prices are cached
            key = (engine, elements, nbytes) if matmul is None and tiles is None and \
                dtype is None else (engine, elements, nbytes, matmul, tiles, dtype,
                                    config.auto_cast)  # (a matmul's rate depends on it)
            priced = self._priced.get(key)
            if priced is None:
                if len(self._priced) >= _CACHE_LIMIT:
                    self._priced.clear()
                c = self.cost_model.cost(engine, elements, nbytes, matmul=matmul, tiles=tiles,
                                         dtype=dtype)
                priced = self._priced[key] = (c, c.duration_ps)
            cost, duration = priced
            start, end = self.clock.schedule(engine, duration)
        if self.clock.records is not None:
            self.clock.record(engine, start, end, cost, elements, nbytes, self.hbm)
        return cost

    def set_cost_model(self, model: CostModel) -> None:
        """Price later launches with `model` (e.g. another launch overhead)."""
        self.cost_model = model
        self._priced.clear()

    def reset_counters(self) -> None:
        self.kernels_launched = 0
        self.hbm_bytes_moved = 0
        self.launches_by_engine.update(dict.fromkeys(ENGINES, 0))
        self.elements_by_engine.update(dict.fromkeys(ENGINES, 0))


def _make_core() -> NeuronCore:
    if config.chip not in CHIPS:
        raise ValueError(f"NEURON_EAGER_CHIP={config.chip!r} is not one of {sorted(CHIPS)}")
    made = NeuronCore(CHIPS[config.chip], config.hbm_bytes)
    read_at_import("chip", "hbm_bytes", "launch_overhead_ns")
    return made


core = _make_core()
