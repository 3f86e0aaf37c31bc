import pytest
import torch
import torch.nn.functional as F
from checks import check_op


def _rand(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape).to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("cfg", [
    dict(mode="nearest", size=7),
    dict(mode="nearest", scale_factor=2),
    dict(mode="nearest-exact", scale_factor=1.7),
    dict(mode="linear", size=9, align_corners=True),
    dict(mode="linear", scale_factor=0.6),
])
def test_interpolate_1d_backward(cfg, seed):
    check_op(lambda x: F.interpolate(x, **cfg), _rand(2, 3, 5), grad=True)


@pytest.mark.parametrize("cfg", [
    dict(mode="nearest", size=(4, 7)),
    dict(mode="nearest-exact", scale_factor=(1.5, 0.7)),
    dict(mode="bilinear", size=(7, 4), align_corners=False),
    dict(mode="bilinear", scale_factor=2.5, align_corners=True),
    dict(mode="bicubic", size=(8, 3), align_corners=False),
    dict(mode="bicubic", scale_factor=1.6, align_corners=True),
    dict(mode="bilinear", size=(3, 9), antialias=True),
    dict(mode="bilinear", scale_factor=0.4, antialias=True, align_corners=True),
    dict(mode="bicubic", size=(3, 9), antialias=True),
    dict(mode="bicubic", scale_factor=0.4, antialias=True, align_corners=True),
    dict(mode="bicubic", size=(13, 2), antialias=True),
])
def test_interpolate_2d_backward(cfg, seed):
    check_op(lambda x: F.interpolate(x, **cfg), _rand(2, 3, 6, 5), grad=True)


@pytest.mark.parametrize("cfg", [
    dict(mode="nearest", size=(3, 5, 4)),
    dict(mode="trilinear", scale_factor=(1.5, 0.6, 2), align_corners=False),
    dict(mode="trilinear", size=(5, 2, 7), align_corners=True),
])
def test_interpolate_3d_backward(cfg, seed):
    check_op(lambda x: F.interpolate(x, **cfg), _rand(1, 2, 4, 3, 5), grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,mode,cfg", [
    ((2, 3, 17), "linear", dict(scale_factor=2)),
    ((2, 3, 17), "linear", dict(size=20, align_corners=True)),
    ((2, 3, 9, 13), "bilinear", dict(scale_factor=0.6)),
    ((2, 3, 9, 13), "bilinear", dict(size=(12, 16), align_corners=True)),
    ((1, 2, 5, 6, 7), "trilinear", dict(scale_factor=(1.7, 2, 0.5))),
])
def test_linear_upsampling_forward(dtype, shape, mode, cfg, seed):
    check_op(lambda x: F.interpolate(x, mode=mode, **cfg), _rand(*shape, dtype=dtype,
                                                                 grad=False))


@pytest.mark.parametrize("shape,mode", [((1, 2, 6), "linear"), ((1, 2, 4, 5), "bilinear"),
                                        ((1, 1, 3, 4, 5), "trilinear")])
def test_linear_upsampling_keeps_infinities_as_the_cpu_does(shape, mode):
    # a score map masked with -inf: the CPU weighs each neighbour (NaN only where a zero
    # weight meets an infinity); x0 + (x1 - x0) * t made every blend with -inf NaN
    x = torch.randn(shape)
    x.view(-1)[::3] = float("-inf")
    x.view(-1)[1] = float("inf")
    for cfg in (dict(scale_factor=2), dict(scale_factor=1.5, align_corners=True)):
        cpu = F.interpolate(x, mode=mode, **cfg)
        got = F.interpolate(x.to("neuron"), mode=mode, **cfg).cpu()
        assert torch.equal(got.isnan(), cpu.isnan()) and torch.equal(got.isinf(), cpu.isinf())
        torch.testing.assert_close(got, cpu, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cfg", [dict(scale_factor=1.7), dict(size=(4, 11), align_corners=True),
                                 dict(scale_factor=(0.6, 2.5))])
def test_bicubic_upsampling_forward(dtype, cfg, seed):
    """Floats: the CPU's 4 x 4 taps summed (was PyTorch's decomposition); channels-last
    images stay channels-last, as on the CPU; infinities and NaN where the CPU has them."""
    x = _rand(2, 3, 6, 7, dtype=dtype, grad=False)
    check_op(lambda t: F.interpolate(t, mode="bicubic", **cfg), x)
    last = x.contiguous(memory_format=torch.channels_last)
    got = F.interpolate(last.to("neuron"), mode="bicubic", **cfg)
    assert got.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(1, 2, 5, 6)
    x.view(-1)[::7] = float("-inf")
    cpu = F.interpolate(x, mode="bicubic", **cfg)
    got = F.interpolate(x.to("neuron"), mode="bicubic", **cfg).cpu()
    assert torch.equal(got.isnan(), cpu.isnan()) and torch.equal(got.isinf(), cpu.isinf())


def test_antialias_forward(seed):
    check_op(lambda x: F.interpolate(x, size=(3, 8), mode="bilinear", antialias=True),
             _rand(2, 3, 7, 5, grad=False))
    with pytest.raises(NotImplementedError, match="compute_index_ranges_weights"):
        F.interpolate(torch.ones(1, 1, 4, 4, dtype=torch.bfloat16, device="neuron"), size=2,
                      mode="bilinear", antialias=True)


@pytest.mark.parametrize("pad", [(2, 1), (1, 2, 3, 0), (-1, 2, 1, -2), (1, 0, 2, 1, 0, 2)])
def test_replication_pad_backward(pad, seed):
    x = _rand(*(2, 3, 4, 5, 6)[:2 + len(pad) // 2])
    check_op(lambda x: F.pad(x, pad, mode="replicate"), x, grad=True)
    check_op(lambda x: F.pad(x, pad, mode="replicate"), x[0], grad=True)  # unbatched


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_16bit_bit_exact(dtype, mode, seed):
    # the CPU computes 16-bit grid sampling in 16-bit, rounding every step; so do we
    x = _rand(2, 3, 5, 9, dtype=dtype, grad=False)
    grid = (torch.rand(2, 4, 6, 2) * 2.4 - 1.2).to(dtype)
    for padding in ("zeros", "border", "reflection"):
        for align in (False, True):
            check_op(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding,
                                                align_corners=align), x, grid, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grid_sample_of_non_finite_coordinates(dtype):
    # clipping sends NaN to pixel 0 and reflection +-inf too, as on the CPU and CUDA
    x = torch.arange(12.).reshape(1, 1, 3, 4).to(dtype)
    nan, inf = float("nan"), float("inf")
    grid = torch.tensor([[[[nan, 0.], [0., nan], [inf, 0.], [-inf, 0.], [nan, nan]]]]).to(dtype)
    for mode in ("bilinear", "nearest", "bicubic"):
        for padding in ("zeros", "border", "reflection"):
            if dtype == torch.bfloat16 and (mode, padding) == ("nearest", "zeros"):
                continue  # the CPU's 16-bit kernel reads pixel 0 there, its fp32 one gives 0
            for align in (False, True):
                check_op(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding,
                                                    align_corners=align), x, grid, rtol=0, atol=0)


def test_grid_sample_bicubic_of_coordinates_past_int64():
    # (the taps were int64 before clipping: 1e19 wrapped to the opposite border)
    x = torch.arange(42.).sin().reshape(1, 1, 6, 7)
    grid = torch.tensor([[[[1e19, -1.], [1e30, 1e30], [-1e19, 0.5], [0.3, 1e20]]]])
    for align in (False, True):
        check_op(lambda x, g: F.grid_sample(x, g, mode="bicubic", padding_mode="border",
                                            align_corners=align), x.requires_grad_(), grid,
                 grad=True, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_backward(mode, seed):
    x = _rand(2, 3, 5, 7)
    grid = (torch.rand(2, 4, 6, 2) * 2.4 - 1.2).requires_grad_()
    for padding in ("zeros", "border", "reflection"):
        for align in (False, True):
            check_op(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding,
                                                align_corners=align), x, grid, grad=True,
                     rtol=1e-4, atol=1e-4)


def test_non_contiguous_inputs(seed):
    x = _rand(2, 5, 6, 3).transpose(1, 3)  # (2, 3, 6, 5), strided
    check_op(lambda x: F.interpolate(x, scale_factor=1.5, mode="bicubic"), x, grad=True,
             rtol=1e-4, atol=1e-4)
    grid = (torch.rand(2, 6, 4, 2) * 2 - 1).transpose(1, 2).requires_grad_()
    check_op(lambda x, g: F.grid_sample(x, g, align_corners=False), x, grid, grad=True,
             rtol=1e-4, atol=1e-4)
    check_op(lambda x: F.pad(x, (1, 2, 0, 3), mode="replicate"), x, grad=True)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d(mode, seed):
    x = _rand(2, 3, 4, 5, 6)
    grid = (torch.rand(2, 3, 2, 4, 3) * 2.4 - 1.2).requires_grad_()
    for padding in ("zeros", "border", "reflection"):
        for align in (False, True):
            fn = lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding,  # noqa: E731
                                             align_corners=align)
            check_op(fn, x, grid, grad=True, rtol=1e-4, atol=1e-4)
            check_op(fn, x.detach().bfloat16(), grid.detach().bfloat16(), rtol=0, atol=0)


# uint8 images: the CPU's fixed-point passes (Note [uint8 resampling]), bit for bit
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("channels,channels_last", [(1, False), (3, True), (4, True), (5, False)])
def test_uint8_resize_matches_cpu(mode, antialias, channels, channels_last):
    g = torch.Generator().manual_seed(channels)
    x = torch.randint(0, 256, (2, channels, 17, 23), dtype=torch.uint8, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    for kwargs in (dict(size=(30, 11)), dict(size=(9, 40), align_corners=True),
                   dict(size=(17, 5)), dict(scale_factor=0.3), dict(size=(64, 64))):
        expected = F.interpolate(x, mode=mode, antialias=antialias, **kwargs)
        got = F.interpolate(x.to("neuron"), mode=mode, antialias=antialias, **kwargs)
        assert got.stride() == expected.stride()
        assert torch.equal(got.cpu(), expected), kwargs


def test_uint8_resize_of_a_view_and_large_downscale():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (1, 3, 200, 150), dtype=torch.uint8, generator=g)
    view = x[:, :, 10:190:2, 5:]  # strided rows
    for antialias in (False, True):
        expected = F.interpolate(view, size=(7, 9), mode="bilinear", antialias=antialias)
        got = F.interpolate(x.to("neuron")[:, :, 10:190:2, 5:], size=(7, 9), mode="bilinear",
                            antialias=antialias)
        assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("k, pad", [(1, (3, 1)), (2, (2, 1, 1, 3)), (2, (-1, 3, 2, -1)),
                                    (3, (1, 2, 0, 3, 2, 1))])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "unbatched"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reflection_pads_and_their_gradients_are_the_cpus(k, pad, layout, dtype):
    """Note [Reflection pads]: one copy forward, one scatter backward (the decomposition of
    a 2-D pad's backward took 144 small ops); values to the bit, layouts as the CPU's. (bf16
    gradients: the CPU adds in bf16, one rounding per add; here in fp32, rounded once.)"""
    import neuron_eager

    g = torch.Generator().manual_seed(k)
    x = torch.randn({1: (2, 3, 7), 2: (2, 3, 5, 6), 3: (1, 2, 4, 5, 6)}[k], generator=g)
    if layout == "unbatched":
        x = x[0]
    elif layout == "channels_last":
        if k == 1:
            pytest.skip("no channels-last 3-D layout")
        x = x.to(memory_format=torch.channels_last if k == 2 else torch.channels_last_3d)
    x = x.to(dtype)
    results = []
    for device in ("cpu", "neuron"):
        leaf = x.to(device).detach().requires_grad_()
        y = F.pad(leaf, pad, mode="reflect")
        neuron_eager.clear_op_tracking()
        y.backward(torch.linspace(-2, 3, y.numel()).view(y.shape).to(dtype).to(device))
        results.append((y.detach().cpu(), y.stride(), leaf.grad.cpu(), leaf.grad.stride()))
    (y, y_stride, grad, grad_stride), (y_n, y_stride_n, grad_n, grad_stride_n) = results
    assert torch.equal(y_n, y) and y_stride_n == y_stride and grad_stride_n == grad_stride
    tol = {} if dtype == torch.float32 else dict(rtol=0.02, atol=0.1)
    torch.testing.assert_close(grad_n, grad, **tol)
    # the backward is one kernel (besides moving the incoming gradient over)
    assert set(neuron_eager.get_executed_ops()) <= {
        f"aten::reflection_pad{k}d_backward", "aten::_to_copy", "aten::copy_", "aten::detach"}


def _special_values(shape, dtype):
    """Random values with -0.0, NaN and infinities among them (integers: any byte)."""
    if not dtype.is_floating_point:
        return torch.randint(0, 256, shape, dtype=dtype)
    x = torch.randn(shape).to(dtype).reshape(-1)
    x[::7], x[1::11], x[2::13] = -0.0, float("nan"), float("-inf")
    return x.reshape(shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16, torch.uint8])
@pytest.mark.parametrize("shape,cfg", [
    ((2, 3, 7), dict(mode="nearest", scale_factor=3)),
    ((2, 3, 7), dict(mode="nearest-exact", size=4)),
    ((2, 3, 6, 5), dict(mode="nearest", scale_factor=2)),
    ((2, 3, 6, 5), dict(mode="nearest", size=(4, 11))),
    ((2, 3, 6, 5), dict(mode="nearest-exact", scale_factor=(1.7, 0.6))),
    ((1, 2, 3, 4, 5), dict(mode="nearest", scale_factor=(2, 1.5, 0.5))),
    ((1, 2, 3, 4, 5), dict(mode="nearest-exact", size=(5, 3, 8))),
])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
@pytest.mark.filterwarnings("ignore:float64 on neuron")
def test_nearest_upsampling_copies_the_cpus_elements(dtype, shape, cfg, layout):
    x = _special_values(shape, dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else
                         torch.channels_last_3d) if x.dim() > 3 else x.transpose(1, 2)
    elif layout == "strided":  # a crop of a wider tensor
        x = torch.cat([x, x], dim=-1)[..., 1::2]
    want = F.interpolate(x, **cfg)
    got = F.interpolate(x.to("neuron"), **cfg)
    assert got.shape == want.shape and got.stride() == want.stride()
    bits = [t.contiguous().view(torch.uint8) for t in (got.cpu(), want)]
    assert torch.equal(*bits)


def test_nearest_upsampling_refuses_as_the_cpu():
    x = torch.randn(1, 1, 4, 4)
    for bad in (dict(size=(0, 3)), dict(size=(2, 2, 2))):
        with pytest.raises((RuntimeError, ValueError)) as cpu:
            F.interpolate(x, mode="nearest", **bad)
        with pytest.raises(type(cpu.value)):
            F.interpolate(x.to("neuron"), mode="nearest", **bad)
    ints = torch.ones(1, 1, 2, 2, dtype=torch.int32)
    with pytest.raises(NotImplementedError):
        F.interpolate(ints, scale_factor=2)
    with pytest.raises(NotImplementedError):
        F.interpolate(ints.to("neuron"), scale_factor=2)


@pytest.mark.parametrize("make", [
    lambda d: F.interpolate(torch.zeros(0, 3, 5, device=d), scale_factor=2, mode="nearest"),
    lambda d: F.interpolate(torch.zeros(0, 3, 5, 5, device=d), scale_factor=2,
                            mode="nearest-exact"),
    lambda d: F.interpolate(torch.zeros(0, 2, 3, 3, 3, device=d), scale_factor=2),
    lambda d: F.pad(torch.zeros(2, 1, 6, 5, 3, device=d), [0, 0, 0, 0, -3, -3], mode="reflect"),
    lambda d: F.pad(torch.zeros(2, 3, 6, 5, device=d), [0, 0, -3, -3], mode="reflect"),
    lambda d: F.pad(torch.zeros(2, 3, 4, 3, device=d), [-2, -1, 0, 0], mode="replicate")])
def test_empty_results_the_cpu_allows(make):
    # (torch's meta kernel of nearest upsampling fails on an empty batch)
    assert make("neuron").shape == make("cpu").shape


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("size,scale", [(5, 1.1), (20, 2.04), (10, 2.05), (8, 0.95)])
def test_nearest_picks_the_cpus_pixels_where_the_size_stays_or_doubles(dims, size, scale):
    # the CPU's 2-D forward copies (or doubles) such an axis; 1-D and 3-D step by 1/scale
    x = torch.arange(float(size ** dims)).reshape((1, 1) + (size,) * dims)
    want = F.interpolate(x, scale_factor=scale, mode="nearest")
    assert torch.equal(F.interpolate(x.to("neuron"), scale_factor=scale, mode="nearest").cpu(),
                       want)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("scale", [1.1, (1.1, 2.0), (0.9, 1.05)])
def test_antialiasing_copies_an_axis_that_keeps_its_size(mode, scale):
    # (the CPU's forward skips such an axis, its backward does not)
    x = torch.randn(1, 2, 5, 5, generator=torch.Generator().manual_seed(0), requires_grad=True)
    on_device = x.detach().to("neuron").requires_grad_()
    want = F.interpolate(x, scale_factor=scale, mode=mode, antialias=True)
    got = F.interpolate(on_device, scale_factor=scale, mode=mode, antialias=True)
    torch.testing.assert_close(got.cpu(), want.detach())
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    want.backward(grad)
    got.backward(grad.to("neuron"))
    torch.testing.assert_close(on_device.grad.cpu(), x.grad)


_LAYOUT_CASES = {  # name -> (input dims, op)
    "avg_pool3d": (5, lambda t: F.avg_pool3d(t, 2)),
    "adaptive_avg_pool3d": (5, lambda t: F.adaptive_avg_pool3d(t, (2, 3, 3))),
    "adaptive_max_pool3d": (5, lambda t: F.adaptive_max_pool3d(t, 2)),
    "max_pool3d": (5, lambda t: F.max_pool3d(t, 2)),
    "nearest 3-D": (5, lambda t: F.interpolate(t, scale_factor=2)),
    "trilinear": (5, lambda t: F.interpolate(t, scale_factor=2, mode="trilinear")),
    "nearest 2-D": (4, lambda t: F.interpolate(t, scale_factor=2)),
    "nearest-exact 2-D": (4, lambda t: F.interpolate(t, scale_factor=2, mode="nearest-exact")),
    "bilinear": (4, lambda t: F.interpolate(t, scale_factor=2, mode="bilinear")),
    "bilinear antialiased": (4, lambda t: F.interpolate(t, scale_factor=0.5, mode="bilinear",
                                                        antialias=True)),
    "bicubic": (4, lambda t: F.interpolate(t, scale_factor=2, mode="bicubic"))}


@pytest.mark.parametrize("name", _LAYOUT_CASES)
def test_channels_last_results_and_gradients_take_the_cpus_layout(name):
    # (3-D average and adaptive pools have no channels-last kernel on the CPU; 2-D nearest,
    # bilinear and trilinear gradients follow a channels-last grad_output there)
    dims, op = _LAYOUT_CASES[name]
    x = torch.randn((2, 3, 4, 6, 6)[5 - dims:]).contiguous(
        memory_format=torch.channels_last if dims == 4 else torch.channels_last_3d)
    layouts = []
    for device in ("cpu", "neuron"):
        leaf = x.detach().to(device).requires_grad_()
        y = op(leaf)
        grad, = torch.autograd.grad(y, leaf, torch.ones_like(y))
        layouts.append((y.stride(), grad.stride()))
    assert layouts[1] == layouts[0]


@pytest.mark.parametrize("size", [(1, 1, 28, 28), (2, 3, 5, 7), (1, 1, 3, 4, 5), (2, 1, 1, 6)])
@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_builds_the_cpus_points(size, align_corners, seed):
    # Note [affine_grid as ATen builds it]: at the identity the points are the CPU's bits (a
    # spatial transformer starts there: grid_sample's gradient flips with an ulp at a centre)
    nd = len(size) - 2
    identity = torch.eye(nd, nd + 1).expand(size[0], nd, nd + 1)
    expected = F.affine_grid(identity, size, align_corners=align_corners)
    got = F.affine_grid(identity.to("neuron"), size, align_corners=align_corners).cpu()
    assert torch.equal(got, expected)
    theta = torch.randn(size[0], nd, nd + 1, requires_grad=True)
    check_op(lambda t: F.affine_grid(t, size, align_corners=align_corners), theta, grad=True,
             atol=1e-4)  # (theta's gradient sums a grid's points: 784 of them)
    with pytest.raises(RuntimeError, match=r"batch2 tensor to be: \[3, "):  # (bmm's words)
        F.affine_grid(theta.detach().to("neuron"), (3, *size[1:]), align_corners=align_corners)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_antialiased_resize_to_the_same_size_copies(dtype, seed):
    # (the CPU copies before it refuses 16-bit weights)
    x = torch.randn(1, 2, 7, 3).to(dtype)
    for mode in ("bilinear", "bicubic"):
        check_op(lambda t: F.interpolate(t, scale_factor=1.0, mode=mode, antialias=True), x)
