import pytest
import torch
import torch.nn.functional as F

from checks import check_op


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_special_binary(dtype, seed):
    a = (torch.randn(6, 5) * 3).to(dtype)
    b = torch.randn(6, 5).to(dtype)
    b[0, 0], a[1, 1] = float("nan"), 0.0
    for op in [torch.xlogy, torch.special.xlog1py, torch.logaddexp, torch.logaddexp2, torch.fmax,
               torch.fmin, torch.copysign, torch.hypot]:
        check_op(op, a, b.abs() if op in (torch.xlogy,) else b)
    check_op(torch.heaviside, a, torch.tensor(0.5, dtype=dtype))
    check_op(lambda x: torch.xlogy(x, 2.0), a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_heaviside_and_xlogy_edge_values(dtype):
    """Non-finite inputs and signed zeros, bit for bit (assert_close equates -0.0 and 0.0)."""
    x = torch.tensor([-1.0, 0.0, -0.0, 2.0, float("nan"), float("inf"), -float("inf")], dtype=dtype)
    y = torch.tensor([2.0, 3.0, float("nan"), 0.0, 1.0, float("inf"), 0.5], dtype=dtype)
    for fn in [lambda a, b: torch.heaviside(a, torch.tensor(0.5, dtype=dtype, device=a.device)),
               torch.xlogy, torch.special.xlog1py, lambda a, b: torch.xlogy(a.neg(), b)]:
        expected, actual = fn(x, y), fn(x.to("neuron"), y.to("neuron")).cpu()
        nan = expected.isnan()
        assert torch.equal(actual.isnan(), nan)  # (NaN payloads and signs aside)
        bits = torch.int16 if dtype != torch.float32 else torch.int32
        assert torch.equal(actual[~nan].view(bits), expected[~nan].view(bits))


def test_special_unary_and_grads(seed):
    x = torch.randn(7, 3, requires_grad=True)
    for op in [torch.sinc, torch.deg2rad, torch.rad2deg, torch.frac,
               lambda t: torch.logit(t.sigmoid()), lambda t: torch.logit(t, eps=1e-3),
               lambda t: torch.round(t * 10, decimals=1), lambda t: torch.round(t, decimals=-1)]:
        check_op(op, x, grad=True)
    check_op(torch.signbit, torch.tensor([-0.0, 0.0, -2.0, 3.0, float("nan")]))
    check_op(lambda t: torch.logaddexp(t, t.flip(0)), x, grad=True)


def test_view_copies_and_layout_moves(seed):
    x = torch.randn(2, 8, 3, 4, requires_grad=True)
    for op in [lambda t: torch.permute_copy(t, (3, 0, 2, 1)), lambda t: torch.t_copy(t[0, 0]),
               lambda t: torch.view_copy(t, (16, 12)), lambda t: torch.diagonal_copy(t[0], 0, 1, 2),
               lambda t: torch.expand_copy(t[:1], (3, 8, 3, 4)), lambda t: F.pixel_shuffle(t, 2),
               lambda t: F.pixel_unshuffle(t[..., :2, :], 2), lambda t: F.channel_shuffle(t, 4),
               lambda t: torch.diag_embed(t[0, 0], offset=1)]:
        check_op(op, x, grad=True)
    x = torch.randn(3, 4)
    assert torch.equal(x.to("neuron"), x.to("neuron"))
    assert not torch.equal(x.to("neuron"), (x + 1).to("neuron"))
    assert not torch.equal(x.to("neuron"), x[:2].to("neuron"))
    check_op(torch.vdot, torch.randn(5), torch.randn(5))
