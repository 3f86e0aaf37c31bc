"""Running a planned region (fusion.py plans it): each group as its cached fused kernel, or
its ops one by one through the normal kernels; then the results become the data of their
pending tensors, and stats() and explain() count the run."""
from __future__ import annotations

from math import prod

import numpy as np
import torch

from neuron_eager.device_sim import config, core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import tensor as T
from neuron_eager.ops import workers
from neuron_eager.ops.sourceline import replay_at, user_frame

from . import codegen, fusion, plans, recording, rowgen
from .fusion import Group, Plan, _plan


def _view(t, shape: tuple, strides: tuple):
    if len(shape) == 1 and strides[0] == 1 and t.__dict__.get("_key") is not None and \
            t.numel() == shape[0]:
        return T.flat(t)  # a contiguous tensor read or written whole: its cached flat view
    size = T.STORAGE_DTYPE[t.dtype].itemsize
    return np.ndarray(shape, T.STORAGE_DTYPE[t.dtype], t._storage.buffer,
                        t.storage_offset() * size, [s * size for s in strides])


def _resolve(region, values, kind, ref):
    return values[ref] if kind == "n" else region.read(ref)


def _drops(region, g: Group) -> dict:
    """For op-by-op runs: after each node, the group's results that nothing reads any more
    (no live tensor, no later group, no later op of the group), so their memory goes back
    at once, as in plain eager, not when the region ends."""
    kept = {j for member in g.batch for j in member.stored}
    last: dict = {}
    order = g.all_nodes()
    inside = set(order)
    for k in order:
        for kind, ref in region.nodes[k].refs:
            if kind == "n" and ref in inside and ref not in kept:
                last[ref] = k
    drops: dict = {}
    for ref, k in last.items():
        drops.setdefault(k, []).append(ref)
    return drops


def _let_go(region, plan: Plan) -> dict:
    """node -> the region inputs that no node after it reads, which an op-by-op run lets go
    of after it: a tensor only the region still held (a saved activation that autograd
    released while its backward ops were recorded) frees its memory then, as in plain eager,
    not when the region ends. Never a tensor updated in place: its memory stays its own."""
    targets = {n.target for n in region.nodes if n.target is not None}
    last: dict = {}
    for g in plan.groups:
        for j in g.all_nodes():
            for kind, ref in region.nodes[j].refs:
                if kind == "i" and ref not in targets:
                    last[ref] = j
    let_go: dict = {}
    for m, j in last.items():
        let_go.setdefault(j, []).append(m)
    return let_go


def _run_ops(region, values, g: Group, let_go=None, nodes=None) -> None:
    """The group's ops one by one, through the normal kernels (their warnings point at the
    lines that recorded them, and so do the profiler's records of their launches). `let_go`:
    _let_go's inputs to drop as their last readers run; `nodes`: only these (one member of
    a batch: the head's all_nodes() are the whole batch's)."""
    outer, clock = replay_at(None), core.clock
    saved = clock.context
    if g.drops is None:
        g.drops = _drops(region, g)
    try:
        for j in g.all_nodes() if nodes is None else nodes:
            node = region.nodes[j]
            replay_at(node.where)
            if clock.records is not None:
                clock.context = (_user_name(node), _line(node))
            try:
                _run_op(region, values, j)
            except Exception as e:
                e.adaptive_node = j  # which op it came from, for run_region's message
                raise
            for done in g.drops.get(j, ()):
                del values[done]
            if let_go is not None:
                for m in let_go.get(j, ()):
                    region.inputs[m] = region.memory[m] = None
    finally:
        replay_at(outer)
        clock.context = saved


def _run_ops_of_plan(region, values, g: Group, plan: Plan) -> None:
    """_run_ops for a group of a whole plan: region inputs let go of after their last reader."""
    if plan.let_go is None:
        plan.let_go = _let_go(region, plan)
    _run_ops(region, values, g, plan.let_go)


def _user_name(node) -> str:
    return "view" if node.op is plans.VIEW else E.user_name(node.op)


def _fused_label(region, g: Group) -> str:
    return "fused_" + "_".join(dict.fromkeys(
        _user_name(region.nodes[j]) for member in g.batch for j in member.nodes))


def place(file: str, line: int) -> str:
    """file:line, or the file alone for a backward op (no line: "<autograd backward: ...>")."""
    return f"{file}:{line}" if line else file


def _line(node) -> str:
    return place(*node.where)


def _run_op(region, values, j: int) -> None:
    node = region.nodes[j]
    operands = [node.raw[ref] if kind == "s" else _resolve(region, values, kind, ref)
                for kind, ref in node.refs]
    if node.op is plans.VIEW:  # the base's memory, seen through the recorded layout
        values[j] = T.make(operands[0]._storage, node.shape, node.stride, node.offset,
                           node.dtype)
        return
    if node.runner is not None:
        values[j] = node.runner(operands, node.params, node.dtype)
    elif node.inplace:  # as the in-place kernel does: computed, then rounded into out
        values[j] = E.run(node.op, operands, node.params, out=_output(region, node))
    elif node.default_dtype is E.default_dtype():
        values[j] = E.run(node.op, operands, node.params)
    else:
        values[j] = _run_with_default_dtype(node, operands)
    fusion.stats["unfused_ops"] += 1


# Note [The default dtype of a recorded op]
# An int tensor times a float scalar takes the default dtype. A program may change it
# (torch.set_default_dtype, a library's `with` block) between recording such an op and the
# sync point that runs it: the recorded node keeps the dtype its result was given, and an op
# run op by op runs under the default dtype of its recording. (A fused kernel computes in
# the node's recorded types already.)
def _run_with_default_dtype(node, operands):
    now = torch.get_default_dtype()
    torch.set_default_dtype(node.default_dtype)
    try:
        return E.run(node.op, operands, node.params)
    finally:
        torch.set_default_dtype(now)


def _output(region, node):
    """Where node's result goes: the memory of the tensor it updates in place, or new memory,
    given at once to a pending tensor of the node if one is alive (no stand-in tensor)."""
    if node.target is not None:
        return region.read(node.target)
    if node.stride is not None:  # a result laid out as its operands (Note [Output layout])
        return T.empty(node.shape, node.dtype, node.stride)
    for ref in node.outs:
        t = ref()
        if t is not None and "_storage" not in t.__dict__:
            return T.attach_storage(t, node.shape, node.dtype)
    return T.new_contiguous(node.shape, node.dtype)


def _run_fused(region, values, g: Group) -> str:
    """Launch the group's fused kernel (a batch: each member's loop, as one launch; Note
    [Batches] in fusion.py); returns how it ran. A member whose kernel does not compile runs
    op by op."""
    fused = compiled = 0
    loaded = codegen.stats["disk_hits"]
    for member in g.batch:
        try:
            ran = _run_kernel(region, values, member, split=len(g.batch) == 1)
        except Exception as e:
            e.adaptive_node = member.nodes[0]  # the member's first op names it
            raise
        if ran:
            fused += 1
            compiled += member.kernel_new
            member.kernel_new = False
        else:
            _run_ops(region, values, member, nodes=member.nodes)
    if not fused:
        return "op by op (the kernel did not compile)"
    clock = core.clock
    if clock.records is None:
        core.launch(g.batch_engine, g.elements, g.moved_total)
    else:  # the profiler names the fused kernel and the line of its first op (not the flush's)
        saved = clock.context
        clock.context = (_fused_label(region, g), _line(region.nodes[g.batch[0].nodes[0]]))
        try:
            core.launch(g.batch_engine, g.elements, g.moved_total)
        finally:
            clock.context = saved
    fusion.stats["hbm_bytes_not_moved"] += g.not_moved_total
    fusion.stats["fused_kernels"] += 1
    loaded = codegen.stats["disk_hits"] - loaded  # (of the new kernels, those read from disk)
    how = "fused (compiled)" if compiled > loaded else \
        "fused (loaded from the disk cache)" if compiled else "fused (cache hit)"
    if len(g.batch) == 1:
        return how
    if fused < len(g.batch):
        how += f", {len(g.batch) - fused} groups op by op"
    return f"{how}, one launch for {fused} groups"


def _run_kernel(region, values, g: Group, split: bool) -> bool:
    """Run group g's fused kernel (compiled on first use; `split`: large loops run in slices
    side by side); False, having run nothing, if it does not compile."""
    kernel = g.kernel
    if kernel is None:
        label = "+".join(region.nodes[j].op.name for j in g.nodes)
        make_source = rowgen.source if g.spec[0] == "r" else codegen.source
        kernel, g.kernel_new = codegen.kernel_for(g.spec, label, make_source)
        g.kernel = kernel
    if kernel is codegen.FAILED:
        return False
    args: list = []
    _arguments(region, values, g, args)
    if g.kernel_new:
        seconds = codegen.first_call(g.spec, kernel, args)
        if seconds is None:
            g.kernel = codegen.FAILED
            fusion.stats["compile_failures"] += 1
            return False
        fusion.stats["compile_seconds"] += seconds
        fusion.stats["cache_misses"] += 1
        return True
    layout = g.spec[0]  # flat loops split by elements, row kernels by rows (2-D views)
    if split and prod(g.shape) >= workers.SPLIT_MIN and (
            E.splits(layout, args[0].shape) if layout != "r" else args[0].shape[0] > 1):
        workers.split_call(kernel, args[0], args[1:])
    else:
        kernel(*args)
    fusion.stats["cache_hits"] += 1
    return True


def _arguments(region, values, g: Group, args: list) -> None:
    """Append the kernel arguments of group `g`: its outputs (allocated now), the arrays it
    reads, its scalars."""
    nodes = region.nodes
    views, sources = g.arrays
    for k, j in enumerate(g.stored):
        out = values[j] = _output(region, nodes[j])
        args.append(_view(out, *views[k]))
    base, aliased = len(g.stored), g.aliased
    for k, (kind, ref) in enumerate(sources):
        if k not in aliased:
            args.append(_view(_resolve(region, values, kind, ref), *views[base + k]))
    for entry in g.scalars:
        if entry[0] == "t":
            args.append(_resolve(region, values, entry[1], entry[2])._nd[()])
        else:
            args.append(nodes[entry[1]].scalars[entry[2]])


def run_region(region, reason: str) -> None:
    """Compute a flushed region and give its live pending tensors their storage."""
    nodes = region.nodes
    alive = [node.alive() for node in nodes]
    key = (tuple([node.key for node in nodes]), tuple(region.descs), tuple(alive),
           config.numerics_key)
    plan = fusion._plans.get(key)
    if plan is None:  # (Note [The plan cache's size] in fusion.py)
        if len(fusion._plans) >= fusion._PLAN_LIMIT or \
                fusion.plan_ops + len(nodes) > fusion._PLAN_OPS_LIMIT:
            fusion._plans.clear()
            fusion.plan_ops = 0
        plan = fusion._plans[key] = _plan(region, alive)
        fusion.plan_ops += len(nodes)
    plan.seen += 1
    fuse = plan.seen >= recording.options.compile_after
    launched, moved = core.kernels_launched, core.hbm_bytes_moved
    values: dict = {}
    modes = []
    for g in plan.groups:
        try:
            if fuse and g.spec is not None:
                try:
                    mode = _run_fused(region, values, g)
                except torch.OutOfMemoryError:
                    if len(g.batch) > 1:
                        raise
                    # (Note [Out of memory in a fused group])
                    for j in g.nodes:
                        values.pop(j, None)
                    _run_ops_of_plan(region, values, g, plan)
                    mode = "op by op (out of memory fused)"
            else:
                _run_ops_of_plan(region, values, g, plan)
                mode = f"op by op (sighting {plan.seen})" if g.spec is not None else "op by op"
        except BaseException as e:  # (an interrupt other than SIGINT's too: Note [Interrupts])
            modes.append(f"failed: {type(e).__name__}")
            _remember(region, reason, plan, modes, launched, moved)  # explain() shows it
            for later in nodes:
                later.error = repr(e)  # a string: no traceback (and its frames) kept alive
                if later.target is not None:  # the tensor gets its memory back
                    values.setdefault(later.index, region.read(later.target))
            _give_storage(nodes, values, range(len(nodes)))
            # (made in a call, not kept in a local: this frame, held by the error's
            # traceback, would hold the error, a cycle keeping the region's HBM until the
            # garbage collector ran, so a retry after an out-of-memory error failed again)
            if not isinstance(e, Exception):
                raise
            raise _failure(nodes[getattr(e, "adaptive_node", g.nodes[0])], e) from e
        finally:
            _give_storage(nodes, values, g.all_nodes())
        modes.append(mode)
    _remember(region, reason, plan, modes, launched, moved)


# Note [Out of memory in a fused group]
# A fused kernel allocates its outputs before it writes anything; when that runs out of
# HBM, the group runs again op by op, so the ops before the one plain eager fails at take
# effect (an in-place update is kept) and the error comes from that op, as in plain eager.
# (Groups batched into one launch keep the error as is: a later member may follow one whose
# kernel ran. They are small, so rarely the ones out of memory.)


def _remember(region, reason: str, plan: Plan, modes: list, launched: int, moved: int) -> None:
    """Count a region that ran (or failed: its last mode says so) for stats() and explain()."""
    nodes = region.nodes
    fusion.stats["ops_recorded"] += len(nodes)
    fusion.stats["regions"] += 1
    fusion.stats["kernels_launched"] += core.kernels_launched - launched
    fusion.stats["hbm_bytes_moved"] += core.hbm_bytes_moved - moved
    fusion.flush_reasons[reason] += 1
    # (the places, not the nodes: their weak references would keep torch.utils.swap_tensors
    # from swapping any tensor a region computed)
    fusion.history.append((reason, len(nodes), plan, modes, [node.where for node in nodes],
                    user_frame()))  # (the line that made the sync point)


def _failure(node, e: Exception) -> Exception:
    """The error of a region whose op `node` failed (fused: the group's first op) with `e`:
    a RuntimeError, or of e's type for an out-of-memory error and a warning raised as an
    error (warnings.simplefilter("error")), so that `except` clauses catch them as in plain
    eager."""
    kind = T.NeuronOutOfMemoryError if isinstance(e, torch.OutOfMemoryError) else \
        type(e) if isinstance(e, Warning) else RuntimeError
    return kind(f"adaptive eager: running {_user_name(node)} recorded at {_line(node)} "
                f"failed: {e}")


def _give_storage(nodes, values, indices) -> None:
    """The computed results become the data of their pending tensors (one of them may hold
    it already: _output), which stop being pending."""
    for j in indices:
        result = values.get(j)
        if result is None:
            continue
        src = result.__dict__
        for ref in nodes[j].outs:
            t = ref()
            if t is None:
                continue
            d = t.__dict__
            if d.get("_node") is not nodes[j]:
                continue  # given other memory since (`t.data = y`): it keeps that
            if t is not result:  # (replacing memory _output gave it, if the group then
                d["_storage"], d["_flat"], d["_key"] = src["_storage"], src.get("_flat"), \
                    src.get("_key")  # ran op by op after all)
                if "_nd" in src:
                    d["_nd"] = src["_nd"]
                else:
                    d.pop("_nd", None)
            d.pop("_node", None)


recording.run_region = run_region
