"""Losses: negative log-likelihood (1-D and 2-D), MSE, smooth L1, Huber, binary cross
entropy (on probabilities and on logits), forward and backward.

Per-element terms are computed in fp32; a mean or sum is accumulated in fp32 and rounded
once into the loss dtype. F.cross_entropy is log_softmax (softmax family) + nll_loss here;
l1_loss and kl_div decompose into elementwise ops before reaching the device.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import njit

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops.kernelgen import JIT_OPTIONS
from neuron_eager.ops.norm import f32_vector, finish, kernel_for, lane_total, meta_run, staged
from neuron_eager.ops.registry import register
from neuron_eager.ops.tensor import dtype_name as _dtype_name

aten = torch.ops.aten
F32 = torch.float32
NONE, MEAN, SUM = 0, 1, 2  # at::Reduction
_ZERO, _ONE, _HALF = np.float32(0), np.float32(1), np.float32(0.5)


def _code(dtype: torch.dtype) -> str:
    return numerics.CODE[dtype]


# -- reductions of per-element losses --------------------------------------------------
def _build_total(load, store):
    tile_total = lane_total(load)

    @njit(**JIT_OPTIONS)
    def total(values, out, divisor):
        acc = np.float32(0)
        n = values.shape[0]
        for start in range(0, n, 4096):  # fp32 lane sums per tile, then across tiles
            acc += tile_total(values, start, min(start + 4096, n), np.float32(0), False)
        out[0] = store(acc / divisor)

    return total


def reduce_values(values: T.NeuronTensor, dtype: torch.dtype, reduction: int):
    """Sum or mean of an fp32 tensor, rounded once into a 0-dim tensor of `dtype`."""
    out, stage = staged((), dtype)
    flat = values._nd.reshape(-1)
    divisor = np.float32(flat.shape[0] if reduction == MEAN else 1)
    kernel_for(_build_total, "f32", _code(stage.dtype))(flat, stage._nd.reshape(1), divisor)
    core.launch("vector", flat.shape[0], flat.nbytes)
    return finish(out, stage)


def pointwise_loss(op: E.Elementwise, meta, operands, params, reduction: int):
    """A loss whose terms are elementwise in broadcast operands."""
    if reduction == NONE:
        return E.run(op, operands, params)
    shape = E.broadcast_shape([a.shape for a in operands if isinstance(a, E.NeuronTensor)])
    values = T.empty(shape, F32)  # terms stay fp32 until the single rounding of the total
    E.run(op, operands, params, out=values)
    return reduce_values(values, meta.dtype, reduction)


def pointwise_backward(op: E.Elementwise, grad, operands, params, reduction: int):
    """d(loss)/d(self): op(*operands, grad, *params, scale), scale = 1/numel for a mean."""
    shape = E.broadcast_shape([a.shape for a in operands if isinstance(a, E.NeuronTensor)])
    scale = 1.0 / max(T.numel(shape), 1) if reduction == MEAN else 1.0
    return E.run(op, [*operands, grad], [*params, scale])


def _loss(name, fn, nparams=0):
    return E.Elementwise(name, njit(fn), nparams)


# -- MSE, smooth L1, Huber ---------------------------------------------------------------
def _mse(x, y):
    d = x - y
    return d * d


def _mse_backward(x, y, g, scale):
    return np.float32(2) * (x - y) * g * scale


def _smooth_l1(x, y, beta):
    z = abs(x - y)
    return _HALF * z * z / beta if z < beta else z - _HALF * beta


def _smooth_l1_backward(x, y, g, beta, scale):
    d = x - y
    if d < -beta:
        r = -_ONE
    elif d > beta:
        r = _ONE
    elif beta == 0:  # the L1 limit: sign(0) = 0
        r = _ZERO
    else:
        r = d / beta
    return r * g * scale


def _huber(x, y, delta):
    z = abs(x - y)
    return _HALF * z * z if z < delta else delta * (z - _HALF * delta)


def _huber_backward(x, y, g, delta, scale):
    d = x - y
    if d <= -delta:
        return -delta * g * scale
    if d >= delta:
        return delta * g * scale
    return d * g * scale


MSE, MSE_BACKWARD = _loss("mse_loss", _mse), _loss("mse_loss_backward", _mse_backward, 1)
SMOOTH_L1 = _loss("smooth_l1_loss", _smooth_l1, 1)
SMOOTH_L1_BACKWARD = _loss("smooth_l1_loss_backward", _smooth_l1_backward, 2)
HUBER, HUBER_BACKWARD = _loss("huber_loss", _huber, 1), _loss("huber_backward", _huber_backward, 2)


@register(aten.mse_loss.default)
def mse_loss(self, target, reduction=MEAN):
    meta = meta_run(aten.mse_loss.default, self, target, reduction)
    return pointwise_loss(MSE, meta, [self, target], [], reduction)


@register(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, self, target, reduction):
    return pointwise_backward(MSE_BACKWARD, grad_output, [self, target], [], reduction)


@register(aten.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=MEAN, beta=1.0):
    meta = meta_run(aten.smooth_l1_loss.default, self, target, reduction, beta)
    return pointwise_loss(SMOOTH_L1, meta, [self, target], [beta], reduction)


@register(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    return pointwise_backward(SMOOTH_L1_BACKWARD, grad_output, [self, target], [beta],
                              reduction)


@register(aten.huber_loss.default)
def huber_loss(self, target, reduction=MEAN, delta=1.0):
    meta = meta_run(aten.huber_loss.default, self, target, reduction, delta)
    return pointwise_loss(HUBER, meta, [self, target], [delta], reduction)


@register(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    return pointwise_backward(HUBER_BACKWARD, grad_output, [self, target], [delta], reduction)


# -- binary cross entropy ----------------------------------------------------------------
def _bce(x, t, w):
    lx = np.log(x)  # logs are clamped at -100 as in PyTorch; NaN stays NaN
    lx = np.float32(-100) if lx < -100 else lx
    l1x = np.log1p(-x)
    l1x = np.float32(-100) if l1x < -100 else l1x
    return w * ((t - _ONE) * l1x - t * lx)


def _bce_backward(x, t, w, g, scale):
    denom = (_ONE - x) * x
    denom = np.float32(1e-12) if denom < np.float32(1e-12) else denom
    return g * scale * w * (x - t) / denom


def _bce_logits(x, t, w, pos_weight):
    log_sigmoid = (x if x < 0 else _ZERO) - np.log1p(np.exp(-abs(x)))
    log_weight = (pos_weight - _ONE) * t + _ONE
    return w * ((_ONE - t) * x - log_weight * log_sigmoid)


BCE, BCE_BACKWARD = _loss("bce", _bce), _loss("bce_backward", _bce_backward, 1)
BCE_LOGITS = _loss("bce_with_logits", _bce_logits)


def _build_unit_check(load, store):
    @njit(**JIT_OPTIONS)
    def in_unit_interval(x):
        for i in range(x.shape[0]):
            v = load(x[i])
            if not (v >= 0 and v <= 1):
                return False
        return True

    return in_unit_interval


@register(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=MEAN):
    meta = meta_run(aten.binary_cross_entropy.default, self, target, weight, reduction)
    if self.numel():
        flat = self.contiguous()
        check = kernel_for(_build_unit_check, _code(self.dtype), _code(self.dtype))
        if not check(flat._nd.reshape(-1)):
            raise RuntimeError("all elements of input should be between 0 and 1")
    return pointwise_loss(BCE, meta, [self, target, 1.0 if weight is None else weight], [],
                          reduction)


@register(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=MEAN):
    return pointwise_backward(BCE_BACKWARD, grad_output,
                              [self, target, 1.0 if weight is None else weight], [], reduction)


@register(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None,
                                     reduction=MEAN):
    meta = meta_run(aten.binary_cross_entropy_with_logits.default, self, target, weight,
                    pos_weight, reduction)
    operands = [self, target, 1.0 if weight is None else weight,
                1.0 if pos_weight is None else pos_weight]
    return pointwise_loss(BCE_LOGITS, meta, operands, [], reduction)


# -- negative log-likelihood -------------------------------------------------------------
# Log-probabilities are viewed as [N, C, S] and targets as [N, S] (S = H*W for the 2-D
# loss, 1 otherwise). A target out of range stops the kernel, which reports it.
def _build_nll(load, store):
    @njit(**JIT_OPTIONS)
    def nll_loss(x, target, w, out, loss, total_weight, ignore, reduction):
        n_, classes, s_ = x.shape
        acc = np.float32(0)
        weight_sum = np.float32(0)
        for n in range(n_):
            part = np.float32(0)
            for s in range(s_):
                k = target[n, s]
                if k == ignore:
                    if reduction == 0:
                        out[n, s] = store(np.float32(0))
                    continue
                if k < 0 or k >= classes:
                    return False, k
                v = -w[k] * load(x[n, k, s])
                if reduction == 0:
                    out[n, s] = store(v)
                part += v
                weight_sum += w[k]
            acc += part
        if reduction == 0:
            weight_sum = np.float32(0)  # as on CPU
        loss[0] = store(acc / weight_sum if reduction == 1 else acc)
        total_weight[0] = store(weight_sum)
        return True, np.int64(0)

    return nll_loss


def _build_nll_backward(load, store):
    @njit(**JIT_OPTIONS)
    def nll_loss_backward(g, target, w, total_weight, gx, ignore, reduction):
        n_, classes, s_ = gx.shape
        zero = store(np.float32(0))
        for n in range(n_):
            for c in range(classes):
                for s in range(s_):
                    gx[n, c, s] = zero
        g_all = load(g[0, 0]) if reduction != 0 else np.float32(0)
        if reduction == 1:
            g_all = g_all / load(total_weight[0])
        for n in range(n_):
            for s in range(s_):
                k = target[n, s]
                if k == ignore:
                    continue
                if k < 0 or k >= classes:
                    return False, k
                gi = load(g[n, s]) if reduction == 0 else g_all
                gx[n, k, s] = store(-w[k] * gi)
        return True, np.int64(0)

    return nll_loss_backward


def _as_device(t: torch.Tensor, dtype: torch.dtype) -> T.NeuronTensor:
    """A neuron tensor of `dtype` (CPU 0-dim scalars are accepted alongside device tensors)."""
    if not isinstance(t, T.NeuronTensor):
        t = T.from_cpu(t.detach())
    return t if t.dtype == dtype else t.to(dtype)


def _out_of_bounds(k):
    return IndexError(f"Target {k} is out of bounds.")


def _check_nll(self, target, weight, spatial: bool):
    if target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got "
                           f"{_dtype_name(target.dtype)}")
    if spatial:
        if target.dim() != 3:
            raise RuntimeError("only batches of spatial targets supported (3D tensors) but got "
                               f"targets of dimension: {target.dim()}")
        if self.dim() != 4:
            raise RuntimeError("only batches of spatial inputs supported (4D tensors), but got "
                               f"input of dimension: {self.dim()}")
        if (self.shape[0], *self.shape[2:]) != tuple(target.shape):
            raise RuntimeError(f"size mismatch (got input: {list(self.shape)} , target: "
                               f"{list(target.shape)}")
    else:
        if not 1 <= self.dim() <= 2:
            raise RuntimeError("input tensor should be 1D or 2D")
        if target.dim() > 1:
            raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
        if not (self.dim() == 1 and target.dim() == 0) and (
                target.dim() == 0 or self.shape[0] != target.shape[0]):
            raise RuntimeError(f"size mismatch (got input: {list(self.shape)}, target: "
                               f"{list(target.shape)})")
    classes = self.shape[-1] if self.dim() == 1 else self.shape[1]
    if weight is not None:
        if weight.numel() != classes:
            raise RuntimeError(f"weight tensor should be defined either for all {classes} "
                               f"classes or no classes but got weight tensor of shape: "
                               f"{list(weight.shape)}")
        if weight.dtype != self.dtype:
            raise RuntimeError(f"expected scalar type {_dtype_name(self.dtype)} but found "
                               f"{_dtype_name(weight.dtype)}")
    return classes


def _nll_views(self, target, classes):
    """self as [N, C, S] and target as [N, S] (contiguous), and the per-item output shape."""
    batch = 1 if self.dim() == 1 else self.shape[0]
    spatial = T.numel(self.shape[2:])
    x = self.contiguous()
    t = (target if target.dtype == torch.int64 else target.to(torch.int64)).contiguous()
    x_nd = x._nd.reshape(batch, classes, spatial) if x.numel() else \
        np.empty((batch, classes, spatial), x._nd.dtype)
    return x, t, x_nd, t._nd.reshape(batch, spatial)


def nll_forward(self, target, weight, reduction, ignore_index, spatial):
    classes = _check_nll(self, target, weight, spatial)
    x, t, x_nd, t_nd = _nll_views(self, target, classes)
    w = f32_vector(weight, classes, 1.0)
    out, out_stage = staged(target.shape if reduction == NONE else (), self.dtype)
    tw, tw_stage = staged((), self.dtype)
    if reduction == NONE:
        per_item, loss = out_stage._nd.reshape(t_nd.shape), np.empty(1, out_stage._nd.dtype)
    else:
        per_item, loss = np.empty((0, 0), out_stage._nd.dtype), out_stage._nd.reshape(1)
    kernel = kernel_for(_build_nll, _code(self.dtype), _code(out_stage.dtype))
    ok, bad = kernel(x_nd, t_nd, w._nd, per_item, loss, tw_stage._nd.reshape(1),
                     np.int64(ignore_index), reduction)
    core.launch("gpsimd", t_nd.size, t._nd.nbytes + t_nd.size * x._nd.itemsize)
    if not ok:
        raise _out_of_bounds(bad)
    return finish(out, out_stage), finish(tw, tw_stage)


def nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight,
                 spatial):
    classes = _check_nll(self, target, weight, spatial)
    x, t, _, t_nd = _nll_views(self, target, classes)
    w = f32_vector(weight, classes, 1.0)
    g = _as_device(grad_output, self.dtype).contiguous()
    tw = _as_device(total_weight, self.dtype)
    gx, gx_stage = staged(self.shape, self.dtype)
    gx_nd = gx_stage._nd.reshape(t_nd.shape[0], classes, t_nd.shape[1]) if gx.numel() else \
        np.empty((t_nd.shape[0], classes, t_nd.shape[1]), gx_stage._nd.dtype)
    g_nd = g._nd.reshape(t_nd.shape) if reduction == NONE else g._nd.reshape(1, 1)
    kernel = kernel_for(_build_nll_backward, _code(self.dtype), _code(gx_stage.dtype))
    ok, bad = kernel(g_nd, t_nd, w._nd, tw._nd.reshape(1), gx_nd, np.int64(ignore_index),
                     reduction)
    core.launch("gpsimd", gx.numel(), gx._nd.nbytes + t._nd.nbytes)
    if not ok:
        raise _out_of_bounds(bad)
    return finish(gx, gx_stage)


@register(aten.nll_loss_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    return nll_forward(self, target, weight, reduction, ignore_index, spatial=False)


@register(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    return nll_forward(self, target, weight, reduction, ignore_index, spatial=True)


@register(aten.nll_loss_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return nll_backward(grad_output, self, target, weight, reduction, ignore_index,
                        total_weight, spatial=False)


@register(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index,
                        total_weight):
    return nll_backward(grad_output, self, target, weight, reduction, ignore_index,
                        total_weight, spatial=True)
