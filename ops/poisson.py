"""Poisson sampling on the GpSimd engine: `torch.poisson` (and torch.distributions.Poisson).

Note [Poisson by rejection]
Rates below 10 count uniforms until their running product falls to exp(-rate) (Knuth's
multiplication method: rate + 1 uniforms on average). Larger rates use Hormann's transformed
rejection with squeeze (PTRS, 1993): a uniform pair (U, V) proposes
k = floor((2a/us + b) U + rate + 0.43), us = 0.5 - |U|, accepted at once inside a box
(~90% of draws) or after comparing log V with the log-density
-rate + k log(rate) - lgamma(k + 1). That comparison cancels terms of size rate log rate,
so it runs in float64 inside the kernel (the CPU's sampler is double throughout); the
result, an integer, is then stored in the tensor's dtype (fp32 holds integers exactly to
2^24; float64 results pass through fp32 as every float64 value on the engines does).
Uniforms come in pairs from Philox stream r of element i's counter for attempt r
(random.philox_stream), as in Note [Gamma by rejection]: results depend only on the seed
and the call sequence. Negative and NaN rates raise the CPU's error before anything is
drawn; an infinite rate gives the CPU's value, -2^63.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit
from neuron_eager.ops.random import PerElementSampler, philox_stream, uniform01
from neuron_eager.ops.registry import register
from neuron_eager.ops.sampling import check_generator

aten = torch.ops.aten
_ATTEMPTS = 64  # PTRS accepts with probability > 0.89 a try: never reached in practice
_PRODUCTS = 512  # pairs of uniforms for rates below 10: P(more) is far below 1e-300
_INF_RATE = -9.223372036854775808e18  # what the CPU's int64 conversion of inf gives


@njit(inline="always")
def _poisson(rate, counter, key):
    if rate == np.inf:
        return _INF_RATE
    if rate < 10.0:
        if rate == 0.0:
            return 0.0
        floor, product, k = math.exp(-rate), 1.0, 0.0
        for r in range(_PRODUCTS):
            w0, w1 = philox_stream(counter, np.uint32(r), key)
            product *= np.float64(uniform01(w0))
            if product <= floor:
                return k
            product *= np.float64(uniform01(w1))
            if product <= floor:
                return k + 1.0
            k += 2.0
        return k
    root, log_rate = math.sqrt(rate), math.log(rate)
    b = 0.931 + 2.53 * root
    a = -0.059 + 0.02483 * b
    log_inv_alpha = math.log(1.1239 + 1.1328 / (b - 3.4))
    box = 0.9277 - 3.6224 / (b - 2.0)
    for r in range(_ATTEMPTS):
        w0, w1 = philox_stream(counter, np.uint32(r), key)
        u = np.float64(uniform01(w0)) - 0.5
        v = np.float64(uniform01(w1))
        us = 0.5 - abs(u)
        k = math.floor((2.0 * a / us + b) * u + rate + 0.43)
        if us >= 0.07 and v <= box:
            return k
        if k < 0.0 or (us < 0.013 and v > us):
            continue
        if math.log(v) + log_inv_alpha - math.log(a / (us * us) + b) <= \
                -rate + k * log_rate - math.lgamma(k + 1.0):
            return k
    return math.floor(rate)


def _make_kernels(load, store):
    @njit(error_model="numpy", nogil=True)
    def valid(rates):
        for i in range(rates.shape[0]):
            if not load(rates[i]) >= np.float32(0):
                return False
        return True

    @njit(error_model="numpy", nogil=True)
    def kernel(out, rates, key, counter):
        for i in range(out.shape[0]):
            k = _poisson(np.float64(load(rates[i])), counter + np.uint64(i), key)
            out[i] = store(np.float32(k))

    return valid, kernel


_sampler = PerElementSampler(_make_kernels)


@register(aten.poisson.default)
def poisson(rates, generator=None):
    check_generator(generator)
    if not rates.dtype.is_floating_point:  # as the CPU's kernel
        raise NotImplementedError(f"\"poisson_cpu\" not implemented for "
                                  f"'{T.dtype_name(rates.dtype)}'")
    if rates.numel() == 0:
        return T.empty(rates.shape, rates.dtype)
    valid, kernel = _sampler.kernels(rates.dtype)
    flat = rates.contiguous()._nd.reshape(-1)
    if not valid(flat):
        raise RuntimeError("invalid Poisson rate, expected rate to be non-negative")
    return _sampler.draw(kernel, rates, flat)
