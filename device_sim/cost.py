"""The engine cost model: how long one kernel launch takes on a simulated NeuronCore.

A launch reports its work (engine, elements, HBM bytes read and written, matmul shape or
tiles); `CostModel.cost` turns it into a `Cost` in nanoseconds from the chip spec and the
named parameters below. Every formula and figure is in docs/cost-model.md, with sources.
Pure arithmetic on the inputs: the same work gives the same time on any machine.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import config
from .spec import ChipSpec

KiB = 1 << 10
PARTITIONS = 128  # Tensor array rows/columns, SBUF partitions, Vector/Scalar lanes
MATMUL_K = 128  # contraction per matmul instruction (partition axis of both operands)
MATMUL_M = 128  # stationary free size
MATMUL_N = 512  # moving free size (gemm_moving_fmax)
MATMUL_MIN_CYCLES = 64  # issue interval floor: max(N, 64) cycles per matmul instruction


@dataclass(frozen=True)
class Cost:
    """One launch's simulated duration and its parts, in nanoseconds."""

    duration_ns: float
    overhead_ns: float
    dma_ns: float
    engine_ns: float
    transfers: int
    tiles: int  # Tensor-engine matmul instructions (0 for other engines)

    @property
    def duration_ps(self) -> int:
        """The duration on the clock, in whole picoseconds."""
        return round(self.duration_ns * 1000)


@dataclass
class CostModel:
    """Launch durations for one chip. Parameters without a public figure are named fields.

    >>> from neuron_eager.device_sim.spec import CHIPS
    >>> model = CostModel(CHIPS["trn2"])
    >>> round(model.cost("vector", 64, 768).duration_ns, 1)
    11469.8
    """

    spec: ChipSpec
    # Per-launch fixed cost of plain eager (runtime dispatch, semaphores, instruction fetch).
    # No public figure exists; 10 us is the order of a GPU runtime's launch (3-10 us).
    launch_overhead_ns: float = field(default_factory=lambda: config.launch_overhead_ns)
    # DMA: fixed cost per transfer (NKI performance guide: about 1.3 us) ...
    dma_fixed_ns: float = 1_300.0
    # ... and bandwidth per DMA engine (guide: 17-33 B/ns; we take the middle, 25 B/ns).
    dma_engine_bytes_per_ns: float = 25.0
    # One transfer moves at most one SBUF tile: 128 partitions x 2 KiB (the guide's
    # "at least 2 KiB per partition" efficiency threshold).
    tile_bytes: int = PARTITIONS * 2 * KiB
    # Vector/Scalar/GpSimd: free elements per instruction (128 partitions x 512 fp32 = one
    # 2 KiB-per-partition tile) and the static cost of an instruction (guide: ~100 cycles
    # of instruction overhead + ~60 cycles to start an SBUF access).
    free_elements: int = 512
    instruction_cycles: int = 160
    # Cycles per free element of one partition (guide: a Vector instruction over N free
    # elements takes about N cycles). GpSimd has no public figure: 4x Vector, assumed.
    cycles_per_element: tuple = (("vector", 1.0), ("scalar", 1.0), ("gpsimd", 4.0))

    def __post_init__(self):
        self._cpe = dict(self.cycles_per_element)

    # -- the parts ------------------------------------------------------------------------
    @property
    def dma_bytes_per_ns(self) -> float:
        """All DMA engines together, capped by the core's share of HBM bandwidth."""
        hbm = self.spec.hbm_bandwidth / self.spec.cores_per_chip / 1e9
        return min(self.spec.dma_engines * self.dma_engine_bytes_per_ns, hbm)

    def clock_hz(self, engine: str) -> float:
        s = self.spec
        return {"tensor": s.clock_tensor_hz, "vector": s.clock_vector_hz,
                "scalar": s.clock_scalar_hz, "gpsimd": s.clock_gpsimd_hz}[engine]

    def transfers(self, nbytes: int, bytes_read: int | None, bytes_written: int | None) -> int:
        """DMA transfers: one per tile of each direction (at least one load and one store
        when only the total is known)."""
        tb = self.tile_bytes
        if bytes_read is None or bytes_written is None:
            return -(-nbytes // tb) + 1 if nbytes > 0 else 0
        return -(-bytes_read // tb) + -(-bytes_written // tb)

    def dma_ns(self, nbytes: int, transfers: int) -> float:
        """Fixed costs overlap across the DMA engines; bytes stream at the aggregate rate."""
        if nbytes <= 0:
            return 0.0
        waves = -(-transfers // self.spec.dma_engines)
        return waves * self.dma_fixed_ns + nbytes / self.dma_bytes_per_ns

    def elementwise_cycles(self, engine: str, elements: int) -> float:
        if elements <= 0:
            return 0.0
        per_partition = -(-elements // PARTITIONS)
        instructions = -(-per_partition // self.free_elements)
        return per_partition * self._cpe[engine] + instructions * self.instruction_cycles

    def matmul_tiles(self, batch: int, m: int, k: int, n: int) -> tuple[int, int]:
        """(instructions, issue cycles at the bf16 rate) of a [batch] (m,k) @ (k,n) matmul:
        out[M<=128, N<=512] per instruction, K accumulated in chunks of 128."""
        blocks = batch * -(-m // MATMUL_M) * -(-k // MATMUL_K)
        full, rest = divmod(n, MATMUL_N)
        cycles = full * MATMUL_N + (max(rest, MATMUL_MIN_CYCLES) if rest else 0)
        return blocks * (full + (rest > 0)), blocks * cycles

    def matmul_factor(self, dtype: str | None) -> int:
        """fp32 inputs run at a quarter of the bf16 rate, unless --auto-cast rounds them."""
        if dtype in (None, "fp32") and config.auto_cast == "none":
            return 4
        return 1

    # -- the whole launch -----------------------------------------------------------------
    def cost(self, engine: str, elements: int, nbytes: int, *, bytes_read: int | None = None,
             bytes_written: int | None = None, matmul: tuple | None = None,
             tiles: int | None = None, dtype: str | None = None) -> Cost:
        """duration = overhead + max(D, E) + min(D, E) / S (docs/cost-model.md)."""
        transfers = self.transfers(nbytes, bytes_read, bytes_written)
        dma = self.dma_ns(nbytes, transfers)
        count = 0
        if engine == "tensor":
            if matmul is not None:  # one (batch, m, k, n) or a list of them
                shapes = matmul if isinstance(matmul, list) else [matmul]
                count = cycles = 0
                for shape in shapes:
                    c, cy = self.matmul_tiles(*shape)
                    count, cycles = count + c, cycles + cy
            elif tiles is not None:
                count, cycles = tiles, tiles * MATMUL_N
            else:  # shape unknown: full 128x128 tiles (a lower bound)
                full = PARTITIONS * PARTITIONS
                cycles = max(-(-elements // full), MATMUL_MIN_CYCLES) if elements > 0 else 0
                count = -(-elements // (full * MATMUL_N))
            compute = cycles * self.matmul_factor(dtype) / self.clock_hz("tensor") * 1e9
        elif engine == "dma":
            compute = 0.0
        else:
            compute = self.elementwise_cycles(engine, elements) / self.clock_hz(engine) * 1e9
        stages = max(1, -(-nbytes // self.tile_bytes))  # tiles in the double-buffered loop
        body = max(dma, compute) + min(dma, compute) / stages
        overhead = self.launch_overhead_ns
        return Cost(overhead + body, overhead, dma, compute, transfers, count)
