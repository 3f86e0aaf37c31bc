"""Losses: negative log-likelihood (1-D and 2-D), MSE, smooth L1, Huber, binary cross
entropy (on probabilities and on logits), forward and backward.

Per-element terms are computed in fp32; a mean or sum is accumulated in fp32 and rounded
once into the loss dtype. F.cross_entropy is log_softmax (softmax family) + nll_loss here;
l1_loss and kl_div decompose into elementwise ops before reaching the device.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops.fastmath import exp_f32, log1p_f32, log_f32
from neuron_eager.ops.jit import njit
from neuron_eager.ops.kernelgen import JIT_OPTIONS
from neuron_eager.ops.matmul import narrow_into, widen
from neuron_eager.ops.meta import meta_run
from neuron_eager.ops.norm import f32_vector, finish, kernel_for, lane_total, staged
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
            acc += tile_total(values, start, min(start + 4096, n))
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


def pointwise_loss(op: E.Elementwise, meta, operands, params, reduction: int, dtype=None):
    """A loss whose terms are elementwise in broadcast operands; `dtype`: the result's, where
    the CPU gives its input's (default: the meta kernel's)."""
    shape = E.broadcast_shape([a.shape for a in operands if isinstance(a, E.NeuronTensor)])
    if reduction == NONE:
        if dtype is None:
            return E.run(op, operands, params)
        return E.run(op, operands, params, out=T.empty(shape, dtype))
    values = T.empty(shape, F32)  # terms stay fp32 until the single rounding of the total
    E.run(op, operands, params, out=values)
    return reduce_values(values, dtype or meta.dtype, reduction)


def check_same_dtype(expected: torch.dtype, *operands) -> None:
    """TensorIterator's check of a loss kernel whose operands must share one dtype."""
    for a in operands:
        if isinstance(a, torch.Tensor) and a.dtype != expected:
            raise RuntimeError(f"Found dtype {T.dtype_name(a.dtype)} but expected "
                               f"{T.dtype_name(expected)}")


def pointwise_backward(op: E.Elementwise, grad, operands, params, reduction: int):
    """d(loss)/d(self): op(*operands, grad, *params, scale), scale = 1/numel for a mean."""
    shape = E.broadcast_shape([a.shape for a in operands if isinstance(a, E.NeuronTensor)])
    scale = 1.0 / max(T.numel(shape), 1) if reduction == MEAN else 1.0
    return E.run(op, [*operands, grad], [*params, scale])


def _loss(name, fn, nparams=0, inline=False):
    return E.Elementwise(name, njit(fn, inline="always") if inline else njit(fn), nparams)


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
    if beta < 0:  # (the meta kernel lets it through)
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    return pointwise_loss(SMOOTH_L1, meta, [self, target], [beta], reduction)


@register(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    return pointwise_backward(SMOOTH_L1_BACKWARD, grad_output, [self, target], [beta],
                              reduction)


@register(aten.huber_loss.default)
def huber_loss(self, target, reduction=MEAN, delta=1.0):
    meta = meta_run(aten.huber_loss.default, self, target, reduction, delta)
    # (computed in the operands' common dtype, returned in self's, as the CPU)
    return pointwise_loss(HUBER, meta, [self, target], [delta], reduction, self.dtype)


@register(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    check_same_dtype(self.dtype, target, grad_output)
    return pointwise_backward(HUBER_BACKWARD, grad_output, [self, target], [delta], reduction)


# -- soft margin: the CPU's in-place sequences, which keep self's dtype ------------------
@register(aten.soft_margin_loss.default)
def soft_margin_loss(self, target, reduction=MEAN):
    loss = aten.neg.default(self)  # log1p(exp(-self * target)), each step rounded to self's
    aten.mul_.Tensor(loss, target)
    aten.exp_.default(loss)
    aten.log1p_.default(loss)
    if reduction == NONE:
        return loss
    return aten.mean.default(loss) if reduction == MEAN else aten.sum.default(loss)


@register(aten.soft_margin_loss_backward.default)
def soft_margin_loss_backward(grad_output, self, target, reduction):
    norm = 1.0 / self.numel() if reduction == MEAN else 1.0
    z = aten.exp.default(aten.mul.Tensor(aten.neg.default(target), self))
    grad = aten.mul.out(target, z, out=T.empty((0,), self.dtype))
    aten.mul_.Scalar(grad, -norm)
    aten.add_.Scalar(z, 1)
    aten.div_.Tensor(grad, z)
    aten.mul_.Tensor(grad, grad_output)
    return grad


# -- binary cross entropy ----------------------------------------------------------------
def _bce(x, t, w):
    lx = log_f32(x)  # logs are clamped at -100 as in PyTorch; NaN stays NaN
    lx = np.float32(-100) if lx < -100 else lx
    l1x = log1p_f32(-x)
    l1x = np.float32(-100) if l1x < -100 else l1x
    return w * ((t - _ONE) * l1x - t * lx)


def _bce_backward(x, t, w, g, scale):
    denom = (_ONE - x) * x
    denom = np.float32(1e-12) if denom < np.float32(1e-12) else denom
    return g * scale * w * (x - t) / denom


def _bce_logits(x, t, w, pos_weight):
    log_sigmoid = (x if x < 0 else _ZERO) - log1p_f32(exp_f32(-abs(x)))
    log_weight = (pos_weight - _ONE) * t + _ONE
    return w * ((_ONE - t) * x - log_weight * log_sigmoid)


BCE, BCE_BACKWARD = _loss("bce", _bce, inline=True), _loss("bce_backward", _bce_backward, 1)
BCE_LOGITS = _loss("bce_with_logits", _bce_logits, inline=True)  # Note [Inlined op bodies]


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
    check_same_dtype(self.dtype, target)  # (a weight of another dtype is taken)
    if self.numel():
        flat = self.contiguous()
        check = kernel_for(_build_unit_check, _code(self.dtype), _code(self.dtype))
        if not check(flat._nd.reshape(-1)):
            raise RuntimeError("all elements of input should be between 0 and 1")
    return pointwise_loss(BCE, meta, [self, target, 1.0 if weight is None else weight], [],
                          reduction, self.dtype)


@register(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=MEAN):
    check_same_dtype(self.dtype, grad_output, target)
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
    # the CPU's order: ranks, then the target's dtype, then sizes and the weight
    if spatial:
        if target.dim() != 3:
            raise RuntimeError("only batches of spatial targets supported (3D tensors) but got "
                               f"targets of dimension: {target.dim()}")
        if self.dim() != 4:
            raise RuntimeError("only batches of spatial inputs supported (4D tensors), but got "
                               f"input of dimension: {self.dim()}")
    else:
        if not 1 <= self.dim() <= 2:
            raise RuntimeError("input tensor should be 1D or 2D")
        if target.dim() > 1:
            raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got "
                           f"{_dtype_name(target.dtype)}")
    classes = self.shape[-1] if self.dim() == 1 else self.shape[1]
    if spatial:
        if weight is not None and weight.numel() != classes:
            raise RuntimeError("weight tensor should be defined either for all or no classes")
        if (self.shape[0], *self.shape[2:]) != tuple(target.shape):
            raise RuntimeError(f"size mismatch (got input: {list(self.shape)} , target: "
                               f"{list(target.shape)}")
    elif not (self.dim() == 1 and target.dim() == 0) and (
            target.dim() == 0 or self.shape[0] != target.shape[0]):
        raise RuntimeError(f"size mismatch (got input: {list(self.shape)}, target: "
                           f"{list(target.shape)})")
    if weight is not None:
        if weight.numel() != classes:
            raise RuntimeError(f"weight tensor should be defined either for all {classes} "
                               f"classes or no classes but got weight tensor of shape: "
                               f"{list(weight.shape)}")
        if weight.dtype != self.dtype:
            raise RuntimeError(f"expected scalar type {_dtype_name(self.dtype)} but found "
                               f"{_dtype_name(weight.dtype)}")
    if spatial and target.dtype == torch.uint8:  # (the CPU's 2-D kernel reads int64 only)
        raise RuntimeError("expected scalar type Long but found Byte")
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


# -- margin losses (backward; the forwards decompose) ------------------------------------
# Gradients are built per frame in fp32 as the CPU does (LossMultiMargin.cpp,
# LossMultilabelMargin.cpp), scaled by grad_output, and rounded once.
@njit(**JIT_OPTIONS)
def multi_margin_backward_kernel(gx, x, target, w, go, g, p, margin, per_frame):
    n_, dim = gx.shape
    for t in range(n_):
        k = target[t]
        if k < 0 or k >= dim:
            return False, k
        xt = x[t, k]
        total = np.float32(0)
        for d in range(dim):
            if d == k:
                continue
            z = margin - xt + x[t, d]
            if z > 0:
                h = g if p == 1 else np.float32(2) * g * z
                h *= w[k]
                total -= h
                gx[t, d] = h
            else:
                gx[t, d] = np.float32(0)
        gx[t, k] = total
        scale = go[t] if per_frame else go[0]
        for d in range(dim):
            gx[t, d] *= scale
    return True, np.int64(0)


@njit(**JIT_OPTIONS)
def multilabel_margin_backward_kernel(gx, x, target, is_target, go, g, per_frame):
    n_, dim = gx.shape
    for t in range(n_):
        for d in range(dim):
            gx[t, d] = np.float32(0)
        for dt in range(dim):
            k = target[t, dt]
            if k < 0:
                break
            xt = x[t, k]
            for d in range(dim):
                if is_target[t, d] == 0:
                    z = np.float32(1) - xt + x[t, d]
                    if z > 0:
                        gx[t, k] -= g
                        gx[t, d] += g
        scale = go[t] if per_frame else go[0]
        for d in range(dim):
            gx[t, d] *= scale


def cpu_fallback(op, args, kwargs):
    from neuron_eager.ops import router

    return router.cpu_fallback(op, args, kwargs)


def _frames(self, target):
    """self as fp32 (frames, dim) values, target as int64 (frames, ...) values."""
    dim = self.shape[-1] if self.dim() else 1
    frames = self.numel() // dim if dim else 0
    x = widen(self.contiguous()).reshape(frames, dim)
    if target.dtype != torch.int64:  # (the CPU's kernels read the target as int64)
        raise RuntimeError(f"expected scalar type Long but found {T.dtype_name(target.dtype)}")
    t = target.contiguous()
    tv = widen(t).reshape(frames, -1) if t.numel() else np.zeros((frames, 0), np.int64)
    return x, tv, frames, dim


def _grad_values(grad_output, frames):
    go = _as_device(grad_output, grad_output.dtype).contiguous()
    return widen(go).astype(np.float32), go.dim() > 0 and go.numel() == frames and frames > 1


@njit(**JIT_OPTIONS)
def multilabel_margin_kernel(x, target, is_target, out):
    """Per frame: sum over the targets before the first -1 of the hinge against every
    non-target, over dim (LossMultilabelMargin.cpp); fp32 sums."""
    n_, dim = x.shape
    for t in range(n_):
        for d in range(dim):
            is_target[t, d] = np.float32(0)
        for d in range(dim):
            k = target[t, d]
            if k < 0:
                break
            if k >= dim:
                return False
            is_target[t, k] = np.float32(1)
        total = np.float32(0)
        for dt in range(dim):
            k = target[t, dt]
            if k < 0:
                break
            xt = x[t, k]
            for d in range(dim):
                if is_target[t, d] == 0:
                    z = np.float32(1) - xt + x[t, d]
                    if z > 0:
                        total += z
        out[t] = total / np.float32(dim)
    return True


@register(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(self, target, reduction):
    # torch._decomp's version counts the entries after a -1 terminator; this follows the CPU
    args = (self, target, reduction)
    if not all(isinstance(t, T.NeuronTensor) for t in (self, target)) or \
            not self.dtype.is_floating_point or self.dim() > 2 or target.shape != self.shape \
            or self.numel() == 0:
        return cpu_fallback(aten.multilabel_margin_loss_forward.default, args, {})
    x, tv, frames, dim = _frames(self, target)
    is_target = np.zeros((frames, dim), np.float32)
    per_frame = np.zeros(frames, np.float32)
    if not multilabel_margin_kernel(x, tv, is_target, per_frame):
        raise RuntimeError("target index out of range")
    it = T.empty(self.shape, self.dtype)
    narrow_into(it, is_target.reshape(-1))
    if reduction == NONE:
        out = T.empty(self.shape[:-1] if self.dim() == 2 else (), self.dtype)
        narrow_into(out, per_frame)
    else:
        total = np.float32(per_frame.sum(dtype=np.float32))
        out = T.empty((), self.dtype)
        narrow_into(out, np.array([total / np.float32(frames) if reduction == MEAN else total],
                                  np.float32))
    core.launch("vector", x.size * dim, self._nd.nbytes * 2)
    return out, it


@njit(**JIT_OPTIONS)
def multi_margin_kernel(x, target, w, p, margin, out):
    n_, dim = x.shape
    for t in range(n_):
        k = target[t]
        if k < 0 or k >= dim:
            return False
        xt = x[t, k]
        total = np.float32(0)
        for d in range(dim):
            if d == k:
                continue
            z = margin - xt + x[t, d]
            if z > 0:
                h = z if p == 1 else z * z
                total += h * w[k]
        out[t] = total / np.float32(dim)
    return True


@register(aten.multi_margin_loss.default)
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=MEAN):
    # the decomposition gives 1-D inputs a (1,) loss where the CPU gives a 0-dim one
    args = (self, target, p, margin, weight, reduction)
    if not all(isinstance(t, T.NeuronTensor) for t in (self, target)) or \
            not self.dtype.is_floating_point or self.dim() > 2 or self.numel() == 0 or \
            p not in (1, 2) or target.numel() != (self.shape[0] if self.dim() == 2 else 1):
        return cpu_fallback(aten.multi_margin_loss.default, args, {})
    x, tv, frames, dim = _frames(self, target)
    w = widen(f32_vector(weight, dim, 1.0))
    per_frame = np.zeros(frames, np.float32)
    if not multi_margin_kernel(x, tv[:, 0].copy(), w, int(p), np.float32(margin), per_frame):
        raise RuntimeError("target out of range")
    if reduction == NONE:
        out = T.empty(self.shape[:-1] if self.dim() == 2 else (), self.dtype)
        narrow_into(out, per_frame)
    else:
        total = np.float32(per_frame.sum(dtype=np.float32))
        out = T.empty((), self.dtype)
        narrow_into(out, np.array([total / np.float32(frames) if reduction == MEAN else total],
                                  np.float32))
    core.launch("vector", x.size, self._nd.nbytes)
    return out


@register(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=MEAN):
    args = (grad_output, self, target, p, margin, weight, reduction)
    if not all(isinstance(t, T.NeuronTensor) for t in (self, target)):
        return cpu_fallback(aten.multi_margin_loss_backward.default, args, {})
    x, tv, frames, dim = _frames(self, target)
    w = widen(f32_vector(weight, dim, 1.0)) if dim else np.ones(0, np.float32)
    g = np.float32(1.0 / (frames * dim) if reduction == MEAN else 1.0 / dim) if dim else \
        np.float32(0)
    gx = T.empty(self.shape, self.dtype)
    values = np.zeros((frames, dim), np.float32)
    go, per_frame = _grad_values(grad_output, frames)
    if frames and dim:
        ok, bad = multi_margin_backward_kernel(values, x, tv[:, 0].copy(), w, go, g, int(p),
                                               np.float32(margin), per_frame)
        if not ok:
            raise RuntimeError("target out of range")
    narrow_into(gx, values.reshape(-1))
    core.launch("vector", gx.numel(), gx._nd.nbytes * 2)
    return gx


@register(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    args = (grad_output, self, target, reduction, is_target)
    if not all(isinstance(t, T.NeuronTensor) for t in (self, target, is_target)):
        return cpu_fallback(aten.multilabel_margin_loss_backward.default, args, {})
    x, tv, frames, dim = _frames(self, target)
    it = widen(is_target.contiguous()).reshape(frames, dim) if frames * dim else \
        np.zeros((frames, dim), np.int64)
    g = np.float32(1.0 / (frames * dim) if reduction == MEAN else 1.0 / dim) if dim else \
        np.float32(0)
    gx = T.empty(self.shape, self.dtype)
    values = np.zeros((frames, dim), np.float32)
    go, per_frame = _grad_values(grad_output, frames)
    if frames and dim:
        multilabel_margin_backward_kernel(values, x, tv, it, go, g, per_frame)
    narrow_into(gx, values.reshape(-1))
    core.launch("vector", gx.numel(), gx._nd.nbytes * 2)
    return gx



# CTC has its own file; importing it here registers it with the other losses.
from neuron_eager.ops import ctc  # noqa: E402,F401
