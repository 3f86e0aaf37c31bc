"""The aten._foreach_* ops (what torch.optim's foreach paths and clip_grad_norm_ call).

An elementwise one over contiguous tensors is one multi-tensor launch
(multitensor.run). Otherwise each loops the per-tensor kernel over its
lists: the registered kernel is called directly (no second trip through the
dispatcher); an op without one goes through the router like any other call.
In-place forms use the per-tensor in-place op where one exists, else compute
and copy back.
"""
from __future__ import annotations

import torch

from neuron_eager.ops import elementwise as E
from neuron_eager.ops import folds
from neuron_eager.ops import multitensor
from neuron_eager.ops.registry import KERNELS, register

aten = torch.ops.aten


# Set by adaptive eager while a foreach op's per-tensor ops are recorded (Note [Foreach in
# adaptive eager]): adaptive/recording.per_tensor.
per_tensor = None


def call(op, *args, **kwargs):
    """Run one per-tensor aten op: its registered kernel if any, else through dispatch."""
    if per_tensor is not None:
        return per_tensor(op, args, kwargs)
    return direct(op, args, kwargs)


def direct(op, args, kwargs):
    """`call` without the adaptive hook."""
    kernel = KERNELS.get(op)
    return kernel(*args, **kwargs) if kernel is not None else op(*args, **kwargs)


# Elements per tensor from which adaptive eager records a foreach op's per-tensor steps, to
# fuse them with the ops around it, instead of one multi-tensor launch (Note [Foreach in
# adaptive eager]).
RECORD_MIN = 1 << 16


def records(args) -> bool:
    """Whether adaptive eager records the per-tensor steps of a foreach op with these
    arguments (its first tensor list decides; recording.dispatch asks, once per op)."""
    for tensors in args:
        if type(tensors) is list or type(tensors) is tuple:
            return sum(t.numel() for t in tensors) >= RECORD_MIN * max(len(tensors), 1)
    return True


# Note [Foreach in adaptive eager]
# Recording a per-tensor step costs several microseconds of Python, more than running it on
# a small tensor; fusing pays when a step's pass over memory costs more than that. So a
# foreach op over small tensors (an optimizer step of a small model) runs as one
# multi-tensor launch in adaptive eager too, after the pending ops it reads, and over large
# tensors its steps are recorded and fuse into one pass (with those of the ops around it).


def _many(func, rows) -> list | None:
    """The per-tensor calls `rows` ((args, kwargs) of `func` each) as one multi-tensor launch
    (ops/multitensor.py); None when they must run one by one:
    not an elementwise op, a call off its fast path, or adaptive eager records them."""
    if per_tensor is not None:
        return None
    plan = E.FUSIBLE_INPLACE.get(func)
    inplace = plan is not None
    if not inplace:
        plan = E.FUSIBLE.get(func)
        if plan is None:
            return None
    return multitensor.run(plan, rows, inplace)


def _check(*lists):
    if not lists[0]:
        raise RuntimeError("Tensor list must have at least one tensor.")
    for other in lists[1:]:
        if len(other) != len(lists[0]):
            raise RuntimeError(f"Tensor lists must have the same number of tensors, got "
                               f"{len(lists[0])} and {len(other)}")


def _write(dst, result):
    call(aten.copy_.default, dst, result)


def _inplace(functional, inplace):
    """Per-tensor in-place step: the in-place op, or functional + copy when there is none."""
    if inplace is not None:
        return lambda *args, **kwargs: call(inplace, *args, **kwargs)

    def step(dst, *args, **kwargs):
        result = call(functional, dst, *args, **kwargs)
        E.check_castable(result.dtype, dst.dtype)  # (the CPU's error, dst unchanged)
        _write(dst, result)

    return step


# -- unary ---------------------------------------------------------------------------------
_UNARY = ["abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1",
          "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal",
          "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc"]


def _unary(name):
    functional, inplace = getattr(aten, name).default, getattr(aten, name + "_").default
    step = _inplace(functional, inplace)

    @register(getattr(aten, "_foreach_" + name).default)
    def foreach(tensors):
        _check(tensors)
        return _many(functional, [((t,), {}) for t in tensors]) or \
            [call(functional, t) for t in tensors]

    @register(getattr(aten, f"_foreach_{name}_").default)
    def foreach_(tensors):
        _check(tensors)
        if _many(inplace, [((t,), {}) for t in tensors]) is None:
            for t in tensors:
                step(t)


for _name in _UNARY:
    _unary(_name)


# -- binary: overload kind -> (per-tensor functional, per-tensor in-place) -------------------
def _ops(name, scalar, tensor):
    f, i = getattr(aten, name), getattr(aten, name + "_")
    return {"Scalar": (getattr(f, scalar), getattr(i, scalar)),
            "ScalarList": (getattr(f, scalar), getattr(i, scalar)),
            "List": (getattr(f, tensor), getattr(i, tensor)),
            "Tensor": (getattr(f, tensor), getattr(i, tensor))}


_BINARY = {
    "add": _ops("add", "Scalar", "Tensor"),
    "sub": _ops("sub", "Scalar", "Tensor"),
    "mul": _ops("mul", "Scalar", "Tensor"),
    "div": _ops("div", "Scalar", "Tensor"),
    "clamp_min": _ops("clamp_min", "default", "Tensor"),
    "clamp_max": _ops("clamp_max", "default", "Tensor"),
    # maximum/minimum with a scalar are clamps; with tensors there is no in-place aten op
    "maximum": {"Scalar": (aten.clamp_min.default, aten.clamp_min_.default),
                "ScalarList": (aten.clamp_min.default, aten.clamp_min_.default),
                "List": (aten.maximum.default, None)},
    "minimum": {"Scalar": (aten.clamp_max.default, aten.clamp_max_.default),
                "ScalarList": (aten.clamp_max.default, aten.clamp_max_.default),
                "List": (aten.minimum.default, None)},
    "pow": {"Scalar": (aten.pow.Tensor_Scalar, aten.pow_.Scalar),
            "ScalarList": (aten.pow.Tensor_Scalar, aten.pow_.Scalar),
            "List": (aten.pow.Tensor_Tensor, aten.pow_.Tensor)},
}


def _operand(kind, other, i):
    """The second operand for tensor i: a list entry, or one scalar / tensor for all."""
    return other[i] if kind in ("List", "ScalarList") else other


def _check_other(kind, other) -> None:
    if kind == "Tensor" and other.dim() != 0:  # (one scalar for all, as a tensor)
        raise RuntimeError(f"scalar tensor expected to be 0 dim but it has {other.dim()} "
                           f"dimensions and {other.numel()} elements.")


def _binary(name, kind, functional, inplace):
    step = _inplace(functional, inplace)

    @register(getattr(getattr(aten, "_foreach_" + name), kind))
    def foreach(tensors, other, **kwargs):
        _check(tensors, *([other] if kind in ("List", "ScalarList") else []))
        _check_other(kind, other)
        rows = [((t, _operand(kind, other, i)), kwargs) for i, t in enumerate(tensors)]
        return _many(functional, rows) or \
            [call(functional, *a, **kwargs) for a, _ in rows]

    @register(getattr(getattr(aten, f"_foreach_{name}_"), kind))
    def foreach_(tensors, other, **kwargs):
        _check(tensors, *([other] if kind in ("List", "ScalarList") else []))
        _check_other(kind, other)
        rows = [((t, _operand(kind, other, i)), kwargs) for i, t in enumerate(tensors)]
        if inplace is None or _many(inplace, rows) is None:
            for a, _ in rows:
                step(*a, **kwargs)


for _name, _kinds in _BINARY.items():
    for _kind, (_functional, _inplace_op) in _kinds.items():
        if _kind in getattr(aten, "_foreach_" + _name).overloads():
            _binary(_name, _kind, _functional, _inplace_op)


@register(aten._foreach_pow.ScalarAndTensor)
def foreach_pow_scalar_and_tensor(base, exponents):
    _check(exponents)
    return [call(aten.pow.Scalar, base, e) for e in exponents]


# -- ternary: addcmul, addcdiv, lerp ----------------------------------------------------------
def _scalars(kind, value, n):
    if kind == "Tensor":  # a 1-D tensor of n scalars (usually on the host)
        if value.dim() != 1 or value.numel() != n:
            raise RuntimeError(f"Expected length of scalars to match input of length {n} but "
                               f"got {value.numel()} instead.")
        return value.tolist()
    if kind == "ScalarList":
        if len(value) != n:
            raise RuntimeError(f"Tensor list must have same number of elements as scalar list, "
                               f"got {n} and {len(value)}")
        return list(value)
    return [value] * n


def _addc_rows(tensors, tensors1, tensors2, values) -> list:
    shared = {"value": values[0]}  # (one dict for one value: multitensor.run sees it at once)
    return [((t, a, b), shared if v is values[0] else {"value": v})
            for t, a, b, v in zip(tensors, tensors1, tensors2, values)]


def _addc(name):
    functional = getattr(aten, name).default
    inplace = getattr(aten, name + "_").default
    for kind in ("Scalar", "ScalarList", "Tensor"):
        def foreach(tensors, tensors1, tensors2, value=1, _kind=kind):
            _check(tensors, tensors1, tensors2)
            rows = _addc_rows(tensors, tensors1, tensors2, _scalars(_kind, value, len(tensors)))
            return _many(functional, rows) or \
                [call(functional, *a, **kw) for a, kw in rows]

        def foreach_(tensors, tensors1, tensors2, value=1, _kind=kind):
            _check(tensors, tensors1, tensors2)
            rows = _addc_rows(tensors, tensors1, tensors2, _scalars(_kind, value, len(tensors)))
            if _many(inplace, rows) is None:
                for a, kw in rows:
                    call(inplace, *a, **kw)

        register(getattr(getattr(aten, "_foreach_" + name), kind))(foreach)
        register(getattr(getattr(aten, f"_foreach_{name}_"), kind))(foreach_)


_addc("addcmul")
_addc("addcdiv")


def _weights(kind, weight, i):
    return weight[i] if kind in ("List", "ScalarList") else weight


for _kind, _ops_pair in {"List": (aten.lerp.Tensor, aten.lerp_.Tensor),
                         "Scalar": (aten.lerp.Scalar, aten.lerp_.Scalar),
                         "ScalarList": (aten.lerp.Scalar, aten.lerp_.Scalar)}.items():
    def _lerp(tensors, ends, weight, _kind=_kind, _op=_ops_pair[0]):
        _check(tensors, ends, *([weight] if _kind != "Scalar" else []))
        rows = [((t, e, _weights(_kind, weight, i)), {}) for i, (t, e) in
                enumerate(zip(tensors, ends))]
        return _many(_op, rows) or [call(_op, *a) for a, _ in rows]

    def _lerp_(tensors, ends, weight, _kind=_kind, _op=_ops_pair[1]):
        _check(tensors, ends, *([weight] if _kind != "Scalar" else []))
        rows = [((t, e, _weights(_kind, weight, i)), {}) for i, (t, e) in
                enumerate(zip(tensors, ends))]
        if _many(_op, rows) is None:
            for a, _ in rows:
                call(_op, *a)

    register(getattr(aten._foreach_lerp, _kind))(_lerp)
    register(getattr(aten._foreach_lerp_, _kind))(_lerp_)


# -- reductions, copies, fills ----------------------------------------------------------------
@register(aten._foreach_norm.Scalar)
def foreach_norm(tensors, ord=2, dtype=None):
    _check(tensors)
    if ord == float("inf") and any(t.numel() == 0 for t in tensors):
        raise RuntimeError("_foreach_norm cannot compute the infinity norm on an empty tensor "
                           "because the operation does not have an identity")  # (the CPU's)
    return (dtype is None and per_tensor is None and folds.norms_of(tensors, ord)) or \
        [call(aten.linalg_vector_norm.default, t, ord, dtype=dtype) for t in tensors]


@register(aten._foreach_max.default)
def foreach_max(tensors):
    _check(tensors)
    return [call(aten.max.default, t) for t in tensors]


@register(aten._foreach_copy_.default)
def foreach_copy_(tensors, src, non_blocking=False):
    _check(tensors, src)
    for t, s in zip(tensors, src):
        call(aten.copy_.default, t, s)


@register(aten._foreach_zero_.default)
def foreach_zero_(tensors):
    _check(tensors)
    for t in tensors:
        call(aten.zero_.default, t)


@register(aten._foreach_clone.default)
def foreach_clone(tensors, *, memory_format=None):
    _check(tensors)
    return [call(aten.clone.default, t, memory_format=memory_format) for t in tensors]


# The foreach kernels of this module: each reaches memory only through `call`, or through
# `_many` when adaptive eager does not record it (and has run the pending ops first).
FOREACH_KERNELS = frozenset(op for op in KERNELS if op.name().startswith("aten::_foreach_"))
