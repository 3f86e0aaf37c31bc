"""Find the op that goes wrong: every aten op on neuron checked against the CPU as it runs.

    from neuron_eager.debug import check_ops
    with check_ops() as check:          # forward and backward (autograd's thread too)
        loss = model(x).sum(); loss.backward()
    print(check.report())               # the ops whose results left the tolerance, worst first

    with check_ops(raise_first=True):   # stop at the first such op: OpMismatch at its line,
        loss = model(x).sum()           # where pdb's post-mortem shows its inputs

Each op runs as usual on neuron, then once more on CPU copies of its inputs; the outputs
are compared elementwise with |neuron - cpu| <= rtol * |cpu| + atol * max|cpu| (atol is
relative to the output's scale, so tiny values of a large output do not flag). Integer and
bool outputs must match exactly. Sampling ops (rand, dropout, ...) and allocations are run
but not compared. Checking runs every op at once, so under adaptive eager nothing fuses
inside the scope. It costs a CPU run and two copies per op: a tool for a step, not a loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from neuron_eager.ops.sourceline import user_frame

# (rtol, atol as a fraction of the output's largest magnitude) per floating dtype: our fp32
# transcendentals are within a few ulp of torch's and matmuls sum in other orders.
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-4, 1e-5),
              torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 8e-3)}
_UNCOMPARED = ("empty", "new_empty", "_local_scalar_dense", "native_dropout", "bernoulli",
               "normal", "uniform", "rand", "exponential", "geometric", "cauchy",
               "log_normal", "multinomial", "random", "poisson", "_standard_gamma",
               "_sample_dirichlet", "set_", "resize_")


@dataclass
class Finding:
    op: str
    output: int  # which output of the op
    where: tuple[str, int]  # the user's (file, line); autograd's backward has torch's
    excess: float  # the largest amount by which |neuron - cpu| passed its allowance
    scale: float  # max |cpu| of that output
    inputs: list = field(default_factory=list)  # (shape, stride, dtype) or the value
    backward_of: str | None = None  # in backward: the autograd node (its forward op's line
    # is `where`, when check_ops saw that op run)

    def __str__(self) -> str:
        at = f"{self.where[0]}:{self.where[1]}"
        if self.backward_of is not None:
            at = f"{self.backward_of} (backward of the op at {at})" if self.where[1] else \
                f"{self.backward_of} (in backward: run the forward inside check_ops too to " \
                f"see its line)"
        return (f"{self.op} output {self.output} at {at}: off by {self.excess:.3g} beyond "
                f"tolerance (output scale {self.scale:.3g}); inputs {self.inputs}")


class OpMismatch(RuntimeError):
    """An op's neuron result left the tolerance (check_ops(raise_first=True)); `.finding`."""

    def __init__(self, finding: Finding):
        super().__init__(f"neuron result differs from the CPU's: {finding}")
        self.finding = finding


class check_ops(TorchDispatchMode):
    """A scope in which each aten op's neuron result is compared with the CPU's; with
    `raise_first` the first op outside the tolerance raises OpMismatch where it was called
    (its result is computed and dropped; in backward, loss.backward() raises it)."""

    def __init__(self, rtol: float | None = None, atol: float | None = None,
                 raise_first: bool = False):
        super().__init__()
        for name, value in (("rtol", rtol), ("atol", atol)):
            if value is not None and not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"check_ops: {name} must be a number >= 0, not {value!r}")
        self.rtol, self.atol, self.raise_first = rtol, atol, raise_first
        self.checked = 0  # ops compared
        self.findings: list[Finding] = []
        self._raised = 0  # findings already raised (raise_first)
        self._lines = _ForwardLines()

    def __enter__(self):
        self._lines.__enter__()  # (so backward findings can name their forward line)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._lines.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = self._check(func, args, kwargs or {})
        if self.raise_first and len(self.findings) > self._raised:
            self._raised = len(self.findings)
            # raised here, so pdb's post-mortem opens where `func`, `args` and `out` are
            raise OpMismatch(self.findings[-1])
        return out

    def _check(self, func, args, kwargs):
        if not _on_neuron(args, kwargs) or func.__name__.startswith(_UNCOMPARED):
            return func(*args, **kwargs)
        # Copies before the op runs: an in-place op's inputs are gone after it.
        host_args, host_kwargs = tree_map(_to_host, args), tree_map(_to_host, kwargs)
        out = func(*args, **kwargs)
        try:
            with _disable_current_modes():
                expected = func(*host_args, **host_kwargs)
        except Exception:  # noqa: BLE001  an op the CPU does not run: nothing to compare
            return out
        self.checked += 1
        got, want = tree_flatten(out)[0], tree_flatten(expected)[0]
        for i, (a, b) in enumerate(zip(got, want)):
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                self._compare(func, i, a, b, args, kwargs, host_args)
        return out

    def _compare(self, func, index, got, want, args, kwargs, host_args) -> None:
        with _disable_current_modes():
            got = got.detach().cpu()
            want = want.detach()
            if got.shape != want.shape or got.dtype != want.dtype:
                excess, scale = float("inf"), 0.0
            elif not got.dtype.is_floating_point:
                excess = float((got != want).sum())
                scale = 0.0
            else:
                if not want.numel():
                    return
                rtol, atol = TOLERANCES.get(want.dtype, (1e-4, 1e-5))
                rtol = self.rtol if self.rtol is not None else rtol
                atol = self.atol if self.atol is not None else atol
                g, w = got.double(), want.double()
                scale = float(w.abs().nan_to_num(0, 0, 0).max())
                # a reduction's rounding is relative to what it summed: a loss that sums to
                # about 0 must not flag its last bits
                for a in host_args:
                    if isinstance(a, torch.Tensor) and a.numel() > want.numel() and \
                            a.dtype.is_floating_point:
                        scale = max(scale, float(a.double().abs().nan_to_num(0, 0, 0).max()))
                same_nan = g.isnan() & w.isnan()
                allowance = rtol * w.abs() + atol * scale
                over = ((g - w).abs() - allowance).masked_fill(same_nan | (g == w), 0)
                excess = float(over.nan_to_num(float("inf")).max())
        if excess > 0:
            where, node = user_frame(), torch._C._current_autograd_node()
            finding = Finding(str(func), index, where, excess, scale, _describe(args, kwargs))
            if node is not None:  # in backward: the line of the forward op it differentiates
                finding.backward_of = node.name()
                finding.where = node.metadata.get("neuron_where", where)
            self.findings.append(finding)

    def report(self, limit: int = 10) -> str:
        if not self.findings:
            return f"{self.checked} ops checked against the CPU: all within tolerance"
        worst = sorted(self.findings, key=lambda f: -f.excess / (f.scale or 1.0))[:limit]
        lines = [f"{self.checked} ops checked against the CPU, {len(self.findings)} outputs "
                 f"outside tolerance; the worst {len(worst)} (relative to their scale):"]
        lines += [f"  {f}" for f in worst]
        return "\n".join(lines)


class _ForwardLines(TorchFunctionMode):
    """Tags each autograd node made in scope with the user's line that made it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.grad_fn is not None and \
                    "neuron_where" not in t.grad_fn.metadata:
                t.grad_fn.metadata["neuron_where"] = user_frame()
        return out


def _on_neuron(args, kwargs) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "neuron"
               for a in tree_flatten((args, kwargs))[0])


def _to_host(value):
    if isinstance(value, torch.Tensor) and value.device.type == "neuron":
        with _disable_current_modes():
            return value.detach().cpu().clone()
    if isinstance(value, torch.device) and value.type == "neuron":
        return torch.device("cpu")
    return value


def _describe(args, kwargs) -> list:
    return [(tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
            for a in tree_flatten((args, kwargs))[0]]
