"""GradScaler's kernels (ops/amp.py) and repeat_interleave's indices, against the CPU."""
import warnings

import pytest
import torch

import neuron_eager
from checks import NEURON, check_op


def _train(device, steps=6):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 16, growth_interval=2)
    seen = []
    for step in range(steps):
        x = torch.randn(5, 8).to(device)
        if step == 2:
            x[0, 0] = float("inf")  # this step is skipped and the scale backs off
        loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        seen.append((scaler.get_scale(), [p.detach().cpu().clone() for p in model.parameters()]))
    return seen


def test_grad_scaler_steps_skips_and_rescales_like_the_cpu():
    neuron_eager.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GradScaler's own .double() (float64 warning)
        ours = _train("neuron")
    assert neuron_eager.get_fallback_ops() == {}
    for (scale, params), (cpu_scale, cpu_params) in zip(ours, _train("cpu")):
        assert scale == cpu_scale
        for p, q in zip(params, cpu_params):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert [s for s, _ in ours] == [65536.0, 131072.0, 65536.0, 65536.0, 131072.0, 131072.0]


def test_unscale_flags_non_finite_values_before_scaling():
    grads = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, float("nan")]).bfloat16()]
    for device in ("cpu", NEURON):
        gs = [g.clone().to(device) for g in grads]
        found, inv = torch.zeros(1, device=device), torch.full((1,), 0.5, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(gs, found, inv)
        assert found.item() == 1.0 and gs[0].cpu().tolist() == [0.5, 1.0]
    with pytest.raises(RuntimeError, match="found_inf must be a float tensor"):
        torch._amp_foreach_non_finite_check_and_unscale_(
            [grads[0].to(NEURON)], torch.zeros(1, dtype=torch.int32, device=NEURON),
            torch.ones(1, device=NEURON))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_repeat_interleave_by_tensor(dtype):
    check_op(lambda r: torch.repeat_interleave(r), torch.tensor([2, 0, 3, 1], dtype=dtype))
    check_op(lambda x, r: x.repeat_interleave(r, dim=0), torch.randn(4, 3),
             torch.tensor([2, 0, 3, 1], dtype=dtype))
    for bad in (torch.tensor([1, -1]), torch.tensor([[1]]), torch.tensor([1.0])):
        with pytest.raises(Exception) as cpu:
            torch.repeat_interleave(bad)
        with pytest.raises(type(cpu.value), match=str(cpu.value)[:20]):
            torch.repeat_interleave(bad.to(NEURON))
