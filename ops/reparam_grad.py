"""Reparameterised gradients of Gamma and Dirichlet samples: `_standard_gamma_grad` (the
backward of Gamma, Chi2 and StudentT `rsample`) and `_dirichlet_grad` (Dirichlet and Beta).

Note [Pathwise gradients]
For a sample x of Gamma(a), dx/da = -(dF(x; a)/da) / f(x; a) with F the CDF and f the
density; it has no closed form, so torch approximates it piecewise (Jankowiak & Obermeyer,
"Pathwise Derivatives Beyond the Reparameterization Trick", 2018), and so do we, with the
same pieces and coefficients so gradients agree with the CPU's: a Taylor series of the
incomplete gamma function for x < 0.8, a saddle-point expansion for a > 8 and a fitted
rational function of (log(x/a), log a) elsewhere. Dirichlet's gradient is a Beta(a, t - a)
one with t the total concentration: series near x = 0 and x = 1, a saddle-point expansion
when both shapes pass 6, else a rational correction of x (psi(t) - psi(a)) / (t - a).
The CPU evaluates these in double (the Beta series in the input's type): cancellation
between the terms costs fp32 several digits, so the kernels compute in float64 inside the
loop (as zeta and igamma do in special_functions) and round the result once.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.ops import elementwise as E
from neuron_eager.ops.jit import njit
from neuron_eager.ops.kernelgen import JIT_OPTIONS
from neuron_eager.ops.registry import register

aten = torch.ops.aten
f64 = np.float64
jit = njit(**JIT_OPTIONS)
_PSI_10 = 2.25175258906672110764  # digamma(10)
_DIGAMMA_ASYMPTOTIC = np.array([8.33333333333333333333e-2, -2.10927960927960927961e-2,
                                7.57575757575757575758e-3, -4.16666666666666666667e-3,
                                3.96825396825396825397e-3, -8.33333333333333333333e-3,
                                8.33333333333333333333e-2])


@jit
def digamma64(x):
    """digamma in float64 (Cephes' recurrence to 10, then the asymptotic series); poles
    give +inf as in the CPU's gradient kernels."""
    if x == 0.0:
        return np.inf
    reflection = 0.0
    if x < 0.0:
        if x == math.floor(x):
            return np.inf
        reflection = -math.pi / math.tan(math.pi * x)
        x = 1.0 - x
    result = 0.0
    while x < 10.0:
        result -= 1.0 / x
        x += 1.0
    if x == 10.0:
        return result + _PSI_10 + reflection
    tail = 0.0
    if x < 1e17:
        z = 1.0 / (x * x)
        p = 0.0
        for c in _DIGAMMA_ASYMPTOTIC:
            p = p * z + c
        tail = z * p
    return result + math.log(x) - 0.5 / x - tail + reflection


# the rational function of Gamma's middle region: coefficient k of p (k < 4) or q (k >= 4)
# is _GAMMA_UV[0][k] + u _GAMMA_UV[1][k] + u^2 _GAMMA_UV[2][k], then a cubic in v
_GAMMA_UV = np.array([
    [0.16009398, -0.094634809, 0.025146376, -0.0030648343,
     1.0, 0.32668115, 0.10406089, 0.0014179084],
    [0.53487893, 0.1298071, 0.065735949, -0.0015649758,
     0.16639465, 0.020070113, -0.0035938915, -0.00058392623],
    [0.040121004, -0.0065914022, -0.0026286047, -0.0013441777,
     0.017050642, -0.0021309326, 0.00085092367, -1.5247877e-07]])


@jit
def _uv(u, k):
    return _GAMMA_UV[0, k] + u * (_GAMMA_UV[1, k] + u * _GAMMA_UV[2, k])


@jit
def _gamma_grad64(a, x):
    if x < 0.8:
        # d/da of the lower incomplete gamma by its series, over the density
        term, shifted = 1.0, a
        s1, s2 = 1.0 / shifted, 1.0 / (shifted * shifted)
        for i in range(1, 6):
            term *= -x / i
            shifted += 1.0
            s1 += term / shifted
            s2 += term / (shifted * shifted)
        x_a = x ** a
        density = x ** (a - 1.0) * math.exp(-x)
        dcdf = (math.log(x) - digamma64(a)) * x_a * s1 - x_a * s2
        g = -dcdf / density
        return 0.0 if g != g else g
    if a > 8.0:
        if 0.9 * a <= x <= 1.1 * a:  # near the mode the expansion's terms cancel: its limit
            num1 = 1.0 + 24.0 * a * (1.0 + 12.0 * a)
            num2 = 1440.0 * a * a + 6.0 * x * (53.0 - 120.0 * x) - 65.0 * x * x / a + \
                a * (107.0 + 3600.0 * x)
            return num1 * num2 / (1244160.0 * a * a * a * a)
        root = math.sqrt(8.0 * a)
        t2 = root / (a - x)
        t3 = (x - a - a * math.log(x / a)) ** -1.5
        t23 = t2 - t3 if x < a else t2 + t3
        t1 = math.log(x / a) * t23 - math.sqrt(2.0 / a) * (a + x) / ((a - x) * (a - x))
        stirling = 1.0 + 1.0 / (12.0 * a) * (1.0 + 1.0 / (24.0 * a))
        return -stirling * x * t1 / root
    u, v = math.log(x / a), math.log(a)
    p = _uv(u, 0) + v * (_uv(u, 1) + v * (_uv(u, 2) + v * _uv(u, 3)))
    q = _uv(u, 4) + v * (_uv(u, 5) + v * (_uv(u, 6) + v * _uv(u, 7)))
    return math.exp(p / q)


@jit
def standard_gamma_grad(a, x):
    return np.float32(_gamma_grad64(f64(a), f64(x)))


@jit
def _beta_grad_a_near0(x, a, b):
    """d x / d a for x ~ Beta(a, b) near 0: the series of the incomplete beta."""
    factor = digamma64(a) - digamma64(a + b) - math.log(x)
    term = 1.0
    s = term / a * (factor + 1.0 / a)
    for i in range(1, 11):
        term *= (i - b) * x / i
        shifted = a + i
        s += term / shifted * (factor + 1.0 / shifted)
    g = x * (1.0 - x) ** -b * s
    return 0.0 if g != g else g


@jit
def _beta_grad_b_near0(x, a, b):
    """d x / d b for x ~ Beta(a, b) near 0 (used at 1 - x with the shapes swapped)."""
    factor = digamma64(a + b) - digamma64(b)
    term, falling, dfalling = 1.0, 1.0, 0.0
    s = factor / a
    for i in range(1, 9):
        term *= -x / i
        dfalling = dfalling * (b - i) + falling
        falling = falling * (b - i)
        s += term / (a + i) * (dfalling + factor * falling)
    g = -(1.0 - x) ** (1.0 - b) * s
    return 0.0 if g != g else g


@jit
def _beta_grad_a_saddle(x, a, b):
    """d x / d a for large a and b: a saddle-point expansion (its limit near the mean)."""
    t = a + b
    mean = a / t
    sd = math.sqrt(a * b / (t + 1.0)) / t
    if mean - 0.1 * sd <= x <= mean + 0.1 * sd:
        bb = b * b
        poly = 47.0 * x * bb * bb + a * (
            (43.0 + 20.0 * (16.0 + 27.0 * b) * x) * bb * b + a * (
                3.0 * (59.0 + 180.0 * b - 90.0 * x) * bb + a * (
                    (453.0 + 1620.0 * b * (1.0 - x) - 455.0 * x) * b + a * (
                        8.0 * (1.0 - x) * (135.0 * b - 11.0)))))
        num = (1.0 + 12.0 * a) * (1.0 + 12.0 * b) / (t * t)
        den = 12960.0 * a * a * a * bb * (1.0 + 12.0 * t)
        return num / (1.0 - x) * poly / den
    prefactor = -x / math.sqrt(2.0 * a * b / t)
    stirling = (1.0 + 1.0 / (12.0 * a) + 1.0 / (288.0 * a * a)) * \
        (1.0 + 1.0 / (12.0 * b) + 1.0 / (288.0 * b * b)) / \
        (1.0 + 1.0 / (12.0 * t) + 1.0 / (288.0 * t * t))
    axbx = a * (x - 1.0) + b * x
    t1 = (2.0 * a * a * (x - 1.0) + a * b * (x - 1.0) - x * b * b) / \
        (math.sqrt(2.0 * a / b) * t ** 1.5 * axbx * axbx)
    t2 = 0.5 * math.log(a / (t * x))
    t3 = math.sqrt(8.0 * a * b / t) / axbx
    t4 = (b * math.log(b / (t * (1.0 - x))) + a * math.log(a / (t * x))) ** -1.5
    return stirling * prefactor * (t1 + t2 * (t3 + (t4 if x < mean else -t4)))


# Dirichlet's rational correction: p (0) and q (1) sum over i, j < 3 of
# log(x)^i (log(a) - log(x))^j times a cubic in log(t) - (log(a) - log(x))
_DIRICHLET_C = np.array([
    [[[1.003668233, -0.01061107488, -0.0657888334, 0.01201642863],
      [0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033],
      [-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013]],
     [[0.221950385, -0.3187676331, 0.01799915743, 0.01074823814],
      [-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057],
      [0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05]],
     [[-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565],
      [0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181],
      [0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05]]],
    [[[1.0, -0.02924021934, -0.04438342661, 0.007285809825],
      [0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521],
      [-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149]],
     [[0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273],
      [0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956],
      [-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05]],
     [[0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05],
      [0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05],
      [-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06]]]])


@jit
def _dirichlet_grad64(x, a, t):
    b = t - a
    spread = t * x * (1.0 - x)
    if x <= 0.5 and spread < 2.5:
        return _beta_grad_a_near0(x, a, b)
    if x >= 0.5 and spread < 0.75:
        return -_beta_grad_b_near0(1.0 - x, b, a)
    if a > 6.0 and b > 6.0:
        return _beta_grad_a_saddle(x, a, b)
    u = math.log(x)
    la = math.log(a) - u
    lb = math.log(t) - la
    p, q = 0.0, 0.0
    ui = 1.0
    for i in range(3):
        uaj = ui
        for j in range(3):
            cp, cq = _DIRICHLET_C[0, i, j], _DIRICHLET_C[1, i, j]
            p += uaj * (cp[0] + lb * (cp[1] + lb * (cp[2] + lb * cp[3])))
            q += uaj * (cq[0] + lb * (cq[1] + lb * (cq[2] + lb * cq[3])))
            uaj *= la
        ui *= u
    return p / q * x * (digamma64(t) - digamma64(a)) / b


@jit
def dirichlet_grad(x, a, t):
    return np.float32(_dirichlet_grad64(f64(x), f64(a), f64(t)))


_GAMMA_GRAD = E.Elementwise("standard_gamma_grad", standard_gamma_grad, engine="scalar",
                            float_only=True)
_DIRICHLET_GRAD = E.Elementwise("dirichlet_grad", dirichlet_grad, engine="scalar",
                                float_only=True)


def _float_only(name: str, *tensors) -> None:
    """The CPU's kernels exist for float32 and float64 only."""
    for t in tensors:
        if t.dtype not in (torch.float32, torch.float64):
            raise NotImplementedError(f"\"{name}_cpu\" not implemented for "
                                      f"'{E.T.dtype_name(t.dtype)}'")


@register(aten._standard_gamma_grad.default)
def _standard_gamma_grad(alpha, sample):
    _float_only("_standard_gamma_grad", alpha)
    return E.run(_GAMMA_GRAD, [alpha, sample])


@register(aten._dirichlet_grad.default)
def _dirichlet_grad(x, alpha, total):
    _float_only("_dirichlet_grad", x)
    return E.run(_DIRICHLET_GRAD, [x, alpha, total])
