"""Adaptive eager: recording short op sequences and running them as fused kernels.

Not built yet (see the adaptive-eager issue); plain eager is the only mode.
"""
