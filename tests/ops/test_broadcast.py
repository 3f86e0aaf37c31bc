"""Broadcast elementwise loops (layout 'b', Note [Broadcast rows] in ops/kernelgen.py): a
contiguous result read with whole arrays, row vectors and column vectors gives the CPU's
bits, split across cores or not, in place or not, and in a dtype conversion."""
import pytest
import torch

import neuron_eager  # noqa: F401
from neuron_eager.ops import kernelgen, workers

N = torch.device("neuron")
BIG = 512  # rows of BIG x 1024 elements: at least SPLIT_MIN, so the loop runs in slices


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.device.type == "neuron" and got.dtype == want.dtype and got.shape == want.shape
    got = got.cpu()
    if want.dtype.is_floating_point:
        got, want = got.float(), want.float()  # (NaN-free inputs: equal values, equal bits)
    assert torch.equal(got, want)


def test_broadcasting_operands_use_the_broadcast_layout(monkeypatch):
    assert workers.SPLIT_MIN <= BIG * 1024
    x, w = _rand(4, 8).to(N), _rand(8, seed=1).to(N)
    layouts, kernel_for = [], kernelgen.elementwise_kernel

    def spy(*args):
        layouts.append(args[7])
        return kernel_for(*args)

    monkeypatch.setattr(kernelgen, "elementwise_kernel", spy)
    x * w
    assert layouts == ["b"]


@pytest.mark.parametrize("rows", [3, BIG])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_row_and_column_vectors_give_the_cpus_bits(rows, dtype):
    x = _rand(rows, 1024, dtype=dtype)
    w, c = _rand(1024, dtype=dtype, seed=1), _rand(rows, 1, dtype=dtype, seed=2)
    xd, wd, cd = x.to(N), w.to(N), c.to(N)
    _same(xd * wd + cd, x * w + c)  # a row vector, then a column vector
    _same(wd - cd, w - c)  # both vectors, a whole result
    _same(torch.where(xd > 0, wd, cd), torch.where(x > 0, w, c))
    scores = _rand(2, rows, 64, dtype=dtype, seed=3)  # (2, rows, 64) by (rows, 64): a mask
    mask = _rand(rows, 64, dtype=dtype, seed=4) > 0  # over the batch coalesces to a row vector
    _same(scores.to(N).masked_fill(mask.to(N), 7), scores.masked_fill(mask, 7))


@pytest.mark.parametrize("rows", [3, BIG])
def test_in_place_broadcasts_give_the_cpus_bits(rows):
    x, w, c = _rand(rows, 1024), _rand(1024, seed=1), _rand(rows, 1, seed=2)
    xd = x.to(N)
    xd.add_(w.to(N)).mul_(c.to(N))
    _same(xd, (x + w) * c)


def test_other_layouts_keep_the_strided_loop():
    x, w = _rand(64, 48), _rand(64, 1, seed=1)
    xd, wd = x.to(N), w.to(N)
    _same(xd.t() + wd.t(), x.t() + w.t())  # a transposed result: its rows are columns
    _same(xd[:, ::2] * wd, x[:, ::2] * w)  # a strided operand: neither whole nor a vector
    _same(xd[:, None, :] + xd[None, :8, :1], x[:, None, :] + x[None, :8, :1])


@pytest.mark.parametrize("rows", [3, BIG])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_broadcast_conversions_give_the_cpus_bits(rows, dtype):
    w, c = _rand(1024, seed=1) * 1e3, _rand(rows, 1, seed=2) * 1e3
    for vector in (w, c):
        want = torch.empty(rows, 1024, dtype=dtype).copy_(vector)
        got = torch.empty(rows, 1024, dtype=dtype, device=N).copy_(vector.to(N))
        _same(got, want)


# -- planned layouts (Note [Planned layouts] in ops/elementwise.py) ---------------------------
def test_a_planned_layout_reads_each_calls_memory_and_scalars():
    big, w = _rand(10, 8), _rand(4, seed=1)
    big_n, w_n = big.to(N), w.to(N)
    for i, scale in enumerate((2.0, -0.5, 3.0)):  # one layout, other offsets and scalars
        _same(big_n[i:i + 4].t() * w_n * scale, big[i:i + 4].t() * w * scale)


def test_a_planned_in_place_layout_still_sees_aliases_and_overlaps():
    a, b = _rand(4, 8), _rand(4, 8, seed=1)
    a_n, b_n = a.to(N), b.to(N)
    for _ in range(2):  # planned: b's memory is not a's
        a_n.t().add_(b_n.t())
        a.t().add_(b.t())
    _same(a_n, a)
    a_n.t().add_(a_n.t())  # the same layout, now reading the output's own memory
    a.t().add_(a.t())
    _same(a_n, a)
    x, y = _rand(10), _rand(10, seed=1)
    x_n, y_n = x.to(N), y.to(N)
    x_n[1:].add_(y_n[:-1])  # planned without overlap
    for _ in range(2):
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            x_n[1:].add_(x_n[:-1])
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            x[1:].add_(x[:-1])
    _same(x_n, x + torch.cat([torch.zeros(1), y[:-1]]))


@pytest.mark.parametrize("rows", [3, BIG])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_one_value_operands_are_loaded_once(rows, dtype, monkeypatch):
    # a (1,)/(1, 1) tensor or one value expanded (mean's gradient) is a scalar operand of
    # the loop (kind "s"), not an array read through zero strides
    x = _rand(rows, 1024, dtype=dtype)
    ones = [(_rand(1, dtype=dtype, seed=2), lambda t: t), (_rand(1, 1, dtype=dtype, seed=3),
                                                          lambda t: t),
            (_rand(dtype=dtype, seed=4), lambda t: t.expand(rows, 1024)),
            (_rand(1, 1, dtype=dtype, seed=5), lambda t: t.expand(1, 1024))]
    kinds, kernel_for = [], kernelgen.elementwise_kernel

    def spy(*args):
        kinds.append((args[0], args[3]))
        return kernel_for(*args)

    for base, view in ones:
        one, on_device, dev = view(base), view(base.to(N)), x.to(N)
        monkeypatch.setattr(kernelgen, "elementwise_kernel", spy)
        _same(dev * on_device, x * one)
        _same(on_device - dev, one - x)
        _same(torch.where(dev > 0, on_device, dev), torch.where(x > 0, one, x))
        if dtype != torch.int32:
            _same(on_device.expand(rows, 1024) / 3, one.expand(rows, 1024) / 3)  # all one
        monkeypatch.setattr(kernelgen, "elementwise_kernel", kernel_for)
        dev.add_(on_device)  # in place, the one value from another tensor
        _same(dev, x + one)
    assert kinds and all("s" in k for name, k in kinds if name != "gt")
