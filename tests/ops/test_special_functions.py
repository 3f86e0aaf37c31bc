"""Special functions (ops/special_functions.py, ops/special_bessel.py) against the CPU."""
import pytest
import torch

from tests.checks import NEURON, check_op

S = torch.special
F32 = dict(rtol=1e-4, atol=1e-5)  # the conformance float32 tolerance (Cephes in fp32)
EDGES = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 1e-6, -1e-6, 8.0, 100.0, -100.0,
         float("inf"), -float("inf"), float("nan")]


def _wide(n=400):
    """Negative args, poles (integers), both sides of the 2/5/8 branch points, large args."""
    return torch.cat([torch.linspace(-30, 30, n), torch.randn(n) * 4, torch.tensor(EDGES)])


def _unit(n=300):
    return torch.cat([torch.rand(n), torch.tensor([0.0, 1.0, 1e-10, 1 - 1e-7, 0.5, -0.1, 1.1])])


UNARY = {
    "digamma": torch.digamma, "lgamma": torch.lgamma, "i0": torch.i0, "i0e": S.i0e,
    "i1": S.i1, "i1e": S.i1e, "entr": S.entr, "log_ndtr": S.log_ndtr, "erfcx": S.erfcx,
    "airy_ai": S.airy_ai, "bessel_j0": S.bessel_j0, "bessel_j1": S.bessel_j1,
    "bessel_y0": S.bessel_y0, "bessel_y1": S.bessel_y1, "mod_i0": S.modified_bessel_i0,
    "mod_i1": S.modified_bessel_i1, "mod_k0": S.modified_bessel_k0,
    "mod_k1": S.modified_bessel_k1, "scaled_k0": S.scaled_modified_bessel_k0,
    "scaled_k1": S.scaled_modified_bessel_k1, "sph_j0": S.spherical_bessel_j0,
    "trigamma": lambda t: torch.polygamma(1, t), "polygamma3": lambda t: torch.polygamma(3, t),
    "mvlgamma3": lambda t: torch.mvlgamma(t, 3),
}
HALF_OK = ["digamma", "lgamma", "i0", "i0e", "i1", "i1e", "entr", "trigamma", "mvlgamma3"]


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_float32(seed, name):
    check_op(UNARY[name], _wide(), **F32)


@pytest.mark.parametrize("name", HALF_OK)
def test_unary_bfloat16(seed, name):
    x = torch.randn(200) * 4
    if name == "mvlgamma3":  # its domain: the CPU forms x - j/2 in bf16 and hits false poles
        x = x.abs() + 1.1
    check_op(UNARY[name], x.to(torch.bfloat16), rtol=1.6e-2, atol=1e-2)


def test_inverse_functions(seed):
    check_op(torch.erfinv, _unit() * 2 - 1, **F32)
    check_op(S.ndtri, _unit(), **F32)
    check_op(torch.erfinv, (torch.rand(100) * 2 - 1).to(torch.bfloat16))


def test_erfinv_near_plus_and_minus_one_to_fp32_accuracy():
    """Near |y| = 1 Newton's step divides erf's rounding by a tiny slope: measured against
    float64, within 4 ulp (and at the CPU's default fp32 tolerances) on both sides."""
    near = 1 - torch.arange(1, 20000, dtype=torch.float32) * 2.0 ** -24  # every fp32 down to ~0.999
    y = torch.cat([near, -near, torch.linspace(-0.99, 0.99, 20001)])
    got = torch.erfinv(y.to(NEURON)).cpu()
    exact = torch.erfinv(y.double())
    ulp = (torch.nextafter(exact.float().abs(), torch.tensor(float("inf"))) - exact.float().abs())
    assert ((got.double() - exact).abs() / ulp.double()).max() <= 4
    torch.testing.assert_close(got, torch.erfinv(y))


def test_integer_inputs_promote(seed):
    x = torch.arange(-5, 20)
    for fn in (torch.digamma, S.bessel_j0):
        check_op(fn, x, **F32)
    check_op(S.entr, torch.tensor([True, False]))


def test_polygamma_orders_and_zeta(seed):
    x = _wide(200)
    for n in range(5):
        check_op(torch.polygamma, n, x, **F32)
    q = torch.cat([torch.rand(300) * 10, torch.tensor([0.0, -1.0, -2.5, 1e-3])])
    s = torch.cat([torch.rand(300) * 6 + 0.5, torch.tensor([1.0, 2.0, 3.0, 2.0])])
    check_op(S.zeta, s, q, **F32)
    check_op(S.zeta, 2.0, q, **F32)  # self_scalar
    check_op(S.zeta, s, 3.0, **F32)  # other_scalar
    check_op(lambda t: S.polygamma(2, t), x, **F32)


def test_incomplete_gamma(seed):
    nan, inf = float("nan"), float("inf")  # (NaN arguments: the CPU's special cases first)
    a = torch.cat([torch.rand(400) * 30, torch.tensor([0.0, 0.0, 1.0, inf, 250.0, nan, nan,
                                                       inf, nan, 1.0])])
    x = torch.cat([torch.rand(400) * 30, torch.tensor([0.0, 1.0, 0.0, 3.0, 260.0, 0.0, inf,
                                                       nan, 2.0, nan])])
    check_op(torch.igamma, a, x, **F32)
    check_op(torch.igammac, a, x, **F32)
    check_op(torch.igamma, a.to(torch.bfloat16), x.to(torch.bfloat16))
    with pytest.raises(NotImplementedError, match="not implemented for 'Int'"):
        torch.igamma(torch.ones(2, dtype=torch.int32, device=NEURON),
                     torch.ones(2, dtype=torch.int32, device=NEURON))


POLY = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
        "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
        "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
        "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
        "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLY)
def test_polynomials(name):
    fn = getattr(S, name)
    # degrees below and above the trig-form switch; x at +-1, 0, 1/2 (the special cases)
    x = torch.cat([torch.linspace(-1.5, 1.5, 61).repeat(13), torch.tensor([1.0, -1.0, 0.0, 0.5])])
    n = torch.cat([torch.arange(-1, 12).repeat_interleave(61), torch.tensor([5, 6, 7, 9])])
    check_op(fn, x, n.float(), **F32)
    if name in ("chebyshev_polynomial_t", "hermite_polynomial_h", "legendre_polynomial_p"):
        check_op(fn, x, 4, **F32)  # n_scalar
        check_op(fn, 0.25, n, **F32)  # x_scalar, integer n promotes to float


def test_gradients(seed):
    x = (torch.rand(50) * 6 + 0.1).requires_grad_()
    for fn in (torch.digamma, torch.lgamma, lambda t: torch.polygamma(2, t), torch.i0, S.i1):
        check_op(fn, x, grad=True, **F32)


def test_layouts_out_and_inplace(seed):
    x = torch.rand(6, 8) * 5 + 0.1
    check_op(lambda t: torch.digamma(t.t()[1:, ::2]), x, **F32)  # strided view
    check_op(lambda a, b: torch.igamma(a, b), torch.rand(6, 1) * 3, torch.rand(1, 8) * 3, **F32)
    check_op(lambda t: t.clone().lgamma_(), x, **F32)
    check_op(lambda t: t.clone().polygamma_(1), x, **F32)
    check_op(lambda t: t.clone().mvlgamma_(2), x + 1, **F32)
    check_op(lambda t: torch.special.i0e(t, out=torch.empty_like(t)), x, **F32)
    check_op(lambda t: torch.erfinv(t, out=torch.empty(6, 8, dtype=torch.bfloat16,
                                                       device=t.device)), x / 6)


def test_errors_match_cpu():
    x = torch.ones(3, device=NEURON)
    with pytest.raises(RuntimeError, match="does not support negative n"):
        torch.polygamma(-1, x)
    with pytest.raises(RuntimeError, match="greater than or equal to 1"):
        torch.mvlgamma(x, 0)
    with pytest.raises(RuntimeError, match="may not be a boolean"):
        torch.mvlgamma(x.bool(), 2)
    with pytest.raises(NotImplementedError, match="not implemented for 'BFloat16'"):
        S.bessel_j0(x.bfloat16())
    with pytest.raises(NotImplementedError, match="not implemented for 'Half'"):
        S.chebyshev_polynomial_t(x.half(), 2)
