"""Connectionist temporal classification loss (aten._ctc_loss and its backward), both
overloads (lengths as lists or as tensors).

The CPU's alpha/beta recursions (LossCTC.cpp, Graves et al. 2006) run in fp32 log space on
widened log-probabilities; results are rounded once into the log_probs dtype. Arguments the
kernel does not handle, and bad ones, go to the CPU, which raises its own errors.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit
from neuron_eager.ops.kernelgen import JIT_OPTIONS
from neuron_eager.ops.matmul import narrow_into, widen
from neuron_eager.ops.registry import on_autograd_key, register

aten = torch.ops.aten


def cpu_fallback(op, args, kwargs):
    from neuron_eager.ops import router

    return router.cpu_fallback(op, args, kwargs)


def check_devices(tensors) -> None:
    from neuron_eager.ops import router

    router.check_devices(tensors)


# log_probs are (T, N, C) values, targets flat int64 with per-sample offsets and a stride;
# the extended target s is blank for even s and target[s // 2] for odd s.
_NEG_INF = np.float32(-np.inf)


@njit(inline="always")
def _prime(targets, offset, stride, s, blank):
    return blank if s % 2 == 0 else targets[offset + stride * (s // 2)]


@njit(inline="always")
def _log_add3(a, b, c):
    m = max(a, max(b, c))
    if m == _NEG_INF:
        m = np.float32(0)
    return np.log(np.exp(a - m) + np.exp(b - m) + np.exp(c - m)) + m


@njit(**JIT_OPTIONS)
def ctc_alpha(lp, targets, offsets, stride, in_lens, tg_lens, blank, alpha, nll):
    for b in range(lp.shape[1]):
        T_, L = in_lens[b], tg_lens[b]
        off = offsets[b]
        if T_ == 0:
            nll[b] = np.float32(0) if L == 0 else np.float32(np.inf)
            continue
        alpha[b, 0, 0] = lp[0, b, blank]
        if L > 0:
            alpha[b, 0, 1] = lp[0, b, _prime(targets, off, stride, 1, blank)]
        for t in range(1, T_):
            for s in range(2 * L + 1):
                k = _prime(targets, off, stride, s, blank)
                a2 = alpha[b, t - 1, s - 1] if s > 0 else _NEG_INF
                a3 = _NEG_INF
                if s > 1 and _prime(targets, off, stride, s - 2, blank) != k:
                    a3 = alpha[b, t - 1, s - 2]
                alpha[b, t, s] = _log_add3(alpha[b, t - 1, s], a2, a3) + lp[t, b, k]
        if L == 0:
            nll[b] = -alpha[b, T_ - 1, 0]
        else:
            l1, l2 = alpha[b, T_ - 1, 2 * L], alpha[b, T_ - 1, 2 * L - 1]
            m = max(l1, l2)
            m = np.float32(0) if m == _NEG_INF else m
            nll[b] = -(np.log(np.exp(l1 - m) + np.exp(l2 - m)) + m)


@njit(**JIT_OPTIONS)
def ctc_beta_grad(lp, targets, offsets, stride, in_lens, tg_lens, blank, alpha, nll, go,
                  go_stride, zero_infinity, beta, grad):
    """grad (T, N, C), prefilled with -inf: log sums of alpha*beta per label, then the
    gradient exp(lp) - exp(sum + nll - lp), times grad_output."""
    Tmax, C = lp.shape[0], lp.shape[2]
    for b in range(lp.shape[1]):
        T_, L = in_lens[b], tg_lens[b]
        off = offsets[b]
        if zero_infinity and nll[b] == np.inf:
            for t in range(Tmax):
                for c in range(C):
                    grad[t, b, c] = np.float32(0)
            continue
        if T_ > 0:
            t = T_ - 1
            beta[b, t, 2 * L] = lp[t, b, blank]
            grad[t, b, blank] = alpha[b, t, 2 * L] + beta[b, t, 2 * L]
            if L > 0:
                k = _prime(targets, off, stride, 2 * L - 1, blank)
                beta[b, t, 2 * L - 1] = lp[t, b, k]
                grad[t, b, k] = alpha[b, t, 2 * L - 1] + beta[b, t, 2 * L - 1]
        for t in range(T_ - 2, -1, -1):
            for s in range(2 * L, -1, -1):
                k = _prime(targets, off, stride, s, blank)
                b2 = beta[b, t + 1, s + 1] if s < 2 * L else _NEG_INF
                b3 = _NEG_INF
                if s < 2 * L - 1 and _prime(targets, off, stride, s + 2, blank) != k:
                    b3 = beta[b, t + 1, s + 2]
                beta[b, t, s] = _log_add3(beta[b, t + 1, s], b2, b3) + lp[t, b, k]
                ab = alpha[b, t, s] + beta[b, t, s]
                cur = grad[t, b, k]
                if cur == _NEG_INF:
                    grad[t, b, k] = ab
                else:
                    m = max(cur, ab)
                    grad[t, b, k] = np.log(np.exp(cur - m) + np.exp(ab - m)) + m
        gr = go[b * go_stride]
        for t in range(T_):
            for c in range(C):
                v = lp[t, b, c]
                grad[t, b, c] = (np.exp(v) - np.exp(grad[t, b, c] + nll[b] - v)) * gr
        for t in range(T_, Tmax):
            for c in range(C):
                grad[t, b, c] = np.float32(0)


def _lengths(v) -> np.ndarray:
    if isinstance(v, T.NeuronTensor):
        return widen(v.contiguous()).astype(np.int64).reshape(-1) if v.numel() else \
            np.zeros(0, np.int64)
    if isinstance(v, torch.Tensor):  # on the CPU, as CUDA also accepts
        return v.detach().reshape(-1).to(torch.int64).numpy()
    return np.asarray(list(v), np.int64).reshape(-1)


def _as_lists(op_list, args: tuple, lengths_at: int):
    """The int[] overload and its arguments, lengths as lists: the CPU fallback then has no
    CPU tensor among neuron ones (lengths may live on either device)."""
    args = list(args)
    for k in (lengths_at, lengths_at + 1):
        if isinstance(args[k], torch.Tensor):
            args[k] = _lengths(args[k]).tolist()
    return op_list, tuple(args)


def _ctc_setup(log_probs, targets, input_lengths, target_lengths):
    """fp32 (T, N, C) log-probabilities, flat int64 targets, per-sample target offsets."""
    T_, N, C = log_probs.shape
    lpv = widen(log_probs.contiguous()).reshape(T_, N, C) if log_probs.numel() else \
        np.zeros((T_, N, C), np.float32)
    tv = widen(targets.contiguous()).astype(np.int64).reshape(-1) if targets.numel() else \
        np.zeros(1, np.int64)
    in_lens, tg_lens = _lengths(input_lengths), _lengths(target_lengths)
    if targets.dim() == 2:  # padded (N, S)
        offsets = np.arange(N, dtype=np.int64) * targets.shape[1]
    else:  # concatenated
        offsets = np.concatenate([[0], np.cumsum(tg_lens)[:-1]]).astype(np.int64)
    max_len = int(tg_lens.max()) if tg_lens.size else 0
    return lpv, tv, offsets, in_lens, tg_lens, (T_, N, C), max_len


def _ctc_ok(log_probs, targets, input_lengths, target_lengths, blank):
    """Arguments this kernel handles; anything else (and every bad input) goes to the CPU,
    which raises its own errors."""
    if not isinstance(log_probs, T.NeuronTensor) or not isinstance(targets, T.NeuronTensor):
        return False
    if log_probs.dtype not in (torch.float32, torch.float64) or log_probs.dim() != 3 or \
            targets.dtype not in (torch.int32, torch.int64) or targets.dim() not in (1, 2):
        return False
    T_, N, C = log_probs.shape
    in_lens, tg_lens = _lengths(input_lengths), _lengths(target_lengths)
    if in_lens.shape != (N,) or tg_lens.shape != (N,) or not 0 <= blank < C:
        return False
    if (in_lens < 0).any() or (in_lens > T_).any() or (tg_lens < 0).any():
        return False
    if targets.dim() == 2 and (targets.shape[0] != N or (tg_lens > targets.shape[1]).any()):
        return False
    if targets.dim() == 1 and tg_lens.sum() != targets.shape[0]:  # (the CPU: equal)
        return False
    tv = widen(targets.contiguous()) if targets.numel() else np.zeros(0, np.int64)
    return bool(tv.size == 0 or ((tv >= 0) & (tv < C)).all())


def _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    args = (log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)
    if log_probs.numel() == 0:  # ("log_probs tensor must not be empty")
        op, listed = _as_lists(aten._ctc_loss.default, args, 2)
        T.cpu_refusal(op, *listed)
    if not _ctc_ok(log_probs, targets, input_lengths, target_lengths, blank):
        return cpu_fallback(*_as_lists(aten._ctc_loss.default, args, 2), {})
    lpv, tv, offsets, in_lens, tg_lens, (T_, N, C), max_len = _ctc_setup(
        log_probs, targets, input_lengths, target_lengths)
    stride = 1
    alpha = np.full((N, T_, 2 * max_len + 1), _NEG_INF, np.float32)
    nll = np.zeros(N, np.float32)
    ctc_alpha(lpv, tv, offsets, stride, in_lens, tg_lens, blank, alpha, nll)
    nll_t = T.empty((N,), log_probs.dtype)
    alpha_t = T.empty(alpha.shape, log_probs.dtype)
    narrow_into(nll_t, nll)
    narrow_into(alpha_t, alpha.reshape(-1))
    core.launch("vector", alpha.size, lpv.nbytes + alpha.nbytes)
    return nll_t, alpha_t


@register(aten._ctc_loss.default, aten._ctc_loss.Tensor)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    check_devices((log_probs, targets))
    return _ctc_forward(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)


ctc_loss.checks_devices = True  # lengths may be CPU tensors


@register(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths,
                      neg_log_likelihood, log_alpha, blank, zero_infinity=False):
    check_devices((grad, log_probs, targets, neg_log_likelihood, log_alpha))
    args = (grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood,
            log_alpha, blank, zero_infinity)
    if not _ctc_ok(log_probs, targets, input_lengths, target_lengths, blank) or \
            not all(isinstance(t, T.NeuronTensor) for t in (grad, neg_log_likelihood, log_alpha)):
        return cpu_fallback(*_as_lists(aten._ctc_loss_backward.default, args, 3), {})
    lpv, tv, offsets, in_lens, tg_lens, (T_, N, C), max_len = _ctc_setup(
        log_probs, targets, input_lengths, target_lengths)
    alpha = widen(log_alpha.contiguous()).reshape(log_alpha.shape) if log_alpha.numel() else \
        np.zeros(tuple(log_alpha.shape), np.float32)
    nll = widen(neg_log_likelihood.contiguous()).reshape(-1) if N else np.zeros(0, np.float32)
    go = widen(grad)
    beta = np.full(alpha.shape, _NEG_INF, np.float32)
    values = np.full((T_, N, C), _NEG_INF, np.float32)
    ctc_beta_grad(lpv, tv, offsets, 1, in_lens, tg_lens, blank, alpha, nll, go,
                  grad.stride(0) if grad.dim() else 0, bool(zero_infinity), beta, values)
    out = T.empty(log_probs.shape, log_probs.dtype)
    narrow_into(out, values.reshape(-1))
    core.launch("vector", values.size, lpv.nbytes + alpha.nbytes + values.nbytes)
    return out


ctc_loss_backward.checks_devices = True


# Note [CTC lengths as tensors]
# aten::ctc_loss.Tensor decomposes one way for plain tensors (lengths copied to the CPU and
# read as int lists: CUDA takes CPU lengths this way) and another for tensor subclasses like
# ours (reduction "mean" divides the losses by the target lengths tensor itself, so CPU
# lengths meet neuron losses in a div and fail). This kernel takes the plain-tensor way.
def _ctc_loss_tensor_lengths(log_probs, targets, input_lengths, target_lengths, blank=0,
                             reduction=1, zero_infinity=False):
    for name, lengths in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or \
                lengths.dtype == torch.bool:
            raise RuntimeError(f"{name} must be integral")
    return aten.ctc_loss.IntList(log_probs, targets, _lengths(input_lengths).tolist(),
                                 _lengths(target_lengths).tolist(), blank, reduction,
                                 zero_infinity)


on_autograd_key("ctc_loss.Tensor", _ctc_loss_tensor_lengths)
