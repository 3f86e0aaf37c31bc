"""torch.autocast("neuron"): CUDA's op lists and cast policies, checked against the CPU.

References are the CPU's own autocast (for ops both lists put in lower precision) or the
same computation with the casts written out; nothing may fall back to the CPU.
"""
import copy

import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from checks import assert_close
from neuron_eager import autocast

N = torch.device("neuron")
LOW = [torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _all_native():
    yield
    assert neuron_eager.get_fallback_ops() == {}, neuron_eager.get_fallback_ops()


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def _dev(*tensors):
    return [t.to(N) for t in tensors]


def test_lists_are_cuda_lists():
    """Same overloads as torch registers on AutocastCUDA (less the cudnn ones), and all
    of them reach the dispatcher on our key."""
    cuda = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA"))
    cuda -= {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::_cudnn_rnn"}
    cuda |= {op.name() for op in autocast.RECURRENT_LAYERS}  # in _cudnn_rnn's place
    cuda |= {op.name() for op in autocast.FAST_PATHS}  # (CUDA's modules skip them)
    ours = {op.name() for op in autocast.POLICY}
    assert ours == cuda
    assert set(torch._C._dispatch_get_registrations_for_dispatch_key(autocast.KEY)) == ours
    for op in autocast.POLICY:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), autocast.KEY)


@pytest.mark.parametrize("dtype", LOW)
def test_lower_precision_matches_manual_cast(dtype, seed):
    x, w, b = _rand(5, 8), _rand(6, 8), _rand(6)
    a3, m = _rand(2, 5, 8), _rand(8, 3)
    img, k = _rand(1, 2, 6, 6), _rand(3, 2, 3, 3)
    cases = [
        (F.linear, (x, w, b)),
        (torch.matmul, (a3, m)),  # matmul -> composite of mm: cast once, at matmul
        (torch.bmm, (a3, _rand(2, 8, 4))),
        (lambda c, p, q: torch.addmm(c, p, q, beta=0.5), (_rand(5, 3), x, m)),
        (lambda i, k, c: F.conv2d(i, k, c, padding=1), (img, k, _rand(3))),
        (F.conv_transpose2d, (img, _rand(2, 3, 3, 3))),
    ]
    for fn, args in cases:
        with torch.autocast("neuron", dtype=dtype):
            out = fn(*_dev(*args))
        assert out.dtype == dtype
        # the reference: inputs rounded to `dtype`, computed in fp32, rounded once (the
        # CPU's own 16-bit convolutions are less precise without AVX-512 BF16/FP16)
        expected = fn(*(t.to(dtype).float() for t in args)).to(dtype)
        assert_close(out, expected, msg=str(fn))


def test_lower_precision_matches_cpu_autocast(seed):
    """Linear, matmul and conv are bf16 under both CPU and CUDA lists: same results."""
    x, w, b, img, k = _rand(5, 8), _rand(6, 8), _rand(6), _rand(1, 2, 6, 6), _rand(3, 2, 3, 3)
    fn = lambda x, w, b, img, k: (F.linear(x, w, b), x @ w.t(), F.conv2d(img, k))  # noqa: E731
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = fn(x, w, b, img, k)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        actual = fn(*_dev(x, w, b, img, k))
    assert [t.dtype for t in actual] == [torch.bfloat16] * 3
    assert_close(actual, expected)


def test_tensor_list_and_cell_ops(seed):
    x, h, c = _rand(3, 4), _rand(3, 5), _rand(3, 5)
    w_ih, w_hh, b = _rand(20, 4), _rand(20, 5), _rand(20)
    mats = (_rand(3, 4), _rand(4, 6), _rand(6, 2))
    with torch.autocast("neuron", dtype=torch.bfloat16):
        hy, cy = torch.lstm_cell(*_dev(x), _dev(h, c), *_dev(w_ih, w_hh, b, b))
        chain = torch.linalg.multi_dot(_dev(*mats))
        q = _dev(_rand(2, 4, 8))[0]
        att = F.scaled_dot_product_attention(q, q, q)
    low = lambda *ts: [t.bfloat16() for t in ts]  # noqa: E731
    assert_close((hy, cy), torch.lstm_cell(*low(x), low(h, c), *low(w_ih, w_hh, b, b)))
    assert_close(chain, torch.linalg.multi_dot(low(*mats)))
    assert_close(att, F.scaled_dot_product_attention(*low(q.cpu(), q.cpu(), q.cpu())))


@pytest.mark.parametrize("layer", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
def test_recurrent_layers_run_in_lower_precision(layer, seed):
    # as CUDA's autocast of _cudnn_rnn: bf16 results, computed from bf16 inputs and weights
    m, x = layer(8, 4, num_layers=2), _rand(5, 3, 8)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out, _ = copy.deepcopy(m).to(N)(x.to(N))
    assert out.dtype == torch.bfloat16
    assert_close(out, m.bfloat16()(x.bfloat16())[0], atol=2e-2, rtol=2e-2)


def test_fp32_ops_run_in_float32(seed):
    x = _rand(4, 6, dtype=torch.bfloat16)
    target = _rand(4, 6)
    cases = [
        lambda x: torch.softmax(x, -1), lambda x: F.log_softmax(x, 1),
        lambda x: F.layer_norm(x, (6,)), lambda x: F.group_norm(x.view(4, 2, 3), 2),
        torch.exp, lambda x: x.pow(2), lambda x: x.cumsum(0), lambda x: x.sum(),
        lambda x: x.sum(1), lambda x: x.prod(1), lambda x: x.logsumexp(1),
        lambda x: x.norm(), lambda x: x.norm(dim=1), lambda x: torch.linalg.vector_norm(x),
        lambda x: F.mse_loss(x, target.to(x.device)),
        lambda x: F.binary_cross_entropy_with_logits(x, target.sigmoid().to(x.device)),
        lambda x: F.cosine_similarity(x, x.flip(0)),
    ]
    for i, fn in enumerate(cases):
        with torch.autocast("neuron", dtype=torch.bfloat16):
            out = fn(x.to(N))
        assert out.dtype == torch.float32, i
        assert_close(out, fn(x.float()), msg=f"case {i}")
    # cross_entropy is not listed: its composite calls log_softmax with an explicit
    # dtype=input dtype (kept, so bf16), then nll_loss, which runs in float32.
    y = torch.arange(4)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = F.cross_entropy(x.to(N), y.to(N))
    assert out.dtype == torch.float32
    assert_close(out, F.nll_loss(F.log_softmax(x, 1).float(), y))


def test_explicit_dtype_and_ineligible_inputs_untouched(seed):
    x = _rand(4, 6, dtype=torch.bfloat16)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert torch.softmax(x.to(N), -1, dtype=torch.bfloat16).dtype == torch.bfloat16
        assert x.to(N).sum(dtype=torch.bfloat16).dtype == torch.bfloat16
        assert torch.softmax(x, -1).dtype == torch.bfloat16  # CPU tensors: not ours to cast
        d = _rand(3, 4, dtype=torch.float64).to(N)
        assert F.linear(d, d).dtype == torch.float64  # float64 is never cast
        assert d.exp().dtype == torch.float64
        i = torch.arange(6).to(N)
        assert i.sum().dtype == torch.int64


def test_promote_to_widest(seed):
    bf, f32 = _rand(5, 3, dtype=torch.bfloat16), _rand(5, 3)
    idx = torch.tensor([0, 3])
    cases = [
        (lambda a, b: torch.cat([a, b]), torch.float32),  # not listed: cat promotes natively
        (lambda a, b: torch.addcmul(a, a, b), torch.float32),
        (lambda a, b: torch.atan2(a, a), torch.bfloat16),
        (lambda a, b: torch.dot(a[:, 0], b[:, 0]), torch.float32),
        (lambda a, b: torch.index_put(a, (idx.to(a.device),), b[:2]), torch.float32),
        (lambda a, b: torch.scatter_add(a, 0, torch.zeros(2, 3, dtype=torch.long,
                                                          device=a.device), b[:2]),
         torch.float32),
    ]
    for i, (fn, dtype) in enumerate(cases):
        with torch.autocast("neuron", dtype=torch.bfloat16):
            out = fn(bf.to(N), f32.to(N))
        assert out.dtype == dtype, i
        assert_close(out, fn(bf.to(dtype), f32.to(dtype)), msg=f"case {i}")


def test_promote_rules_from_aten():
    """Tensor? args are cast but do not vote (bilinear's bias); a float16 tensor under
    bfloat16 autocast is ATen's 'Unexpected floating ScalarType' error."""
    a, w, bias = _rand(2, 3, dtype=torch.bfloat16), _rand(4, 3, 3, dtype=torch.bfloat16), _rand(4)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = F.bilinear(*_dev(a, a, w, bias))
        with pytest.raises(RuntimeError, match="Unexpected floating ScalarType"):
            torch.addcmul(*_dev(a, a, a.half()))
    assert out.dtype == torch.bfloat16
    assert_close(out, F.bilinear(a, a, w, bias.bfloat16()))
    # The neuron backend has no _trilinear kernel yet (bilinear's only CPU fallback).
    assert set(neuron_eager.get_fallback_ops()) <= {"aten::_trilinear"}
    neuron_eager.clear_op_tracking()


def test_unlisted_ops_and_forms_unchanged(seed):
    a, b = _rand(4, 4).to(N), _rand(4, 4).to(N)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert (a + b).dtype == torch.float32
        assert F.relu(a).dtype == torch.float32 and a.bfloat16().relu().dtype == torch.bfloat16
        out = torch.empty(4, 4, device=N)
        torch.mm(a, b, out=out)  # out= forms are not autocast
        assert_close(out, a.cpu() @ b.cpu(), rtol=1e-4, atol=1e-4)
        c = a.clone().addmm_(a, b)  # nor are in-place ones
        assert c.dtype == torch.float32
        assert_close(c, a.cpu() + a.cpu() @ b.cpu(), rtol=1e-4, atol=1e-4)


def test_nested_regions(seed):
    x, w = _rand(3, 4).to(N), _rand(5, 4).to(N)
    assert not torch.is_autocast_enabled("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("neuron")
        with torch.autocast("neuron", enabled=False):
            assert F.linear(x, w).dtype == torch.float32
            assert torch.softmax(x.bfloat16(), -1).dtype == torch.bfloat16
        with torch.autocast("neuron", dtype=torch.float16):
            assert F.linear(x, w).dtype == torch.float16
        with torch.autocast("cpu", dtype=torch.bfloat16):  # another device's region
            assert F.linear(x, w).dtype == torch.bfloat16
        assert F.linear(x, w).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):  # CPU autocast leaves neuron alone
        assert F.linear(x, w).dtype == torch.float32
    assert F.linear(x, w).dtype == torch.float32


def test_binary_cross_entropy_refused(seed):
    p, t = torch.rand(4, 3).to(N), torch.rand(4, 3).to(N)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        for call in (lambda: F.binary_cross_entropy(p, t), lambda: torch.nn.BCELoss()(p, t)):
            with pytest.raises(RuntimeError) as err:
                call()
            assert str(err.value).startswith(autocast.BCE_MESSAGE)
        with torch.autocast("neuron", enabled=False):
            assert F.binary_cross_entropy(p, t).dtype == torch.float32
    assert "binary_cross_entropy_with_logits" in autocast.BCE_MESSAGE


@pytest.mark.parametrize("dtype", LOW)
def test_mlp_training_step(dtype, seed):
    """Forward under autocast, backward outside, as the AMP recipe says. Reference: the
    CPU's own autocast (Linear in low precision too; its cross_entropy is all float32,
    where CUDA's and ours keep log_softmax in the input dtype, hence the tolerance)."""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    dev = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    dev.load_state_dict(cpu.state_dict())
    dev.to(N)
    x, y = _rand(6, 8), torch.randint(0, 4, (6,))
    opt = torch.optim.SGD(dev.parameters(), lr=0.1)
    with torch.autocast("cpu", dtype=dtype):
        cpu_loss = F.cross_entropy(cpu(x), y)
    cpu_loss.backward()
    with torch.autocast("neuron", dtype=dtype):
        hidden = dev[0](x.to(N))
        loss = F.cross_entropy(dev[2](dev[1](hidden)), y.to(N))
    assert hidden.dtype == dtype and loss.dtype == torch.float32
    loss.backward()
    assert_close(loss, cpu_loss, rtol=2e-2, atol=2e-2)
    for (name, p), q in zip(dev.named_parameters(), cpu.parameters()):
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name
        assert_close(p.grad, q.grad, rtol=2e-2, atol=2e-2, msg=name)
    before = dev[0].weight.detach().cpu()
    opt.step()
    assert dev[0].weight.dtype == torch.float32
    assert not torch.equal(dev[0].weight.detach().cpu(), before)


def test_bare_autocast_defaults_to_bf16():
    with torch.autocast("neuron"):
        y = torch.nn.functional.linear(torch.randn(2, 3, device="neuron"),
                                       torch.randn(4, 3, device="neuron"))
    assert y.dtype == torch.bfloat16


def _weight_cache_program(device, cache_enabled=True):
    """What a weight updated in place inside an autocast block is read as (Note [The
    autocast weight cache])."""
    w = torch.nn.Parameter(torch.ones(4, 4, device=device))
    x = torch.ones(2, 4, device=device)
    seen = []
    with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=cache_enabled):
        with torch.no_grad():
            seen.append(torch.mm(x, w))  # (a cast under no_grad is not kept)
        seen.append(torch.mm(x, w))
        with torch.no_grad():
            w.add_(1.0)
        with torch.autocast(device, dtype=torch.bfloat16):  # an inner block keeps it too
            seen.append(torch.mm(x, w))
        seen.append(torch.mm(x, w))
        seen.append(torch.mm(x, w[:2].t()))  # (a view is cast afresh)
    seen.append(torch.mm(x, w))  # (outside: float32)
    with torch.autocast(device, dtype=torch.bfloat16):  # a new block casts again
        seen.append(torch.mm(x, w))
    return [(t.detach().cpu(), t.requires_grad) for t in seen]


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_weights_are_cast_once_per_autocast_block_as_on_the_cpu(cache_enabled):
    want = _weight_cache_program("cpu", cache_enabled)
    got = _weight_cache_program("neuron", cache_enabled)
    for (g, g_grad), (w, w_grad) in zip(got, want):
        assert torch.equal(g, w) and g.dtype == w.dtype and g_grad == w_grad


def test_attention_fast_paths_run_in_the_lower_precision_as_on_the_cpu():
    # (they skip themselves under torch.is_autocast_enabled(), CUDA's: under
    # autocast("neuron") they ran, in float32)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    results = []
    for device in ("cpu", "neuron"):
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            out, weights = mha.to(device)(*[x.to(device)] * 3)
            results.append((out.cpu(), weights.cpu(), layer.to(device)(x.to(device)).cpu()))
    for got, want in zip(*results[::-1]):
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=0.03, atol=0.03)
