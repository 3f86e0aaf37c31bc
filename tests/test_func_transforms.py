"""torch.func and FX tracing over neuron tensors, against the CPU."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from checks import NEURON


def test_make_fx_keeps_ops_on_closed_over_tensors():
    x = torch.arange(4.0)
    cpu = make_fx(lambda t: t * x.sin())(torch.ones(4))
    dev_x = x.to(NEURON)
    dev = make_fx(lambda t: t * dev_x.sin())(torch.ones(4, device=NEURON))
    v = torch.linspace(-2, 2, 4)
    torch.testing.assert_close(dev(v.to(NEURON)).cpu(), cpu(v))
    assert "aten.mul" in dev.code and "aten.sin" in dev.code


def test_linearize_gives_the_cpu_jvp():
    x, v = torch.linspace(-1, 2, 5), torch.linspace(3, -3, 5)
    fn = lambda t: torch.sin(t) * t + t ** 3  # noqa: E731
    out, jvp_fn = torch.func.linearize(fn, x)
    dev_out, dev_jvp_fn = torch.func.linearize(fn, x.to(NEURON))
    torch.testing.assert_close(dev_out.cpu(), out)
    torch.testing.assert_close(dev_jvp_fn(v.to(NEURON)).cpu(), jvp_fn(v))
    torch.testing.assert_close(dev_jvp_fn((2 * v).to(NEURON)).cpu(), jvp_fn(2 * v))
