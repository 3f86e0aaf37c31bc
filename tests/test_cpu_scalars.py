"""Python numbers and 0-dim tensors as operands: the dtype the CPU computes in, the range checks
it makes when it converts them (and those it does not), compared with the CPU."""
import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from checks import outcome


SCALAR_TENSOR_CASES = {
    "uint8 // int64 0-dim": lambda d: torch.tensor([3, 250, 1, 5], dtype=torch.uint8, device=d)
    // torch.tensor(-3, device=d),
    "maximum of int8 and an int16 0-dim": lambda d: torch.maximum(
        torch.tensor([3, -1, 1, 5], dtype=torch.int8, device=d),
        torch.tensor(255, dtype=torch.int16, device=d)),
    "uint8 < int64 0-dim": lambda d: torch.tensor([3, 250], dtype=torch.uint8, device=d)
    < torch.tensor(-3, device=d),
    "bf16 % float32 0-dim": lambda d: torch.tensor([1., 3., 0.1, 256.], dtype=torch.bfloat16,
                                                   device=d) % torch.tensor(1.0001, device=d),
    "bf16 + float32 0-dim": lambda d: torch.tensor([256.], dtype=torch.bfloat16, device=d)
    + torch.tensor(1.0001, device=d),
    "uint8 add_ of an int64 0-dim": lambda d: torch.tensor(
        [3, 250], dtype=torch.uint8, device=d).add_(torch.tensor(-3, device=d)),
    "bf16 + int64 0-dim": lambda d: torch.tensor([1., 3.], dtype=torch.bfloat16, device=d)
    + torch.tensor(257, device=d),
    "int64 0-dim * bf16": lambda d: torch.tensor(257, device=d) * torch.tensor(
        [1., 3.], dtype=torch.bfloat16, device=d),
    # mul and div read a one-value second operand at fp32 (original_scalar_value<opmath_t>)
    "bf16 mul_ of a float32 0-dim": lambda d: torch.tensor(
        [1.1328, -1.5, 3.], dtype=torch.bfloat16, device=d).mul_(torch.tensor(1.0035, device=d)),
    "fp16 / float64 0-dim": lambda d: torch.tensor([1., 3., 2047.], dtype=torch.float16,
                                                   device=d) / torch.tensor(1.0007, device=d,
                                                                            dtype=torch.float64),
    "bf16 * int64 0-dim": lambda d: torch.tensor([1., 3.], dtype=torch.bfloat16, device=d)
    * torch.tensor(257, device=d),
    # floor and trunc division read their divisor as mul and div do; a CPU 0-dim tensor (read
    # on the host) is cast as a device one
    "bf16 // float32 0-dim": lambda d: torch.tensor([3., 256.], dtype=torch.bfloat16,
                                                    device=d) // torch.tensor(1.0035, device=d),
    "fp16 trunc-div by float32 0-dim": lambda d: torch.div(
        torch.tensor([float("inf"), 3.], dtype=torch.float16, device=d),
        torch.tensor(70000.0, device=d), rounding_mode="trunc"),
    "bf16 + a CPU float32 0-dim": lambda d: torch.tensor([1., 3.], dtype=torch.bfloat16,
                                                         device=d) + torch.tensor(257.0),
    "CPU float32 0-dim * bf16": lambda d: torch.tensor(257.0) * torch.tensor(
        [-3., 1.], dtype=torch.bfloat16, device=d),
    "0.1 // bf16": lambda d: 0.1 // torch.tensor([0.1, 3.0], dtype=torch.bfloat16, device=d),
}


@pytest.mark.parametrize("name", SCALAR_TENSOR_CASES)
def test_zero_dim_tensors_take_the_common_dtype_first(name):
    # the CPU casts a 0-dim operand to the common dtype (it does not promote): -3 is 253 in uint8
    cpu, neuron = (SCALAR_TENSOR_CASES[name](d) for d in ("cpu", "neuron"))
    assert neuron.dtype == cpu.dtype and torch.equal(neuron.cpu(), cpu)


def test_a_uint8_where_condition_warns_as_on_cpu():
    for device in ("cpu", "neuron"):
        mask = torch.tensor([1, 0], dtype=torch.uint8, device=device)
        with pytest.warns(UserWarning, match="where received a uint8 condition tensor"):
            out = torch.where(mask, torch.ones(2, device=device), torch.zeros(2, device=device))
        assert out.tolist() == [1.0, 0.0]


# Python scalars the CPU converts to the result's dtype, or to its compute type (fp32 for
# 16-bit floats), with a range check; a sweep found each computing inf, nan or a wrapped value
_HALF, _BF16, _INT = torch.float16, torch.bfloat16, torch.int32
SCALARS_THAT_DO_NOT_FIT = {
    "add alpha": lambda x: x.add(x, alpha=1e39),
    "sub alpha, fp16": lambda x: x.half().sub(x.half(), alpha=70000.0),
    "rsub alpha, int32": lambda x: torch.rsub(x.to(_INT), x.to(_INT), alpha=2 ** 40),
    "add_ alpha, int32": lambda x: x.to(_INT).add_(x.to(_INT), alpha=2 ** 40),
    "addcmul value, bf16": lambda x: x.bfloat16().addcmul(x.bfloat16(), x.bfloat16(), value=1e39),
    "addcdiv_ value": lambda x: x.addcdiv_(x, x + 5, value=-1e39),
    "lerp weight, fp16": lambda x: x.half().lerp(x.half(), 1e39),
    "threshold value, fp16": lambda x: F.threshold(x.half(), 0.5, 70000.0),
    "hardtanh limits, int32": lambda x: F.hardtanh(x.to(_INT), -1e10, 1e10),
    "relu6-style hardtanh_, bf16": lambda x: F.hardtanh(x.bfloat16(), 0.0, 1e39, inplace=True),
    "leaky_relu slope, bf16": lambda x: F.leaky_relu(x.bfloat16(), 1e39),
    "elu alpha": lambda x: F.elu(x, 1e39),
    "scatter value, fp16": lambda x: x.half().scatter(0, torch.zeros(1, dtype=torch.long,
                                                                      device=x.device), 70000.0),
    "pow exponent, bf16": lambda x: x.bfloat16() ** 1e39,
    "pow_ exponent, int32": lambda x: x.to(_INT).pow_(2 ** 40),
    "addmm beta": lambda x: torch.addmm(x.view(2, 1).expand(2, 2), x.view(2, 1), x.view(1, 2),
                                        beta=1e39),
    "baddbmm alpha, bf16": lambda x: torch.baddbmm(x.bfloat16().view(1, 2, 1).expand(1, 2, 2),
                                                   x.bfloat16().view(1, 2, 1),
                                                   x.bfloat16().view(1, 1, 2), alpha=-1e39),
    "foreach add_ alpha": lambda x: torch._foreach_add_([x, x + 1], [x, x], alpha=1e39),
}


# ... and values it converts without a check (a sweep found each raising here)
VALUES_CAST_WITHOUT_A_CHECK = {
    "threshold's threshold, fp16": lambda x: F.threshold(x.half(), 70000.0, 1.0),
    "fill_ with a float32 tensor, fp16": lambda x: x.half().fill_(torch.tensor(70000.0)),
    "fill_ with a float64 tensor": lambda x: x.fill_(torch.tensor(1e39, dtype=torch.float64)),
    # a 0-dim value on the device is copied in: wrapped, not range-checked
    "fill_ int8 with a long tensor": lambda x: x.to(torch.int8).fill_(_t(300, x)),
    "fill_ int8 with a negative long": lambda x: x.to(torch.int8).fill_(_t(-129, x)),
    "fill_ uint8 with a float tensor": lambda x: x.to(torch.uint8).fill_(_t(-3.5, x)),
    "fill_ int32 with a float nan": lambda x: x.to(_INT).fill_(_t(float("nan"), x)),
    "fill_ fp16 with a long past its range": lambda x: x.half().fill_(_t(2 ** 40, x)),
    "fill_ bool with a long past int32": lambda x: x.bool().fill_(_t(2 ** 40, x)),
    "fill int8 with a float tensor": lambda x: torch.fill(x.to(torch.int8), _t(300.7, x)),
    "fill bf16 with a long tensor": lambda x: torch.fill(x.bfloat16(), _t(2 ** 40 + 1, x)),
    "fill of a transposed input": lambda x: torch.fill(x.repeat(3, 1).t(), 2.0).stride(),
    "fill_ with a tensor, transposed": lambda x: torch.fill(x.repeat(3, 1).t(), _t(2, x)),
}


def _t(value, x):
    return torch.tensor(value, device=x.device)


@pytest.mark.parametrize("name", VALUES_CAST_WITHOUT_A_CHECK)
def test_values_cast_without_a_check_as_on_cpu(name):
    x = torch.tensor([1.5, -2.0])
    expected = VALUES_CAST_WITHOUT_A_CHECK[name](x.clone())
    got = VALUES_CAST_WITHOUT_A_CHECK[name](x.to("neuron"))
    if isinstance(expected, tuple):  # (strides)
        assert got == expected
        return
    assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected)
    assert got.stride() == expected.stride()


@pytest.mark.parametrize("adaptive", [False, True], ids=["plain", "adaptive"])
@pytest.mark.parametrize("name", SCALARS_THAT_DO_NOT_FIT)
def test_scalars_that_do_not_fit_raise_as_on_cpu(name, adaptive):
    def program(device):
        with neuron_eager.adaptive_eager(adaptive and device == "neuron"):
            x = torch.tensor([1.5, -2.0], device=device)
            out = SCALARS_THAT_DO_NOT_FIT[name](x)
            return out if isinstance(out, torch.Tensor) else x

    cpu, neuron = outcome(program, "cpu"), outcome(program, "neuron")
    assert isinstance(cpu, tuple) and "without overflow" in cpu[1], f"the CPU: {cpu}"
    assert neuron == cpu
