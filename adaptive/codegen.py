"""Fused kernels: Numba source for one group of recorded elementwise ops, and their cache.

A kernel is generated from fixed per-op templates with generated names (never from user
strings): each op loads its operands to its compute type, calls the op's jitted scalar
function and rounds the value to its output dtype (Note [Bit-identical fusion]), so the
fused loop computes exactly what the ops compute one by one. Kernels are cached in memory
by their structure, which leaves out shapes and scalar values (they are arguments), and on
disk as content-hashed files that Numba caches machine code for (diskcache.py), so a later
process loads them instead of compiling. A generator returns (source, recipes): each global
the source calls is a printable recipe that `elementwise.resolve` turns into the jitted
function.
"""
from __future__ import annotations

import time
import warnings

from neuron_eager.ops import diskcache, elementwise, kernelgen

# Note [Bit-identical fusion]
# Plain eager stores every op's result in its dtype and the next op loads it back. A fused
# kernel keeps the stored form in a local instead of HBM: `v = store(fn(load(a), ...))` and
# a consumer loads `v` with the loader plain eager would use on that tensor. Scalars are cast
# on the host to the op's compute type, as plain eager does. Nothing is rounded less or
# more often, so results are the same bits (the differential tests check it).

FAILED = object()  # a kernel that did not compile: its groups run op by op
_kernels: dict = {}
_labels: dict = {}  # spec -> label, for first_call's warning
_warned: set = set()
STATS_ZERO = dict(compiles=0, disk_hits=0, disk_writes=0, disk_fallbacks=0)
stats: dict = dict(STATS_ZERO)


def source(spec) -> tuple[str, dict]:
    """Kernel source and recipes (global name -> recipe, see `elementwise.resolve`) for a
    group `spec`: (layout, nodes, stores, n_out, n_in, n_scalars, aliases, kinds). Each node
    is (op, operands, compute, out_code) with operands ("v", local node, load code), ("a",
    input array, load code), ("t", scalar arg, load code: a 0-dim tensor's stored value) or
    ("s", scalar arg: a host-cast Python scalar or parameter); `stores` lists (local node,
    output array); `aliases` (input, output) pairs: inputs read through the output that
    writes their memory (Note [In-place loops] in ops/kernelgen.py); `kinds`, under layout
    'b', each input's kind (Note [Broadcast rows] in ops/kernelgen.py)."""
    layout, nodes, stores, n_out, n_in, n_scalars, aliases, kinds = spec
    aliases = dict(aliases)
    names = [f"o{k}" for k in range(n_out)] + [f"a{k}" for k in range(n_in)
                                                if k not in aliases] + \
        [f"s{k}" for k in range(n_scalars)]
    recipes: dict = {}
    lines = [f"def kernel({', '.join(names)}):"]
    loop, idx, pad = kernelgen.loop_header(layout, "o0")
    lines += loop
    for k in range(n_in):
        array = f"o{aliases[k]}" if k in aliases else f"a{k}"
        at = kernelgen.index(layout, kinds[k]) if kinds and k not in aliases else idx
        lines.append(f"{pad}r{k} = {array}{at}")
    held = set()  # fp16 results held as their fp32 values (Note [fp16 values stay fp32])
    for j, (op, operands, compute, out_code) in enumerate(nodes):
        recipes[f"f{j}"] = ("op", op.name)
        if out_code == "f16":
            held.add(j)
            recipes[f"st{j}"] = ("rounder", "f16")
        else:
            recipes[f"st{j}"] = ("storer", out_code)
        values = []
        for i, (kind, ref, *code) in enumerate(operands):
            if kind == "s":
                values.append(f"s{ref}")
                continue
            load = "f32" if kind == "v" and ref in held else code[0]
            recipes[f"l{j}_{i}"] = ("loader", load, compute)
            arg = {"v": "v", "a": "r", "t": "s"}[kind] + str(ref)
            values.append(f"l{j}_{i}({arg})")
        lines.append(f"{pad}v{j} = st{j}(f{j}({', '.join(values)}))")
    for j, k in stores:
        if j in held:
            recipes[f"e{j}"] = ("storer", "f16")
            lines.append(f"{pad}o{k}{idx} = e{j}(v{j})")
        else:
            lines.append(f"{pad}o{k}{idx} = v{j}")
    return "\n".join(lines) + "\n", recipes


# Note [fp16 values stay fp32]
# Plain eager rounds every fp16 result to fp16 and the next op widens it back. A fused kernel
# does the same rounding in one step on the fp32 value (numerics.round_to_f16, equal to the
# round trip for every input) and encodes fp16 bits only where a result is stored: the same
# values, and LLVM compiles a chain of such ops 2-3x faster than the bit round trips.


def kernel_for(spec, label: str, make_source=None):
    """(kernel, compiled_now) for `spec`, its source made by `make_source(spec) -> (src,
    recipes)` (default `source`; specs of different generators must differ); FAILED if it
    did not compile before. A new kernel comes from the disk cache when it can (Numba then
    loads its machine code at the first call instead of compiling), else from memory."""
    kernel = _kernels.get(spec)
    if kernel is not None:
        return kernel, False
    src, recipes = (make_source or source)(spec)
    kernel = None
    folder = diskcache.folder()
    if folder is not None:
        kernel, written = diskcache.load(folder, src, recipes, label)
        stats["disk_writes"] += written
        stats["disk_fallbacks"] += kernel is None
    if kernel is None:
        namespace = {name: elementwise.resolve(recipe) for name, recipe in recipes.items()}
        kernel = kernelgen.jit_source(src, namespace, f"fused {label}")
    _kernels[spec], _labels[spec] = kernel, label
    return kernel, True


def first_call(spec, kernel, args) -> float | None:
    """Run a new kernel once (Numba compiles it now, or loads it from the disk cache: counted
    in `stats`). Returns the seconds it took, or None if it failed to compile: then it is
    marked FAILED and a warning names it once."""
    hits, misses = _cache_counts(kernel)
    t0 = time.perf_counter()
    try:
        kernel(*args)
    except Exception as e:  # noqa: BLE001  (any Numba typing/lowering error)
        _kernels[spec] = FAILED
        label = _labels.get(spec, "?")
        if label not in _warned:
            _warned.add(label)
            warnings.warn(f"adaptive eager: the fused kernel {label} did not compile; its ops "
                          f"run one by one ({type(e).__name__}: {str(e).splitlines()[0]})",
                          RuntimeWarning, stacklevel=2)
        return None
    seconds = time.perf_counter() - t0
    now_hits, now_misses = _cache_counts(kernel)
    stats["disk_hits"] += now_hits > hits  # machine code loaded from the disk cache
    stats["compiles"] += now_misses > misses
    return seconds


def _cache_counts(kernel) -> tuple[int, int]:
    """Numba's counts of signatures loaded from its cache and compiled, for a dispatcher."""
    s = getattr(kernel, "py_kernel", kernel).stats  # (py_kernel: under numerics.with_noise)
    return sum(s.cache_hits.values()), sum(s.cache_misses.values())


def cache_size() -> int:
    return sum(1 for k in _kernels.values() if k is not FAILED)
