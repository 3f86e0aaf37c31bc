"""The ops' jit decorator: `numba.njit` with the machine code kept on disk.

Every kernel in ops/ is decorated with this `njit`. Numba then saves what it compiles to
the kernel cache folder (diskcache.py, the folder fused kernels use) and a later process
loads it instead of compiling: a second run's first training step pays milliseconds per
kernel instead of 0.1-10 s (Note [Plain kernels on disk]).
"""
from __future__ import annotations

import dis
import hashlib
import pickle
import tempfile
import types
from pathlib import Path

import llvmlite.binding as llvm
import numpy
import numba
from llvmlite import ir
from numba import types as nbtypes
from numba.core import cgutils
from numba.core.extending import intrinsic

from neuron_eager.ops import _compat, diskcache, sourceline

_folder: list = []  # [Path | None], decided once per process
_made: list = []  # the dispatchers made here and kernelgen's loops, for stats()

# Note [Plain kernels on disk]
# Numba's own cache (cache=True) keeps machine code in __pycache__ beside the source and
# trusts it while that one file is unchanged: it would reuse code that inlined a helper from
# another file after the helper changed. So the ops' functions are cached in
# `<kernel folder>/plain/`, inside the folder named by the fingerprint of all sources (Note
# [Kernel cache fingerprint]): any edit starts an empty folder. Numba's key is wrong for us
# in two more ways. It pickles closure cells, and a pickled Numba function carries a random
# id, new in every process: kernels that factories build around jitted loaders and storers
# would never be found again. And it hashes bytecode alone: two lambdas on one line that
# differ only in a constant, or two copies of a template whose globals are rebound
# (reduction.specialize), would share machine code. So the key digests the code with its
# constants, closure cells and the globals it names, each by what it is (a jitted function
# by the same parts, recursively; a module by its name: what kernels read from modules is
# their source, in the fingerprint). The folder is decided when ops/ is imported: changing
# NEURON_EAGER_CACHE_DIR later moves only adaptive eager's fused kernels.


def njit(*args, **options):
    """`numba.njit`, caching compiled code on disk when the kernel folder is usable."""
    on_disk = options.pop("cache", True) and plain_folder() is not None

    def decorate(fn):
        dispatcher = numba.njit(**options)(fn)
        if on_disk:
            dispatcher._cache = _FunctionCache(fn)  # enable_caching(), with our class
        return track(dispatcher)

    if args and callable(args[0]):
        return decorate(args[0])
    return decorate


def track(dispatcher):
    """Count a dispatcher's compiles and disk loads in `stats()`; returns it."""
    _made.append(dispatcher)
    return dispatcher


def stats() -> dict:
    """Signatures of plain eager's kernels loaded from the disk cache and compiled in this
    process."""
    loaded = sum(sum(d.stats.cache_hits.values()) for d in _made)
    return dict(loaded=loaded, compiled=sum(len(d.overloads) for d in _made) - loaded)


def plain_folder() -> Path | None:
    """Where the ops' machine code is cached for this process (None: in memory only)."""
    if not _folder:
        _folder.append(_usable(diskcache.folder()))
    return _folder[0]


def _usable(kernels: Path | None) -> Path | None:
    if kernels is None:
        return None
    path = kernels / "plain"
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        sourceline.warn_at_user_line(
            f"neuron-eager: the kernel disk cache {path} is not usable, kernels compile in "
            f"every process ({type(e).__name__}: {e}); set {diskcache.ENV} to another "
            f"folder, or to 'off'", RuntimeWarning)
        return None
    diskcache.prune_once(kernels)
    return path


def function_key(fn) -> str:
    """A digest of what a Python function compiles to, stable across processes: its code
    (bytecode, constants, names), its closure cells and the globals it names, each by what
    it is (Note [Plain kernels on disk])."""
    return hashlib.sha256(repr(_describe(fn, {})).encode()).hexdigest()


def _describe(value, memo: dict):
    py_func = getattr(value, "py_func", None)  # a Numba function: all it compiles from
    if isinstance(py_func, types.FunctionType):
        seen = memo.get(id(py_func))
        if seen is not None:  # described already, or being described (recursion)
            return seen
        memo[id(py_func)] = head = ("jit", py_func.__module__, py_func.__qualname__)
        memo[id(py_func)] = described = head + _parts(py_func, memo)
        return described
    defn = getattr(value, "_defn", None)  # an intrinsic: its code writes the LLVM IR
    if isinstance(defn, types.FunctionType):
        cells = tuple(_describe(c.cell_contents, memo) for c in defn.__closure__ or ())
        return ("intrinsic", defn.__module__, defn.__qualname__, _code(defn.__code__), cells)
    if isinstance(value, types.FunctionType):  # a jitted function's Python source
        return ("py", value.__module__, value.__qualname__) + _parts(value, memo)
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(_describe(v, memo) for v in value)
    try:
        return (type(value).__qualname__, hashlib.sha256(pickle.dumps(value)).hexdigest())
    except Exception:  # noqa: BLE001  (unpicklable: unique to this process, never reused)
        return (type(value).__qualname__, "id", id(value))


def _parts(fn, memo: dict) -> tuple:
    """A function's code, closure cells and the globals its code loads, described."""
    code, names = fn.__code__, fn.__globals__
    cells = tuple(_describe(c.cell_contents, memo) for c in fn.__closure__ or ())
    used = tuple((name, _describe(names[name], memo) if isinstance(
        getattr(names[name], "py_func", None), types.FunctionType) else _shallow(names[name]))
        for name in sorted(_global_loads(code)) if name in names)
    return _code(code), cells, used


def _shallow(value):
    """A global that is not a Numba function: constants in full, the rest by name."""
    if isinstance(value, (types.FunctionType, type)):  # (not jitted: an @overload'ed name)
        return ("object", getattr(value, "__module__", ""), value.__qualname__)
    return _describe(value, {})


def _global_loads(code) -> set:
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_loads(const)
    return names


def _code(code) -> tuple:
    consts = []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            consts.append(_code(const))
        elif isinstance(const, frozenset):  # its order changes with the string hash seed
            consts.append(sorted(map(repr, const)))
        else:
            consts.append((type(const).__name__, repr(const)))
    return (code.co_code, tuple(consts), code.co_names)


# Note [Symbols across processes]
# Numba names a function's machine code by module, qualified name and a serial number that
# counts from 1 in every process. Lambdas, factory closures and reduction.specialize copies
# share a qualified name, so two of them compiled in two processes could get one symbol;
# loaded from the disk cache into one process, the linker then binds both callers to one of
# them (a fused LayerNorm called mul where it meant div). Counting from a random 60-bit
# start in each process keeps every symbol distinct.
_compat.unique_numba_symbols()
_compat.renew_numba_compiler_lock_after_fork()
_FunctionCache = _compat.numba_function_cache(plain_folder, function_key)


@intrinsic
def fma(typingctx, x, y, z):
    """x * y + z rounded once (LLVM's llvm.fma, the CPU's vector fmadd) for floats of one
    type; for integers of one type x * y + z, and for bools z or (x and y)."""
    if not (x == y == z):
        return None
    if isinstance(x, nbtypes.Float):
        def codegen(context, builder, signature, args):
            ty = args[0].type
            fn = builder.module.declare_intrinsic("llvm.fma", [ty],
                                                  ir.FunctionType(ty, [ty, ty, ty]))
            return builder.call(fn, args)
    elif isinstance(x, nbtypes.Integer):
        def codegen(context, builder, signature, args):
            return builder.add(builder.mul(args[0], args[1]), args[2])
    elif isinstance(x, nbtypes.Boolean):
        def codegen(context, builder, signature, args):
            return builder.or_(args[2], builder.and_(args[0], args[1]))
    else:
        return None
    return x(x, y, z), codegen


@intrinsic
def fetch_add(typingctx, counter, value):
    """Atomically add `value` to counter[0] (a 1-D int64 array) and return the old value:
    threads running one kernel claim work items from a shared counter."""
    if not (isinstance(counter, nbtypes.Array) and counter.dtype == nbtypes.int64
            and isinstance(value, nbtypes.Integer)):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, value=args[0]).data
        step = context.cast(builder, args[1], signature.args[1], nbtypes.int64)
        return builder.atomic_rmw("add", data, step, "seq_cst")

    return nbtypes.int64(counter, value), codegen


# Note [Native calls by symbol]
# A kernel holding a ctypes function holds its address, which is new in every process, so
# Numba cannot keep such a kernel on disk and every process compiled it again (1.8 s for a
# first torch.linalg.inv). `native_call` registers the address with LLVM under a name of
# ours (llvmlite's add_symbol) and returns a jitted call of that name: machine code read
# from disk is linked to this process's address when it is loaded.
def native_call(symbol: str, address: int, nargs: int, floats: tuple = ()):
    """A jitted call of the C function at `address` taking `nargs` arguments and returning
    nothing (a result is ignored), by the LLVM name `symbol`: C floats at the positions in
    `floats`, pointer-sized integers (pointers, C ints) elsewhere."""
    llvm.add_symbol(symbol, address)

    @intrinsic
    def call(typingctx, *args):
        if len(args) != nargs or not all(isinstance(a, nbtypes.Float if i in floats
                                                    else nbtypes.Integer)
                                         for i, a in enumerate(args)):
            return None

        def codegen(context, builder, signature, llargs):
            pointer = ir.IntType(8).as_pointer()
            kinds = [ir.FloatType() if i in floats else pointer for i in range(nargs)]
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), kinds), symbol)
            values = cgutils.unpack_tuple(builder, llargs[0], nargs) if nargs else []
            builder.call(fn, [context.cast(builder, v, t, nbtypes.float32) if i in floats
                              else builder.inttoptr(v, pointer)
                              for i, (v, t) in enumerate(zip(values, args))])
            return context.get_dummy_value()

        return nbtypes.void(nbtypes.StarArgTuple.from_types(args)), codegen

    return call


_pointers: dict = {}


def pointer_to(dtype_name: str):
    """A jitted cast of an address (int64) to a pointer to elements of the NumPy dtype named
    `dtype_name`, for `numba.carray(pointer, n)`: multi-tensor kernels read their tensors
    from a table of addresses (Note [Address tables] in multitensor.py)."""
    made = _pointers.get(dtype_name)
    if made is None:
        element = numba.from_dtype(numpy.dtype(dtype_name))

        @intrinsic
        def pointer(typingctx, address):
            if not isinstance(address, nbtypes.Integer):
                return None

            def codegen(context, builder, signature, args):
                return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

            return nbtypes.CPointer(element)(address), codegen

        made = _pointers[dtype_name] = pointer
    return made
