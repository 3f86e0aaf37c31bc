"""nn.LSTM, nn.GRU and nn.RNN as whole-sequence kernels with their own backward (cuDNN's
role).

Note [Whole-sequence RNN layers]
`aten::lstm.input`, `gru.input`, `rnn_tanh.input` and `rnn_relu.input` decompose, on any
device but the CPU, into a cell per time step: two matmuls, a cell (ops/recurrent.py) and
the stacking, each a full dispatch, forward and backward. A 2-layer LSTM over 50 steps made
3,118 launches a training step, 30x the CPU's time. Here each layer and direction is one
autograd node:
- forward: one matmul for the input gates of every step (a device mm), then one loop over
  the steps (rnn_kernels.*_sequence): the recurrent product, chunked in K as the device's
  matmuls, and the cell, the same fp32 operations as the per-step cell;
- backward: one loop over the steps in reverse for the gate gradients and the state
  gradients they pass back, then device matmuls for the input, weight and bias gradients
  over all steps at once.
Values are the per-step path's up to the order of fp32 sums (a weight gradient is one
product over all steps, not a sum of per-step products). The per-step path stays for what
this does not cover: 16-bit layers and autocast (they round after every op, as the CPU
does), projections (proj_size), dropout between layers while training (its masks are drawn
in the decomposition's order), and packed sequences (the `*.data` overloads). The backward
is once-differentiable: a second derivative through an RNN layer raises.
"""
from __future__ import annotations

import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import _compat, blas_threads, rnn_kernels
from neuron_eager.ops import tensor as T

aten = torch.ops.aten
WHOLE_SEQUENCE = True  # off: the per-step decomposition (benchmarks/recurrent.py compares)
_WORKSPACE = {"lstm": 4, "gru": 5, "rnn_tanh": 0, "rnn_relu": 0}  # per step, in units of H
_CELLS = {"gru": rnn_kernels.GRU, "rnn_tanh": rnn_kernels.RNN_TANH,
          "rnn_relu": rnn_kernels.RNN_RELU}
_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _mm(a, b):
    return aten.mm.default(a, b)


def _flat(x):
    return aten.reshape.default(x, [-1, x.shape[-1]])


def _launch(kind: str, steps: int, batch: int, hidden: int, nbytes: int) -> None:
    """The step loop as one Tensor-engine launch: its recurrent products, cells included."""
    gates = _GATES[kind] * hidden
    core.launch("tensor", steps * batch * hidden * gates, nbytes,
                matmul=(steps, batch, hidden, gates), dtype="fp32")


class _Layer(torch.autograd.Function):
    """One layer in one direction: x (T, B, I) -> (outputs (T, B, H), h_n[, c_n])."""

    @staticmethod
    def forward(ctx, kind, reverse, x, h0, c0, w_ih, w_hh, b_ih, b_hh):
        steps, batch = x.shape[0], x.shape[1]
        hidden = w_hh.shape[1]
        xg = _mm(_flat(x), aten.t.default(w_ih))  # every step's input gates, one launch
        w_t = aten.t.default(w_hh).contiguous()
        bias = b_ih is not None
        ib, hb = (b_ih.contiguous()._nd, b_hh.contiguous()._nd) if bias else \
            (rnn_kernels.NO_BIAS, rnn_kernels.NO_BIAS)
        hs = T.empty((steps, batch, hidden), torch.float32)
        hn = T.empty((batch, hidden), torch.float32)
        ws = T.empty((steps, batch, _WORKSPACE[kind] * hidden), torch.float32)
        h0_ = h0.contiguous()
        xg_ = xg._nd.reshape(steps, batch, -1)
        previous = blas_threads.limit(1)  # (Note [One BLAS thread])
        try:
            if kind == "lstm":
                cs, cn = T.empty(hs.shape, torch.float32), T.empty(hn.shape, torch.float32)
                rnn_kernels.lstm_sequence(hs._nd, cs._nd, ws._nd, hn._nd, cn._nd, xg_, h0_._nd,
                                          c0.contiguous()._nd, w_t._nd, ib, hb, bias, reverse)
            else:  # (an Elman layer's states are its activations: an empty workspace)
                cs = cn = None
                rnn_kernels.single_state_sequence(hs._nd, ws._nd, hn._nd, xg_, h0_._nd,
                                                  w_t._nd, ib, hb, bias, _CELLS[kind], reverse)
        finally:
            blas_threads.restore(previous)
        _launch(kind, steps, batch, hidden, xg._nd.nbytes + 2 * hs._nd.nbytes + ws._nd.nbytes)
        ctx.kind, ctx.reverse, ctx.bias = kind, reverse, bias
        ctx.ws, ctx.cs = ws, cs
        # (the output is saved, as the CPU's oneDNN layer saves it: updating it in place
        # makes backward raise there and here)
        ctx.save_for_backward(x, h0_, c0, w_ih, w_hh, hs)
        return (hs, hn, cn) if kind == "lstm" else (hs, hn)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, grad_hn, grad_cn=None):
        with torch.autocast("neuron", enabled=False):  # (a backward run inside autocast)
            return _Layer._backward(ctx, grad_out, grad_hn, grad_cn)

    @staticmethod
    def _backward(ctx, grad_out, grad_hn, grad_cn):
        x, h0, c0, w_ih, w_hh, hs = ctx.saved_tensors
        steps, batch, hidden = hs.shape
        n_gates = _GATES[ctx.kind] * hidden
        grad_out, grad_hn = grad_out.contiguous(), grad_hn.contiguous()
        dh0 = T.empty((batch, hidden), torch.float32)
        gates = T.empty((steps, batch, n_gates), torch.float32)  # wrt the input gates
        w_hh_ = w_hh.contiguous()
        previous = blas_threads.limit(1)
        try:
            if ctx.kind == "lstm":
                dc0 = T.empty((batch, hidden), torch.float32)
                rnn_kernels.lstm_sequence_backward(
                    gates._nd, dh0._nd, dc0._nd, grad_out._nd, grad_hn._nd,
                    grad_cn.contiguous()._nd, ctx.cs._nd, ctx.ws._nd, c0.contiguous()._nd,
                    w_hh_._nd, ctx.reverse)
                hidden_gates = gates
            elif ctx.kind == "gru":
                dc0 = None
                hidden_gates = T.empty(gates.shape, torch.float32)
                rnn_kernels.gru_sequence_backward(gates._nd, hidden_gates._nd, dh0._nd,
                                                  grad_out._nd, grad_hn._nd, ctx.ws._nd,
                                                  w_hh_._nd, ctx.reverse)
            else:
                dc0, hidden_gates = None, gates
                rnn_kernels.rnn_sequence_backward(gates._nd, dh0._nd, grad_out._nd,
                                                  grad_hn._nd, hs._nd, w_hh_._nd,
                                                  ctx.kind == "rnn_relu", ctx.reverse)
        finally:
            blas_threads.restore(previous)
        _launch(ctx.kind, steps, batch, hidden, 2 * gates._nd.nbytes + ctx.ws._nd.nbytes)
        # each step's previous hidden state, in the forward's order
        first = aten.unsqueeze.default(h0, 0)
        if ctx.reverse:
            previous_h = aten.cat.default([aten.slice.Tensor(hs, 0, 1), first])
        else:
            previous_h = aten.cat.default([first, aten.slice.Tensor(hs, 0, 0, steps - 1)])
        g_in, g_hid = _flat(gates), _flat(hidden_gates)
        grad_x = aten.reshape.default(_mm(g_in, w_ih), list(x.shape))
        grad_w_ih = _mm(aten.t.default(g_in), _flat(x))
        grad_w_hh = _mm(aten.t.default(g_hid), _flat(previous_h))
        grad_b_ih = aten.sum.dim_IntList(g_in, [0]) if ctx.bias else None
        grad_b_hh = aten.sum.dim_IntList(g_hid, [0]) if ctx.bias else None
        return (None, None, grad_x, dh0, dc0, grad_w_ih, grad_w_hh, grad_b_ih, grad_b_hh)


def _covered(input, hx, params, has_biases, num_layers, dropout, train,
             bidirectional) -> bool:
    """Whether the whole-sequence path runs this call (else the per-step decomposition)."""
    tensors = [input, *hx, *params]
    if not WHOLE_SEQUENCE or any(type(t) is not T.NeuronTensor or t.dtype != torch.float32
                                 for t in tensors):
        return False
    if input.dim() != 3 or input.numel() == 0 or (dropout > 0 and train and num_layers > 1) \
            or torch.is_autocast_enabled("neuron"):  # (autocast runs the cells in 16 bits)
        return False
    per_layer = 4 if has_biases else 2  # (projections add a weight per layer and direction)
    if len(params) != num_layers * (2 if bidirectional else 1) * per_layer:
        return False
    return all(h.shape[-1] == hx[0].shape[-1] for h in hx)  # (h has proj_size's width)


def _check_length(input, batch_first) -> None:
    if input.dim() == 3 and input.shape[1 if batch_first else 0] == 0:
        raise RuntimeError("Expected sequence length to be larger than 0 in RNN")  # (the CPU's)


def _run(kind, input, hx, params, has_biases, num_layers, bidirectional, batch_first):
    """The layers in turn, each direction one _Layer; results laid out as the CPU's."""
    per_layer = 4 if has_biases else 2
    directions = 2 if bidirectional else 1
    x = aten.transpose.int(input, 0, 1) if batch_first else input
    last_h, last_c = [], []
    for layer in range(num_layers):
        outputs = []
        for d in range(directions):
            k = layer * directions + d
            w = params[k * per_layer:(k + 1) * per_layer]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            h0 = hx[0][k]
            c0 = hx[1][k] if kind == "lstm" else None
            result = _Layer.apply(kind, d == 1, x, h0, c0, w[0], w[1], b_ih, b_hh)
            outputs.append(result[0])
            last_h.append(result[1])
            if kind == "lstm":
                last_c.append(result[2])
        x = outputs[0] if directions == 1 else aten.cat.default(outputs, 2)
    output = aten.transpose.int(x, 0, 1) if batch_first else x
    hy = aten.stack.default(last_h)
    return (output, hy, aten.stack.default(last_c)) if kind == "lstm" else (output, hy)


def lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
         batch_first):
    _check_length(input, batch_first)
    if not _covered(input, hx, params, has_biases, num_layers, dropout, train, bidirectional):
        return aten.lstm.input.decompose(input, hx, params, has_biases, num_layers, dropout,
                                         train, bidirectional, batch_first)
    return _run("lstm", input, hx, params, has_biases, num_layers, bidirectional, batch_first)


def _single_state(kind: str):
    """The kernel of `aten::<kind>.input` (GRU, Elman RNNs: one state tensor)."""
    op = getattr(aten, kind).input

    def run(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
            batch_first):
        _check_length(input, batch_first)
        if not _covered(input, [hx], params, has_biases, num_layers, dropout, train,
                        bidirectional):
            return op.decompose(input, hx, params, has_biases, num_layers, dropout, train,
                                bidirectional, batch_first)
        return _run(kind, input, [hx], params, has_biases, num_layers, bidirectional,
                    batch_first)

    return run


_library = torch.library.Library("aten", "IMPL")
for _name, _kernel in (("lstm.input", lstm), *((f"{kind}.input", _single_state(kind))
                                                 for kind in ("gru", "rnn_tanh", "rnn_relu"))):
    _compat.keep_dynamo_out(_kernel)  # (called from C++ while a compiled graph runs)
    _library.impl(_name, _kernel, "AutogradPrivateUse1")
