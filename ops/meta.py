"""Meta runs: an op run on meta tensors gives the CPU's argument checks and the outputs'
shapes, strides and dtypes without computing anything.

Some meta kernels are Python decompositions (native_layer_norm's costs about a millisecond,
more than the op itself at training sizes), so successful runs are cached by the
arguments' signature: tensor layouts and dtypes, every other argument's value. A call that
raises is never cached: it raises again, at the user's line.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._pytree import tree_map

_cache: dict = {}
_LIMIT = 4096


def meta_run(op, *args, **kwargs):
    """`op(*args, **kwargs)` on meta copies of the tensors, a refusal raised in the CPU's
    words. The result (meta tensors) is shared between calls with the same signature: read
    its metadata, never write it."""
    return _cached(_run, op, args, kwargs)


def meta_outputs(op, args, kwargs=None):
    """`op(*args, **kwargs)` on meta copies of the tensors, cached as meta_run caches,
    raising what the meta kernel raises (NotImplementedError where it has none)."""
    return _cached(_run_meta, op, args, kwargs or {})


def _cached(run, op, args, kwargs):
    # (the default dtype: a factory's, or an integer op's float result, follows it)
    key = (run, op, torch.get_default_dtype(), _signature(args),
           tuple([(k, _signature(v)) for k, v in sorted(kwargs.items())]) if kwargs else ())
    try:
        hit = _cache.get(key)
    except TypeError:  # an unhashable argument: run it every time
        return run(op, args, kwargs)
    if hit is None:
        if len(_cache) >= _LIMIT:
            _cache.clear()
        hit = _cache[key] = run(op, args, kwargs)
    return hit


def _run_meta(op, args, kwargs):
    def to_meta(a):
        if isinstance(a, torch.Tensor):
            return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
        return a

    with as_cpu_kernels():
        return op(*tree_map(to_meta, args), **tree_map(to_meta, kwargs))


@contextlib.contextmanager
def as_cpu_kernels():
    """Around a meta run that stands for a CPU kernel: deterministic mode off. Meta kernels
    take a meta tensor for a CUDA one and refuse, in deterministic mode, what CUDA computes
    nondeterministically (histc, median with indices); the CPU's kernels and ours do not."""
    if not torch.are_deterministic_algorithms_enabled():
        yield
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)


def _run(op, args, kwargs):
    try:
        return _run_meta(op, args, kwargs)
    except (RuntimeError, AssertionError) as error:  # (Python meta kernels assert some checks)
        in_cpu_words(op, args, kwargs)
        raise error


# Note [Errors in the CPU's words]
# Meta kernels check what the CPU checks, often in other words (a Python reference says
# "gather(): Expected dtype int32/int64 for index, but got torch.float32", the CPU "gather():
# Expected dtype int32/int64 for index"). Where a meta run refuses a call, the call runs
# once more on CPU stand-ins, zero-stride views with no memory to speak of (a written
# argument gets memory of its own), and the CPU's error is raised if it has one. Only the
# error path pays; the CPU raises before it computes.
_STAND_IN_ELEMENTS = 1 << 20  # a larger stand-in has zero strides: no memory


def in_cpu_words(op, args, kwargs) -> None:
    """Raise the CPU's error for `op(*args, **kwargs)` on stand-ins, if it has one."""
    schema = getattr(op, "_schema", None)
    written = set() if schema is None else {
        a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    names = [] if schema is None else [a.name for a in schema.arguments]

    def stand_in(a, writable=False):
        if isinstance(a, torch.Tensor):
            if writable:
                return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype)
            extent = sum((n - 1) * abs(s) for n, s in zip(a.shape, a.stride())) + 1
            if 0 not in a.shape and extent <= _STAND_IN_ELEMENTS:  # (messages quote strides)
                return torch.zeros(extent, dtype=a.dtype).as_strided(a.shape, a.stride())
            return torch.zeros((), dtype=a.dtype).expand(a.shape)
        if isinstance(a, torch.device):
            return torch.device("cpu")
        return a

    cpu_args = [tree_map(lambda t, w=(i < len(names) and names[i] in written): stand_in(t, w), a)
                for i, a in enumerate(args)]
    cpu_kwargs = {k: tree_map(lambda t, w=(k in written): stand_in(t, w), v)
                  for k, v in kwargs.items()}
    try:
        with torch._C._DisableTorchDispatch():
            op(*cpu_args, **cpu_kwargs)
    except (RuntimeError, IndexError, TypeError, ValueError, NotImplementedError) as cpu_error:
        raise cpu_error from None


def _signature(value):
    kind = type(value)
    if kind is list or kind is tuple:
        for v in value:
            if type(v) is not int:
                return (kind.__name__, *[_signature(v) for v in value])
        return (kind, tuple(value))  # (a shape: ints only, the common case, in one step)
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype)
    return (kind, value)
