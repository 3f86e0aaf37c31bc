"""The hot elementwise ops' loops vectorise (Note [Inlined op bodies], Note [branch-free]).

A body LLVM does not inline, or a branch it cannot turn into a select, leaves the loop one
element at a time: the same bits, 4-8x slower, and nothing else would notice.
"""
import numba
import pytest

import neuron_eager  # noqa: F401
from neuron_eager.ops import elementwise as E
from neuron_eager.ops.kernelgen import JIT_OPTIONS

HOT = ["gelu", "gelu_backward", "gelu_tanh_backward", "silu", "silu_backward", "softplus",
       "log_sigmoid", "mish", "bce_with_logits", "exp", "log", "log1p", "tanh", "sigmoid",
       "erf", "add", "mul", "div"]


def _vector_instructions(fn) -> int:
    arity = fn.py_func.__code__.co_argcount
    names = [f"a{j}" for j in range(arity)]
    source = (f"def loop({', '.join(names)}, out):\n    for i in range(out.size):\n"
              f"        out[i] = fn({', '.join(n + '[i]' for n in names)})\n")
    namespace = {"fn": fn}
    exec(source, namespace)
    loop = numba.njit(**JIT_OPTIONS)(namespace["loop"])
    array = numba.types.float32[::1]
    loop.compile((array,) * (arity + 1))
    llvm = loop.inspect_llvm(loop.signatures[0])
    return llvm.count("x float>")


@pytest.mark.parametrize("name", HOT)
def test_hot_op_loops_vectorise(name):
    assert _vector_instructions(E.OPS_BY_NAME[name].fn) > 0
