"""Errors raised inside autograd's backward on neuron reach backward()'s caller with their own
type and message (Note [Errors on autograd's thread] in
ops/backward_errors.py): before, the process aborted."""
import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from neuron_eager import debug
from neuron_eager.ops import tensor as tensor_module
from checks import corrupt, outcome

NEURON = "neuron"


def _failing(monkeypatch, op, error):
    real = tensor_module._dispatcher

    def dispatcher(func, args, kwargs):
        if func is op:
            raise error
        return real(func, args, kwargs)

    monkeypatch.setattr(tensor_module, "_dispatcher", dispatcher)


def test_an_op_error_in_backward_is_raised_by_backward(monkeypatch):
    x = torch.randn(8, device=NEURON, requires_grad=True)
    loss = x.tanh().sum()
    _failing(monkeypatch, torch.ops.aten.tanh_backward.default,
             neuron_eager.NeuronOutOfMemoryError("simulated HBM is full"))
    with pytest.raises(neuron_eager.NeuronOutOfMemoryError, match="simulated HBM is full"):
        loss.backward()
    with pytest.raises(neuron_eager.NeuronOutOfMemoryError):
        torch.autograd.grad(x.tanh().sum(), x)
    monkeypatch.undo()  # the device still works, and so does backward
    x.tanh().sum().backward()
    torch.testing.assert_close(x.grad.cpu(), 1 - x.detach().cpu().tanh() ** 2)


def test_a_custom_backward_catches_an_op_error_as_raised(monkeypatch):
    class Guarded(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            try:
                return g.tanh()
            except ValueError:  # (as raised: it was a RuntimeError naming it)
                return g * 2

    x = torch.randn(4, device=NEURON, requires_grad=True)
    _failing(monkeypatch, torch.ops.aten.tanh.default, ValueError("refused"))
    Guarded.apply(x).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((4,), 2.0))


def test_an_error_of_an_op_with_several_results(monkeypatch):
    x = torch.randn(4, 8, device=NEURON, requires_grad=True)
    loss = F.layer_norm(x, (8,)).sum()
    _failing(monkeypatch, torch.ops.aten.native_layer_norm_backward.default,
             ValueError("refused"))
    with pytest.raises(ValueError, match="refused"):
        loss.backward()


@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_hooks_that_raise_in_backward(device):
    x = torch.randn(5, device=device, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: (_ for _ in ()).throw(KeyError("tensor hook")))
    with pytest.raises(KeyError, match="tensor hook"):
        y.sum().backward()
    p = torch.randn(3, device=device, requires_grad=True)
    p.register_post_accumulate_grad_hook(lambda t: (_ for _ in ()).throw(ValueError("post")))
    with pytest.raises(ValueError, match="post"):
        (p * p).sum().backward()
    for register in ("register_full_backward_hook", "register_full_backward_pre_hook"):
        m = torch.nn.Linear(3, 2).to(device)
        getattr(m, register)(lambda *a: (_ for _ in ()).throw(RuntimeError(register)))
        with pytest.raises(RuntimeError, match=register):
            m(torch.randn(4, 3, device=device, requires_grad=True)).sum().backward()


@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_module_hooks_returning_too_many_gradients(device):
    # a tensor instead of a tuple: torch's own check after the hook raises, which aborted
    # the process on neuron (Note [Errors on autograd's thread])
    for register, words in (("register_full_backward_hook", "grad_input, got 4"),
                            ("register_full_backward_pre_hook", "grad_output, got 4")):
        m = torch.nn.Linear(3, 2).to(device)
        getattr(m, register)(lambda mod, *grads: grads[-1][0] * 1)
        with pytest.raises(RuntimeError, match=f"invalid number of {words}, but expected 1"):
            m(torch.randn(4, 3, device=device, requires_grad=True)).sum().backward()


def _legacy_hook_raises(device):
    m = torch.nn.Linear(3, 3).to(device)
    m.register_backward_hook(lambda *a: (_ for _ in ()).throw(ValueError("legacy")))
    m(torch.randn(2, 3, device=device, requires_grad=True)).sum().backward()


def _hook_returns(register, value):
    def program(device):
        x = torch.randn(3, device=device, requires_grad=True)
        if register in ("register_hook", "register_post_accumulate_grad_hook"):
            getattr(x, register)(lambda *a: value)
            (x * 2).sum().backward()
        else:
            m = torch.nn.Linear(3, 3).to(device)
            getattr(m, register)(lambda *a: value)
            m(x).sum().backward()
    return program


def _warning_as_error_in_a_module_hook(device):
    # (a full backward hook on a module whose input needs no gradient makes torch warn there)
    import warnings

    m = torch.nn.Linear(3, 3).to(device)
    m.register_full_backward_hook(lambda *a: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(torch.randn(2, 3, device=device)).sum().backward()


@pytest.mark.parametrize("program", [
    _legacy_hook_raises, _hook_returns("register_hook", (1,)),
    _hook_returns("register_post_accumulate_grad_hook", 1),
    _hook_returns("register_full_backward_pre_hook", (7,)),
    _hook_returns("register_full_backward_hook", ("a",)),
    _warning_as_error_in_a_module_hook], ids=lambda f: getattr(f, "__name__", "returns"))
def test_hook_errors_and_refused_results_raise_as_on_cpu(program):
    # each aborted the process on neuron (Note [Errors on autograd's thread])
    want = outcome(program, "cpu")
    assert want is not None
    assert outcome(program, NEURON) == want


def _node_hook(register, result, node=lambda y, x: y.grad_fn):
    def program(device):
        x = torch.randn(3, device=device, requires_grad=True)
        y = (x * 2).sum()
        getattr(node(y, x), register)(lambda *a: result(a))
        y.backward()
        return x.grad
    program.__name__ = register
    return program


def _raise(error):
    def hook_body(args):
        raise error
    return hook_body


@pytest.mark.parametrize("program", [
    _node_hook("register_hook", _raise(ValueError("post hook"))),
    _node_hook("register_prehook", _raise(KeyError("pre hook"))),
    _node_hook("register_hook", lambda args: 5),  # (torch's own check of the result)
    _node_hook("register_prehook", lambda args: ("a",)),
    _node_hook("register_hook", _raise(ValueError("leaf")),  # an AccumulateGrad node
               lambda y, x: y.grad_fn.next_functions[0][0].next_functions[0][0]),
    _node_hook("register_hook", lambda args: None)], ids=lambda f: f.__name__)
def test_hooks_on_autograd_nodes_raise_as_on_cpu(program):
    # each but the last aborted the process (Note [An exception pending in the device guard]
    # in ops/_compat.py)
    assert_same = torch.testing.assert_close
    want, got = outcome(program, "cpu"), outcome(program, NEURON)
    if isinstance(want, torch.Tensor):
        assert_same(got, want)
    else:
        assert got == want
    test_hooks_that_do_not_raise_still_change_gradients()  # (the device still works)


def test_hooks_that_do_not_raise_still_change_gradients():
    x = torch.randn(5, device=NEURON, requires_grad=True)
    x.register_hook(lambda g: g * 3)
    (x * 1).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((5,), 3.0))
    m = torch.nn.Linear(3, 2).to(NEURON)
    m.register_full_backward_hook(lambda mod, gi, go: (gi[0] * 0,))
    inp = torch.randn(4, 3, device=NEURON, requires_grad=True)
    m(inp).sum().backward()
    assert inp.grad.abs().sum().item() == 0


def test_check_ops_raise_first_in_backward(monkeypatch):
    corrupt(monkeypatch, torch.ops.aten.tanh_backward.default, scale=1.01)
    x = torch.randn(10, device=NEURON, requires_grad=True)
    with pytest.raises(debug.OpMismatch, match="tanh_backward"):
        with debug.check_ops(raise_first=True):
            x.tanh().sum().backward()


def test_an_op_failing_in_checkpoints_recomputation(monkeypatch):
    from torch.utils.checkpoint import checkpoint

    x = torch.randn(6, device=NEURON, requires_grad=True)
    for reentrant in (False, True):
        loss = checkpoint(lambda t: (t * 3).sin(), x, use_reentrant=reentrant).sum()
        _failing(monkeypatch, torch.ops.aten.mul.Tensor, ValueError("refused in recompute"))
        with pytest.raises(ValueError, match="refused in recompute"):
            loss.backward()
        monkeypatch.undo()


@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_an_unpack_hook_that_raises(device):
    x = torch.randn(3, device=device, requires_grad=True)

    def unpack(t):
        raise KeyError("unpack hook")

    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        loss = (x * x).sum()
    with pytest.raises(KeyError, match="unpack hook"):
        loss.backward()
    with torch.autograd.graph.save_on_cpu():  # a working pair of hooks still works
        loss = (x * x).sum()
    loss.backward()
    torch.testing.assert_close(x.grad.cpu(), 2 * x.detach().cpu())


def test_an_error_in_double_backward(monkeypatch):
    x = torch.randn(6, device=NEURON, requires_grad=True)
    (g,) = torch.autograd.grad((x.tanh() ** 2).sum(), x, create_graph=True)
    _failing(monkeypatch, torch.ops.aten.tanh_backward.default, ValueError("second order"))
    with pytest.raises(ValueError, match="second order"):
        g.sum().backward()


class _CpuGradient(torch.autograd.Function):
    """A user's bug: backward moves the gradient of `b` off its device."""

    @staticmethod
    def forward(ctx, a, k, b):
        return a * k + b

    @staticmethod
    def backward(ctx, g):
        return g * 2, None, g.cpu()


def test_gradients_on_another_device_raise_at_their_source():
    # the engine's check, which it skips for Python subclasses (Note [Gradients on another
    # device]); before, the leaves got a CPU .grad and optimizer.step() raised
    x = torch.randn(3, device=NEURON, requires_grad=True)
    with pytest.raises(RuntimeError, match="expected device neuron:0 but got cpu"):
        x.view(3).backward(torch.ones(3))
    with pytest.raises(RuntimeError, match="invalid gradient at index 1"):
        torch.autograd.grad([x.sum(), x * 1], x, [None, torch.ones(3)])
    b = torch.randn(3, device=NEURON, requires_grad=True)
    with pytest.raises(RuntimeError, match="returned an invalid gradient at index 2"):
        _CpuGradient.apply(x, 2, b).sum().backward()
    assert x.grad is None and b.grad is None
    (x * 3).sum().backward(torch.tensor(2.))  # a 0-dim CPU gradient is a scalar, as on CUDA
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 6.))


def test_a_backward_makes_the_exit_wait_for_autograds_thread():
    # Note [Exit after backward]: without the wait, about 1 exit in 10 after a backward on
    # neuron aborted (SIGABRT) under load, after the script had printed its results
    from neuron_eager.ops import backward_errors
    backward_errors._exit_wait.clear()  # (a second wait at this process's exit: harmless)
    w = torch.ones(3, device="neuron", requires_grad=True)
    (w * 2).sum().backward()
    assert backward_errors._exit_wait


@pytest.mark.parametrize("where", ["op", "hook"])
def test_a_failed_backward_frees_its_graph_without_the_garbage_collector(where, monkeypatch):
    """The usual "catch the out-of-memory error, free, retry": the re-raised error must not
    stay in a reference cycle with the frame that raised it (the cycle held the failed
    step's activations, and their HBM, until the garbage collector ran)."""
    import gc

    x = torch.randn(64, 64, device=NEURON, requires_grad=True)

    def step():
        h = x
        for _ in range(4):
            h = (h * 1.01).tanh()
        if where == "hook":
            h.register_hook(lambda g: (_ for _ in ()).throw(RuntimeError("boom")))
        h.sum().backward()

    if where == "op":  # (a new error each time: one kept by the test would hold its frames)
        real = tensor_module._dispatcher

        def dispatcher(func, args, kwargs):
            if func is torch.ops.aten.tanh_backward.default:
                raise RuntimeError("boom")
            return real(func, args, kwargs)
        monkeypatch.setattr(tensor_module, "_dispatcher", dispatcher)
    gc.collect()
    gc.disable()
    try:
        before = torch.neuron.memory_allocated()
        try:
            step()
        except RuntimeError as e:
            assert "boom" in str(e)
        else:
            pytest.fail("backward did not raise")
        x.grad = None
        assert torch.neuron.memory_allocated() == before
    finally:
        gc.enable()
