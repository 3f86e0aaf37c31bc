"""Results take the CPU's strides where a program can tell: `.view()` after an op works on
neuron exactly when it works on the CPU."""
import pytest
import torch

import neuron_eager


def _broadcast_with_odd_strides(device):
    z = torch.arange(64.0, device=device).view(4, 4, 4)
    a = z[..., :1].transpose(1, 2).unsqueeze(-1)  # (4, 1, 4, 1), strides (16, 1, 4, 1)
    b = torch.arange(12.0, device=device).view(3, 4).t()  # (4, 3), strides (1, 4)
    return a * b


CASES = {"broadcast of a size-1 dim's stride": _broadcast_with_odd_strides}


@pytest.mark.parametrize("adaptive", [False, True], ids=["plain", "adaptive"])
@pytest.mark.parametrize("name", CASES)
def test_layouts_as_on_cpu(name, adaptive):
    want = CASES[name]("cpu")
    with neuron_eager.adaptive_eager(adaptive):
        got = CASES[name]("neuron")
        assert got.stride() == want.stride()
        assert torch.equal(got.reshape(-1).cpu(), want.reshape(-1))
