"""NeuronTensor behaviour a PyTorch user relies on, compared with the CPU."""
import copy
import io
import warnings

import pytest
import torch

import neuron_eager
from checks import check_op, without_kernel

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_and_conversions(dtype):
    src = (torch.randn(3, 5) * 10).to(dtype)
    x = src.to("neuron")
    assert x.device == torch.device("neuron", 0) and x.dtype == dtype
    assert torch.equal(x.cpu(), src)
    assert x.tolist() == src.tolist()
    assert x[1, 2].item() == src[1, 2].item()
    for target in [torch.float32, torch.bfloat16, torch.int32, torch.bool]:
        torch.testing.assert_close(x.to(target).cpu(), src.to(target), rtol=0, atol=0)


def test_16_bit_conversions_are_bit_exact_including_specials():
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-42,
                             65504.0, 65520.0, 70000.0, 3.0e-8, 6.0e-5, 1.0 + 2**-8,
                             1.0 + 3 * 2**-9, 3.4e38, -1.17e-38])
    values = torch.cat([specials, torch.randn(5000) * torch.logspace(-30, 30, 5000)])
    for dtype in (torch.bfloat16, torch.float16):
        got = values.to("neuron").to(dtype).cpu()
        want = values.to(dtype)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), dtype
        back = want.to("neuron").float().cpu()
        assert torch.equal(back.view(torch.int32), want.float().view(torch.int32)), dtype


def test_factories():
    dev = "neuron"
    assert torch.equal(torch.zeros(2, 3, device=dev).cpu(), torch.zeros(2, 3))
    assert torch.equal(torch.ones(4, dtype=torch.int32, device=dev).cpu(),
                       torch.ones(4, dtype=torch.int32))
    assert torch.equal(torch.full((2,), 7.5, device=dev).cpu(), torch.full((2,), 7.5))
    for args in [(5,), (2, 9), (0, 1, 0.1), (-3.0, 4.0, 0.5)]:
        assert torch.equal(torch.arange(*args, device=dev).cpu(), torch.arange(*args))
    for args in [(0, 1, 7), (-2, 5, 1), (3, -3, 100)]:
        assert torch.equal(torch.linspace(*args, device=dev).cpu(), torch.linspace(*args))
    assert torch.equal(torch.eye(3, 4, device=dev).cpu(), torch.eye(3, 4))
    neuron_eager.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (torch.range is deprecated)
        for args in [(0, 4), (0, 3, 0.1), (5, 1, -2)]:  # (its CPU fallback failed to grow out=)
            assert torch.equal(torch.range(*args, device=dev).cpu(), torch.range(*args))
        out = torch.empty(0, dtype=torch.long, device=dev)
        assert torch.equal(torch.range(1, 3, out=out).cpu(), torch.tensor([1, 2, 3]))
    for shape in [(3, 3), (2, 5), (5, 2)]:  # eye.m_out, on the device (no CPU fallback)
        w = torch.nn.init.eye_(torch.empty(shape, device=dev))
        assert torch.equal(w.cpu(), torch.eye(*shape))
    assert torch.equal(torch.eye(4, out=torch.empty(0, device=dev)).cpu(), torch.eye(4))
    assert neuron_eager.get_fallback_ops() == {}
    assert torch.equal(torch.tensor([[1, 2], [3, 4]], device=dev).cpu(),
                       torch.tensor([[1, 2], [3, 4]]))
    assert torch.empty(2, 3, device=dev).shape == (2, 3)
    x = torch.randn(3, 4, device=dev)
    for fn in [torch.zeros_like, torch.ones_like, torch.empty_like, torch.rand_like,
               torch.randn_like]:
        y = fn(x)
        assert y.device.type == "neuron" and y.shape == x.shape
    assert torch.equal(torch.full_like(x, 2).cpu(), torch.full((3, 4), 2.0))
    r = torch.randint(0, 5, (100,), device=dev).cpu()
    assert r.dtype == torch.int64 and 0 <= r.min() and r.max() < 5
    assert torch.rand(2, 2, device=dev).device.type == "neuron"
    with pytest.raises(RuntimeError):
        torch.arange(0, 10, -1, device=dev)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8,
                                   torch.uint8, torch.int16, torch.int32])
def test_linspace_gives_the_cpus_bits_and_refuses_what_it_refuses(dtype):
    # 16-bit outputs compute in 16 bits; bounds are converted to the dtype first (Note
    # [linspace as the CPU computes it])
    for args in [(-1, 1, 11), (-3, 7, 1001), (0.1, 0.7, 37), (5, -3, 200), (-5, 3, 4),
                 (0, 100, 3000), (-100.7, 99.3, 257), (-5.0, 3, 4), (0, 300, 4),
                 (0, 40000.0, 5), (0, 1e10, 4), (0, 70000.0, 3), (0, float("nan"), 3)]:
        try:
            want = torch.linspace(*args, dtype=dtype)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match=str(e)):
                torch.linspace(*args, dtype=dtype, device="neuron")
            continue
        got = torch.linspace(*args, dtype=dtype, device="neuron").cpu()
        assert torch.equal(got, want) or want.is_floating_point() and \
            torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()],
                                                                   want[~want.isnan()]), args


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kaiser_window_is_made_on_the_device(dtype):
    neuron_eager.clear_op_tracking()
    for length, periodic, beta in [(0, True, 12.0), (1, False, 3.0), (7, True, 12.0),
                                   (8, False, 5.0), (301, True, 0.5), (1000, False, 12.0)]:
        got = torch.kaiser_window(length, periodic, beta, dtype=dtype, device="neuron")
        assert got.device.type == "neuron"
        torch.testing.assert_close(got.cpu(), torch.kaiser_window(length, periodic, beta,
                                                                  dtype=dtype))
    assert neuron_eager.get_fallback_ops() == {}
    with pytest.raises(RuntimeError, match=r"expects floating point dtypes, got: "
                       r"TensorOptions\(dtype=int, device=neuron, layout=Strided \(default\), "
                       r"requires_grad=false \(default\), pinned_memory=false,"):
        torch.kaiser_window(5, dtype=torch.int32, device="neuron")


def test_repr_matches_pytorch_format():
    cases = [torch.tensor([1.5, -2.0]), torch.tensor([[1, 2], [3, 4]]),
             torch.tensor([0.25], dtype=torch.bfloat16), torch.tensor(3.0), torch.empty(0, 3),
             torch.tensor([True, False]), torch.arange(2000.0),
             torch.tensor([], dtype=torch.int64), torch.empty(0, 3, dtype=torch.int64),
             torch.tensor([], dtype=torch.bool), torch.empty(0, dtype=torch.bfloat16)]
    for t in cases:
        want = repr(t)[:-1] + ", device='neuron:0')"
        if "dtype=" in want or "size=" in want:
            head, _, tail = repr(t).rpartition(")")[0].partition(", ")
            want = f"{head}, device='neuron:0', {tail})" if tail else want
        assert repr(t.to("neuron")) == want
    p = torch.nn.Parameter(torch.ones(2).to("neuron"))
    assert repr(p) == ("Parameter containing:\n"
                       "tensor([1., 1.], device='neuron:0', requires_grad=True)")
    y = p * 2
    assert repr(y).endswith("grad_fn=<MulBackward0>)")
    assert f"{torch.tensor(1.23456).to('neuron'):.2f}" == "1.23"
    print(torch.randn(2, 3).to("neuron"))  # the user's first thing: must not raise

    class Marked(torch.Tensor):
        pass

    marked = torch.tensor([0.5, 2.0]).as_subclass(Marked)
    assert repr(marked.to("neuron").as_subclass(Marked)) == \
        repr(marked)[:-1] + ", device='neuron:0')"  # "Marked([...], device=...)"
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():  # forward-mode AD: the tangent is shown, as on the CPU
        primal, tangent = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.25])
        assert "tangent=" in repr(fwAD.make_dual(primal, tangent))
        want = f"{repr(primal)[:-1]}, device='neuron:0', tangent={repr(tangent)[:-1]}, " \
               f"device='neuron:0'))"
        got = repr(fwAD.make_dual(primal.to("neuron"), tangent.to("neuron")))
        assert " ".join(got.split()) == " ".join(want.split())  # (wrapped at other widths)


def test_numpy_refuses_like_cuda():
    x = torch.ones(2).to("neuron")
    with pytest.raises(TypeError, match=r"Use Tensor.cpu\(\)"):
        x.numpy()
    assert x.cpu().numpy().tolist() == [1.0, 1.0]


def test_dlpack_export_refuses_clearly():
    # (torch's export gave a capsule of an unreadable pointer, and a broken tensor back)
    x = torch.arange(6.0).to("neuron")
    for export in (lambda: x.__dlpack__(), lambda: torch.from_dlpack(x),
                   lambda: torch.utils.dlpack.to_dlpack(x)):
        with pytest.raises(BufferError, match=r"DLPack.*Tensor.cpu\(\)"):
            export()
    assert torch.equal(torch.from_dlpack(x.cpu()), torch.arange(6.0))  # the way it says


def test_views_alias_their_base():
    base = torch.zeros(4, 6).to("neuron")
    v1, v2 = base[1], base.t()[2:4]
    v1.fill_(1.0)
    v2.add_(5.0)
    expect = torch.zeros(4, 6)
    expect[1] = 1.0
    expect.t()[2:4] += 5.0
    assert torch.equal(base.cpu(), expect)
    flat = base.view(-1)
    flat[0] = 9.0
    assert base[0, 0].item() == 9.0
    a, b = base.unbind(0)[:2]
    assert a.untyped_storage is not None and b[2].item() == expect[1, 2]
    assert base.expand(2, 4, 6).shape == (2, 4, 6)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        base.t().view(-1)


def test_views_know_their_contiguity_before_their_data_is_read():
    # views make their NumPy array on first use; the C-contiguity they carry until then must be
    # NumPy's own flag (which the elementwise fast path relies on)
    import numpy as np

    from neuron_eager.ops import tensor as T

    base = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    x = base.to("neuron")
    views = [lambda t: t.view(-1), lambda t: t.t() if t.dim() == 2 else t.transpose(0, 1),
             lambda t: t[:, 1:2], lambda t: t[..., ::2], lambda t: t.unsqueeze(1),
             lambda t: t.expand(3, *t.shape), lambda t: t[:0], lambda t: t.select(3, 0),
             lambda t: t.permute(3, 2, 1, 0), lambda t: t.detach(), lambda t: t[1:, :, :1]]
    for view in views:
        v = view(x)
        flag = v._key is not None
        nd = T.nd_view(v._storage, v.shape, v.stride(), v.storage_offset(), v.dtype)
        assert flag == nd.flags.c_contiguous, (v.shape, v.stride())
        assert np.array_equal(v._nd, nd)
        assert torch.equal(v.cpu(), view(base))
    for shape, stride in [((1, 4), (99, 1)), ((4, 1), (1, 7)), ((2, 0, 3), (5, 5, 5)), ((), ()),
                          ((3, 2), (1, 3)), ((2, 3), (3, 1))]:
        arr = np.lib.stride_tricks.as_strided(np.zeros(64, np.float32), shape,
                                              [4 * st for st in stride])
        assert T.c_contiguous(shape, stride) == arr.flags.c_contiguous, (shape, stride)


def test_inplace_metadata_ops():
    check_op(lambda x: x.clone().t_() + 1, torch.randn(3, 4))
    check_op(lambda x: x.clone().unsqueeze_(0).squeeze_(0).transpose_(0, 1), torch.randn(3, 4))
    x = torch.arange(6.0).to("neuron")
    x.resize_(2, 3)
    assert x.shape == (2, 3) and x.cpu().tolist() == [[0, 1, 2], [3, 4, 5]]
    x.resize_(4, 4)
    assert x.shape == (4, 4) and x.flatten()[:6].cpu().tolist() == [0, 1, 2, 3, 4, 5]


def test_parameters_state_dict_save_load_deepcopy():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to("neuron")
    for p in model.parameters():
        assert isinstance(p, torch.nn.Parameter) and p.device.type == "neuron"
    sd = model.state_dict()
    assert all(v.device.type == "neuron" for v in sd.values())
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf)  # weights_only=True, the default
    for k in sd:
        assert loaded[k].device.type == "neuron" and torch.equal(loaded[k].cpu(), sd[k].cpu())
    twin = torch.nn.Linear(4, 3)
    twin.load_state_dict({k: v.cpu() for k, v in sd.items()})
    clone = copy.deepcopy(model)
    for a, b in zip(clone.parameters(), model.parameters()):
        assert isinstance(a, torch.nn.Parameter) and a.device.type == "neuron"
        assert torch.equal(a.cpu(), b.cpu())
        a.data.add_(1.0)
        assert not torch.equal(a.cpu(), b.cpu())
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    whole = torch.load(buf, weights_only=False)
    assert isinstance(whole.weight, torch.nn.Parameter) and whole.weight.device.type == "neuron"
    fresh = torch.nn.Linear(4, 3).to("neuron")
    fresh.load_state_dict(sd)
    assert torch.equal(fresh.weight.cpu(), model.weight.cpu())


def test_autograd_basics():
    check_op(lambda x, y: x * y + x, torch.randn(3, requires_grad=True),
             torch.randn(3, requires_grad=True), grad=True)
    x = torch.randn(3).to("neuron").requires_grad_()
    (x * 3).backward(torch.ones(3).to("neuron"))
    assert x.grad.device.type == "neuron"
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 3.0))
    cpu = torch.randn(3, requires_grad=True)
    moved = cpu.to("neuron")
    (moved * 2).backward(torch.ones(3).to("neuron"))
    assert cpu.grad is not None and torch.equal(cpu.grad, torch.full((3,), 2.0))


def test_mixing_devices_raises_like_cuda():
    x = torch.ones(3).to("neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3) * x
    assert torch.equal((x + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))  # CPU scalars mix
    # index_put_'s values too (CUDA's TensorIterator): CPU indices and 0-dim values mix
    for index in (torch.tensor([0, 2]), torch.tensor([True, False, True])):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            x[index] = torch.ones(2)
    x[torch.tensor([0, 2])] = torch.tensor(5.0)
    assert x.cpu().tolist() == [5.0, 1.0, 5.0]


def test_unsupported_layouts_and_dtypes_are_refused_clearly():
    with pytest.raises(NotImplementedError, match="sparse tensors are not supported on neuron"):
        torch.eye(3).to_sparse().to("neuron")
    with pytest.raises(NotImplementedError, match="sparse tensors are not supported on neuron"):
        torch.eye(3).to_sparse_csr().to("neuron")
    # sparse gradients: refused at the lookup (in backward, autograd's engine aborted)
    idx = torch.tensor([1, 2], device="neuron")
    with pytest.raises(NotImplementedError, match=r"Embedding\(sparse=True\).*sparse=False"):
        torch.nn.Embedding(10, 4, sparse=True).to("neuron")(idx)
    with pytest.raises(NotImplementedError, match=r"EmbeddingBag\(sparse=True\)"):
        torch.nn.EmbeddingBag(10, 4, sparse=True).to("neuron")(idx.view(1, 2))
    with torch.no_grad():  # no gradient, nothing sparse: it runs
        assert torch.nn.Embedding(10, 4, sparse=True).to("neuron")(idx).shape == (2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(NotImplementedError, match="nested tensors are not supported on neuron"):
        nested.to("neuron")
    with pytest.raises(RuntimeError, match="complex"):
        torch.ones(2, dtype=torch.complex64).to("neuron")
    with pytest.raises(RuntimeError, match="complex"):
        torch.zeros(2, dtype=torch.complex64, device="neuron")
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):  # the dtypes it holds, a way out
        with pytest.raises(RuntimeError, match=r"neuron tensors hold float32, .*bfloat16, .*"
                                               r"Keep float8_\w+ tensors on the CPU"):
            torch.ones(2).to(fp8).to("neuron")
    x = torch.ones(3, device="neuron")
    for complex_op in (lambda: x * 1j, lambda: 1j + x, lambda: x * torch.tensor(1j),
                       lambda: x ** 1j,  # (a TypeError there became "unsupported operand")
                       lambda: x == (1 + 0j), lambda: x != 1j,  # (were Python bools)
                       lambda: torch.ones(4, device="neuron").view(torch.cfloat)):  # (KeyError)
        with pytest.raises(RuntimeError, match="Trainium has no complex dtypes"):
            complex_op()
    # an op that makes complex results from real ones names itself, and nothing falls back
    before = neuron_eager.get_fallback_ops()
    with pytest.raises(RuntimeError, match=r"aten::_fft_r2c returns torch.complex64"):
        torch.fft.rfft(torch.ones(8, device="neuron"))
    assert neuron_eager.get_fallback_ops() == before


def test_float64_warns_once_and_computes_in_float32():
    neuron_eager.ops.copy._float64_warned = False
    with pytest.warns(UserWarning, match="float64 on neuron"):
        x = torch.tensor([1.0, 1e-10], dtype=torch.float64).to("neuron")
    y = (x + 1.0).cpu()
    assert y.dtype == torch.float64
    assert y[1].item() == 1.0  # 1 + 1e-10 rounds to 1 in float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.ones(2, dtype=torch.float64).to("neuron")  # once only


def test_grad_scaler_does_not_warn_of_float64():
    # unscale_ takes 1/scale through float64 on every device; the user asked for no float64
    neuron_eager.ops.copy._float64_warned = False
    m = torch.nn.Linear(4, 2).to("neuron")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("neuron"):
            loss = m(torch.randn(3, 4, device="neuron")).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    with pytest.warns(UserWarning, match="float64 on neuron"):  # still told of its own
        torch.ones(2, dtype=torch.float64, device="neuron")


def test_float32_linalg_does_not_warn_of_its_own_float64_tolerances():
    # matrix_rank and pinv make float64 tolerance tensors in C++ for a float32 input
    neuron_eager.ops.copy._float64_warned = False
    a = torch.randn(5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.linalg.matrix_rank(a.to("neuron")).item() == torch.linalg.matrix_rank(a)
        torch.testing.assert_close(torch.linalg.pinv(a.to("neuron"), rtol=0.1).cpu(),
                                   torch.linalg.pinv(a, rtol=0.1))
    with pytest.warns(UserWarning, match="float64 on neuron"):  # still told of its own
        torch.linalg.matrix_rank(a.double().to("neuron"))


def test_batch_norm_of_an_empty_batch_does_not_warn_of_float64():
    # torch makes its statistics in float64 on any device but CUDA; the user has none
    neuron_eager.ops.copy._float64_warned = False
    x = torch.randn(0, 3, 5, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = torch.nn.functional.batch_norm(x.to("neuron"), None, None, training=True)
    assert y.dtype == torch.float32 and y.shape == x.shape
    with pytest.warns(UserWarning, match="float64 on neuron"):  # still told of its own
        torch.nn.functional.batch_norm(x.double().to("neuron"), None, None, training=True)


def test_moving_a_model_keeps_its_parameters_hooks_and_attributes():
    # .to() keeps each Parameter object (Note in ops/_compat.py); what the user put on it
    # (hooks, flags read to build parameter groups) must stay on it, in both directions
    lin = torch.nn.Linear(3, 1)
    handle = lin.weight.register_hook(lambda g: g * 0)
    lin.weight._no_weight_decay = True
    accumulated = []
    lin.weight.register_post_accumulate_grad_hook(lambda p: accumulated.append(p.grad.sum()))
    lin.to("neuron")
    lin(torch.ones(2, 3, device="neuron")).sum().backward()
    assert torch.equal(lin.weight.grad.cpu(), torch.zeros(1, 3))
    assert lin.weight._no_weight_decay and len(accumulated) == 1
    handle.remove()
    lin.to("cpu")
    lin.weight.grad = None
    lin(torch.ones(2, 3)).sum().backward()
    assert torch.equal(lin.weight.grad, torch.full((1, 3), 2.0))
    assert lin.weight._no_weight_decay and len(accumulated) == 2
    assert "_storage" not in lin.weight.__dict__


def test_bare_storages_raise_instead_of_crashing():
    # Note [No bare neuron storages]: these crashed the process (no C++ allocator)
    for make in (lambda: torch.UntypedStorage(12, device="neuron"),
                 lambda: torch.ones(3, device="neuron").untyped_storage().clone()):
        with pytest.raises(RuntimeError, match="cannot be made on its own"):
            make()
    assert torch.UntypedStorage(12).nbytes() == 12  # the CPU's are untouched
    assert torch.ones(3).untyped_storage().clone().nbytes() == 12


def test_int64_is_computed_in_32_bits():
    x = torch.tensor([2**31 - 1, 5]).to("neuron")
    y = (x + 1).cpu()
    assert y.dtype == torch.int64
    assert y.tolist() == [-(2**31), 6]  # wraps like int32, as on Trainium


@without_kernel(torch.ops.aten.special_i0e.default)
def test_fallback_warns_counts_and_can_be_switched_off():
    op = torch.ops.aten.special_i0e.default
    x = torch.rand(4) + 0.5
    neuron_eager.clear_op_tracking()
    with pytest.warns(UserWarning, match=r"Operator 'aten::special_i0e' fell back to CPU"):
        y = op(x.to("neuron"))
    assert y.device.type == "neuron"
    torch.testing.assert_close(y.cpu(), op(x))
    assert neuron_eager.get_fallback_ops() == {"aten::special_i0e": 1}
    neuron_eager.config.cpu_fallback = False
    before = x.to("neuron")
    with pytest.raises(NotImplementedError, match="aten::special_i0e.*NEURON_EAGER_CPU_FALLBACK"):
        op(before)
    assert torch.equal(before.cpu(), x)


@without_kernel(torch.ops.aten.special_i0e.default)
def test_fallback_inplace_writes_reach_the_device():
    op = torch.ops.aten.special_i0e.out
    x = torch.rand(4) + 0.5
    out = torch.zeros(4).to("neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = op(x.to("neuron"), out=out)
        shrunk = op(x.to("neuron"), out=torch.zeros(2, 3).to("neuron"))
    assert r is out
    torch.testing.assert_close(out.cpu(), torch.special.i0e(x))
    assert shrunk.shape == (4,)  # (the CPU resized its alias: the device tensor too)
    torch.testing.assert_close(shrunk.cpu(), torch.special.i0e(x))
    assert "aten::special_i0e.out" in neuron_eager.get_fallback_ops() or \
        "aten::special_i0e" in neuron_eager.get_fallback_ops()


def test_fallback_op_that_resizes_the_buffers_it_updates():
    """A fused fake-quantizer (QAT's default per-channel weight observer) has no neuron
    kernel; its CPU kernel updates the observer's running range and the scale in place and
    grows them from shape (0,)/(1,) to one per channel, which memory aliasing the device
    cannot do: the CPU run gets copies, written back."""
    import torch.ao.quantization as Q

    w = torch.randn(6, 4)
    quantizers, outputs = [], []
    for device in ("cpu", "neuron"):
        fq = Q.get_default_qat_qconfig("fbgemm").weight().to(device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outputs += [fq(w.to(device)), fq(w.to(device) * 2)]
        quantizers.append(fq)
    for want, got in zip(outputs[:2], outputs[2:]):
        assert torch.equal(got.cpu(), want)
    for (name, want), (_, got) in zip(*[fq.named_buffers() for fq in quantizers]):
        assert got.device.type == "neuron" and got.shape == want.shape, name
        assert torch.equal(got.cpu(), want), name


def test_optimizers_take_their_foreach_path():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [torch.nn.Parameter(torch.ones(3).to("neuron"))]
    fused, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    assert foreach and not fused
    params[0].grad = torch.ones(3).to("neuron")
    neuron_eager.clear_op_tracking()
    torch.optim.AdamW(params, lr=0.1).step()
    assert any(name.startswith("aten::_foreach_") for name in neuron_eager.get_executed_ops())


def test_view_scatter_ops():
    x, src = torch.randn(4, 5), torch.randn(5)
    check_op(lambda a, s: torch.select_scatter(a, s, 0, 2), x, src)
    check_op(lambda a, s: torch.slice_scatter(a, s, 1, 1, 5, 2), x, torch.randn(4, 2))
    check_op(lambda a, s: torch.diagonal_scatter(a, s), x, torch.randn(4))
    check_op(lambda a, s: torch.as_strided_scatter(a, s, (2, 2), (5, 1), 3), x,
             torch.randn(2, 2))


def test_index_factories():
    for args in [(4, 4), (3, 5, 1), (5, 3, -2), (0, 3)]:
        for fn in (torch.tril_indices, torch.triu_indices):
            assert torch.equal(fn(*args, device="neuron").cpu(), fn(*args))
    assert torch.tril_indices(3, 3, dtype=torch.int32, device="neuron").dtype == torch.int32


def test_int64_outside_int32_warns_where_it_reaches_the_device():
    numerics = neuron_eager.ops.numerics  # (the flag lives there)
    numerics.int64_warned = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # values that fit: no warning
        small = torch.tensor([5, -7]).to("neuron") + 1
        torch.arange(10, device="neuron")
        torch.randint(-2 ** 31, 2 ** 31, (1000,), device="neuron")  # the whole int32 range
    assert small.cpu().tolist() == [6, -6]
    for make in (lambda: torch.tensor([2 ** 40]).to("neuron"),
                 lambda: torch.zeros(1, dtype=torch.int64, device="neuron").copy_(
                     torch.tensor([-2 ** 33])),
                 lambda: torch.arange(2 ** 33, 2 ** 33 + 4, device="neuron"),
                 lambda: torch.full((2,), 2 ** 40, device="neuron"),
                 # drawn on the device
                 lambda: torch.randint(2 ** 33, 2 ** 34, (4,), device="neuron"),
                 lambda: torch.empty(8, dtype=torch.int64, device="neuron").random_(),
                 lambda: torch.linspace(0, 2 ** 40, 3, dtype=torch.long, device="neuron"),
                 # Python scalars stored by kernels
                 lambda: torch.zeros(2, dtype=torch.long, device="neuron").index_fill(
                     0, torch.tensor([0], device="neuron"), 2 ** 40),
                 lambda: torch.zeros(2, dtype=torch.long, device="neuron").scatter(
                     0, torch.tensor([0], device="neuron"), 2 ** 40),
                 # a Python scalar becomes a 0-dim neuron tensor (scalar_tensor) first
                 lambda: torch.where(torch.tensor(True, device="neuron"), 2 ** 40, 0)):
        numerics.int64_warned = False
        with pytest.warns(UserWarning, match="int64 values outside the int32 range"):
            stored = make()
        if stored.numel() == 1 and stored.dim():
            assert stored.cpu().item() in (2 ** 40, -2 ** 33)  # host copies keep them
    numerics.int64_warned = False
    with pytest.warns(UserWarning, match="floats beyond it convert to -2147483648"):
        big = torch.tensor([3e9], device="neuron").long()  # converted in int32, as computed
    assert big.item() == -2 ** 31
    numerics.int64_warned = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inf and NaN have no integer value anywhere: no warning
        torch.tensor([0.0, 5.0], device="neuron").log().long()
        torch.tensor([float("nan"), float("inf")], device="neuron").long()


def test_views_inside_inference_mode_are_what_the_cpu_gives():
    for device in ("cpu", "neuron"):
        w = torch.arange(24.0).reshape(6, 4).to(device)
        with torch.inference_mode():
            views = [w[1:3], w.t(), w.view(24), w.detach(), *w.chunk(2), *w.unbind(1)]
            assert not any(v.is_inference() for v in views)  # views of a normal tensor
            fresh = torch.ones(3, device=device)
            assert fresh.is_inference() and fresh[1:].is_inference()
            assert w[1:3].sum().item() == 60.0


def test_reshape_and_to_reaching_the_dispatcher_alias_as_on_the_cpu():
    # inside inference mode (as inside kernels) reshape and to(dtype) skip autograd's
    # decomposition and reach our kernels: views where the layout allows, copies elsewhere
    for device in ("cpu", "neuron"):
        w = torch.arange(24.0).reshape(6, 4).to(device)
        with torch.inference_mode():
            flat, copied = w.reshape(24), w.t().reshape(24)
            same, wider = w.to(torch.float32), w.to(torch.float64 if device == "cpu" else
                                                   torch.bfloat16)
            assert flat.data_ptr() == w.data_ptr() and copied.data_ptr() != w.data_ptr()
            assert same is w and wider.data_ptr() != w.data_ptr()
            assert copied.tolist() == w.cpu().t().reshape(24).tolist()
            assert w[1:].reshape(2, 10).tolist() == w.cpu()[1:].reshape(2, 10).tolist()
            with pytest.raises(RuntimeError, match="invalid for input of size 24"):
                w.t().reshape(5, 5)


def test_data_ptr_tells_aliases_apart_as_on_the_cpu():
    for device in ("cpu", "neuron"):
        a, b = torch.ones(6, device=device), torch.ones(6, device=device)
        v = a.view(2, 3)[1, 1:]
        assert a.data_ptr() != b.data_ptr() and a.data_ptr() != 0
        assert v.data_ptr() - a.data_ptr() == 4 * a.element_size()
        assert a.detach().data_ptr() == a.data_ptr()


def test_torch_compile_runs_neuron_models_with_eager_results():
    # Dynamo stays out of the simulator (Note [torch.compile] in ops/tensor.py)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    expected = model(x)
    model.to("neuron")
    compiled = torch.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo's notes on the graph breaks
        out = compiled(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    assert model[0].weight.grad is not None and neuron_eager.get_fallback_ops() == {}


def test_torch_compile_backend_neuron_is_found_by_name():
    # neuron_eager/compile.py, through the torch_dynamo_backends entry point: transformers
    # asks for it by name (generate with a static cache on a neuron model)
    assert "neuron" in torch._dynamo.list_backends()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model(x)
    model.to("neuron")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo's notes on the graph breaks
        out = compiled(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-6)


def test_torch_compile_runs_a_gpt_with_factories_on_the_device():
    # Note [Compiled graphs on neuron]: `torch.arange(T, device=idx.device)` alone in a graph
    # runs through the device, and Dynamo stays out of the factories' kernels (a fresh
    # process traced into Numba before); in both modes, with eager's results
    from neuron_eager import adaptive, workloads

    torch.manual_seed(0)
    model = workloads.GPT(vocab=50, block_size=8, n_layer=1, n_head=2, n_embd=16)
    idx = torch.randint(0, 50, (2, 8))
    expected = model(idx, idx)
    model.to("neuron")
    for on in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with warnings.catch_warnings(), adaptive.adaptive_eager(on):
            warnings.simplefilter("ignore")  # Dynamo's notes on the graph breaks
            loss = compiled(idx.to("neuron"), idx.to("neuron"))
            torch.testing.assert_close(loss.cpu(), expected, rtol=1e-5, atol=1e-5)
            assert torch.equal(torch.compile(lambda x: torch.arange(x.shape[1], device=x.device))(
                idx.to("neuron")).cpu(), torch.arange(8))
    assert neuron_eager.get_fallback_ops() == {}


@torch.compile
def _rows_of_x_as_many_as_y_doubled(x, y):
    return x[: y.shape[0]] * 2


def test_torch_compile_slicing_by_another_tensors_shape_under_adaptive_eager():
    # Dynamo's resumed code for this (module-level) function holds a slice constant, which
    # made its code object unhashable in the source-line lookup (ops/sourceline.user_frame)
    from neuron_eager import adaptive

    with warnings.catch_warnings(), adaptive.adaptive_eager():
        warnings.simplefilter("ignore")
        got = _rows_of_x_as_many_as_y_doubled(torch.ones(4, 5, device="neuron") + 0,
                                              torch.ones(4, 5, device="neuron"))
        assert torch.equal(got.cpu(), torch.full((4, 5), 2.0))


def test_clone_and_empty_like_lay_out_memory_like_aten():
    # preserve_format keeps a dense layout (any dim order); an expanded or overlapping one is
    # made dense in its stride order, so `.view(-1)` works where it works on the CPU
    x = torch.arange(4.0).view(1, 4)
    y = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    cases = [(x, lambda t: t.expand(3, 4)), (x, lambda t: t.t()), (x, lambda t: t[:, ::2]),
             (x, lambda t: t.reshape(-1).unfold(0, 3, 1)), (y, lambda t: t[:, :, ::2]),
             (y, lambda t: t[:, 1:]),
             (y, lambda t: t.permute(2, 0, 3, 1)[:, :1].expand(4, 5, 5, 3))]
    for base, make in cases:
        cpu, dev = make(base), make(base.to("neuron"))
        for fn in (lambda t: t.clone(), torch.empty_like):
            assert fn(dev).stride() == fn(cpu).stride(), (cpu.shape, cpu.stride())
        assert torch.equal(dev.clone().cpu(), cpu.clone())
    assert torch.equal(x.to("neuron").expand(3, 4).clone().view(-1).cpu(),
                       x.expand(3, 4).clone().view(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int64,
                                   torch.uint8, torch.bool])
def test_empty_tensors_are_filled_in_deterministic_mode(dtype):
    # torch.utils.deterministic.fill_uninitialized_memory (on by default): NaN or the
    # dtype's largest value, as the CPU fills them, so stale memory never shows
    makers = [lambda d: torch.empty(3, 2, dtype=dtype, device=d),
              lambda d: torch.empty_strided((3, 2), (1, 3), dtype=dtype, device=d),
              lambda d: torch.empty_like(torch.ones(3, 2, dtype=dtype, device=d)),
              lambda d: torch.ones(1, dtype=dtype, device=d).new_empty((3, 2))]
    torch.ones(64, device="neuron").mul(7)  # (memory to reuse: no longer zeros)
    torch.use_deterministic_algorithms(True)
    try:
        for make in makers:
            got, want = make("neuron").cpu(), make("cpu")
            assert torch.equal(got.isnan(), want.isnan()) if dtype.is_floating_point else \
                torch.equal(got, want)
    finally:
        torch.use_deterministic_algorithms(False)


def test_copy_from_a_python_number():
    for value, dtype in [(2, torch.float32), (2.7, torch.int32), (True, torch.bfloat16)]:
        dev = torch.zeros(2, 3, dtype=dtype, device="neuron").t()
        cpu = torch.zeros(2, 3, dtype=dtype).t()
        assert torch.equal(dev.copy_(value).cpu(), cpu.copy_(value))


LAYOUT_PROGRAMS = [
    lambda x, cl: x.t() * 2, lambda x, cl: x.t() + x.t(), lambda x, cl: x.t() - x.t()[:, :1],
    lambda x, cl: torch.ones(4, 1, device=x.device) + x.t(), lambda x, cl: cl + 1,
    lambda x, cl: torch.relu(cl) * cl.contiguous(), lambda x, cl: torch.where(cl > 0, cl, 0.0),
    lambda x, cl: (x.t() * 2).t().view(-1), lambda x, cl: x.t().float().half(),
    lambda x, cl: cl.permute(0, 2, 3, 1).sigmoid(), lambda x, cl: x[:, ::2].t().exp(),
    lambda x, cl: cl.masked_fill(cl > 0.5, -1.0) * 2, lambda x, cl: cl.clamp(-0.5, 0.5) + 1,
    lambda x, cl: (cl ** 2).sum(1), lambda x, cl: (x.t() * 3).sum(-1, keepdim=True) + x.t(),
]


@pytest.mark.parametrize("adaptive_on", [False, True])
@pytest.mark.parametrize("k", range(len(LAYOUT_PROGRAMS)))
def test_elementwise_results_are_laid_out_as_on_cpu(k, adaptive_on):
    """TensorIterator's output layout (Note [Output layout]): transposed and channels-last
    operands give results in their dim order, in both modes, with the same values."""
    x = torch.randn(3, 4)
    cl = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    expected = LAYOUT_PROGRAMS[k](x, cl)
    with neuron_eager.adaptive.adaptive_eager(adaptive_on):
        for _ in range(3):  # (adaptive eager: op by op, then compiled, then cached)
            out = LAYOUT_PROGRAMS[k](x.to("neuron"), cl.to("neuron"))
            assert out.stride() == expected.stride()
            torch.testing.assert_close(out.cpu(), expected, rtol=1e-6, atol=1e-6)


def test_storage_of_a_neuron_tensor_copies_to_the_host():
    x = torch.arange(6.0, device="neuron")
    host = x.untyped_storage().cpu()
    assert host.device.type == "cpu" and host.nbytes() == 24
    assert torch.equal(torch.empty(0).set_(host, 0, (6,), (1,)), torch.arange(6.0))


def test_forward_mode_ad_runs_on_the_device():
    # jacfwd/jvp make zero tangents with _new_zeros_with_same_feature_meta: other's layout
    # over zeroed memory, batch slices end to end, as PyTorch lays it out
    base, b = torch.randn(3, 4), torch.randn(5, 2, 3)
    for k in (0, 1, 2):
        expected = torch.ops.aten._new_zeros_with_same_feature_meta(b, base[:, 1:],
                                                                    self_num_batch_dims=k)
        got = torch.ops.aten._new_zeros_with_same_feature_meta(
            b.to("neuron"), base.to("neuron")[:, 1:], self_num_batch_dims=k)
        assert (got.shape, got.stride(), got.storage_offset()) == \
            (expected.shape, expected.stride(), expected.storage_offset())
        assert torch.equal(got.cpu(), expected)
    neuron_eager.clear_op_tracking()
    x, w = torch.randn(4), torch.randn(3, 4)
    jac = torch.func.jacfwd(lambda x: torch.tanh(w.to("neuron") @ x))(x.to("neuron"))
    torch.testing.assert_close(jac.cpu(), torch.func.jacfwd(lambda x: torch.tanh(w @ x))(x),
                               rtol=1e-5, atol=1e-6)
    assert neuron_eager.get_fallback_ops() == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_large_transposed_copies_are_the_cpus(dtype):
    # tiled copies (Note [Tiled transposes] in ops/transpose.py): edges that are not whole
    # tiles, strided rows, and a transposed slice of a bigger matrix
    x = (torch.randn(300, 517) * 100).to(dtype)
    for view in (lambda t: t.t(), lambda t: t[:, ::2].t(), lambda t: t[10:290, 5:].t(),
                 lambda t: t.reshape(3, 100, 517).transpose(1, 2)):
        got = view(x.to("neuron")).contiguous()
        assert got.is_contiguous() and torch.equal(got.cpu(), view(x).contiguous())
        assert torch.equal(view(x.to("neuron")).clone().cpu(), view(x).clone())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_large_strided_copies_are_the_cpus(dtype):
    # run by run (Note [Strided copies] in ops/transpose.py): head transposes, slices, an
    # expanded dim, a reversed permutation and runs that are not unit-stride
    x = (torch.randn(8, 64, 12, 40) * 100).to(dtype)
    for view in (lambda t: t.permute(0, 2, 1, 3), lambda t: t[:, ::2], lambda t: t[..., 1:],
                 lambda t: t.permute(3, 1, 2, 0), lambda t: t.expand(2, 8, 64, 12, 40),
                 lambda t: t.permute(2, 0, 3, 1)[::3]):
        got = view(x.to("neuron")).contiguous()
        assert got.is_contiguous() and torch.equal(got.cpu(), view(x).contiguous())


def test_functional_forms_of_in_place_ops_run_on_the_device():
    """What functionalization, export and TorchScript call: they fell back to the CPU."""
    aten = torch.ops.aten
    x = torch.randn(2, 3, 5, 6)
    src = torch.randn(1)  # (broadcasts to every layout's shape)
    w, b, wt = torch.randn(4, 3, 3, 3), torch.randn(4), torch.randn(3, 2, 3, 3)
    layouts = [lambda t: t, lambda t: t.contiguous(memory_format=torch.channels_last),
               lambda t: t.transpose(1, 3), lambda t: t[:, :, ::2],
               lambda t: t[:, :1].expand(2, 3, 5, 6)]  # (made where the tensor is)
    cases = [
        lambda d, t: aten.copy.default(t(d(x)), d(src)),
        lambda d, t: aten.zero.default(t(d(x))),
        lambda d, t: aten.lift_fresh_copy.default(t(d(x))),
        lambda d, t: aten._reshape_copy.default(t(d(x)), [6, -1]),
        lambda d, t: aten._convolution.default(d(x), d(w), d(b), [1, 1], [1, 1], [1, 1], False,
                                               [0, 0], 1, False, False, True, True),
        lambda d, t: aten._convolution.default(d(x), d(wt), None, [2, 2], [1, 1], [1, 1], True,
                                               [1, 1], 1, False, False, True, True),
    ]
    neuron_eager.clear_op_tracking()
    for case in cases:
        for t in layouts:
            want = case(lambda v: v, t)
            got = case(lambda v: v.to("neuron"), t)
            assert got.shape == want.shape and got.stride() == want.stride()
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert neuron_eager.get_fallback_ops() == {}
