"""Property tests: random shapes, broadcasts, strided views and dtypes agree with the CPU.

Hypothesis draws the cases; every case is compared with the same op on the CPU.
Example counts are kept modest: each new dtype/layout combination compiles a kernel.
"""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checks import TOLERANCES

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64]
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def tensors(draw, shape=None, dtype=None, min_dims=0):
    """A CPU tensor, sometimes a transposed or sliced view of a bigger one."""
    dtype = dtype or draw(st.sampled_from(DTYPES))
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(1, 5), min_size=min_dims, max_size=4)))
    view = draw(st.sampled_from(["plain", "transposed", "sliced"])) if len(shape) >= 2 \
        else "plain"
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if view == "transposed":
        base = _values(shape[:-2] + (shape[-1], shape[-2]), dtype, g)
        return base.transpose(-1, -2)
    if view == "sliced":
        base = _values(shape[:-1] + (shape[-1] * 2,), dtype, g)
        return base[..., ::2]
    return _values(shape, dtype, g)


def _values(shape, dtype, g):
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(-20, 20, shape, generator=g, dtype=dtype)


def broadcastable(shape, draw):
    """A shape that broadcasts against `shape`: some dims dropped from the front or set to 1."""
    drop = draw(st.integers(0, len(shape)))
    return tuple(1 if draw(st.booleans()) else n for n in shape[drop:])


def _check(actual, expected):
    rtol, atol = TOLERANCES.get(expected.dtype, (0, 0))
    assert actual.device.type == "neuron"
    torch.testing.assert_close(actual.cpu(), expected, rtol=rtol, atol=atol, equal_nan=True)


BINARY = [torch.add, torch.sub, torch.mul, torch.maximum, torch.minimum, torch.eq, torch.lt,
          lambda a, b: torch.add(a, b, alpha=2)]


@SETTINGS
@given(data=st.data())
def test_binary_ops_broadcast_and_promote(data):
    a = data.draw(tensors())
    b = data.draw(tensors(shape=broadcastable(tuple(a.shape), data.draw)))
    op = data.draw(st.sampled_from(BINARY))
    _check(op(a.to("neuron"), b.to("neuron")), op(a, b))


@SETTINGS
@given(data=st.data())
def test_unary_and_scalar_ops(data):
    a = data.draw(tensors(dtype=data.draw(st.sampled_from(DTYPES[:3]))))
    scalar = data.draw(st.sampled_from([2, -0.5, 3.25]))
    op = data.draw(st.sampled_from([torch.neg, torch.abs, torch.exp, torch.tanh, torch.sigmoid,
                                    lambda t: t * scalar, lambda t: t + scalar,
                                    lambda t: t.clamp(-1, 1), torch.nn.functional.gelu]))
    _check(op(a.to("neuron")), op(a))


@SETTINGS
@given(data=st.data())
def test_reductions(data):
    a = data.draw(tensors(dtype=data.draw(st.sampled_from(DTYPES[:3])), min_dims=1))
    dim = data.draw(st.integers(-a.dim(), a.dim() - 1))
    keepdim = data.draw(st.booleans())
    op = data.draw(st.sampled_from([torch.sum, torch.mean, torch.amax, torch.amin,
                                    lambda t, dim, keepdim: torch.softmax(t, dim),
                                    lambda t, dim, keepdim: torch.var(t, dim, keepdim=keepdim)]))
    expected = op(a.float(), dim=dim, keepdim=keepdim).to(a.dtype) if a.dtype != torch.float32 \
        else op(a, dim=dim, keepdim=keepdim)
    # 16-bit results: the CPU reference computes in fp32 and rounds once, as Trainium does
    _check(op(a.to("neuron"), dim=dim, keepdim=keepdim), expected)


@SETTINGS
@given(data=st.data())
def test_matmul_shapes_and_layouts(data):
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
    m, k, n = (data.draw(st.integers(1, 40)) for _ in range(3))
    batch = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    a = data.draw(tensors(shape=batch + (m, k), dtype=dtype))
    b = data.draw(tensors(shape=(k, n) if data.draw(st.booleans()) else batch + (k, n),
                          dtype=dtype))
    expected = torch.matmul(a.float(), b.float()).to(dtype)
    actual = torch.matmul(a.to("neuron"), b.to("neuron"))
    torch.testing.assert_close(actual.cpu().float(), expected.float(),
                               rtol=1e-4 if dtype == torch.float32 else 1.6e-2,
                               atol=1e-4 if dtype == torch.float32 else 2e-2)
