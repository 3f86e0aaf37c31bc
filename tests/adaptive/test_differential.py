"""Differential test: random elementwise programs give the same bits in adaptive and plain eager.

Hypothesis draws a program (ops, operands, Python scalars, broadcast and strided inputs,
which intermediates stay referenced, interleaved reads); it runs in plain eager, then in
adaptive eager with fusion from the first sighting. Each new program structure compiles a
fused kernel (~0.1 s), which bounds the example count: each program runs on three
data sets (300 cases).
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_eager import adaptive
from neuron_eager.adaptive import recording

from test_adaptive import same_bits

N = torch.device("neuron")
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32]
SHAPES = [(37,), (6, 7), (3, 4, 5)]
UNARY = {"neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "exp": torch.exp,
         "sigmoid": torch.sigmoid, "gelu": F.gelu, "sqrt": torch.sqrt}
FLOAT_ONLY = {"exp", "sigmoid", "gelu", "sqrt"}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum,
          "div": torch.div, "lt": torch.lt, "add_alpha": lambda a, b: torch.add(a, b, alpha=3)}
SCALAR = {"mul_s": lambda a, c: a * c, "add_s": lambda a, c: a + c,
          "rsub_s": lambda a, c: c - a, "pow_s": lambda a, c: a ** 2}


@st.composite
def programs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from(SHAPES))
    inputs = []
    for k in range(draw(st.integers(1, 3))):
        form = draw(st.sampled_from(["full", "broadcast", "transposed", "zero-dim"]))
        if form == "broadcast":
            drop = draw(st.integers(0, len(shape) - 1))
            sub = tuple(1 if draw(st.booleans()) else n for n in shape[drop:])
            inputs.append(("plain", sub))
        elif form == "transposed" and len(shape) >= 2:
            inputs.append(("transposed", shape))
        elif form == "zero-dim":
            inputs.append(("plain", ()))
        else:
            inputs.append(("plain", shape))
    inputs[0] = ("plain", shape)  # the result has the full shape
    steps = []
    for _ in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "scalar"]))
        names = {"unary": UNARY, "binary": BINARY, "scalar": SCALAR}[kind]
        name = draw(st.sampled_from(sorted(names)))
        if name in FLOAT_ONLY and not dtype.is_floating_point:
            name = "neg"
        other = draw(st.integers(0, 8))  # an input or an earlier kept result
        scalar = draw(st.sampled_from([2, -3, 0.5, 1.25e-3, 7.0]))
        steps.append((kind, name, other, scalar, draw(st.booleans()), draw(st.booleans())))
    seed = draw(st.integers(0, 2**16))
    return dtype, inputs, steps, seed


def make_inputs(dtype, inputs, seed):
    g = torch.Generator().manual_seed(seed)
    made = []
    for form, shape in inputs:
        if form == "transposed":
            shape = shape[:-2] + (shape[-1], shape[-2])
        if dtype.is_floating_point:
            t = (torch.randn(shape, generator=g) * 2).to(dtype)
        else:
            t = torch.randint(-9, 9, shape, generator=g, dtype=dtype)
        t = t.to(N)
        made.append(t.transpose(-1, -2) if form == "transposed" else t)
    return made


def run(program, tensors):
    """Run the program; returns its kept results and the values read on the way."""
    _, _, steps, _ = program
    env, reads = list(tensors), []
    prev = tensors[0]
    for kind, name, other, scalar, keep, read in steps:
        try:
            if kind == "unary":
                prev = UNARY[name](prev)
            elif kind == "binary":
                prev = BINARY[name](prev, env[other % len(env)])
            else:
                prev = SCALAR[name](prev, scalar)
        except (RuntimeError, NotImplementedError) as e:  # e.g. gelu of a bool: both modes
            reads.append(f"{type(e).__name__}: {e}")
            break
        if keep:
            env.append(prev)
        if read:  # a sync point in the middle of the program
            reads.append(prev.reshape(-1)[0].item())
    return env[len(tensors):] + [prev], reads


@pytest.fixture
def fuse_at_once():
    saved = recording.options.compile_after
    recording.options.compile_after = 1
    yield
    recording.options.compile_after = saved
    adaptive.disable()


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(program=programs())
def test_random_programs_bit_identical(program, fuse_at_once):
    dtype, inputs, _, seed = program
    for data in range(3):  # three cases per compiled structure: new data, same kernel
        tensors = make_inputs(dtype, inputs, seed + data)
        adaptive.disable()
        expected, expected_reads = run(program, tensors)
        expected = [t.cpu() for t in expected]
        adaptive.enable()
        got, reads = run(program, tensors)
        got = [t.cpu() for t in got]
        adaptive.disable()
        for g, e in zip(got, expected):
            same_bits(g, e)
        assert [r if r == r else "nan" for r in reads] == \
            [r if r == r else "nan" for r in expected_reads]
