"""`p.data = new` on neuron tensors: Module.to(dtype)/.half() and user code swap the memory too."""
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
    with pytest.raises(RuntimeError,
                       match="cannot set .data of a neuron tensor to a tensor on cpu"):
        p.data = torch.zeros(4)
    assert torch.equal(p.detach().cpu(), torch.arange(4.0))  # unchanged by the refused set
