"""The simulated NeuronCore: chip specs, the HBM caching allocator, counters.

This layer knows nothing about torch; it deals in bytes, engines and counts.
"""
from neuron_eager.device_sim.config import config
from neuron_eager.device_sim.core import NeuronCore, core
from neuron_eager.device_sim.hbm import Block, CachingAllocator, OutOfMemory
from neuron_eager.device_sim.spec import CHIPS, ChipSpec

__all__ = ["config", "NeuronCore", "core", "Block", "CachingAllocator", "OutOfMemory", "CHIPS", "ChipSpec"]
