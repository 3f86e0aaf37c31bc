"""Running a flushed region: planning, the adaptive policy, and fused or op-by-op launches.

A plan is cached by the region's signature (ops, operand refs, dtypes, shapes, input
layouts, which results are still referenced, numerics settings). It drops dead ops, splits
the rest into groups whose shapes nest under one broadcast shape, and lays each group out
as a flat or 4-D strided loop. The policy is a small state machine per plan: the first
`compile_after - 1` sightings run op by op through the normal kernels (no compile stall);
from then on each group of two or more ops runs as one cached fused kernel, and a kernel
that fails to compile leaves its group running op by op. Intermediates that no live
tensor references are never written to HBM.
"""
from __future__ import annotations

from collections import Counter, deque
from math import prod

import numpy as np

from neuron_eager.device_sim import config, core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import kernelgen, numerics
from neuron_eager.ops import tensor as T

from . import codegen, recording

STATS_ZERO = dict(ops_recorded=0, regions=0, kernels_launched=0, fused_kernels=0,
                  unfused_ops=0, cache_hits=0, cache_misses=0, compile_failures=0,
                  compile_seconds=0.0, hbm_bytes_moved=0, hbm_bytes_not_moved=0)
stats: dict = dict(STATS_ZERO)
flush_reasons: Counter = Counter()
history: deque = deque(maxlen=16)  # what explain() shows
_plans: dict = {}
_PLAN_LIMIT = 4096


class Group:
    """Ops of a region run as one loop: `nodes` (region indices, in order), `stored` (those
    whose results are written), and once laid out, the fused kernel's spec and arguments."""

    __slots__ = ("nodes", "stored", "shape", "spec", "arrays", "scalars", "engine",
                 "moved", "not_moved", "kernel")

    def __init__(self, j: int, shape: tuple):
        self.nodes, self.shape, self.spec, self.kernel = [j], shape, None, None


class Plan:
    __slots__ = ("groups", "seen")

    def __init__(self, groups):
        self.groups, self.seen = groups, 0


def _broadcast(a: tuple, b: tuple) -> tuple | None:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


def _strides_in(shape: tuple, stride: tuple, group_shape: tuple) -> list[int]:
    """Strides of a tensor read (or written) over the group's broadcast shape."""
    lead = len(group_shape) - len(shape)
    return [0] * lead + [st if n == g else 0
                         for n, st, g in zip(shape, stride, group_shape[lead:])]


def _plan(region, alive: list[bool]) -> Plan:
    nodes = region.nodes
    needed = list(alive)
    for j in range(len(nodes) - 1, -1, -1):
        if needed[j]:
            for kind, ref in nodes[j].refs:
                if kind == "n":
                    needed[ref] = True
    groups: list[Group] = []
    group_of: dict[int, Group] = {}
    for j, node in enumerate(nodes):
        if not needed[j]:
            continue  # dead: nothing reads it, nothing will
        g = groups[-1] if groups else None
        shape = _broadcast(g.shape, node.shape) if g is not None else None
        if shape is not None and (shape == g.shape or shape == node.shape):
            g.nodes.append(j)
            g.shape = shape
        else:
            g = Group(j, node.shape)
            groups.append(g)
        group_of[j] = g
    crossing = set()  # results read by a later group: written even if no tensor holds them
    for k in group_of:
        for kind, ref in nodes[k].refs:
            if kind == "n" and group_of[ref] is not group_of[k]:
                crossing.add(ref)
    for g in groups:
        g.stored = [j for j in g.nodes if alive[j] or j in crossing]
        if len(g.nodes) > 1:
            _lay_out(region, g)
    return Plan(groups)


def _lay_out(region, g: Group) -> None:
    """The fused kernel's spec and argument sources for group `g` (None spec: op by op)."""
    nodes, shape = region.nodes, g.shape
    n = prod(shape)
    if n == 0:
        return
    local = {j: i for i, j in enumerate(g.nodes)}
    arrays: list = []  # ("i", m) or ("n", j): tensors read element by element
    scalars: list = []  # ("t", source) 0-dim tensors or ("s", node, k) host scalars
    array_index: dict = {}
    scalar_index: dict = {}
    specs, bytes_eager = [], 0
    for j in g.nodes:
        node = nodes[j]
        operands = []
        bytes_eager += prod(node.shape) * T.STORAGE_DTYPE[node.dtype].itemsize
        refs = list(node.refs) + [("p", k) for k in range(len(node.params))]
        for kind, ref in refs:
            if kind == "n" and ref in local:
                src = nodes[ref]
                operands.append(("v", local[ref], numerics.load_code(src.dtype)))
                bytes_eager += prod(node.shape) * T.STORAGE_DTYPE[src.dtype].itemsize
            elif kind in ("n", "i"):
                dtype, ishape = (nodes[ref].dtype, nodes[ref].shape) if kind == "n" else \
                    region.descs[ref][:2]
                code = numerics.load_code(dtype)
                if len(ishape) == 0:
                    k = scalar_index.setdefault((kind, ref), len(scalars))
                    if k == len(scalars):
                        scalars.append(("t", kind, ref))
                    operands.append(("t", k, code))
                else:
                    k = array_index.setdefault((kind, ref), len(arrays))
                    if k == len(arrays):
                        arrays.append((kind, ref))
                    operands.append(("a", k, code))
                    bytes_eager += prod(node.shape) * T.STORAGE_DTYPE[dtype].itemsize
            else:  # a Python scalar operand ("s", k) or parameter ("p", k)
                k = ref if kind == "s" else len(node.raw) + ref
                operands.append(("s", len(scalars)))
                scalars.append(("s", j, k))
        specs.append((node.op, tuple(operands), node.compute, numerics.CODE[node.dtype]))
    # strides (in elements) of every array over the group shape: outputs, then inputs
    strides = []
    for j in g.stored:
        node = nodes[j]
        strides.append(_strides_in(node.shape, T.contiguous_strides(node.shape), shape))
    for kind, ref in arrays:
        if kind == "n":
            ishape = nodes[ref].shape
            strides.append(_strides_in(ishape, T.contiguous_strides(ishape), shape))
        else:
            _, ishape, istride = region.descs[ref]
            strides.append(_strides_in(ishape, istride, shape))
    cshape, cstrides = kernelgen.coalesce(list(shape), strides)
    if len(cshape) > 4:
        return
    if len(cshape) == 1 and (cshape[0] == 1 or all(st[0] == 1 for st in cstrides)):
        layout, views = "c", [((cshape[0],), (1,)) for _ in cstrides]
    else:
        pad = 4 - len(cshape)
        layout = "s"
        views = [(tuple([1] * pad + cshape), tuple([0] * pad + st)) for st in cstrides]
    stores = tuple((local[j], k) for k, j in enumerate(g.stored))
    g.spec = (layout, tuple(specs), stores, len(g.stored), len(arrays), len(scalars))
    g.arrays = (views, arrays)
    g.scalars = scalars
    g.engine = "scalar" if any(nodes[j].op.engine == "scalar" for j in g.nodes) else "vector"
    itemsize = [T.STORAGE_DTYPE[nodes[j].dtype].itemsize for j in g.stored] + [
        T.STORAGE_DTYPE[nodes[r].dtype if kind == "n" else region.descs[r][0]].itemsize
        for kind, r in arrays]
    g.moved = n * sum(itemsize)
    g.not_moved = max(0, bytes_eager - g.moved)


def _view(t, shape: tuple, strides: tuple):
    size = T.STORAGE_DTYPE[t.dtype].itemsize
    return np.ndarray(shape, T.STORAGE_DTYPE[t.dtype], t._storage.buffer,
                        t.storage_offset() * size, [s * size for s in strides])


def _resolve(region, values, kind, ref):
    return values[ref] if kind == "n" else region.inputs[ref]


def _run_ops(region, values, g: Group) -> None:
    """The group's ops one by one, through the normal kernels."""
    for j in g.nodes:
        node = region.nodes[j]
        operands = [node.raw[ref] if kind == "s" else _resolve(region, values, kind, ref)
                    for kind, ref in node.refs]
        values[j] = E.run(node.op, operands, node.params)
        stats["unfused_ops"] += 1


def _run_fused(region, values, g: Group) -> str | None:
    """Launch the group's fused kernel; returns how ("hit", "compiled") or None if the
    kernel failed to compile (the caller runs the ops instead)."""
    nodes = region.nodes
    kernel = g.kernel
    compiled = False
    if kernel is None:
        label = "+".join(nodes[j].op.name for j in g.nodes)
        kernel, compiled = codegen.kernel_for(g.spec, label)
        g.kernel = kernel
    if kernel is codegen.FAILED:
        return None
    views, sources = g.arrays
    args = []
    for k, j in enumerate(g.stored):
        node = nodes[j]
        out = values[j] = T.new_contiguous(node.shape, node.dtype)
        args.append(_view(out, *views[k]))
    base = len(g.stored)
    for k, (kind, ref) in enumerate(sources):
        args.append(_view(_resolve(region, values, kind, ref), *views[base + k]))
    for entry in g.scalars:
        if entry[0] == "t":
            args.append(_resolve(region, values, entry[1], entry[2])._nd[()])
        else:
            args.append(nodes[entry[1]].scalars[entry[2]])
    if compiled:
        seconds = codegen.first_call(g.spec, kernel, args)
        if seconds is None:
            g.kernel = codegen.FAILED
            stats["compile_failures"] += 1
            return None
        stats["compile_seconds"] += seconds
        stats["cache_misses"] += 1
    else:
        n = args[0].shape[0]
        if g.spec[0] == "c" and n >= E.SPLIT_MIN:
            E._split_call(kernel, args[0], args[1:])
        else:
            kernel(*args)
        stats["cache_hits"] += 1
    core.launch(g.engine, prod(g.shape), g.moved)
    stats["fused_kernels"] += 1
    stats["hbm_bytes_not_moved"] += g.not_moved
    return "fused (compiled)" if compiled else "fused (cache hit)"


def run_region(region, reason: str) -> None:
    """Compute a flushed region and give its live pending tensors their storage."""
    nodes = region.nodes
    alive = [node.alive() for node in nodes]
    key = (tuple(node.key for node in nodes), tuple(region.descs), tuple(alive),
           config.numerics_key)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= _PLAN_LIMIT:
            _plans.clear()
        plan = _plans[key] = _plan(region, alive)
    plan.seen += 1
    fuse = plan.seen >= recording.options.compile_after
    launched, moved = core.kernels_launched, core.hbm_bytes_moved
    values: dict = {}
    modes = []
    for g in plan.groups:
        mode = None
        try:
            if fuse and g.spec is not None:
                mode = _run_fused(region, values, g)
            if mode is None:
                _run_ops(region, values, g)
                mode = f"op by op (sighting {plan.seen})" if g.spec is not None else "op by op"
        except Exception as e:
            node = nodes[g.nodes[0]]
            error = RuntimeError(f"adaptive eager: running {node.op.name} recorded at "
                                 f"{node.where[0]}:{node.where[1]} failed: {e}")
            for later in nodes:
                later.error = repr(e)  # a string: no traceback (and its frames) kept alive
            raise error from e
        finally:
            _give_storage(nodes, values, g)
        modes.append(mode)
    stats["ops_recorded"] += len(nodes)
    stats["regions"] += 1
    stats["kernels_launched"] += core.kernels_launched - launched
    stats["hbm_bytes_moved"] += core.hbm_bytes_moved - moved
    flush_reasons[reason] += 1
    history.append((reason, len(nodes), [
        ([nodes[j].op.name for j in g.nodes], sorted({nodes[j].where for j in g.nodes}),
         mode, prod(g.shape)) for g, mode in zip(plan.groups, modes)]))


def _give_storage(nodes, values, g: Group) -> None:
    for j in g.nodes:
        result = values.get(j)
        if result is None:
            continue
        for ref in nodes[j].outs:
            t = ref()
            if t is not None and "_storage" not in t.__dict__:
                d, src = t.__dict__, result.__dict__
                d["_storage"], d["_flat"], d["_key"] = result._storage, src.get("_flat"), \
                    result._key
                if "_nd" in src:
                    d["_nd"] = src["_nd"]
                del d["_node"]


recording.run_region = run_region
