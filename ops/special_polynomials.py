"""Orthogonal polynomials P_n(x) as fp32 scalar kernels of (x, n): Chebyshev T/U/V/W and
their shifted forms, Hermite H/He, Laguerre L, Legendre P.

PyTorch's CPU algorithms (three-term recurrences, trig forms for large n on |x| < 1), in fp32;
n arrives as a float and is truncated to an integer as the CPU does. `special_functions`
registers them.
"""
from __future__ import annotations

import numpy as np

from neuron_eager.ops.activation import acos_f32, cos_f32, sin_f32
from neuron_eager.ops.jit import njit
from neuron_eager.ops.kernelgen import JIT_OPTIONS

f32 = np.float32
jit = njit(**JIT_OPTIONS)
_0, _HALF, _1, _2 = f32(0), f32(0.5), f32(1), f32(2)
_INF, _NAN = f32(np.inf), f32(np.nan)


@jit
def _order(n):
    """The polynomial degree as the CPU reads a float n (NaN/inf -> invalid -> 0 result)."""
    if n != n or abs(n) == _INF:
        return np.int64(-1)
    return np.int64(n)


@jit
def _recur(y2, p, q, n):
    """Chebyshev-type three-term recurrence r = y2 q - p from degree 2 to n."""
    r = q
    k = 2
    while k <= n and q == q:
        r = y2 * q - p
        p = q
        q = r
        k += 1
    return r


@jit
def _parity(n, even, odd):
    return even if n % 2 == 0 else odd


@jit
def chebyshev_t(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if abs(x) == _1:
        return _1 if x > _0 or n % 2 == 0 else -_1
    if n > 6 and abs(x) < _1:
        return cos_f32(f32(n) * acos_f32(x))
    if n == 0:
        return _1
    if n == 1:
        return x
    return _recur(x + x, _1, x, n)


@jit
def chebyshev_u(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if abs(x) == _1:
        return f32(n + 1) if x > _0 or n % 2 == 0 else -f32(n + 1)
    if n > 8 and abs(x) < _1:
        t = acos_f32(x)
        if sin_f32(t) != _0:
            return sin_f32(f32(n + 1) * t) / sin_f32(t)
        return f32(n + 1) * cos_f32(f32(n + 1) * t) / x
    if n == 0:
        return _1
    if n == 1:
        return x + x
    return _recur(x + x, _1, x + x, n)


@jit
def chebyshev_v(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if abs(x) == _1:
        return _1 if x > _0 else _parity(n, f32(n + n + 1), -f32(n + n + 1))
    if n > 8 and abs(x) < _1:
        t = acos_f32(x)
        if sin_f32(t / _2) != _1:
            return cos_f32((f32(n) + _HALF) * t) / cos_f32(t / _2)
        return _parity(n, f32(n + n + 1), -f32(n + n + 1))
    if n == 0:
        return _1
    if n == 1:
        return x + x - _1
    return _recur(x + x, _1, x + x - _1, n)


@jit
def chebyshev_w(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if abs(x) == _1:
        return f32(n + n + 1) if x > _0 else _parity(n, _1, -_1)
    if n > 8 and abs(x) < _1:
        t = acos_f32(x)
        if cos_f32(t / _2) != _1:
            return sin_f32((f32(n) + _HALF) * t) / sin_f32(t / _2)
        return f32(n + n + 1) if x > _0 else _parity(n, _1, -_1)
    if n == 0:
        return _1
    if n == 1:
        return x + x + _1
    return _recur(x + x, _1, x + x + _1, n)


@jit
def shifted_chebyshev_t(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if x == _1:
        return _1
    if x == _0:
        return _parity(n, _1, -_1)
    y = x + x - _1
    if n > 6 and abs(y) < _1:
        return cos_f32(f32(n) * acos_f32(y))
    if n == 0:
        return _1
    if n == 1:
        return y
    return _recur(y + y, _1, y, n)


@jit
def shifted_chebyshev_u(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if x == _1:
        return f32(n + 1)
    if x == _0:
        return _parity(n, f32(n + 1), -f32(n + 1))
    y = x + x - _1
    if n > 6 and abs(y) < _1:
        t = acos_f32(y)
        if sin_f32(t) != _0:
            return sin_f32(f32(n + 1) * t) / sin_f32(t)
        return f32(n + 1) * cos_f32(f32(n + 1) * t) / y
    if n == 0:
        return _1
    if n == 1:
        return y + y
    return _recur(y + y, _1, y + y, n)


@jit
def shifted_chebyshev_v(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if x == _1:
        return _1
    if x == _0:
        return _parity(n, f32(n + n + 1), -f32(n + n + 1))
    y = x + x - _1
    if n > 6 and abs(y) < _1:
        t = acos_f32(y)
        if sin_f32(t / _2) != _1:
            return cos_f32((f32(n) + _HALF) * t) / cos_f32(t / _2)
        return _parity(n, f32(n + n + 1), -f32(n + n + 1))
    if n == 0:
        return _1
    if n == 1:
        return y + y - _1
    return _recur(y + y, _1, y + y - _1, n)


@jit
def shifted_chebyshev_w(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if x == _1:
        return f32(n + n + 1)
    if x == _0:
        return _parity(n, _1, -_1)
    y = x + x - _1
    if n > 4 and abs(y) < _1:
        t = acos_f32(y)
        if cos_f32(t / _2) != _1:
            return sin_f32((f32(n) + _HALF) * t) / sin_f32(t / _2)
        return _parity(n, _1, -_1)
    if n == 0:
        return _1
    if n == 1:
        return y + y + _1
    return _recur(y + y, _1, y + y + _1, n)


@jit
def hermite_h(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if n == 0:
        return _1
    if n == 1:
        return x + x
    if n > 128:  # the CPU's float32 limit
        return _NAN
    p, q, r = _1, x + x, _0
    for k in range(2, n + n, 2):
        r = (x + x) * q - f32(k) * p
        p = q
        q = r
    return r


@jit
def hermite_he(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if n == 0:
        return _1
    if n == 1:
        return x
    if n > 128:
        return _NAN
    p, q, r = _1, x, x
    for k in range(1, n):
        r = x * q - f32(k) * p
        p = q
        q = r
    return r


@jit
def laguerre_l(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if abs(x) == _0 or n == 0:
        return _1
    if n == 1:
        return _1 - x
    p, q = _1, _1 - x
    r = q
    k = 1
    while k < n and q == q:
        r = ((f32(k + k) + (_1 - x)) * q - f32(k) * p) / f32(k + 1)
        p = q
        q = r
        k += 1
    return r


@jit
def legendre_p(x, nf):
    n = _order(nf)
    if n < 0:
        return _0
    if abs(x) == _1:
        return _1 if x > _0 or n % 2 == 0 else -_1
    if n == 0:
        return _1
    if n == 1:
        return x
    p, q = _1, x
    r = q
    k = 1
    while k < n and q == q:
        r = (f32(k + k + 1) * x * q - f32(k) * p) / f32(k + 1)
        p = q
        q = r
        k += 1
    return r


POLYNOMIALS = {
    "chebyshev_polynomial_t": chebyshev_t, "chebyshev_polynomial_u": chebyshev_u,
    "chebyshev_polynomial_v": chebyshev_v, "chebyshev_polynomial_w": chebyshev_w,
    "shifted_chebyshev_polynomial_t": shifted_chebyshev_t,
    "shifted_chebyshev_polynomial_u": shifted_chebyshev_u,
    "shifted_chebyshev_polynomial_v": shifted_chebyshev_v,
    "shifted_chebyshev_polynomial_w": shifted_chebyshev_w,
    "hermite_polynomial_h": hermite_h, "hermite_polynomial_he": hermite_he,
    "laguerre_polynomial_l": laguerre_l, "legendre_polynomial_p": legendre_p,
}
