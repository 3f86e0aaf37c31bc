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

_sigmoid = OPS_BY_NAME["sigmoid"].fn
_tanh = OPS_BY_NAME["tanh"].fn
_ONE = np.float32(1)


@njit(error_model="numpy", nogil=True)
def lstm_forward(hy, cy, ws, ig, hg, ib, hb, cx, bias):
    """Gates (B, 4H) -> hy, cy (B, H) and the activated gates ws (B, 4H)."""
    B, H = cx.shape
    for b in range(B):
        for j in range(H):
            act = np.empty(4, np.float32)
            for k in range(4):
                c = k * H + j
                x, y = ig[b, c], hg[b, c]
                if bias:
                    x, y = x + ib[c], y + hb[c]
                v = x + y
                act[k] = _tanh(v) if k == 2 else _sigmoid(v)
                ws[b, c] = act[k]
            c_new = act[1] * cx[b, j] + act[0] * act[2]
            cy[b, j] = c_new
            hy[b, j] = act[3] * _tanh(c_new)


@njit(error_model="numpy", nogil=True)
def lstm_backward(grad_gates, grad_cx, grad_hy, grad_cy, cx, cy, ws, has_hy, has_cy):
    B, H = cx.shape
    for b in range(B):
        for j in range(H):
            i, f, g, o = ws[b, j], ws[b, H + j], ws[b, 2 * H + j], ws[b, 3 * H + j]
            tanh_cy = _tanh(cy[b, j])
            gc = grad_cy[b, j] if has_cy else np.float32(0)
            go = np.float32(0)
            if has_hy:
                gh = grad_hy[b, j]
                gc = gc + (gh * o) * (_ONE - tanh_cy * tanh_cy)
                go = (gh * tanh_cy) * (o * (_ONE - o))
            grad_gates[b, j] = (gc * g) * (i * (_ONE - i))
            grad_gates[b, H + j] = (gc * cx[b, j]) * (f * (_ONE - f))
            grad_gates[b, 2 * H + j] = (gc * i) * (_ONE - g * g)
            grad_gates[b, 3 * H + j] = go
            grad_cx[b, j] = gc * f


@njit(error_model="numpy", nogil=True)
def gru_forward(hy, ws, ig, hg, ib, hb, hx, bias):
    """Gates (B, 3H) -> hy (B, H) and the workspace ws (B, 5H): r, z, n, hx, hn."""
    B, H = hx.shape
    for b in range(B):
        for j in range(H):
            gi = np.empty(3, np.float32)
            gh = np.empty(3, np.float32)
            for k in range(3):
                c = k * H + j
                gi[k], gh[k] = ig[b, c], hg[b, c]
                if bias:
                    gi[k], gh[k] = gi[k] + ib[c], gh[k] + hb[c]
            r = _sigmoid(gi[0] + gh[0])
            z = _sigmoid(gi[1] + gh[1])
            n = _tanh(gi[2] + r * gh[2])
            h = hx[b, j]
            hy[b, j] = n + z * (h - n)
            ws[b, j], ws[b, H + j], ws[b, 2 * H + j] = r, z, n
            ws[b, 3 * H + j], ws[b, 4 * H + j] = h, gh[2]


@njit(error_model="numpy", nogil=True)
def gru_backward(grad_in, grad_hidden, grad_hx, grad_hy, ws):
    B, H = grad_hy.shape
    for b in range(B):
        for j in range(H):
            r, z, n = ws[b, j], ws[b, H + j], ws[b, 2 * H + j]
            hx, hn = ws[b, 3 * H + j], ws[b, 4 * H + j]
            gh = grad_hy[b, j]
            grad_hx[b, j] = gh * z
            gz = (gh * (hx - n)) * (z * (_ONE - z))
            gn = (gh * (_ONE - z)) * (_ONE - n * n)
            gr = (gn * hn) * (r * (_ONE - r))
            grad_in[b, j], grad_in[b, H + j], grad_in[b, 2 * H + j] = gr, gz, gn
            grad_hidden[b, j], grad_hidden[b, H + j] = gr, gz
            grad_hidden[b, 2 * H + j] = gn * r
