"""Elementwise kernel generation: per-op scalar functions -> jitted loops.

A kernel is built from a fixed template (never from user strings) for one
combination of op, operand kinds (array or scalar), storage formats, compute
type and layout, then cached. Layout 'c' loops over flat contiguous arrays;
layout 'b' over the rows of a contiguous 2-D result whose operands are whole
arrays or vectors repeated along rows or columns (Note [Broadcast rows]);
layout 's' over 4-D strided views (broadcast dims have stride 0), so any
broadcasting and transposed inputs need no copies.
"""
from __future__ import annotations

import linecache
from itertools import count

import numpy as np
import numba
from numba import njit

from neuron_eager.ops import _compat, diskcache, jit, numerics

JIT_OPTIONS = dict(error_model="numpy", nogil=True)


_compat.prefer_512_bit_vectors()  # Note [512-bit vectors] in _compat.py
_kernels: dict = {}
_ids = count()
stats = {"compiled": 0, "hits": 0}


def loop_header(layout: str, out: str) -> tuple[list[str], str, str]:
    """The loop lines over array `out` for a layout ('c': flat, 'b': broadcast rows, 's': 4-D
    strided), the element index expression (of a whole array) and the body's indentation."""
    if layout == "c":
        return [f"    for i in range({out}.shape[0]):"], "[i]", " " * 8
    if layout == "b":
        return [f"    for r in range({out}.shape[0]):",
                f"        for c in range({out}.shape[1]):"], "[r, c]", " " * 12
    lines = [f"    d0, d1, d2, d3 = {out}.shape"]
    lines += [" " * (4 + 4 * k) + f"for i{k} in range(d{k}):" for k in range(4)]
    return lines, "[i0, i1, i2, i3]", " " * 20


# Note [Broadcast rows]
# Numba compiles an array argument for its layout: a contiguous one ('C') is walked with a
# known unit stride and the loop vectorizes; a strided view ('A', as every 4-D view of the
# 's' layout is) is not. A bias add `x * w + b` ((1024, 1024) by (1024,)) ran 3.4x slower
# in the 's' layout than the same loop over a contiguous result, a row vector and a column
# vector passed as such: 0.30 against 0.09 ms. So a result that coalesces to contiguous rows
# gets layout 'b' when each array operand is whole ("a"), one value per column repeated down
# the rows ("col": passed as its 1-D vector) or one value per row ("row": a (rows, 1) array).


def broadcast_kinds(shape, strides_list) -> tuple | None:
    """The kinds of layout 'b' for a coalesced `shape` and its strides (in elements, the
    output's first): one per array, or None if the layout does not fit."""
    if len(shape) != 2:
        return None
    rows, cols = shape
    kinds = []
    for row_stride, col_stride in strides_list:
        if (row_stride, col_stride) == (cols, 1):
            kinds.append("a")
        elif (row_stride, col_stride) == (0, 1):
            kinds.append("col")
        elif (row_stride, col_stride) == (1, 0):
            kinds.append("row")
        else:
            return None
    return tuple(kinds) if kinds[0] == "a" else None


# (shape, strides) in elements of an array of each kind of layout 'b', for (rows, cols)
BROADCAST_VIEWS = {"a": lambda rows, cols: ((rows, cols), (cols, 1)),
                   "col": lambda rows, cols: ((cols,), (1,)),
                   "row": lambda rows, cols: ((rows, 1), (1, 1))}


def index(layout: str, kind: str = "a") -> str:
    """The element index expression of an array of `kind` in the loops of `layout`."""
    if layout == "b":
        return {"a": "[r, c]", "o": "[r, c]", "col": "[c]", "row": "[r, 0]"}[kind]
    return loop_header(layout, "out")[1]


def _source(arity: int, nparams: int, kinds: tuple, layout: str, stochastic: bool) -> str:
    # kinds: "s" a scalar, "o" the output array itself (Note [In-place loops]), else an array:
    # "a", or under layout 'b' "col"/"row" (Note [Broadcast rows])
    args = ["out"] + [f"a{i}" for i in range(arity) if kinds[i] != "o"] + \
        [f"p{j}" for j in range(nparams)]
    lines = [f"def kernel({', '.join(args)}):"]
    for i, kind in enumerate(kinds):
        if kind == "s":
            lines.append(f"    v{i} = load{i}(a{i})")
    loop, idx, pad = loop_header(layout, "out")
    lines += loop
    values = [f"v{i}" if kind == "s" else f"load{i}(out{idx})" if kind == "o"
              else f"load{i}(a{i}{index(layout, kind)})" for i, kind in enumerate(kinds)]
    call = f"fn({', '.join(values + [f'p{j}' for j in range(nparams)])})"
    if stochastic:
        lines.append(f"{pad}out{idx} = store({call}, np.random.randint(0, 4294967296))")
    else:
        lines.append(f"{pad}out{idx} = store({call})")
    return "\n".join(lines) + "\n"


# Note [In-place loops]
# An in-place op reads the array it writes. Passed as two arguments, the loop's input and
# output are different pointers to LLVM, which vectorises only after a run-time check that
# their ranges do not overlap; they do, so the scalar loop runs: 2-8x slower (a 256K-element
# x.mul_(y): 222 us against 93 us for x * y). Read through the output argument itself, the
# element i that is read is the element i that is written, and the loop vectorises.


def _table_source(nparams: int, kinds: tuple) -> str:
    # kinds as in _source, layout 'c', and "z": the address of a 0-dim tensor read once. Table
    # column t holds the addresses of tensor t's output (row 0) and of its array operands;
    # sizes[t] its element count
    arrays = [i for i, kind in enumerate(kinds) if kind == "a"]
    args = ["table", "sizes"] + [f"a{i}" for i, kind in enumerate(kinds) if kind in "sz"] + \
        [f"p{j}" for j in range(nparams)]
    lines = [f"def kernel({', '.join(args)}):"]
    lines += [f"    v{i} = load{i}(a{i})" if kind == "s" else
              f"    v{i} = load{i}(numba.carray(at{i}(a{i}), 1)[0])"
              for i, kind in enumerate(kinds) if kind in "sz"]
    lines += ["    for t in range(sizes.shape[0]):",
              "        n = sizes[t]",
              "        out = numba.carray(at_out(table[0, t]), n)"]
    lines += [f"        x{i} = numba.carray(at{i}(table[{c + 1}, t]), n)"
              for c, i in enumerate(arrays)]
    values = [f"v{i}" if kind in "sz" else f"load{i}(out[i])" if kind == "o"
              else f"load{i}(x{i}[i])" for i, kind in enumerate(kinds)]
    call = f"fn({', '.join(values + [f'p{j}' for j in range(nparams)])})"
    lines += ["        for i in range(n):", f"            out[i] = store({call})"]
    return "\n".join(lines) + "\n"


def jit_source(src: str, namespace: dict, label: str):
    """Compile generated source (from a fixed template) into a jitted function `kernel`.

    The source is registered with linecache so tracebacks and pdb can show it.
    """
    filename = f"<neuron-kernel {label} #{next(_ids)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace = dict(namespace, np=np, numba=numba, JIT_OPTIONS=JIT_OPTIONS)
    exec(compile(src, filename, "exec"), namespace)
    stats["compiled"] += 1
    return njit(**JIT_OPTIONS)(namespace["kernel"])


def elementwise_kernel(name: str, fn, nparams: int, kinds: tuple, codes: tuple, compute: str,
                       out_code: str, layout: str, stochastic: bool):
    """The cached jitted loop for one op/format/layout combination."""
    key = (name, nparams, kinds, codes, compute, out_code, layout, stochastic)
    kernel = _kernels.get(key)
    if kernel is not None:
        stats["hits"] += 1
        return kernel
    recipes = {"store": ("storer", out_code, stochastic)}
    recipes.update({f"load{i}": ("loader", code, compute) for i, code in enumerate(codes)})
    kernel = _compile(_source(len(kinds), nparams, kinds, layout, stochastic), recipes, name, fn)
    if stochastic:
        kernel = numerics.with_noise(kernel)
    _kernels[key] = kernel
    return kernel


def table_kernel(name: str, fn, nparams: int, kinds: tuple, codes: tuple, compute: str,
                 out_code: str, storage: tuple):
    """The cached multi-tensor loop of one op/format combination: contiguous tensors read
    from a table of addresses, one column per tensor (Note [Address tables] in
    multitensor.py).
    `storage` names the NumPy dtype of the output's memory, then of each operand's."""
    key = ("table", name, nparams, kinds, codes, compute, out_code, storage)
    kernel = _kernels.get(key)
    if kernel is not None:
        stats["hits"] += 1
        return kernel
    recipes = {"store": ("storer", out_code, False), "at_out": ("pointer", storage[0])}
    for i, (kind, code) in enumerate(zip(kinds, codes)):
        recipes[f"load{i}"] = ("loader", code, compute)
        if kind in ("a", "z"):
            recipes[f"at{i}"] = ("pointer", storage[i + 1])
    kernel = _kernels[key] = _compile(_table_source(nparams, kinds), recipes, name, fn)
    return kernel


def _compile(src: str, recipes: dict, name: str, fn):
    """Generated kernel source with the scalar function `fn` and the helpers `recipes` names:
    from the disk cache when `fn` is the op named `name`, else compiled in memory."""
    kernel = None
    folder = jit.plain_folder()
    if folder is not None and getattr(fn, "py_func", fn) is _named_fn(name):
        kernel, _ = diskcache.load(folder, src, dict(recipes, fn=("op", name)), name)
    if kernel is None:
        namespace = {"fn": fn}
        for local, (kind, *args) in recipes.items():
            namespace[local] = numerics.loader(*args) if kind == "loader" else \
                numerics.storer(*args) if kind == "storer" else jit.pointer_to(*args)
        kernel = jit_source(src, namespace, name)
    jit.track(kernel)  # (in kernel_cache_stats)
    return kernel


def _named_fn(name: str):
    """The scalar function a generated kernel file gets for op `name` (Note [Ops by name])."""
    from neuron_eager.ops.elementwise import OPS_BY_NAME  # (elementwise imports this module)

    op = OPS_BY_NAME.get(name)
    return None if op is None else getattr(op.fn, "py_func", op.fn)


def strided_4d(shape, strides) -> tuple[tuple, tuple]:
    """The 4-D form of a coalesced loop for layout 's': size-1 dims go after the outermost
    dim, so that slicing dim 0 splits a loop of two or more dims over the cores (Note
    [Strided loops in slices])."""
    pad = 4 - len(shape)
    if len(shape) == 1:
        return (1,) * pad + tuple(shape), (0,) * pad + tuple(strides)
    return (shape[0], *(1,) * pad, *shape[1:]), (strides[0], *(0,) * pad, *strides[1:])


# Note [Strided loops in slices]
# A loop over a transposed or sliced tensor runs in layout 's' (4 nested loops over strided
# views). Its dims keep their order with the padding placed after the outermost one, so
# workers.split_call can cut dim 0 into one slice per core as it cuts contiguous loops: a
# (1024, 1024) `x.t() * y` ran on one core before.


def coalesce(shape, strides_list):
    """Drop size-1 dims and merge dims that are contiguous in every operand.

    `strides_list` holds one stride tuple (in elements) per operand, all for `shape`.
    Returns the new shape and strides, at least one dim.
    """
    dims = [i for i, n in enumerate(shape) if n != 1]
    new_shape = [shape[i] for i in dims]
    new_strides = [[s[i] for i in dims] for s in strides_list]
    k = len(new_shape) - 1
    while k > 0:
        if all(st[k - 1] == st[k] * new_shape[k] for st in new_strides):
            new_shape[k - 1] *= new_shape[k]
            del new_shape[k]
            for st in new_strides:
                st[k - 1] = st[k]
                del st[k]
        k -= 1
    if not new_shape:
        return [1], [[0] for _ in strides_list]
    return new_shape, new_strides
