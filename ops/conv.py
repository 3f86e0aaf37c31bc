"""Convolution on the Tensor engine: aten.convolution and aten.convolution_backward.

1-D, 2-D and 3-D, with stride, padding, dilation, groups and bias, plain and transposed. The
input is unfolded into fp32 columns (im2col) and contracted with the weight by the matmul
kernel (Note [PSUM accumulation] in matmul.py), bias added in fp32 before the one
rounding; bf16 columns keep their bits for the bf16 units (Note [bf16 chunks on MKL] in
bf16_chunks.py). Gradients are matmuls too; col2im sums overlapping windows in fp32.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import tensor as T
from neuron_eager.ops import bf16_chunks, workers
from neuron_eager.ops.copy import keeps_channels_last
from neuron_eager.ops.jit import njit
from neuron_eager.ops.matmul import (blas_path, compute_dtype, flat, gemm_values, narrow_into,
                                     raise_like_cpu, rate, result_buffer, widen)
from neuron_eager.ops.meta import meta_outputs
from neuron_eager.ops.registry import register
from neuron_eager.ops.views import decomposed, unusual_column_arguments

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor


# -- kernels ---------------------------------------------------------------------------------
# g: N, C, D, H, W, x strides (n, c, d, h, w), kd, kh, kw, Do, Ho, Wo, stride (d, h, w),
#    padding (d, h, w), dilation (d, h, w). 1-D and 2-D convolutions have D = kd = 1.
# Note [Column runs]: for one (channel, tap, output row) the in-range output columns are one
# run [lo, hi) (w = wo * sw + off, off = j * dw - pw): the columns before and after it are
# padding. The kernels copy or add whole runs (unit-stride loops vectorize) and take a range
# of samples, so large batches run a share per core; window order, and so every sum's bits,
# is unchanged.
@njit(inline="always")
def _run(off, sw, W, Wo):
    """[lo, hi): the wo with 0 <= wo * sw + off < W."""
    lo = 0 if off >= 0 else min((sw - 1 - off) // sw, Wo)
    hi = min(max((W - off + sw - 1) // sw, 0), Wo)
    return lo, max(hi, lo)


@njit(error_model="numpy", nogil=True)
def im2col(lo_n, hi_n, cols, x, g):
    """cols[((c*kd + a)*kh + i)*kw + j, n, (do*Ho + ho)*Wo + wo] = x[n, c, do*sd - pd + a*dd,
    ho*sh - ph + i*dh, wo*sw - pw + j*dw] for samples lo_n..hi_n-1: samples side by side in
    each row, so one GEMM covers the batch. Out-of-range positions are the zero padding (Note
    [Column runs])."""
    N, C, D, H, W, xn, xc, xd, xh, xw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], \
        g[9]
    kd, kh, kw, Do, Ho, Wo = g[10], g[11], g[12], g[13], g[14], g[15]
    sd, sh, sw, pd, ph, pw, dd, dh, dw = g[16], g[17], g[18], g[19], g[20], g[21], g[22], \
        g[23], g[24]
    zero = cols.dtype.type(0)
    step = sw * xw
    L = Do * Ho * Wo
    for n in range(lo_n, hi_n):
        for c in range(C):
            base = n * xn + c * xc
            for a in range(kd):
                for i in range(kh):
                    for j in range(kw):
                        o = ((((c * kd + a) * kh + i) * kw + j) * N + n) * L
                        off = j * dw - pw
                        lo, hi = _run(off, sw, W, Wo)
                        for do in range(Do):
                            d = do * sd - pd + a * dd
                            for ho in range(Ho):
                                h = ho * sh - ph + i * dh
                                at = np.uint64(o)
                                if 0 <= d < D and 0 <= h < H:
                                    src = base + d * xd + h * xh + off * xw
                                    for wo in range(lo):
                                        cols[at + np.uint64(wo)] = zero
                                    if step == 1:
                                        for wo in range(lo, hi):
                                            cols[at + np.uint64(wo)] = x[np.uint64(src + wo)]
                                    else:
                                        for wo in range(lo, hi):
                                            cols[at + np.uint64(wo)] = x[np.uint64(src + wo * step)]
                                    for wo in range(hi, Wo):
                                        cols[at + np.uint64(wo)] = zero
                                else:
                                    for wo in range(Wo):
                                        cols[at + np.uint64(wo)] = zero
                                o += Wo


@njit(error_model="numpy", nogil=True)
def col2im(lo_n, hi_n, img, cols, g):
    """The adjoint of im2col for samples lo_n..hi_n-1: img (contiguous N, C, D, H, W) += each
    column entry, window by window in (a, i, j) order, in the compute type. g as for im2col
    (x strides unused)."""
    C, D, H, W = g[1], g[2], g[3], g[4]
    kd, kh, kw, Do, Ho, Wo = g[10], g[11], g[12], g[13], g[14], g[15]
    sd, sh, sw, pd, ph, pw, dd, dh, dw = g[16], g[17], g[18], g[19], g[20], g[21], g[22], \
        g[23], g[24]
    for n in range(lo_n, hi_n):
        o = n * C * kd * kh * kw * Do * Ho * Wo
        for c in range(C):
            base = (n * C + c) * D * H * W
            for a in range(kd):
                for i in range(kh):
                    for j in range(kw):
                        off = j * dw - pw
                        lo, hi = _run(off, sw, W, Wo)
                        for do in range(Do):
                            d = do * sd - pd + a * dd
                            for ho in range(Ho):
                                h = ho * sh - ph + i * dh
                                if 0 <= d < D and 0 <= h < H:
                                    dst = base + (d * H + h) * W + off
                                    if sw == 1:
                                        for wo in range(lo, hi):
                                            img[np.uint64(dst + wo)] += cols[np.uint64(o + wo)]
                                    else:
                                        for wo in range(lo, hi):
                                            img[np.uint64(dst + wo * sw)] += cols[np.uint64(o + wo)]
                                o += Wo


# Note [Convolution in sample blocks]
# The columns of a whole batch are CK = C*kh*kw times the image (a 32 x 64 x 32 x 32 batch
# under a 3x3 kernel: 75 MB; 3.7 GB at 224 x 224), written by im2col and read back by the
# GEMM. In blocks of samples of about COLUMN_BLOCK_BYTES they stay in cache between the two,
# and so do the gradient's columns between the GEMM and col2im. Samples are independent, and
# the weight gradient sums over them sample by sample (its batch-reduce dim), so later
# blocks add their chunks to the running sum (gemm_values' `accumulate`): every output keeps
# its K-chunks and their order (Note [PSUM accumulation]). The sum inside a chunk is MKL's,
# whose order may depend on the product's width: a result may then differ in its last bit
# from the whole batch in one product (none did on the shapes of tests and benchmarks).
# Forward of that batch: 52 -> 38-43 ms.
COLUMN_BLOCK_BYTES = 8 << 20


# Note [Depthwise convolution]
# With one input channel per group and one output channel per input channel (ConvNeXt's and
# MobileNet's depthwise layers), each group's GEMM is a row of kh*kw taps times a matrix of
# columns: im2col copied every input value kh*kw times (472 MB for 8 x 96 x 56 x 56 with 7 x 7
# taps) for products of one row. The kernel below slides the taps over the image instead:
# one output row accumulates tap by tap in fp32 (the chunk of Note [PSUM accumulation]; taps
# past 128 start a new chunk, added in order), then the bias, then the one rounding.
@njit(inline="always")
def _padded(g):
    """(Hp, Wp): a zero-padded plane holding every tap of every output position."""
    H, W, kh, kw, Ho, Wo = g[2], g[3], g[8], g[9], g[10], g[11]
    sh, sw, ph, pw, dh, dw = g[12], g[13], g[14], g[15], g[16], g[17]
    return (max((Ho - 1) * sh + (kh - 1) * dh + 1, ph + H),
            max((Wo - 1) * sw + (kw - 1) * dw + 1, pw + W))


@njit(inline="always")
def _gather(dst, width, start, src, base, rows, cols, s_r, s_c):
    """dst[start + r * width + c] = src[base + r * s_r + c * s_c] for r < rows, c < cols: a
    strided plane into rows of `width` (an image into its padded plane, a gradient into wide
    or dense rows, a tap's inputs out of the plane)."""
    for r in range(rows):
        for c in range(cols):
            dst[start + r * width + c] = src[np.uint64(base + r * s_r + c * s_c)]


@njit(error_model="numpy", nogil=True, fastmath={"contract"})
def depthwise(lo_r, hi_r, out, x, w, b, g):
    """out[r, ho*Wo + wo] for rows r = n*C + c in [lo_r, hi_r): x (strided: g[4:8]) correlated
    with w[c] (kh*kw taps), plus b[c] where g[18]; g as in Conv.depthwise_geometry. Each
    plane is copied into a zero-padded one (Hp x Wp), and each tap is one long loop over a
    "wide" output of Ho rows of Wp (the columns past Wo are computed and dropped): rows of a
    few dozen columns left most of the work to the vector loop's scalar remainder."""
    C, xn, xc = g[1], g[4], g[5]
    kh, kw, Ho, Wo, sh, sw, dh, dw, has_bias = g[8], g[9], g[10], g[11], g[12], g[13], \
        g[16], g[17], g[18]
    taps = kh * kw
    Hp, Wp = _padded(g)
    plane = np.zeros((Hp + 1) * Wp, np.float32)  # (+ a row: the last tap's wide row runs on)
    wide = Ho * Wp
    chunk = np.empty(wide, np.float32)
    total = np.empty(wide, np.float32)
    for r in range(lo_r, hi_r):
        n, c = r // C, r % C
        _gather(plane, Wp, g[14] * Wp + g[15], x, n * xn + c * xc, g[2], g[3], g[6], g[7])
        for t0 in range(0, taps, 128):
            chunk[:] = 0
            for t in range(t0, min(t0 + 128, taps)):
                wt = w[c * taps + t]
                shift = (t // kw) * dh * Wp + (t % kw) * dw
                if sh == 1 and sw == 1:
                    src = plane[shift:shift + wide]
                    for k in range(wide):
                        chunk[k] += wt * src[k]
                else:
                    for ho in range(Ho):
                        for wo in range(Wo):
                            chunk[ho * Wp + wo] += wt * plane[shift + ho * sh * Wp + wo * sw]
            if t0 == 0:
                total[:] = chunk
            else:
                total += chunk
        at = r * Ho * Wo
        for ho in range(Ho):
            for wo in range(Wo):
                v = total[ho * Wp + wo]
                out[np.uint64(at + ho * Wo + wo)] = v + b[c] if has_bias else v


@njit(error_model="numpy", nogil=True, fastmath={"contract"})
def depthwise_image_grad(lo_r, hi_r, img, grad, w, g):
    """The adjoint of `depthwise` for rows [lo_r, hi_r): img (contiguous N*C planes of H*W)
    from grad (strided: g[19:23] its (n, c, h, w) strides). Each tap adds its products over
    the wide rows into a padded plane, taps in order (col2im's order)."""
    C, H, W = g[1], g[2], g[3]
    kh, kw, Ho, Wo, sh, sw, ph, pw, dh, dw = g[8], g[9], g[10], g[11], g[12], g[13], g[14], \
        g[15], g[16], g[17]
    gn, gc, gh, gw = g[19], g[20], g[21], g[22]
    taps = kh * kw
    Hp, Wp = _padded(g)
    plane = np.empty((Hp + 1) * Wp, np.float32)
    wide = Ho * Wp
    spread = np.zeros(wide, np.float32)  # grad in wide rows (columns past Wo stay 0)
    for r in range(lo_r, hi_r):
        n, c = r // C, r % C
        _gather(spread, Wp, 0, grad, n * gn + c * gc, Ho, Wo, gh, gw)
        plane[:] = 0
        for t in range(taps):
            wt = w[c * taps + t]
            shift = (t // kw) * dh * Wp + (t % kw) * dw
            if sh == 1 and sw == 1:
                dst = plane[shift:shift + wide]
                for k in range(wide):
                    dst[k] += wt * spread[k]
            else:
                for ho in range(Ho):
                    for wo in range(Wo):
                        plane[shift + ho * sh * Wp + wo * sw] += wt * spread[ho * Wp + wo]
        at = r * H * W
        for h in range(H):
            for ww in range(W):
                img[np.uint64(at + h * W + ww)] = plane[(h + ph) * Wp + ww + pw]


@njit(error_model="numpy", nogil=True)
def depthwise_weight_grad(lo_c, hi_c, out, x, grad, g):
    """out[c * taps + t] = sum over samples and positions of grad * the tap's input, for
    channels [lo_c, hi_c): per sample, chunks of 128 positions each summed in fp32 (a BLAS
    dot), added in order (the weight-gradient GEMM's order, Note [PSUM accumulation])."""
    N, xn, xc = g[0], g[4], g[5]
    kh, kw, Ho, Wo, sh, sw, dh, dw = g[8], g[9], g[10], g[11], g[12], g[13], g[16], g[17]
    gn, gc, gh, gw = g[19], g[20], g[21], g[22]
    taps, L = kh * kw, Ho * Wo
    Hp, Wp = _padded(g)
    plane = np.zeros((Hp + 1) * Wp, np.float32)
    dense = np.empty(L, np.float32)
    tap = np.empty(L, np.float32)
    total = np.empty(taps, np.float32)
    for c in range(lo_c, hi_c):
        total[:] = 0
        for n in range(N):
            _gather(plane, Wp, g[14] * Wp + g[15], x, n * xn + c * xc, g[2], g[3], g[6], g[7])
            _gather(dense, Wo, 0, grad, n * gn + c * gc, Ho, Wo, gh, gw)
            for t in range(taps):
                shift = (t // kw) * dh * Wp + (t % kw) * dw
                _gather(tap, Wo, 0, plane, shift, Ho, Wo, sh * Wp, sw)
                for l0 in range(0, L, 128):
                    l1 = min(l0 + 128, L)
                    total[t] += np.dot(dense[l0:l1], tap[l0:l1])
        for t in range(taps):
            out[c * taps + t] = total[t]


# -- geometry --------------------------------------------------------------------------------
def _five(t: torch.Tensor):
    """(N, C, D, H, W) sizes and strides of a 3-D (N, C, L), 4-D or 5-D tensor."""
    shape, stride = list(t.shape), list(t.stride())
    while len(shape) < 5:
        shape.insert(2, 1)
        stride.insert(2, 0)
    return tuple(shape), tuple(stride)


def _triple(values, dims: int, fill: int):
    values = list(values)
    if len(values) == 1:
        values = values * dims
    return (fill,) * (3 - dims) + tuple(values)


class Conv:
    """One non-transposed convolution: the `image` side (N, C, D, H, W) -> the `output` side
    (N, O, Do, Ho, Wo) with weight (O, C/G, kd, kh, kw)."""

    def __init__(self, image_shape, out_shape, weight_shape, stride, padding, dilation, groups):
        d = len(image_shape) - 2
        as5 = lambda s: tuple(s[:2]) + (1,) * (3 - d) + tuple(s[2:])  # noqa: E731
        self.N, self.C, self.D, self.H, self.W = as5(image_shape)
        _, self.O, self.Do, self.Ho, self.Wo = as5(out_shape)
        self.kd, self.kh, self.kw = as5(weight_shape)[2:]
        self.stride, self.padding = _triple(stride, d, 1), _triple(padding, d, 0)
        self.dilation, self.G = _triple(dilation, d, 1), groups
        self.Og, self.CK = self.O // groups, self.C * self.kd * self.kh * self.kw
        self.CKg, self.L = self.CK // groups, self.Do * self.Ho * self.Wo

    def geometry(self, x_strides=(0, 0, 0, 0, 0)) -> np.ndarray:
        return np.array([self.N, self.C, self.D, self.H, self.W, *x_strides, self.kd, self.kh,
                         self.kw, self.Do, self.Ho, self.Wo, *self.stride, *self.padding,
                         *self.dilation], np.int64)

    def product(self, which: str) -> tuple:
        """(batch, m, k, n) of the implicit GEMM behind forward, image_grad or weight_grad
        (the same multiply-adds each), for the cost model."""
        Og, CKg, L = self.Og, self.CKg, self.L
        return {"forward": (self.N * self.G, Og, CKg, L),
                "image": (self.N * self.G, CKg, Og, L),
                "weight": (self.G, Og, self.N * L, CKg)}[which]

    def columns(self, image: NeuronTensor, bits: bool = False) -> np.ndarray:
        """im2col of the image side, as compute values (CK, N, L), or with `bits` as the bf16
        image's own bits. Matmul operands here and below are staged with `widen(.., True)`:
        config.auto_cast "matmult" rounds them."""
        _, strides = _five(image)
        src = flat(image) if bits else widen(image, True)
        cols = np.empty(self.N * self.CK * self.L, src.dtype if bits
                        else compute_dtype(image.dtype))
        workers.share_rows(im2col, self.N, cols.size, [cols, src, self.geometry(strides)])
        return cols

    def depthwise_geometry(self, image=None, grad=None, has_bias=False) -> np.ndarray:
        """g of the depthwise kernels: N, C, H, W, the image's strides (n, c, h, w), kh, kw,
        Ho, Wo, stride, padding and dilation (h, w), has_bias, the grad's strides."""
        def strides(t):
            if t is None:
                return (0, 0, 0, 0)
            _, (sn, sc, _, sh, sw) = _five(t)
            return sn, sc, sh, sw

        return np.array([self.N, self.C, self.H, self.W, *strides(image), self.kh, self.kw,
                         self.Ho, self.Wo, *self.stride[1:], *self.padding[1:],
                         *self.dilation[1:], int(has_bias), *strides(grad)], np.int64)

    @property
    def is_depthwise(self) -> bool:
        """One input and one output channel per group, in 1-D or 2-D (Note [Depthwise
        convolution])."""
        return self.G == self.C == self.O and self.kd == 1 and self.D == 1

    def forward(self, out_values: np.ndarray, image: NeuronTensor, weight: NeuronTensor,
                bias: NeuronTensor | None):
        """out (N, O, L) = W_g @ cols_g per group, + bias: one product (Og, CKg) @ (CKg, N*L)
        per group, then the samples moved to the front."""
        Og, CKg, L, N = self.Og, self.CKg, self.L, self.N
        fb = widen(bias) if bias is not None else None
        bs = bias.stride(0) if bias is not None else 0
        if self.is_depthwise and out_values.dtype == np.float32:
            fb = fb[np.arange(self.C) * bs] if bias is not None else np.zeros(1, np.float32)
            workers.share_rows(depthwise, N * self.C, out_values.size,
                               [out_values, widen(image, True), widen(weight, True), fb,
                                self.depthwise_geometry(image, has_bias=bias is not None)])
            return out_values
        dims, beta = (1, self.G, 1, Og, N * L, CKg), 1 if bias is not None else 0
        ws, cs, bias_strides = (0, Og * CKg, 0, CKg, 1), (0, CKg * N * L, 0, N * L, 1), \
            (0, Og * bs, bs, 0)
        layouts = _bf16_plan(dims, weight, ws, image, cs)
        if layouts is None:
            self._forward_in_blocks(out_values, image, widen(weight, True), fb, bias_strides,
                                    beta)
            return out_values
        # (G, Og, N, L), or the result itself for one sample
        by_group = np.empty(self.O * N * L, out_values.dtype) if N > 1 else out_values
        bf16_chunks.run(layouts, None, by_group, dims, flat(weight), ws,
                        self.columns(image, bits=True), cs, fb, bias_strides, 1, beta)
        if N > 1:
            workers.copy(out_values.reshape(N, self.O, L),
                         by_group.reshape(self.O, N, L).transpose(1, 0, 2))
        return out_values

    def block_samples(self, itemsize: int) -> int:
        """Samples per block of Note [Convolution in sample blocks]: columns of about
        COLUMN_BLOCK_BYTES, and a sample per core at least (im2col splits by samples)."""
        per_sample = max(self.CK * self.L * itemsize, 1)
        return max(1, min(self.N, max(workers.COUNT, COLUMN_BLOCK_BYTES // per_sample)))

    def column_blocks(self, image: NeuronTensor):
        """(n0, m, columns of samples n0..n0+m-1 as (CK, m, L)), block of samples by block
        (Note [Convolution in sample blocks]); a block's columns live until the next one."""
        _, strides = _five(image)
        src, g = widen(image, True), self.geometry(strides)
        kind = compute_dtype(image.dtype)
        nb = self.block_samples(np.dtype(kind).itemsize)
        cols = np.empty(self.CK * nb * self.L, kind)
        for n0 in range(0, self.N, nb):
            m = min(nb, self.N - n0)
            g[0] = m  # im2col sees the block as the batch (its samples side by side)
            block = cols[:self.CK * m * self.L]
            workers.share_rows(im2col, m, block.size, [block, src[n0 * strides[0]:], g])
            yield n0, m, block

    def _forward_in_blocks(self, out_values: np.ndarray, image: NeuronTensor, w: np.ndarray,
                           fb, bias_strides, beta) -> None:
        """forward's fp32 product, block of samples by block: each block's columns, then
        W_g @ cols_g + bias into its samples' outputs."""
        Og, CKg, L, N, O = self.Og, self.CKg, self.L, self.N, self.O
        out, part = out_values.reshape(N, O * L), None
        for n0, m, block in self.column_blocks(image):
            if m > 1 and part is None:
                part = np.empty(O * m * L, out_values.dtype)  # (the first block is the largest)
            res = out[n0] if m == 1 else part[:O * m * L]  # (G, Og, m, L)
            gemm_values(res, (1, self.G, 1, Og, m * L, CKg), w, (0, Og * CKg, 0, CKg, 1),
                        block, (0, CKg * m * L, 0, m * L, 1), fb, bias_strides, 1, beta)
            if m > 1:
                workers.copy(out[n0:n0 + m].reshape(m, O, L),
                             res.reshape(O, m, L).transpose(1, 0, 2))

    def image_grad(self, grad: NeuronTensor, weight: NeuronTensor, dtype, bias=None):
        """col2im(W_g^T @ grad_g): the gradient on the image side (transposed conv forward)."""
        Og, CKg, L = self.Og, self.CKg, self.L
        kind = compute_dtype(dtype)
        if self.is_depthwise and kind is np.float32:
            img = np.empty(self.N * self.C * self.H * self.W, kind)
            workers.share_rows(depthwise_image_grad, self.N * self.C, img.size,
                               [img, widen(grad, True), widen(weight, True),
                                self.depthwise_geometry(grad=grad)])
            if bias is not None:
                img.reshape(self.N, self.C, -1)[:] += widen(bias)[np.arange(self.C)
                                                                  * bias.stride(0)][:, None]
            return img
        grad, (sn, sc, sl) = _matrix(grad)
        dims, ws, gs = (self.N, self.G, 1, CKg, L, Og), (0, Og * CKg, 0, 1, CKg), \
            (sn, Og * sc, 0, sc, sl)
        layouts = _bf16_plan(dims, weight, ws, grad, gs)
        img = np.zeros(self.N * self.C * self.D * self.H * self.W, kind)
        if layouts is not None:
            cols = np.empty(self.N * self.CK * L, kind)
            bf16_chunks.run(layouts, None, cols, dims, flat(weight), ws, flat(grad), gs)
            workers.share_rows(col2im, self.N, cols.size, [img, cols, self.geometry()])
        else:  # block of samples by block (Note [Convolution in sample blocks])
            nb, w, fg = self.block_samples(np.dtype(kind).itemsize), widen(weight, True), \
                widen(grad, True)
            cols, image_size = np.empty(nb * self.CK * L, kind), img.size // self.N
            for n0 in range(0, self.N, nb):
                m = min(nb, self.N - n0)
                block = cols[:m * self.CK * L]
                gemm_values(block, (m, self.G, 1, CKg, L, Og), w, ws, fg[n0 * sn:], gs)
                workers.share_rows(col2im, m, block.size,
                                   [img[n0 * image_size:], block, self.geometry()])
        if bias is not None:  # transposed convolution's bias, added before the one rounding
            fb = widen(bias)[np.arange(self.C) * bias.stride(0)]
            img.reshape(self.N, self.C, -1)[:] += fb[:, None]
        return img

    def weight_grad(self, out_values: np.ndarray, grad: NeuronTensor, image: NeuronTensor):
        """sum_n grad_g[n] @ cols_g[n]^T: (G, Og, CKg), the weight's contiguous layout."""
        Og, CKg, L = self.Og, self.CKg, self.L
        if self.is_depthwise and out_values.dtype == np.float32:
            workers.share_rows(depthwise_weight_grad, self.C, self.N * self.C * L,
                               [out_values, widen(image, True), widen(grad, True),
                                self.depthwise_geometry(image, grad)])
            return out_values
        grad, (sn, sc, sl) = _matrix(grad)
        dims, gs, cs = (1, self.G, self.N, Og, CKg, L), (0, Og * sc, sn, sc, sl), \
            (0, CKg * self.N * L, L, 1, self.N * L)
        layouts = _bf16_plan(dims, grad, gs, image, cs)
        if layouts is not None:  # (out_values: fp32, a bf16 weight's compute values)
            bf16_chunks.run(layouts, None, out_values, dims, flat(grad), gs,
                            self.columns(image, bits=True), cs)
        elif self.N > 1 and blas_path(dims, out_values.dtype.type):
            self._weight_grad_in_blocks(out_values, widen(grad, True), (sn, sc, sl), image)
        else:
            gemm_values(out_values, dims, widen(grad, True), gs, self.columns(image), cs)
        return out_values

    def _weight_grad_in_blocks(self, out_values: np.ndarray, fg: np.ndarray, grad_strides,
                               image: NeuronTensor) -> None:
        """weight_grad's product block of samples by block (Note [Convolution in sample
        blocks]): the samples are the product's batch-reduce dim, each one's K-chunks in
        turn, so later blocks add their chunks to the running sum in the same order."""
        Og, CKg, L = self.Og, self.CKg, self.L
        sn, sc, sl = grad_strides
        for n0, m, block in self.column_blocks(image):
            gemm_values(out_values, (1, self.G, m, Og, CKg, L), fg[n0 * sn:],
                        (0, Og * sc, sn, sc, sl), block, (0, CKg * m * L, L, 1, m * L),
                        accumulate=n0 > 0)


def _bf16_plan(dims, a: NeuronTensor, a_strides, b: NeuronTensor, b_strides):
    """bf16_chunks.plan for a product whose operands hold the values of bf16 tensors a and b
    (a staged operand, the columns, only values of its tensor and zeros); None otherwise."""
    if not a.dtype == b.dtype == torch.bfloat16:
        return None
    return bf16_chunks.plan(dims, a_strides, b_strides, flat(a), flat(b))


def _matrix(grad: NeuronTensor):
    """grad (N, C, [[D,] H,] W) with strides (n, c, l) where l walks D*H*W as one axis (a
    contiguous copy when its spatial dims do not merge)."""
    (_, _, D, H, W), (sn, sc, sd, sh, sw) = _five(grad)
    dims = [(n, st) for n, st in ((D, sd), (H, sh), (W, sw)) if n > 1]
    if any(dims[k][1] != dims[k + 1][0] * dims[k + 1][1] for k in range(len(dims) - 1)):
        grad = grad.contiguous()
        (_, _, D, H, W), (sn, sc, sd, sh, sw) = _five(grad)
        dims = [(n, st) for n, st in ((D, sd), (H, sh), (W, sw)) if n > 1]
    return grad, (sn, sc, dims[-1][1] if dims else 1)


def bias_grad(out_values: np.ndarray, grad: NeuronTensor) -> np.ndarray:
    """The sum of grad over samples and positions, as ones @ grad^T on the Tensor engine."""
    (N, C, D, H, W), _ = _five(grad)
    grad, (sn, sc, sl) = _matrix(grad)
    ones = np.ones(1, out_values.dtype)
    return gemm_values(out_values, (1, 1, N, 1, C, D * H * W), ones, (0, 0, 0, 0, 0),
                       widen(grad), (0, 0, sn, sl, sc))  # a sum, not a matmul: no auto-cast


# -- ops -------------------------------------------------------------------------------------
def _meta(t):
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                      device="meta")


# Note [Convolution argument checks]
# The meta kernel only infers the output's shape: it lets through negative padding, a zero
# dilation, output_padding >= stride, a bias of the wrong length and a transposed weight
# whose channels do not match the input's, which our kernels then read past (garbage, and a
# crash in backward). The CPU's own checks run on stand-ins of an empty batch (zero-stride
# views: nothing is allocated or computed); where they refuse, raise_like_cpu repeats the
# call with the real batch size for the CPU's exact words. An empty batch skips the checks of
# the CPU's kernels (stride, dilation, output_padding): those are tested here.
def _cpu_checks(args) -> None:
    x, weight, bias, stride, _, dilation, transposed, output_padding, groups = args
    if min(stride) <= 0 or min(dilation) <= 0 or groups <= 0 or transposed and any(
            o >= s and o >= d for o, s, d in zip(output_padding, stride, dilation)):
        raise RuntimeError("refused by the CPU's checks")
    # (an empty batch returns before the CPU compares the input's and weight's types; a
    # batch of one raises there, before computing)
    batch = 0 if x.dtype == weight.dtype else 1
    stand_ins = [torch.zeros((), dtype=t.dtype).expand(shape) for t, shape in
                 ((x, (batch, *x.shape[1:])), (weight, weight.shape))]
    stand_ins.append(None if bias is None else torch.zeros((), dtype=bias.dtype).expand(bias.shape))
    with torch._C._DisableTorchDispatch():
        aten.convolution.default(*stand_ins, *args[3:])


def _supported(x, weight, other) -> bool:
    tensors = [t for t in (x, weight, other) if t is not None]
    return x.dim() == weight.dim() and x.dim() in (3, 4, 5) and x.dtype != torch.bool and \
        all(isinstance(t, NeuronTensor) for t in tensors)


def _fallback(op, args):
    from neuron_eager.ops.router import cpu_fallback

    return cpu_fallback(op, args, {})


def _launch(products: list, dtype: torch.dtype, *tensors) -> None:
    """One Tensor-engine launch for the implicit GEMMs `products` ((batch, m, k, n) each)."""
    core.launch("tensor", sum(b * m * k * n for b, m, k, n in products),
                sum(t._nd.nbytes for t in tensors if t is not None), matmul=products,
                dtype=rate(dtype))


# -- F.unfold and F.fold: the column transforms alone ------------------------------------------
# Both run the kernels above (PyTorch's decompositions took ~3 ms a call for a 4x4 image
# here: 18 ops); arguments the meta kernel refuses, and unusual ones, take the decomposition,
# which raises the CPU's errors.
def _column_meta(op, x, args):
    if x.numel() == 0 or unusual_column_arguments(args):
        return None
    try:
        return meta_outputs(op, (x, *args))
    except RuntimeError:
        return None


def _column_geometry(N, C, image_size, kernel_size, dilation, padding, stride, x_strides):
    (H, W), (kh, kw), (dh, dw), (ph, pw), (sh, sw) = image_size, kernel_size, dilation, \
        padding, stride
    Ho, Wo = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return np.array([N, C, 1, H, W, *x_strides, 1, kh, kw, 1, Ho, Wo, 1, sh, sw, 0, ph, pw,
                     1, dh, dw], np.int64)


@register(aten.im2col.default)
def unfold(x, kernel_size, dilation, padding, stride):
    """F.unfold: im2col above on the image's own elements (any dtype: a copy), then the
    samples to the front."""
    args = (kernel_size, dilation, padding, stride)
    meta = _column_meta(aten.im2col.default, x, args)
    if meta is None:
        return decomposed(aten.im2col.default, x, *args)
    image = x if x.dim() == 4 else x.unsqueeze(0)
    (N, C, _, H, W), (sn, sc, _, sh, sw) = _five(image)
    g = _column_geometry(N, C, (H, W), *args, (sn, sc, 0, sh, sw))
    out = T.empty(meta.shape, x.dtype)
    dst = out._nd.reshape(-1)
    cols = dst if N == 1 else np.empty_like(dst)  # (C*kh*kw, N, L)
    workers.share_rows(im2col, N, cols.size, [cols, flat(image), g])
    if N > 1:
        workers.copy(dst.reshape(N, -1, meta.shape[-1]),
                     cols.reshape(-1, N, meta.shape[-1]).transpose(1, 0, 2))
    core.launch("vector", dst.size, 2 * dst.nbytes)
    return out


@register(aten.col2im.default)
def fold(x, output_size, kernel_size, dilation, padding, stride):
    """F.fold of fp32 columns: col2im above adds each window's entries into the image in the
    CPU's order (its im2col.h: windows by (channel, i, j), then by position)."""
    args = (output_size, kernel_size, dilation, padding, stride)
    meta = _column_meta(aten.col2im.default, x, args)
    if meta is None or x.dtype != torch.float32:
        return decomposed(aten.col2im.default, x, *args)
    (kh, kw), (H, W) = kernel_size, output_size
    cols = x if x.dim() == 3 else x.unsqueeze(0)
    N, C = cols.shape[0], cols.shape[1] // (kh * kw)
    g = _column_geometry(N, C, (H, W), *args[1:], (0, 0, 0, 0, 0))
    out = T.empty(meta.shape, torch.float32)
    img = out._nd.reshape(-1)
    img[:] = 0
    workers.share_rows(col2im, N, cols.numel(), [img, widen(cols.contiguous()), g])
    core.launch("vector", cols.numel(), cols.numel() * 4 + img.nbytes)
    return out


@register(aten._convolution.default)  # (TorchScript's traced convolutions call it)
def _convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups, benchmark, deterministic, cudnn_enabled, allow_tf32):
    return aten.convolution.default(x, weight, bias, stride, padding, dilation, transposed,
                                    output_padding, groups)


@register(aten.convolution.default)
@keeps_channels_last(0, 1)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    args = (x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    try:
        meta = aten.convolution.default(_meta(x), _meta(weight), _meta(bias), *args[3:])
        _cpu_checks(args)
    except (RuntimeError, ZeroDivisionError):  # (the meta kernel divides by the stride)
        raise_like_cpu(aten.convolution.default, *args)
    if not _supported(x, weight, bias):
        return _fallback(aten.convolution.default, args)
    out = T.empty(meta.shape, meta.dtype)
    if out.numel() == 0:
        return out
    if transposed:  # the image-side gradient of the conv from `out` to `x`
        conv = Conv(out.shape, x.shape, weight.shape, stride, padding, dilation, groups)
        narrow_into(out, conv.image_grad(x, weight.contiguous(), out.dtype, bias))
    else:
        conv = Conv(x.shape, out.shape, weight.shape, stride, padding, dilation, groups)
        narrow_into(out, conv.forward(result_buffer(out), x, weight.contiguous(), bias))
    _launch([conv.product("forward")], x.dtype, x, weight, bias, out)
    return out


@register(aten.convolution_backward.default)
@keeps_channels_last(1, 2)  # (the CPU's grad_input layout)
def convolution_backward(grad, x, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    args = (grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
            groups, output_mask)
    try:
        aten.convolution_backward.default(_meta(grad), _meta(x), _meta(weight), *args[3:])
    except RuntimeError:
        raise_like_cpu(aten.convolution_backward.default, *args)
    if not _supported(x, weight, grad):
        return _fallback(aten.convolution_backward.default, args)
    weight = weight.contiguous()
    # A transposed convolution is the plain one from its output (`grad` side) to its input.
    image, output = (grad, x) if transposed else (x, grad)
    conv = Conv(image.shape, output.shape, weight.shape, stride, padding, dilation, groups)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = T.empty(x.shape, x.dtype)
        if grad_input.numel():
            if transposed:
                values = conv.forward(result_buffer(grad_input), grad, weight, None)
            else:
                values = conv.image_grad(grad, weight, x.dtype)
            narrow_into(grad_input, values)
    if output_mask[1]:
        grad_weight = T.empty(weight.shape, weight.dtype)
        if grad_weight.numel():
            narrow_into(grad_weight, conv.weight_grad(result_buffer(grad_weight), output, image))
    if output_mask[2]:
        grad_bias = T.empty((grad.shape[1],), grad.dtype)
        if grad_bias.numel():
            narrow_into(grad_bias, bias_grad(result_buffer(grad_bias), grad))
    products = [conv.product(which) for which, wanted in
                (("image", output_mask[0]), ("weight", output_mask[1])) if wanted]
    _launch(products, x.dtype, grad, x, weight, grad_input, grad_weight)
    return grad_input, grad_weight, grad_bias
