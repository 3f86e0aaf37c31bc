"""The simulated NeuronCore: chip specs, the HBM caching allocator, the cost model and
clock, counters.

This layer knows nothing about torch; it deals in bytes, engines and counts.
"""
from .clock import Clock
from .config import config
from .core import NeuronCore, core
from .cost import Cost, CostModel
from .hbm import Block, CachingAllocator, OutOfMemory
from .spec import CHIPS, ChipSpec

__all__ = ["config", "NeuronCore", "core", "Block", "CachingAllocator", "OutOfMemory", "CHIPS",
           "ChipSpec", "Clock", "Cost", "CostModel"]
