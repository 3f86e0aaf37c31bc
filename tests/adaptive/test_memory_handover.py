"""Adaptive eager when memory reaches a tensor without an op (`.data =`, swap_tensors, a
module's dtype or device change): what was recorded reads the old memory, later ops the new
one, as in plain eager (Note [Inputs are read when recorded] in adaptive/region.py)."""
import warnings

import pytest
import torch

from test_adaptive import N, both_modes

pytestmark = pytest.mark.usefixtures("plain_after")


def test_data_assignment_after_a_recorded_read():
    def program():
        x = torch.ones(3, device=N)
        y = x * 5
        x.data = torch.full((3,), 100.0, device=N)
        return y, x + 1, y * 2

    both_modes(program)


def test_swap_tensors_after_a_recorded_read():
    def program():
        a = torch.ones(3, device=N)
        c = a * 5
        torch.utils.swap_tensors(a, torch.full((3,), 2.0, device=N))
        return c, a * 5

    both_modes(program)


@pytest.mark.parametrize("swap_on_conversion", [False, True])
def test_module_conversion_right_after_an_optimizer_step(swap_on_conversion):
    """The step leaves the parameters pending; converting swaps them (torch's swap on
    conversion, or the tied-parameter shim), which needs their region run first (Note
    [Swapping pending tensors]). No warning, the same bits, the same Parameter objects."""
    def program():
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3).to(N)
        weight = m.weight
        opt = torch.optim.AdamW(m.parameters())
        m(torch.ones(2, 4, device=N)).sum().backward()
        opt.step()
        torch.__future__.set_swap_module_params_on_conversion(swap_on_conversion)
        try:
            m.half()
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)
        assert m.weight is weight
        return m.weight * 1, m.bias * 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        both_modes(program)


@pytest.mark.parametrize("convert", [lambda m: m.to(torch.bfloat16), lambda m: m.half(),
                                     lambda m: m.double()])
def test_module_dtype_change_after_a_recorded_read(convert):
    def program():
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2).to(N)
        w = m.weight * 2
        b = m.bias + 1
        convert(m)
        return w, b, m.weight * 1, m.bias.float()

    both_modes(program)


def test_data_assignment_to_a_pending_tensor():
    def program():
        p = torch.ones(4, device=N) * 2  # pending
        q = p + 1  # reads p's pending value
        p.data = torch.full((4,), 5.0, device=N)  # p keeps this, not its old node's result
        torch.neuron.synchronize()
        return p, q

    both_modes(program)
