"""Fused optimizer steps (ops/optim.py) against the CPU's fused kernels."""
import warnings

import pytest
import torch

import neuron_eager

CASES = [
    (torch.optim.Adam, dict(lr=0.01)),
    (torch.optim.Adam, dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
    (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    (torch.optim.AdamW, dict(lr=torch.tensor(0.01), maximize=True)),
    (torch.optim.SGD, dict(lr=0.1)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, maximize=True)),
    (torch.optim.Adagrad, dict(lr=0.1)),
    (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, maximize=True)),
    (torch.optim.Adagrad, dict(lr=torch.tensor(0.1))),
]


def _train(device, cls, kwargs, scaler, steps=4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3)).to(device)
    opt = cls(model.parameters(), fused=True, **kwargs)
    grad_scaler = torch.amp.GradScaler(device, init_scale=1024.0) if scaler else None
    for step in range(steps):
        x = torch.randn(5, 6).to(device)
        if scaler and step == 1:
            x[0, 0] = float("inf")  # found_inf: this step is skipped
        loss = model(x).pow(2).mean()
        if grad_scaler is not None:
            grad_scaler.scale(loss).backward()
            grad_scaler.step(opt)
            grad_scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad()
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("scaler", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_optimizers_match_the_cpu(case, scaler):
    cls, kwargs = CASES[case]
    neuron_eager.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GradScaler's own .double() (float64 warning)
        ours = _train("neuron", cls, kwargs, scaler)
    assert neuron_eager.get_fallback_ops() == {}
    for p, q in zip(ours, _train("cpu", cls, kwargs, scaler)):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_fused_steps_on_16_bit_parameters_keep_fp32_intermediates(cls, dtype):
    # as the CPU's fused kernels: rounding each stage to fp16 underflowed the second
    # moment (tiny gradients gave -inf updates)
    results = []
    for device in ("cpu", "neuron"):
        torch.manual_seed(0)
        p = torch.randn(512).to(dtype).to(device).requires_grad_()
        opt = cls([p], lr=0.01, fused=True, amsgrad=True)
        g = torch.Generator().manual_seed(1)
        for _ in range(4):
            p.grad = (torch.randn(512, generator=g) * 1e-3).to(dtype).to(device)
            opt.step()
        results.append(p.detach().cpu())
    assert torch.isfinite(results[1]).all()
    ulp = torch.finfo(dtype).eps * results[0].abs().float().clamp_min(1)
    assert ((results[1].float() - results[0].float()).abs() <= ulp).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_sgd_on_16_bit_parameters_rounds_once(dtype):
    # the CPU's fused SGD keeps its intermediates in fp32 and rounds each stored tensor once;
    # on tensors of 15 elements it runs its scalar loop, whose 16-bit path is the reference
    # (its vector loop reads a bf16 momentum buffer as fp32)
    results = []
    for device in ("cpu", "neuron"):
        g = torch.Generator().manual_seed(0)
        params = [torch.randn(15, generator=g).to(dtype).to(device).requires_grad_()
                  for _ in range(8)]
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                              fused=True)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(15, generator=g).to(dtype).to(device)
            opt.step()
        results.append(torch.cat([p.detach().cpu() for p in params] +
                                 [opt.state[p]["momentum_buffer"].cpu() for p in params]))
    assert torch.equal(results[1], results[0])
