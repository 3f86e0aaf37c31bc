"""Product ops (ops/products.py): trace, addr, cross, bilinear (_trilinear), block_diag."""
import pytest
import torch
import torch.nn.functional as F

from checks import check_op

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES + [torch.int32])
def test_trace(dtype, seed):
    x = torch.randn(4, 6).to(dtype) if dtype.is_floating_point else torch.randint(-9, 9, (4, 6),
                                                                                   dtype=dtype)
    check_op(torch.trace, x)
    check_op(lambda t: torch.trace(t.t()), x)
    if dtype.is_floating_point:
        check_op(torch.trace, x.float().requires_grad_(), grad=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_addr(dtype, seed):
    s, a, b = torch.randn(3, 4).to(dtype), torch.randn(3).to(dtype), torch.randn(4).to(dtype)
    check_op(torch.addr, s, a, b)
    check_op(lambda x, y, z: torch.addr(x, y, z, beta=0.5, alpha=-2), s, a, b)
    check_op(lambda x, y, z: torch.addr(x, y, z, beta=0), torch.full((3, 4), float("nan")), a, b)
    check_op(torch.addr, torch.randn(4), a, b)  # self broadcasts
    check_op(torch.addr, s.float().requires_grad_(), a.float().requires_grad_(),
             b.float().requires_grad_(), grad=True)


def test_addr_int_and_bool(seed):
    i = torch.randint(-5, 5, (3, 4), dtype=torch.int32)
    check_op(lambda x, y, z: torch.addr(x, y, z, beta=2, alpha=3), i, i[:, 0], i[0])
    m = torch.rand(3, 4) > 0.5
    check_op(lambda x, y, z: torch.addr(x, y, z, beta=False), m, m[:, 0], m[0])
    check_op(torch.addr, m, m[:, 1], m[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross(dtype, seed):
    a, b = torch.randn(2, 1, 3).to(dtype), torch.randn(1, 4, 3).to(dtype)
    check_op(torch.linalg.cross, a, b)
    check_op(lambda x, y: torch.cross(x, y, dim=0), torch.randn(3, 5).to(dtype),
             torch.randn(3, 5).to(dtype).t().contiguous().t())
    check_op(torch.linalg.cross, a.float().requires_grad_(), b.float().requires_grad_(),
             grad=True)
    with pytest.raises(RuntimeError, match="expected scalar type Float but found Int"):
        torch.cross(torch.ones(2, 3, device="neuron"),
                    torch.ones(2, 3, dtype=torch.int32, device="neuron"), dim=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bilinear(dtype, seed):
    x1, x2 = torch.randn(4, 3).to(dtype), torch.randn(4, 5).to(dtype)
    w, bias = torch.randn(6, 3, 5).to(dtype), torch.randn(6).to(dtype)
    check_op(F.bilinear, x1, x2, w, bias, rtol=2e-2 if dtype == torch.bfloat16 else None,
             atol=5e-2 if dtype == torch.bfloat16 else None)
    if dtype == torch.float32:
        check_op(F.bilinear, x1.requires_grad_(), x2.requires_grad_(), w.requires_grad_(),
                 grad=True)


def test_block_diag(seed):
    check_op(lambda *ts: torch.block_diag(*ts), torch.ones(2, dtype=torch.int32),
             torch.tensor(3.0), torch.randn(2, 3).bfloat16())
    check_op(lambda *ts: torch.block_diag(*ts), torch.randn(2, 2).requires_grad_(),
             torch.randn(1, 3).requires_grad_(), grad=True)
    check_op(lambda *ts: torch.block_diag(*ts), torch.randn(2, 0), torch.randn(3, 2).t())
