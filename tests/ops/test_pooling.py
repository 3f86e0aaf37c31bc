import pytest
import torch
import torch.nn.functional as F
from checks import check_op

FLOATS = [torch.float32, torch.bfloat16]


def _rand(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape).to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cfg", [
    dict(kernel_size=2),
    dict(kernel_size=(3, 2, 2), stride=(2, 1, 2), padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=2, stride=1, divisor_override=3),
])
def test_avg_pool3d(dtype, cfg, seed):
    # the CPU has no 16-bit 3-D average pooling (CUDA has): those compare with its fp32
    # result rounded once, as the device computes them
    check_op(lambda x: F.avg_pool3d(x, **cfg), _rand(2, 3, 5, 6, 7, dtype=dtype), grad=True,
             fp32_reference=dtype != torch.float32)


def test_avg_pool3d_under_autocast():
    # CUDA's autocast lists leave avg_pool3d alone: it sees the bf16 convolution's output
    model = torch.nn.Sequential(torch.nn.Conv3d(1, 4, 3, padding=1), torch.nn.AvgPool3d(2))
    x = torch.randn(2, 1, 8, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
    model.to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        got = model(x.to("neuron"))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float().cpu(), want.float(), rtol=2e-2, atol=2e-2)


def test_avg_pool_integers(seed):
    x = torch.randint(-20, 20, (2, 3, 7, 6))
    check_op(lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), x)  # truncating division
    check_op(lambda x: F.avg_pool3d(x, (1, 2, 2), divisor_override=3), x[:, :, None, :4])
    check_op(lambda x: F.avg_pool1d(x, 3, 2, 1), x[0])


@pytest.mark.parametrize("dtype", FLOATS)
def test_adaptive_pool3d(dtype, seed):
    x = _rand(2, 3, 5, 7, 6, dtype=dtype)
    check_op(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)), x.detach().float().requires_grad_(),
             grad=True)
    check_op(lambda x: F.adaptive_avg_pool3d(x, (None, 1, 3)), x[0], grad=True,
             rtol=3e-2, atol=3e-2)  # the CPU sums 16-bit windows in 16-bit
    check_op(lambda x: F.adaptive_max_pool3d(x, (3, 2, 4), return_indices=True), x, grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_max_pool3d(dtype, seed):
    x = torch.randn(2, 2, 6, 7, 8) * 10
    x = x.to(dtype).requires_grad_(dtype.is_floating_point)
    for cfg in (dict(kernel_size=2), dict(kernel_size=3, stride=(1, 2, 2), padding=1,
                                             dilation=(2, 1, 1), ceil_mode=True)):
        check_op(lambda x: F.max_pool3d(x, return_indices=True, **cfg), x,
                 grad=dtype.is_floating_point)


@pytest.mark.parametrize("dtype", FLOATS)
def test_fractional_max_pool(dtype, seed):
    x = _rand(2, 3, 9, 10, dtype=dtype)
    samples = torch.rand(2, 3, 2).to(dtype)
    check_op(lambda x, s: F.fractional_max_pool2d(x, 3, output_size=(4, 5), return_indices=True,
                                                  _random_samples=s), x, samples, grad=True)
    x3 = _rand(1, 2, 7, 8, 6, dtype=dtype)
    check_op(lambda x, s: F.fractional_max_pool3d(x, (2, 3, 2), output_ratio=0.5,
                                                  return_indices=True, _random_samples=s),
             x3, torch.rand(1, 2, 3).to(dtype), grad=True)
    check_op(lambda x, s: F.fractional_max_pool2d(x, 2, output_size=3, _random_samples=s),
             x[0], samples[:1], grad=True)  # unbatched


def test_pool3d_non_contiguous(seed):
    x = _rand(2, 6, 5, 4, 3).permute(0, 4, 3, 2, 1)  # (2, 3, 4, 5, 6), strided
    check_op(lambda x: F.max_pool3d(x, 2, stride=1), x, grad=True)
    check_op(lambda x: F.avg_pool3d(x, (2, 1, 3), padding=(1, 0, 1)), x, grad=True)
    check_op(lambda x: F.adaptive_avg_pool3d(x, (3, 2, 4)), x, grad=True)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_max_pool_windows_wholly_in_the_padding(dims, dtype, seed):
    # (Note [Windows in the padding]: a size-1 dim, kernel 2, padding 1, dilation 2: the
    # CPU's lowest value and its index, which may lie past the input)
    pool = [F.max_pool1d, F.max_pool2d, F.max_pool3d][dims - 1]
    x = torch.randn((1, 2) + (3,) * (dims - 1) + (1,))
    x = x.to(dtype) if dtype.is_floating_point else (x * 100).to(dtype)
    kwargs = dict(kernel_size=2, padding=1, dilation=2, return_indices=True)
    check_op(lambda t: pool(t, **kwargs), x)
    if dtype != torch.float32:
        return
    if dims > 1:  # (its index lies in the plane: the CPU's backward adds there)
        check_op(lambda t: pool(t, **kwargs)[0], x.requires_grad_(), grad=True)
    else:  # (past it, where the CPU writes into the next plane or beyond the tensor)
        x = x.to("neuron").requires_grad_()
        pool(x, **kwargs)[0].sum().backward()
        assert torch.equal(x.grad.cpu(), torch.zeros(x.shape))


def test_max_unpool_to_an_empty_output(seed):
    # (the CPU checks the indices it writes: none)
    x, indices = F.max_pool1d(torch.randn(3, 1), 2, 2, 1, return_indices=True)
    check_op(lambda t, i: F.max_unpool1d(t, i, 2, 2, 1), x, indices)
    x, indices = F.max_pool2d(torch.randn(1, 2, 3, 1), 2, 2, 1, return_indices=True)
    check_op(lambda t, i: F.max_unpool2d(t, i, 2, 2, 1, output_size=(3, 0)), x, indices)
