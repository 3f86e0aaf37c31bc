"""Recording: the dispatcher that adaptive eager puts in front of the router.

While on, a fusible op (Note [Fusible ops] in ops/elementwise.py) is checked and typed at
once, so errors are raised at the user's line, and returns a *pending* tensor: a
NeuronTensor with shape, dtype and strides but no storage yet, whose `_node` names its
recorded op. Any other op flushes the pending region first if it reads a pending tensor or
may write memory; reading a pending tensor's data anywhere (print, `.item()`, `.cpu()`,
kernels) flushes through the tensor's pending hook. One region is shared by all threads
(autograd's backward runs on its own), guarded by one lock (Ctrl-C waits: interrupts.py).
"""
from __future__ import annotations

import sys
import threading
import weakref

import torch

from neuron_eager.device_sim import config, forks
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import foreach
from neuron_eager.ops import numerics, overlap, router, views
from neuron_eager.ops.sourceline import user_frame, warn_at_user_line
from neuron_eager.ops import tensor as T
from neuron_eager.ops.router import native_counter

from . import plans
from .region import Node, Region, alive_count, move, options  # noqa: F401  (options: the API)

NeuronTensor = T.NeuronTensor
aten = torch.ops.aten
_make_wrapper = torch.Tensor._make_wrapper_subclass


_lock = threading.RLock()  # (Ctrl-C waits while it is held: Note [Interrupts])
forks.renew_after_fork(sys.modules[__name__], "_lock", threading.RLock)
_region = Region()
active = False  # recording on (the dispatcher may stay wrapped, e.g. by the profiler)
_inner = None  # the dispatcher that was installed before adaptive eager
_installed = False
run_region = None  # set by launch.py: run_region(region, reason)


def pending_node(t) -> Node | None:
    return t.__dict__.get("_node") if type(t) is NeuronTensor else None


_stochastic_warned = False


def _stochastic_rounding_on() -> bool:
    """Stochastic rounding draws noise per launch on the calling thread (Note [stochastic
    rounding noise]): fused kernels would draw other noise than plain eager, so nothing is
    recorded while it is on. Said once, not silently."""
    global _stochastic_warned
    if not config.stochastic_rounding:
        return False
    if not _stochastic_warned:
        _stochastic_warned = True
        warn_at_user_line("adaptive eager records nothing while stochastic rounding is on "
                          "(NEURON_RT_STOCHASTIC_ROUNDING_EN=1): ops run as in plain eager")
    return True


def _record(plan, args, kwargs):
    """Record one fusible op; None when it should run eagerly instead."""
    if config.stochastic_rounding and _stochastic_rounding_on():
        return None
    planned = plan(*args, **kwargs)  # the kernel's own checks, raised here
    if planned is None:
        return None
    op, operands, params = planned[0], planned[1], planned[2]
    if type(op) is E.Elementwise and (len(planned) == 3 or planned.runner is None):
        # (as plain eager's run; a plan's own kernel casts what it casts: where and
        # masked_fill read a 0-dim bool condition as it is)
        operands = E.scalar_tensors_cast(op, operands)
    region = _region
    refs, raw, sig = _refs(region, operands)
    if refs is None:
        return None
    if len(planned) > 3 and planned.dtype is not None:
        dtype, shape = planned.dtype, planned.shape
        compute = planned.compute or numerics.compute_type(dtype)
        cast = numerics.scalar_cast(compute, dtype)
        if shape is None:
            shape = E.broadcast_shape([o.shape for o in operands if type(o) is NeuronTensor])
        if 0 in shape:
            return None
        runner = planned.runner
    else:
        key = (op, sig, E.default_dtype())
        typed = _typed.get(key)
        if typed is None:
            typed = _type(op, operands, key)
        if typed is False:
            return None
        dtype, compute, shape, cast = typed
        runner = None
    if dtype == torch.int64 and compute == "int":
        return None  # (Note [int64 runs eagerly])
    # plain eager keeps the operands' dim order (Note [Output layout] in ops/elementwise.py)
    stride = None if type(op) is plans.Reduction or op.dense_result else \
        _result_strides(operands, shape)
    out = _make_wrapper(NeuronTensor, shape, dtype=dtype, device=T.DEVICE) if stride is None \
        else _make_wrapper(NeuronTensor, shape, strides=stride, dtype=dtype, device=T.DEVICE)
    node = _add_node(region, op, refs, params, raw, dtype, compute, shape, out, cast=cast)
    node.runner, node.stride = runner, stride
    if len(region.nodes) >= options.max_ops:
        flush("buffer limit")
    return out


def _result_strides(operands, shape):
    """The strides plain eager gives this elementwise op's result (None: contiguous), from
    metadata only: nothing pending runs."""
    for a in operands:  # (one pass, no lists: this runs for every recorded op)
        if type(a) is NeuronTensor:
            d = a.__dict__
            node = d.get("_node")  # a pending result: contiguous, a view's layout, or strided
            dense = d.get("_key") is not None if node is None else node.stride is None
            if not dense and a.numel() > 1:
                break
    else:
        return None
    return E.layout_for(shape, [(a.shape, a.stride()) for a in operands
                                if type(a) is NeuronTensor])


# (op, operand signature from _refs, default dtype) -> (dtype, compute type, shape, scalar
# cast), or False: run eagerly
_typed: dict = {}
_TYPES_KEPT = 4096


def _type(op, operands, key):
    """The result's dtype, compute type and (broadcast) shape, by PyTorch's rules; raises
    what the eager kernel raises."""
    dtype, compute, cast, rounds = E.promotion(op, operands)
    if dtype not in T.STORAGE_DTYPE:  # (x * 1j: eager's error, not the scalar cast's)
        T.check_dtype(dtype)
    shape = E.broadcast_shape([o.shape for o in operands if type(o) is NeuronTensor])
    if len(_typed) >= _TYPES_KEPT:  # (keyed by shapes: a run whose shapes never repeat)
        _typed.clear()
    # (integers rounded to 16 bits first run eagerly: Note [Integers into 16-bit floats])
    typed = _typed[key] = (dtype, compute, shape, cast) if 0 not in shape and \
        rounds is None else False
    return typed


def _refs(region, operands):
    """Operand refs of a new node (None: no neuron tensor operand, run eagerly), the raw
    scalars, and the operands' signature: (dtype, shape) of each neuron tensor, the type of
    each Python scalar, (dtype, is 0-dim) of each CPU scalar tensor."""
    refs, raw, sig = [], [], []
    tensors = False
    for a in operands:
        kind = type(a)
        if kind is NeuronTensor:
            node = a.__dict__.get("_node")
            if node is None:
                m = region.input(a)
                refs.append(("i", m))
                sig.append(region.sigs[m])
            elif node.region == region.serial:
                refs.append(("n", node.index))
                sig.append((node.dtype, node.shape))
            else:
                a._storage  # noqa: B018  (a result of a failed region: its hook says so)
            tensors = True
        elif isinstance(a, torch.Tensor):
            T.check_foreign(a)  # a CPU 0-dim tensor: its value is read on the host now
            refs.append(("s", len(raw)))
            raw.append(a.clone())
            sig.append((a.dtype, a.dim() == 0))
        else:
            refs.append(("s", len(raw)))
            raw.append(a)
            sig.append(kind)
    return (tuple(refs) if tensors else None), raw, tuple(sig)


def _add_node(region, op, refs, params, raw, dtype, compute, shape, out, target=None,
              inplace=False, cast=None) -> Node:
    """A new node of `region` computing `out`. Its key names scalars by position only
    ("s", k): their values are kernel arguments, so a new learning rate is not a new kernel.
    `cast` converts them (numerics.scalar_cast; default: to the compute type)."""
    if raw or params:
        cast = cast or numerics.SCALAR_CAST[compute]
        scalars = [cast(v.item() if isinstance(v, torch.Tensor) else v) for v in raw]
        if params:
            scalars += [cast(p) for p in params]
    else:
        scalars = raw
    node = Node()
    node.index, node.region, node.error = len(region.nodes), region.serial, None
    node.op, node.refs, node.params, node.raw = op, refs, params, raw
    node.scalars = scalars
    node.dtype, node.compute, node.shape = dtype, compute, shape
    node.runner, node.target, node.inplace = None, target, inplace
    node.views, node.stride, node.offset = None, None, 0
    node.default_dtype = E.default_dtype()  # (Note [The default dtype of a recorded op])
    node.key = (op, refs, len(params), dtype, shape, compute, inplace, target)
    if _foreach_where is not None:
        node.where, node.site = _foreach_where, None
    else:
        node.site = _site
        node.where = _site[1]
    out._node = node
    node.outs = [weakref.ref(out)]
    region.nodes.append(node)
    return node


_inplace_types: dict = {}  # (op, operand signature) -> compute type, "" if refused


def _inplace_type(op, operands, a) -> str:
    """The compute type of `op` updating `a`, "" when the eager kernel raises (a result
    type that cannot be cast to a's dtype, operands that do not broadcast to a's shape)."""
    promoted, compute = E.dtypes_for(op, operands)
    if not torch.can_cast(promoted, a.dtype):
        return ""
    shape = tuple(a.shape)
    for o in operands:
        if type(o) is NeuronTensor and E.try_broadcast([o.shape, shape]) != shape:
            return ""
    return compute
_DATA = ("_storage", "_nd", "_flat", "_key")


def _record_inplace(plan, args, kwargs):
    """Record an in-place fusible op on `a = args[0]`; None to run it eagerly.

    `a` is recorded only when nothing else can see its memory: a pending result held by
    `a` alone, or a tensor whose storage no other tensor (a view, an alias, a saved
    tensor) holds. Its data fields then move to a stand-in that the region reads and
    writes, and `a` becomes pending, so any read of `a` flushes (Note [In-place ops]).
    """
    a = args[0]
    if (config.stochastic_rounding and _stochastic_rounding_on()) or type(a) is not NeuronTensor \
            or a.dtype == torch.int64:  # (Note [int64 runs eagerly])
        return None
    planned = plan(*args, **kwargs)
    if planned is None:
        return None
    op, operands, params = planned
    if not operands or operands[0] is not a or a.numel() == 0:
        return None
    operands = E.scalar_tensors_cast(op, operands)  # (as plain eager's run)
    region = _region
    d = a.__dict__
    old = d.get("_node")
    if old is not None:
        if old.region != region.serial or old.op is plans.VIEW or \
                alive_count(old.outs) != 1 or (old.views and alive_count(old.views)):
            return None  # another tensor sees this memory: run it eagerly
    else:
        storage = d.get("_storage")
        m = region.input_index.get(id(a))
        kept = m is not None and region.memory[m][0] is storage  # the region's own reference
        if storage is None or sys.getrefcount(storage) > 3 + kept:  # d, `storage`, the arg
            return None
        if d.get("_key") is None and not overlap.elements_apart(a.shape, a.stride()):
            return None  # elements sharing memory (as_strided_): each write is seen by the next
    # the operands' signature from _refs keys the type check; should it refuse, the flush
    # before the eager kernel drops the inputs _refs added
    refs, raw, sig = _refs(region, operands)
    key = (op, sig)
    compute = _inplace_types.get(key)
    if compute is None:
        if len(_inplace_types) >= _TYPES_KEPT:
            _inplace_types.clear()
        compute = _inplace_types[key] = _inplace_type(op, operands, a)
    if not compute:
        return None  # the eager kernel raises
    dtype, shape = sig[0]
    if old is not None:
        target, old.target = old.target, None  # only the last writer writes a's memory
        old.outs = [r for r in old.outs if r() is not a]
        layout = old.stride  # a's layout stays (Note [In-place layouts])
    else:
        target = refs[0][1]  # (_refs read `a` first: ("i", its input index))
        # a stand-in takes a's data fields (its arrays too): `a` itself becomes pending
        _, _, stride = region.descs[target]
        layout = None if a.is_contiguous() else stride
        stand_in = _make_wrapper(NeuronTensor, shape, strides=stride,
                                 storage_offset=region.memory[target][1], dtype=dtype,
                                 device=T.DEVICE)
        moved = stand_in.__dict__
        for name in _DATA:
            if name in d:
                moved[name] = d.pop(name)
        region.inputs[target] = stand_in
        del region.input_index[id(a)]  # later reads of `a` name the node
        del storage
    node = _add_node(region, op, refs, params, raw, dtype, compute, shape, a, target, True,
                     numerics.scalar_cast(compute, dtype))
    node.stride = layout
    if len(region.nodes) >= options.max_ops:
        flush("buffer limit")
    return a


# Note [int64 runs eagerly]
# Plain eager computes int64 arithmetic exactly and wraps it to int32 with a warning
# (numerics.wrap_int64), at the op's line and under the warning filters in force there (a
# `warnings.catch_warnings()` block, pytest.warns). Recorded, the op would warn when its
# region runs, outside that block; so int64 arithmetic is not recorded.


# Note [In-place layouts]
# An in-place result keeps the updated tensor's layout: a pending result's (a transposed
# operand's order, Note [Output layout]) or the memory's own (channels-last, a transpose).
# The node records it as its stride, so the value is allocated, read back by later
# groups, and seen by later ops' layout rules (_result_strides) in that layout, as plain
# eager leaves it.


# Note [In-place ops]
# Plain eager writes an in-place result straight into the tensor, rounded once from the
# promoted compute type to the tensor's dtype; the recorded node does the same. Reads of
# the old value come before the write in the region, and a fused group writing memory
# that it also reads keeps one shape and one layout for both (fusion._place), so each
# element is read before it is written. A second in-place op on the same tensor makes the
# first one's result an ordinary value: only the last writer writes.


def _detach(t: NeuronTensor):
    """detach() of a pending tensor (autograd's saved results): another one of its node. A
    detached view has no `_base` keeping its view alive: it counts as its base's view."""
    node = t.__dict__["_node"]
    with views.normal_views_of(t):  # (an inference tensor exactly when t is, as in eager)
        out = _make_wrapper(NeuronTensor, t.shape, strides=t.stride(),
                            storage_offset=t.storage_offset(), dtype=t.dtype,
                            device=T.DEVICE)  # a pending view's layout
    out._node = node
    ref = weakref.ref(out)
    node.outs.append(ref)
    base = node
    while base.op is plans.VIEW and base.refs[0][0] == "n":  # (a view of a region input,
        base = _region.nodes[base.refs[0][1]]                # after a partial flush: itself)
    if base is not node:
        base.add_view(ref)
    return out


# op id -> whether it flushes even without pending arguments (it may write memory)
_writes: dict[int, bool] = {}


def _sync(func, args, kwargs) -> None:
    """Before running `func` eagerly: a host read (.item(), .cpu()) runs the part of the
    region its tensor needs (Note [Partial flush]); an op that may write memory runs all
    of it; any other op reading a pending tensor runs all of it too (more fusion across
    independent work than running parts one by one)."""
    writes = _writes.get(id(func))
    if writes is None:
        writes = _writes[id(func)] = func.namespace != "aten" or func._schema.is_mutable
    if writes:
        flush(func.name())
        return
    host_read = id(func) in _HOST_READS
    serial = _region.serial
    needed = []
    for a in (*args, *kwargs.values()):
        if type(a) is NeuronTensor:
            node = a.__dict__.get("_node")
            if node is not None and node.region == serial:
                needed.append(node)
        elif type(a) is list or type(a) is tuple:
            for b in a:
                node = b.__dict__.get("_node") if type(b) is NeuronTensor else None
                if node is not None and node.region == serial:
                    needed.append(node)
    if needed and not (host_read and _flush_part(needed, func.name())):
        flush(func.name())


_HOST_READS = {id(aten._local_scalar_dense.default), id(aten._to_copy.default)}


# id(op) -> (recorder, plan): recorder is _record, _record_inplace, or None for a foreach
# op. Filled by install(); keyed by id because OpOverload hashes in Python (several
# microseconds a lookup on the hot path).
_ACTIONS: dict = {}
_DETACH = aten.detach.default


def dispatch(func, args, kwargs):
    """The dispatcher while adaptive eager is on."""
    global _site
    if not active:
        return _inner(func, args, kwargs)
    action = _ACTIONS.get(id(func))
    with _lock:
        if action is not None:
            recorder, plan = action
            if recorder is None:  # a foreach op: its per-tensor ops come back through per_tensor()
                if foreach.records(args):  # else one launch, as in plain eager (Note
                    return _run_foreach(func, args, kwargs)  # [Foreach in adaptive eager])
                counts["foreach_ops_run_eagerly"] += 1
                _sync(func, args, kwargs)
                return _inner(func, args, kwargs)
            _site = site = _site_of(func, args)
            skip = _alone.get(site)
            if skip and recorder is _record and not _reads_pending(args, kwargs):
                # Note [Ops that run alone]
                _alone[site] = skip - 1
                counts["ops_run_alone"] += 1
            else:
                out = recorder(plan, args, kwargs)
                if out is not None:
                    native_counter(func)[2] += 1  # get_executed_ops() counts it, as plain eager
                    return out
        if _region.nodes:
            node = pending_node(args[0]) if args else None
            if node is not None and node.region == _region.serial:
                if func is _DETACH:
                    return _detach(args[0])
                if _is_view(func):
                    _site = (id(func), user_frame(2))
                    out = _record_view(func, node, args, kwargs)
                    if out is not None:
                        native_counter(func)[2] += 1
                        return out
            _sync(func, args, kwargs)
    return _inner(func, args, kwargs)


# Note [Ops that run alone]
# A recorded op flushed as its region's only computing op (a GELU right before a matmul)
# gains nothing: one launch either way, and recording it and running the region cost more
# than running it (a 64x128 GELU then its matmul: 83 us in adaptive eager, 56 us in plain).
# So its site (op and user line) is remembered, and its next `options.alone_skip` sightings
# run eagerly, as plain eager runs them, when that flushes nothing: out of place, reading no
# pending tensor (an in-place op, run eagerly, would flush the ops recorded around it). Then
# it is recorded again, in case it now has company. An op of a region with more computing
# ops is forgotten. Ops that foreach kernels run are not sites: they come in groups.
_alone: dict = {}  # site -> eager sightings left
_site = None  # the site of the op being recorded (under _lock)
counts = {"ops_run_alone": 0, "foreach_ops_run_eagerly": 0}


def _site_of(func, args) -> tuple:
    """The op's site: the op and the user's line; in autograd's backward, which has no user
    lines, the op and its first operand's shape (every backward add has one line)."""
    where = user_frame(3)  # (above _site_of, dispatch, __torch_dispatch__)
    if where[1] == 0 and args and type(args[0]) is NeuronTensor:
        return id(func), where, args[0].shape
    return id(func), where


def _reads_pending(args, kwargs) -> bool:
    for a in (*args, *kwargs.values()):
        if type(a) is NeuronTensor and "_node" in a.__dict__:
            return True
    return False


def _learn(region: Region) -> None:
    """After a whole region ran: remember a lone op's site, forget sites that had company."""
    computing = [node for node in region.nodes if node.op is not plans.VIEW]
    if len(computing) == 1:
        if computing[0].site is not None and options.alone_skip > 0:
            _alone[computing[0].site] = options.alone_skip
    elif _alone:
        for node in computing:
            _alone.pop(node.site, None)


_foreach_where = None  # the user's line of the foreach op running now (under _lock)


def _run_foreach(func, args, kwargs):
    """A foreach op whose per-tensor ops are recorded: the kernel hands them to per_tensor()
    while it runs (under _lock), and they share its user line (found once, not per tensor)."""
    global _foreach_where
    outer, hook = _foreach_where, foreach.per_tensor
    _foreach_where, foreach.per_tensor = user_frame(1), per_tensor
    try:
        return _inner(func, args, kwargs)
    finally:
        _foreach_where, foreach.per_tensor = outer, hook


_views: dict = {}  # id(op) -> whether it is a single-tensor view op


def _is_view(func) -> bool:
    view = _views.get(id(func))
    if view is None:
        returns = func._schema.returns
        # (a CompositeImplicitAutograd op annotated as a view may copy: contiguous, reshape,
        # flatten and `to` return new memory for some layouts; the meta run cannot tell)
        view = _views[id(func)] = (func.is_view or func is _UNSAFE_VIEW) and \
            len(returns) == 1 and str(returns[0].type) == "Tensor" and \
            not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                               "CompositeImplicitAutograd")
    return view


_UNSAFE_VIEW = aten._unsafe_view.default
_REACHING_VIEWS = (aten.as_strided.default, aten.as_strided_.default)


def _record_view(func, node: Node, args, kwargs):
    """A view of a pending tensor: another pending tensor on the same memory (no kernel);
    None to flush and run it eagerly."""
    if _stochastic_rounding_on() or func in _REACHING_VIEWS:
        return None  # (as_strided may reach past the memory: run eagerly, which checks)
    for a in (*args[1:], *kwargs.values()):
        if type(a) is NeuronTensor:
            return None
    # the layout from the view kernel's cached meta run, which raises what the CPU raises
    layouts, many = views.view_metadata(func, args[0], args[1:], kwargs)
    if many or layouts[0][3] != args[0].dtype:
        return None
    shape, stride, offset, dtype, _ = layouts[0]
    with views.normal_views_of(args[0]):
        out = _make_wrapper(NeuronTensor, shape, strides=stride, storage_offset=offset,
                            dtype=dtype, device=T.DEVICE)
    view = _add_node(_region, plans.VIEW, (("n", node.index),), (), [], dtype, "f32", shape,
                     out)
    view.stride, view.offset = stride, offset
    key = view.key
    view.key = key[:4] + ((shape, stride, offset),) + key[5:]
    node.add_view(weakref.ref(out))
    if len(_region.nodes) >= options.max_ops:
        flush("buffer limit")
    return out


def per_tensor(func, args, kwargs):
    """A foreach kernel's per-tensor op (ops/foreach.py calls it while adaptive eager is on):
    recorded like a user's op, or run after the flush it needs; not counted again."""
    with _lock:
        action = _ACTIONS.get(id(func))
        if action is not None and action[0] is not None:
            out = action[0](action[1], args, kwargs)
            if out is not None:
                return out
        if _region.nodes:
            _sync(func, args, kwargs)
    return foreach.direct(func, args, kwargs)


def flush(reason: str = "flush") -> None:
    """Run every pending op now (a sync point)."""
    global _region
    with _lock:
        region = _region
        if not region.nodes:
            return
        _region = Region()
        run_region(region, reason)
        _learn(region)


def materialize(t: NeuronTensor) -> None:
    """The pending hook: code reads the data of `t`, so the part of its region that `t`
    needs runs now (Note [Partial flush])."""
    with _lock:
        node = t.__dict__.get("_node")
        if node is not None and node.region == _region.serial and \
                not _flush_part([node], "data read"):
            flush("data read")
    if "_storage" not in t.__dict__:
        node = t.__dict__.get("_node")
        error = node.error if node is not None else None
        raise RuntimeError("adaptive eager: this tensor's data was never computed" +
                           (f": its region failed ({error})" if error else ""))


# Note [Partial flush]
# Reading one pending tensor on the host (print, .item(), .cpu(), .tolist()) runs the ops
# it depends on; the rest of the region stays recorded (printing the loss does not cut the
# optimizer's region in two). The ops that
# run form a region of their own; results the remaining ops read are kept by extra pending
# references and become inputs of the remaining region. If a needed op writes a tensor's
# memory that a remaining op still reads the old value of, everything runs instead.
# An op stays pending through one partial flush, not two: the next one runs it too. Else a
# loop that reads one tensor a step (a parameter, the loss of one model of two) leaves the
# other tensors' updates pending step after step, until the buffer limit runs a region that
# never repeats (its length depends on where the limit fell), op by op, every few steps.
def _flush_part(wanted: list, reason: str) -> bool:
    """Run only what the `wanted` nodes need; False if that is the whole region (or
    unsafe)."""
    global _region
    region = _region
    nodes = region.nodes
    need = {n.index for n in wanted} | set(range(region.carried))
    stack = list(need)
    while stack:
        for kind, ref in nodes[stack.pop()].refs:
            if kind == "n" and ref not in need:
                need.add(ref)
                stack.append(ref)
    if len(need) == len(nodes):
        return False
    written = {nodes[j].target for j in need if nodes[j].target is not None}
    rest = [n for n in nodes if n.index not in need]
    if written and any(kind == "i" and ref in written for n in rest for kind, ref in n.refs):
        return False
    keepers = []  # pending references to results the remaining ops read
    read_later = {ref for n in rest for kind, ref in n.refs if kind == "n" and ref in need}
    if any(nodes[j].target is not None for j in read_later):
        return False  # (its value has the updated tensor's layout, not a new one's)
    for j in sorted(read_later):
        node = nodes[j]
        if node.stride is not None:  # a view: its base's memory, with the view's layout
            keeper = _make_wrapper(NeuronTensor, node.shape, strides=node.stride,
                                   storage_offset=node.offset, dtype=node.dtype,
                                   device=T.DEVICE)
        else:
            keeper = _make_wrapper(NeuronTensor, node.shape, dtype=node.dtype, device=T.DEVICE)
        keeper._node = node
        node.outs.append(weakref.ref(keeper))
        keepers.append((j, keeper))
    first, later = Region(), Region()
    move(region, [nodes[j] for j in sorted(need)], first, {})
    move(region, rest, later, dict(keepers))
    later.carried = len(rest)
    _region = later
    run_region(first, reason)
    return True


# Note [Swapping pending tensors]
# torch.utils.swap_tensors refuses a tensor that has weak references, and a pending tensor
# has one: its node's. Module.to()/.half() swap parameters that way (swap on conversion, and
# ops/_compat.py's tied-parameter shim), often right after an optimizer step left them
# pending. So swap_tensors runs the region first when either tensor is pending in it; the
# nodes then die with the region, and their weak references with them.
_swap_tensors = torch.utils.swap_tensors


def _swap_after_flush(t1, t2):
    if _region.nodes and any(_pending_here(t) for t in (t1, t2)):
        flush("swap_tensors")
    return _swap_tensors(t1, t2)


def _pending_here(t) -> bool:
    node = pending_node(t)
    return node is not None and node.region == _region.serial


def install() -> None:
    global _inner, _installed, active
    torch.utils.swap_tensors = _swap_after_flush
    if not _ACTIONS:  # once: the tables are complete when the ops package is imported
        for table, recorder in ((E.FUSIBLE, _record), (plans.PLANS, _record),
                                (E.FUSIBLE_INPLACE, _record_inplace)):
            _ACTIONS.update({id(op): (recorder, plan) for op, plan in table.items()})
        _ACTIONS.update({id(op): (None, None) for op in foreach.FOREACH_KERNELS})
    active = True
    if _flush_before_numerics not in config.before_numerics_change:
        config.before_numerics_change.append(_flush_before_numerics)
    if not _installed:  # else still in the chain, under a dispatcher installed later
        _inner, _installed = T._dispatcher, True
        T.set_dispatcher(dispatch)
    T.set_pending_hook(materialize)  # stays: results of failed regions must explain


def _flush_before_numerics() -> None:
    flush("numerics setting changed")


def uninstall() -> None:
    global _installed, active
    try:
        flush("adaptive eager off")
    finally:  # off even when what was pending fails (its error is raised after)
        active = False
        if T._dispatcher is dispatch:  # plain eager pays nothing for adaptive eager being off
            T.set_dispatcher(_inner)
            _installed = False
            router.drop_idle_profiler()  # (a profiler that stopped while this was on top)
