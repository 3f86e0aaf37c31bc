"""bf16 products on MKL's bf16 GEMM, one K-chunk at a time (Note [bf16 chunks on MKL]).

`products(out16, out32, dims, a, a_strides, b, b_strides, c, c_strides, alpha, beta)`
computes a bf16 product the way Note [PSUM accumulation] in ops/matmul.py describes, or
returns False where it may not (no MKL or no bf16 units, a layout BLAS cannot read in place,
values that could be subnormal or overflow): then matmul's fp32 path computes. `plan` and
`run` are its two halves, for callers that stage an operand (convolution's columns).
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.ops import workers
from neuron_eager.ops._compat import torch_cpu_address
from neuron_eager.ops.jit import fetch_add, native_call, njit
from neuron_eager.ops.numerics import f32_to_bf16

# Note [bf16 chunks on MKL]
# MKL, linked into torch's CPU library on x86-64, exports cblas_gemm_bf16bf16f32: bf16
# operands, exact fp32 products, fp32 sums, C = alpha*A@B + beta*C. On a CPU with AVX512-BF16
# or AMX it runs on the bf16 dot-product units, where the default path widens the operands to
# fp32 for sgemm (1024^3: ~3 ms against ~9 ms; torch's own bf16 matmul, which sums the whole
# K at once, ~1.8 ms). It is called once per 128-deep K-chunk, beta=1 into the accumulator:
# - alpha is SCALE = 2, not 1. With alpha = 1 MKL adds parts of a chunk to C as it goes, not
#   the chunk's sum (332 of 336 shapes tried); with alpha != 1 it sums the chunk, scales and
#   adds (all 336). Doubling is exact, and rounding commutes with it, so the accumulator
#   holds exactly twice the PSUM sums; the epilogue halves it. A probe checks this once per
#   process (`chunk_sums_are_added`), and the exact-chunk operands of tests/ops/test_matmul.py
#   check it bit for bit.
# - The units flush subnormal inputs and results to zero (DAZ/FTZ), which the PSUM path does
#   not. So the path is taken only where nothing can be subnormal: no operand is, and the
#   smallest nonzero magnitudes multiply to at least 2^-103 (biased exponents ea + eb >= 151).
#   Then every product is a multiple of 2^-126 and so is every partial sum (rounding above
#   2^-103 keeps that; below, sums of such multiples are exact): each is zero or normal. The
#   largest magnitudes must leave room for the doubling (no overflow that PSUM would not
#   have). One scan of the operands' exponents decides (~35 us per 1024 x 1024 operand).
# - Each core claims whole output blocks (up to BLOCK_M rows and BLOCK elements: an fp32
#   accumulator of 512 KB that stays in its L2; a product of few rows takes wider blocks,
#   so fewer calls) and runs a block's chunks with MKL on one thread, then forms
#   alpha*acc + beta*C in fp32 and rounds once into the output while the block is in cache.
#   Calling MKL per chunk on the whole output instead reads and writes all of it per chunk.
#   The calls are made from a Numba loop (Note [Native calls by symbol] in ops/jit.py).
BLOCK_M, BLOCK = 256, 256 * 512  # rows, elements (fewer rows: wider blocks, fewer calls)
CHUNK = 128  # = matmul.TILE_K, the PE array's contraction depth
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
MIN_OUTPUTS, MIN_DEPTH = 64 * 64, 64
SCALE = 2.0  # MKL's alpha: see the Note
MIN_EXPONENT_SUM = 151  # 2^(ea-127) * 2^(eb-127) >= 2^-103
MAX_EXPONENT_SUM = 377  # SCALE * K * 2^(ea-126) * 2^(eb-126) <= 2^127: no overflow

_gemm_address = torch_cpu_address("cblas_gemm_bf16bf16f32")
_threads_address = torch_cpu_address("MKL_Set_Num_Threads_Local")  # by value
_has_bf16_units = any(getattr(torch.cpu, name, lambda: False)()
                      for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
AVAILABLE = bool(_gemm_address and _threads_address and _has_bf16_units)
if AVAILABLE:
    _gemm = native_call("neuron_eager_cblas_gemm_bf16bf16f32", _gemm_address, 14, floats=(6, 11))
    _mkl_threads_local = native_call("neuron_eager_mkl_set_num_threads_local",
                                     _threads_address, 1)


@njit(nogil=True)
def exponent_range(u):
    """The smallest biased exponent among the nonzero bf16 values whose bits are `u`
    (uint16; 0 for a subnormal, 256 when all are zero) and the largest (0 when all are)."""
    low, high = np.uint16(0xFFFF), np.uint16(0)
    for i in range(u.shape[0]):
        twice = np.uint16(u[i] << np.uint16(1))  # twice the magnitude: the sign shifted out
        x = np.uint16(twice - np.uint16(2))  # zeros wrap to the top
        if x < low:
            low = x
        if twice > high:
            high = twice
    return (np.int64(low) + 2) >> 8, np.int64(high) >> 8


@njit(nogil=True)
def _blocks(lo, hi, next_item, out16, out32, a, b, c, g, alpha, beta):
    """Output blocks (B1*B2 products of M x N in g[26] x g[27] blocks, row-major order)
    claimed one at a time from next_item[0] until all are taken, by every thread that runs
    this (lo and hi, split_rows' share, are not used: a core that got less CPU time then
    takes fewer blocks). Each block's K-chunks are summed in order into an fp32 block by MKL
    on this thread alone, then alpha*acc + beta*C is formed in fp32 and stored once, rounded
    to bf16 into out16 or as fp32 into out32 (g[25])."""
    B2, BR, M, N, K = g[1], g[2], g[3], g[4], g[5]
    a1, a2, ar, am, ak = g[6], g[7], g[8], g[9], g[10]
    b1, b2, br, bk, bn = g[11], g[12], g[13], g[14], g[15]
    ta, lda, tb, ldb = g[16], g[17], g[18], g[19]
    c1, c2, cm, cn, use_c, to_f32 = g[20], g[21], g[22], g[23], g[24], g[25]
    rows, cols = g[26], g[27]  # of a block
    row_blocks, col_blocks = (M + rows - 1) // rows, (N + cols - 1) // cols
    pa, pb = np.int64(a.ctypes.data), np.int64(b.ctypes.data)
    acc = np.empty((rows, cols), np.float32)
    pacc = np.int64(acc.ctypes.data)
    _mkl_threads_local(1)
    items = g[0] * B2 * row_blocks * col_blocks
    while True:
        item = fetch_add(next_item, 1)
        if item >= items:
            break
        j, block = item // (row_blocks * col_blocks), item % (row_blocks * col_blocks)
        j1, j2 = j // B2, j % B2
        m0, n0 = (block // col_blocks) * rows, (block % col_blocks) * cols
        mb, nb = min(rows, M - m0), min(cols, N - n0)
        beta_acc = np.float32(0)
        for jr in range(BR):
            a0 = j1 * a1 + j2 * a2 + jr * ar + m0 * am
            b0 = j1 * b1 + j2 * b2 + jr * br + n0 * bn
            for k0 in range(0, K, CHUNK):
                _gemm(ROW_MAJOR, ta, tb, mb, nb, min(CHUNK, K - k0), np.float32(SCALE),
                      pa + 2 * (a0 + k0 * ak), lda, pb + 2 * (b0 + k0 * bk), ldb, beta_acc,
                      pacc, cols)
                beta_acc = np.float32(1)
        for i in range(mb):  # one loop per case: a test inside would stop vectorization
            row = acc[i, :nb]
            if alpha != 1:
                for n in range(nb):
                    row[n] = alpha * (row[n] * np.float32(1 / SCALE))
            else:
                for n in range(nb):
                    row[n] *= np.float32(1 / SCALE)
            if use_c:  # slices, not computed indices: those stay scalar (negative wraparound)
                crow = j1 * c1 + j2 * c2 + (m0 + i) * cm + n0 * cn
                if cn == 0:
                    add = beta * c[crow]
                    for n in range(nb):
                        row[n] += add
                else:
                    crow_values = c[crow:crow + (nb - 1) * cn + 1:cn]
                    for n in range(nb):
                        row[n] += beta * crow_values[n]
            o = (j * M + m0 + i) * N + n0
            if to_f32:
                out32[o:o + nb] = row
            else:
                dst = out16[o:o + nb]
                for n in range(nb):
                    dst[n] = f32_to_bf16(row[n])
    _mkl_threads_local(0)  # back to the global setting


@njit(nogil=True)
def _round_to_bf16(dst, src):
    for i in range(src.shape[0]):
        dst[i] = f32_to_bf16(src[i])


def rounded_bits(values: np.ndarray) -> np.ndarray:
    """fp32 values rounded to bf16 (to nearest even, as auto-cast rounds them): the bits."""
    bits = np.empty(values.shape[0], np.uint16)
    if values.shape[0] >= workers.SPLIT_MIN:
        workers.split_call(_round_to_bf16, bits, [values])
    else:
        _round_to_bf16(bits, values)
    return bits


def _layout(row_stride: int, col_stride: int, rows: int, cols: int):
    """(transpose flag, leading dimension) for a row-major BLAS read of a rows x cols view
    with these element strides, or None where BLAS cannot read it in place."""
    if col_stride == 1 and row_stride >= cols:
        return NO_TRANS, row_stride
    if row_stride == 1 and col_stride >= rows:
        return TRANS, col_stride
    return None


def suits(dims) -> bool:
    """Whether a product of these dims (as in matmul.gemm) is worth this path, here: below
    about 64 x 64 outputs or 64 deep a call costs more than it saves (a first convolution
    layer, 3 channels x 3 x 3 taps, ran 1.2x slower than on the fp32 path)."""
    _, _, BR, M, N, K = dims
    return AVAILABLE and M * N >= MIN_OUTPUTS and K * BR >= MIN_DEPTH


def plan(dims, a_strides, b_strides, a_values: np.ndarray, b_values: np.ndarray):
    """The BLAS layouts of A and B for `run`, or None where this path may not compute the
    product: dims and element strides as in matmul.gemm; a_values and b_values hold the bits
    (uint16) of every value A and B contain (the operands' own memory, or what they are
    staged from), whose exponents must rule out subnormals and overflow (the Note)."""
    _, _, BR, M, N, K = dims
    if not (suits(dims) and chunk_sums_are_added()):
        return None
    la = _layout(a_strides[3], a_strides[4], M, K)
    lb = _layout(b_strides[3], b_strides[4], K, N)
    if la is None or lb is None:
        return None
    (a_low, a_high), (b_low, b_high) = exponent_range(a_values), exponent_range(b_values)
    if (min(a_low, b_low) < 1 or a_low + b_low < MIN_EXPONENT_SUM
            or a_high + b_high + (K * BR).bit_length() > MAX_EXPONENT_SUM):
        return None
    return (*la, *lb)


def run(layouts, out16: np.ndarray | None, out32: np.ndarray | None, dims, a: np.ndarray,
        a_strides, b: np.ndarray, b_strides, c: np.ndarray | None = None,
        c_strides=(0, 0, 0, 0), alpha=1, beta=0) -> None:
    """beta*C + alpha * (sum over BR and K-chunks of A @ B), rounded once to bf16 into out16
    (contiguous, B1*B2*M*N) or, where out16 is None, stored as fp32 into out32. `a` and `b`
    are the bf16 operands' bits (uint16, from their first element), `c` fp32 values;
    `layouts` from `plan`."""
    B1, B2, _, M, N, _ = dims
    bm = min(M, BLOCK_M)
    bn = min(N, BLOCK // bm)
    g = np.array([*dims, *a_strides, *b_strides, *layouts, *c_strides, c is not None,
                  out16 is None, bm, bn], np.int64)
    args = [_EMPTY16 if out16 is None else out16, _EMPTY32 if out32 is None else out32, a, b,
            _EMPTY32 if c is None else c, g, np.float32(alpha), np.float32(beta)]
    if B1 * B2 * -(-M // bm) * -(-N // bn) > 1:
        workers.split_rows(_blocks, workers.COUNT, [np.zeros(1, np.int64), *args])
    else:
        _blocks(0, 1, np.zeros(1, np.int64), *args)


def products(out16: np.ndarray | None, out32: np.ndarray | None, dims, a: np.ndarray,
             a_strides, b: np.ndarray, b_strides, c: np.ndarray | None = None,
             c_strides=(0, 0, 0, 0), alpha=1, beta=0) -> bool:
    """`run` on operands that are their own memory, where `plan` allows; else False, with
    nothing written."""
    layouts = plan(dims, a_strides, b_strides, a, b)
    if layouts is None:
        return False
    run(layouts, out16, out32, dims, a, a_strides, b, b_strides, c, c_strides, alpha, beta)
    return True


_EMPTY16, _EMPTY32 = np.empty(0, np.uint16), np.empty(0, np.float32)
_probed: list = []


def chunk_sums_are_added() -> bool:
    """Whether MKL, with alpha != 1, sums each chunk before adding it to C (once per process).
    Rows of 2^24 in the first chunk and 1 at both ends of the second, against ones: 2^24 + 2
    when the chunk is summed first, 2^24 when its parts are added to the accumulator one at a
    time (2^24 + 1 is a tie, rounded to even). With alpha = 1 MKL adds parts of a chunk."""
    if not _probed:
        n = 32
        a = np.zeros((n, 256), np.float32)
        a[:, 0], a[:, 128], a[:, 255] = 2.0 ** 24, 1, 1
        bits = lambda x: (x.view(np.uint32) >> 16).astype(np.uint16).reshape(-1)  # exact
        out = np.zeros(n * n, np.float32)
        run((NO_TRANS, 256, NO_TRANS, n), None, out, (1, 1, 1, n, n, 256), bits(a),
            (0, 0, 0, 256, 1), bits(np.ones((256, n), np.float32)), (0, 0, 0, n, 1))
        _probed.append(bool((out == 2.0 ** 24 + 2).all()))
    return _probed[0]
