"""`p.data = new` on neuron tensors: Module.to(dtype)/.half() and user code swap the memory too."""
import copy

import pytest
import torch

N = torch.device("neuron")


@pytest.mark.parametrize("convert", [lambda m: m.to(torch.bfloat16), lambda m: m.half(),
                                     lambda m: m.to(N, torch.float16)])
def test_module_dtype_conversion_on_device_keeps_values(convert):
    torch.manual_seed(0)
    cpu = torch.nn.Linear(5, 3)
    dev = torch.nn.Linear(5, 3)
    dev.load_state_dict(cpu.state_dict())
    dev = convert(dev.to(N))
    cpu = cpu.to(dev.weight.dtype)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        assert p.device.type == "neuron" and p.dtype == q.dtype
        assert torch.equal(p.detach().cpu(), q.detach())
    x = torch.randn(2, 5).to(dev.weight.dtype)
    torch.testing.assert_close(dev(x.to(N)).cpu(), cpu(x), rtol=1e-2, atol=1e-2)


def test_data_assignment_replaces_shape_and_memory():
    p = torch.nn.Parameter(torch.ones(3, device=N))
    p.data = torch.arange(4.0, device=N)
    assert p.shape == (4,) and p.requires_grad
    assert torch.equal(p.detach().cpu(), torch.arange(4.0))


def _move_optimizer_state(optimizer, device):
    """The snippet that moves an optimizer's state after loading a checkpoint, by `.data =`."""
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                value.data = value.data.to(device)


def test_data_assignment_across_devices_moves_the_tensor_as_on_cuda():
    # Note [Setting .data across devices]
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 3), torch.randn(5, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(x).sum().backward()
    optimizer.step()
    reference = copy.deepcopy((model, optimizer))  # (deepcopy keeps the optimizer's params)
    weight = model.weight
    weight.tag = "decay"
    seen = []
    weight.register_hook(lambda g: seen.append(g.device.type))
    for p in model.parameters():
        p.data = p.data.to(N)
    _move_optimizer_state(optimizer, N)
    assert model.weight is weight and weight.tag == "decay" and weight.requires_grad
    assert isinstance(weight, torch.nn.Parameter) and weight.device.type == "neuron"
    assert weight.grad.device.type == "neuron"  # (moved along, so backward can accumulate)
    assert all(v.device.type == "neuron" for v in optimizer.state[weight].values())
    ref_model, ref_optimizer = reference
    for m, opt, data in ((model, optimizer, x.to(N)), (ref_model, ref_optimizer, x)):
        for _ in range(2):
            opt.zero_grad()
            m(data).sum().backward()
            opt.step()
    for got, want in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(got.detach().cpu(), want.detach())
    assert seen == ["neuron", "neuron"]  # (its hook stayed on it)
    for p in model.parameters():  # and back, as `optimizer_to(optimizer, "cpu")` does
        p.data = p.data.cpu()
    _move_optimizer_state(optimizer, "cpu")
    assert model.weight is weight and type(weight) is torch.nn.Parameter and weight.tag == "decay"
    assert weight.device.type == "cpu" and optimizer.state[weight]["exp_avg"].device.type == "cpu"
    plain = torch.zeros(3)
    plain.data = torch.ones(3, device=N)
    assert plain.device.type == "neuron" and not plain.requires_grad
