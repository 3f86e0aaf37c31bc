"""nn.LSTM, nn.GRU and nn.RNN as whole-sequence kernels with their own backward (cuDNN's
role).

Note [Whole-sequence RNN layers]
`aten::lstm`, `gru`, `rnn_tanh` and `rnn_relu` (`.input`: a padded sequence; `.data`: a
PackedSequence's rows and batch sizes) decompose, on any device but the CPU, into a cell per
time step: two matmuls, a cell (ops/recurrent.py) and the stacking, each a full dispatch,
forward and backward. A 2-layer LSTM over 50 steps made 3,118 launches a training step, 30x
the CPU's time. Here each layer and direction is one autograd node over the steps laid out
as rows (a padded sequence is a packed one whose batch never shrinks):
- forward: one matmul for the input gates of every step (a device mm), then one loop over
  the steps (rnn_kernels.*_sequence): the recurrent product, chunked in K as the device's
  matmuls, and the cell, the same fp32 operations as the per-step cell;
- backward: one loop over the steps in reverse for the gate gradients and the state
  gradients they pass back, then device matmuls for the input, weight and bias gradients
  over all steps at once.
An LSTM's projection (proj_size P: w_hr (P, H)) is one more product in the loop, each
step's cell output times w_hr transposed: its output and recurrent state, P wide. Backward
takes the output gradients through w_hr in the loop and w_hr's gradient is one product.
Values are the per-step path's up to the order of fp32 sums (a weight gradient is one
product over all steps, not a sum of per-step products). The per-step path stays for what
this does not cover: 16-bit layers and autocast (they round after every op, as the CPU's
own cell does; with oneDNN on, the CPU's bf16 LSTM runs a fused cell in fp32 instead, about
1.7x closer to float64 than either). The backward is not differentiable: a second
derivative through an RNN layer raises (Note [No second derivative]).

Note [Dropout between layers]
While training with dropout, each layer's output but the last goes through aten.dropout,
as in the decomposition: its rows (steps-major, directions side by side) are the elements of
the decomposition's (T, B, H) output in the same order, so the masks are the same draws.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import blas_threads, rnn_kernels
from neuron_eager.ops import tensor as T
from neuron_eager.ops.registry import on_autograd_key

aten = torch.ops.aten
WHOLE_SEQUENCE = True  # off: the per-step decomposition (benchmarks/recurrent.py compares)
_WORKSPACE = {"lstm": 4, "gru": 5, "rnn_tanh": 0, "rnn_relu": 0}  # per step, in units of H
_CELLS = {"gru": rnn_kernels.GRU, "rnn_tanh": rnn_kernels.RNN_TANH,
          "rnn_relu": rnn_kernels.RNN_RELU}
_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _mm(a, b):
    return aten.mm.default(a, b)


def _launch(kind: str, rows: int, hidden: int, width: int, nbytes: int) -> None:
    """The step loop as one Tensor-engine launch: its recurrent products (states `width`
    wide), an LSTM's projections (width < hidden), cells included."""
    shapes = [(1, rows, width, _GATES[kind] * hidden)]
    if width != hidden:
        shapes.append((1, rows, hidden, width))
    core.launch("tensor", sum(m * k * n for _, m, k, n in shapes), nbytes,  # (one shape:
                matmul=shapes if len(shapes) > 1 else shapes[0], dtype="fp32")  # price cached)


class _Layer(torch.autograd.Function):
    """One layer in one direction over steps laid out as rows (rnn_kernels' layout): x (N, I)
    and the batch sizes per step -> (outputs (N, P), h_n[, c_n]); P is H but with an LSTM's
    projection w_hr (P, H)."""

    @staticmethod
    def forward(ctx, kind, reverse, sizes, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr):
        rows, (batch, width) = x.shape[0], h0.shape
        hidden = w_hh.shape[0] // _GATES[kind]
        xg = _mm(x, aten.t.default(w_ih))  # every step's input gates, one launch
        w_t = aten.t.default(w_hh).contiguous()
        bias = b_ih is not None
        ib, hb = (b_ih.contiguous()._nd, b_hh.contiguous()._nd) if bias else \
            (rnn_kernels.NO_BIAS, rnn_kernels.NO_BIAS)
        hs, hp = T.empty((rows, width), torch.float32), T.empty((rows, width), torch.float32)
        hn = T.empty((batch, width), torch.float32)
        ws = T.empty((rows, _WORKSPACE[kind] * hidden), torch.float32)
        h0_ = h0.contiguous()
        hc = None
        previous = blas_threads.limit(1)  # (Note [One BLAS thread])
        try:
            if kind == "lstm":
                cs, cp = (T.empty((rows, hidden), torch.float32) for _ in range(2))
                cn = T.empty((batch, hidden), torch.float32)
                proj = w_hr is not None
                hc = T.empty(cs.shape, torch.float32) if proj else hs  # (the cells' outputs)
                w_r = aten.t.default(w_hr).contiguous()._nd if proj else \
                    rnn_kernels.NO_PROJECTION
                rnn_kernels.lstm_sequence(hs._nd, hc._nd, cs._nd, ws._nd, hp._nd, cp._nd,
                                          hn._nd, cn._nd, xg._nd, h0_._nd,
                                          c0.contiguous()._nd, w_t._nd, w_r, ib, hb, bias,
                                          proj, sizes, reverse)
            else:  # (an Elman layer's states are its activations: an empty workspace)
                cs = cp = cn = None
                rnn_kernels.single_state_sequence(hs._nd, ws._nd, hp._nd, hn._nd, xg._nd,
                                                  h0_._nd, w_t._nd, ib, hb, bias,
                                                  _CELLS[kind], sizes, reverse)
        finally:
            blas_threads.restore(previous)
        _launch(kind, rows, hidden, width,
                xg._nd.nbytes + 3 * hs._nd.nbytes + ws._nd.nbytes)
        ctx.kind, ctx.reverse, ctx.bias, ctx.sizes = kind, reverse, bias, sizes
        # (hc only when it is not the output: ctx holding its own output would be a cycle
        # that keeps the layer's memory until the garbage collector runs)
        ctx.ws, ctx.cs, ctx.cp, ctx.hp = ws, cs, cp, hp
        ctx.hc = hc if w_hr is not None else None
        # (the output is saved, as the CPU's oneDNN layer saves it: updating it in place
        # makes backward raise there and here; not a projected LSTM's: the CPU runs those
        # on its native layer, which does not save it)
        ctx.save_for_backward(x, w_ih, w_hh, w_hr, hs if w_hr is None else None)
        return (hs, hn, cn) if kind == "lstm" else (hs, hn)

    @staticmethod
    def backward(ctx, grad_out, grad_hn, grad_cn=None):
        with torch.no_grad(), torch.autocast("neuron", enabled=False):  # (inside autocast)
            grads = _Layer._backward(ctx, grad_out, grad_hn, grad_cn)
        if torch.is_grad_enabled():  # create_graph: Note [No second derivative]
            return _not_differentiable(grads, [t for t in ctx.saved_tensors[:4]
                                               if t is not None])
        return grads

    @staticmethod
    def _backward(ctx, grad_out, grad_hn, grad_cn):
        x, w_ih, w_hh, w_hr, hs = ctx.saved_tensors
        (rows, width), batch = ctx.hp.shape, grad_hn.shape[0]
        hidden = w_hh.shape[0] // _GATES[ctx.kind]
        grad_out, grad_hn = grad_out.contiguous(), grad_hn.contiguous()
        dh0 = T.empty((batch, width), torch.float32)
        grad_r = None  # (the gradients of a projected LSTM's outputs, recurrence included)
        gates = T.empty((rows, _GATES[ctx.kind] * hidden), torch.float32)  # wrt input gates
        w_hh_, sizes, reverse = w_hh.contiguous(), ctx.sizes, ctx.reverse
        previous = blas_threads.limit(1)
        try:
            if ctx.kind == "lstm":
                dc0 = T.empty((batch, hidden), torch.float32)
                proj = w_hr is not None
                if proj:
                    grad_r = T.empty((rows, width), torch.float32)
                no = rnn_kernels.NO_PROJECTION
                rnn_kernels.lstm_sequence_backward(
                    gates._nd, grad_r._nd if proj else no, dh0._nd, dc0._nd, grad_out._nd,
                    grad_hn._nd, grad_cn.contiguous()._nd, ctx.cs._nd, ctx.cp._nd,
                    ctx.ws._nd, w_hh_._nd, w_hr.contiguous()._nd if proj else no, proj,
                    sizes, reverse)
                hidden_gates = gates
            elif ctx.kind == "gru":
                dc0 = None
                hidden_gates = T.empty(gates.shape, torch.float32)
                rnn_kernels.gru_sequence_backward(gates._nd, hidden_gates._nd, dh0._nd,
                                                  grad_out._nd, grad_hn._nd, ctx.ws._nd,
                                                  w_hh_._nd, sizes, reverse)
            else:
                dc0, hidden_gates = None, gates
                rnn_kernels.rnn_sequence_backward(gates._nd, dh0._nd, grad_out._nd,
                                                  grad_hn._nd, hs._nd, w_hh_._nd,
                                                  ctx.kind == "rnn_relu", sizes, reverse)
        finally:
            blas_threads.restore(previous)
        _launch(ctx.kind, rows, hidden, width, 2 * gates._nd.nbytes + ctx.ws._nd.nbytes)
        grad_x = _mm(gates, w_ih)
        grad_w_ih = _mm(aten.t.default(gates), x)
        grad_w_hh = _mm(aten.t.default(hidden_gates), ctx.hp)  # (each row's previous state)
        grad_b_ih = aten.sum.dim_IntList(gates, [0]) if ctx.bias else None
        grad_b_hh = aten.sum.dim_IntList(hidden_gates, [0]) if ctx.bias else None
        grad_w_hr = None if grad_r is None else _mm(aten.t.default(grad_r), ctx.hc)
        return (None, None, None, grad_x, dh0, dc0, grad_w_ih, grad_w_hh, grad_b_ih,
                grad_b_hh, grad_w_hr)


_SECOND_DERIVATIVE = (
    "a second derivative through nn.LSTM, nn.GRU or nn.RNN is not supported on neuron: fp32 "
    "layers run as whole-sequence kernels whose backward is not differentiable (as cuDNN's "
    "on CUDA). Step through nn.LSTMCell, nn.GRUCell or nn.RNNCell to differentiate twice.")


class _NoSecondDerivative(torch.autograd.Function):
    """The first n inputs (a layer's gradients) as outputs, differentiable from the rest (the
    layer's inputs): differentiating them raises."""

    @staticmethod
    def forward(ctx, n, *tensors):
        return tuple(t.clone() for t in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_SECOND_DERIVATIVE)


def _not_differentiable(grads: tuple, inputs) -> tuple:
    """The gradients, each behind a node that hangs from the layer's inputs and raises if
    differentiated."""
    tensors = [g for g in grads if isinstance(g, torch.Tensor)]
    outs = iter(_NoSecondDerivative.apply(len(tensors), *tensors, *inputs))
    return tuple(next(outs) if isinstance(g, torch.Tensor) else g for g in grads)


# Note [No second derivative]
# Autograd's create_graph runs a backward with grad mode on, and expects gradients that it
# can differentiate again. The layer's kernels cannot be, so every gradient it returns then
# hangs from an error node whose inputs are the layer's input and weights: a second backward
# or autograd.grad toward any of them raises. (once_differentiable's error node hangs from
# the incoming gradients: a penalty on the gradient of out.sum() was silently disconnected,
# and autograd.grad toward the weights found them unused.)


def _covered(input, hx, params, has_biases, num_layers, dropout, train,
             bidirectional) -> bool:
    """Whether the whole-sequence path runs this call (else the per-step decomposition)."""
    tensors = [input, *hx, *params]
    if not WHOLE_SEQUENCE or any(type(t) is not T.NeuronTensor or t.dtype != torch.float32
                                 for t in tensors):
        return False
    if input.numel() == 0 or torch.is_autocast_enabled("neuron"):  # (autocast: 16-bit cells)
        return False
    per_layer, projected = _per_layer(hx, params, has_biases, num_layers, bidirectional)
    if len(params) != num_layers * (2 if bidirectional else 1) * per_layer:
        return False
    if projected:  # h is w_hr's width (proj_size), c the cell's
        w_hr = params[per_layer - 1]
        return hx[0].shape[-1] == w_hr.shape[0] and hx[1].shape[-1] == w_hr.shape[1]
    return all(h.shape[-1] == hx[0].shape[-1] for h in hx)


def _per_layer(hx, params, has_biases, num_layers, bidirectional) -> tuple[int, bool]:
    """The params of each layer and direction, w_ih, w_hh[, b_ih, b_hh][, w_hr], and whether
    w_hr (an LSTM's projection) is there, as their count says."""
    plain = 4 if has_biases else 2
    layers = num_layers * (2 if bidirectional else 1)
    projected = len(hx) == 2 and len(params) == layers * (plain + 1)
    return plain + projected, projected


def _check_length(input, batch_first) -> None:
    if input.dim() == 3 and input.shape[1 if batch_first else 0] == 0:
        raise RuntimeError("Expected sequence length to be larger than 0 in RNN")  # (the CPU's)


def _layers(kind, x, sizes, hx, params, has_biases, num_layers, dropout, train,
            bidirectional):
    """The layers in turn over rows x (N, I) with `sizes` rows a step, each direction one
    _Layer, dropout between layers while training: (outputs (N, directions * H), h_n
    stacked[, c_n stacked]). (Note [Dropout between layers])"""
    per_layer, projected = _per_layer(hx, params, has_biases, num_layers, bidirectional)
    directions = 2 if bidirectional else 1
    last_h, last_c = [], []
    for layer in range(num_layers):
        outputs = []
        for d in range(directions):
            k = layer * directions + d
            w = params[k * per_layer:(k + 1) * per_layer]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            c0 = hx[1][k] if kind == "lstm" else None
            w_hr = w[-1] if projected else None
            result = _Layer.apply(kind, d == 1, sizes, x, hx[0][k], c0, w[0], w[1], b_ih, b_hh,
                                  w_hr)
            outputs.append(result[0])
            last_h.append(result[1])
            if kind == "lstm":
                last_c.append(result[2])
        x = outputs[0] if directions == 1 else aten.cat.default(outputs, 1)
        if dropout > 0 and train and layer < num_layers - 1:
            x = aten.dropout.default(x, dropout, train)
    states = [aten.stack.default(last_h)]
    return x, *states, *([aten.stack.default(last_c)] if kind == "lstm" else [])


def _per_step(op, kind, inputs, hx, params, has_biases, num_layers, dropout, train,
              bidirectional, tail):
    """PyTorch's decomposition of `op` (a cell per step), a layer at a time with dropout
    between layers while training: the decomposition never applies it (its condition
    `num_layers < i - 1` is never true), so nn.LSTM(dropout=p) trained without dropout."""
    def decompose(x, states, weights, layers, p):
        return op.decompose(x, *inputs[1:], states if kind == "lstm" else states[0], weights,
                            has_biases, layers, p, train, bidirectional, *tail)

    if not (dropout > 0 and train and num_layers > 1):
        return decompose(inputs[0], hx, params, num_layers, dropout)
    directions = 2 if bidirectional else 1
    per_layer = len(params) // (num_layers * directions)
    x, finals = inputs[0], []
    for layer in range(num_layers):
        rows = slice(layer * directions, (layer + 1) * directions)
        weights = params[layer * directions * per_layer:(layer + 1) * directions * per_layer]
        x, *states = decompose(x, [h[rows] for h in hx], weights, 1, 0.0)
        finals.append(states)
        if layer < num_layers - 1:
            x = aten.dropout.default(x, dropout, train)
    return x, *[aten.cat.default(list(parts)) for parts in zip(*finals)]


def _sequence(kind, input, hx, params, has_biases, num_layers, dropout, train,
              bidirectional, batch_first):
    """`aten::<kind>.input`: a (T, B, I) sequence (B, T, I with batch_first)."""
    _check_length(input, batch_first)
    if input.dim() != 3 or not _covered(input, hx, params, has_biases, num_layers, dropout,
                                        train, bidirectional):
        return _per_step(getattr(aten, kind).input, kind, (input,), hx, params, has_biases,
                         num_layers, dropout, train, bidirectional, (batch_first,))
    x = aten.transpose.int(input, 0, 1) if batch_first else input
    steps, batch = x.shape[0], x.shape[1]
    sizes = np.full(steps, batch, np.int64)
    out, *states = _layers(kind, aten.reshape.default(x, [steps * batch, x.shape[2]]), sizes,
                           hx, params, has_biases, num_layers, dropout, train, bidirectional)
    out = aten.view.default(out, [steps, batch, out.shape[1]])
    return (aten.transpose.int(out, 0, 1) if batch_first else out), *states


def _packed(kind, data, batch_sizes, hx, params, has_biases, num_layers, dropout, train,
            bidirectional):
    """`aten::<kind>.data`: a PackedSequence's rows and its (CPU) batch sizes."""
    if data.dim() != 2 or not isinstance(batch_sizes, torch.Tensor) or \
            batch_sizes.device.type != "cpu" or not _covered(
                data, hx, params, has_biases, num_layers, dropout, train, bidirectional):
        return _per_step(getattr(aten, kind).data, kind, (data, batch_sizes), hx, params,
                         has_biases, num_layers, dropout, train, bidirectional, ())
    sizes = batch_sizes.to(torch.int64).contiguous().numpy().copy()
    return tuple(_layers(kind, data, sizes, hx, params, has_biases, num_layers, dropout,
                         train, bidirectional))


def _kernels(kind: str):
    """The kernels of `aten::<kind>.input` and `.data`; the single-state kinds (GRU, Elman
    RNNs) take one state tensor where the LSTM takes two."""
    def sequence(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                 batch_first):
        return _sequence(kind, input, hx if kind == "lstm" else [hx], params, has_biases,
                         num_layers, dropout, train, bidirectional, batch_first)

    def packed(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train,
               bidirectional):
        return _packed(kind, data, batch_sizes, hx if kind == "lstm" else [hx], params,
                       has_biases, num_layers, dropout, train, bidirectional)

    return sequence, packed


for _kind in ("lstm", "gru", "rnn_tanh", "rnn_relu"):
    for _overload, _kernel in zip(("input", "data"), _kernels(_kind)):
        on_autograd_key(f"{_kind}.{_overload}", _kernel)
