"""Convolution on the Tensor engine: aten.convolution and aten.convolution_backward.

1-D and 2-D, with stride, padding, dilation, groups and bias, plain and transposed. The
input is unfolded into fp32 columns (im2col) and contracted with the weight by the matmul
kernel (Note [PSUM accumulation] in matmul.py), bias added in fp32 before the one
rounding. Gradients are matmuls too; col2im sums overlapping windows in fp32.
3-D convolution falls back to the CPU.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit

from neuron_eager.device_sim import core
from neuron_eager.ops import tensor as T
from neuron_eager.ops.matmul import (compute_dtype, gemm_values, narrow_into, raise_like_cpu,
                                     result_buffer, widen)
from neuron_eager.ops.registry import register

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor


# -- kernels ---------------------------------------------------------------------------------
@njit(error_model="numpy", nogil=True)
def im2col(cols, x, g):
    """cols[n, (c*kh + i)*kw + j, ho*Wo + wo] = x[n, c, ho*sh - ph + i*dh, wo*sw - pw + j*dw].

    g: N, C, H, W, x strides (n, c, h, w), kh, kw, Ho, Wo, sh, sw, ph, pw, dh, dw.
    Out-of-range positions are the zero padding.
    """
    N, C, H, W, xn, xc, xh, xw = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    kh, kw, Ho, Wo, sh, sw, ph, pw, dh, dw = g[8], g[9], g[10], g[11], g[12], g[13], g[14], \
        g[15], g[16], g[17]
    zero = cols.dtype.type(0)
    o = 0
    for n in range(N):
        for c in range(C):
            base = n * xn + c * xc
            for i in range(kh):
                for j in range(kw):
                    for ho in range(Ho):
                        h = ho * sh - ph + i * dh
                        inside = 0 <= h < H
                        for wo in range(Wo):
                            w = wo * sw - pw + j * dw
                            if inside and 0 <= w < W:
                                cols[o] = x[base + h * xh + w * xw]
                            else:
                                cols[o] = zero
                            o += 1


@njit(error_model="numpy", nogil=True)
def col2im(img, cols, g):
    """The adjoint of im2col: img (contiguous N, C, H, W) += each column entry, window by
    window in (i, j) order, in the compute type. g as for im2col (x strides unused)."""
    N, C, H, W = g[0], g[1], g[2], g[3]
    kh, kw, Ho, Wo, sh, sw, ph, pw, dh, dw = g[8], g[9], g[10], g[11], g[12], g[13], g[14], \
        g[15], g[16], g[17]
    o = 0
    for n in range(N):
        for c in range(C):
            base = (n * C + c) * H * W
            for i in range(kh):
                for j in range(kw):
                    for ho in range(Ho):
                        h = ho * sh - ph + i * dh
                        inside = 0 <= h < H
                        for wo in range(Wo):
                            w = wo * sw - pw + j * dw
                            if inside and 0 <= w < W:
                                img[base + h * W + w] += cols[o]
                            o += 1


# -- geometry --------------------------------------------------------------------------------
def _four(t: torch.Tensor):
    """(N, C, H, W) sizes and strides of a 3-D (N, C, L) or 4-D tensor."""
    if t.dim() == 3:
        return (t.shape[0], t.shape[1], 1, t.shape[2]), (t.stride(0), t.stride(1), 0,
                                                         t.stride(2))
    return tuple(t.shape), t.stride()


def _pair(values, dims: int, fill: int):
    values = list(values)
    if len(values) == 1 and dims == 2:
        values = values * 2
    return (fill, values[0]) if dims == 1 else tuple(values)


class Conv:
    """One non-transposed convolution: the `image` side (N, C, H, W) -> the `output` side
    (N, O, Ho, Wo) with weight (O, C/G, kh, kw)."""

    def __init__(self, image_shape, out_shape, weight_shape, stride, padding, dilation, groups):
        d = len(image_shape) - 2
        as4 = (lambda s: (s[0], s[1], 1, s[2])) if d == 1 else tuple
        self.N, self.C, self.H, self.W = as4(image_shape)
        _, self.O, self.Ho, self.Wo = as4(out_shape)
        self.kh, self.kw = as4(weight_shape)[2:]
        self.stride, self.padding = _pair(stride, d, 1), _pair(padding, d, 0)
        self.dilation, self.G = _pair(dilation, d, 1), groups
        self.Og, self.CK = self.O // groups, self.C * self.kh * self.kw
        self.CKg, self.L = self.CK // groups, self.Ho * self.Wo

    def geometry(self, x_strides=(0, 0, 0, 0)) -> np.ndarray:
        return np.array([self.N, self.C, self.H, self.W, *x_strides, self.kh, self.kw, self.Ho,
                         self.Wo, *self.stride, *self.padding, *self.dilation], np.int64)

    def columns(self, image: NeuronTensor) -> np.ndarray:
        """im2col of the image side, as compute values (N, CK, L)."""
        _, strides = _four(image)
        cols = np.empty(self.N * self.CK * self.L, compute_dtype(image.dtype))
        im2col(cols, widen(image), self.geometry(strides))
        return cols

    def forward(self, out_values: np.ndarray, image: NeuronTensor, weight: NeuronTensor,
                bias: NeuronTensor | None):
        """out (N, O, L) = W_g @ cols_g per sample and group, + bias."""
        Og, CKg, L = self.Og, self.CKg, self.L
        fb = widen(bias) if bias is not None else None
        bs = bias.stride(0) if bias is not None else 0
        gemm_values(out_values, (self.N, self.G, 1, Og, L, CKg),
                    widen(weight), (0, Og * CKg, 0, CKg, 1),
                    self.columns(image), (self.CK * L, CKg * L, 0, L, 1),
                    fb, (0, Og * bs, bs, 0), 1, 1 if bias is not None else 0)
        return out_values

    def image_grad(self, grad: NeuronTensor, weight: NeuronTensor, dtype, bias=None):
        """col2im(W_g^T @ grad_g): the gradient on the image side (transposed conv forward)."""
        Og, CKg, L = self.Og, self.CKg, self.L
        fg, (sn, sc, sl) = _matrix(grad)
        kind = compute_dtype(dtype)
        cols = np.empty(self.N * self.CK * L, kind)
        gemm_values(cols, (self.N, self.G, 1, CKg, L, Og), widen(weight), (0, Og * CKg, 0, 1, CKg),
                    fg, (sn, Og * sc, 0, sc, sl))
        img = np.zeros(self.N * self.C * self.H * self.W, kind)
        col2im(img, cols, self.geometry())
        if bias is not None:  # transposed convolution's bias, added before the one rounding
            fb = widen(bias)[np.arange(self.C) * bias.stride(0)]
            img.reshape(self.N, self.C, -1)[:] += fb[:, None]
        return img

    def weight_grad(self, out_values: np.ndarray, grad: NeuronTensor, image: NeuronTensor):
        """sum_n grad_g[n] @ cols_g[n]^T: (G, Og, CKg), the weight's contiguous layout."""
        Og, CKg, L = self.Og, self.CKg, self.L
        fg, (sn, sc, sl) = _matrix(grad)
        gemm_values(out_values, (1, self.G, self.N, Og, CKg, L), fg, (0, Og * sc, sn, sc, sl),
                    self.columns(image), (0, CKg * L, self.CK * L, 1, L))
        return out_values


def _matrix(grad: NeuronTensor):
    """grad (N, C, [H,] W) staged, with strides (n, c, l) where l walks H*W as one axis."""
    (_, _, H, W), (sn, sc, sh, sw) = _four(grad)
    if H > 1 and W > 1 and sh != W * sw:
        grad = grad.contiguous()
        (_, _, H, W), (sn, sc, sh, sw) = _four(grad)
    return widen(grad), (sn, sc, sw if W > 1 else sh)


def bias_grad(out_values: np.ndarray, grad: NeuronTensor) -> np.ndarray:
    """The sum of grad over samples and positions, as ones @ grad^T on the Tensor engine."""
    (N, C, H, W), _ = _four(grad)
    fg, (sn, sc, sl) = _matrix(grad)
    ones = np.ones(1, out_values.dtype)
    return gemm_values(out_values, (1, 1, N, 1, C, H * W), ones, (0, 0, 0, 0, 0),
                       fg, (0, 0, sn, sl, sc))


# -- ops -------------------------------------------------------------------------------------
def _meta(t):
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                      device="meta")


def _supported(x, weight, other) -> bool:
    tensors = [t for t in (x, weight, other) if t is not None]
    return x.dim() == weight.dim() and x.dim() in (3, 4) and x.dtype != torch.bool and \
        all(isinstance(t, NeuronTensor) for t in tensors)


def _fallback(op, args):
    from neuron_eager.ops.router import cpu_fallback

    return cpu_fallback(op, args, {})


def _launch(macs: int, *tensors) -> None:
    core.launch("tensor", macs, sum(t._nd.nbytes for t in tensors if t is not None))


@register(aten.convolution.default)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    args = (x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    try:
        meta = aten.convolution.default(_meta(x), _meta(weight), _meta(bias), *args[3:])
    except RuntimeError:
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
    _launch(conv.N * conv.O * conv.L * conv.CKg, x, weight, bias, out)
    return out


@register(aten.convolution_backward.default)
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
    _launch(conv.N * conv.O * conv.L * conv.CKg * sum(map(bool, output_mask[:2])), grad, x,
            weight, grad_input, grad_weight)
    return grad_input, grad_weight, grad_bias
