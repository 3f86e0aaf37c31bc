"""Planning a flushed region (launch.py runs the plan), and the counters of both.

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

from neuron_eager.ops import elementwise as E
from neuron_eager.ops import kernelgen, numerics, workers
from neuron_eager.ops import tensor as T

from . import plans

STATS_ZERO = dict(ops_recorded=0, regions=0, kernels_launched=0, fused_kernels=0,
                  unfused_ops=0, cache_hits=0, cache_misses=0, compile_failures=0,
                  compile_seconds=0.0, hbm_bytes_moved=0, hbm_bytes_not_moved=0)
stats: dict = dict(STATS_ZERO)
flush_reasons: Counter = Counter()
history: deque = deque(maxlen=16)  # what explain() shows
_plans: dict = {}
_PLAN_LIMIT = 4096
# Note [The plan cache's size]
# A plan holds its region's keys, groups, kernel specs and argument layouts: ~0.8 KB an op,
# so 4096 plans of 200-op regions held ~700 MB in a program whose shapes never repeat (a
# buffer that grows each step). Plans are cleared together when their ops pass this count
# (~25 MB), or their number passes _PLAN_LIMIT; a program with static shapes keeps a few
# dozen. Kernels, cached by structure, stay.
_PLAN_OPS_LIMIT = 32768
plan_ops = 0  # ops of the plans in _plans


class Group:
    """Ops of a region run as one loop: `nodes` (region indices, in order), `stored` (those
    whose results are written), and once laid out, the fused kernel's spec and arguments.
    A row group (`full` set: the shape its reductions reduce, over the last `k` dims) gives
    each node a role: "full", "row" or "red" (adaptive/rowgen.py)."""

    __slots__ = ("nodes", "stored", "shape", "spec", "arrays", "scalars", "engine",
                 "moved", "not_moved", "kernel", "kernel_new", "full", "k", "roles", "fixed",
                 "alone", "batch", "elements", "moved_total", "not_moved_total", "batch_engine",
                 "aliased", "drops")

    def __init__(self, j: int, shape: tuple):
        self.nodes, self.shape, self.spec, self.kernel = [j], shape, None, None
        self.kernel_new = False
        self.full, self.k, self.roles, self.fixed, self.alone = None, 0, {}, False, False
        self.batch = (self,)  # the groups one launch runs (Note [Batches])
        self.aliased = frozenset()  # inputs the kernel reads through an output (_lay_out)
        self.drops = None  # op-by-op runs: node -> results no longer needed after it (_drops)

    def all_nodes(self) -> list[int]:
        return self.nodes if len(self.batch) == 1 else [j for g in self.batch for j in g.nodes]


class Plan:
    __slots__ = ("groups", "seen", "names", "let_go")

    def __init__(self, groups, names):
        self.groups, self.seen, self.names = groups, 0, names
        self.let_go = None  # op-by-op runs: node -> region inputs read for the last time


def _strides_in(shape: tuple, stride: tuple, group_shape: tuple) -> list[int]:
    """Strides of a tensor read (or written) over the group's broadcast shape."""
    lead = len(group_shape) - len(shape)
    return [0] * lead + [st if n == g else 0
                         for n, st, g in zip(shape, stride, group_shape[lead:])]


def _role(shape: tuple, full: tuple, k: int) -> str | None:
    """How a value of `shape` broadcasts over a row group's (rows, cols) split: one value
    per element ("full"), one per row ("row"), or neither (None)."""
    if len(shape) > len(full):
        return None
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    split = len(full) - k
    if any(n != f and n != 1 for n, f in zip(padded[:split], full[:split])):
        return None
    cols = padded[split:]
    if cols == full[split:]:
        return "full"
    return "row" if all(n == 1 for n in cols) else None


def _is_red(node) -> bool:
    return type(node.op) is plans.Reduction


def _stride(node) -> tuple:
    """The layout a node's value has in memory: contiguous, a recorded view's, or the one
    plain eager gives a result of non-contiguous operands."""
    return node.stride if node.stride is not None else T.contiguous_strides(node.shape)


def _in_shape(region, node) -> tuple:
    """The shape a reduction node reads."""
    kind, ref = node.refs[0]
    return tuple(region.nodes[ref].shape if kind == "n" else region.descs[ref][1])


def _joins_row(g: Group, region, j: int) -> bool:
    """Whether node j fits row group g (as full, row or reduction) and records its role."""
    node = region.nodes[j]
    inside = [ref for kind, ref in node.refs if kind == "n" and ref in g.roles]
    if _is_red(node):
        kind, ref = node.refs[0]
        if kind == "n" and ref in g.roles and g.roles[ref] != "full":
            return False
        if _in_shape(region, node) != g.full or len(node.op.dims) != g.k:
            return False
        g.roles[j] = "red" if node.op.keepdim else "out"
        return True
    role = _role(node.shape, g.full, g.k)
    if role is None:
        return False
    for ref in inside:
        if g.roles[ref] == "out" or (role == "row" and g.roles[ref] == "full"):
            return False
    g.roles[j] = role
    return True


def _to_row_group(g: Group, region, j: int, in_shape: tuple) -> bool:
    """Turn elementwise group g into a row group for reduction node j, if all its nodes fit."""
    nodes = region.nodes
    k = len(nodes[j].op.dims)
    roles = {}
    for i in g.nodes:
        role = _role(nodes[i].shape, in_shape, k)
        if role is None:
            return False
        roles[i] = role
    g.full, g.k, g.roles = in_shape, k, roles
    if _joins_row(g, region, j):
        return True
    g.full, g.k, g.roles = None, 0, {}
    return False


def _alone(node) -> bool:
    """Whether node makes a group of its own: a view (no kernel: its base's memory). (int64
    arithmetic, which must warn where it wraps, is not recorded: Note [int64 runs eagerly]
    in recording.py.)"""
    return node.op is plans.VIEW


# Note [Smaller ops in a bigger loop]
# An op of a smaller shape (a causal mask's `bias == 0`, broadcast over batch and heads) may
# join a group whose loop covers its shape several times: the loop then computes it once per
# element it broadcasts to. Joining saves a launch and the write and read of its result, and
# lets a later op reading both (masked_fill of the scores) join too, where a group of its own
# would leave the scores' group and the mask's group each a launch. It joins when the loop
# repeats it at most _REPEAT_LIMIT times, or when it reads a value of that group (writing it
# to memory to read it back broadcast would cost more). The same holds the other way round: a
# bigger op joining a smaller group makes the loop repeat the group's ops, so it joins on the
# same terms (two AdamW steps recorded in one region put a weight's update into its bias's
# group: the bias's nine ops ran 768 times over, 9 ms for a step plain eager runs in 3).
_REPEAT_LIMIT = 64


# Note [Kernel size]
# LLVM's time for a fused loop grows faster than its op count: 0.47 s for 16 ops, 0.53 s for
# 32, 1.2 s for 64, 2.3 s for 128 and 6.2 s for 255 (`b = b * 1.001 + 1e-4` in a loop). So a
# group takes at most _GROUP_OPS ops and the next op starts a new one (its input is written
# and read back once, as plain eager writes every result). A long loop's regions then split
# into equal pieces that share one kernel: 255 such ops compile twice in about a second.
_GROUP_OPS = 32


def _place(region, groups, group_of, last_read, j: int) -> int | None:
    """The index of the group node j joins, or None for a new group.

    A group runs after every group before it, so j may join an earlier group only if all
    it reads is computed by then, and a group of another shape only if it reads a value
    computed there; a node writing a tensor's memory (`target`) joins only
    after every group that reads the old value, and its group keeps one shape (Note
    [In-place ops] in recording.py). Reductions and row groups only extend the last group.
    """
    node = region.nodes[j]
    if not groups or _alone(node):
        return None
    last = len(groups) - 1
    g = groups[last]
    if g.alone or len(g.nodes) >= _GROUP_OPS:
        g = None
    if _is_red(node):
        in_shape = _in_shape(region, node)
        if g is None:
            return None
        if g.full is not None:
            return last if _joins_row(g, region, j) else None
        return last if g.shape == in_shape and not g.fixed and \
            _to_row_group(g, region, j, in_shape) else None
    if g is not None and g.full is not None:
        return last if node.target is None and _joins_row(g, region, j) else None
    reads = {group_of[ref] for kind, ref in node.refs if kind == "n"}
    lowest = max(reads, default=0)
    if node.target is not None:
        lowest = max(lowest, last_read.get(node.target, 0))
    for gi in range(last, lowest - 1, -1):
        g = groups[gi]
        if g.full is not None or g.alone or len(g.nodes) >= _GROUP_OPS:
            continue
        shape = E.try_broadcast([g.shape, node.shape])
        if shape is None or (shape != g.shape and shape != node.shape):
            continue
        if node.shape != g.shape and gi not in reads and \
                prod(shape) > _REPEAT_LIMIT * min(prod(g.shape), prod(node.shape)):
            continue  # (Note [Smaller ops in a bigger loop]: j's, or the group's ops)
        if g.fixed and shape != g.shape:
            continue  # it writes memory that it reads: one loop shape
        if node.target is not None and shape != node.shape:
            continue
        g.shape = shape
        g.fixed = g.fixed or node.target is not None
        return gi
    return None


def _plan(region, alive: list[bool]) -> Plan:
    nodes = region.nodes
    needed = list(alive)
    for j in range(len(nodes) - 1, -1, -1):
        if needed[j]:
            for kind, ref in nodes[j].refs:
                if kind == "n":
                    needed[ref] = True
    groups: list[Group] = []
    group_of: dict[int, int] = {}  # node -> index of its group
    last_read: dict[int, int] = {}  # region input -> the last group reading it
    for j, node in enumerate(nodes):
        if not needed[j]:
            continue  # dead: nothing reads it, nothing will
        gi = _place(region, groups, group_of, last_read, j)
        if gi is None:
            g = Group(j, node.shape)
            if _is_red(node):
                g.full, g.k = _in_shape(region, node), len(node.op.dims)
                g.roles[j] = "red" if node.op.keepdim else "out"
            g.fixed = node.target is not None
            g.alone = _alone(node)
            groups.append(g)
            gi = len(groups) - 1
        else:
            groups[gi].nodes.append(j)
        group_of[j] = gi
        for kind, ref in node.refs:
            if kind == "i":
                last_read[ref] = max(last_read.get(ref, -1), gi)
    crossing = set()  # results read by a later group: written even if no tensor holds them
    for k in group_of:
        for kind, ref in nodes[k].refs:
            if kind == "n" and group_of[ref] != group_of[k]:
                crossing.add(ref)
    for g in groups:
        g.stored = [j for j in g.nodes if alive[j] or j in crossing]
        if g.full is not None:
            g.shape = g.full
            if len(g.nodes) > 1:
                _lay_out_row(region, g)
        elif len(g.nodes) > 1:
            _lay_out(region, g)
    return Plan(_batch(region, groups), [node.op.name for node in nodes])


# Note [Batches]
# An optimizer step records the same chain once per parameter; parameters of one shape share
# a group, and parameters of other shapes, or with other chains (no weight decay, a gradient
# still being accumulated), make groups of their own. Small groups run as one launch, as a
# multi-tensor kernel does on a device, so launches do not grow with the number of parameter
# shapes. The simulator runs that launch by calling each member's cached loop in turn: one
# Numba function holding all the loops cost LLVM twice the compile time (it optimizes the
# inlined loops again), and separate loops are shared by every batch that has them. A later
# group joins a batch only if it may run at the batch's place: nothing between them computes
# a value it reads or reads the old value of memory it writes. Large groups stay apart (they
# split across threads on their own).
def _batch(region, groups: list) -> list:
    nodes = region.nodes
    kept: list = []
    heads: list = []  # indices in `kept` of batches that later groups may join
    for g in groups:
        if g.spec is None or prod(g.shape) >= workers.SPLIT_MIN:
            kept.append(g)
            continue
        for at in reversed(heads):
            if _may_move(nodes, g, kept[at + 1:]):
                head = kept[at]
                head.batch = head.batch + (g,)
                break
        else:
            heads.append(len(kept))
            kept.append(g)
    for g in kept:  # what the launch reports, summed once here
        if g.spec is not None:
            g.elements = sum(prod(m.shape) for m in g.batch)
            g.moved_total = sum(m.moved for m in g.batch)
            g.not_moved_total = sum(m.not_moved for m in g.batch)
            g.batch_engine = "scalar" if any(m.engine == "scalar" for m in g.batch) else "vector"
    return kept


def _may_move(nodes, g: Group, between: list) -> bool:
    """Whether `g` may run before the groups `between` (Note [Batches])."""
    reads_n = {ref for j in g.nodes for kind, ref in nodes[j].refs if kind == "n"}
    writes = {nodes[j].target for j in g.nodes if nodes[j].target is not None}
    for other in between:
        for j in other.all_nodes():
            if j in reads_n:
                return False
            if writes and any(kind == "i" and ref in writes for kind, ref in nodes[j].refs):
                return False
    return True


def _load_code(node, dtype) -> str:
    """The loader format of an operand: casts and reductions load without auto-cast, as
    their eager kernels do."""
    if node.op is plans.CONVERT or _is_red(node):
        return numerics.CODE[dtype]
    return numerics.load_code(dtype)


def _operands(region, g: Group, roles=None):
    """Each node's (op, operands, compute, out_code) spec part, the arrays and scalars the
    kernel reads, and the bytes plain eager would move for these ops."""
    nodes = region.nodes
    local = {j: i for i, j in enumerate(g.nodes)}
    arrays: list = []  # ("i", m) or ("n", j): tensors read element by element
    scalars: list = []  # ("t", source) 0-dim tensors or ("s", node, k) host scalars
    array_index: dict = {}
    scalar_index: dict = {}
    specs, bytes_eager = [], 0
    for j in g.nodes:
        node = nodes[j]
        operands = []
        size = prod(_in_shape(region, node) if _is_red(node) else node.shape)
        bytes_eager += prod(node.shape) * T.STORAGE_DTYPE[node.dtype].itemsize
        refs = list(node.refs) + [("p", k) for k in range(len(node.params))]
        for kind, ref in refs:
            if kind == "n" and ref in local:
                src = nodes[ref]
                operands.append(("v", local[ref], _load_code(node, src.dtype)))
                bytes_eager += size * T.STORAGE_DTYPE[src.dtype].itemsize
            elif kind in ("n", "i"):
                dtype, ishape = (nodes[ref].dtype, nodes[ref].shape) if kind == "n" else \
                    region.descs[ref][:2]
                code = _load_code(node, dtype)
                if len(ishape) == 0 and not _is_red(node):
                    k = scalar_index.setdefault((kind, ref), len(scalars))
                    if k == len(scalars):
                        scalars.append(("t", kind, ref))
                    operands.append(("t", k, code))
                else:
                    k = array_index.setdefault((kind, ref), len(arrays))
                    if k == len(arrays):
                        arrays.append((kind, ref))
                    operands.append(("a", k, code))
                    bytes_eager += size * T.STORAGE_DTYPE[dtype].itemsize
            else:  # a Python scalar operand ("s", k) or parameter ("p", k)
                k = ref if kind == "s" else len(node.raw) + ref
                operands.append(("s", len(scalars)))
                scalars.append(("s", j, k))
        out_code = numerics.CODE[node.dtype]
        if roles is None:
            specs.append((node.op, tuple(operands), node.compute, out_code))
        else:
            op = node.op.name if _is_red(node) else node.op
            role = "red" if roles[j] == "out" else roles[j]  # "out": a reduction not read here
            specs.append((role, op, tuple(operands), node.compute, out_code))
    return local, specs, arrays, scalars, bytes_eager


def _lay_out(region, g: Group) -> None:
    """The fused kernel's spec and argument sources for elementwise group `g` (None spec:
    op by op)."""
    nodes, shape = region.nodes, g.shape
    n = prod(shape)
    if n == 0 or not shape:
        return  # 0-dim chains: nothing to gain, and LLVM can take minutes on some (f16 exp)
    local, specs, arrays, scalars, bytes_eager = _operands(region, g)
    # strides (in elements) of every array over the group shape: outputs, then inputs
    strides = []
    for j in g.stored:
        node = nodes[j]
        stride = region.descs[node.target][2] if node.target is not None else _stride(node)
        strides.append(_strides_in(node.shape, stride, shape))
    for kind, ref in arrays:
        if kind == "n":
            strides.append(_strides_in(nodes[ref].shape, _stride(nodes[ref]), shape))
        else:
            _, ishape, istride = region.descs[ref]
            strides.append(_strides_in(ishape, istride, shape))
    cshape, cstrides = kernelgen.coalesce(list(shape), strides)
    if len(cshape) > 4:
        return
    kinds = kernelgen.broadcast_kinds(cshape, cstrides)  # (Note [Broadcast rows])
    if kinds is not None and any(kind != "a" for kind in kinds[:len(g.stored)]):
        # a smaller op's result written over the loop (Note [Smaller ops in a bigger loop])
        kinds = None
    if len(cshape) == 1 and (cshape[0] == 1 or all(st[0] == 1 for st in cstrides)):
        layout, views, kinds = "c", [((cshape[0],), (1,)) for _ in cstrides], ()
    elif kinds is not None:
        layout = "b"
        views = [kernelgen.BROADCAST_VIEWS[kind](*cshape) for kind in kinds]
        kinds = kinds[len(g.stored):]
    else:
        layout, kinds = "s", ()
        views = [kernelgen.strided_4d(cshape, st) for st in cstrides]
    stores = tuple((local[j], k) for k, j in enumerate(g.stored))
    # an input that is the very memory and layout an in-place result is written to is read
    # through that output (Note [In-place loops] in ops/kernelgen.py)
    n_out, aliases = len(g.stored), []
    for k_in, (kind, ref) in enumerate(arrays):
        for k_out, j in enumerate(g.stored):
            if kind == "i" and nodes[j].target == ref and views[k_out] == views[n_out + k_in]:
                aliases.append((k_in, k_out))
                break
    g.aliased = frozenset(k_in for k_in, _ in aliases)
    g.spec = (layout, tuple(specs), stores, n_out, len(arrays), len(scalars), tuple(aliases),
              kinds)
    _finish(region, g, views, arrays, scalars, n * _itemsizes(region, g, arrays), bytes_eager)


def _itemsizes(region, g: Group, arrays) -> int:
    nodes = region.nodes
    return sum(T.STORAGE_DTYPE[nodes[j].dtype].itemsize for j in g.stored) + sum(
        T.STORAGE_DTYPE[nodes[r].dtype if kind == "n" else region.descs[r][0]].itemsize
        for kind, r in arrays)


def _finish(region, g: Group, views, arrays, scalars, moved: int, bytes_eager: int) -> None:
    g.arrays = (views, arrays)
    g.scalars = scalars
    nodes = region.nodes
    g.engine = "scalar" if any(nodes[j].op.engine == "scalar" for j in g.nodes) else "vector"
    g.moved = moved
    g.not_moved = max(0, bytes_eager - moved)


def _lay_out_row(region, g: Group) -> None:
    """The row kernel's spec and 2-D views for row group `g` (None spec: op by op)."""
    nodes, full, k = region.nodes, g.full, g.k
    if prod(full) == 0:
        return
    local, specs, arrays, scalars, bytes_eager = _operands(region, g, g.roles)
    split = len(full) - k
    rows_shape = full[:split]
    strides, sizes = [], []
    for j in g.stored:
        node = nodes[j]
        if g.roles[j] in ("red", "out"):  # the reduced result: rows contiguous
            strides.append(list(T.contiguous_strides(rows_shape)) + [0] * k)
        else:
            strides.append(_strides_in(node.shape, _stride(node), full))
        sizes.append(prod(node.shape) * T.STORAGE_DTYPE[node.dtype].itemsize)
    for kind, ref in arrays:
        if kind == "n":
            dtype, ishape, istride = nodes[ref].dtype, nodes[ref].shape, _stride(nodes[ref])
        else:
            dtype, ishape, istride = region.descs[ref]
        strides.append(_strides_in(ishape, istride, full))
        sizes.append(prod(ishape) * T.STORAGE_DTYPE[dtype].itemsize)
    rshape, rstrides = kernelgen.coalesce(list(rows_shape) or [1], [st[:split] or [0]
                                                                    for st in strides])
    cshape, cstrides = kernelgen.coalesce(list(full[split:]), [st[split:] for st in strides])
    if len(rshape) > 1 or len(cshape) > 1:
        return  # rows or columns that no single stride walks: op by op
    views = [((rshape[0], cshape[0]), (rs[0], cs[0])) for rs, cs in zip(rstrides, cstrides)]
    # an input every row reads whole (a LayerNorm weight) goes as its vector: contiguous, where
    # its 2-D view (row stride 0) is strided to Numba (Note [Broadcast rows] in kernelgen.py)
    n_out = len(g.stored)
    kinds = tuple("col" if views[n_out + k][1] == (0, 1) and rshape[0] > 1 else "a"
                  for k in range(len(arrays)))
    for k, kind in enumerate(kinds):
        if kind == "col":
            views[n_out + k] = kernelgen.BROADCAST_VIEWS["col"](rshape[0], cshape[0])
    stores = tuple((local[j], n) for n, j in enumerate(g.stored))
    g.spec = ("r", tuple(specs), stores, n_out, len(arrays), len(scalars), kinds)
    _finish(region, g, views, arrays, scalars, sum(sizes), bytes_eager)
