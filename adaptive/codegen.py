"""Fused kernels: Numba source for one group of recorded elementwise ops, and their cache.

A kernel is generated from fixed per-op templates with generated names (never from user
strings): each op loads its operands to its compute type, calls the op's jitted scalar
function and rounds the value to its output dtype (Note [Bit-identical fusion]), so the
fused loop computes exactly what the ops compute one by one. Kernels are cached in memory
by their structure, which leaves out shapes and scalar values (they are arguments).
"""
from __future__ import annotations

import time
import warnings

from neuron_eager.ops import kernelgen, numerics

# Note [Bit-identical fusion]
# Plain eager stores every op's result in its dtype and the next op loads it back. A fused
# kernel keeps the stored form in a local instead of HBM: `v = store(fn(load(a), ...))` and
# a consumer loads `v` with the loader plain eager would use on that tensor. Scalars are cast
# on the host to the op's compute type, as plain eager does. Nothing is rounded less or
# more often, so results are the same bits (the differential tests check it).

FAILED = object()  # a kernel that did not compile: its groups run op by op
_kernels: dict = {}
_warned: set = set()


def source(spec) -> tuple[str, dict]:
    """Kernel source and namespace for a group `spec`: (layout, nodes, stores, n_out, n_in,
    n_scalars). Each node is (op, operands, compute, out_code) with operands ("v", local
    node, load code), ("a", input array, load code), ("t", scalar arg, load code: a 0-dim
    tensor's stored value) or ("s", scalar arg: a host-cast Python scalar or parameter);
    `stores` lists (local node, output array)."""
    layout, nodes, stores, n_out, n_in, n_scalars = spec
    names = [f"o{k}" for k in range(n_out)] + [f"a{k}" for k in range(n_in)] + \
        [f"s{k}" for k in range(n_scalars)]
    namespace: dict = {}
    lines = [f"def kernel({', '.join(names)}):"]
    loop, idx, pad = kernelgen.loop_header(layout, "o0")
    lines += loop
    for k in range(n_in):
        lines.append(f"{pad}r{k} = a{k}{idx}")
    for j, (op, operands, compute, out_code) in enumerate(nodes):
        namespace[f"f{j}"] = op.fn
        namespace[f"st{j}"] = numerics.storer(out_code)
        values = []
        for i, (kind, ref, *code) in enumerate(operands):
            if kind == "s":
                values.append(f"s{ref}")
                continue
            namespace[f"l{j}_{i}"] = numerics.loader(code[0], compute)
            arg = {"v": "v", "a": "r", "t": "s"}[kind] + str(ref)
            values.append(f"l{j}_{i}({arg})")
        lines.append(f"{pad}v{j} = st{j}(f{j}({', '.join(values)}))")
    for j, k in stores:
        lines.append(f"{pad}o{k}{idx} = v{j}")
    return "\n".join(lines) + "\n", namespace


def kernel_for(spec, label: str):
    """(kernel, compiled_now) for `spec`; FAILED if it did not compile before."""
    kernel = _kernels.get(spec)
    if kernel is not None:
        return kernel, False
    src, namespace = source(spec)
    kernel = _kernels[spec] = kernelgen.jit_source(src, namespace, f"fused {label}")
    return kernel, True


def first_call(spec, kernel, args) -> float | None:
    """Run a new kernel once (Numba compiles it now). Returns the seconds it took, or None
    if it failed to compile: then it is marked FAILED and a warning names it once."""
    t0 = time.perf_counter()
    try:
        kernel(*args)
    except Exception as e:  # noqa: BLE001  (any Numba typing/lowering error)
        _kernels[spec] = FAILED
        label = "+".join(node[0].name for node in spec[1])
        if label not in _warned:
            _warned.add(label)
            warnings.warn(f"adaptive eager: the fused kernel {label} did not compile; its ops "
                          f"run one by one ({type(e).__name__}: {str(e).splitlines()[0]})",
                          RuntimeWarning, stacklevel=2)
        return None
    return time.perf_counter() - t0


def cache_size() -> int:
    return sum(1 for k in _kernels.values() if k is not FAILED)
