"""Linear solvers and what is built on them: triangular, LU, Cholesky and LDL solves, inverse,
determinants, least squares, pseudo-inverse, the matrix exponential and cdist/pdist.

LAPACK/BLAS routines are those torch's CPU backend calls (trsm, getrs, potrs, sytrs, gels*),
called from Numba loops over the batch as in linalg.py; fp32 throughout, float64 stored back.
Where torch factors A^T for a contiguous A (det, slogdet) so do we: the LU and pivots
returned feed torch's own backward formulas, which assume that choice.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit
from neuron_eager.ops.linalg import (I32, JIT, F32, at, batch3, check_errors_kernel, check_float,
                                     finish, from_f, launch, lu_factor, new, to_f, view3,
                                     _binding)
from neuron_eager.ops.meta import in_cpu_words, meta_run
from neuron_eager.ops.registry import register

aten = torch.ops.aten
strsm = _binding("strsm", 11, "blas")
sgetrs = _binding("sgetrs", 9)
spotrs = _binding("spotrs", 8)
ssytrs = _binding("ssytrs", 9)
sgels = _binding("sgels", 11)
sgelsy = _binding("sgelsy", 13)
sgelsd = _binding("sgelsd", 14)
sgelss = _binding("sgelss", 13)


def _expand(x, batch, dtype=F32):
    """`x` widened to fp32 and broadcast to `batch` leading dimensions, contiguous."""
    return x.to(dtype).expand(tuple(batch) + tuple(x.shape[-2:])).contiguous()


def _batch_of(*xs):
    return torch.broadcast_shapes(*(x.shape[:-2] for x in xs))


# -- triangular solves ------------------------------------------------------------------------
@njit(**JIT)
def trsm_kernel(a, bm, out, left, upper, trans, unit):
    nb, r, c = bm.shape
    n = a.shape[1]
    wa = np.empty(max(n * n, 1), np.float32)
    wb = np.empty(max(r * c, 1), np.float32)
    alpha = np.ones(1, np.float32)
    iv = np.zeros(8, I32)
    iv[0] = 76 if left else 82
    iv[1] = 85 if upper else 76
    iv[2] = 84 if trans else 78
    iv[3] = 85 if unit else 78
    iv[4] = r
    iv[5] = c
    iv[6] = max(n, 1)
    iv[7] = max(r, 1)
    for b in range(nb):
        to_f(a[b], wa, n)
        to_f(bm[b], wb, r)
        strsm(at(iv, 0), at(iv, 1), at(iv, 2), at(iv, 3), at(iv, 4), at(iv, 5),
              alpha.ctypes.data, wa.ctypes.data, at(iv, 6), wb.ctypes.data, at(iv, 7))
        from_f(wb, r, out[b])
    return alpha[0] + iv[0] + wa[0]  # (keeps the buffers alive across the call)


def triangular(a, b, left, upper, trans, unit):
    batch = _batch_of(a, b)
    a_ = _expand(a, batch)
    b_ = _expand(b, batch)
    out = new(b_.shape)
    if out.numel():
        trsm_kernel(view3(a_), view3(b_), view3(out), left, upper, trans, unit)
    launch(out.numel() * a.shape[-1], 4 * (a_.numel() + 2 * out.numel()))
    return out, a_


@register(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    meta_run(aten.linalg_solve_triangular.default, a, b, upper=upper, left=left,
             unitriangular=unitriangular)
    check_float(a, aten.linalg_solve_triangular.default, a, b, upper=upper, left=left,
                unitriangular=unitriangular)
    out, _ = triangular(a, b, left, upper, False, unitriangular)
    return finish(out, a.dtype)


@register(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    meta_run(aten.triangular_solve.default, b, a, upper, transpose, unitriangular)
    check_float(a, aten.triangular_solve.default, b, a, upper, transpose, unitriangular)
    out, a_ = triangular(a, b, True, upper, transpose, unitriangular)
    return finish(out, a.dtype), finish(a_.clone() if a_ is a else a_, a.dtype)


# -- LU, Cholesky and LDL solves ----------------------------------------------------------------
@njit(**JIT)
def factored_solve_kernel(f, piv, bm, out, kind, flag):
    """kind 0: getrs (flag: transposed), 1: potrs (flag: upper), 2: sytrs (lower)."""
    nb, n, c = bm.shape
    wa = np.empty(max(n * n, 1), np.float32)
    wb = np.empty(max(n * c, 1), np.float32)
    ip = np.zeros(max(n, 1), I32)
    iv = np.zeros(6, I32)
    iv[1] = n
    iv[2] = c
    iv[3] = max(n, 1)
    for b in range(nb):
        to_f(f[b], wa, n)
        to_f(bm[b], wb, n)
        for i in range(n):
            ip[i] = piv[b, i] if kind != 1 else 0
        if kind == 0:
            iv[0] = 84 if flag else 78
            sgetrs(at(iv, 0), at(iv, 1), at(iv, 2), wa.ctypes.data, at(iv, 3), ip.ctypes.data,
                   wb.ctypes.data, at(iv, 3), at(iv, 4))
        elif kind == 1:
            iv[0] = 85 if flag else 76
            spotrs(at(iv, 0), at(iv, 1), at(iv, 2), wa.ctypes.data, at(iv, 3), wb.ctypes.data,
                   at(iv, 3), at(iv, 4))
        else:
            iv[0] = 76
            ssytrs(at(iv, 0), at(iv, 1), at(iv, 2), wa.ctypes.data, at(iv, 3), ip.ctypes.data,
                   wb.ctypes.data, at(iv, 3), at(iv, 4))
        from_f(wb, n, out[b])
    return iv[4] + wa[0] + ip[0]


def factored_solve(f, piv, b, kind, flag, left=True):
    """Solve with a factorization `f` (and pivots) of A: A X = B, or X A = B when not left."""
    if not left:  # X A = B  <=>  A^T X^T = B^T
        return factored_solve(f, piv, b.mT, kind, not flag, True).mT
    batch = _batch_of(f, b)
    f_ = _expand(f, batch)
    b_ = _expand(b, batch)
    n = f.shape[-1]
    nb = T.numel(batch)
    if piv is None:
        p3 = np.zeros((nb, n), I32)
    else:  # (the tensor must outlive the kernel: its HBM block is freed with it)
        piv_ = piv.expand(tuple(batch) + (n,)).contiguous()
        p3 = piv_._nd.reshape(nb, n)
    out = new(b_.shape)
    if out.numel():
        factored_solve_kernel(view3(f_), p3, view3(b_), view3(out), kind, flag)
    launch(out.numel() * n, 4 * (f_.numel() + 2 * out.numel()))
    return out


@register(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, piv, b, *, left=True, adjoint=False):
    meta_run(aten.linalg_lu_solve.default, lu, piv, b, left=left, adjoint=adjoint)
    check_float(lu, aten.linalg_lu_solve.default, lu, piv, b, left=left, adjoint=adjoint)
    return finish(factored_solve(lu, piv, b, 0, adjoint, left), lu.dtype)


@register(aten.cholesky_solve.default, aten._cholesky_solve_helper.default)
def cholesky_solve(b, l_, upper=False):
    meta_run(aten.cholesky_solve.default, b, l_, upper)
    check_float(l_, aten.cholesky_solve.default, b, l_, upper)
    return finish(factored_solve(l_, None, b, 1, upper), b.dtype)


@register(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(ld, piv, b, *, hermitian=False):
    meta_run(aten.linalg_ldl_solve.default, ld, piv, b, hermitian=hermitian)
    check_float(ld, aten.linalg_ldl_solve.default, ld, piv, b, hermitian=hermitian)
    return finish(factored_solve(ld, piv, b, 2, False), b.dtype)


# -- general solve, inverse, determinants ---------------------------------------------------------
def _is_vector_rhs(a, b) -> bool:
    return b.dim() == 1 or (a.dim() - 1 == b.dim() and b.shape == a.shape[:-1])


@register(aten._linalg_solve_ex.default)
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    meta_run(aten._linalg_solve_ex.default, a, b, left=left)
    check_float(a, aten._linalg_solve_ex.default, a, b, left=left)
    lu, piv, info = lu_factor(a)  # (unlike det, torch 2.13 factors A itself here)
    if check_errors:
        check_errors_kernel(info, "torch.linalg.solve_ex", is_matrix=a.dim() == 2)
    vector = _is_vector_rhs(a, b)
    out = factored_solve(lu, piv, b.unsqueeze(-1) if vector else b, 0, False, left)
    if vector:
        out = out.squeeze(-1)
    return finish(out, a.dtype), finish(lu, a.dtype), piv, info


@register(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    meta_run(aten.linalg_inv_ex.default, a)
    if a.dtype in (torch.bfloat16, torch.float16):
        raise RuntimeError(f"linalg.inv: Low precision dtypes not supported. Got "
                           f"{T.dtype_name(a.dtype)}")
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    out, _, _, info = linalg_solve_ex(a, eye.expand(a.shape))
    if check_errors:
        check_errors_kernel(info, "linalg.inv_ex", is_matrix=a.dim() == 2)
    return out, info


@njit(**JIT)
def det_kernel(lu, piv, det, sign, logabs):
    """det = sign(P) prod(diag U); slogdet as torch: sign(P) prod(sign u), sum(log |u|)."""
    nb, n, _ = lu.shape
    for b in range(nb):
        p = np.float32(1)
        for i in range(n):
            if piv[b, i] != i + 1:
                p = -p
        d = np.float32(1)
        s = p
        acc = np.float32(0)
        for i in range(n):
            u = lu[b, i, i]
            d *= u
            s *= np.float32(1) if u > 0 else (np.float32(-1) if u < 0 else np.float32(0))
            acc += np.log(np.abs(u))
        det[b] = p * d
        sign[b] = s
        logabs[b] = acc


def _det_parts(a):
    lu, piv, _ = lu_factor(a.mT if a.is_contiguous() else a)
    batch, n = a.shape[:-2], a.shape[-1]
    nb = T.numel(batch)
    det, sign, logabs = new(batch), new(batch), new(batch)
    det_kernel(view3(lu), piv._nd.reshape(nb, n), det._nd.reshape(-1), sign._nd.reshape(-1),
               logabs._nd.reshape(-1))
    launch(a.numel(), 4 * a.numel())
    return det, sign, logabs, lu, piv


@register(aten._linalg_det.default)
def linalg_det(a):
    meta_run(aten._linalg_det.default, a)
    check_float(a, aten._linalg_det.default, a)
    det, _, _, lu, piv = _det_parts(a)
    return finish(det, a.dtype), finish(lu, a.dtype), piv


@register(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    meta_run(aten._linalg_slogdet.default, a)
    check_float(a, aten._linalg_slogdet.default, a)
    _, sign, logabs, lu, piv = _det_parts(a)
    return finish(sign, a.dtype), finish(logabs, a.dtype), finish(lu, a.dtype), piv


# -- least squares ---------------------------------------------------------------------------------
_DRIVERS = {"gels": 0, "gelsy": 1, "gelsd": 2, "gelss": 3}


@njit(**JIT)
def lstsq_kernel(a, bm, sol, rank, sv, resid, driver, rcond, info):
    nb, m, n = a.shape
    c = bm.shape[2]
    k = min(m, n)
    ldb = max(m, n, 1)
    wa = np.empty(max(m * n, 1), np.float32)
    wb = np.zeros(ldb * max(c, 1), np.float32)
    s = np.empty(max(k, 1), np.float32)
    jpvt = np.zeros(max(n, 1), I32)
    iwork = np.empty(max(1, 3 * k * 12 + 11 * k), I32)
    rc = np.full(1, rcond, np.float32)
    work = np.empty(1, np.float32)
    iv = np.zeros(10, I32)
    iv[0] = 78
    iv[1] = m
    iv[2] = n
    iv[3] = c
    iv[4] = max(m, 1)
    iv[5] = ldb
    for b in range(nb):
        to_f(a[b], wa, m)
        to_f(bm[b], wb, ldb)
        iv[6] = -1
        for _ in range(2):
            if driver == 0:
                sgels(at(iv, 0), at(iv, 1), at(iv, 2), at(iv, 3), wa.ctypes.data, at(iv, 4),
                      wb.ctypes.data, at(iv, 5), work.ctypes.data, at(iv, 6), at(iv, 7))
            elif driver == 1:
                for i in range(n):
                    jpvt[i] = 0
                sgelsy(at(iv, 1), at(iv, 2), at(iv, 3), wa.ctypes.data, at(iv, 4),
                       wb.ctypes.data, at(iv, 5), jpvt.ctypes.data, rc.ctypes.data, at(iv, 8),
                       work.ctypes.data, at(iv, 6), at(iv, 7))
            elif driver == 2:
                sgelsd(at(iv, 1), at(iv, 2), at(iv, 3), wa.ctypes.data, at(iv, 4),
                       wb.ctypes.data, at(iv, 5), s.ctypes.data, rc.ctypes.data, at(iv, 8),
                       work.ctypes.data, at(iv, 6), iwork.ctypes.data, at(iv, 7))
            else:
                sgelss(at(iv, 1), at(iv, 2), at(iv, 3), wa.ctypes.data, at(iv, 4),
                       wb.ctypes.data, at(iv, 5), s.ctypes.data, rc.ctypes.data, at(iv, 8),
                       work.ctypes.data, at(iv, 6), at(iv, 7))
            if iv[6] != -1:
                break
            work = np.empty(max(int(work[0]), 1), np.float32)
            iv[6] = work.size
        info[b] = iv[7]
        rank[b] = iv[8]
        for i in range(n):
            for j in range(c):
                sol[b, i, j] = wb[j * ldb + i]
        for i in range(sv.shape[1]):
            sv[b, i] = s[i]
        for j in range(resid.shape[1]):
            acc = np.float32(0)
            for i in range(n, m):
                v = wb[j * ldb + i]
                acc += v * v
            resid[b, j] = acc
    return rc[0] + wa[0] + jpvt[0] + iwork[0]


def _lstsq_checked(a, b, rcond, driver):
    """(b is a vector right-hand side, the batch shape), after the CPU's checks: a call the
    quick test doubts runs on CPU stand-ins, whose error is raised (linalg_lstsq has no meta
    kernel)."""
    vector = _is_vector_rhs(a, b)
    try:
        if a.dtype in (F32, torch.float64) and b.dtype == a.dtype and driver in _DRIVERS \
                and 2 <= a.dim() == b.dim() + vector \
                and b.shape[-1 - (not vector)] == a.shape[-2]:
            return vector, _batch_of(a, b.unsqueeze(-1) if vector else b)
    except RuntimeError:  # (batch shapes that do not broadcast)
        pass
    in_cpu_words(aten.linalg_lstsq.default, (a, b, rcond), {"driver": driver})
    check_float(a, aten.linalg_lstsq.default, a, b, rcond, driver=driver)
    raise RuntimeError("torch.linalg.lstsq: unsupported arguments")  # (the CPU refuses them)


def _of_batch(x, batch, a_batch, tail: int):
    """`x` (batch + `tail` dims) narrowed to A's batch: rank and singular values are A's,
    the same in every broadcast copy of A."""
    lead = len(batch) - len(a_batch)
    for d, (n, k) in enumerate(zip(batch[lead:], a_batch)):
        if n != k:
            x = x.narrow(lead + d, 0, 1)
    return x.reshape(tuple(a_batch) + tuple(x.shape[x.dim() - tail:])).clone(
        memory_format=torch.contiguous_format)


@register(aten.linalg_lstsq.default)
def linalg_lstsq(a, b, rcond=None, *, driver=None):
    driver = "gelsy" if driver is None else driver
    vector, batch = _lstsq_checked(a, b, rcond, driver)
    b2 = b.unsqueeze(-1) if vector else b
    m, n = a.shape[-2], a.shape[-1]
    a_, b_ = _expand(a, batch), _expand(b2, batch)
    c, nb, k = b_.shape[-1], T.numel(batch), min(m, n)
    if rcond is None:
        rcond = float(np.finfo(np.float32).eps) * max(m, n)
    sol = new(tuple(batch) + (n, c))
    rank = new(batch, torch.int64)
    sv = new(tuple(batch) + (k,)) if driver in ("gelsd", "gelss") else new((0,))
    with_resid = m > n and driver != "gelsy"
    resid = new(tuple(batch) + (c,))
    info = new(batch, torch.int32)
    rank32 = np.zeros(nb, I32)
    lstsq_kernel(view3(a_), view3(b_), view3(sol), rank32,
                 sv._nd.reshape(nb, k) if sv.numel() else np.zeros((nb, 0), np.float32),
                 resid._nd.reshape(nb, c) if with_resid else np.zeros((nb, 0), np.float32),
                 _DRIVERS[driver], rcond, info._nd.reshape(-1))
    launch(a_.numel() * c, 4 * (a_.numel() + b_.numel() + sol.numel()))
    check_errors_kernel(info, "torch.linalg.lstsq", is_matrix=info.numel() <= 1)
    rank._nd.reshape(-1)[...] = rank32
    if driver in ("gelsd", "gelss") and with_resid:
        with_resid = bool((rank32 == n).all())
    resid = resid if with_resid else new((0,))
    if vector:  # (residuals keep their column, as the CPU's)
        sol = sol.squeeze(-1)
    rank = new((0,), torch.int64) if driver == "gels" else _of_batch(rank, batch, a.shape[:-2], 0)
    if driver in ("gelsd", "gelss"):
        sv = _of_batch(sv, batch, a.shape[:-2], 1)
    return finish(sol, a.dtype), finish(resid, a.dtype), rank, finish(sv, a.dtype)


# -- pseudo-inverse --------------------------------------------------------------------------------
@register(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(a, *, atol=None, rtol=None, hermitian=False):
    """torch's composition (LinearAlgebra.cpp) over the neuron svd/eigh kernels."""
    if a.dtype not in (torch.float32, torch.float64) or a.dim() < 2:
        raise RuntimeError(f"linalg.pinv({T.dtype_name(a.dtype)}"
                           f"{{{list(a.shape)}}}): expected a tensor with 2 or more dimensions "
                           "of float, double, cfloat or cdouble types")
    # (torch's composition forms tolerances in float64; the device computes float64 as
    # float32, so float32 gives the same values without a float64 warning, and the default
    # rtol is float32's eps whatever the dtype: float64's would keep float32's round-off
    # singular values, inverting them to ~1e7)
    opts = dict(dtype=a.dtype, device=a.device)
    atol_t = atol if atol is not None else torch.zeros((), **opts)
    if rtol is None:
        default = torch.full((), float(np.finfo(np.float32).eps)
                             * max(a.shape[-1], a.shape[-2]), **opts)
        rtol = torch.where(atol > 0, torch.zeros((), **opts), default) if atol is not None \
            else default
    if a.numel() == 0:
        u, s, v = torch.svd(a)
        return torch.matmul(v * s.reciprocal().unsqueeze(-2), u.mH)
    if not hermitian:
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        max_val = s.narrow(-1, 0, 1)
        tol = torch.max(atol_t.unsqueeze(-1), rtol.unsqueeze(-1) * max_val)
        s_inv = torch.where(s > tol, s.reciprocal(), torch.zeros((), dtype=s.dtype,
                                                                 device=a.device)).to(a.dtype)
        return torch.matmul(vh.mH * s_inv.unsqueeze(-2), u.mH)
    s, u = torch.linalg.eigh(a)
    s_abs = s.abs()
    max_val = s_abs.amax(dim=-1, keepdim=True)
    tol = torch.max(atol_t.unsqueeze(-1), rtol.unsqueeze(-1) * max_val)
    s_inv = torch.where(s_abs > tol, s.reciprocal(), torch.zeros((), dtype=s.dtype,
                                                                 device=a.device)).to(a.dtype)
    return torch.matmul(u * s_inv.unsqueeze(-2), u.mH)


# -- matrix exponential ----------------------------------------------------------------------------
_THETA_18 = np.float32(3.010066362817634)
_THETAS = np.array([1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
                    5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00],
                   np.float32)
_DEGREES = np.array([1, 2, 4, 8, 12, 18], np.int64)


@njit(**JIT)
def _matmul(x, y, out):
    n = x.shape[0]
    for i in range(n):
        for j in range(n):
            out[i, j] = np.float32(0)
        for k in range(n):
            xik = x[i, k]
            for j in range(n):
                out[i, j] += xik * y[k, j]


@njit(**JIT)
def matrix_exp_kernel(a, out, thetas, degrees):
    """torch's choice of Taylor degree by the 1-norm, with scaling and squaring past theta_18;
    the polynomial is evaluated by Horner's rule."""
    nb, n, _ = a.shape
    x = np.empty((n, n), np.float32)
    acc = np.empty((n, n), np.float32)
    tmp = np.empty((n, n), np.float32)
    for b in range(nb):
        norm = np.float32(0)
        for j in range(n):
            col = np.float32(0)
            for i in range(n):
                col += np.abs(a[b, i, j])
            norm = max(norm, col)
        deg = degrees[-1]
        for d in range(degrees.size):
            if norm <= thetas[d]:
                deg = degrees[d]
                break
        if np.isinf(norm):  # (no number of squarings: the CPU's result is all NaN)
            out[b] = np.float32(np.nan)
            continue
        s = 0
        if norm > thetas[-1]:
            s = int(np.ceil(np.log2(norm / thetas[-1])))
        scale = np.float32(2.0 ** -s)
        for i in range(n):
            for j in range(n):
                x[i, j] = a[b, i, j] * scale
                acc[i, j] = np.float32(0)
        for i in range(n):  # Horner: acc = I + x/1 (I + x/2 (I + ... (I + x/deg)))
            acc[i, i] = np.float32(1)
        for k in range(deg, 0, -1):
            _matmul(x, acc, tmp)
            inv = np.float32(1) / np.float32(k)
            for i in range(n):
                for j in range(n):
                    acc[i, j] = tmp[i, j] * inv + (np.float32(1) if i == j else np.float32(0))
        for _ in range(s):
            _matmul(acc, acc, tmp)
            acc[:, :] = tmp
        out[b] = acc


@register(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    meta_run(aten.linalg_matrix_exp.default, a)  # (floats only; 16-bit ones too, as the CPU:
    a_, a3 = batch3(a)  # its matrix exponential is made of matmuls, not LAPACK)
    out = new(a.shape)
    matrix_exp_kernel(a3, view3(out), _THETAS, _DEGREES)
    launch(a.numel() * a.shape[-1] * 18, 8 * a.numel())
    return finish(out, a.dtype)


# -- pairwise distances ----------------------------------------------------------------------------
# p codes: 0 (count of differences), 1, 2, inf (3), and any other p (4)
def _p_code(p: float) -> int:
    return {0.0: 0, 1.0: 1, 2.0: 2, math.inf: 3}.get(float(p), 4)


@njit(**JIT)
def _dist(x, y, code, p):
    acc = np.float32(0)
    for k in range(x.size):
        d = np.abs(x[k] - y[k])
        if code == 0:
            acc += np.float32(1) if d != 0 else np.float32(0)
        elif code == 1:
            acc += d
        elif code == 2:
            acc += d * d
        elif code == 3:
            acc = max(acc, d)
        else:
            acc += d ** p
    if code == 2:
        return np.sqrt(acc)
    if code == 4:
        return acc ** (np.float32(1) / p)
    return acc


@njit(**JIT)
def _dist_grad(x, y, g, dist, code, p, out, sign):
    """out += sign * g * d dist(x, y) / dx (torch's cases, zero where dist is zero)."""
    if code == 0 or g == 0:
        return
    for k in range(x.size):
        diff = x[k] - y[k]
        s = np.float32(1) if diff > 0 else (np.float32(-1) if diff < 0 else np.float32(0))
        if code == 1:
            v = s * g
        elif code == 3:
            v = s * g if np.abs(diff) == dist else np.float32(0)
        elif dist == 0:
            v = np.float32(0)
        elif code == 2:
            v = g * diff / dist
        elif p < 2:
            v = np.float32(0) if (diff == 0 and p < 1) else \
                s * np.abs(diff) ** (p - 1) * g / dist ** (p - 1)
        else:
            v = diff * np.abs(diff) ** (p - 2) * g / dist ** (p - 1)
        out[k] += sign * v


@njit(**JIT)
def cdist_kernel(x1, x2, out, code, p):
    nb, r1, _ = x1.shape
    r2 = x2.shape[1]
    for b in range(nb):
        for i in range(r1):
            for j in range(r2):
                out[b, i, j] = _dist(x1[b, i], x2[b, j], code, p)


@njit(**JIT)
def cdist_backward_kernel(grad, x1, x2, dist, out, code, p):
    nb, r1, m = x1.shape
    r2 = x2.shape[1]
    for b in range(nb):
        for i in range(r1):
            for k in range(m):
                out[b, i, k] = np.float32(0)
            for j in range(r2):
                _dist_grad(x1[b, i], x2[b, j], grad[b, i, j], dist[b, i, j], code, p, out[b, i],
                           np.float32(1))


def _cdist_inputs(x1, x2):
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return batch, _expand(x1, batch), _expand(x2, batch)


@register(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    meta = meta_run(aten._cdist_forward.default, x1, x2, p, compute_mode)
    check_float(x1, aten._cdist_forward.default, x1, x2, p, compute_mode)
    if x1.dtype != x2.dtype:  # (the meta kernel promotes)
        raise RuntimeError(f"expected scalar type {T.dtype_name(x1.dtype)} but found "
                           f"{T.dtype_name(x2.dtype)}")
    r1, r2 = x1.shape[-2], x2.shape[-2]
    mode = 0 if compute_mode is None else compute_mode
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))) and meta.numel():
        # torch's _euclidean_dist: one matmul over padded operands
        n1, n2 = x1.pow(2).sum(-1, keepdim=True), x2.pow(2).sum(-1, keepdim=True)
        a = torch.cat([x1.mul(-2), n1, torch.ones_like(n1)], -1)
        b = torch.cat([x2, torch.ones_like(n2), n2], -1)
        return a.matmul(b.mT).clamp_min(0).sqrt().expand(meta.shape).contiguous()
    batch, a, b = _cdist_inputs(x1, x2)
    out = new(meta.shape)
    if out.numel():
        cdist_kernel(view3(a), view3(b), view3(out), _p_code(p), np.float32(p))
    launch(out.numel() * x1.shape[-1], 4 * (a.numel() + b.numel() + out.numel()))
    return finish(out, x1.dtype)


@register(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, dist):
    batch, a, b = _cdist_inputs(x1, x2)
    out = new(a.shape)
    if out.numel():
        g_, g3 = batch3(grad.expand(tuple(batch) + grad.shape[-2:]))
        d_, d3 = batch3(dist.expand(tuple(batch) + dist.shape[-2:]))
        cdist_backward_kernel(g3, view3(a), view3(b), d3, view3(out), _p_code(p), np.float32(p))
    launch(out.numel() * x2.shape[-2], 4 * (a.numel() + b.numel() + 2 * grad.numel()))
    out = finish(out, x1.dtype)
    return out if out.shape == x1.shape else out.sum_to_size(x1.shape)


@njit(**JIT)
def pdist_kernel(x, out, code, p):
    n = x.shape[0]
    t = 0
    for i in range(n):
        for j in range(i + 1, n):
            out[t] = _dist(x[i], x[j], code, p)
            t += 1


@njit(**JIT)
def pdist_backward_kernel(grad, x, dist, out, code, p):
    n = x.shape[0]
    out[:, :] = np.float32(0)
    t = 0
    for i in range(n):
        for j in range(i + 1, n):
            _dist_grad(x[i], x[j], grad[t], dist[t], code, p, out[i], np.float32(1))
            _dist_grad(x[i], x[j], grad[t], dist[t], code, p, out[j], np.float32(-1))
            t += 1


@register(aten._pdist_forward.default)
def pdist_forward(x, p=2.0):
    meta = meta_run(aten._pdist_forward.default, x, p)
    check_float(x, aten._pdist_forward.default, x, p)
    x_, _ = batch3(x.unsqueeze(0))
    out = new(meta.shape)
    pdist_kernel(x_._nd.reshape(x.shape), out._nd.reshape(-1), _p_code(p), np.float32(p))
    launch(out.numel() * x.shape[-1], 4 * (x.numel() + out.numel()))
    return finish(out, x.dtype)


@register(aten._pdist_backward.default)
def pdist_backward(grad, x, p, dist):
    x_, _ = batch3(x.unsqueeze(0))
    g_, d_ = grad.to(F32).contiguous(), dist.to(F32).contiguous()
    out = new(x.shape)
    pdist_backward_kernel(g_._nd.reshape(-1), x_._nd.reshape(x.shape), d_._nd.reshape(-1),
                          out._nd.reshape(x.shape), _p_code(p), np.float32(p))
    launch(2 * grad.numel() * x.shape[-1], 4 * (2 * x.numel() + 2 * grad.numel()))
    return finish(out, x.dtype)
