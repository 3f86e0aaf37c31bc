"""Printing neuron tensors: torch's format, without copying what a summary leaves out."""
import pytest
import torch

from neuron_eager.ops import tensor as T

LARGE = {
    "contiguous": lambda d: torch.arange(4000.0, device=d).view(40, 100),
    "transposed": lambda d: torch.arange(4000.0, device=d).view(40, 100).t(),
    "expanded": lambda d: torch.arange(40.0, device=d)[:, None].expand(40, 100),
    "bf16 strided": lambda d: torch.arange(4000, device=d).view(40, 100)[:, ::3].bfloat16(),
    "bool": lambda d: torch.arange(4000, device=d) % 3 == 0,
}


@pytest.mark.parametrize("name", LARGE)
def test_a_summarized_tensor_prints_as_on_cpu_without_a_copy(name, monkeypatch):
    # (repr copied the whole tensor to the host first: +312 MB for a 256 MB tensor)
    t = LARGE[name]("neuron")
    copy = T.to_cpu
    monkeypatch.setattr(T, "to_cpu", lambda x, *a: pytest.fail("copied") if x.numel() > 1000
                        else copy(x, *a))
    want = repr(LARGE[name]("cpu"))
    want = want.replace("dtype=", "device='neuron:0', dtype=") if "dtype=" in want else \
        want[:-1] + ", device='neuron:0')"
    assert _words(repr(t)) == _words(want)  # (the suffix moves line breaks)


def _words(text: str) -> str:
    return "".join(text.split())


def _invalid_grad_fn(d):
    base = torch.ones(2, device=d, requires_grad=True).clone()
    with torch.no_grad():
        view = base[:1]
        base.mul_(2)
    return view


class _Masked(torch.Tensor):
    def __repr__(self, *, tensor_contents=None):
        return super().__repr__(tensor_contents="[--masked--]")


PRINTED = {
    "edgeitems=0": lambda d: torch.arange(10.0, device=d),  # (size= instead of values)
    "a no_grad view of a base changed in place": _invalid_grad_fn,  # (grad_fn=<Invalid>)
    "a subclass's own contents": lambda d: torch.ones(1, device=d).as_subclass(_Masked),
}


@pytest.mark.parametrize("name", PRINTED)
def test_prints_as_on_cpu(name):
    # (each was printed otherwise, or raised)
    options = dict(edgeitems=0, threshold=5) if name == "edgeitems=0" else {}
    torch.set_printoptions(**options)
    try:
        want, got = repr(PRINTED[name]("cpu")), repr(PRINTED[name]("neuron"))
    finally:
        torch.set_printoptions(profile="default")
    cut = want.index("]") + 1  # (the device comes first among the suffixes)
    assert got == want[:cut] + ", device='neuron:0'" + want[cut:]
