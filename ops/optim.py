"""The fused optimizer steps (`torch.optim.Adam/AdamW/SGD/Adagrad(fused=True)`), from foreach ops.

The CPU's fused kernels are the reference: gradients are unscaled in place by grad_scale,
a found_inf of 1 skips the whole step, bias corrections and the step size are computed in
double precision on the host, and the update runs in fp32. Each stage here is one foreach
op over all parameters (so adaptive eager fuses them as it fuses the foreach optimizers).
"""
from __future__ import annotations

import math

import torch

from neuron_eager.ops.registry import register

aten = torch.ops.aten


def _host_values(tensors) -> list[float]:
    """Scalars living in 1-element device tensors (the step counts), read in one transfer."""
    return aten.stack.default([aten.reshape.default(t, []) for t in tensors]).tolist()


def _skipped(found_inf) -> bool:
    return found_inf is not None and found_inf.item() == 1.0


def _unscaled(grads, grad_scale, maximize):
    if grad_scale is not None:  # stored back, as the fused kernels do
        aten._foreach_div_.List(grads, [grad_scale] * len(grads))  # (one element: ops/amp.py)
    return aten._foreach_neg.default(grads) if maximize else grads


def _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
          beta2, weight_decay, eps, amsgrad, maximize, decoupled, grad_scale=None,
          found_inf=None):
    if not params or _skipped(found_inf):
        return
    lr = lr.item() if isinstance(lr, torch.Tensor) else lr
    g = _unscaled(grads, grad_scale, maximize)
    if weight_decay != 0:
        if decoupled:
            aten._foreach_mul_.Scalar(params, 1 - lr * weight_decay)
        else:
            g = aten._foreach_add.List(g, params, alpha=weight_decay)
    aten._foreach_lerp_.Scalar(exp_avgs, g, 1 - beta1)
    aten._foreach_mul_.Scalar(exp_avg_sqs, beta2)
    aten._foreach_addcmul_.Scalar(exp_avg_sqs, g, g, 1 - beta2)
    steps = _host_values(state_steps)
    step_sizes = [-lr / (1 - beta1 ** s) for s in steps]
    corrections = [math.sqrt(1 - beta2 ** s) for s in steps]
    if amsgrad:
        aten._foreach_maximum_.List(max_exp_avg_sqs, exp_avg_sqs)
    denom = aten._foreach_sqrt.default(max_exp_avg_sqs if amsgrad else exp_avg_sqs)
    aten._foreach_div_.ScalarList(denom, corrections)
    aten._foreach_add_.Scalar(denom, eps)
    aten._foreach_addcdiv_.ScalarList(params, exp_avgs, denom, step_sizes)


def _in_fp32(step):
    """Run a fused step on 16-bit tensors as the CPU's fused kernels do: every intermediate
    in fp32, each stored tensor rounded once at the end (rounding each foreach stage to fp16
    underflowed Adam's second moment: -inf updates where the CPU's are finite)."""
    def run(*lists, **hyper):
        if not lists[0] or lists[0][0].dtype not in (torch.bfloat16, torch.float16):
            return step(*lists, **hyper)
        wide = [[aten._to_copy.default(t, dtype=torch.float32) for t in ts]
                if ts and ts[0].dtype in (torch.bfloat16, torch.float16) else ts
                for ts in lists]
        step(*wide, **hyper)
        for narrow, ts in zip(lists, wide):
            if ts is not narrow:
                aten._foreach_copy_.default(narrow, ts)

    return run


def _adam_step(decoupled: bool):
    @_in_fp32
    def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **hyper):
        _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
              decoupled=decoupled, **hyper)

    return step


register(aten._fused_adam_.default, aten._fused_adam_.tensor_lr)(_adam_step(False))
register(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr)(_adam_step(True))


@register(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr)
@_in_fp32
def fused_sgd_(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
               nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    if not params or _skipped(found_inf):
        return
    lr = lr.item() if isinstance(lr, torch.Tensor) else lr
    g = _unscaled(grads, grad_scale, maximize)
    if weight_decay != 0:
        g = aten._foreach_add.List(g, params, alpha=weight_decay)
    if momentum != 0:
        bufs = momentum_buffer_list
        if is_first_step:
            aten._foreach_copy_.default(bufs, g)
        else:
            aten._foreach_mul_.Scalar(bufs, momentum)
            aten._foreach_add_.List(bufs, g, alpha=1 - dampening)
        g = aten._foreach_add.List(g, bufs, alpha=momentum) if nesterov else bufs
    aten._foreach_add_.List(params, g, alpha=-lr)


@register(aten._fused_adagrad_.default, aten._fused_adagrad_.tensor_lr)
@_in_fp32
def fused_adagrad_(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
                   maximize, grad_scale=None, found_inf=None):
    if not params or _skipped(found_inf):
        return
    lr = lr.item() if isinstance(lr, torch.Tensor) else lr
    g = _unscaled(grads, grad_scale, maximize)
    if weight_decay != 0:
        g = aten._foreach_add.List(g, params, alpha=weight_decay)
    aten._foreach_addcmul_.Scalar(state_sums, g, g, 1)
    std = aten._foreach_sqrt.default(state_sums)
    aten._foreach_add_.Scalar(std, eps)
    # the CPU's order: p - (clr * g) / std, with clr per parameter from its step count
    steps = _host_values(state_steps)
    update = aten._foreach_mul.ScalarList(g, [lr / (1 + (s - 1) * lr_decay) for s in steps])
    aten._foreach_div_.List(update, std)
    aten._foreach_sub_.List(params, update)
