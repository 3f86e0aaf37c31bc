import pytest
import torch
import torch.nn.functional as F
from checks import NEURON, check_op

import neuron_eager

aten = torch.ops.aten
FLOATS = [torch.float32, torch.bfloat16]
REDUCTIONS = ["none", "mean", "sum"]


def _ran(*names):
    """Every op in `names` (aten names without overload) ran on a neuron kernel."""
    ran = {k.split("::")[-1].split(".")[0] for k in neuron_eager.get_executed_ops()}
    missing = set(names) - ran
    assert not missing, f"{missing} did not run on neuron: {sorted(ran)}"


def _log_probs(shape, dtype):
    return torch.randn(shape).log_softmax(1).to(dtype).requires_grad_()


# -- nll_loss ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss(dtype, reduction, seed):
    x = _log_probs((7, 5), dtype)
    t = torch.tensor([0, 4, 2, -100, 1, 3, 4])  # -100: the default ignore_index
    w = torch.rand(5, dtype=dtype) + 0.1
    check_op(lambda x, t: F.nll_loss(x, t, reduction=reduction), x, t, grad=True)
    check_op(lambda x, t, w: F.nll_loss(x, t, w, reduction=reduction), x, t, w, grad=True)
    check_op(lambda x, t, w: F.nll_loss(x, t, w, reduction=reduction, ignore_index=4), x,
             t.clamp(min=0), w, grad=True)
    _ran("nll_loss_forward", "nll_loss_backward")


def test_nll_loss_ops_and_total_weight(seed):
    x, t, w = _log_probs((6, 4), torch.float32), torch.tensor([0, 3, 1, 1, 2, 0]), torch.rand(4)
    for reduction in (0, 1, 2):
        out, total = check_op(lambda *a: aten.nll_loss_forward(*a, reduction, 1), x, t, w)
        g = torch.randn(6) if reduction == 0 else torch.tensor(0.7)
        check_op(lambda *a: aten.nll_loss_backward(*a, reduction, 1, total.cpu()), g, x, t, w)
    check_op(lambda x, t: F.nll_loss(x, t), _log_probs((1, 4), torch.float32)[0],
             torch.tensor(2), grad=True)  # no batch dimension
    check_op(lambda x, t: F.nll_loss(x, t.to(torch.uint8)), x, t)  # Byte targets


def test_nll_loss_all_ignored_and_empty(seed):
    x = _log_probs((3, 4), torch.float32)
    ignored = torch.full((3,), -100)
    check_op(lambda x, t: F.nll_loss(x, t), x, ignored, grad=True)  # NaN, zero grad
    check_op(lambda x, t: F.nll_loss(x, t, reduction="sum"), x, ignored, grad=True)
    empty = torch.empty(0, 4).requires_grad_()
    check_op(lambda x, t: F.nll_loss(x, t), empty, torch.empty(0, dtype=torch.long), grad=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss2d(dtype, reduction, seed):
    x = _log_probs((2, 3, 4, 5), dtype)
    t = torch.randint(0, 3, (2, 4, 5))
    t[0, 1, :2] = -100
    w = torch.rand(3, dtype=dtype) + 0.1
    check_op(lambda x, t, w: F.nll_loss(x, t, w, reduction=reduction), x, t, w, grad=True)
    check_op(lambda x, t: F.nll_loss(x, t, reduction=reduction, ignore_index=1), x,
             t.clamp(min=0), grad=True)
    _ran("nll_loss2d_forward", "nll_loss2d_backward")


def test_nll_loss_errors_match_cpu():
    x = torch.randn(3, 5).log_softmax(1).to(NEURON)
    with pytest.raises(IndexError, match="Target 7 is out of bounds."):
        F.nll_loss(x, torch.tensor([0, 7, 1]).to(NEURON))
    with pytest.raises(IndexError, match="Target -2 is out of bounds."):
        F.nll_loss(x, torch.tensor([0, -2, 1]).to(NEURON), reduction="none")
    with pytest.raises(RuntimeError, match=r"size mismatch \(got input: \[3, 5\], target: \[2\]"):
        aten.nll_loss_forward(x, torch.tensor([0, 1]).to(NEURON), None, 1, -100)
    with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte"):
        aten.nll_loss_forward(x, torch.tensor([0, 1, 2], dtype=torch.int32).to(NEURON), None,
                              1, -100)
    with pytest.raises(RuntimeError, match="weight tensor should be defined either for all 5"):
        F.nll_loss(x, torch.tensor([0, 1, 2]).to(NEURON), torch.ones(4).to(NEURON))
    with pytest.raises(IndexError, match="Target 3 is out of bounds."):
        F.nll_loss(torch.randn(1, 3, 2, 2).to(NEURON), torch.full((1, 2, 2), 3).to(NEURON))
    byte = torch.zeros(1, 2, 2, dtype=torch.uint8)  # (spatial: the CPU takes int64 only)
    with pytest.raises(RuntimeError) as cpu_error:
        F.cross_entropy(torch.randn(1, 3, 2, 2), byte)
    with pytest.raises(RuntimeError, match=str(cpu_error.value)):
        F.cross_entropy(torch.randn(1, 3, 2, 2).to(NEURON), byte.to(NEURON))


# -- cross entropy: log_softmax (softmax family) + nll_loss ------------------------------
CE_CASES = [(torch.float32, {}, False), (torch.float32, {"reduction": "none"}, True),
            (torch.float32, {"label_smoothing": 0.1, "reduction": "sum"}, True),
            (torch.bfloat16, {}, True), (torch.bfloat16, {"label_smoothing": 0.1}, False)]


@pytest.mark.parametrize("dtype, kwargs, weighted", CE_CASES,
                         ids=["plain", "none-weighted", "smoothing-sum-weighted", "bf16-weighted",
                              "bf16-smoothing"])
def test_cross_entropy(dtype, kwargs, weighted, seed):
    x = torch.randn(6, 5, dtype=dtype, requires_grad=True)
    t = torch.tensor([0, 4, 2, -100, 1, 3])
    w = torch.rand(5, dtype=dtype) + 0.1
    if weighted:
        check_op(lambda x, t, w: F.cross_entropy(x, t, w, **kwargs), x, t, w, grad=True,
                 native=False)
    else:
        check_op(lambda x, t: F.cross_entropy(x, t, **kwargs), x, t, grad=True, native=False)
    _ran("nll_loss_forward", "nll_loss_backward")


def test_cross_entropy_spatial_and_probabilities(seed):
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    t = torch.randint(0, 3, (2, 4, 4))
    check_op(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), x, t, grad=True,
             native=False)
    _ran("nll_loss2d_forward", "nll_loss2d_backward")
    logits = torch.randn(6, 5, requires_grad=True)
    probs = torch.softmax(torch.randn(6, 5), 1)  # class-probability targets decompose
    check_op(lambda x, p: F.cross_entropy(x, p), logits, probs, grad=True, native=False)
    check_op(lambda x, p: F.cross_entropy(x, p, label_smoothing=0.2), logits, probs, grad=True,
             native=False)


# -- regression losses -------------------------------------------------------------------
REGRESSION = {
    "mse": lambda a, b, r: F.mse_loss(a, b, reduction=r),
    "smooth_l1": lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r, beta=0.5),
    "huber": lambda a, b, r: F.huber_loss(a, b, reduction=r, delta=0.7),
}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", list(REGRESSION))
def test_regression_losses(name, reduction, seed):
    a, b = torch.randn(5, 6, requires_grad=True), torch.randn(5, 6)
    check_op(lambda a, b: REGRESSION[name](a, b, reduction), a, b, grad=True)
    _ran({"mse": "mse_loss", "smooth_l1": "smooth_l1_loss", "huber": "huber_loss"}[name])


@pytest.mark.parametrize("name", list(REGRESSION))
def test_regression_losses_bfloat16(name, seed):
    a = torch.randn(5, 6, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(5, 6, dtype=torch.bfloat16)
    check_op(lambda a, b: REGRESSION[name](a, b, "mean"), a, b, grad=True)
    check_op(lambda a, b: REGRESSION[name](a, b, "none"), a, b, grad=True)


def test_regression_losses_broadcast_and_strided(seed):
    a = torch.randn(4, 6, requires_grad=True)
    check_op(lambda a, b: aten.mse_loss(a, b, 0), a, torch.randn(6))  # aten broadcasts
    check_op(lambda a, b: F.smooth_l1_loss(a.t(), b, reduction="sum"), a, torch.randn(6, 4),
             grad=True)
    check_op(lambda a, b: F.smooth_l1_loss(a, b, beta=0.0), a, torch.randn(4, 6), grad=True,
             native=False)  # beta=0 is L1, decomposed by PyTorch
    check_op(lambda a, b: F.l1_loss(a, b), a, torch.randn(4, 6), grad=True, native=False)


# -- binary cross entropy ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(dtype, reduction, seed):
    p = torch.rand(4, 7).clamp(0.02, 0.98).to(dtype).requires_grad_()
    t, w = torch.rand(4, 7, dtype=dtype), torch.rand(7, dtype=dtype)
    check_op(lambda p, t: F.binary_cross_entropy(p, t, reduction=reduction), p, t, grad=True)
    check_op(lambda p, t, w: F.binary_cross_entropy(p, t, w, reduction=reduction), p, t, w,
             grad=True)
    _ran("binary_cross_entropy", "binary_cross_entropy_backward")


def test_binary_cross_entropy_edges():
    p = torch.tensor([0.0, 1.0, 0.5, 1.0])
    t = torch.tensor([1.0, 0.0, 0.5, 1.0])
    check_op(lambda p, t: F.binary_cross_entropy(p, t, reduction="none"), p, t)  # log -> -100
    with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
        F.binary_cross_entropy(torch.tensor([0.5, 1.5]).to(NEURON),
                               torch.tensor([1.0, 0.0]).to(NEURON))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits(dtype, reduction, seed):
    x = (torch.randn(4, 7) * 4).to(dtype).requires_grad_()
    t, w = torch.rand(4, 7, dtype=dtype), torch.rand(4, 1, dtype=dtype)
    pos = torch.rand(7, dtype=dtype) * 3
    check_op(lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction), x, t)
    check_op(lambda x, t, w, pw: F.binary_cross_entropy_with_logits(
        x, t, w, pos_weight=pw, reduction=reduction), x, t, w, pos)
    # the backward is a PyTorch formula over elementwise ops of other families
    check_op(lambda x, t, w, pw: F.binary_cross_entropy_with_logits(
        x, t, w, pos_weight=pw, reduction=reduction), x, t, w, pos, grad=True, native=False)
    _ran("binary_cross_entropy_with_logits")


def test_kl_div_decomposes(seed):
    x = torch.randn(3, 5).log_softmax(1).requires_grad_()
    t = torch.softmax(torch.randn(3, 5), 1)
    check_op(lambda x, t: F.kl_div(x, t, reduction="batchmean"), x, t, grad=True, native=False)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float64), (torch.float16, torch.float32),
                                    (torch.bfloat16, torch.float32)], ids=str)
def test_losses_keep_the_inputs_dtype_as_the_cpu(dtypes, reduction):
    # huber and soft margin compute in the common dtype (soft margin: step by step into
    # self's) and return self's; BCE takes a weight of another dtype (its target it refuses)
    x_dtype, other = dtypes
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=g).to(x_dtype)
    t = (torch.randint(0, 2, (5, 7), generator=g) * 2 - 1).to(other)
    p = torch.rand(5, 7, generator=g).to(x_dtype)
    losses = [lambda x, t, p: F.soft_margin_loss(x, t, reduction=reduction),
              lambda x, t, p: F.huber_loss(x, t, reduction=reduction, delta=0.5),
              lambda x, t, p: F.binary_cross_entropy(p, (t > 0).to(x_dtype), reduction=reduction,
                                                     weight=t.abs() * 2)]
    for loss in losses:
        expected = loss(x, t, p)
        got = loss(x.to(NEURON), t.to(NEURON), p.to(NEURON)).cpu()
        assert got.dtype == expected.dtype == x_dtype
        torch.testing.assert_close(got, expected)
    # soft margin's gradient as the CPU's in-place steps round it, bit for bit in 16 bits
    results = []
    for device in ("cpu", NEURON):
        xx = x.clone().to(device).requires_grad_()
        grad = torch.ones(5, 7) if reduction == "none" else torch.ones(())
        F.soft_margin_loss(xx, t.to(device), reduction=reduction).backward(
            grad.to(x_dtype).to(device))
        results.append(xx.grad.cpu())
    if x_dtype != torch.float32:
        assert torch.equal(results[1], results[0])
    torch.testing.assert_close(results[1], results[0])


# -- margin losses and CTC ---------------------------------------------------------------
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_margin_losses_backward(reduction, seed):
    x = torch.randn(6, 5, requires_grad=True)
    t = torch.tensor([0, 4, 2, 1, 3, 4])
    w = torch.rand(5) + 0.5
    check_op(lambda x, t, w: F.multi_margin_loss(x, t, p=2, margin=0.7, weight=w,
                                                 reduction=reduction), x, t, w, grad=True)
    check_op(lambda x, t: F.multi_margin_loss(x, t, reduction=reduction), x[0], t[0], grad=True)
    labels = torch.tensor([[3, 0, -1, 1, 2], [1, 2, 4, 0, 3], [-1, 1, 2, 3, 4],
                           [4, -1, 0, 0, 0], [2, 1, -1, 0, 0], [0, 1, 2, 3, -1]])
    check_op(lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction), x, labels,
             grad=True)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_ctc_loss(reduction, seed):
    T_, N, C = 12, 3, 6
    lp = torch.randn(T_, N, C).log_softmax(2).requires_grad_()
    targets = torch.tensor([[1, 2, 2, 5], [3, 3, 1, 0], [4, 1, 5, 2]])
    in_lens, tg_lens = [12, 9, 5], [4, 2, 0]
    check_op(lambda lp, t: F.ctc_loss(lp, t, in_lens, tg_lens, reduction=reduction), lp,
             targets, grad=True, rtol=1e-4, atol=1e-5)
    flat = torch.tensor([1, 2, 2, 5, 3, 3], dtype=torch.int32)  # concatenated targets
    check_op(lambda lp, t, il, tl: F.ctc_loss(lp, t, il, tl, blank=0, reduction=reduction,
                                              zero_infinity=True),
             lp, flat, torch.tensor([12, 1, 5]), torch.tensor([4, 2, 0]), grad=True,
             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_ctc_loss_with_lengths_on_the_cpu(reduction, seed):
    # as on CUDA, the lengths may stay CPU tensors (only log_probs must be on the device),
    # "mean" included: Note [CTC lengths as tensors]
    lp = torch.randn(12, 2, 6).log_softmax(2).requires_grad_()
    targets = torch.tensor([[1, 2, 2, 3], [4, 1, 0, 0]])
    in_lens, tg_lens = torch.tensor([12, 10]), torch.tensor([4, 2], dtype=torch.int32)
    check_op(lambda lp, t: F.ctc_loss(lp, t, in_lens, tg_lens, reduction=reduction), lp,
             targets, grad=True, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError) as cpu:  # input longer than log_probs: the CPU's error
        F.ctc_loss(lp, targets, torch.tensor([13, 10]), tg_lens)
    with pytest.raises(RuntimeError) as ours:
        F.ctc_loss(lp.detach().to(NEURON), targets.to(NEURON), torch.tensor([13, 10]), tg_lens)
    assert str(ours.value) == str(cpu.value)
    with pytest.raises(RuntimeError, match="input_lengths must be integral"):
        F.ctc_loss(lp.detach().to(NEURON), targets.to(NEURON), in_lens.float(), tg_lens)


def test_multi_margin_loss_with_a_strided_target():
    """The kernel reads a contiguous copy of a strided target: the copy must stay alive (it
    was freed and overwritten by the next allocation: Note [Blocks still seen])."""
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(6, 8, generator=g), torch.randint(0, 5, (6, 8), generator=g)
    check_op(lambda x, t: F.multi_margin_loss(x, t[:, 0], reduction="none"), x, t)
