"""Compare an op on neuron against the same op on the CPU.

`check_op(fn, *args)` runs `fn` on CPU inputs and on neuron copies of them,
compares outputs (and, with `grad=True`, input gradients) with
`torch.testing.assert_close` at tolerances suited to the dtype, and by default
asserts that nothing fell back to the CPU.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map

import neuron_eager
from neuron_eager.ops import router
from neuron_eager.ops.registry import KERNELS

NEURON = torch.device("neuron")
# (rtol, atol) per dtype: Trainium computes 16-bit floats in fp32 and rounds once.
TOLERANCES = {
    torch.float32: (1.3e-6 * 4, 1e-5),
    torch.float64: (1.3e-6 * 4, 1e-5),  # computed in float32 on neuron
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
}


def to_neuron(tree):
    def move(x):
        if isinstance(x, torch.Tensor):
            y = x.detach().to(NEURON)
            return y.requires_grad_(x.requires_grad)
        return x

    return tree_map(move, tree)


def to_cpu(tree):
    return tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, tree)


def assert_close(actual, expected, rtol=None, atol=None, msg=""):
    """Compare a neuron result (any pytree) to a CPU result."""
    a_leaves, _ = tree_flatten(actual)
    e_leaves, _ = tree_flatten(expected)
    assert len(a_leaves) == len(e_leaves), f"{msg}: {len(a_leaves)} outputs vs {len(e_leaves)}"
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{msg}: expected a tensor, got {type(a)}"
            assert a.device.type == "neuron", f"{msg}: result on {a.device}, not neuron"
            r, t = TOLERANCES.get(e.dtype, (0, 0))
            torch.testing.assert_close(a.cpu(), e, rtol=rtol if rtol is not None else r,
                                       atol=atol if atol is not None else t, equal_nan=True,
                                       msg=lambda m: f"{msg}: {m}")
        else:
            assert a == e or (a != a and e != e), f"{msg}: {a!r} != {e!r}"


def _upcast(x):
    if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16):
        return x.detach().float().requires_grad_(x.requires_grad)
    return x


def _rounded_like(value, like):
    return value.to(like.dtype) if isinstance(value, torch.Tensor) else value


def check_op(fn, *args, grad=False, native=True, rtol=None, atol=None, fp32_reference=False,
             **kwargs):
    """Run fn(*args, **kwargs) on CPU and on neuron and compare; returns the neuron result.

    fp32_reference: the CPU computes 16-bit inputs in float32 and rounds the results once,
    as Trainium does. For ops whose CPU kernels use lower internal precision on some
    machines (bf16 convolutions without AVX-512 BF16), the CPU's own 16-bit result is no
    reference."""
    cpu_args = tree_map(lambda x: x.detach().clone().requires_grad_(x.requires_grad)
                        if isinstance(x, torch.Tensor) else x, args)
    dev_args = to_neuron(cpu_args)
    ref_args = tree_map(_upcast, cpu_args) if fp32_reference else cpu_args
    neuron_eager.clear_op_tracking()
    expected = fn(*ref_args, **kwargs)
    actual = fn(*dev_args, **to_neuron(kwargs))
    expected_rounded = tree_map(_rounded_like, expected, actual) if fp32_reference else expected
    assert_close(actual, expected_rounded, rtol, atol, msg=getattr(fn, "__name__", "op"))
    if grad:
        outs = [o for o in tree_flatten(expected)[0]
                if isinstance(o, torch.Tensor) and o.requires_grad]
        douts = [o for o in tree_flatten(actual)[0]
                 if isinstance(o, torch.Tensor) and o.requires_grad]
        seeds = [torch.randn_like(o, dtype=d.dtype) for o, d in zip(outs, douts)]
        torch.autograd.backward(outs, [s.to(o.dtype) for s, o in zip(seeds, outs)])
        torch.autograd.backward(douts, [s.to(NEURON) for s in seeds])
        for c, r, d in zip(tree_flatten(cpu_args)[0], tree_flatten(ref_args)[0],
                           tree_flatten(dev_args)[0]):
            if isinstance(c, torch.Tensor) and c.requires_grad:
                assert d.grad is not None, "no gradient reached the neuron input"
                assert_close(d.grad, r.grad.to(c.dtype), rtol, atol, msg="grad")
    if native:
        assert neuron_eager.get_fallback_ops() == {}, \
            f"fell back to CPU: {neuron_eager.get_fallback_ops()}"
    return actual


@contextlib.contextmanager
def without_kernel(op):
    """Hide `op`'s kernel from the router: it (and the in-place/out= forms derived from it)
    falls back to the CPU. Every op has a kernel or decomposition, so tests make their own
    fallback example this way."""
    kernel = KERNELS.pop(op)
    router._entries.clear()
    router._plans.clear()
    try:
        yield
    finally:
        KERNELS[op] = kernel
        router._entries.clear()
        router._plans.clear()


def corrupt(monkeypatch, op, *, scale=1.0, shift=0.0):
    """A planted kernel bug for the checkers' tests: the neuron result of `op` comes back as
    result * scale + shift (computed on the device; `monkeypatch` undoes it)."""
    from neuron_eager.ops import tensor as tensor_module

    real = tensor_module._dispatcher
    aten = torch.ops.aten

    def dispatcher(func, args, kwargs):
        out = real(func, args, kwargs)
        if func is op:
            out = real(aten.add.Tensor, (real(aten.mul.Tensor, (out, scale), {}), shift), {})
        return out

    monkeypatch.setattr(tensor_module, "_dispatcher", dispatcher)


def lane_sums(rows: np.ndarray) -> np.ndarray:
    """The documented order (Note [Sum order] in ops/numerics.py): blocks of 4096; element i
    of a block goes to lane i % 64, each lane adds in order from +0 in fp32; the lanes fold
    pairwise (lane q += lane q + h, h = 32, 16, ..., 1); the block sums add in order."""
    rows = rows.astype(np.float32)
    total = np.zeros(len(rows), np.float32)
    for b0 in range(0, rows.shape[1], 4096):
        block = rows[:, b0:b0 + 4096]
        lanes = np.zeros((len(rows), 64), np.float32)
        for i in range(block.shape[1]):
            lanes[:, i % 64] += block[:, i]  # (float32 arrays: rounded at every add)
        h = 32
        while h:
            lanes[:, :h] += lanes[:, h:2 * h]
            h //= 2
        total += lanes[:, 0]
    return total


def outcome(fn, device):
    """`fn(device)`'s result (a tensor on the CPU), or its exception as (type, the first line
    of its message: the CPU may append a printed tensor)."""
    try:
        out = fn(device)
    except Exception as e:  # noqa: BLE001
        return type(e), (str(e).splitlines() or [""])[0]
    return out.cpu() if isinstance(out, torch.Tensor) else out
