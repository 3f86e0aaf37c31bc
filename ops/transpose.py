"""Copies of strided tensors into contiguous ones: transposed matrices tile by tile (what
`.t().contiguous()` runs), other layouts run by run (`permute(0, 2, 1, 3).contiguous()`).

Note [Tiled transposes]: copying a transposed matrix into rows reads it a column at a time,
every element from another cache line (NumPy's copy: 3.4 ms for 1024 x 1024 fp32 here).
Tiles keep the lines a tile reads cached until it is done, but square 32 x 32 tiles of a
matrix whose rows are 4 KB apart put all 32 lines in one L1 set (8 ways): they evicted
each other, 2.9 ms on one core. A tile of ROWS output rows by COLS (8) columns reads 8
source lines, each for ROWS consecutive outputs: 0.51 ms. Offsets are unsigned, so no
negative-index wraparound is computed per element.
"""
from __future__ import annotations

import numpy as np

from neuron_eager.ops import kernelgen, workers
from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit

ROWS, COLS = 64, 8  # output rows, columns of a tile (Note [Tiled transposes])
MIN_ELEMENTS = 1 << 16  # below, the cache holds the whole matrix: NumPy's copy is as fast


@njit(**kernelgen.JIT_OPTIONS)
def _copy_tiles(lo, hi, dst, src, rows, cols, row_stride, col_stride):
    """dst[i * cols + j] = src[i * row_stride + j * col_stride] for the rows of tiles lo..hi-1
    (ROWS rows each)."""
    u_cols, u_rs, u_cs = np.uint64(cols), np.uint64(row_stride), np.uint64(col_stride)
    for t in range(lo, hi):
        i_end = min((t + 1) * ROWS, rows)
        for j0 in range(0, cols, COLS):
            j_end = min(j0 + COLS, cols)
            for i in range(t * ROWS, i_end):
                d, s = np.uint64(i) * u_cols, np.uint64(i) * u_rs
                for j in range(j0, j_end):
                    dst[d + np.uint64(j)] = src[s + np.uint64(j) * u_cs]


# Note [Strided copies]
# A copy of a permuted tensor whose last dim stays in place (attention's head transposes)
# is a run of contiguous elements per outer position. NumPy's strided copy took 0.68 ms for
# 1M fp32 elements in runs of 64, on one core; a loop per run with unsigned offsets, a share
# of the runs per core, takes 0.26 ms.
@njit(**kernelgen.JIT_OPTIONS)
def _copy_runs(lo, hi, dst, src, shape, dst_strides, src_strides):
    """dst[i . dst_strides] = src[i . src_strides] over the 4-D index i, for the runs (the
    first three dims merged) lo..hi-1."""
    d1, d2, n = shape[1], shape[2], shape[3]
    ds, ss = dst_strides, src_strides
    u_ds, u_ss = np.uint64(ds[3]), np.uint64(ss[3])
    for r in range(lo, hi):
        i0, i1, i2 = r // (d1 * d2), (r // d2) % d1, r % d2
        d = np.uint64(i0 * ds[0] + i1 * ds[1] + i2 * ds[2])
        s = np.uint64(i0 * ss[0] + i1 * ss[1] + i2 * ss[2])
        if ds[3] == 1 and ss[3] == 1:
            for j in range(n):
                dst[d + np.uint64(j)] = src[s + np.uint64(j)]
        else:
            for j in range(n):
                dst[d + np.uint64(j) * u_ds] = src[s + np.uint64(j) * u_ss]


def copy_into_rows(dst: T.NeuronTensor, src: T.NeuronTensor) -> bool:
    """dst[...] = src (same shape and dtype, storage not shared) where dst is contiguous: a
    matrix with strided rows (after merging dims) by tiles (Note [Tiled transposes]), other
    layouts of at most 4 merged dims run by run (Note [Strided copies]); False, copying
    nothing, where neither applies."""
    if dst._key is None or src.shape != dst.shape:
        return False
    shape, (so, si) = kernelgen.coalesce(tuple(dst.shape), [list(dst.stride()),
                                                           list(src.stride())])
    if len(shape) > 4 or min(si) < 0:
        return False
    out = dst._nd.reshape(-1)
    arr = T.nd_view(src._storage, (T.storage_extent(shape, si, 0),), (1,),
                    src.storage_offset(), src.dtype)
    if len(shape) == 2 and si[1] != 1 and min(si) > 0:
        rows, cols = shape
        workers.share_rows(_copy_tiles, -(-rows // ROWS), out.size,
                           [out, arr, rows, cols, si[0], si[1]])
        return True
    shape4, so4 = kernelgen.strided_4d(shape, so)
    si4 = kernelgen.strided_4d(shape, si)[1]
    workers.share_rows(_copy_runs, shape4[0] * shape4[1] * shape4[2], out.size,
                       [out, arr, np.array(shape4, np.int64), np.array(so4, np.int64),
                        np.array(si4, np.int64)])
    return True
