"""Every touch of torch (and Numba) internals, in one place (torch.nn's in _compat_modules.py);
tests/test_compat.py checks each.

These are private or experimental PyTorch APIs (torch 2.13) and Numba's codegen target
machine. If an upgrade breaks one, the test named after it fails loudly rather than the
device misbehaving quietly.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import sys

import torch
import torch.utils.backend_registration as _backend_registration
from torch._C import DispatchKey, DispatchKeySet

from neuron_eager.ops import sourceline

BACKEND = "neuron"
_META = DispatchKeySet(DispatchKey.Meta)


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


_PRIVATE_USE1 = torch._C._autograd.DeviceType.PrivateUse1
_pending_error = ctypes.pythonapi.PyErr_Occurred  # (a PyDLL call: raises what is pending)
_pending_error.argtypes, _pending_error.restype = [], ctypes.c_void_p
_keep_error = None  # backward_errors.keep, once backward's errors are installed


# Note [An exception pending in the device guard]
# Python code failing in backward on autograd's device thread (an op, a user's hook) leaves
# its exception pending while the failed node's stream guard unwinds, and the guard's
# destructor (noexcept) asks this guard for its device type: a Python call that cannot
# succeed with an exception pending, so the process aborted (Note [Errors on autograd's
# thread] in backward_errors.py). Asking CPython whether an exception is pending raises it
# here (ctypes' PyDLL calls check): in backward it is kept for backward()'s wrapper and the
# guard answers. One C call per guard call: ~0.2 us, ~450 calls in a small transformer's
# training step (<1% of it).
class _DeviceGuard(torch._C._acc.DeviceGuard):
    """Without a device guard, `.to('neuron')` and backward() fail inside C++."""

    def type_(self):
        try:
            _pending_error()
        except BaseException as e:
            if _keep_error is None or torch._C._current_graph_task_id() == -1:
                raise
            _keep_error(e)
        return _PRIVATE_USE1


def rename_backend() -> None:
    """Rename PrivateUse1 to `neuron` and generate `Tensor.neuron()` and friends (idempotent)."""
    if torch._C._get_privateuse1_backend_name() == BACKEND:
        return
    torch.utils.rename_privateuse1_backend(BACKEND)
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_DeviceGuard())


def register_device_module(module) -> None:
    """Make `module` answer as `torch.neuron`."""
    if getattr(torch, BACKEND, None) is not module:
        torch._register_device_module(BACKEND, module)


def make_wrapper(cls, shape, stride, offset, dtype, device, requires_grad=False):
    return torch.Tensor._make_wrapper_subclass(
        cls, shape, strides=stride, storage_offset=offset, dtype=dtype, device=device,
        requires_grad=requires_grad)


# Note [Host tensors under a default device]
# torch.set_default_device("neuron") (or `with torch.device("neuron"):`) is a torch function
# mode that sends every factory call without a device to neuron, our own host-side calls
# too: the CPU tensors kernels, printing and torch.save make landed on the device. So the
# device's Python runs with torch function off whenever a mode is on (checked per op, with
# the tracer's state below: ~0.1 us together): user modes see the user's calls, never the
# simulator's.
# torch.jit.trace likewise recorded the simulator's own calls into the user's trace (the
# convolution's meta run broke the tracer's bookkeeping, and a process that failed such traces
# could crash later): the tracer is paused inside the device too.
function_modes = torch._C._len_torch_function_stack
tracing_state = torch._C._get_tracing_state


@contextlib.contextmanager
def device_side():
    """Torch function modes and the JIT tracer off (Note [Host tensors under a default
    device])."""
    state = tracing_state()
    if state is not None:
        _set_tracing_state(None)
    try:
        with torch._C.DisableTorchFunction():
            yield
    finally:
        if state is not None:
            _set_tracing_state(state)


def _set_tracing_state(state) -> None:
    """torch refuses to change the tracing state while its Tracer key is excluded, as it is in
    a kernel: the exclusion is lifted for the change."""
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded(_TRACER)
    torch._C._dispatch_tls_set_dispatch_key_excluded(_TRACER, False)
    try:
        torch._C._set_tracing_state(state)
    finally:
        torch._C._dispatch_tls_set_dispatch_key_excluded(_TRACER, excluded)


_TRACER = torch._C._parse_dispatch_key("Tracer")  # (not a named member of DispatchKey)


def host_side(fn):
    """`fn` run as `device_side` (Note [Host tensors under a default device])."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if sys.gettrace() is not None and sourceline.debugger_tracing(sys.gettrace()):
            return sourceline.untraced(run, *args, **kwargs)
        if function_modes() or tracing_state() is not None:
            with device_side():
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    # Dynamo inlined printing and tolist() into a compiled graph (np.copyto on fake tensors
    # failed): it breaks the graph at them, and runs them untraced (Note [torch.compile])
    run._torchdynamo_disable = True
    keep_dynamo_out(run)
    return run


def keep_dynamo_out(fn) -> None:
    """TorchDynamo runs `fn` and everything it calls without tracing it (Note [torch.compile]
    in ops/tensor.py). A per-code setting: no cost per call, unlike torch._dynamo.disable's
    wrapper (2-5 us an op)."""
    from torch._C._dynamo import eval_frame

    skip = eval_frame._FrameAction.SKIP
    eval_frame.set_code_exec_strategy(fn.__code__, eval_frame._FrameExecStrategy(skip, skip))


# Note [Compiled graphs on neuron]
# Dynamo breaks the graph at every op on a neuron tensor (Note [torch.compile] in
# ops/tensor.py), but a factory with device="neuron" (`torch.arange(T, device=x.device)`)
# has no tensor argument, so it lands in a graph, and Inductor, which has no code generator
# for the device, failed on it (KeyError: 'neuron'). Graphs that make or take a neuron tensor
# therefore run as they were traced, op by op through the device's kernels (eager's
# results); others still go to Inductor.
_plain_inductor_call = None


def _touches(graph_module, inputs) -> bool:
    for t in inputs:
        if getattr(getattr(t, "device", None), "type", None) == BACKEND:
            return True
    for node in graph_module.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if getattr(getattr(v, "device", None), "type", None) == BACKEND:
                return True
    return False


def install_backward_errors(errors) -> None:
    """Wrap torch's entry to the autograd engine (backward() and autograd.grad() call it):
    when the engine fails for an exception kept on autograd's thread, raise that exception
    (Note [Errors on autograd's thread] in backward_errors.py); check gradients' devices.
    Idempotent."""
    import torch.autograd.graph as graph

    global _keep_error
    _keep_error = errors.keep  # (Note [An exception pending in the device guard])
    run = graph._engine_run_backward
    if getattr(run, "_neuron_wrapped", False):
        return

    def _engine_run_backward(*args, **kwargs):
        errors.check_root_gradients(args[0], args[1] if len(args) > 1 else None)
        errors.wait_at_exit_after(args[0])
        since = errors.mark()
        try:
            return run(*args, **kwargs)
        except SystemError:  # ("returned NULL without setting an exception")
            kept = errors.claim(since)
            if kept is None:
                raise
            try:  # (this frame must not keep the error: its traceback holds the frame, a
                raise kept.with_traceback(kept.__traceback__) from None  # cycle keeping
            finally:  # the failed step's tensors, and HBM, until the garbage collector ran)
                kept = None

    _engine_run_backward._neuron_wrapped = True
    keep_dynamo_out(_engine_run_backward)  # (a compiled step's backward would trace it, and
    # warn about the atexit call of Note [Exit after backward])
    graph._engine_run_backward = _engine_run_backward
    torch.autograd._engine_run_backward = _engine_run_backward  # (imported there by name)

    # custom autograd.Functions' backward: the engine's device check skips Python subclasses
    node = torch.autograd.function.BackwardCFunction
    node_apply = node.apply

    def apply(self, *args):
        result = node_apply(self, *args)
        errors.check_function_gradients(self, result)
        return result

    node.apply = apply


# Note [Control flow ops in eager]
# torch.cond and torch._higher_order_ops.while_loop, called outside torch.compile/export, run
# their operator through Dynamo with fullgraph=True, which cannot hold an op on a neuron
# tensor (Note [torch.compile] in ops/tensor.py): they failed in eager. With a neuron tensor
# among the predicate and operands, eager runs them as their documentation spells them out:
# the branch the predicate picks (torch's own eager answer for a Python bool predicate), or
# the body while the condition holds. torch's input checks run first; whether the two
# branches agree is checked where a graph is made (compile, export), as for a bool.
def install_control_flow_shim() -> None:
    import importlib

    from torch.utils import _pytree as pytree

    # (the package's `cond` and `while_loop` are the functions: the modules by their names)
    cond_module = importlib.import_module("torch._higher_order_ops.cond")
    loop_module = importlib.import_module("torch._higher_order_ops.while_loop")

    cond, while_loop = cond_module.cond, loop_module.while_loop
    if getattr(cond, "_neuron_wrapped", False):
        return

    def eager_with(*trees) -> bool:
        return not (torch.compiler.is_dynamo_compiling() or torch.compiler.is_exporting()) \
            and any(isinstance(t, torch.Tensor) and t.device.type == BACKEND
                    for t in pytree.tree_leaves(trees))

    @functools.wraps(cond)
    def cond_in_eager(pred, true_fn, false_fn, operands=()):
        if not eager_with(pred, operands):
            return cond(pred, true_fn, false_fn, operands)
        if isinstance(pred, torch.Tensor) and pred.numel() != 1:
            raise RuntimeError(f"Expected pred to be bool or single-element tensor, but got "
                               f"{pred}.")
        if not callable(true_fn) or not callable(false_fn):
            raise RuntimeError("Expect both branches to be callable.")
        return (true_fn if bool(pred) else false_fn)(*operands)

    @functools.wraps(while_loop)
    def while_loop_in_eager(cond_fn, body_fn, carried_inputs):
        if not eager_with(carried_inputs):
            return while_loop(cond_fn, body_fn, carried_inputs)
        carried = tuple(carried_inputs)
        while bool(cond_fn(*carried)):
            carried = tuple(body_fn(*carried))
        return carried

    cond_in_eager._neuron_wrapped = True
    torch.cond = cond_module.cond = cond_in_eager
    loop_module.while_loop = while_loop_in_eager
    if getattr(torch._higher_order_ops, "while_loop", None) is while_loop:
        torch._higher_order_ops.while_loop = while_loop_in_eager


def install_compile_shim() -> None:
    """Send torch.compile's graphs that touch neuron tensors around Inductor (Note [Compiled
    graphs on neuron]); Inductor is not imported until torch.compile runs."""
    global _plain_inductor_call
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or _plain_inductor_call is not None:
        return
    _plain_inductor_call = wrapper.__call__

    def __call__(self, model_, inputs_, **kwargs):
        if _touches(model_, inputs_):
            return model_
        return _plain_inductor_call(self, model_, inputs_, **kwargs)

    wrapper.__call__ = __call__


def set_metadata(tensor: torch.Tensor, shape, stride, offset: int) -> None:
    """Change a wrapper tensor's size, stride and offset in place (resize_, set_, t_, ...).

    The Meta kernel of `set_`, given the wrapper's own (data-less) storage, edits the
    TensorImpl's metadata and nothing else, which is exactly what a wrapper subclass needs.
    """
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _META, tensor, torch._C.TensorBase.untyped_storage(tensor), offset, list(shape),
        list(stride))


def ensure_foreach_support(cls) -> None:
    """Let torch.optim take its foreach path for `cls` tensors."""
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    for supported in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if cls not in supported:
            supported.append(cls)


def ensure_fx_tracing(cls) -> None:
    """Let make_fx (torch.func.linearize, functorch's compile) trace ops on `cls` tensors it
    is not tracking, as it traces plain tensors: as graph constants. Its proxy mode declines
    tensor types outside its list (they are taken for subclasses to unwrap first), so the op
    ran untraced and its trace-time result became a constant of the graph."""
    from torch.fx.experimental import proxy_tensor

    if cls not in proxy_tensor.HANDLED_TYPES:
        proxy_tensor.HANDLED_TYPES = (*proxy_tensor.HANDLED_TYPES, cls)


def install_accelerator_functions(neuron_functions: dict) -> None:
    """Answer torch.accelerator's calls that need C++ device hooks when neuron is the
    accelerator: `neuron_functions` maps each name (in torch.accelerator or its memory
    module) to neuron's version.

    Those calls reach a C++ caching allocator, host allocator or stream type that a Python
    backend cannot register: `empty_cache()` and the stats resets hit a c10 internal assert,
    `empty_host_cache()` crashed the process, `set_stream` refused torch.neuron.Stream. Each
    Python function is replaced by one that falls through to the original for any other
    accelerator.
    """
    import torch.accelerator as accelerator
    import torch.accelerator.memory as accelerator_memory

    def is_neuron() -> bool:
        current = accelerator.current_accelerator()
        return current is not None and current.type == BACKEND

    for name, neuron_function in neuron_functions.items():
        module = accelerator_memory if name in accelerator_memory.__all__ else accelerator
        original = getattr(module, name)
        if getattr(original, "_neuron", False):
            continue

        def call(*args, _original=original, _neuron=neuron_function, **kwargs):
            return (_neuron if is_neuron() else _original)(*args, **kwargs)

        functools.update_wrapper(call, original)
        call._neuron = True
        setattr(module, name, call)
        setattr(accelerator, name, call)  # torch.accelerator re-exports the memory functions


def refuse_process_sharing(cls, message: str) -> None:
    """torch.multiprocessing sends a tensor to another process through shared memory or CUDA
    IPC (its ForkingPickler reducers); a `cls` tensor's memory cannot go either way, and
    pickling it by value gave the child an unshared copy or failed inside torch's shared-file
    code. Sending one raises `message` instead."""
    from multiprocessing import reduction

    def refuse(tensor):
        raise RuntimeError(message)

    reduction.register(cls, refuse)


def refuse_dlpack_export(cls, message: str) -> None:
    """torch.to_dlpack (torch.utils.dlpack.to_dlpack) exports a `cls` tensor as `message`
    says, like its __dlpack__: the capsule torch made held a device pointer no library could
    read."""
    export = torch.utils.dlpack.to_dlpack
    if getattr(export, "_neuron_wrapped", False):
        return

    @functools.wraps(export)
    def to_dlpack(tensor):
        if isinstance(tensor, cls):
            raise BufferError(message)
        return export(tensor)

    to_dlpack._neuron_wrapped = True
    torch.utils.dlpack.to_dlpack = torch.to_dlpack = to_dlpack


_pin_lib = None


def install_pinned_memory_shim() -> None:
    """Make `Tensor.pin_memory()` (and DataLoader(pin_memory=True)) work with neuron current.

    Pinning asks the current accelerator's C++ hooks for a pinned-memory allocator, which
    a Python backend cannot provide. The simulated device reads host memory directly, so
    pinning is a plain copy here and `is_pinned()` says False. Installed only where no CUDA
    device exists, so a real GPU's pinning is never replaced.
    """
    global _pin_lib
    if _pin_lib is not None or torch.cuda.is_available():
        return
    _pin_lib = torch.library.Library("aten", "IMPL")
    _pin_lib.impl("_pin_memory", lambda self, device=None: self.clone(), "CPU")
    _pin_lib.impl("is_pinned", lambda self, device=None: False, "CPU")


# Note [No bare neuron storages]
# A storage made on its own (torch.UntypedStorage(n, device="neuron"), storage.clone(), a
# DataLoader worker collating device tensors into shared memory) asks c10 for the device's C++
# allocator, which a Python backend cannot register: the process crashed (SIGSEGV). Such calls
# now raise, saying what works instead; storages of neuron tensors are unaffected.
_storage_new = None


def refuse_bare_storages() -> None:
    global _storage_new
    if _storage_new is not None:
        return
    _storage_new = torch.UntypedStorage.__new__

    def __new__(cls, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == BACKEND:
            raise RuntimeError(
                f"a storage cannot be made on its own on {BACKEND} (this simulated device has "
                f"no C++ allocator): make a tensor there instead (torch.empty(n, dtype=torch."
                f"uint8, device='{BACKEND}')). In a DataLoader, return CPU tensors from the "
                f"dataset and move each batch to {BACKEND} in the training loop.")
        if device is not None:
            kwargs["device"] = device
        return _storage_new(cls, *args, **kwargs)

    torch.UntypedStorage.__new__ = __new__


def _torch_cpu_library():
    """torch's CPU library (libtorch_cpu: MKL is linked into it on x86-64 Linux) as a ctypes
    library, or None."""
    import ctypes
    import os

    try:
        return ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib",
                                        "libtorch_cpu.so"))
    except OSError:
        return None


def torch_lapack_library():
    """torch's own LAPACK (MKL, linked into libtorch_cpu) as a ctypes library, when it exports
    the Fortran symbols the linear-algebra kernels call; None otherwise. The kernels call it
    on NumPy buffers, as they call SciPy's LAPACK; no torch op runs."""
    lib = _torch_cpu_library()
    has = lib is not None and all(hasattr(lib, n) for n in ("sgesdd_", "ssyevd_"))
    return lib if has else None  # (both present, or use SciPy's)


def torch_cpu_address(name: str) -> int | None:
    """The address of C function `name` exported by torch's CPU library, or None."""
    import ctypes

    lib = _torch_cpu_library()
    if lib is None or not hasattr(lib, name):
        return None
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def install_profiler_hooks(on_start, on_stop, on_results, on_export) -> None:
    """Let the simulated device take part in torch.profiler (both torch.profiler.profile and
    torch.autograd.profiler.profile run through the latter's methods).

    A Python backend cannot feed device activity to Kineto, so four methods of
    `torch.autograd.profiler.profile` are wrapped: `_start_trace` -> on_start(prof),
    `__exit__` -> on_stop(prof) after it, `_parse_kineto_results` -> events =
    on_results(prof, kineto_result, events), and `export_chrome_trace` -> on_export(prof,
    path) after the file is written. Idempotent.
    """
    from torch.autograd.profiler import profile

    if getattr(profile._start_trace, "_neuron", False):
        return
    start, stop = profile._start_trace, profile.__exit__
    parse, export = profile._parse_kineto_results, profile.export_chrome_trace

    def _start_trace(self):
        start(self)
        on_start(self)

    def __exit__(self, exc_type, exc_val, exc_tb):
        try:
            return stop(self, exc_type, exc_val, exc_tb)
        finally:
            if self.enabled:
                on_stop(self)

    def _parse_kineto_results(self, result, timeout_s=None):
        return on_results(self, result, parse(self, result, timeout_s=timeout_s))

    def export_chrome_trace(self, path, metadata=None, use_python_export=False):
        out = export(self, path, metadata, use_python_export)
        on_export(self, path)
        return out

    init = profile.__init__

    def __init__(self, *args, use_device=None, use_kineto=False, **kwargs):
        # the legacy profiler's own mode for a PrivateUse1 device (use_kineto=False) needs C++
        # profiler stubs a Python backend cannot register: every op logged an error. Kineto's
        # mode is the one torch.profiler.profile uses, and works.
        init(self, *args, use_device=use_device,
             use_kineto=use_kineto or use_device == BACKEND, **kwargs)

    for name, fn in (("_start_trace", _start_trace), ("__exit__", __exit__),
                     ("_parse_kineto_results", _parse_kineto_results),
                     ("export_chrome_trace", export_chrome_trace), ("__init__", __init__)):
        fn._neuron = True
        fn.__doc__ = getattr(profile, name).__doc__
        setattr(profile, name, fn)


def device_function_event(name: str, start_us: float, end_us: float, track: int, flops=None):
    """A profiler FunctionEvent for one kernel on the neuron device (DeviceType.PrivateUse1),
    as Kineto would build for a CUDA kernel."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    return FunctionEvent(id=0, name=name, thread=track, start_us=start_us, end_us=end_us,
                         overload_name="", trace_name=name, input_shapes=[], stack=[],
                         use_device=BACKEND, device_type=DeviceType.PrivateUse1, device_index=0,
                         device_resource_id=track, flops=flops, concrete_inputs=[], kwinputs={})


def is_host_event(event) -> bool:
    from torch.autograd import DeviceType

    return event.device_type == DeviceType.CPU and not event.is_async


# -- Numba ------------------------------------------------------------------------------
# Note [512-bit vectors]
# LLVM tunes AVX-512 CPUs to prefer 256-bit vectors (clock throttling on old Xeons), so
# Numba's loops used ymm registers only. The elementwise templates and the fastmath
# polynomials are compute-bound at 256 bits (gelu on 4M fp32: about 1.3x faster at 512).
# The tuning flag lives on Numba's codegen target machine, which every kernel shares, plain
# and fused alike (the option cannot differ between them); vector width never changes a
# result, since no kernel lets LLVM reassociate (tests/test_numerics.py compares the bits).
def prefer_512_bit_vectors() -> bool:
    """Let Numba's LLVM use 512-bit vectors on AVX-512 CPUs; True if it now does."""
    import llvmlite.binding as ll
    from numba.core import config as numba_config
    from numba.core.registry import cpu_target

    codegen = cpu_target.target_context.codegen()
    features = getattr(codegen, "_tm_features", "")
    if "-prefer-256-bit" in features:
        return True
    if "+avx512f" not in features.split(",") or not hasattr(codegen, "_tm"):
        return False
    features += ",-prefer-256-bit"
    options = dict(opt=numba_config.OPT)
    codegen._customize_tm_options(options)
    options["features"] = features
    codegen._tm = ll.Target.from_triple(ll.get_process_triple()).create_target_machine(**options)
    codegen._tm_features = features  # part of the on-disk cache key (magic_tuple)
    return True


def numba_function_cache(folder, function_key):
    """A Numba FunctionCache class (what `cache=True` installs on a dispatcher) keeping
    machine code in the folder `folder()` names, under keys from `function_key(py_func)`
    instead of Numba's bytecode hash and pickled closure (Note [Plain kernels on disk])."""
    from numba.core import caching

    class Locator(caching._CacheLocator):
        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno

        def get_cache_path(self):
            return str(folder())

        def get_source_stamp(self):  # the folder's fingerprint covers every source
            return None

        def get_disambiguator(self):
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            return cls(py_func, py_file)

    class Impl(caching.CompileResultCacheImpl):
        _locator_classes = [Locator]

    class FunctionCache(caching.FunctionCache):
        _impl_class = Impl

        def __init__(self, py_func):
            super().__init__(py_func)
            keyed_cache_files(self)

        def _index_key(self, sig, codegen):
            return sig, codegen.magic_tuple(), function_key(self._py_func)

    return FunctionCache


# Note [Cache files across processes]
# Numba saves an overload by reading the function's index, naming the data file by the first
# free serial number, writing the index and then the data. Two processes saving different
# overloads at once (pytest-xdist's workers, two training scripts) both take serial 1: the
# index then maps one signature to the other's machine code, which a later process loads. CI
# saw it as "can't unbox array" (an int64 copy loop given a bool one's code); with equal
# item sizes it would run the wrong code silently. Here a data file is named by a digest of
# its key, written before the index names it, and the index is updated under a file lock:
# two processes can only write the same code to the same name.
def keyed_cache_files(cache) -> None:
    """Give a Numba Cache (a dispatcher's `_cache`) the saving of Note [Cache files across
    processes], and make its disk errors a warning (Note [A cache folder that goes away])."""
    cache._cache_file.__class__ = _keyed_index_file_class()
    cache._guard_against_spurious_io_errors = _disk_errors_warned


# Note [A cache folder that goes away]
# Another version's pruning (Note [Old fingerprints] in ops/diskcache.py), a user clearing
# ~/.cache or a full disk can take a kernel folder away while a process uses it. Numba lets
# the OSError of loading or saving escape into the op that wanted the kernel (its guard
# covers Windows' EACCES only); here it warns once, and the kernel compiles in memory.
_disk_warned: set = set()


@contextlib.contextmanager
def _disk_errors_warned():
    try:
        yield
    except OSError as e:
        if type(e) not in _disk_warned:
            _disk_warned.add(type(e))
            sourceline.warn_at_user_line(
                f"neuron-eager: a kernel could not be read from or written to the disk cache "
                f"({type(e).__name__}: {e}); it compiles in memory", RuntimeWarning)


@functools.cache
def _keyed_index_file_class():
    import hashlib
    import pickle

    from numba.core import caching

    class KeyedIndexDataCacheFile(caching.IndexDataCacheFile):
        def save(self, key, data):
            digest = hashlib.sha256(pickle.dumps(key)).hexdigest()[:24]
            name = self._data_name_pattern.replace("{number:d}", digest)
            self._save_data(name, data)
            with _locked(self._index_path + ".lock"):
                overloads = self._load_index()
                overloads[key] = name
                self._save_index(overloads)

    return KeyedIndexDataCacheFile


class _locked:
    """An exclusive lock on a lock file (none where fcntl is missing: Windows)."""

    def __init__(self, path: str):
        self._path, self._file = path, None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:
            return self
        self._file = open(self._path, "a")  # noqa: SIM115  (closed in __exit__)
        fcntl.flock(self._file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self._file is not None:
            self._file.close()  # (closing releases the lock)
        return False


def unique_numba_symbols() -> None:
    """Number this process's Numba functions from a random start (Note [Symbols across
    processes] in ops/jit.py)."""
    import itertools
    import secrets

    from numba.core import bytecode

    bytecode.FunctionIdentity._unique_ids = itertools.count(secrets.randbits(48) << 12)


def renew_numba_compiler_lock_after_fork() -> None:
    """Numba's compiler lock made anew in a forked child (Note [Forking with threads] in
    device_sim/forks.py): a child forked while another thread compiled waited on it."""
    import threading

    from numba.core.compiler_lock import global_compiler_lock

    from neuron_eager.device_sim import forks

    forks.renew_after_fork(global_compiler_lock, "_lock", threading.RLock)
