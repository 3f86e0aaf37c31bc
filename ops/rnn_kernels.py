"""One-launch fp32 LSTM and GRU cells (forward and backward) for ops/recurrent.py.

Note [Fused RNN cells]
nn.LSTM and nn.GRU call a fused cell per time step; composed from elementwise kernels it
cost ~12 launches forward and ~20 backward a step, each a full dispatch (an LSTM step of
batch 8 took ~1.3 ms, 26x the CPU's). These loops run the same fp32 operations in the same
order, with the elementwise ops' own sigmoid and tanh, so the results are the composition's
bits, in one launch. 16-bit cells keep the composition: it rounds after every op, as the
CPU's per-op LSTM does.
"""
from __future__ import annotations

import numpy as np

from neuron_eager.ops.elementwise import OPS_BY_NAME
from neuron_eager.ops.jit import njit
from neuron_eager.ops.matmul import TILE_K

_sigmoid = OPS_BY_NAME["sigmoid"].fn
_tanh = OPS_BY_NAME["tanh"].fn
_ONE = np.float32(1)
NO_BIAS = np.zeros(1, np.float32)  # the bias argument of a layer without biases
NO_PROJECTION = np.zeros((1, 1), np.float32)  # w_hr and grad_r of an LSTM without one


# Note [Vectorised cells]
# Each loop below stores into one array (a row segment): a loop storing into several, which
# LLVM cannot prove distinct from the ones it reads, stays scalar, and scalar sigmoid and
# tanh cost ~10 ns an element against ~0.5 vectorised (an LSTM cell of 16 x 128: 410 us
# with the stores together, 25 us split). The operations and their order are the same.
@njit(error_model="numpy", nogil=True)
def _preactivate(out, x, y, bx, by, bias):
    """out = (x + bx) + (y + by), or x + y without biases (activated in place after)."""
    if bias:
        for j in range(out.shape[0]):
            out[j] = (x[j] + bx[j]) + (y[j] + by[j])
    else:
        for j in range(out.shape[0]):
            out[j] = x[j] + y[j]


@njit(error_model="numpy", nogil=True)
def _sigmoid_in_place(v):
    for j in range(v.shape[0]):
        v[j] = _sigmoid(v[j])


@njit(error_model="numpy", nogil=True)
def _tanh_in_place(v):
    for j in range(v.shape[0]):
        v[j] = _tanh(v[j])


@njit(error_model="numpy", nogil=True)
def lstm_forward(hy, cy, ws, ig, hg, ib, hb, cx, bias):
    """Gates (B, 4H) -> hy, cy (B, H) and the activated gates ws (B, 4H): i, f, g, o."""
    B, H = cx.shape
    for b in range(B):
        w = ws[b]
        _preactivate(w, ig[b], hg[b], ib, hb, bias)
        _sigmoid_in_place(w[:2 * H])
        _tanh_in_place(w[2 * H:3 * H])
        _sigmoid_in_place(w[3 * H:])
        c, h, c_prev = cy[b], hy[b], cx[b]
        for j in range(H):
            c[j] = w[H + j] * c_prev[j] + w[j] * w[2 * H + j]
        for j in range(H):
            h[j] = w[3 * H + j] * _tanh(c[j])


@njit(error_model="numpy", nogil=True)
def lstm_backward(grad_gates, grad_cx, grad_hy, grad_cy, cx, cy, ws, has_hy, has_cy):
    B, H = cx.shape
    for b in range(B):
        w, gg, gcx = ws[b], grad_gates[b], grad_cx[b]
        gy = grad_hy[b] if has_hy else grad_hy[0]  # (without it: a 1 x 1 placeholder)
        for j in range(H):
            gcx[j] = _tanh(cy[b, j])  # (grad_cx holds tanh(cy), then the cell's gradient)
        for j in range(H):
            o = w[3 * H + j]
            gg[3 * H + j] = (gy[j] * gcx[j]) * (o * (_ONE - o)) if has_hy else np.float32(0)
        for j in range(H):
            gc = grad_cy[b, j] if has_cy else np.float32(0)
            if has_hy:
                gc = gc + (gy[j] * w[3 * H + j]) * (_ONE - gcx[j] * gcx[j])
            gcx[j] = gc
        for j in range(H):
            i = w[j]
            gg[j] = (gcx[j] * w[2 * H + j]) * (i * (_ONE - i))
        for j in range(H):
            f = w[H + j]
            gg[H + j] = (gcx[j] * cx[b, j]) * (f * (_ONE - f))
        for j in range(H):
            g = w[2 * H + j]
            gg[2 * H + j] = (gcx[j] * w[j]) * (_ONE - g * g)
        for j in range(H):
            gcx[j] = gcx[j] * w[H + j]


@njit(error_model="numpy", nogil=True)
def gru_forward(hy, ws, ig, hg, ib, hb, hx, bias):
    """Gates (B, 3H) -> hy (B, H) and the workspace ws (B, 5H): r, z, n, hx, hn."""
    B, H = hx.shape
    for b in range(B):
        w, x, y, h = ws[b], ig[b], hg[b], hx[b]
        _preactivate(w[:2 * H], x[:2 * H], y[:2 * H], ib, hb, bias)
        _sigmoid_in_place(w[:2 * H])
        for j in range(H):
            w[4 * H + j] = y[2 * H + j] + hb[2 * H + j] if bias else y[2 * H + j]
        for j in range(H):
            xn = x[2 * H + j] + ib[2 * H + j] if bias else x[2 * H + j]
            w[2 * H + j] = _tanh(xn + w[j] * w[4 * H + j])
        for j in range(H):
            w[3 * H + j] = h[j]
        out = hy[b]
        for j in range(H):
            n = w[2 * H + j]
            out[j] = n + w[H + j] * (h[j] - n)


@njit(error_model="numpy", nogil=True)
def gru_backward(grad_in, grad_hidden, grad_hx, grad_hy, ws):
    B, H = grad_hy.shape
    for b in range(B):
        w, gi, gh, gy, ghx = ws[b], grad_in[b], grad_hidden[b], grad_hy[b], grad_hx[b]
        for j in range(H):
            ghx[j] = gy[j] * w[H + j]
        for j in range(H):
            z = w[H + j]
            gi[H + j] = (gy[j] * (w[3 * H + j] - w[2 * H + j])) * (z * (_ONE - z))
        for j in range(H):
            n = w[2 * H + j]
            gi[2 * H + j] = (gy[j] * (_ONE - w[H + j])) * (_ONE - n * n)
        for j in range(H):
            r = w[j]
            gi[j] = (gi[2 * H + j] * w[4 * H + j]) * (r * (_ONE - r))
        for j in range(2 * H):
            gh[j] = gi[j]
        for j in range(H):
            gh[2 * H + j] = gi[2 * H + j] * w[j]


# -- whole sequences (Note [Whole-sequence RNN layers] in ops/rnn_layers.py) -------------------
# Steps are rows of flat arrays, as in a PackedSequence: step t is rows off[t]:off[t] + b[t]
# (b: the batch sizes, never growing; a plain (T, B) sequence has B at every step). A row
# of the running state keeps its value while its sequence is over, so the state after the
# loop holds each sequence's last one, and a reverse loop finds a joining sequence's initial
# state where it was. hp (and cp) record each row's previous state, for the backward.
@njit(error_model="numpy", nogil=True)
def _product(out, a, w, stage):
    """out (B, N) = a (B, K) @ w (K, N), K in chunks of TILE_K whose fp32 sums are added in
    order, as the device's matmuls (Note [PSUM accumulation] in matmul.py)."""
    K = a.shape[1]
    out[:] = 0
    for k0 in range(0, K, TILE_K):
        k1 = min(k0 + TILE_K, K)
        np.dot(np.ascontiguousarray(a[:, k0:k1]), w[k0:k1], stage)
        out += stage


@njit(error_model="numpy", nogil=True)
def _offsets(sizes):
    off = np.zeros(sizes.shape[0], np.int64)
    for t in range(1, sizes.shape[0]):
        off[t] = off[t - 1] + sizes[t - 1]
    return off


@njit(error_model="numpy", nogil=True)
def lstm_sequence(hs, hc, cs, ws, hp, cp, hn, cn, xg, h0, c0, w_t, w_r, ib, hb, bias, proj,
                  sizes, reverse):
    """An LSTM layer: xg (N, 4H) input gates, w_t (P, 4H) the recurrent weight transposed ->
    outputs hs (N, P), the cell's outputs hc and states cs (N, H), activated gates ws
    (N, 4H), the last states hn (B, P) and cn (B, H). `proj`: each output is its cell's
    projected, hc @ w_r (H, P) (w_hr transposed); else P is H and hc is hs. `reverse`: from
    the last step down (a bidirectional layer's second half)."""
    off = _offsets(sizes)
    h, c = h0.copy(), c0.copy()
    hg = np.empty((h.shape[0], w_t.shape[1]), np.float32)
    stage, stage_r = np.empty_like(hg), np.empty_like(h)
    T = sizes.shape[0]
    for s in range(T):
        t = T - 1 - s if reverse else s
        b, o = sizes[t], off[t]
        hp[o:o + b] = h[:b]
        cp[o:o + b] = c[:b]
        _product(hg[:b], h[:b], w_t, stage[:b])
        lstm_forward(hc[o:o + b], cs[o:o + b], ws[o:o + b], xg[o:o + b], hg[:b], ib, hb,
                     cp[o:o + b], bias)
        if proj:
            _product(hs[o:o + b], hc[o:o + b], w_r, stage_r[:b])
        h[:b] = hs[o:o + b]
        c[:b] = cs[o:o + b]
    hn[:] = h
    cn[:] = c


@njit(error_model="numpy", nogil=True)
def lstm_sequence_backward(gates, grad_r, dh0, dc0, grad_out, grad_hn, grad_cn, cs, cp, ws,
                           w_hh, w_hr, proj, sizes, reverse):
    """The gradients of lstm_sequence's gates (N, 4H) and of its first states, the steps
    taken in the reverse order: a step's output gradient is its own plus what the next
    step's recurrent product passes back (gates @ w_hh). With `proj` that sum is stored in
    grad_r (N, P), for w_hr's gradient, and reaches the cell through w_hr (P, H)."""
    off = _offsets(sizes)
    dh, dc = grad_hn.copy(), grad_cn.copy()
    B, H = dc.shape
    gh = np.empty((B, H), np.float32)
    gcx = np.empty((B, H), np.float32)
    stage, stage_h = np.empty_like(dh), np.empty_like(gh)
    T = sizes.shape[0]
    for s in range(T):
        t = s if reverse else T - 1 - s
        b, o = sizes[t], off[t]
        if proj:
            grad_r[o:o + b] = grad_out[o:o + b] + dh[:b]
            _product(gh[:b], grad_r[o:o + b], w_hr, stage_h[:b])
        else:
            gh[:b] = grad_out[o:o + b] + dh[:b]
        lstm_backward(gates[o:o + b], gcx[:b], gh[:b], dc[:b], cp[o:o + b], cs[o:o + b],
                      ws[o:o + b], True, True)
        dc[:b] = gcx[:b]
        _product(dh[:b], gates[o:o + b], w_hh, stage[:b])
    dh0[:] = dh
    dc0[:] = dc


@njit(error_model="numpy", nogil=True)
def _simple_cell(out, x, y, ib, hb, bias, relu):
    """An Elman cell: out = tanh or relu of the gates, relu as the CPU's (NaN and -0.0 pass)."""
    B, H = out.shape
    for b in range(B):
        h = out[b]
        _preactivate(h, x[b], y[b], ib, hb, bias)
        if relu:
            for j in range(H):
                h[j] = np.float32(0) if h[j] < np.float32(0) else h[j]
        else:
            _tanh_in_place(h)


GRU, RNN_TANH, RNN_RELU = 0, 1, 2  # single_state_sequence's cells


@njit(error_model="numpy", nogil=True)
def single_state_sequence(hs, ws, hp, hn, xg, h0, w_t, ib, hb, bias, cell, sizes, reverse):
    """A GRU (ws: (N, 5H) workspaces) or Elman layer (nn.RNN: its outputs are its states,
    ws is empty) over its steps, as lstm_sequence."""
    off = _offsets(sizes)
    h = h0.copy()
    hg = np.empty((h.shape[0], w_t.shape[1]), np.float32)
    stage = np.empty_like(hg)
    T = sizes.shape[0]
    for s in range(T):
        t = T - 1 - s if reverse else s
        b, o = sizes[t], off[t]
        hp[o:o + b] = h[:b]
        _product(hg[:b], h[:b], w_t, stage[:b])
        if cell == GRU:
            gru_forward(hs[o:o + b], ws[o:o + b], xg[o:o + b], hg[:b], ib, hb, hp[o:o + b],
                        bias)
        else:
            _simple_cell(hs[o:o + b], xg[o:o + b], hg[:b], ib, hb, bias, cell == RNN_RELU)
        h[:b] = hs[o:o + b]
    hn[:] = h


@njit(error_model="numpy", nogil=True)
def gru_sequence_backward(grad_in, grad_hidden, dh0, grad_out, grad_hn, ws, w_hh, sizes,
                          reverse):
    """The gradients of a GRU layer's input and hidden gates (N, 3H) and of h0."""
    off = _offsets(sizes)
    dh = grad_hn.copy()
    B, H = dh.shape
    gh = np.empty((B, H), np.float32)
    direct = np.empty((B, H), np.float32)
    passed = np.empty((B, H), np.float32)
    stage = np.empty((B, H), np.float32)
    T = sizes.shape[0]
    for s in range(T):
        t = s if reverse else T - 1 - s
        b, o = sizes[t], off[t]
        gh[:b] = grad_out[o:o + b] + dh[:b]
        gru_backward(grad_in[o:o + b], grad_hidden[o:o + b], direct[:b], gh[:b], ws[o:o + b])
        _product(passed[:b], grad_hidden[o:o + b], w_hh, stage[:b])
        dh[:b] = direct[:b] + passed[:b]
    dh0[:] = dh


@njit(error_model="numpy", nogil=True)
def rnn_sequence_backward(gates, dh0, grad_out, grad_hn, hs, w_hh, relu, sizes, reverse):
    """The gradients of an Elman layer's gates (N, H): tanh_backward or threshold_backward of
    each step's state gradient, as autograd's formulas."""
    off = _offsets(sizes)
    dh = grad_hn.copy()
    B, H = dh.shape
    stage = np.empty((B, H), np.float32)
    T = sizes.shape[0]
    for s in range(T):
        t = s if reverse else T - 1 - s
        b, o = sizes[t], off[t]
        for r in range(b):
            gb, yb, ob, db = gates[o + r], hs[o + r], grad_out[o + r], dh[r]
            for j in range(H):
                gb[j] = ob[j] + db[j]
            if relu:
                for j in range(H):
                    gb[j] = np.float32(0) if yb[j] <= np.float32(0) else gb[j]
            else:
                for j in range(H):
                    gb[j] = gb[j] * (_ONE - yb[j] * yb[j])
        _product(dh[:b], gates[o:o + b], w_hh, stage[:b])
    dh0[:] = dh
