"""bf16 products on MKL's bf16 GEMM (Note [bf16 chunks on MKL] in ops/bf16_chunks.py): the
same PSUM sums as the fp32 path, bit for bit, and the fp32 path wherever that is not sure."""
import numpy as np
import pytest
import torch

import neuron_eager
from neuron_eager.ops import bf16_chunks
from test_matmul import _chunked_reference, _exact_chunk_operands

pytestmark = pytest.mark.skipif(not bf16_chunks.AVAILABLE,
                                reason="no MKL bf16 GEMM or no bf16 units on this CPU")
BF16 = torch.bfloat16


@pytest.fixture
def taken(monkeypatch):
    """Whether each product went through bf16_chunks (True) or the fp32 path (False)."""
    seen = []
    products = bf16_chunks.products
    monkeypatch.setattr(bf16_chunks, "products",
                        lambda *args: seen.append(products(*args)) or seen[-1])
    return seen


def _psum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Note [PSUM accumulation] of exact-chunk operands, in fp32: batched over leading dims."""
    x, y = a.float().numpy(), b.float().numpy()
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    x, y = np.broadcast_to(x, batch + x.shape[-2:]), np.broadcast_to(y, batch + y.shape[-2:])
    out = np.empty(batch + (x.shape[-2], y.shape[-1]), np.float32)
    for i in np.ndindex(batch):
        out[i] = _chunked_reference(x[i], y[i])
    return torch.from_numpy(out)


def _operands(m, k, n, batch=()):
    pairs = [_exact_chunk_operands(m, k, n, BF16) for _ in range(int(np.prod(batch)))]
    return (torch.stack([p[0] for p in pairs]).reshape(*batch, m, k),
            torch.stack([p[1] for p in pairs]).reshape(*batch, k, n))


def test_products_are_the_psum_sums_bit_for_bit(taken, seed):
    a, b = _operands(140, 300, 170)
    wide = torch.cat([a, torch.zeros(140, 100, dtype=BF16)], 1)[:, :300]  # lda > K
    for x, y in ((a, b), (a.t().contiguous().t(), b), (a, b.t().contiguous().t()), (wide, b)):
        got = torch.mm(x.to("neuron"), y.to("neuron"))
        assert torch.equal(got.cpu(), _psum(a, b).to(BF16))
        fp32 = torch.mm(x.to("neuron"), y.to("neuron"), out_dtype=torch.float32)
        assert torch.equal(fp32.cpu(), _psum(a, b))  # the accumulator itself
    p, q = _operands(96, 260, 1500, batch=(3,))  # 96-row blocks, two columns of them
    got = torch.matmul(p[None].expand(2, 3, 96, 260).to("neuron"), q.to("neuron"))
    assert torch.equal(got.cpu(), _psum(p, q).to(BF16).expand(2, 3, 96, 1500))
    a, b = _operands(300, 260, 700)  # 256-row blocks: two rows and two columns of them
    assert torch.equal(torch.mm(a.to("neuron"), b.to("neuron")).cpu(), _psum(a, b).to(BF16))
    assert taken == [True] * 10 and not torch.equal(_psum(a, b), (a.float() @ b.float()))


def test_epilogues_round_once(taken, seed):
    a, b = _operands(200, 300, 520)
    acc = _psum(a, b).numpy()
    for c in (torch.randn(520).to(BF16), torch.randn(200, 520).to(BF16)):
        got = torch.addmm(c.to("neuron"), a.to("neuron"), b.to("neuron"), beta=0.5, alpha=3)
        want = np.float32(3) * acc + np.float32(0.5) * c.float().numpy()  # fp32, then once
        assert torch.equal(got.cpu(), torch.from_numpy(want).to(BF16))
    p, q = _operands(130, 256, 140, batch=(3,))  # addbmm: the batch is summed, chunk by chunk
    want = np.zeros((130, 140), np.float32)
    for i in range(3):
        for k0 in range(0, 256, 128):
            want += (p[i, :, k0:k0 + 128].double() @ q[i, k0:k0 + 128].double()).float().numpy()
    got = torch.addbmm(torch.zeros(130, 140, dtype=BF16).to("neuron"), p.to("neuron"),
                       q.to("neuron"))
    assert torch.equal(got.cpu(), torch.from_numpy(want).to(BF16))
    assert taken == [True] * 3


def test_stochastic_rounding_rounds_the_psum_sums(taken, seed):
    a, b = _operands(128, 256, 256)
    exact = _psum(a, b)
    neuron_eager.config.stochastic_rounding = True
    try:
        got = torch.mm(a.to("neuron"), b.to("neuron")).cpu()
    finally:
        neuron_eager.config.stochastic_rounding = False
    low = (exact.view(torch.int32) >> 16).to(torch.int16).to(torch.int32)  # toward zero
    steps = got.view(torch.int16).to(torch.int32) - low
    assert set(steps.unique().tolist()) == {0, 1} and taken == [True]


def test_values_the_bf16_units_would_flush_or_overflow_take_the_fp32_path(taken, seed):
    # products of 2^-70 and 2^-70 are subnormal in fp32: the bf16 units flush them to zero
    tiny = torch.full((64, 256), 2.0 ** -70, dtype=BF16)
    # 200 products of 2^120 fit in fp32, the doubled accumulator would not
    big = torch.full((64, 200), 2.0 ** 60, dtype=BF16)
    for x, y in ((tiny, torch.full((256, 256), 2.0 ** -70, dtype=BF16)),
                 (big, torch.full((200, 256), 2.0 ** 60, dtype=BF16))):
        got = torch.mm(x.to("neuron"), y.to("neuron")).cpu()
        assert torch.equal(got, (x.double() @ y.double()).to(BF16))  # exact: 2^-132, 1.5625*2^127
    sub = torch.randn(64, 256).to(BF16)
    sub[3, 5] = 2.0 ** -130  # a subnormal operand
    wide = torch.randn(64, 512).to(BF16)
    for x, dev in ((sub, sub.to("neuron")),
                   (wide[:, ::2], wide.to("neuron")[:, ::2])):  # no leading dimension for BLAS
        y = torch.randn(256, 256).to(BF16)
        got = torch.mm(dev, y.to("neuron")).cpu()
        torch.testing.assert_close(got, (x.float() @ y.float()).to(BF16))
    assert taken == [False] * 4


def test_a_library_that_adds_parts_of_a_chunk_is_not_used(taken, monkeypatch, seed):
    monkeypatch.setattr(bf16_chunks, "_probed", [False])
    a, b = _operands(140, 300, 170)
    assert torch.equal(torch.mm(a.to("neuron"), b.to("neuron")).cpu(), _psum(a, b).to(BF16))
    assert taken == [False]


def _small_ints(*shape):
    return torch.randint(-4, 5, shape).to(BF16)


@pytest.mark.parametrize("case", [
    dict(x=(2, 64, 12, 12), w=(64, 64, 3, 3), padding=1),
    dict(x=(3, 48, 9, 10), w=(128, 24, 3, 2), stride=(2, 1), groups=2, bias=True),
    dict(x=(4, 160, 40), w=(64, 160, 5), dilation=2, bias=True),  # 1-D, K = 800
    dict(x=(1, 16, 5, 6, 7), w=(64, 16, 3, 3, 3), padding=1),  # 3-D
])  # (64 output channels: products of fewer than 64 x 64 outputs or 64 deep stay fp32)
def test_convolutions_on_the_bf16_units_are_exact(case, monkeypatch, seed):
    # integer values: every sum is exact in any order, so the results are the float64
    # convolution's, rounded once, forward and both gradients (Note [bf16 chunks on MKL])
    runs = []
    run = bf16_chunks.run
    bf16_chunks.chunk_sums_are_added()  # (its once-per-process probe runs a product too)
    monkeypatch.setattr(bf16_chunks, "run", lambda *args: runs.append(1) or run(*args))
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d,
            5: torch.nn.functional.conv3d}[len(case["x"])]
    options = {k: v for k, v in case.items() if k not in ("x", "w", "bias")}
    x, w = _small_ints(*case["x"]), _small_ints(*case["w"])
    b = _small_ints(case["w"][0]) if case.get("bias") else None
    results, g = [], None
    for device, dtype in (("cpu", torch.float64), ("neuron", BF16)):
        xs, ws = (t.to(device, dtype).requires_grad_() for t in (x, w))
        out = conv(xs, ws, None if b is None else b.to(device, dtype), **options)
        g = _small_ints(*out.shape) if g is None else g
        out.backward(g.to(device, dtype))
        results.append([t.cpu().to(BF16) for t in (out, xs.grad, ws.grad)])
    for want, got in zip(*results):
        assert torch.equal(got, want)
    assert len(runs) == 3  # forward, image gradient, weight gradient
