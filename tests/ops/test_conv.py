import pytest
import torch
import torch.nn.functional as F

from checks import check_op
from neuron_eager.device_sim import core

FLOATS = [torch.float32, torch.bfloat16]
# Sums run in another order than the CPU's; bf16 keeps check_op's default tolerance.
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


def _rand(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape).to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cfg", [
    dict(),
    dict(stride=2, padding=1, groups=2),
    dict(stride=(1, 2), padding=(2, 1), dilation=(2, 1)),
    dict(padding="same", groups=4),  # depthwise
])
def test_conv2d(dtype, cfg, seed):
    groups = cfg.get("groups", 1)
    x, w = _rand(2, 4, 9, 8, dtype=dtype), _rand(8, 4 // groups, 3, 3, dtype=dtype)
    b = _rand(8, dtype=dtype)
    check_op(lambda x, w, b: F.conv2d(x, w, b, **cfg), x, w, b, grad=True, **TOL[dtype],
             fp32_reference=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cfg", [
    dict(k=3, padding=1),
    dict(k=7, padding=3),  # ConvNeXt's
    dict(k=(3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
    dict(k=3, stride=3, padding=5, dilation=2),
    dict(k=13, padding=6),  # 169 taps: two PSUM chunks
])
def test_depthwise_conv2d(dtype, cfg, seed):
    # Note [Depthwise convolution]: forward, image and weight gradients by their own kernels
    cfg = dict(cfg)
    k = cfg.pop("k")
    k = (k, k) if isinstance(k, int) else k
    x, w, b = _rand(3, 6, 15, 17, dtype=dtype), _rand(6, 1, *k, dtype=dtype), _rand(6, dtype=dtype)
    check_op(lambda x, w, b: F.conv2d(x, w, b, groups=6, **cfg), x, w, b, grad=True,
             **TOL[dtype], fp32_reference=True)


def test_depthwise_conv_layouts_1d_transposed_and_large(seed):
    x = torch.randn(2, 8, 9, 9).to(memory_format=torch.channels_last).requires_grad_(True)
    check_op(lambda x, w: F.conv2d(x, w, padding=1, groups=8), x, _rand(8, 1, 3, 3), grad=True,
             **TOL[torch.float32])
    check_op(lambda x, w, b: F.conv1d(x, w, b, padding=2, groups=5), _rand(3, 5, 20),
             _rand(5, 1, 5), _rand(5), grad=True, **TOL[torch.float32])
    check_op(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1,
                                                groups=4), _rand(2, 4, 5, 6), _rand(4, 1, 3, 3),
             _rand(4), grad=True, **TOL[torch.float32])
    # enough rows to run a share per core
    check_op(lambda x, w: F.conv2d(x, w, padding=3, groups=32), _rand(4, 32, 48, 48),
             _rand(32, 1, 7, 7), grad=True, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", FLOATS)
def test_conv2d_long_contraction_no_bias(dtype, seed):
    # K = C*kh*kw = 300: three PSUM chunks, the last one partial
    x, w = _rand(2, 75, 5, 5, dtype=dtype), _rand(3, 75, 2, 2, dtype=dtype)
    check_op(F.conv2d, x, w, grad=True, **TOL[dtype])


def test_conv1d_and_unbatched(seed):
    check_op(lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1), _rand(2, 4, 11),
             _rand(6, 4, 3), _rand(6), grad=True, **TOL[torch.float32])
    check_op(lambda x, w: F.conv1d(x, w, dilation=2, groups=2), _rand(3, 4, 10), _rand(4, 2, 3),
             grad=True, **TOL[torch.float32])
    check_op(F.conv2d, _rand(4, 6, 6), _rand(7, 4, 2, 2), grad=True, **TOL[torch.float32])


def test_conv2d_channels_last_and_module(seed):
    x = torch.randn(2, 8, 7, 7).to(memory_format=torch.channels_last).requires_grad_(True)
    check_op(lambda x, w: F.conv2d(x, w, padding=1), x, _rand(5, 8, 3, 3), grad=True,
             **TOL[torch.float32])
    conv = torch.nn.Conv2d(3, 4, 3, stride=2)
    dev = torch.nn.Conv2d(3, 4, 3, stride=2).to("neuron")
    dev.load_state_dict(conv.state_dict())
    x = torch.randn(2, 3, 10, 10)
    torch.testing.assert_close(dev(x.to("neuron")).cpu(), conv(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", [
    lambda x, w: F.conv2d(x, w, padding=1),
    lambda x, w: F.conv2d(x.contiguous(), w.contiguous(memory_format=torch.channels_last)),
    lambda x, w: F.conv2d(x.contiguous(), w[:, :, :1, :1].contiguous(  # strides fit both
        memory_format=torch.channels_last)),
    lambda x, w: F.conv_transpose2d(x, w.transpose(0, 1).contiguous()),
    lambda x, w: F.max_pool2d(x, 2, return_indices=True),
    lambda x, w: F.avg_pool2d(x, 3, stride=2, padding=1),
    lambda x, w: F.adaptive_avg_pool2d(x, 3),
    lambda x, w: F.adaptive_max_pool2d(x, (2, 3), return_indices=True),
    lambda x, w: F.batch_norm(x, None, None, training=True),
    lambda x, w: F.group_norm(x, 2),
    lambda x, w: F.conv3d(x[:, :, None].expand(-1, -1, 3, -1, -1).contiguous(
        memory_format=torch.channels_last_3d), w[:, :, None]),
    lambda x, w: F.max_pool3d(x[:, :, None].expand(-1, -1, 2, -1, -1).contiguous(
        memory_format=torch.channels_last_3d), 2),
    lambda x, w: F.pixel_shuffle(x, 2), lambda x, w: F.pixel_unshuffle(x, 2),
    lambda x, w: F.channel_shuffle(x, 2),
    lambda x, w: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
    lambda x, w: F.interpolate(x, size=(5, 7), mode="bilinear", antialias=True),
    lambda x, w: F.interpolate(x, size=(5, 7), mode="bicubic", antialias=True),
])
@pytest.mark.parametrize("crop", [False, True])
def test_channels_last_inputs_give_the_cpus_result_layout(op, crop, seed):
    # Note [Channels-last results] in ops/copy.py: same values and strides as the CPU; a crop
    # of a channels-last activation (a U-Net's skip) is channels-last to the CPU too
    x = torch.randn(2, 4, 8, 10 if crop else 8).contiguous(memory_format=torch.channels_last)
    w = torch.randn(6, 4, 3, 3)
    expected, got = (op(a[..., 1:9] if crop else a, b) for a, b in ((x, w), (x.to("neuron"),
                                                                        w.to("neuron"))))
    for e, g in zip(*(r if isinstance(r, tuple) else (r,) for r in (expected, got))):
        assert g.stride() == e.stride()
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", [
    lambda x, w: F.conv2d(x, w, padding=1), lambda x, w: F.conv2d(x.contiguous(), w.contiguous(
        memory_format=torch.channels_last)),
    lambda x, w: F.max_pool2d(x, 3, 2, 1), lambda x, w: F.avg_pool2d(x, 3, stride=2, padding=1),
    lambda x, w: F.adaptive_avg_pool2d(x, 3), lambda x, w: F.adaptive_max_pool2d(x, (2, 3)),
    lambda x, w: F.batch_norm(x, None, None, torch.ones(4, device=x.device), None,
                              training=True),
    lambda x, w: F.max_pool3d(x[:, :, None].expand(-1, -1, 2, -1, -1).contiguous(
        memory_format=torch.channels_last_3d), 2),
])  # (group_norm's autograd formula makes a non-CPU device's input contiguous, as CUDA's)
def test_channels_last_inputs_get_the_cpus_gradient_layout(op, seed):
    x = torch.randn(2, 4, 8, 10).contiguous(memory_format=torch.channels_last)
    w = torch.randn(6, 4, 3, 3)
    grads = []
    for a, b in ((x, w), (x.to("neuron"), w.to("neuron"))):
        a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
        y = op(a, b)
        upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.device)
        grads.append(torch.autograd.grad(y, (a, b), upstream, allow_unused=True))
    for e, g in zip(*grads):
        if e is not None:
            assert g.stride() == e.stride()
            torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", [
    dict(x=(5, 32, 16, 16), w=(64, 32, 3, 3), padding=1),  # (weight gradient on MKL)
    dict(x=(5, 16, 11, 9), w=(64, 8, 3, 3), stride=2, groups=2, channels_last=True),
    dict(x=(5, 64, 16, 16), w=(128, 32, 3, 3), padding=1, groups=2),  # (a batch of groups)
    dict(x=(7, 48, 40), w=(32, 48, 5), dilation=2),  # 1-D
])
def test_sample_blocks_give_the_whole_batchs_results(cfg, monkeypatch, seed):
    """Note [Convolution in sample blocks]: forward, the image gradient and the weight
    gradient (whose later blocks add their chunks to the running sum) in blocks of two
    samples give what the whole batch in one product gives. Small integers: every sum is
    exact in any order, so a sample's block, offset or running sum gone wrong shows, while
    BLAS's order inside a chunk (which may change with the block's width) does not."""
    from neuron_eager.ops import conv as C

    conv = F.conv1d if len(cfg["x"]) == 3 else F.conv2d
    options = {k: v for k, v in cfg.items() if k not in ("x", "w", "channels_last")}
    x, w = torch.randint(-3, 4, cfg["x"]).float(), torch.randint(-3, 4, cfg["w"]).float()
    b = torch.randint(-3, 4, cfg["w"][:1]).float()
    if cfg.get("channels_last"):
        x = x.to(memory_format=torch.channels_last)
    g = torch.randint(-3, 4, conv(x, w, **options).shape).float()
    results = []
    for block_bytes in (1 << 40, 1):  # the whole batch; then blocks of two samples
        monkeypatch.setattr(C, "COLUMN_BLOCK_BYTES", block_bytes)
        xn, wn = x.to("neuron").requires_grad_(), w.to("neuron").requires_grad_()
        y = conv(xn, wn, b.to("neuron"), **options)
        results.append([y, *torch.autograd.grad(y, (xn, wn), g.to("neuron"))])
    xs, ws = x.double().requires_grad_(), w.double().requires_grad_()
    y = conv(xs, ws, b.double(), **options)
    exact = [y, *torch.autograd.grad(y, (xs, ws), g.double())]
    for whole, blocked, want in zip(*results, exact):
        assert torch.equal(whole.cpu(), blocked.cpu())
        assert torch.equal(blocked.cpu().double(), want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_conv_transpose(dtype, seed):
    x, w, b = _rand(2, 4, 5, 6, dtype=dtype), _rand(4, 3, 3, 3, dtype=dtype), _rand(6, dtype=dtype)
    check_op(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1,
                                                groups=2), x, w, b, grad=True, **TOL[dtype])
    check_op(lambda x, w: F.conv_transpose1d(x, w, stride=3, dilation=2),
             _rand(2, 4, 7, dtype=dtype), _rand(4, 2, 3, dtype=dtype), grad=True, **TOL[dtype])


def test_conv_integer_and_empty(seed):
    x, w = torch.randint(-5, 5, (2, 3, 6, 6)), torch.randint(-5, 5, (4, 3, 3, 3))
    check_op(F.conv2d, x, w)  # exact int64
    check_op(F.conv2d, _rand(0, 3, 6, 6, grad=False), _rand(4, 3, 3, 3, grad=False))


@pytest.mark.parametrize("dtype", FLOATS)
def test_conv3d(dtype, seed):
    check_op(lambda x, w, b: F.conv3d(x, w, b, stride=(1, 2, 1), padding=(1, 0, 1),
                                      dilation=(1, 1, 2), groups=2),
             _rand(2, 4, 4, 5, 6, dtype=dtype), _rand(6, 2, 2, 3, 2, dtype=dtype),
             _rand(6, dtype=dtype), grad=True, **TOL[dtype])
    check_op(lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=1),
             _rand(1, 3, 3, 4, 3, dtype=dtype), _rand(3, 2, 3, 2, 3, dtype=dtype),
             _rand(2, dtype=dtype), grad=True, **TOL[dtype])


def test_conv_launches_and_errors(seed):
    x, w = torch.randn(1, 4, 6, 6).to("neuron"), torch.randn(5, 4, 3, 3).to("neuron")
    core.reset_counters()
    F.conv2d(x, w)
    assert core.launches_by_engine["tensor"] == 1
    assert core.elements_by_engine["tensor"] == 5 * 16 * 36  # O * Ho*Wo * C*kh*kw
    with pytest.raises(RuntimeError) as cpu:
        F.conv2d(torch.randn(1, 3, 6, 6), torch.randn(5, 4, 3, 3))
    with pytest.raises(RuntimeError) as dev:
        F.conv2d(torch.randn(1, 3, 6, 6).to("neuron"), w)
    assert str(dev.value) == str(cpu.value)


# -- pooling ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cfg", [dict(kernel_size=2),
                                 dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                 dict(kernel_size=(3, 2), stride=(2, 1), padding=1,
                                      dilation=(2, 3))])
def test_max_pool2d(dtype, cfg, seed):
    x = _rand(2, 3, 9, 10, dtype=dtype)
    out = check_op(lambda x: F.max_pool2d(x, **cfg), x, grad=True)
    idx = F.max_pool2d(x.detach(), return_indices=True, **cfg)[1]
    torch.testing.assert_close(
        F.max_pool2d(x.detach().to("neuron"), return_indices=True, **cfg)[1].cpu(), idx)
    assert out.shape == idx.shape


def test_max_pool_variants(seed):
    check_op(lambda x: F.max_pool1d(x, 3, stride=2, padding=1), _rand(2, 3, 11), grad=True)
    check_op(lambda x: F.max_pool2d(x, 2), _rand(3, 8, 8), grad=True)  # unbatched
    check_op(lambda x: F.max_pool2d(x, 2), torch.randint(-100, 100, (2, 3, 8, 8)))
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last).requires_grad_(True)
    check_op(lambda x: F.max_pool2d(x, 2), x, grad=True)
    nan = torch.randn(1, 1, 4, 4)
    nan[0, 0, 0, 1] = nan[0, 0, 1, 0] = float("nan")
    check_op(lambda x: F.max_pool2d(x, 2, return_indices=True), nan)  # same NaN index as CPU
    check_op(lambda x: F.adaptive_max_pool2d(x, (4, 3), return_indices=True), _rand(2, 3, 9, 10))
    check_op(lambda x: F.adaptive_max_pool2d(x, (4, 3)), _rand(2, 3, 9, 10), grad=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cfg", [dict(kernel_size=2),
                                 dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                 dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                                      count_include_pad=False),
                                 dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0),
                                      divisor_override=5)])
def test_avg_pool2d(dtype, cfg, seed):
    check_op(lambda x: F.avg_pool2d(x, **cfg), _rand(2, 3, 9, 10, dtype=dtype), grad=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("size", [(4, 3), 7, (9, 10), 1])
def test_adaptive_avg_pool2d(dtype, size, seed):
    check_op(lambda x: F.adaptive_avg_pool2d(x, size), _rand(2, 3, 9, 10, dtype=dtype),
             grad=True)
    check_op(lambda x: torch.nn.AdaptiveAvgPool2d(size)(x), _rand(3, 9, 10, dtype=dtype),
             grad=True)


def test_pooling_errors_match_cpu():
    x = torch.randn(1, 2, 4, 4)
    for fn in (lambda x: F.max_pool2d(x, 2, padding=2), lambda x: F.avg_pool2d(x, 5)):
        with pytest.raises(RuntimeError) as cpu:
            fn(x)
        with pytest.raises(RuntimeError) as dev:
            fn(x.to("neuron"))
        assert str(dev.value) == str(cpu.value)


def test_conv_reports_its_implicit_gemm_to_the_cost_model():
    from neuron_eager.device_sim import core

    x, w = torch.randn(2, 6, 10, 10).to("neuron"), torch.randn(8, 3, 3, 3).to("neuron")
    core.clock.start_recording()
    F.conv2d(x, w, groups=2)
    (record,) = [r for r in core.clock.stop_recording() if r.engine == "tensor"]
    # per sample and group: (8/2 out channels) x (3*3*3) @ (3*3*3) x (8*8 positions)
    assert record.cost.tiles == core.cost_model.matmul_tiles(2 * 2, 4, 27, 64)[0]
    assert record.cost == core.cost_model.cost("tensor", 2 * 8 * 64 * 27, record.nbytes,
                                               matmul=[(4, 4, 27, 64)], dtype="fp32")


@pytest.mark.parametrize("n, c, size, cfg", [
    (1, 1, (4, 4), dict(kernel_size=3)),
    (2, 8, (9, 9), dict(kernel_size=3, padding=1, stride=2)),
    (None, 6, (5, 7), dict(kernel_size=(2, 3), dilation=(2, 1), padding=(1, 0), stride=(1, 2))),
    (4, 3, (8, 12), dict(kernel_size=3, dilation=(2, 1), padding=(2, 1), stride=(2, 3))),
])
def test_fold_adds_windows_in_the_cpus_order(n, c, size, cfg, seed):
    """F.fold of fp32 columns (conv's col2im): the CPU's bits, batched or not, from
    contiguous and transposed columns, and its gradient (F.unfold)."""
    kernel = nn_pair(cfg["kernel_size"])
    blocks = F.unfold(torch.zeros(1, 1, *size), **cfg).shape[-1]
    shape = (c * kernel[0] * kernel[1], blocks) if n is None else (n, c * kernel[0] * kernel[1],
                                                                    blocks)
    x = torch.randn(shape)
    expected = F.fold(x, size, **cfg)
    for cols in (x, x.transpose(-1, -2).contiguous().transpose(-1, -2)):
        assert torch.equal(F.fold(cols.to("neuron"), size, **cfg).cpu(), expected)
    check_op(lambda t: F.fold(t, size, **cfg), x.requires_grad_(), grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
@pytest.mark.parametrize("n", [None, 1, 3])
def test_unfold_copies_windows_as_the_cpu(n, dtype, seed):
    """F.unfold (conv's im2col, samples moved to the front): the CPU's elements and layout
    for batched and unbatched images, strided ones too; fp32 gradients through F.fold."""
    x = (torch.randn((4, 7, 9) if n is None else (n, 4, 7, 9)) * 5).to(dtype)
    for cfg in (dict(kernel_size=3),
                dict(kernel_size=(2, 3), dilation=(2, 1), padding=(1, 0), stride=(1, 2))):
        for image in (x, x.transpose(-1, -2).contiguous().transpose(-1, -2), x[..., ::2, :]):
            expected, got = F.unfold(image, **cfg), F.unfold(image.to("neuron"), **cfg).cpu()
            assert torch.equal(got, expected) and got.stride() == expected.stride()
        if dtype == torch.float32:
            check_op(lambda t: F.unfold(t, **cfg), x.clone().requires_grad_(), grad=True)


def nn_pair(v):  # (an int or a pair, as nn.Fold takes them)
    return v if isinstance(v, tuple) else (v, v)
