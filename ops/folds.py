"""Folds: prod, any/all, count_nonzero, logsumexp and vector norms, as row kernels on the
Vector engine (the rows and kernel templates of reduction.py, Note [Kernel templates])."""
from __future__ import annotations

import numba
import numpy as np
import torch

from neuron_eager.device_sim import config, core
from neuron_eager.ops import numerics
from neuron_eager.ops import reduction as R
from neuron_eager.ops import tensor as T
from neuron_eager.ops.fastmath import exp_f32, log_f32
from neuron_eager.ops.jit import njit, pointer_to
from neuron_eager.ops.meta import in_cpu_words
from neuron_eager.ops.numerics import SUM_LANES, lane_sum, row_extreme
from neuron_eager.ops.reduction import cast, load, stage, store  # template placeholders
from neuron_eager.ops.registry import register

aten = torch.ops.aten


# -- kernels ---------------------------------------------------------------------------------
def lane_norm_kernel(src, base, starts, steps, stride, n, out, mode, p):
    """Float 1- and 2-norms: |v| or v * v staged per row, then a lane sum (Note [Sum order])
    and, for the 2-norm, its square root."""
    terms = np.empty(n, np.float32)
    lanes = np.empty(SUM_LANES, np.float32)
    squares = mode == NORM_2
    for r in range(starts.size):
        s0 = np.uint64(base + starts[r])
        stage(terms, src, s0, steps, stride, n)
        if squares:
            for i in range(n):
                terms[i] *= terms[i]
        else:
            for i in range(n):
                terms[i] = abs(terms[i])
        total = lane_sum(terms, n, lanes)
        out[r] = store(np.sqrt(total) if squares else total)


def logsumexp_kernel(src, base, starts, steps, stride, n, out):
    """Shifted by the row max, as torch.logsumexp (an infinite max shifts by 0): the row
    staged in fp32, the engines' exp and log (ops/fastmath.py: NumPy's are libm calls, one
    element at a time), a lane sum (Note [Sum order])."""
    row = np.empty(n, np.float32)
    lanes = np.empty(SUM_LANES, np.float32)
    for r in range(starts.size):
        s0 = np.uint64(base + starts[r])
        stage(row, src, s0, steps, stride, n)
        m = row_extreme(row, n, True)
        if m == np.inf or m == -np.inf:
            m = np.float32(0)
        for i in range(n):
            row[i] = exp_f32(row[i] - m)
        out[r] = store(log_f32(lane_sum(row, n, lanes)) + m)


# fold modes: the reductions that are not hot share one kernel with a mode switch (float 1-
# and 2-norms, which are, run as lane norms)
PROD, NORM_P, NORM_1, NORM_2, NORM_INF, NORM_NEG_INF = range(6)


def fold_kernel(src, base, starts, steps, stride, n, out, mode, p):
    """One step per element by `mode`; p-norm sums in blocks of reduction.BLOCK."""
    gathered = steps.size > 0
    additive = mode == NORM_P
    for r in range(starts.size):
        s0 = base + starts[r]
        total = cast(0)
        acc = cast(1) if mode == PROD else cast(0)
        if mode == NORM_NEG_INF:
            acc = cast(np.inf)
        for i in range(n):
            v = load(src[s0 + (steps[i] if gathered else i * stride)])
            if mode == PROD:
                acc *= v
            elif mode == NORM_P and p == 0:
                acc += cast(1) if v != 0 else cast(0)
            elif mode == NORM_P:
                acc += cast(np.float32(abs(v)) ** np.float32(p))
            elif v != v:  # inf norms propagate NaN
                acc = v
                break
            elif mode == NORM_INF:
                acc = max(acc, abs(v))
            else:
                acc = min(acc, abs(v))
            if additive and (i + 1) % R.BLOCK == 0:
                total += acc
                acc = cast(0)
        if additive:
            acc += total
        if mode == NORM_P and p != 0:
            acc = cast(np.float32(acc) ** (np.float32(1) / np.float32(p)))
        out[r] = store(acc)


ANY, ALL, COUNT = range(3)


@njit(**R.JIT)
def truth_kernel(src, base, starts, steps, stride, n, out, mode, mask):
    """any/all/count_nonzero on raw stored bits, one kernel per element width: a value is
    true when its bits, less a float's sign bit (`mask`), are not all zero (NaN is true)."""
    gathered = steps.size > 0
    for r in range(starts.size):
        s0 = base + starts[r]
        hits = 0
        for i in range(n):
            if src[s0 + (steps[i] if gathered else i * stride)] & mask:
                hits += 1
                if mode == ANY:
                    break
            elif mode == ALL:
                break
        if mode == COUNT:
            out[r] = hits
        elif mode == ANY:
            out[r] = hits > 0
        else:
            out[r] = hits == n


R.FAMILIES.update(lane_norm=lane_norm_kernel, logsumexp=logsumexp_kernel, fold=fold_kernel)


# -- ops ------------------------------------------------------------------------------------
def fold(op, x, dims, keepdim, mode, out_dtype, p=0.0):
    compute = "f32" if out_dtype.is_floating_point else "int"
    out = T.empty(R.out_shape(x, dims, keepdim), out_dtype)
    family = "lane_norm" if compute == "f32" and mode in (NORM_1, NORM_2) else "fold"
    R.launch(R.kernel(family, x.dtype, out_dtype, compute, op, exact=True), x, dims, [out], mode,
             numerics.SCALAR_CAST[compute](p))
    if out_dtype == torch.int64:
        numerics.wrap_int64(out._nd, "prod" if mode == PROD else "reduction")
    return out


def _prod(op, x, dim, keepdim, dtype):
    dims = R.wrap_dims(x, dim)
    if x.numel() == 0:
        return R.on_empty(op, x, *([] if dim is None else [dim, keepdim]), dtype=dtype)
    x, out_dtype = R.accumulated(x, dtype)
    return fold(op, x, dims, keepdim, PROD, out_dtype)


@register(aten.prod.default)
def prod(x, *, dtype=None):
    return _prod(aten.prod.default, x, None, False, dtype)


@register(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, *, dtype=None):
    return _prod(aten.prod.dim_int, x, dim, keepdim, dtype)


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def truth(op, x, dims, keepdim, mode, out_dtype):
    """any/all (bool, or uint8 for uint8 input) or count_nonzero (int64) over `dims`."""
    R.code(x.dtype, op)
    out = T.empty(R.out_shape(x, dims, keepdim), out_dtype)
    bits = x.element_size() * 8
    unsigned = _UNSIGNED[x.element_size()]
    mask = unsigned((1 << (bits - 1)) - 1 if x.dtype.is_floating_point else (1 << bits) - 1)
    result = out._nd.reshape(-1)
    if out_dtype != torch.int64:
        result = result.view(np.uint8)
    r = R.rows(x, dims)
    truth_kernel(R.flat(x).view(unsigned), x.storage_offset(), r.starts, r.steps, r.stride, r.n,
                 result, mode, mask)
    core.launch("vector", x.numel(), x._nd.nbytes + result.nbytes)
    return out


def _truth(op, x, dim, keepdim, mode):
    dims = R.wrap_dims(x, dim, empty_means_all=False)
    out_dtype = torch.uint8 if x.dtype == torch.uint8 else torch.bool
    if x.numel() == 0:
        return R.on_empty(op, x, *([] if op in R.ALL_DIMS else [dim, keepdim]))
    return truth(op, x, dims, keepdim, mode, out_dtype)


def _register_truth(packet, mode, *aliases):
    """any or all: over everything (and `aliases`, e.g. _is_any_true), over one dim or dims."""
    register(packet.default, *aliases)(lambda x: _truth(packet.default, x, None, False, mode))

    @register(packet.dim, packet.dims)
    def by_dims(x, dim=None, keepdim=False):
        op = packet.dim if isinstance(dim, int) else packet.dims
        return _truth(op, x, dim, keepdim, mode)


_register_truth(aten.any, ANY, aten._is_any_true.default)
_register_truth(aten.all, ALL)


@register(aten._is_all_true.default)
def is_all_true(x):
    return _truth(aten.all.default, x, None, False, ALL)


@register(aten.count_nonzero.dim_IntList, aten.count_nonzero.default)
def count_nonzero(x, dim=None):
    op = aten.count_nonzero.dim_IntList if isinstance(dim, (list, tuple)) \
        else aten.count_nonzero.default
    dims = R.wrap_dims(x, dim)
    if x.numel() == 0:
        return R.on_empty(op, x, dim)
    return truth(op, x, dims, False, COUNT, torch.int64)


@register(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    if isinstance(dim, (list, tuple)) and len(dim) == 0 and x.numel() and not keepdim \
            and x.dim():
        # CPU reduces all dims, then fails to write the [1, ..] result into a 0-dim output
        raise RuntimeError(f"output with shape [] doesn't match the broadcast shape "
                           f"{[1] * x.dim()}")
    dims = R.wrap_dims(x, dim)
    out_dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    if x.numel() == 0:
        return R.on_empty(aten.logsumexp.default, x, dim, keepdim)
    out = T.empty(R.out_shape(x, dims, keepdim), out_dtype)
    R.launch(R.kernel("logsumexp", x.dtype, out_dtype, "f32", aten.logsumexp.default), x, dims,
             [out])
    return out


def _norm_mode(ord) -> int:
    ord = float(ord)
    return {2.0: NORM_2, 1.0: NORM_1, float("inf"): NORM_INF,
            float("-inf"): NORM_NEG_INF}.get(ord, NORM_P)


@register(aten.linalg_vector_norm.default)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    op = aten.linalg_vector_norm.default
    if not x.dtype.is_floating_point or dtype is not None and (
            not dtype.is_floating_point or torch.promote_types(x.dtype, dtype) != dtype):
        in_cpu_words(op, (x, ord, dim, keepdim), {"dtype": dtype})  # (its checks, its words)
        if not x.dtype.is_floating_point:
            raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex "
                               f"tensor as input. Got {T.dtype_name(x.dtype)}")
        raise RuntimeError(f"linalg.vector_norm: the dtype of the input ({T.dtype_name(x.dtype)}) "
                           f"should be convertible without narrowing to the specified dtype "
                           f"({T.dtype_name(dtype)})")
    dims = R.wrap_dims(x, dim)
    if x.numel() == 0:
        return R.on_empty(op, x, ord, dim, keepdim, dtype=dtype)
    return fold(op, x, dims, keepdim, _norm_mode(ord), dtype or x.dtype, float(ord))


def norms_of(tensors, ord) -> list | None:
    """The whole-tensor 1- or 2-norm of each tensor (_foreach_norm), as one launch over an
    address table (Note [Address tables] in multitensor.py) running each tensor through the
    per-tensor kernel, so with its bits; None where the per-tensor path must decide: another
    norm, an empty or strided tensor, formats that differ, stochastic rounding."""
    mode, dtype = _norm_mode(ord), tensors[0].dtype
    if mode not in (NORM_1, NORM_2) or len(tensors) < 2 or not dtype.is_floating_point or (
            config.stochastic_rounding and dtype in (torch.bfloat16, torch.float16)):
        return None
    for t in tensors:
        key = t.__dict__.get("_key") if type(t) is T.NeuronTensor else None
        if key is None or key[1] != dtype or not t.numel():
            return None
    kernel = _norm_tables.get(dtype)
    if kernel is None:
        row = R.kernel("lane_norm", dtype, dtype, "f32", aten.linalg_vector_norm.default, True)
        kernel = _norm_tables[dtype] = _norm_table(row, pointer_to(T.STORAGE_DTYPE[dtype].name))
    outs = [T.new_contiguous((), dtype) for _ in tensors]
    table = np.array([[o._key[2] for o in outs], [t._key[2] for t in tensors]], np.int64)
    sizes = np.array([t.numel() for t in tensors], np.int64)
    kernel(table, sizes, mode, np.float32(ord))
    elements = int(sizes.sum())
    core.launch("vector", elements, elements * tensors[0].element_size() + len(outs) * 4)
    return outs


_norm_tables: dict = {}


def _norm_table(row, at):
    @njit(**R.JIT)
    def kernel(table, sizes, mode, p):
        starts, steps = np.zeros(1, np.int64), np.empty(0, np.int64)
        for t in range(sizes.shape[0]):
            n = sizes[t]
            row(numba.carray(at(table[1, t]), n), 0, starts, steps, 1, n,
                numba.carray(at(table[0, t]), 1), mode, p)

    return kernel


@register(aten.norm.Scalar, aten.norm.ScalarOpt_dtype)
def norm(x, p=2, *, dtype=None):
    return linalg_vector_norm(x, 2 if p is None else p, None, False, dtype=dtype)


@register(aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype)
def norm_dim(x, p, dim, keepdim=False, *, dtype=None):
    return linalg_vector_norm(x, 2 if p is None else p, dim, keepdim, dtype=dtype)
