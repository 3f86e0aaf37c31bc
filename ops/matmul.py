"""Matrix products on the Tensor engine: mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot.

Every product runs through `gemm`: operands are staged as flat fp32 (int64 for integer
dtypes) arrays, one tiled Numba kernel computes, and the result is rounded once into the
output. Also home of the staging helpers (`flat`, `widen`, `narrow_into`) that the
convolution and pooling kernels share, so the whole family compiles few kernels.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import config, core
from neuron_eager.ops import bf16_chunks, blas_threads, numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit
from neuron_eager.ops.meta import in_cpu_words, meta_outputs
from neuron_eager.ops.registry import register

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor

# Note [PSUM accumulation]
# The Tensor engine contracts at most 128 partitions per matmul and accumulates successive
# matmuls into an fp32 PSUM tile. So: inputs are widened to fp32 (bf16 x bf16 products are
# exact in fp32); each chunk of TILE_K is summed in fp32; the chunk sums are added in order
# into the fp32 accumulator; alpha*acc + beta*C is formed in fp32 and rounded once to the
# output dtype. Integer products accumulate exactly in int64 (in k order, tiled for the
# cache) and wrap to the output dtype, as on the CPU.
# The chunk product itself is a BLAS sgemm (fp32 products and sums, FMA): OpenBLAS's through
# np.dot on staged chunks in the Numba kernel for small products, MKL's through torch's CPU
# addmm_ (beta=1) for large ones; large bf16 products go to MKL's bf16 GEMM chunk by chunk
# where the CPU has bf16 units (Note [bf16 chunks on MKL] in ops/bf16_chunks.py). The
# summation order within a chunk is the micro-kernel's, so float matmul bits may differ
# between CPU models and between these paths, as torch's own CPU results do.
# tests/ops/test_matmul.py checks the chunk structure against a float64 reference on values
# whose chunk sums are exact in any order.
TILE_K = 128
TILE_M = 64  # cache blocking of the integer kernel only
TILE_N = 256
BLAS_MIN_WORK = 128 ** 3  # multiply-adds per product from which sgemm is called from Python

stats = {"launches": 0}


# -- staging: storage <-> compute arrays -----------------------------------------------------
def flat(t: NeuronTensor) -> np.ndarray:
    """A 1-D array over the storage `t` reaches, starting at its first element (no copy)."""
    nd = t._nd
    if t._key is not None:  # C-contiguous: its own elements (the common operand, and cheap)
        return nd.reshape(-1)
    n = T.storage_extent(t.shape, t.stride(), 0)
    if n == 0:
        return np.empty(0, nd.dtype)
    return np.ndarray((n,), nd.dtype, t._storage.buffer, t.storage_offset() * nd.itemsize)


_widen_kernels: dict = {}
_narrow_kernels: dict = {}


def _widen_kernel(code: str):
    kernel = _widen_kernels.get(code)
    if kernel is None:
        load = numerics.loader(code, "f32")

        @njit(error_model="numpy", nogil=True)
        def kernel(dst, src):
            for i in range(src.shape[0]):
                dst[i] = load(src[i])

        _widen_kernels[code] = kernel
    return kernel


def widen(t: NeuronTensor, auto_cast: bool = False) -> np.ndarray:
    """`flat(t)` in the compute type: fp32 for floats (exact for 16-bit floats; float64 is
    computed as float32), int64 for integers. fp32 and int64 tensors are not copied, unless
    `auto_cast` (a matmul operand) and config.auto_cast round fp32 to a narrower type."""
    src = flat(t)
    code = numerics.load_code(t.dtype, "matmult") if auto_cast else numerics.CODE[t.dtype]
    if code == "f32" or t.dtype == torch.int64:
        return src
    if not t.dtype.is_floating_point:
        return src.astype(np.int64)
    dst = np.empty(src.shape[0], np.float32)
    _widen_kernel(code)(dst, src)
    return dst


def compute_dtype(dtype: torch.dtype):
    return np.float32 if dtype.is_floating_point else np.int64


def narrow_into(out: NeuronTensor, values: np.ndarray) -> None:
    """Round contiguous compute values (fp32 or int64) once into contiguous `out`."""
    dst = out._nd.reshape(-1)
    if dst.dtype == values.dtype:
        if not np.may_share_memory(dst, values):  # else the kernel wrote `out` directly
            dst[:] = values
        return
    if not out.dtype.is_floating_point:
        dst[:] = values.astype(dst.dtype)  # wraps, as the CPU's integer arithmetic does
        return
    stochastic = config.stochastic_rounding and out.dtype in (torch.bfloat16, torch.float16)
    key = (numerics.CODE[out.dtype], stochastic)
    kernel = _narrow_kernels.get(key)
    if kernel is None:
        store = numerics.storer(*key)
        if stochastic:
            @njit(error_model="numpy", nogil=True)
            def kernel(dst, src):
                for i in range(src.shape[0]):
                    dst[i] = store(src[i], np.random.randint(0, 4294967296))

            kernel = numerics.with_noise(kernel)
        else:
            @njit(error_model="numpy", nogil=True)
            def kernel(dst, src):
                for i in range(src.shape[0]):
                    dst[i] = store(src[i])
        _narrow_kernels[key] = kernel
    kernel(dst, values)


def result_buffer(out: NeuronTensor) -> np.ndarray:
    """Where a kernel writes compute values for `out`: out itself when the types agree."""
    dst = out._nd.reshape(-1)
    want = compute_dtype(out.dtype)
    return dst if dst.dtype == want else np.empty(dst.shape[0], want)


# -- the kernels -----------------------------------------------------------------------------
@njit(error_model="numpy", nogil=True)
def _chunk(part, ap, bp, mb, kt, nt):
    """part[:mb, :nt] = ap[:mb, :kt] @ bp[:kt, :nt], each sum in k order.

    Four rows at a time share each load of bp (about 1.7x faster than one row at a time).
    """
    i = 0
    while i + 4 <= mb:
        for r in range(4):
            for nn in range(nt):
                part[i + r, nn] = 0
        for kk in range(kt):
            a0, a1, a2, a3 = ap[i, kk], ap[i + 1, kk], ap[i + 2, kk], ap[i + 3, kk]
            for nn in range(nt):
                bv = bp[kk, nn]
                part[i, nn] += a0 * bv
                part[i + 1, nn] += a1 * bv
                part[i + 2, nn] += a2 * bv
                part[i + 3, nn] += a3 * bv
        i += 4
    while i < mb:
        for nn in range(nt):
            part[i, nn] = 0
        for kk in range(kt):
            av = ap[i, kk]
            for nn in range(nt):
                part[i, nn] += av * bp[kk, nn]
        i += 1


@njit(error_model="numpy", nogil=True)
def gemm_kernel(out, a, b, c, g, alpha, beta):
    """Tiled integer gemm over flat int64 arrays with element strides (exact in any order).

    g: B1, B2, BR, M, N, K; strides of A (b1, b2, br, m, k), B (b1, b2, br, k, n) and
    C (b1, b2, m, n); use_c. out is contiguous (B1, B2, M, N); the BR batch is summed.
    """
    B1, B2, BR, M, N, K = g[0], g[1], g[2], g[3], g[4], g[5]
    a1, a2, ar, am, ak = g[6], g[7], g[8], g[9], g[10]
    b1, b2, br, bk, bn = g[11], g[12], g[13], g[14], g[15]
    c1, c2, cm, cn, use_c = g[16], g[17], g[18], g[19], g[20]
    tm, tn, tk = min(TILE_M, M), min(TILE_N, N), min(TILE_K, K)  # small products: small tiles
    acc = np.empty((tm, tn), out.dtype)
    part = np.empty((tm, tn), out.dtype)
    ap = np.empty((tm, tk), out.dtype)
    bp = np.empty((tk, tn), out.dtype)
    for j1 in range(B1):
        for j2 in range(B2):
            for n0 in range(0, N, TILE_N):
                nt = min(TILE_N, N - n0)
                for i0 in range(0, M, TILE_M):
                    mb = min(TILE_M, M - i0)
                    for i in range(mb):
                        for nn in range(nt):
                            acc[i, nn] = 0
                    for jr in range(BR):
                        abase = j1 * a1 + j2 * a2 + jr * ar + i0 * am
                        bbase = j1 * b1 + j2 * b2 + jr * br + n0 * bn
                        for k0 in range(0, K, TILE_K):
                            kt = min(TILE_K, K - k0)
                            for kk in range(kt):  # stage both chunks, as DMA into SBUF
                                src = abase + (k0 + kk) * ak
                                for i in range(mb):
                                    ap[i, kk] = a[src + i * am]
                                src = bbase + (k0 + kk) * bk
                                for nn in range(nt):
                                    bp[kk, nn] = b[src + nn * bn]
                            _chunk(part, ap, bp, mb, kt, nt)
                            for i in range(mb):  # PSUM accumulates the chunk's partial sums
                                for nn in range(nt):
                                    acc[i, nn] += part[i, nn]
                    obase = ((j1 * B2 + j2) * M + i0) * N + n0
                    cbase = j1 * c1 + j2 * c2 + i0 * cm + n0 * cn
                    for i in range(mb):
                        for nn in range(nt):
                            v = alpha * acc[i, nn]
                            if use_c:
                                v += beta * c[cbase + i * cm + nn * cn]
                            out[obase + i * N + nn] = v


@njit(error_model="numpy", nogil=True)
def gemm_f32_kernel(out, a, b, c, g, alpha, beta):
    """fp32 gemm over flat arrays with element strides (layout of `g` as in gemm_kernel).

    Each K-chunk is staged row-major (as DMA into SBUF) and multiplied by BLAS sgemm
    (np.dot), whose micro-kernels sum the chunk in fp32 registers; the chunk sums are added
    in order into the fp32 accumulator, then alpha*acc + beta*C is formed once.
    """
    B1, B2, BR, M, N, K = g[0], g[1], g[2], g[3], g[4], g[5]
    a1, a2, ar, am, ak = g[6], g[7], g[8], g[9], g[10]
    b1, b2, br, bk, bn = g[11], g[12], g[13], g[14], g[15]
    c1, c2, cm, cn, use_c = g[16], g[17], g[18], g[19], g[20]
    uak, ubn, ucn = np.uint64(ak), np.uint64(bn), np.uint64(cn)
    acc = np.empty((M, N), np.float32)
    part = np.empty((M, N), np.float32)
    for j1 in range(B1):
        for j2 in range(B2):
            acc[:] = 0
            for jr in range(BR):
                abase = j1 * a1 + j2 * a2 + jr * ar
                bbase = j1 * b1 + j2 * b2 + jr * br
                for k0 in range(0, K, TILE_K):
                    kt = min(TILE_K, K - k0)
                    ap = np.empty((M, kt), np.float32)
                    bp = np.empty((kt, N), np.float32)
                    # offsets unsigned (strides are never negative): with signed ones Numba
                    # selects for negative wraparound and the copies stay scalar (3x slower)
                    for i in range(M):
                        src = np.uint64(abase + i * am + k0 * ak)
                        for kk in range(kt):
                            ap[i, kk] = a[src + np.uint64(kk) * uak]
                    for kk in range(kt):
                        src = np.uint64(bbase + (k0 + kk) * bk)
                        for nn in range(N):
                            bp[kk, nn] = b[src + np.uint64(nn) * ubn]
                    np.dot(ap, bp, part)
                    acc += part
            obase = (j1 * B2 + j2) * M * N
            cbase = j1 * c1 + j2 * c2
            for i in range(M):
                orow = np.uint64(obase + i * N)
                crow = np.uint64(cbase + i * cm)
                for nn in range(N):
                    v = alpha * acc[i, nn]
                    if use_c:
                        v += beta * c[crow + np.uint64(nn) * ucn]
                    out[orow + np.uint64(nn)] = v


def cpu_sgemm_is_fp32() -> bool:
    """Whether torch's CPU fp32 matmuls compute in fp32: not when `fp32_precision` (or the
    legacy `torch.set_float32_matmul_precision`) lets oneDNN use bf16 or tf32 inside them."""
    mkldnn = torch.backends.mkldnn
    return all(p in ("none", "ieee") for p in (torch.backends.fp32_precision,
                                               mkldnn.fp32_precision, mkldnn.matmul.fp32_precision))


def _blas_gemm(acc: np.ndarray, fa: np.ndarray, a_shape, a_strides, fb: np.ndarray, b_shape,
               b_strides, accumulate: bool = False) -> None:
    """acc (B1, B2, M, N) = sum over BR and K-chunks of A (B1, B2, BR, M, K) @ B (.., K, N).

    A and B are views (element strides, 0 broadcasts) of the flat fp32 arrays fa and fb.
    Each chunk is one BLAS sgemm through torch's CPU addmm_ (MKL), beta=1 into the
    accumulator: the micro-kernel sums the chunk's products in fp32 registers, then adds
    that sum to acc (tests/ops/test_matmul.py checks this order); over a batch, one bmm per
    chunk whose sums are then added (sdpa's 64 heads: 128 calls -> 2). torch multiplies
    strided chunks in place (no staging copies) and uses every core torch uses. With
    `accumulate` acc already holds a sum: the first chunk is added to it too.
    """
    B1, B2, BR, M, K = a_shape
    N, B = b_shape[-1], B1 * B2
    if B == 1:  # one product (summed over BR): 3-D views, 2-D chunks
        a = torch.from_numpy(fa).as_strided((BR, M, K), a_strides[2:])
        b = torch.from_numpy(fb).as_strided((BR, K, N), b_strides[2:])
        if BR * (K // TILE_K) >= 4 and M * N <= BATCHED_CHUNKS_MAX_OUTPUTS:
            _batched_chunks(acc.reshape(-1), a, b, not accumulate)
            return
        out = torch.from_numpy(acc).view(M, N)
        for jr in range(BR):
            for k0 in range(0, K, TILE_K):
                if jr == k0 == 0 and not accumulate:
                    torch.mm(a[0, :, :TILE_K], b[0, :TILE_K], out=out)
                else:
                    out.addmm_(a[jr, :, k0:k0 + TILE_K], b[jr, k0:k0 + TILE_K])
        return
    out, part = torch.from_numpy(acc).view(B, M, N), None
    if B1 == 1 or B2 == 1:  # one batch dim: 4-D views, strides kept (broadcasts too)
        j = 1 if B1 == 1 else 0
        a = torch.from_numpy(fa).as_strided((B, BR, M, K), (a_strides[j], *a_strides[2:]))
        b = torch.from_numpy(fb).as_strided((B, BR, K, N), (b_strides[j], *b_strides[2:]))

        def chunk(jr, k0):
            return a[:, jr, :, k0:k0 + TILE_K], b[:, jr, k0:k0 + TILE_K]
    else:  # (chunks reshaped one by one: a copy where the batch dims don't merge)
        a5 = torch.from_numpy(fa).as_strided(a_shape, a_strides)
        b5 = torch.from_numpy(fb).as_strided(b_shape, b_strides)

        def chunk(jr, k0):
            return (a5[:, :, jr, :, k0:k0 + TILE_K].reshape(B, M, -1),
                    b5[:, :, jr, k0:k0 + TILE_K].reshape(B, -1, N))
    for jr in range(BR):  # chunk by chunk, one bmm each (bmm has no beta: the chunk sums,
        for k0 in range(0, K, TILE_K):  # then one fp32 add each, in order)
            x, y = chunk(jr, k0)
            if jr == k0 == 0 and not accumulate:
                torch.bmm(x, y, out=out)
            else:
                part = torch.bmm(x, y) if part is None else torch.bmm(x, y, out=part)
                out.add_(part)


# Note [Batched chunks]
# A product with a small output and a long K (a small layer's weight gradient over many
# tokens) is many small chunk products, one addmm_ each, whose call costs more than its
# arithmetic. Multiplied as one bmm over the chunks, the chunk sums land side by side and a
# loop adds them to the accumulator in order: the same sums, added in the same order (the
# first one assigned, as mm(out=) does). 16 x 65536 @ 65536 x 16: 6.2 -> 0.6 ms; 64 x 64
# outputs over the same K: 14 -> 6.5 ms; from 128 x 128 outputs on the two take the same time
# (larger ones were slower batched). Partial sums are held for BATCHED_CHUNKS_BYTES at most.
BATCHED_CHUNKS_MAX_OUTPUTS = 128 * 128
BATCHED_CHUNKS_BYTES = 16 << 20


@njit(error_model="numpy", nogil=True)
def _add_in_order(acc, parts, first):
    """acc = parts[0] (when first) or acc + parts[0], then + parts[1], ... in fp32."""
    start = 0
    if first:
        for j in range(acc.size):
            acc[j] = parts[0, j]
        start = 1
    for i in range(start, parts.shape[0]):
        for j in range(acc.size):
            acc[j] += parts[i, j]


def _batched_chunks(acc: np.ndarray, a: torch.Tensor, b: torch.Tensor,
                    first: bool) -> None:
    """acc (M*N,) = the sum over BR and K-chunks of a (BR, M, K) @ b (BR, K, N), chunk by
    chunk in order (Note [Batched chunks]); the first chunk assigned, unless not `first`:
    then added to what acc holds."""
    BR, M, K = a.shape
    N = b.shape[-1]
    whole = K // TILE_K * TILE_K
    group = max(1, BATCHED_CHUNKS_BYTES // (4 * M * N))
    for jr in range(BR):
        for k0 in range(0, whole, group * TILE_K):
            k1 = min(k0 + group * TILE_K, whole)
            n = (k1 - k0) // TILE_K
            x = a[jr, :, k0:k1].reshape(M, n, TILE_K).transpose(0, 1)
            y = b[jr, k0:k1].reshape(n, TILE_K, N)
            _add_in_order(acc, torch.bmm(x, y).numpy().reshape(n, M * N), first)
            first = False
        if whole < K:
            part = torch.mm(a[jr, :, whole:], b[jr, whole:]).numpy().reshape(1, M * N)
            _add_in_order(acc, part, first)
            first = False


def _strided(flat_values: np.ndarray, shape, strides) -> np.ndarray:
    """A read-only view (np.ndarray directly: stride_tricks.as_strided costs ~8 us a call)."""
    item = flat_values.itemsize
    view = np.ndarray(shape, flat_values.dtype, flat_values, 0, [s * item for s in strides])
    view.flags.writeable = False
    return view


def blas_path(dims, kind) -> bool:
    """Whether gemm_values computes a product of these dims in `kind` by MKL's sgemm chunk by
    chunk (through torch). Large products do: no staging copies and no extra pass over the
    accumulator. Unless torch's fp32 matmuls may use bf16/tf32: then the Numba kernel's
    OpenBLAS (np.dot) computes the chunks."""
    B1, B2, BR, M, N, K = dims
    work = M * N * K * B1 * B2  # (_blas_gemm multiplies a batch's chunks in one bmm each)
    return (kind is np.float32 and work >= BLAS_MIN_WORK and M > 1 and N > 1
            and cpu_sgemm_is_fp32())


def gemm_values(res: np.ndarray, dims, fa, a_strides, fb, b_strides, fc=None,
                c_strides=(0, 0, 0, 0), alpha=1, beta=0, accumulate=False) -> np.ndarray:
    """The kernel on staged compute arrays: res (contiguous B1*B2*M*N) = beta*C + alpha*A@B.

    dims = (B1, B2, BR, M, N, K); strides are in elements (0 broadcasts); BR is summed.
    With `accumulate` (where blas_path holds; no C, alpha 1) res holds a running sum that the
    chunks are added to, as the next chunks of one product: a long K in parts.
    """
    use_c = int(fc is not None and beta != 0)  # beta == 0 ignores C, NaN included (PyTorch)
    B1, B2, BR, M, N, K = dims
    kind = res.dtype.type
    blas = blas_path(dims, kind)
    if accumulate and not (blas and alpha == 1 and not use_c):
        raise ValueError("gemm_values: accumulate needs the sgemm path, alpha 1 and no C")
    if res.size and blas:
        out = res.reshape(B1, B2, M, N)
        _blas_gemm(out, fa.astype(kind, copy=False), (B1, B2, BR, M, K), a_strides,
                   fb.astype(kind, copy=False), (B1, B2, BR, K, N), b_strides, accumulate)
        if alpha != 1:
            out *= kind(alpha)
        if use_c:
            bias = _strided(fc.astype(kind, copy=False), (B1, B2, M, N), c_strides)
            out += bias if beta == 1 else kind(beta) * bias  # (1 * C is C: no scaled copy)
    elif res.size:
        g = np.array([*dims, *a_strides, *b_strides,
                      *(c_strides if use_c else (0, 0, 0, 0)), use_c], np.int64)
        kernel = gemm_f32_kernel if kind is np.float32 else gemm_kernel
        # (np.dot in the fp32 kernel: Note [One BLAS thread] in ops/blas_threads.py)
        previous = blas_threads.limit(1) if kind is np.float32 else None
        try:
            kernel(res, fa.astype(kind, copy=False), fb.astype(kind, copy=False),
                   (fc if use_c else fa).astype(kind, copy=False), g, kind(alpha), kind(beta))
        finally:
            blas_threads.restore(previous)
    stats["launches"] += 1
    return res


# Note [bf16 GEMM]
# With config.bf16_gemm = "cpu" (environment NEURON_EAGER_BF16_GEMM=cpu), large bf16
# products (no C, alpha 1, round-to-nearest-even output) call torch's CPU bf16 GEMM on the
# operands' own bytes: oneDNN's bf16 kernels form the exact products, sum them in fp32 and
# round once to bf16. That is Note [PSUM accumulation] but for two things: the fp32 sum runs
# over the whole K in the micro-kernel's order instead of chunk by chunk, and AVX512-BF16
# dot products and AMX flush subnormal products to zero. On normal random data 1 to 3 in
# 10,000 results then differ in the last bit from the default "psum" path; on this AMX VM
# it is ~1.6x faster than "psum" (which runs MKL's bf16 GEMM per K-chunk: Note [bf16 chunks
# on MKL]) for 1024^3 (benchmarks/large_kernels.py). A probe checks, once per oneDNN
# setting, that the sums really are fp32 (a row of 1 and 1023 x 2^-9 against ones gives 3.0
# in fp32 and stays 1.0 summed in bf16), with plain and transposed operands; else "psum".
_bf16_gemm_sums_fp32: dict = {}


def _cpu_bf16_gemm_sums_fp32() -> bool:
    key = torch.backends.mkldnn.enabled
    ok = _bf16_gemm_sums_fp32.get(key)
    if ok is None:
        x = torch.full((128, 1024), 2.0 ** -9, dtype=torch.bfloat16)
        x[:, 0] = 1
        y = torch.ones(1024, 128, dtype=torch.bfloat16)
        ok = all(bool((torch.mm(p, q) == 3).all())
                 for p, q in ((x, y), (x.t().contiguous().t(), y), (x, y.t().contiguous().t())))
        _bf16_gemm_sums_fp32[key] = ok
    return ok


def _bf16_blas_gemm(out: NeuronTensor, dims, a: NeuronTensor, a_strides, b: NeuronTensor,
                    b_strides, use_c: bool, alpha) -> bool:
    """out = A @ B through torch's CPU bf16 GEMM (Note [bf16 GEMM]); False where it may not."""
    B1, B2, BR, M, N, K = dims
    if not (config.bf16_gemm == "cpu" and not use_c and alpha == 1
            and a.dtype == b.dtype == out.dtype == torch.bfloat16
            and BR == 1 and M > 1 and N > 1 and M * N * K >= BLAS_MIN_WORK
            and not config.stochastic_rounding
            and _cpu_bf16_gemm_sums_fp32()):
        return False
    fa = torch.from_numpy(flat(a)).view(torch.bfloat16).as_strided((B1, B2, M, K),
                                                                    a_strides[:2] + a_strides[3:])
    fb = torch.from_numpy(flat(b)).view(torch.bfloat16).as_strided((B1, B2, K, N),
                                                                    b_strides[:2] + b_strides[3:])
    res = T.cpu_alias(out).view(B1, B2, M, N)
    for j1 in range(B1):
        if B2 > 1:
            torch.bmm(fa[j1], fb[j1], out=res[j1])
        else:
            torch.mm(fa[j1, 0], fb[j1, 0], out=res[j1, 0])
    stats["launches"] += 1
    return True


def _bf16_chunks(out: NeuronTensor, dims, a: NeuronTensor, a_strides, b: NeuronTensor,
                 b_strides, fc, c_strides, alpha, beta) -> bool:
    """out = beta*C + alpha*A@B with bf16 K-chunks on MKL (Note [bf16 chunks on MKL]), rounded
    in the kernel unless stochastically; False where that path may not compute it. fp32
    operands that config.auto_cast "matmult" rounds to bf16 are rounded to their bits."""
    if out.dtype not in (torch.bfloat16, torch.float32) or not bf16_chunks.suits(dims):
        return False
    if a.dtype == b.dtype == torch.bfloat16:
        fa, fb = flat(a), flat(b)
    elif a.dtype == b.dtype == torch.float32 and \
            numerics.load_code(torch.float32, "matmult") == "f32>bf16":
        fa, fb = bf16_chunks.rounded_bits(flat(a)), bf16_chunks.rounded_bits(flat(b))
    else:
        return False
    rounded_here = out.dtype == torch.bfloat16 and not config.stochastic_rounding
    res = None if rounded_here else result_buffer(out)  # fp32 out itself, or to round later
    if not bf16_chunks.products(out._nd.reshape(-1) if rounded_here else None, res, dims,
                                fa, a_strides, fb, b_strides, fc, c_strides, alpha, beta):
        return False
    if res is not None:
        narrow_into(out, res)
    stats["launches"] += 1
    return True


def gemm(out: NeuronTensor, dims, a: NeuronTensor, a_strides, b: NeuronTensor, b_strides,
         c: NeuronTensor | None = None, c_strides=(0, 0, 0, 0), alpha=1,
         beta=0) -> NeuronTensor:
    """out[j1, j2] = beta*C + alpha * sum_jr A[j1, j2, jr] @ B[j1, j2, jr], rounded once.

    dims = (B1, B2, BR, M, N, K); strides are in elements of each operand's storage
    (0 broadcasts). `out` is contiguous with B1*B2*M*N elements, of any shape.
    """
    if out.numel() == 0:
        return out
    use_c = c is not None and beta != 0
    if not _bf16_blas_gemm(out, dims, a, a_strides, b, b_strides, use_c, alpha):
        fc = widen(c) if use_c else None
        if not _bf16_chunks(out, dims, a, a_strides, b, b_strides, fc, c_strides, alpha, beta):
            res = gemm_values(result_buffer(out), dims, widen(a, True), a_strides,
                              widen(b, True), b_strides, fc, c_strides, alpha, beta)
            narrow_into(out, res)
    moved = out._nd.nbytes + sum(x._nd.nbytes for x in (a, b, c)[:2 + use_c])
    B1, B2, BR, M, N, K = dims
    core.launch("tensor", B1 * B2 * BR * M * N * K, moved, matmul=(B1 * B2 * BR, M, K, N),
                dtype=rate(a.dtype))
    return out


_RATES = {torch.float32: "fp32", torch.float64: "fp32", torch.bfloat16: "bf16",
          torch.float16: "fp16"}


def rate(dtype: torch.dtype) -> str:
    """The Tensor engine's input type for the cost model ("fp32" runs at a quarter rate)."""
    return _RATES.get(dtype, "int")


# -- checks ----------------------------------------------------------------------------------
def raise_like_cpu(op, *args, **kwargs):
    """Raise the error the CPU raises for these arguments (run on stand-ins without memory:
    Note [Errors in the CPU's words] in ops/meta.py)."""
    in_cpu_words(op, args, kwargs)
    raise RuntimeError(f"{op}: these arguments are not supported on neuron")


def meta_check(op, args):
    """Run `op` on meta copies of `args`: the output metadata (shared between calls with the
    same signature: read it, never write it), or the CPU's error for bad arguments. None
    when the op has no meta kernel (the kernel's own checks must do). Cached: bilinear
    upsampling's meta kernel is PyTorch's Python decomposition, ~36 ms a call here."""
    try:
        return meta_outputs(op, args)
    except NotImplementedError:
        return None
    except (RuntimeError, ValueError, IndexError):
        raise_like_cpu(op, *args)


def _ok(*tensors, dims) -> bool:
    dtype = tensors[0].dtype
    return all(isinstance(t, NeuronTensor) and t.dtype == dtype and t.dim() == d
               for t, d in zip(tensors, dims)) and dtype != torch.bool


def _c_strides(op, c, shape, args, beta, alpha, out_dtype=None) -> tuple:
    """Strides that broadcast C to `shape`, padded to 4 (the CPU's error if it can't); beta
    and alpha must fit the compute type, as the CPU converts them."""
    numerics.check_fits_compute(beta, args[0].dtype)
    numerics.check_fits_compute(alpha, args[0].dtype)
    ok = isinstance(c, NeuronTensor) and c.dim() <= len(shape) and \
        c.dtype in (args[0].dtype, out_dtype)
    strides = [0] * (len(shape) - c.dim())
    if ok:
        for n, size, st in zip(shape[len(strides):], c.shape, c.stride()):
            ok = ok and size in (n, 1)
            strides.append(st if size == n else 0)
    if not ok:
        raise_like_cpu(op, c, *args, beta=beta, alpha=alpha)
    return (0,) * (4 - len(strides)) + tuple(strides)


# -- ops -------------------------------------------------------------------------------------
def _result_dtype(a, out_dtype) -> torch.dtype:
    """The product's dtype: the inputs', or `out_dtype` of the `.dtype` overloads (Note [PSUM
    out_dtype])."""
    if out_dtype is None or out_dtype == a.dtype:
        return a.dtype
    if out_dtype == torch.float32 and a.dtype in (torch.bfloat16, torch.float16):
        return out_dtype
    raise RuntimeError("out_dtype must be the same as input dtype or fp32 for fp16/bf16 inputs")


# Note [PSUM out_dtype]
# mm/bmm/addmm/baddbmm(..., out_dtype=torch.float32) on bf16/fp16 inputs return the fp32
# accumulator itself, not rounded to the inputs' dtype: what the Tensor engine leaves in
# PSUM. torch's CPU has no kernel for these overloads (CUDA does); the dtype rules are
# its meta kernels'. A bias C may be in the inputs' dtype or in out_dtype.
def _mm(op, a, b, c=None, beta=1, alpha=1, out_dtype=None):
    if not (_ok(a, b, dims=(2, 2)) and a.shape[1] == b.shape[0]):
        raise_like_cpu(op, *((c,) if c is not None else ()), a, b)
    dtype = _result_dtype(a, out_dtype)
    (M, K), N = a.shape, b.shape[1]
    cs = _c_strides(op, c, (M, N), (a, b), beta, alpha, dtype) if c is not None \
        else (0, 0, 0, 0)
    sa, sb = a.stride(), b.stride()
    return gemm(T.empty((M, N), dtype), (1, 1, 1, M, N, K), a, (0, 0, 0, *sa), b,
                (0, 0, 0, *sb), c, cs, alpha, beta if c is not None else 0)


@register(aten.mm.default)
def mm(a, b):
    return _mm(aten.mm.default, a, b)


@register(aten.mm.dtype)
def mm_dtype(a, b, out_dtype):
    return _mm(aten.mm.dtype, a, b, out_dtype=out_dtype)


@register(aten.addmm.default)
def addmm(c, a, b, *, beta=1, alpha=1):
    return _mm(aten.addmm.default, a, b, c, beta, alpha)


@register(aten.addmm.dtype)
def addmm_dtype(c, a, b, out_dtype, *, beta=1, alpha=1):
    return _mm(aten.addmm.dtype, a, b, c, beta, alpha, out_dtype)


def _bmm(op, a, b, c=None, beta=1, alpha=1, reduce=False, out_dtype=None):
    if not (_ok(a, b, dims=(3, 3)) and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1]):
        raise_like_cpu(op, *((c,) if c is not None else ()), a, b)
    dtype = _result_dtype(a, out_dtype)
    (Bt, M, K), N = a.shape, b.shape[2]
    shape = (M, N) if reduce else (Bt, M, N)
    cs = _c_strides(op, c, shape, (a, b), beta, alpha, dtype) if c is not None \
        else (0, 0, 0, 0)
    (s0, *sa), (t0, *sb) = a.stride(), b.stride()
    # addbmm sums over the batch (the BR axis of the kernel); bmm keeps it (the B2 axis)
    dims, ast, bst = ((1, 1, Bt, M, N, K), (0, 0, s0, *sa), (0, 0, t0, *sb)) if reduce else \
        ((1, Bt, 1, M, N, K), (0, s0, 0, *sa), (0, t0, 0, *sb))
    return gemm(T.empty(shape, dtype), dims, a, ast, b, bst, c, cs, alpha,
                beta if c is not None else 0)


@register(aten.bmm.default)
def bmm(a, b):
    return _bmm(aten.bmm.default, a, b)


@register(aten.bmm.dtype)
def bmm_dtype(a, b, out_dtype):
    return _bmm(aten.bmm.dtype, a, b, out_dtype=out_dtype)


@register(aten.baddbmm.default)
def baddbmm(c, a, b, *, beta=1, alpha=1):
    return _bmm(aten.baddbmm.default, a, b, c, beta, alpha)


@register(aten.baddbmm.dtype)
def baddbmm_dtype(c, a, b, out_dtype, *, beta=1, alpha=1):
    return _bmm(aten.baddbmm.dtype, a, b, c, beta, alpha, out_dtype=out_dtype)


@register(aten.addbmm.default)
def addbmm(c, a, b, *, beta=1, alpha=1):
    return _bmm(aten.addbmm.default, a, b, c, beta, alpha, reduce=True)


def _mv(op, a, x, c=None, beta=1, alpha=1):
    # Computed as x^T @ A^T (1 x K times K x M) so the long axis is the vectorised one.
    if not (_ok(a, x, dims=(2, 1)) and a.shape[1] == x.shape[0]):
        raise_like_cpu(op, *((c,) if c is not None else ()), a, x)
    M, K = a.shape
    cs = _c_strides(op, c, (1, M), (a, x), beta, alpha) if c is not None else (0, 0, 0, 0)
    sa = a.stride()
    return gemm(T.empty((M,), a.dtype), (1, 1, 1, 1, M, K), x, (0, 0, 0, 0, x.stride(0)), a,
                (0, 0, 0, sa[1], sa[0]), c, cs, alpha, beta if c is not None else 0)


@register(aten.mv.default)
def mv(a, x):
    return _mv(aten.mv.default, a, x)


@register(aten.addmv.default)
def addmv(c, a, x, *, beta=1, alpha=1):
    return _mv(aten.addmv.default, a, x, c, beta, alpha)


@register(aten.dot.default, aten.vdot.default)  # vdot conjugates: the same for real dtypes
def dot(x, y):
    if not (_ok(x, y, dims=(1, 1)) and x.shape[0] == y.shape[0]):
        raise_like_cpu(aten.dot.default, x, y)
    return gemm(T.empty((), x.dtype), (1, 1, 1, 1, 1, x.shape[0]), x, (0, 0, 0, 0, x.stride(0)),
                y, (0, 0, 0, y.stride(0), 0))
