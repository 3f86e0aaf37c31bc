"""Fit the polynomial coefficients of ops/fastmath.py (run by hand; prints Python).

Least squares on 4,000 Chebyshev nodes in float64 (close to minimax at these degrees),
against SciPy/NumPy float64 references. The printed tuples are pasted into ops/fastmath.py;
`python -m neuron_eager.numerics_report` then measures the fp32 kernels' errors in ulp.
"""
import numpy as np
from numpy.polynomial import polynomial as P
from scipy import special


def fit(f, a, b, deg, var=lambda x: x):
    """Power-basis coefficients (lowest first) of a degree-`deg` fit of f over [a, b] in var(x)."""
    n = 4000
    x = np.cos(np.pi * (np.arange(n) + 0.5) / n) * (b - a) / 2 + (a + b) / 2
    return P.polyfit(var(x), f(x), deg)


def show(name, coefs):
    print(f"{name} = ({', '.join(f'{c!r}' for c in map(float, coefs))})")


# tanh(x) = x + x^3 * Q(x^2), |x| < 0.625
show("TANH_Q", fit(lambda x: (np.tanh(x) - x) / x ** 3, 1e-4, 0.625, 5, lambda x: x * x))
# erf(x) = x * Q(x^2), |x| < 0.84
show("ERF_SMALL", fit(lambda x: special.erf(x) / x, 1e-4, 0.84, 7, lambda x: x * x))
# erf(x) = 1 - R(x - mid) on [0.84, 2.2] and [2.2, 3.92] (R fits erfc: small absolute error)
show("ERFC_MID", fit(special.erfc, 0.84, 2.2, 11, lambda x: x - 1.52))
show("ERFC_TAIL", fit(special.erfc, 2.2, 3.92, 10, lambda x: x - 3.06))
# Phi(x) = 1/2 + x * Q(x^2), |x| < 1.5, and Phi(-a) = R(a - 3.5) on [1.5, 5.5] (gelu's CDF)
show("PHI_SMALL", fit(lambda x: special.ndtr(x) / x - 0.5 / x, 1e-4, 1.5, 6, lambda x: x * x))
show("PHI_TAIL", fit(lambda a: special.ndtr(-a), 1.5, 5.5, 12, lambda a: a - 3.5))
