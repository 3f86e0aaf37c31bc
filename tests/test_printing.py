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
