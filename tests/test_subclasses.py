"""Tensor subclasses over neuron tensors (Note [Subclasses of neuron tensors] in
ops/tensor.py): `as_subclass` works as on the CPU, for classes that wrap every result
(torch.Tensor's __torch_function__) and for classes like torchvision's tv_tensors."""
import pytest
import torch
from torch._C import DisableTorchFunctionSubclass

import neuron_eager
from neuron_eager import adaptive

N = torch.device("neuron", 0)


class Wrapping(torch.Tensor):
    """torch.Tensor's __torch_function__: every result is a Wrapping."""


class Marked(torch.Tensor):
    """As torchvision's TVTensor: results are plain tensors, but clone() and to() keep it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if not all(issubclass(cls, t) for t in types):
            return NotImplemented
        with DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        if func in (torch.Tensor.clone, torch.Tensor.to) and isinstance(out, torch.Tensor):
            return out.as_subclass(cls)
        if isinstance(out, cls):
            return out.as_subclass(torch.Tensor)
        return out


@pytest.mark.parametrize("cls", [Wrapping, Marked])
def test_as_subclass_behaves_as_on_the_cpu(cls):
    x = torch.randn(3, 4)
    cpu, dev = x.clone().as_subclass(cls), x.to(N).as_subclass(cls)
    assert isinstance(dev, cls) and dev.device == N and dev.shape == cpu.shape
    for got, want in [(dev * 2 + 1, cpu * 2 + 1), (dev[1:], cpu[1:]), (dev.clone(), cpu.clone()),
                      (dev.sum(0), cpu.sum(0))]:
        assert isinstance(got, cls) == isinstance(want, cls)
        assert got.device == N  # (a sum adds in its own order: Note [Sum order])
        torch.testing.assert_close(got.cpu().as_subclass(torch.Tensor),
                                   want.as_subclass(torch.Tensor))
    back = dev.cpu()  # a CPU tensor of the user's class (or plain), never a neuron one
    assert back.device.type == "cpu" and type(back) in (cls, torch.Tensor)
    assert torch.equal(back.as_subclass(torch.Tensor), x)
    assert type(x.as_subclass(cls).to(N)) is type(dev)  # moved to neuron: the same class
    assert repr(dev).startswith(f"{cls.__name__}([") and repr(cpu).startswith(f"{cls.__name__}([")
    assert "device='neuron:0'" in repr(dev)


def test_a_subclass_view_shares_memory_and_autograd():
    base = torch.randn(5, device=N, requires_grad=True)
    view = base.as_subclass(Marked)
    (view * 3).sum().backward()
    assert torch.equal(base.grad.cpu(), torch.full((5,), 3.0))
    plain = torch.zeros(4, device=N)
    marked = plain.as_subclass(Marked)
    marked.add_(2)  # writes the same memory
    assert torch.equal(plain.cpu(), torch.full((4,), 2.0))


def test_a_pending_result_becomes_a_subclass():
    x = torch.randn(6)
    xd = x.to(N)
    with adaptive.adaptive_eager():
        marked = (xd * 2).as_subclass(Marked)
        assert torch.equal((marked + 1).cpu(), x * 2 + 1)


def test_classes_of_their_own_dispatch_keep_torchs_answer():
    class Dispatching(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise AssertionError("not reached")

    x = torch.randn(2, device=N)
    with pytest.raises(RuntimeError, match="already associated to a python object"):
        x.as_subclass(Dispatching)
    assert type(x.as_subclass(torch.Tensor)) is neuron_eager.ops.tensor.NeuronTensor


def test_a_saved_subclass_loads_as_that_class(tmp_path):
    x = torch.randn(2, 3)
    marked = x.to(N).as_subclass(Marked)
    marked.note = "kept"  # state a subclass keeps on the object (tv_tensors' box format)
    torch.save({"t": marked, "cpu": x.as_subclass(Marked)}, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    got = loaded["t"]
    assert isinstance(got, Marked) and got.device == N and got.note == "kept"
    assert torch.equal(got.cpu(), x) and type(loaded["cpu"]) is Marked
    on_cpu = torch.load(tmp_path / "m.pt", weights_only=False, map_location="cpu")["t"]
    assert type(on_cpu) is Marked and on_cpu.device.type == "cpu"  # as a CUDA one loads


def test_aliases_on_other_threads():
    import threading

    x, results = torch.randn(3, device=N), []
    thread = threading.Thread(target=lambda: results.append(
        (torch.ops.aten.alias(x), x.as_subclass(Marked))))
    thread.start()
    thread.join()
    alias, marked = results[0]
    assert type(alias) is neuron_eager.ops.tensor.NeuronTensor and isinstance(marked, Marked)


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_type_of_a_parameter_rewraps_new_data_as_a_parameter(device):
    # accelerate's set_module_tensor_to_device: a neuron Parameter's type is NeuronTensor,
    # whose constructor wanted a storage and a shape
    old = torch.nn.Linear(2, 2).to(device).weight
    for kwargs in ({}, {"requires_grad": False}):
        new = type(old)(torch.zeros(2, 2, device=device), **kwargs, **vars(old))
        assert isinstance(new, torch.nn.Parameter) and new.device.type == device
        assert new.requires_grad == kwargs.get("requires_grad", True)
        assert torch.equal(new.detach().cpu(), torch.zeros(2, 2))
