"""Lazy modules moved to neuron before their first forward (Note [Lazy modules on the
device] in ops/_compat_modules.py)."""
import pytest
import torch

from checks import NEURON


def _model():
    return torch.nn.Sequential(torch.nn.LazyConv2d(4, 3), torch.nn.LazyBatchNorm2d(),
                               torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2))


def test_a_lazy_model_moved_first_materializes_on_the_device_and_trains():
    x = torch.randn(2, 3, 8, 8)
    dev = _model().to(NEURON)
    assert all(isinstance(p, torch.nn.UninitializedParameter) for p in dev.parameters())
    out = dev(x.to(NEURON))  # materialized here, on neuron, the same objects
    assert all(p.device.type == "neuron" and p.is_leaf and p.requires_grad
               for p in dev.parameters())
    assert all(b.device.type == "neuron" for b in dev.buffers())
    cpu = _model()
    cpu(x)  # (materialized on the host, then given the device model's values)
    cpu.load_state_dict({k: v.cpu() for k, v in dev.state_dict().items()})
    dev.load_state_dict({k: v.to(NEURON) for k, v in cpu.state_dict().items()})
    for model, inp in ((cpu, x), (dev, x.to(NEURON))):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(inp).square().sum().backward()
        optimizer.step()
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5,
                                   msg=name)
    assert out.shape == (2, 2)


def test_a_lazy_layer_takes_the_dtype_and_can_go_back_to_the_host():
    half = torch.nn.LazyLinear(3).to(NEURON, torch.float16)
    y = half(torch.randn(2, 5, dtype=torch.float16, device=NEURON))
    assert half.weight.dtype == torch.float16 and y.dtype == torch.float16
    assert half.weight.device.type == "neuron"
    back = torch.nn.LazyLinear(3).to(NEURON).cpu()  # sent home before its first forward
    back(torch.randn(2, 5))
    assert back.weight.device.type == "cpu"


def _made_on(where: str):
    if where == "device=":
        return torch.nn.Sequential(torch.nn.LazyConv2d(4, 3, device=NEURON),
                                   torch.nn.LazyBatchNorm2d(device=NEURON), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.LazyLinear(2, device=NEURON))
    with torch.device(NEURON):  # (set_default_device works through the same mode)
        return _model()


@pytest.mark.parametrize("where", ["device=", "with torch.device"])
def test_a_lazy_model_made_on_the_device_materializes_there_and_trains_as_on_cpu(where):
    # the placeholders could not be made on neuron: the lazy layers raised at construction
    x = torch.randn(2, 3, 8, 8)
    dev = _made_on(where)
    dev(x.to(NEURON))
    assert all(p.device.type == "neuron" for p in dev.parameters())
    assert all(b.device.type == "neuron" for b in dev.buffers())
    cpu = _model()
    cpu(x)
    cpu.load_state_dict({k: v.cpu() for k, v in dev.state_dict().items()})
    for model, inp in ((cpu, x), (dev, x.to(NEURON))):
        torch.optim.SGD(model.parameters(), lr=0.1).zero_grad()
        model(inp).square().sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5,
                                   msg=name)
