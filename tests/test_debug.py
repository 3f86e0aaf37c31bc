"""neuron_eager.debug.check_ops: each op's neuron result against the CPU's."""
import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from neuron_eager import debug
from checks import corrupt


def _model_step(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.GELU(), torch.nn.Flatten(), torch.nn.Linear(144, 5))
    model.to(device)
    x = torch.randn(2, 3, 8, 8).to(device)
    target = torch.tensor([1, 3]).to(device)
    F.cross_entropy(model(x), target).backward()


def test_a_correct_step_has_no_findings_and_backward_ops_are_checked(monkeypatch):
    seen = []
    monkeypatch.setattr(debug.check_ops, "_compare",
                        lambda self, func, *rest, _orig=debug.check_ops._compare:
                        (seen.append(func.__name__.split(".")[0]), _orig(self, func, *rest))[1])
    with debug.check_ops() as check:
        _model_step("neuron")
    assert check.findings == [], check.report()
    assert "all within tolerance" in check.report()
    # the backward ops run on autograd's thread and are checked too
    assert {"convolution_backward", "native_batch_norm_backward", "mm"} <= set(seen)


def test_a_wrong_kernel_is_found_at_the_users_line(monkeypatch):
    corrupt(monkeypatch, torch.ops.aten.mul.Tensor, shift=1e-3)
    x = torch.linspace(-2, 2, 50).to("neuron")
    with debug.check_ops() as check:
        y = x * x  # the line the finding must name
        z = y + 1
    line = next(n for n, text in enumerate(open(__file__), 1) if "y = x * x  # the line" in text)
    assert [f.op for f in check.findings] == ["aten.mul.Tensor"]
    assert check.findings[0].where[1] == line
    assert check.findings[0].where[0] == __file__
    assert "aten.mul.Tensor" in check.report()
    # the op's own result is returned unchanged: checking does not mend it
    torch.testing.assert_close(z.cpu(), x.cpu() * x.cpu() + 1e-3 + 1)


def test_raise_first_stops_at_the_wrong_op(monkeypatch):
    import pytest

    corrupt(monkeypatch, torch.ops.aten.exp.default, scale=1.01)
    x = torch.linspace(-2, 2, 50).to("neuron")
    ran = []
    with pytest.raises(debug.OpMismatch, match="aten.exp.default") as caught:
        with debug.check_ops(raise_first=True) as check:
            y = (x * 2).exp()
            ran.append(y)  # not reached
    assert ran == [] and len(check.findings) == 1
    assert caught.value.finding is check.findings[0]
    line = next(n for n, text in enumerate(open(__file__), 1) if "y = (x * 2).exp()" in text)
    assert caught.value.finding.where == (__file__, line)
    assert any(entry.lineno + 1 == line for entry in caught.traceback)  # raised at that line


def test_integer_results_must_match_exactly_and_tolerance_is_settable():
    x = torch.tensor([1.0, 2.0, 3.0]).to("neuron")
    with debug.check_ops(rtol=0.0, atol=0.0) as check:
        (x.exp() > 2).sum()
        x.exp()
    assert check.checked >= 3
    # exp is within a few ulp, not bit-exact with torch's: zero tolerance may flag it, but
    # the comparison and the sum are integers and exact
    assert all(f.op.startswith("aten.exp") for f in check.findings)


def test_a_wrong_backward_op_is_found_at_its_forward_line(monkeypatch):
    corrupt(monkeypatch, torch.ops.aten.tanh_backward.default, scale=1.01)
    x = torch.linspace(-2, 2, 50).to("neuron").requires_grad_()
    with debug.check_ops() as check:
        y = x.tanh()  # the line the backward finding must name
        y.sum().backward()
    line = next(n for n, text in enumerate(open(__file__), 1) if "y = x.tanh()  # the" in text)
    (finding,) = check.findings
    assert finding.op == "aten.tanh_backward.default" and finding.backward_of == "TanhBackward0"
    assert finding.where == (__file__, line)
    assert f"backward of the op at {__file__}:{line}" in str(finding)


def test_bad_tolerances_and_explain_arguments_are_refused():
    for kwargs in (dict(rtol=-1), dict(atol="1e-3")):
        with pytest.raises(ValueError, match="must be a number >= 0"):
            debug.check_ops(**kwargs)
    with pytest.raises(TypeError, match="number of regions"):
        neuron_eager.adaptive.explain("x")
