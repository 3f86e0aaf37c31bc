"""Meta runs: an op run on meta tensors gives the CPU's argument checks and the outputs'
shapes, strides and dtypes without computing anything.

Some meta kernels are Python decompositions (native_layer_norm's costs about a millisecond,
more than the op itself at training sizes), so successful runs are cached by the
arguments' signature: tensor layouts and dtypes, every other argument's value. A call that
raises is never cached: it raises again, at the user's line.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

_cache: dict = {}
_LIMIT = 4096


def meta_run(op, *args, **kwargs):
    """`op(*args, **kwargs)` on meta copies of the tensors. The result (meta tensors) is
    shared between calls with the same signature: read its metadata, never write it."""
    key = (op, _signature(args), _signature(tuple(sorted(kwargs.items()))))
    try:
        hit = _cache.get(key)
    except TypeError:  # an unhashable argument: run it every time
        return _run(op, args, kwargs)
    if hit is None:
        if len(_cache) >= _LIMIT:
            _cache.clear()
        hit = _cache[key] = _run(op, args, kwargs)
    return hit


def _run(op, args, kwargs):
    def to_meta(a):
        if isinstance(a, torch.Tensor):
            return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
        return a

    return op(*tree_map(to_meta, args), **tree_map(to_meta, kwargs))


def _signature(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype)
    if type(value) in (list, tuple):
        return (type(value).__name__, *[_signature(v) for v in value])
    return (type(value), value)
