"""Gamma sampling on the GpSimd engine: `torch._standard_gamma`, which torch.distributions'
Gamma and Chi2 draw from, and `torch._sample_dirichlet` (Dirichlet and Beta) built on it.
Their reparameterised gradients (rsample's backward) are in ops/reparam_grad.py.

Note [Gamma by rejection]
Marsaglia and Tsang's method: for shape a >= 1, with d = a - 1/3 and c = 1/sqrt(9d), draw a
standard normal x and v = (1 + c x)^3, and accept d v when a uniform u has
log u < x^2/2 + d (1 - v + log v) (a cheap squeeze, u < 1 - 0.0331 x^4, accepts most
draws first). Shapes below 1 sample a + 1 and scale by u^(1/a). Attempts vary per element,
so attempt r of element i draws from Philox stream r of i's counter (random.philox_stream):
results depend only on the seed and the call sequence, as every random kernel here. Like the
CPU, a result below the smallest normal float (tiny or invalid shapes) is that float.
"""
from __future__ import annotations

import numpy as np
import torch

from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit
from neuron_eager.ops.random import PerElementSampler, philox_stream, uniform01, uniform01_open
from neuron_eager.ops.registry import register
from neuron_eager.ops.sampling import check_generator, normal01

aten = torch.ops.aten
_F32 = np.float32
_TINY = _F32(1.1754944e-38)  # the smallest normal fp32
_ATTEMPTS = 64  # each accepts with probability >= 0.95: never reached in practice
_UNIFORM = np.uint32(1 << 31)  # the streams of the acceptance uniforms


@njit(inline="always")
def _standard_gamma(alpha, counter, key):
    a = _F32(alpha)
    if not a > _F32(0):  # zero, negative, NaN: the CPU's result, below
        return _TINY
    boost = _F32(1)
    if a < _F32(1):
        w, _ = philox_stream(counter, np.uint32(0), key)
        boost = np.exp(np.log(uniform01_open(w)) / a)
        a = a + _F32(1)
    d = a - _F32(1.0 / 3.0)
    c = _F32(1) / np.sqrt(_F32(9) * d)
    for r in range(1, _ATTEMPTS + 1):
        w0, w1 = philox_stream(counter, np.uint32(r), key)
        x = normal01(w0, w1)
        v = _F32(1) + c * x
        if v <= _F32(0):
            continue
        v = v * v * v
        w2, _ = philox_stream(counter, _UNIFORM + np.uint32(r), key)
        u = uniform01(w2)
        x2 = x * x
        if u < _F32(1) - _F32(0.0331) * x2 * x2 or \
                np.log(u) < _F32(0.5) * x2 + d * (_F32(1) - v + np.log(v)):
            return d * v * boost
    return d * boost


def _make_kernel(load, store):
    @njit(error_model="numpy", nogil=True)
    def kernel(out, alpha, key, counter):
        for i in range(out.shape[0]):
            s = _standard_gamma(load(alpha[i]), counter + np.uint64(i), key)
            out[i] = store(s if s > _TINY else _TINY)  # (NaN too)

    return kernel


_sampler = PerElementSampler(_make_kernel)


@register(aten._standard_gamma.default)
def standard_gamma(alpha, generator=None):
    check_generator(generator)
    if alpha.dtype not in (torch.float32, torch.float64):  # as the CPU's kernel
        raise NotImplementedError(f"\"gamma_cpu\" not implemented for "
                                  f"'{T.dtype_name(alpha.dtype)}'")
    if alpha.numel() == 0:
        return T.empty(alpha.shape, alpha.dtype)
    return _sampler.draw(_sampler.kernels(alpha.dtype), alpha,
                         alpha.contiguous()._nd.reshape(-1))


@register(aten._sample_dirichlet.default)
def sample_dirichlet(alpha, generator=None):
    """Gammas normalised along the last dim, kept inside (0, 1) as the CPU keeps them."""
    g = standard_gamma(alpha, generator)
    if g.dim() == 0 or g.numel() == 0:
        return g
    info = torch.finfo(alpha.dtype)
    top = 1.0 - info.eps / 2  # the largest float below 1
    ratios = aten.div.Tensor(g, aten.sum.dim_IntList(g, [-1], True))
    return aten.clamp_.default(ratios, info.tiny, top)
