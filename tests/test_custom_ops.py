"""Other libraries' ops on neuron (Note [Other libraries' ops] in ops/router.py): their own
kernel for our backend runs; only ops with kernels for other devices alone fall back."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from checks import NEURON, check_op


@torch.library.custom_op("neuron_eager_tests::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + y


@scaled_add.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


scaled_add.register_autograd(
    lambda ctx, g: (g * ctx.alpha, g, None),
    setup_context=lambda ctx, inputs, output: setattr(ctx, "alpha", inputs[2]))


@torch.library.custom_op("neuron_eager_tests::cpu_only", mutates_args=(), device_types="cpu")
def cpu_only(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@torch.library.custom_op("neuron_eager_tests::per_device", mutates_args=(), device_types="cpu")
def per_device(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@per_device.register_kernel("neuron")
def _(x):
    return x + 2  # a different kernel, so the test sees which one ran


def test_a_custom_op_for_every_device_runs_its_function_on_neuron():
    x, y = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    check_op(lambda a, b: scaled_add(a, b, 0.5), x, y, grad=True)  # native: no fallback


def test_a_kernel_registered_for_neuron_is_the_one_that_runs():
    neuron_eager.clear_op_tracking()
    got = per_device(torch.zeros(3, device=NEURON))
    assert torch.equal(got.cpu(), torch.full((3,), 2.0))
    assert neuron_eager.get_fallback_ops() == {}


def test_a_cpu_only_custom_op_falls_back_warned_and_counted():
    neuron_eager.clear_op_tracking()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = cpu_only(torch.zeros(3, device=NEURON))
    assert got.device.type == "neuron" and torch.equal(got.cpu(), torch.ones(3))
    assert neuron_eager.get_fallback_ops() == {"neuron_eager_tests::cpu_only": 1}
    assert any("fell back to CPU" in str(w.message) for w in caught)


@torch.library.custom_op("neuron_eager_tests::positive_only", mutates_args=(),
                         device_types="cpu")
def positive_only(x: torch.Tensor) -> torch.Tensor:
    if (x < 0).any():
        raise RuntimeError("positive_only: negative input")
    return x.sqrt()


def test_a_fallback_the_cpu_refuses_raises_its_error_and_counts_nothing():
    neuron_eager.clear_op_tracking()
    with pytest.raises(RuntimeError, match="negative input"):
        positive_only(-torch.ones(2, device=NEURON))
    assert neuron_eager.get_fallback_ops() == {}


_LIB = torch.library.Library("neuron_eager_tests", "FRAGMENT")
_LIB.define("doubled.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")


def _doubled_out(x, *, out):
    out.resize_(2 * x.numel())
    return out.copy_(torch.cat([x.reshape(-1), x.reshape(-1)]))


_LIB.impl("doubled.out", _doubled_out, "CPU")


def test_a_fallback_that_must_resize_its_out_tensor_says_so():
    x = torch.arange(3.0, device=NEURON)
    with pytest.raises(RuntimeError, match="out= tensor, which aliases neuron memory, cannot be "
                                           "resized"):
        torch.ops.neuron_eager_tests.doubled.out(x, out=torch.empty(0, device=NEURON))
    out = torch.empty(6, device=NEURON)  # the result's shape: no resize, it runs
    torch.ops.neuron_eager_tests.doubled.out(x, out=out)
    assert torch.equal(out.cpu(), torch.tensor([0.0, 1, 2, 0, 1, 2]))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_chunked_linear_cross_entropy_runs_natively(reduction, seed):
    # torch 2.13's chunked path is a torch_nn:: custom op
    x, w = torch.randn(12, 16, requires_grad=True), torch.randn(10, 16, requires_grad=True)
    target = torch.randint(0, 10, (12,))
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=5)
    check_op(lambda a, b, t: F.linear_cross_entropy(a, b, t, reduction=reduction,
                                                    options=options),
             x, w, target, grad=True, rtol=1e-5, atol=1e-6)
