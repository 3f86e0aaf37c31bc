"""The op router: how one aten op on neuron tensors gets executed.

Order (see ARCHITECTURE.md, "The way of one op"): a registered kernel; the
in-place or out= form of a registered functional kernel; a PyTorch
decomposition; a CompositeImplicitAutograd decomposition (other libraries' ops: their own
kernel for our backend, Note [Other libraries' ops]); CPU fallback with a
one-time warning, counted, and an error when fallback is switched off. The
plan for each op is decided once and cached. While the profiler records, the router
also tells the simulated core which op and user source line each kernel comes from.
"""
from __future__ import annotations

import inspect
from collections import Counter
from functools import partial

import torch
from torch._decomp import decomposition_table
from torch.utils._pytree import tree_flatten, tree_map

from neuron_eager.device_sim import config, core
from neuron_eager.ops import _compat
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import overlap
from neuron_eager.ops import tensor as T
from neuron_eager.ops.registry import KERNELS
from neuron_eager.ops.sourceline import user_frame, warn_at_user_line

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor

fallback_ops: Counter[str] = Counter()  # op name -> CPU fallback runs
_warned: set[str] = set()

# Ops that legitimately take tensors from another device (copies, CPU index tensors).
DEVICE_CHECK_EXEMPT = {
    aten.copy_.default, aten._to_copy.default, aten._copy_from.default,
    aten._copy_from_and_resize.default, aten.index.Tensor, aten.index_put_.default,
    aten.index_put.default, aten._index_put_impl_.default, aten.set_.source_Tensor,
    aten.lift_fresh.default,
    # the `scalars` tensor of these comes from the host, as on CUDA
    aten._foreach_addcmul.Tensor, aten._foreach_addcmul_.Tensor,
    aten._foreach_addcdiv.Tensor, aten._foreach_addcdiv_.Tensor,
}
# Decompositions that are slower or less faithful than the alternatives.
_DECOMP_SKIP = {aten._to_copy.default, aten.clone.default}


device_error = T.device_error


def check_devices(args) -> None:
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) is not NeuronTensor:
                T.check_foreign(a)
        elif type(a) is list or type(a) is tuple:
            for b in a:  # (a foreach op's lists: the common case tested first)
                if type(b) is not NeuronTensor and isinstance(b, torch.Tensor):
                    T.check_foreign(b)


# id(OpOverload) -> [kernel, check devices?, native runs]. OpOverload hashes in Python, so the
# hot path keys by id; overloads are long-lived singletons, and KERNELS holds them alive.
_entries: dict[int, list] = {}


def dispatch(func, args, kwargs):
    entry = _entries.get(id(func))
    if entry is None:
        entry = _entry(func)
    if entry[0] is not None:
        if entry[1]:
            check_devices(args)
        entry[2] += 1
        return entry[0](*args, **kwargs)
    plan = _plans.get(func)
    if plan is None:
        plan = _make_plan(func)
        _plans[func] = _plan_bumping_versions(plan) if id(func) in T.FOREACH_INPLACE else plan
    return plan(func, args, kwargs)


def _entry(func) -> list:
    kernel = KERNELS.get(func)
    check = func not in DEVICE_CHECK_EXEMPT and not getattr(kernel, "checks_devices", False)
    if kernel is not None and func in _HOST_READS:
        kernel = _with_host_read(kernel)
    if kernel is not None and id(func) in T.FOREACH_INPLACE:
        kernel = _bumping_versions(kernel)
    entry = [kernel, check, 0]
    if kernel is not None:
        _entries[id(func)] = entry
        _entry_ops[id(func)] = func
    return entry


_entry_ops: dict[int, object] = {}


def native_counter(func) -> list:
    """The entry whose [2] counts native runs of `func`: adaptive eager records fusible ops
    and runs them later, fused, and counts each recorded call here as plain eager would.
    Look it up per call: the entries are rebuilt when the kernel table changes."""
    entry = _entries.get(id(func))
    return entry if entry is not None else _entry(func)


def executed_counts() -> dict[str, int]:
    """Native kernel runs per op name since the last clear."""
    return {_entry_ops[key].name(): entry[2] for key, entry in _entries.items() if entry[2]}


# -- what the simulated core is told ----------------------------------------------------
# Reading a value on the host waits for the current stream, on the simulated clock too.
_HOST_READS = {aten._local_scalar_dense.default, aten._to_copy.default}


def _with_host_read(kernel):
    clock = core.clock

    def run(*args, **kwargs):
        out = kernel(*args, **kwargs)
        if type(out) is not NeuronTensor:
            clock.wait_until(clock.current.ready_ps)
        return out

    run.checks_devices = getattr(kernel, "checks_devices", False)
    return run


_unprofiled = None  # the dispatcher that was installed before profiling began
_in_chain = False  # _dispatch_profiled is in the dispatcher chain
_profiling = False  # and records


def _dispatch_profiled(func, args, kwargs):
    """The dispatcher while the profiler records: tags launches with (op, source line);
    nested ops keep the outermost op's source line (the user's line is the same)."""
    if not _profiling:  # stopped while a later dispatcher (adaptive eager's) was on top
        return _unprofiled(func, args, kwargs)
    clock = core.clock
    saved = clock.context
    source = saved[1] if saved is not None else "%s:%d" % user_frame()
    clock.context = (func, source)
    try:
        return _unprofiled(func, args, kwargs)
    finally:
        clock.context = saved


def start_profiling() -> None:
    """Record every launch (called when torch.profiler starts)."""
    global _unprofiled, _in_chain, _profiling
    if not _in_chain:  # (if still in the chain, under another dispatcher: recording again)
        _unprofiled, _in_chain = T._dispatcher, True
        T.set_dispatcher(_dispatch_profiled)
    _profiling = True
    core.clock.start_recording()


def stop_profiling() -> list:
    """Stop recording; returns the launch records (device_sim.clock.Record)."""
    global _profiling
    _profiling = False
    drop_idle_profiler()
    return core.clock.stop_recording()


def drop_idle_profiler() -> None:
    """Take the profiler's dispatcher out of the chain once it is idle and on top (a
    dispatcher installed after it, adaptive eager's, keeps it in until that one leaves)."""
    global _in_chain
    if _in_chain and not _profiling and T._dispatcher is _dispatch_profiled:
        T.set_dispatcher(_unprofiled)
        _in_chain = False


# In-place foreach ops bump the versions of the tensors they write (Note [Foreach versions]
# in ops/tensor.py): their kernels and plans are wrapped once, when first looked up.
def _bumping_versions(kernel):
    def run(tensors, *args, **kwargs):
        out = kernel(tensors, *args, **kwargs)
        torch._C._increment_version(tensors)
        return out

    run.checks_devices = getattr(kernel, "checks_devices", False)
    return run


def _plan_bumping_versions(plan):
    def run(func, args, kwargs):
        out = plan(func, args, kwargs)
        torch._C._increment_version(args[0])
        return out

    return run


# -- plans ---------------------------------------------------------------------------
_plans: dict = {}


def _is_inplace(func) -> bool:
    args = func._schema.arguments
    return (func._schema.name.endswith("_") and bool(args) and args[0].alias_info is not None
            and args[0].alias_info.is_write and not args[0].kwarg_only)


def _out_args(func) -> list[str]:
    return [a.name for a in func._schema.arguments if a.is_out]


def _functional_of(func):
    """The functional overload matching an in-place or out= overload, if any."""
    schema = func._schema
    name = schema.name.split("::")[1]
    if _is_inplace(func):
        name = name[:-1]
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    candidates = [c for c in (getattr(packet, o) for o in packet.overloads())
                  if c is not func and not _is_inplace(c)
                  and not any(a.is_out for a in c._schema.arguments)]
    # names and types first (index_fill_.int_Scalar is not index_fill.int_Tensor), then
    # names only (List[Tensor] where the functional takes List[Optional[Tensor]])
    for key in (lambda a: (a.name, str(a.type)), lambda a: a.name):
        want = [key(a) for a in schema.arguments if not a.is_out]
        for candidate in candidates:
            if [key(a) for a in candidate._schema.arguments] == want:
                return candidate
    return None


def _uses_aten_only(decomposition) -> bool:
    """torch._refs decompositions, and some in torch._decomp, end in prims, which are not
    device ops (a prim called with a neuron tensor recurses through its meta kernel)."""
    if not decomposition.__module__.startswith("torch._decomp"):
        return False
    try:
        return "prims." not in inspect.getsource(decomposition)
    except (OSError, TypeError):
        return False


def _make_plan(func):
    if func.namespace != "aten" and func.namespace != "prims":
        # Note [Other libraries' ops]
        if torch._C._dispatch_has_computed_kernel_for_dispatch_key(func.name(), "PrivateUse1"):
            return _run_own_kernel
        return cpu_fallback
    functional = _functional_of(func) if (_is_inplace(func) or _out_args(func)) else None
    if functional is not None and functional in KERNELS:
        pointwise = functional in E.FUSIBLE  # TensorIterator ops on the CPU: overlap checked
        return partial(_run_inplace if _is_inplace(func) else _run_out, functional, pointwise)
    if func in decomposition_table and func not in _DECOMP_SKIP and \
            _uses_aten_only(decomposition_table[func]):
        return _run_decomposition
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return _run_implicit
    return cpu_fallback


dtype_name = T.dtype_name


def write_result(dst: NeuronTensor, result: torch.Tensor, what: str = "output",
                 pointwise: bool = False) -> None:
    """Copy a computed result into an in-place or out= destination, as PyTorch checks it.
    A `pointwise` op's out= that must be resized takes the result's strides, as
    TensorIterator restrides an output it resized (channels-last in, channels-last out)."""
    if not torch.can_cast(result.dtype, dst.dtype):
        raise RuntimeError(f"result type {dtype_name(result.dtype)} can't be cast to the desired "
                           f"output type {dtype_name(dst.dtype)}")
    if dst.shape != result.shape:
        if what == "inplace":
            raise RuntimeError(f"output with shape {list(dst.shape)} doesn't match the broadcast "
                               f"shape {list(result.shape)}")
        from neuron_eager.ops.views import resize_output

        resize_output(dst, result.shape, result.stride() if pointwise else None)
    aten.copy_.default(dst, result)


def _check_overlap(outs, args, kwargs) -> None:
    for dst in outs:
        if type(dst) is NeuronTensor:
            overlap.check_no_internal_overlap(dst)
            for a in (*args, *kwargs.values()):
                if type(a) is NeuronTensor:
                    overlap.check_no_partial_overlap(dst, a)


def _run_inplace(functional, pointwise, func, args, kwargs):
    if pointwise:
        _check_overlap(args[:1], args[1:], kwargs)
    elif T.shares_memory(args[:1], tree_flatten((args[1:], kwargs))[0]):
        T.run_on_cpu(func, args, kwargs)
    result = functional(*args, **kwargs)
    write_result(args[0], result, "inplace")
    return args[0]


def _run_out(functional, pointwise, func, args, kwargs):
    names = _out_args(func)
    kwargs = dict(kwargs)
    outs = [kwargs.pop(n) for n in names]
    if id(func) in _DTYPE_FROM_OUT and kwargs.get("dtype") is None and \
            isinstance(outs[0], torch.Tensor):
        kwargs["dtype"] = outs[0].dtype  # computed in out's dtype, inputs cast first, as the CPU
    if pointwise:
        _check_overlap(outs, args, kwargs)
        if id(func) in _OUT_OF_THE_INPUTS_DTYPE and isinstance(args[0], torch.Tensor) and \
                outs[0].dtype != (torch.bool if func is aten.signbit.out else args[0].dtype):
            _out_dtype_like_cpu(func, names, outs, args, kwargs)
        if len(outs) == 1 and type(outs[0]) is NeuronTensor and \
                _elementwise_into(functional, args, kwargs, outs[0]):
            return outs[0]
    elif T.shares_memory(outs, tree_flatten((args, kwargs))[0]):
        T.run_on_cpu(func, args, {**kwargs, **dict(zip(names, outs))})
    result = functional(*args, **kwargs)
    results = (result,) if len(outs) == 1 else tuple(result)
    for dst, res in zip(outs, results):
        if not isinstance(dst, NeuronTensor):
            raise device_error(dst.device)
    if not pointwise and id(func) not in _DTYPE_FROM_OUT and any(
            dst.dtype != res.dtype for dst, res in zip(outs, results)):
        _out_dtype_like_cpu(func, names, outs, args, kwargs)
    for dst, res in zip(outs, results):
        write_result(dst, res, pointwise=pointwise)
    return outs[0] if len(outs) == 1 else tuple(outs)


# Note [out= of another dtype]
# Elementwise ops and sums cast their result into out's dtype; most other ops (matmuls, sorts,
# the index outs of max/topk, gather, linalg) require out's own dtype, and where they do the
# CPU raises. Which is which is the CPU kernel's business, so when the dtypes differ the
# call runs on the CPU once (T.run_on_cpu, into scratch outs of the given dtypes): its
# error is raised as ours; if it accepts, our result is cast into out.
def _out_dtype_like_cpu(func, names, outs, args, kwargs) -> None:
    scratch = {n: torch.empty(dst.shape, dtype=dst.dtype) for n, dst in zip(names, outs)}
    T.run_on_cpu(func, args, {**kwargs, **scratch})


# Sums, products and scans with `out=` and no dtype take out's dtype as theirs (sum of floats
# into a long tensor sums their truncations); other ops cast their result into out.
# (ids: an OpOverload hashes in Python, microseconds a lookup)
_DTYPE_FROM_OUT = {id(op) for op in (aten.sum.IntList_out, aten.cumsum.out, aten.cumprod.out,
                                     aten.prod.int_out, aten.nansum.out)}
# Elementwise ops whose CPU kernels refuse an out= of another dtype than the input's ("Found
# dtype Half but expected Float"; signbit's must be bool): the CPU raises, once, for them.
_OUT_OF_THE_INPUTS_DTYPE = {id(op) for op in (
    aten.abs.out, aten.neg.out, aten.sign.out, aten.sgn.out, aten.ceil.out, aten.floor.out,
    aten.trunc.out, aten.round.out, aten.round.decimals_out, aten.frac.out, aten.signbit.out)}


def _elementwise_into(functional, args, kwargs, dst: NeuronTensor) -> bool:
    """An elementwise out= call written straight into `dst`, as the in-place form is (the
    result computed in the promoted type and rounded into dst's dtype, through the promoted
    dtype where that is bf16/fp16, or the CPU's cast error), when dst has the result's shape;
    False to compute the result apart and copy it (resizes, other kernels). A 16 MB add
    with out= took twice the functional add's time through the copy."""
    planned = E.FUSIBLE[functional](*args, **kwargs)  # the kernel's own checks
    if planned is None or len(planned) != 3 or type(planned[0]) is not E.Elementwise:
        return False
    op, operands, params = planned
    arrays = [o.shape for o in operands if type(o) is NeuronTensor]
    if not arrays or E.broadcast_shape(arrays) != tuple(dst.shape):
        return False
    E.run(op, operands, params, out=dst)
    return True


# Note [Other libraries' ops]
# An op of another library (torch.library.custom_op, Library.impl) reaches us at the Python
# key, above its own kernels. If it has one for our backend (registered for "neuron", or for
# every backend: custom_op without device_types, CompositeExplicitAutograd), that kernel
# runs, as it would on CUDA: it is PyTorch code, and its ops come back here one by one.
# Only ops whose kernels are all for other devices run on the CPU (warned and counted).
_OUR_BACKEND = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


def _run_own_kernel(func, args, kwargs):
    return func.redispatch(_OUR_BACKEND, *args, **kwargs)


def _run_decomposition(func, args, kwargs):
    return decomposition_table[func](*args, **kwargs)


def _run_implicit(func, args, kwargs):
    result = func.decompose(*args, **kwargs)
    if result is NotImplemented:
        return cpu_fallback(func, args, kwargs)
    return result


# -- CPU fallback ----------------------------------------------------------------------
def _describe(args, kwargs) -> str:
    parts = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            parts.append(f"{a.dtype}{list(a.shape)}@{a.device}")
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            parts.append("[" + ", ".join(f"{t.dtype}{list(t.shape)}" for t in a) + "]")
        else:
            parts.append(repr(a))
    return ", ".join(parts)


def cpu_fallback(func, args, kwargs):
    """Run `func` on the CPU over aliases of the device memory (warned once, counted)."""
    name = func.name()
    if not config.cpu_fallback:
        raise NotImplementedError(
            f"Operator '{name}' has no neuron kernel and CPU fallback is off "
            f"(NEURON_EAGER_CPU_FALLBACK=0). Arguments: {_describe(args, kwargs)}")
    check_devices(args)
    inputs: list[tuple[torch.Tensor, NeuronTensor]] = []
    copies: list[tuple[torch.Tensor, NeuronTensor]] = []

    def down(x):
        if isinstance(x, NeuronTensor):
            alias = T.cpu_alias(x)
            inputs.append((alias, x))
            return alias
        if isinstance(x, torch.device) and x.type == T.DEVICE.type:
            return torch.device("cpu")
        return x

    def down_copy(x):
        if isinstance(x, NeuronTensor):
            copy = T.cpu_alias(x).clone()  # (torch's: a NumPy-made copy cannot be resized)
            copies.append((copy, x))
            return copy
        return down(x)

    copied = _copied_args(func)  # (names, in the schema's order; positions of args)
    if copied:
        cpu_args = tuple(tree_map(down_copy if i in copied else down, a)
                         for i, a in enumerate(args))
        cpu_kwargs = {k: tree_map(down_copy if k in copied else down, v)
                      for k, v in kwargs.items()}
    else:
        cpu_args, cpu_kwargs = tree_map(down, args), tree_map(down, kwargs)
    if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == T.DEVICE.type:
        cpu_kwargs["device"] = torch.device("cpu")
    with torch._C._DisableTorchDispatch():
        try:
            out = func(*cpu_args, **cpu_kwargs)
        except RuntimeError as e:
            if "not resizable" not in str(e):
                raise
            # an out= alias of device memory cannot grow on the CPU: say what happened
            raise RuntimeError(f"Operator '{name}' has no neuron kernel and ran on the CPU, "
                               f"where its out= tensor, which aliases neuron memory, cannot be "
                               f"resized: pass an out= tensor of the result's shape, or call "
                               f"the op without out=") from e
    # (after the run: a call the CPU refuses too raises its error, and nothing fell back)
    _refuse_complex(name, out)
    for copy, original in copies:
        _write_back(original, copy)
    for alias, original in inputs:  # an out= the CPU shrank or reshaped (rand(3, out=x5))
        if alias.shape != original.shape or alias.storage_offset() or \
                alias.stride() != original.stride():
            _compat.set_metadata(original, tuple(alias.shape), alias.stride(),
                                 original.storage_offset() + alias.storage_offset())
            T.refresh(original)
    if name not in _warned:
        _warned.add(name)
        warn_at_user_line(f"Operator '{name}' fell back to CPU")
    fallback_ops[name] += 1

    def up(o):
        if not isinstance(o, torch.Tensor) or isinstance(o, NeuronTensor):
            return o
        for alias, original in (*copies, *inputs):
            if o is alias:
                T.refresh(original)
                return original
        if o.numel() > 0:
            for alias, original in inputs:
                if alias.numel() > 0 and o.untyped_storage().data_ptr() == \
                        alias.untyped_storage().data_ptr():
                    shift = (o.data_ptr() - alias.data_ptr()) // o.element_size()
                    return T.make(original._storage, o.shape, o.stride(),
                                  original.storage_offset() + shift, o.dtype)
        return T.from_cpu(o)

    return tree_map(up, out)


_copied: dict = {}  # id(op) -> names and positions of the args its CPU run gets as copies


def _copied_args(func) -> frozenset:
    """Arguments a fallback op writes that are neither out= tensors nor an in-place op's
    `self`: buffers such as a fake-quantizer's observer range and scale, which its CPU kernel
    may also resize (from shape (0,) to one per channel), and an alias of device memory
    cannot grow. The CPU run gets copies, written back after it (resized where it resized
    them), as PyTorch's own CPU fallback copies mutated arguments back."""
    found = _copied.get(id(func))
    if found is None:
        arguments = func._schema.arguments
        skip = 0 if not _is_inplace(func) else 1
        found = _copied[id(func)] = frozenset(
            key for i, a in enumerate(arguments) if i >= skip and a.alias_info is not None
            and a.alias_info.is_write and not a.is_out for key in (i, a.name))
    return found


def _write_back(original: NeuronTensor, copy: torch.Tensor) -> None:
    if copy.shape != original.shape:
        from neuron_eager.ops.views import resize_

        resize_(original, copy.shape)
    aten.copy_.default(original, copy)


def _refuse_complex(name: str, out) -> None:
    """An op whose result is complex (torch.fft on a real tensor) cannot come back: say which
    op, rather than only that the dtype is unsupported."""
    for o in tree_flatten(out)[0]:
        if isinstance(o, torch.Tensor) and o.is_complex():
            raise T.UnsupportedDtypeError(
                f"{name} returns {o.dtype}, which neuron cannot hold: Trainium has no complex "
                f"dtypes. Run it on the CPU (`.cpu()` its inputs) and move real results, such "
                f"as `.abs()` or `.real`, back to neuron.")


def clear_op_tracking() -> None:
    for entry in _entries.values():
        entry[2] = 0
    fallback_ops.clear()
    _warned.clear()


T.set_dispatcher(dispatch)
