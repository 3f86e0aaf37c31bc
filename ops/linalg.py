"""Matrix factorizations: Cholesky, LU, QR (geqrf, orgqr, ormqr), SVD, eigh and LDL.

Kernels call the fp32 LAPACK routines torch's CPU backend uses (potrf, getrf, geqrf/orgqr,
gesdd, syevd, sytrf), from Numba loops over the batch, through the LAPACK linked into torch
(MKL) when it exports them, else SciPy's: signs of singular vectors and eigenvectors then
follow the CPU's. float64 computes as float32 (Trainium has no fp64); 16-bit floats are
refused as on the CPU.
Solvers, inverses, determinants and distances built on these live in linalg_solve.py.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch
from numba.core.extending import get_cython_function_address

from neuron_eager.device_sim import core
from neuron_eager.ops import tensor as T
from neuron_eager.ops._compat import torch_lapack_library
from neuron_eager.ops.jit import native_call, njit
from neuron_eager.ops.meta import in_cpu_words, meta_run
from neuron_eager.ops.copy import float64_temporaries
from neuron_eager.ops.registry import around_decomposition, register

aten = torch.ops.aten
F32 = torch.float32
I32 = np.int32
JIT = dict(error_model="numpy", nogil=True)


# -- LAPACK bindings ---------------------------------------------------------------------
# Note [LAPACK calls]: every argument is passed by address (Fortran). Integer and character
# arguments live in one int32 array `iv` (a character is the low byte of its slot) and the
# info result is read back from it after the call, which also keeps the array alive across
# the call (Numba frees an array after its last use).
# Singular vectors' and eigenvectors' signs are implementation-defined: MKL's differ from
# reference LAPACK's, so torch's own LAPACK (when it exports the symbols) gives CPU-identical
# results; SciPy's is the fallback.
# The kernels call each routine by an LLVM symbol (Note [Native calls by symbol] in ops/jit.py).
_MKL = torch_lapack_library()


def _binding(name: str, nargs: int, module: str = "lapack"):
    """A jitted call of LAPACK/BLAS routine `name` taking `nargs` addresses."""
    if _MKL is not None and hasattr(_MKL, name + "_"):
        addr = ctypes.cast(getattr(_MKL, name + "_"), ctypes.c_void_p).value
    else:
        addr = get_cython_function_address(f"scipy.linalg.cython_{module}", name)
    return native_call(f"neuron_eager_{name}", addr, nargs)


spotrf = _binding("spotrf", 5)
spotri = _binding("spotri", 5)
sgetrf = _binding("sgetrf", 6)
sgeqrf = _binding("sgeqrf", 8)
sorgqr = _binding("sorgqr", 9)
sormqr = _binding("sormqr", 13)
sgesdd = _binding("sgesdd", 14)
ssyevd = _binding("ssyevd", 11)
ssytrf = _binding("ssytrf", 8)


@njit(**JIT)
def at(iv, k):
    """Address of slot k of the int32 argument array."""
    return iv.ctypes.data + 4 * k


@njit(**JIT)
def to_f(a, w, ld):
    """Copy the (r, c) matrix `a` into the column-major buffer `w` (leading dimension ld)."""
    r, c = a.shape
    for j in range(c):
        for i in range(r):
            w[j * ld + i] = a[i, j]


@njit(**JIT)
def from_f(w, ld, out):
    """Copy the column-major buffer `w` into the (r, c) matrix `out`."""
    r, c = out.shape
    for i in range(r):
        for j in range(c):
            out[i, j] = w[j * ld + i]


# -- shared plumbing -----------------------------------------------------------------------
def check_float(x: torch.Tensor, op, *args, **kwargs) -> None:
    """The CPU's LAPACK kernels take float32 and float64 only: `op(*args, **kwargs)` with `x`
    of another dtype raises the CPU's error, asked of the CPU (its words name the kernel
    that refuses, often not `op`: Note [Errors in the CPU's words] in ops/meta.py)."""
    if x.dtype not in (torch.float32, torch.float64):
        in_cpu_words(op, args, kwargs)
        raise NotImplementedError(f"{op}: {T.dtype_name(x.dtype)} is not supported on neuron")


def batch3(x: torch.Tensor) -> tuple[T.NeuronTensor, np.ndarray]:
    """A contiguous fp32 copy of `x` (no copy when it is one) and its (batch, r, c) view."""
    t = x.to(F32).contiguous()
    return t, view3(t)


def view3(t: T.NeuronTensor) -> np.ndarray:
    r, c = t.shape[-2], t.shape[-1]
    return t._nd.reshape((T.numel(t.shape[:-2]), r, c))


def new(shape, dtype=F32) -> T.NeuronTensor:
    return T.empty(tuple(shape), dtype)


def finish(out: T.NeuronTensor, dtype: torch.dtype) -> T.NeuronTensor:
    """fp32 results are stored in the input's dtype (float64 inputs compute as float32)."""
    return out if dtype == F32 else out.to(dtype)


def launch(elements: int, nbytes: int) -> None:
    core.launch("gpsimd", elements, nbytes)


def flat_batch(shape) -> int:
    return T.numel(shape)


# -- Cholesky --------------------------------------------------------------------------------
@njit(**JIT)
def potrf_kernel(a, out, info, upper):
    nb, n, _ = a.shape
    w = np.empty(max(n * n, 1), np.float32)
    iv = np.zeros(4, I32)
    for b in range(nb):
        to_f(a[b], w, n)
        iv[0] = 85 if upper else 76
        iv[1] = n
        iv[2] = max(n, 1)
        spotrf(at(iv, 0), at(iv, 1), w.ctypes.data, at(iv, 2), at(iv, 3))
        info[b] = iv[3]
        for i in range(n):
            for j in range(n):
                keep = j >= i if upper else j <= i
                out[b, i, j] = w[j * n + i] if keep else np.float32(0)


def cholesky_factor(x, upper: bool):
    """(factor, info) in fp32, the factor's other triangle zero."""
    a, a3 = batch3(x)
    out, info = new(x.shape), new(x.shape[:-2], torch.int32)
    potrf_kernel(a3, view3(out), info._nd.reshape(-1), upper)
    launch(x.numel(), 8 * x.numel())
    return out, info


@register(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(x, *, upper=False, check_errors=False):
    meta_run(aten.linalg_cholesky_ex.default, x, upper=upper)
    check_float(x, aten.linalg_cholesky_ex.default, x, upper=upper)
    out, info = cholesky_factor(x, upper)
    if check_errors:
        check_errors_kernel(info, "linalg.cholesky_ex", is_matrix=x.dim() == 2)
    return finish(out, x.dtype), info


@register(aten.cholesky.default)
def cholesky(x, upper=False):
    meta_run(aten.cholesky.default, x, upper)
    check_float(x, aten.cholesky.default, x, upper)
    if x.numel() == 0:
        return new(x.shape, x.dtype)
    out, info = cholesky_factor(x, upper)
    check_errors_kernel(info, "cholesky", is_matrix=x.dim() == 2)
    return finish(out, x.dtype)


@njit(**JIT)
def potri_kernel(a, out, info, upper):
    nb, n, _ = a.shape
    w = np.empty(max(n * n, 1), np.float32)
    iv = np.zeros(4, I32)
    for b in range(nb):
        to_f(a[b], w, n)
        iv[0] = 85 if upper else 76
        iv[1] = n
        iv[2] = max(n, 1)
        spotri(at(iv, 0), at(iv, 1), w.ctypes.data, at(iv, 2), at(iv, 3))
        info[b] = iv[3]
        for i in range(n):  # potri fills one triangle: mirror it
            for j in range(n):
                lower = i >= j
                src = lower != upper
                out[b, i, j] = w[j * n + i] if src else w[i * n + j]


@register(aten.cholesky_inverse.default)
def cholesky_inverse(x, upper=False):
    meta = meta_run(aten.cholesky_inverse.default, x, upper)
    check_float(x, aten.cholesky_inverse.default, x, upper)
    a, a3 = batch3(x)
    out, info = new(meta.shape), new(x.shape[:-2], torch.int32)
    potri_kernel(a3, view3(out), info._nd.reshape(-1), upper)
    launch(x.numel(), 8 * x.numel())
    check_errors_kernel(info, "cholesky_inverse", is_matrix=x.dim() == 2)
    return finish(out, x.dtype)


# -- LU -------------------------------------------------------------------------------------
@njit(**JIT)
def getrf_kernel(a, lu, piv, info):
    nb, m, n = a.shape
    k = min(m, n)
    w = np.empty(max(m * n, 1), np.float32)
    ip = np.zeros(max(k, 1), I32)
    iv = np.zeros(4, I32)
    for b in range(nb):
        to_f(a[b], w, m)
        iv[0] = m
        iv[1] = n
        iv[2] = max(m, 1)
        sgetrf(at(iv, 0), at(iv, 1), w.ctypes.data, at(iv, 2), ip.ctypes.data, at(iv, 3))
        info[b] = iv[3]
        for i in range(k):
            piv[b, i] = ip[i]
        from_f(w, m, lu[b])


def lu_factor(x):
    """(LU, pivots, info) of `x` (pivoted, LAPACK's 1-based int32 pivots), LU in fp32."""
    m, n = x.shape[-2], x.shape[-1]
    a, a3 = batch3(x)
    batch = x.shape[:-2]
    lu = new(x.shape)
    piv = new(batch + (min(m, n),), torch.int32)
    info = new(batch, torch.int32)
    getrf_kernel(a3, view3(lu), piv._nd.reshape(flat_batch(batch), min(m, n)),
                 info._nd.reshape(-1))
    launch(x.numel(), 8 * x.numel())
    return lu, piv, info


def _check_pivot(op, x, pivot: bool) -> None:
    """LU without pivoting is CUDA's only: the CPU's refusal, in its words."""
    if not pivot:
        in_cpu_words(op, (x,), {"pivot": pivot})
        raise RuntimeError(f"{op}: LU without pivoting is not implemented on the CPU")


@register(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(x, *, pivot=True, check_errors=False):
    meta_run(aten.linalg_lu_factor_ex.default, x, pivot=pivot)
    check_float(x, aten.linalg_lu_factor_ex.default, x, pivot=pivot)
    _check_pivot(aten.linalg_lu_factor_ex.default, x, pivot)
    lu, piv, info = lu_factor(x)
    if check_errors:
        check_errors_kernel(info, "torch.linalg.lu_factor_ex", is_matrix=x.dim() == 2)
    return finish(lu, x.dtype), piv, info


@njit(**JIT)
def lu_unpack_kernel(lu, piv, p, l, u, unpack_data, unpack_pivots):
    nb, m, n = lu.shape
    k = min(m, n)
    perm = np.empty(m, np.int64)
    for b in range(nb):
        if unpack_data:
            for i in range(m):
                for j in range(k):
                    l[b, i, j] = np.float32(1) if i == j else (lu[b, i, j] if i > j else
                                                               np.float32(0))
            for i in range(k):
                for j in range(n):
                    u[b, i, j] = lu[b, i, j] if j >= i else np.float32(0)
        if unpack_pivots:
            for i in range(m):
                perm[i] = i
            for i in range(k):  # row i was swapped with row piv[i] (1-based), in order
                t = piv[b, i] - 1
                perm[i], perm[t] = perm[t], perm[i]
            for i in range(m):
                for j in range(m):
                    p[b, i, j] = np.float32(0)
            for j in range(m):  # A = P L U: row j of L U is row perm[j] of A
                p[b, perm[j], j] = np.float32(1)


def lu_unpack_f32(lu, piv, unpack_data=True, unpack_pivots=True):
    """(P, L, U) in fp32 from an LU factorization (shapes as torch gives them)."""
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)
    batch = lu.shape[:-2]
    nb = flat_batch(batch)
    lu_c, lu3 = batch3(lu)
    piv_c = piv.expand(batch + (k,)).contiguous() if piv.shape[:-1] != batch else piv.contiguous()
    p = new(batch + (m, m)) if unpack_pivots else new((0,))
    l_ = new(batch + (m, k)) if unpack_data else new((0,))
    u = new(batch + (k, n)) if unpack_data else new((0,))
    dummy = np.zeros((nb, 0, 0), np.float32)
    lu_unpack_kernel(lu3, piv_c._nd.reshape(nb, k),
                     view3(p) if unpack_pivots else dummy,
                     view3(l_) if unpack_data else dummy,
                     view3(u) if unpack_data else dummy, unpack_data, unpack_pivots)
    launch(lu.numel(), 8 * lu.numel())
    return p, l_, u


@register(aten.lu_unpack.default)
def lu_unpack(lu, piv, unpack_data=True, unpack_pivots=True):
    meta_run(aten.lu_unpack.default, lu, piv, unpack_data, unpack_pivots)
    if piv.dtype != torch.int32:
        raise RuntimeError("torch.lu_unpack: LU_pivots is expected to be a contiguous tensor "
                           "of torch.int32 dtype. Note: this function is intended to be used "
                           "with the output produced by torch.linalg.lu_factor")
    check_float(lu, aten.lu_unpack.default, lu, piv, unpack_data, unpack_pivots)
    return tuple(finish(t, lu.dtype) for t in lu_unpack_f32(lu, piv, unpack_data,
                                                            unpack_pivots))


@register(aten.linalg_lu.default)
def linalg_lu(x, *, pivot=True):
    meta_run(aten.linalg_lu.default, x, pivot=pivot)
    check_float(x, aten.linalg_lu.default, x, pivot=pivot)
    _check_pivot(aten.linalg_lu.default, x, pivot)
    lu, piv, _ = lu_factor(x)
    return tuple(finish(t, x.dtype) for t in lu_unpack_f32(lu, piv))


# -- QR ---------------------------------------------------------------------------------------
@njit(**JIT)
def geqrf_call(w, m, n, tau, iv):
    """geqrf on the column-major (m, n) buffer `w`, with its workspace query."""
    work = np.empty(1, np.float32)
    iv[0] = m
    iv[1] = n
    iv[2] = max(m, 1)
    iv[3] = -1
    sgeqrf(at(iv, 0), at(iv, 1), w.ctypes.data, at(iv, 2), tau.ctypes.data,
           work.ctypes.data, at(iv, 3), at(iv, 4))
    work = np.empty(max(int(work[0]), 1), np.float32)
    iv[3] = work.size
    sgeqrf(at(iv, 0), at(iv, 1), w.ctypes.data, at(iv, 2), tau.ctypes.data,
           work.ctypes.data, at(iv, 3), at(iv, 4))
    return work[0]


@njit(**JIT)
def orgqr_call(w, m, n, k, tau, iv):
    """orgqr: the first n columns of Q from k reflectors stored in `w` (ld m)."""
    work = np.empty(1, np.float32)
    iv[0] = m
    iv[1] = n
    iv[2] = k
    iv[3] = max(m, 1)
    iv[4] = -1
    sorgqr(at(iv, 0), at(iv, 1), at(iv, 2), w.ctypes.data, at(iv, 3), tau.ctypes.data,
           work.ctypes.data, at(iv, 4), at(iv, 5))
    work = np.empty(max(int(work[0]), 1), np.float32)
    iv[4] = work.size
    sorgqr(at(iv, 0), at(iv, 1), at(iv, 2), w.ctypes.data, at(iv, 3), tau.ctypes.data,
           work.ctypes.data, at(iv, 4), at(iv, 5))
    return work[0]


@njit(**JIT)
def geqrf_kernel(a, out, tau_out):
    nb, m, n = a.shape
    k = min(m, n)
    w = np.empty(max(m * n, 1), np.float32)
    tau = np.zeros(max(k, 1), np.float32)
    iv = np.zeros(8, I32)
    for b in range(nb):
        to_f(a[b], w, m)
        geqrf_call(w, m, n, tau, iv)
        from_f(w, m, out[b])
        for i in range(k):
            tau_out[b, i] = tau[i]


@register(aten.geqrf.default)
def geqrf(x):
    if x.dim() < 2:  # (geqrf has no meta kernel)
        raise RuntimeError("torch.geqrf: input must have at least 2 dimensions.")
    check_float(x, aten.geqrf.default, x)
    m, n = x.shape[-2], x.shape[-1]
    k, batch = min(m, n), x.shape[:-2]
    a, a3 = batch3(x)
    out, tau = new(x.shape), new(batch + (k,))
    geqrf_kernel(a3, view3(out), tau._nd.reshape(flat_batch(batch), k))
    launch(x.numel(), 8 * x.numel())
    return finish(out, x.dtype), finish(tau, x.dtype)


@njit(**JIT)
def qr_kernel(a, q, r, qcols, rrows):
    nb, m, n = a.shape
    k = min(m, n)
    w = np.empty(max(m * max(n, qcols), 1), np.float32)
    tau = np.zeros(max(k, 1), np.float32)
    iv = np.zeros(8, I32)
    for b in range(nb):
        to_f(a[b], w, m)
        geqrf_call(w, m, n, tau, iv)
        for i in range(rrows):
            for j in range(n):
                r[b, i, j] = w[j * m + i] if j >= i else np.float32(0)
        if qcols > 0:
            orgqr_call(w, m, qcols, k, tau, iv)
            from_f(w, m, q[b])


@register(aten.linalg_qr.default)
def linalg_qr(x, mode="reduced"):
    mq, mr = meta_run(aten.linalg_qr.default, x, mode)
    check_float(x, aten.linalg_qr.default, x, mode)
    a, a3 = batch3(x)
    q, r = new(mq.shape), new(mr.shape)
    qcols = 0 if mode == "r" else mq.shape[-1]
    q3 = view3(q) if qcols else np.zeros((1, 0, 0), np.float32)
    qr_kernel(a3, q3, view3(r), qcols, mr.shape[-2])
    launch(x.numel(), 8 * x.numel())
    return finish(q, x.dtype), finish(r, x.dtype)


@njit(**JIT)
def orgqr_kernel(a, tau, out):
    nb, m, n = a.shape
    k = tau.shape[1]
    w = np.empty(max(m * n, 1), np.float32)
    t = np.zeros(max(k, 1), np.float32)
    iv = np.zeros(8, I32)
    for b in range(nb):
        to_f(a[b], w, m)
        for i in range(k):
            t[i] = tau[b, i]
        orgqr_call(w, m, n, k, t, iv)
        from_f(w, m, out[b])


@register(aten.linalg_householder_product.default)
def linalg_householder_product(x, tau):
    meta_run(aten.linalg_householder_product.default, x, tau)
    check_float(x, aten.linalg_householder_product.default, x, tau)
    a, a3 = batch3(x)
    k = tau.shape[-1]
    t = tau.to(F32).expand(x.shape[:-2] + (k,)).contiguous()
    out = new(x.shape)
    orgqr_kernel(a3, t._nd.reshape(a3.shape[0], k), view3(out))
    launch(x.numel(), 8 * x.numel())
    return finish(out, x.dtype)


@njit(**JIT)
def ormqr_kernel(a, tau, c, out, left, trans):
    nb, ra, ca = a.shape
    _, m, n = c.shape
    k = tau.shape[1]
    wa = np.empty(max(ra * ca, 1), np.float32)
    wc = np.empty(max(m * n, 1), np.float32)
    t = np.zeros(max(k, 1), np.float32)
    work = np.empty(1, np.float32)
    iv = np.zeros(10, I32)
    for b in range(nb):
        to_f(a[b], wa, ra)
        to_f(c[b], wc, m)
        for i in range(k):
            t[i] = tau[b, i]
        iv[0] = 76 if left else 82
        iv[1] = 84 if trans else 78
        iv[2] = m
        iv[3] = n
        iv[4] = k
        iv[5] = max(ra, 1)
        iv[6] = max(m, 1)
        iv[7] = -1
        for _ in range(2):  # workspace query, then the call
            sormqr(at(iv, 0), at(iv, 1), at(iv, 2), at(iv, 3), at(iv, 4), wa.ctypes.data,
                   at(iv, 5), t.ctypes.data, wc.ctypes.data, at(iv, 6), work.ctypes.data,
                   at(iv, 7), at(iv, 8))
            if iv[7] == -1:
                work = np.empty(max(int(work[0]), 1), np.float32)
                iv[7] = work.size
        from_f(wc, m, out[b])


@register(aten.ormqr.default)
def ormqr(x, tau, other, left=True, transpose=False):
    meta = meta_run(aten.ormqr.default, x, tau, other, left, transpose)
    check_float(x, aten.ormqr.default, x, tau, other, left, transpose)
    batch = meta.shape[:-2]
    a = x.to(F32).expand(batch + x.shape[-2:]).contiguous()
    k = tau.shape[-1]
    t = tau.to(F32).expand(batch + (k,)).contiguous()
    c = other.to(F32).expand(meta.shape).contiguous()
    out = new(meta.shape)
    ormqr_kernel(view3(a), t._nd.reshape(flat_batch(batch), k), view3(c), view3(out), left,
                 transpose)
    launch(out.numel(), 8 * out.numel())
    return finish(out, x.dtype)


# -- SVD and symmetric eigendecomposition -------------------------------------------------------
@njit(**JIT)
def gesdd_kernel(a, u, s, vh, jobz, info):
    nb, m, n = a.shape
    k = min(m, n)
    ucols = u.shape[2]
    vrows = vh.shape[1]
    w = np.empty(max(m * n, 1), np.float32)
    wu = np.empty(max(m * ucols, 1), np.float32)
    wv = np.empty(max(vrows * n, 1), np.float32)
    sv = np.empty(max(k, 1), np.float32)
    iwork = np.empty(max(8 * k, 1), I32)
    work = np.empty(1, np.float32)
    iv = np.zeros(8, I32)
    iv[0] = jobz
    iv[1] = m
    iv[2] = n
    iv[3] = max(m, 1)
    iv[4] = max(m, 1)
    iv[5] = max(vrows, 1)
    iv[6] = -1
    for b in range(nb):
        to_f(a[b], w, m)
        for _ in range(2):
            sgesdd(at(iv, 0), at(iv, 1), at(iv, 2), w.ctypes.data, at(iv, 3), sv.ctypes.data,
                   wu.ctypes.data, at(iv, 4), wv.ctypes.data, at(iv, 5), work.ctypes.data,
                   at(iv, 6), iwork.ctypes.data, at(iv, 7))
            if iv[6] != -1:
                break
            work = np.empty(max(int(work[0]), 1), np.float32)
            iv[6] = work.size
        info[b] = iv[7]
        for i in range(k):
            s[b, i] = sv[i]
        if jobz != 78 and k == 0:  # (gesdd returns at once, writing nothing: the CPU's factors of
            for i in range(u.shape[1]):  # an empty matrix are identities)
                for j in range(ucols):
                    u[b, i, j] = np.float32(i == j)
            for i in range(vrows):
                for j in range(n):
                    vh[b, i, j] = np.float32(i == j)
        elif jobz != 78:
            from_f(wu, m, u[b])
            from_f(wv, vrows, vh[b])


def svd_f32(x, full_matrices: bool, compute_uv: bool):
    """(U, S, Vh, info) in fp32 via gesdd, the driver torch uses on the CPU."""
    mu, ms, mv = meta_run(aten._linalg_svd.default, x, full_matrices, compute_uv)
    a, a3 = batch3(x)
    u, s, vh = new(mu.shape), new(ms.shape), new(mv.shape)
    nb = a3.shape[0]
    info = new(x.shape[:-2], torch.int32)
    jobz = (65 if full_matrices else 83) if compute_uv else 78  # 'A', 'S', 'N'
    empty = np.zeros((nb, 0, 0), np.float32)
    gesdd_kernel(a3, view3(u) if compute_uv else empty, s._nd.reshape(nb, ms.shape[-1]),
                 view3(vh) if compute_uv else empty, jobz, info._nd.reshape(-1))
    launch(x.numel(), 8 * x.numel())
    return u, s, vh, info


@register(aten._linalg_svd.default)
def linalg_svd(x, full_matrices=False, compute_uv=True, *, driver=None):
    check_float(x, aten._linalg_svd.default, x, full_matrices, compute_uv, driver=driver)
    if driver is not None:
        raise RuntimeError("torch.linalg.svd: keyword argument `driver=` is only supported on "
                           "CUDA inputs with cuSOLVER backend.")
    u, s, vh, info = svd_f32(x, full_matrices, compute_uv)
    check_errors_kernel(info, "linalg.svd", is_matrix=x.dim() == 2)
    return finish(u, x.dtype), finish(s, x.dtype), finish(vh, x.dtype)


@njit(**JIT)
def syevd_kernel(a, vals, vecs, jobz, upper, info):
    nb, n, _ = a.shape
    w = np.empty(max(n * n, 1), np.float32)
    ev = np.empty(max(n, 1), np.float32)
    work = np.empty(1, np.float32)
    iwork = np.empty(1, I32)
    iv = np.zeros(8, I32)
    iv[0] = jobz
    iv[1] = 85 if upper else 76
    iv[2] = n
    iv[3] = max(n, 1)
    iv[4] = -1
    iv[5] = -1
    for b in range(nb):
        to_f(a[b], w, n)
        for _ in range(2):
            ssyevd(at(iv, 0), at(iv, 1), at(iv, 2), w.ctypes.data, at(iv, 3), ev.ctypes.data,
                   work.ctypes.data, at(iv, 4), iwork.ctypes.data, at(iv, 5), at(iv, 6))
            if iv[4] != -1:
                break
            work = np.empty(max(int(work[0]), 1), np.float32)
            iwork = np.empty(max(iwork[0], 1), I32)
            iv[4] = work.size
            iv[5] = iwork.size
        info[b] = iv[6]
        for i in range(n):
            vals[b, i] = ev[i]
        if vecs.shape[1]:
            from_f(w, n, vecs[b])


@register(aten._linalg_eigh.default)
def linalg_eigh(x, UPLO="L", compute_v=True):
    mvals, mvecs = meta_run(aten._linalg_eigh.default, x, UPLO, compute_v)
    check_float(x, aten._linalg_eigh.default, x, UPLO, compute_v)
    a, a3 = batch3(x)
    nb, n = a3.shape[0], x.shape[-1]
    vals, vecs = new(mvals.shape), new(mvecs.shape)
    info = new(x.shape[:-2], torch.int32)
    syevd_kernel(a3, vals._nd.reshape(nb, n),
                 view3(vecs) if compute_v else np.zeros((nb, 0, 0), np.float32),
                 86 if compute_v else 78, UPLO.upper() == "U", info._nd.reshape(-1))
    launch(x.numel(), 8 * x.numel())
    check_errors_kernel(info, "linalg.eigh", is_matrix=x.dim() == 2)
    return finish(vals, x.dtype), finish(vecs, x.dtype)


# -- LDL (Bunch-Kaufman) ------------------------------------------------------------------------
@njit(**JIT)
def sytrf_kernel(a, ld, piv, info):
    nb, n, _ = a.shape
    w = np.empty(max(n * n, 1), np.float32)
    ip = np.zeros(max(n, 1), I32)
    work = np.empty(1, np.float32)
    iv = np.zeros(6, I32)
    iv[0] = 76
    iv[1] = n
    iv[2] = max(n, 1)
    iv[3] = -1
    for b in range(nb):
        for j in range(n):  # only the lower triangle is factored; the upper one stays zero
            for i in range(n):
                w[j * n + i] = a[b, i, j] if i >= j else np.float32(0)
        for _ in range(2):
            ssytrf(at(iv, 0), at(iv, 1), w.ctypes.data, at(iv, 2), ip.ctypes.data,
                   work.ctypes.data, at(iv, 3), at(iv, 4))
            if iv[3] != -1:
                break
            work = np.empty(max(int(work[0]), 1), np.float32)
            iv[3] = work.size
        info[b] = iv[4]
        for i in range(n):
            piv[b, i] = ip[i]
        from_f(w, n, ld[b])


@register(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(x, *, hermitian=False, check_errors=False):
    meta_run(aten.linalg_ldl_factor_ex.default, x, hermitian=hermitian)
    check_float(x, aten.linalg_ldl_factor_ex.default, x, hermitian=hermitian)
    a, a3 = batch3(x)
    nb, n, batch = a3.shape[0], x.shape[-1], x.shape[:-2]
    ld, piv = new(x.shape), new(batch + (n,), torch.int32)
    info = new(batch, torch.int32)
    sytrf_kernel(a3, view3(ld), piv._nd.reshape(nb, n), info._nd.reshape(-1))
    launch(x.numel(), 8 * x.numel())
    if check_errors:
        check_errors_kernel(info, "torch.linalg.ldl_factor_ex", is_matrix=x.dim() == 2)
    return finish(ld, x.dtype), piv, info


# -- error reporting ------------------------------------------------------------------------------
def _error_text(api: str, info: int) -> tuple[type, str]:
    """torch's message for a nonzero LAPACK info (BatchLinearAlgebra.cpp)."""
    linalg_error = torch.linalg.LinAlgError
    if info < 0:
        if "svd" in api and info == -4:
            return linalg_error, ("The algorithm failed to converge because the input matrix "
                                  "contained non-finite values.")
        return RuntimeError, (f"Argument {-info} has illegal value. Most certainly there is a bug "
                              "in the implementation calling the backend library.")
    if "inv" in api:
        return linalg_error, (f"The diagonal element {info} is zero, the inversion could not be "
                              "completed because the input matrix is singular.")
    if "solve" in api:
        return linalg_error, "The solver failed because the input matrix is singular."
    if "cholesky" in api:
        return linalg_error, ("The factorization could not be completed because the input is "
                              f"not positive-definite (the leading minor of order {info} is not "
                              "positive-definite).")
    if "svd" in api:
        return linalg_error, ("The algorithm failed to converge because the input matrix is "
                              "ill-conditioned or has too many repeated singular values (error "
                              f"code: {info}).")
    if "eig" in api or "syevd" in api:
        return linalg_error, ("The algorithm failed to converge because the input matrix is "
                              "ill-conditioned or has too many repeated eigenvalues (error code: "
                              f"{info}).")
    if "lstsq" in api:
        return linalg_error, ("The least squares solution could not be computed because the "
                              f"input matrix does not have full rank (error code: {info}).")
    if "lu_factor" in api:
        return RuntimeError, (f"U[{info},{info}] is zero and using it on lu_solve would result "
                              "in a division by zero. If you still want to perform the "
                              "factorization, consider calling linalg.lu(A, pivot) or "
                              "linalg.lu_factor_ex(A, pivot)")
    return RuntimeError, f"Unknown error code: {info}."


def check_errors_kernel(info: T.NeuronTensor, api_name: str, is_matrix: bool) -> None:
    """Raise torch's error for the first nonzero `info` (read on the device, no copy)."""
    codes = info._nd.reshape(-1)
    bad = np.flatnonzero(codes)
    if bad.size == 0:
        return
    first = int(bad[0])
    code = int(codes[first])
    kind, text = _error_text(api_name, code)
    where = "" if is_matrix or text.startswith("Unknown") else f" (Batch element {first}):"
    raise kind(f"{api_name}:{where} {text}" if where else f"{api_name}: {text}")


@register(aten._linalg_check_errors.default)
def linalg_check_errors(info, api_name, *, is_matrix):
    check_errors_kernel(info, api_name, is_matrix)


# matrix_rank and pinv build float64 tolerance tensors in C++ for inputs of any dtype: the
# float64 warning would name the user's line for a tensor the user never made.
# matrix_rank's default rtol is the eps of its input's dtype times max(m, n): a float64 input
# computes as float32, so it decomposes as float32 (the int64 rank is the same otherwise) and
# the default cuts float32's round-off singular values, as linalg_pinv and lstsq do.
around_decomposition(float64_temporaries, aten.linalg_pinv)
around_decomposition(float64_temporaries, aten.linalg_matrix_rank,
                     first=lambda x: x.to(F32) if x.dtype == torch.float64 else x)

