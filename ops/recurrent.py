"""Fused RNN cells: what nn.LSTM / nn.GRU call on a non-CPU device.

PyTorch's RNN layers pick `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell` (and their
backward) whenever the input is not on the CPU, and the CPU has no kernels for them, so
they cannot fall back. They are composed here from the device's elementwise, reduction
and cat kernels, with the workspace layouts CUDA uses (so autograd's formulas apply).
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import rnn_kernels
from neuron_eager.ops import tensor as T
from neuron_eager.ops.registry import register

aten = torch.ops.aten
_NO_GRAD = np.zeros((1, 1), np.float32)


def _fp32(*tensors) -> bool:
    """Whether a cell takes the one-launch fp32 path (Note [Fused RNN cells])."""
    return all(t is None or (type(t) is T.NeuronTensor and t.dtype == torch.float32)
               for t in tensors) and tensors[0].dim() == 2


def _arrays(*tensors, missing=rnn_kernels.NO_BIAS):
    return [missing if t is None else t.contiguous()._nd for t in tensors]


def _launch(*tensors) -> None:
    core.launch("vector", tensors[0].numel(), sum(t._nd.nbytes for t in tensors))


def _with_bias(gates, bias):
    return gates if bias is None else aten.add.Tensor(gates, bias)


@register(aten._thnn_fused_lstm_cell.default)
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    if _fp32(input_gates, hidden_gates, cx, input_bias, hidden_bias) and \
            (input_bias is None) == (hidden_bias is None):
        hy, cy = T.empty(cx.shape, cx.dtype), T.empty(cx.shape, cx.dtype)
        workspace = T.empty(input_gates.shape, cx.dtype)
        rnn_kernels.lstm_forward(hy._nd, cy._nd, workspace._nd,
                                 *_arrays(input_gates, hidden_gates, input_bias, hidden_bias, cx),
                                 input_bias is not None)
        _launch(workspace, input_gates, hidden_gates, cx, hy, cy)
        return hy, cy, workspace
    gates = aten.add.Tensor(_with_bias(input_gates, input_bias),
                            _with_bias(hidden_gates, hidden_bias))
    i, f, g, o = aten.chunk.default(gates, 4, 1)
    i, f, o = aten.sigmoid.default(i), aten.sigmoid.default(f), aten.sigmoid.default(o)
    g = aten.tanh.default(g)
    cy = aten.add.Tensor(aten.mul.Tensor(f, cx), aten.mul.Tensor(i, g))
    hy = aten.mul.Tensor(o, aten.tanh.default(cy))
    workspace = aten.cat.default([i, f, g, o], 1)  # the activated gates
    return hy, cy, workspace


def _sigmoid_grad(s):
    return aten.mul.Tensor(s, aten.rsub.Scalar(s, 1))


@register(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if _fp32(cx, cy, workspace, grad_hy, grad_cy):
        grad_gates = T.empty(workspace.shape, cx.dtype)
        grad_cx = T.empty(cx.shape, cx.dtype)
        hy_, cy_ = _arrays(grad_hy, grad_cy, missing=_NO_GRAD)
        rnn_kernels.lstm_backward(grad_gates._nd, grad_cx._nd, hy_, cy_,
                                  *_arrays(cx, cy, workspace), grad_hy is not None,
                                  grad_cy is not None)
        _launch(grad_gates, workspace, cx, cy, grad_cx)
        grad_bias = aten.sum.dim_IntList(grad_gates, [0]) if has_bias else None
        return grad_gates, grad_cx, grad_bias
    i, f, g, o = aten.chunk.default(workspace, 4, 1)
    tanh_cy = aten.tanh.default(cy)
    grad_c = aten.zeros_like.default(cy) if grad_cy is None else grad_cy
    if grad_hy is not None:
        dtanh = aten.rsub.Scalar(aten.mul.Tensor(tanh_cy, tanh_cy), 1)
        grad_c = aten.add.Tensor(grad_c, aten.mul.Tensor(aten.mul.Tensor(grad_hy, o), dtanh))
        grad_o = aten.mul.Tensor(aten.mul.Tensor(grad_hy, tanh_cy), _sigmoid_grad(o))
    else:
        grad_o = aten.zeros_like.default(o)
    grad_i = aten.mul.Tensor(aten.mul.Tensor(grad_c, g), _sigmoid_grad(i))
    grad_f = aten.mul.Tensor(aten.mul.Tensor(grad_c, cx), _sigmoid_grad(f))
    grad_g = aten.mul.Tensor(aten.mul.Tensor(grad_c, i), aten.rsub.Scalar(aten.mul.Tensor(g, g), 1))
    grad_gates = aten.cat.default([grad_i, grad_f, grad_g, grad_o], 1)
    grad_cx = aten.mul.Tensor(grad_c, f)
    grad_bias = aten.sum.dim_IntList(grad_gates, [0]) if has_bias else None
    return grad_gates, grad_cx, grad_bias


@register(aten._thnn_fused_gru_cell.default)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if _fp32(input_gates, hidden_gates, hx, input_bias, hidden_bias) and \
            (input_bias is None) == (hidden_bias is None):
        hy = T.empty(hx.shape, hx.dtype)
        workspace = T.empty((hx.shape[0], 5 * hx.shape[1]), hx.dtype)
        rnn_kernels.gru_forward(hy._nd, workspace._nd,
                                *_arrays(input_gates, hidden_gates, input_bias, hidden_bias, hx),
                                input_bias is not None)
        _launch(workspace, input_gates, hidden_gates, hx, hy)
        return hy, workspace
    ir, ii, in_ = aten.chunk.default(_with_bias(input_gates, input_bias), 3, 1)
    hr, hi, hn = aten.chunk.default(_with_bias(hidden_gates, hidden_bias), 3, 1)
    r = aten.sigmoid.default(aten.add.Tensor(ir, hr))
    z = aten.sigmoid.default(aten.add.Tensor(ii, hi))
    n = aten.tanh.default(aten.add.Tensor(in_, aten.mul.Tensor(r, hn)))
    hy = aten.add.Tensor(n, aten.mul.Tensor(z, aten.sub.Tensor(hx, n)))
    workspace = aten.cat.default([r, z, n, hx, hn], 1)
    return hy, workspace


@register(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    if _fp32(grad_hy, workspace):
        B, H = grad_hy.shape
        grad_in, grad_hidden = T.empty((B, 3 * H), grad_hy.dtype), T.empty((B, 3 * H), grad_hy.dtype)
        grad_hx = T.empty((B, H), grad_hy.dtype)
        rnn_kernels.gru_backward(grad_in._nd, grad_hidden._nd, grad_hx._nd,
                                 *_arrays(grad_hy, workspace))
        _launch(grad_in, grad_hidden, grad_hx, grad_hy, workspace)
        if has_bias:
            return (grad_in, grad_hidden, grad_hx, aten.sum.dim_IntList(grad_in, [0]),
                    aten.sum.dim_IntList(grad_hidden, [0]))
        return grad_in, grad_hidden, grad_hx, None, None
    r, z, n, hx, hn = aten.chunk.default(workspace, 5, 1)
    grad_hx = aten.mul.Tensor(grad_hy, z)
    grad_z = aten.mul.Tensor(aten.mul.Tensor(grad_hy, aten.sub.Tensor(hx, n)), _sigmoid_grad(z))
    grad_n = aten.mul.Tensor(aten.mul.Tensor(grad_hy, aten.rsub.Scalar(z, 1)),
                             aten.rsub.Scalar(aten.mul.Tensor(n, n), 1))
    grad_r = aten.mul.Tensor(aten.mul.Tensor(grad_n, hn), _sigmoid_grad(r))
    grad_input_gates = aten.cat.default([grad_r, grad_z, grad_n], 1)
    grad_hidden_gates = aten.cat.default([grad_r, grad_z, aten.mul.Tensor(grad_n, r)], 1)
    if has_bias:
        return (grad_input_gates, grad_hidden_gates, grad_hx,
                aten.sum.dim_IntList(grad_input_gates, [0]),
                aten.sum.dim_IntList(grad_hidden_gates, [0]))
    return grad_input_gates, grad_hidden_gates, grad_hx, None, None


@register(aten._pack_padded_sequence.default)
def pack_padded_sequence(input, lengths, batch_first):
    """PackedSequence data: the CPU packs a stand-in of element indices with the same
    lengths (its checks and errors included), the device gathers those rows. `lengths` is a
    CPU tensor, as on CUDA."""
    if not isinstance(lengths, torch.Tensor) or lengths.device.type != "cpu":
        raise RuntimeError("'lengths' argument should be a 1D CPU int64 tensor, but got "
                           f"{lengths.dim()}D {lengths.device.type} "
                           f"{T.dtype_name(lengths.dtype)} tensor")
    lead = tuple(input.shape[:2])
    index = torch.arange(lead[0] * lead[1]).reshape(lead)
    rows, batch_sizes = aten._pack_padded_sequence.default(index, lengths, batch_first)
    flat = aten.reshape.default(input, [lead[0] * lead[1], *input.shape[2:]])
    return aten.index_select.default(flat, 0, rows.to(input.device)), batch_sizes


pack_padded_sequence.checks_devices = True  # lengths live on the CPU
