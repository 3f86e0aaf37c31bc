import pytest
import torch

import neuron_eager
from checks import check_op, outcome

B = (2,)  # batch shape used throughout


def _spd(*shape):
    a = torch.randn(*shape)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


def _well(*shape):
    return torch.randn(*shape) + shape[-1] * torch.eye(shape[-1])


def test_cholesky_family(seed):
    a = _spd(*B, 4, 4)
    check_op(torch.linalg.cholesky, a.requires_grad_(), grad=True)
    check_op(lambda x: torch.linalg.cholesky(x, upper=True), _spd(4, 4))
    check_op(lambda x: torch.linalg.cholesky_ex(x), _spd(*B, 3, 3))
    check_op(lambda x: torch.cholesky_inverse(torch.linalg.cholesky(x)), _spd(*B, 4, 4))
    check_op(lambda x, b: torch.cholesky_solve(b, torch.linalg.cholesky(x)), _spd(4, 4),
             torch.randn(*B, 4, 2))


def test_cholesky_errors(seed):
    bad = torch.stack([torch.eye(3), torch.diag(torch.tensor([1.0, -1.0, 1.0]))])
    with pytest.raises(torch.linalg.LinAlgError) as cpu:
        torch.linalg.cholesky(bad)
    with pytest.raises(torch.linalg.LinAlgError) as dev:
        torch.linalg.cholesky(bad.to("neuron"))
    assert str(dev.value) == str(cpu.value)
    check_op(lambda x: torch.linalg.cholesky_ex(x), bad)  # info, no error


def test_singular_errors(seed):
    z = torch.zeros(3, 3)
    for fn in (torch.linalg.inv, torch.linalg.lu_factor, lambda x: torch.linalg.solve(x, x)):
        with pytest.raises(RuntimeError) as cpu:
            fn(z)
        with pytest.raises(RuntimeError) as dev:
            fn(z.to("neuron"))
        assert type(dev.value) is type(cpu.value) and str(dev.value) == str(cpu.value)


def test_solve_inv_det(seed):
    a, b = _well(*B, 4, 4), torch.randn(*B, 4, 3)
    check_op(torch.linalg.solve, a.clone().requires_grad_(), b.requires_grad_(), grad=True)
    check_op(lambda x, y: torch.linalg.solve(x, y, left=False), a, torch.randn(3, 4))
    check_op(torch.linalg.solve, a.mT, torch.randn(4))  # non-contiguous A, vector rhs
    check_op(torch.linalg.inv, a.clone().requires_grad_(), grad=True)
    check_op(torch.linalg.det, a.clone().requires_grad_(), grad=True)
    check_op(torch.linalg.slogdet, a)
    check_op(torch.logdet, _spd(3, 3))


def test_lu(seed):
    a = torch.randn(*B, 5, 4)
    check_op(torch.linalg.lu, a)
    check_op(torch.linalg.lu_factor, torch.randn(4, 4))
    check_op(lambda x: torch.lu_unpack(*torch.linalg.lu_factor(x)), torch.randn(3, 4))
    check_op(lambda x, y: torch.linalg.lu_solve(*torch.linalg.lu_factor(x), y, adjoint=True),
             _well(*B, 3, 3), torch.randn(3, 2))
    check_op(lambda x, y: torch.linalg.lu_solve(*torch.linalg.lu_factor(x), y, left=False),
             _well(3, 3), torch.randn(*B, 2, 3))


def test_triangular(seed):
    a = torch.randn(*B, 4, 4).triu() + 4 * torch.eye(4)
    check_op(lambda x, y: torch.linalg.solve_triangular(x, y, upper=True), a, torch.randn(4, 2))
    check_op(lambda x, y: torch.linalg.solve_triangular(x, y, upper=False, left=False,
                                                        unitriangular=True),
             a.mT, torch.randn(*B, 3, 4))
    check_op(lambda x, y: torch.triangular_solve(y, x, transpose=True), a, torch.randn(4, 2))


def test_svd_qr_eigh(seed):
    a = torch.randn(*B, 5, 3)
    check_op(torch.linalg.svd, a)
    check_op(lambda x: torch.linalg.svd(x, full_matrices=True), a.mT)
    check_op(torch.linalg.svdvals, a.clone().requires_grad_(), grad=True)
    check_op(torch.linalg.qr, a)
    check_op(lambda x: torch.linalg.qr(x, mode="complete"), a)
    check_op(lambda x: torch.linalg.qr(x, mode="r"), a.mT)
    s = _spd(*B, 4, 4)
    check_op(torch.linalg.eigh, s)
    check_op(lambda x: torch.linalg.eigvalsh(x, UPLO="U"), s)
    check_op(torch.linalg.pinv, a)
    check_op(lambda x: torch.linalg.pinv(x, hermitian=True), s)


def test_householder(seed):
    a, tau = torch.geqrf(torch.randn(*B, 5, 3))
    check_op(torch.geqrf, torch.randn(*B, 4, 3))
    check_op(torch.linalg.householder_product, a, tau)
    check_op(lambda x, t, c: torch.ormqr(x, t, c, transpose=True), a, tau, torch.randn(*B, 5, 2))
    check_op(lambda x, t, c: torch.ormqr(x, t, c, left=False), a, tau,
             torch.randn(*B, 2, 5))


def test_ldl_lstsq_matrix_exp(seed):
    s = _spd(*B, 4, 4)
    check_op(torch.linalg.ldl_factor, s)
    check_op(lambda x, y: torch.linalg.ldl_solve(*torch.linalg.ldl_factor(x), y), s,
             torch.randn(4, 2))
    a, b = torch.randn(*B, 5, 3), torch.randn(*B, 5, 2)
    for driver in ("gels", "gelsy", "gelsd", "gelss"):
        check_op(lambda x, y: torch.linalg.lstsq(x, y, driver=driver), a, b)
    check_op(torch.linalg.matrix_exp, 0.3 * torch.randn(*B, 4, 4))
    check_op(torch.linalg.matrix_exp, torch.randn(3, 3), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("p", [0.0, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_cdist_pdist(p, seed):
    x1, x2 = torch.randn(*B, 4, 3), torch.randn(5, 3)
    check_op(lambda a, b: torch.cdist(a, b, p=p), x1.requires_grad_(), x2.requires_grad_(),
             grad=True)
    check_op(lambda a: torch.nn.functional.pdist(a, p=p), torch.randn(5, 3).requires_grad_(),
             grad=True)


def test_cdist_mm_path(seed):
    check_op(lambda a, b: torch.cdist(a, b), torch.randn(30, 3), torch.randn(4, 3), atol=1e-4)


def test_float64_and_kernel_ran(seed):
    a = _spd(3, 3).double()
    check_op(torch.linalg.cholesky, a)
    neuron_eager.clear_op_tracking()
    torch.linalg.det(a.float().to("neuron"))
    assert neuron_eager.get_fallback_ops() == {}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matrix_exp_of_16_bit_floats(dtype, seed):
    # the CPU's matrix exponential is made of matmuls and takes 16-bit floats (it refused them)
    a = (torch.randn(2, 4, 4) * 0.5).to(dtype)
    exact = torch.linalg.matrix_exp(a.double())
    got = torch.linalg.matrix_exp(a.to("neuron")).cpu()
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), exact, rtol=2e-2, atol=1e-2)


def test_rank_deficient_float64_tolerances(seed):
    # float64 computes as float32: the default tolerances must cut float32's round-off
    # singular values (float64's eps kept them: pinv ~1e7, full rank)
    r = torch.randn(6, 3, dtype=torch.float64) @ torch.randn(3, 5, dtype=torch.float64)
    h = r @ r.mT
    check_op(torch.linalg.pinv, r, rtol=1e-4, atol=1e-5)
    check_op(lambda x: torch.linalg.pinv(x, hermitian=True), h, rtol=1e-3, atol=1e-5)
    check_op(torch.linalg.matrix_rank, r)
    check_op(lambda x: torch.linalg.matrix_rank(x, hermitian=True), h)


@pytest.mark.parametrize("kwargs", [{}, {"hermitian": True}, {"atol": 0.1, "rtol": 0.0},
                                    {"tol": 0.5}])
def test_matrix_rank_out(kwargs, seed):
    a = _spd(4, 4) - 4 * torch.eye(4)
    for device in ("cpu", "neuron"):
        out = torch.full((), -7, dtype=torch.int64, device=device)
        assert torch.linalg.matrix_rank(a.to(device), out=out, **kwargs) is out
        if device == "cpu":
            expected = out
    assert out.item() == expected.item()


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (2, 0, 3), (0, 0)])
def test_svd_of_empty_matrices(shape):
    # gesdd writes nothing for an empty matrix: the CPU's full U and Vh are identities
    for full in (True, False):
        expected = torch.linalg.svd(torch.ones(shape), full_matrices=full)
        got = torch.linalg.svd(torch.ones(shape, device="neuron"), full_matrices=full)
        for e, g in zip(expected, got):
            assert g.shape == e.shape and torch.equal(g.cpu(), e)


def test_matrix_exp_of_infinities():
    inf = float("inf")
    check_op(torch.linalg.matrix_exp, torch.tensor([[[inf, 0.0], [0.0, 1.0]],
                                                    [[1.0, -inf], [0.0, 1.0]],
                                                    [[0.5, 0.0], [0.0, 1.0]]]))


def _m(d, *shape, dtype=torch.float32):
    return torch.eye(*shape[-2:], dtype=dtype, device=d).expand(shape) if len(shape) > 1 \
        else torch.ones(shape, dtype=dtype, device=d)


L = torch.linalg
HALF, LONG = torch.half, torch.int64
ERRORS = {
    # 1-D input: torch's meta kernels assert (AssertionError); the CPU raises RuntimeError
    **{name: (lambda f: lambda d: f(_m(d, 3)))(f) for name, f in [
        ("inv", L.inv), ("inv_ex", L.inv_ex), ("det", L.det), ("slogdet", L.slogdet),
        ("cholesky", L.cholesky), ("cholesky_ex", L.cholesky_ex), ("eigh", L.eigh),
        ("eigvalsh", L.eigvalsh), ("matrix_exp", L.matrix_exp), ("ldl_factor", L.ldl_factor),
        ("solve", lambda a: L.solve(a, a)), ("cholesky_inverse", torch.cholesky_inverse),
        ("solve_triangular", lambda a: L.solve_triangular(a, a, upper=True)),
        ("torch.inverse", torch.inverse)]},
    # dtypes the CPU's kernels refuse, in the words of the kernel that refuses
    "pinv half": lambda d: L.pinv(_m(d, 2, 2, dtype=HALF)),
    "pinv int64": lambda d: L.pinv(_m(d, 2, 2, dtype=LONG)),
    "pinv 1-D": lambda d: L.pinv(_m(d, 3)),
    "svd int64": lambda d: L.svd(_m(d, 2, 2, dtype=LONG)),
    "solve half": lambda d: L.solve(_m(d, 2, 2, dtype=HALF), _m(d, 2, dtype=HALF)),
    "qr half": lambda d: L.qr(_m(d, 2, 2, dtype=HALF)),
    "det half": lambda d: L.det(_m(d, 2, 2, dtype=HALF)),
    "eigh half": lambda d: L.eigh(_m(d, 2, 2, dtype=HALF)),
    "lu pivot=False": lambda d: L.lu(_m(d, 2, 2), pivot=False),
    "lu_factor pivot=False": lambda d: L.lu_factor(_m(d, 2, 2), pivot=False),
    "vector_norm dtype=int64": lambda d: L.vector_norm(_m(d, 2), dtype=LONG),
    "vector_norm of int64": lambda d: L.vector_norm(_m(d, 2, dtype=LONG)),
    "tril_indices float": lambda d: torch.tril_indices(3, 3, dtype=torch.float32, device=d),
    "triu_indices bool": lambda d: torch.triu_indices(3, 3, dtype=torch.bool, device=d),
    # lstsq's checks (it has no meta kernel)
    "lstsq int64": lambda d: L.lstsq(_m(d, 2, 2, dtype=LONG), _m(d, 2, 2, dtype=LONG)),
    "lstsq half": lambda d: L.lstsq(_m(d, 2, 2, dtype=HALF), _m(d, 2, 2, dtype=HALF)),
    "lstsq float32, int64": lambda d: L.lstsq(_m(d, 3, 2), _m(d, 3, 2, dtype=LONG)),
    "lstsq float32, float64": lambda d: L.lstsq(_m(d, 3, 2), _m(d, 3, 2, dtype=torch.double)),
    "lstsq B of more dims": lambda d: L.lstsq(_m(d, 6, 3), _m(d, 2, 6, 2)),
    "lstsq 0-d B": lambda d: L.lstsq(_m(d, 4, 3), torch.tensor(1.0, device=d)),
    "lstsq rows": lambda d: L.lstsq(_m(d, 6, 3), _m(d, 5, 2)),
    "lstsq vector rows": lambda d: L.lstsq(_m(d, 6, 3), _m(d, 5)),
    "lstsq batch vs matrix": lambda d: L.lstsq(_m(d, 2, 6, 3), _m(d, 6, 2)),
    "lstsq batches": lambda d: L.lstsq(_m(d, 2, 6, 3), _m(d, 3, 6, 2)),
    "lstsq driver": lambda d: L.lstsq(_m(d, 6, 3), _m(d, 6, 2), driver="gesv"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_errors_as_on_cpu(name):
    expected = outcome(ERRORS[name], "cpu")
    assert isinstance(expected, tuple), "the CPU accepts it"
    assert outcome(ERRORS[name], "neuron") == expected


@pytest.mark.parametrize("a_shape,b_shape", [
    ((6, 3), (6,)), ((2, 6, 3), (2, 6)), ((1, 6, 3), (2, 6, 2)), ((3, 1, 6, 3), (1, 2, 6, 2)),
    ((6, 6, 3), (6, 6)), ((2, 6, 3), (1, 6, 2))])
@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd", "gelss"])
def test_lstsq_result_shapes(a_shape, b_shape, driver, seed):
    # residuals keep a vector b's column; rank and singular values have A's batch shape
    check_op(lambda a, b: tuple(L.lstsq(a, b, driver=driver)), torch.randn(a_shape),
             torch.randn(b_shape), atol=1e-4, rtol=1e-4)
