"""Chip specifications (per NeuronCore unless named otherwise).

Figures are AWS's public ones (see docs/TRAINIUM facts); the per-core HBM share
is the chip's HBM divided by its physical NeuronCores.
"""
from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10


@dataclass(frozen=True)
class ChipSpec:
    name: str
    cores_per_chip: int
    hbm_per_chip: int  # bytes
    hbm_bandwidth: float  # bytes per second, per chip
    sbuf_partitions: int
    sbuf_bytes_per_partition: int
    psum_bytes_per_partition: int
    psum_banks: int
    tensor_tflops_bf16: float
    tensor_tflops_fp32: float
    clock_tensor_hz: float
    clock_vector_hz: float
    clock_scalar_hz: float
    clock_gpsimd_hz: float
    dma_engines: int

    @property
    def hbm_per_core(self) -> int:
        return self.hbm_per_chip // self.cores_per_chip

    @property
    def sbuf_bytes(self) -> int:
        return self.sbuf_partitions * self.sbuf_bytes_per_partition

    @property
    def psum_bytes(self) -> int:
        return self.sbuf_partitions * self.psum_bytes_per_partition


CHIPS = {
    "trn1": ChipSpec("trn1", 2, 32 * GiB, 820e9, 128, 192 * KiB, 16 * KiB, 8,
                     92.0, 23.0, 2.8e9, 1.12e9, 1.4e9, 1.4e9, 16),
    "trn2": ChipSpec("trn2", 8, 96 * GiB, 2.9e12, 128, 224 * KiB, 16 * KiB, 8,
                     79.0, 20.0, 2.4e9, 0.96e9, 1.2e9, 1.2e9, 16),
    "trn3": ChipSpec("trn3", 8, 144 * GiB, 4.9e12, 128, 256 * KiB, 16 * KiB, 8,
                     79.0, 20.0, 2.4e9, 1.2e9, 1.2e9, 1.2e9, 16),
}
