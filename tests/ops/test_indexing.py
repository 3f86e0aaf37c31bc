"""Indexing family (ops/indexing.py, advanced_indexing.py, masking.py, arrange.py) vs the CPU."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from checks import NEURON, check_op

DTYPES = [torch.float32, torch.bfloat16]


def _x(shape, dtype=torch.float32):
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(-50, 50, shape, dtype=dtype)


def check_error(fn, *args):
    """fn raises the same exception type and message on neuron as on the CPU."""
    with pytest.raises(Exception) as cpu:
        fn(*args)
    dev = [a.to(NEURON) if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(type(cpu.value)) as ours:
        fn(*dev)
    assert str(ours.value).split("\n")[0] == str(cpu.value).split("\n")[0]
    return dev


# -- gathers -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.int64, torch.bool])
def test_index_select(dtype, seed):
    x = _x((5, 6, 3), dtype) if dtype != torch.bool else torch.rand(5, 6, 3) > 0.5
    idx = torch.tensor([4, 0, 0, 2])
    for dim in (0, 1, -1):
        check_op(lambda t, i: t.index_select(dim, i), x, idx.clamp(max=2 if dim else 4))
    check_op(lambda t, i: t.transpose(0, 1).index_select(1, i), x, idx)  # strided input
    check_op(lambda t, i: t.index_select(0, i), x, idx.int())


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select_grad(dtype, seed):
    x = _x((5, 4), dtype).requires_grad_()
    check_op(lambda t, i: t.index_select(0, i) * 2, x, torch.tensor([1, 1, 3]), grad=True)


def test_embedding(seed):
    w = torch.randn(10, 4, requires_grad=True)
    idx = torch.tensor([[1, 2, 2], [9, 0, 1]])
    check_op(F.embedding, idx, w, grad=True)
    check_op(lambda i, t: F.embedding(i, t, padding_idx=2), idx, w, grad=True)
    check_op(lambda i, t: F.embedding(i, t, scale_grad_by_freq=True), idx, w, grad=True)
    check_op(F.embedding, idx, w.detach().bfloat16().requires_grad_(), grad=True)
    check_op(lambda i, t: torch.nn.Embedding.from_pretrained(t, padding_idx=0)(i), idx, w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather(dtype, seed):
    x = _x((4, 5), dtype).requires_grad_()
    idx = torch.tensor([[0, 4, 4], [1, 1, 0], [2, 3, 0]])
    check_op(lambda t, i: t.gather(1, i), x, idx, grad=True)
    check_op(lambda t, i: t.gather(0, i.clamp(max=3)), x, idx, grad=True)
    check_op(lambda t, i: t.t().gather(0, i), x, idx, grad=True)


# -- scatters ------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("dtype", DTYPES + [torch.int32])
def test_scatter_and_index_add(dtype, seed):
    x, src = _x((4, 5), dtype), _x((3, 5), dtype)
    idx = torch.tensor([[0, 1, 2, 3, 0], [1, 2, 3, 0, 1], [3, 3, 3, 3, 3]])
    check_op(lambda t, i, s: t.scatter(0, i, s), x, idx, src)
    check_op(lambda t, i: t.scatter(1, i[:, :2], 7), x, idx)
    check_op(lambda t, i, s: t.scatter_add(0, i, s), x, idx, src)
    check_op(lambda t, i, s: t.clone().scatter_add_(0, i, s), x, idx, src)
    check_op(lambda t, i, s: t.scatter(0, i, s, reduce="add"), x, idx, src)
    check_op(lambda t, i, s: t.scatter(0, i, s, reduce="multiply"), x, idx, src)
    rows = torch.tensor([3, 0, 3])
    check_op(lambda t, i, s: t.index_add(0, i, s), x, rows, src)
    check_op(lambda t, i, s: t.index_add(0, i, s, alpha=2), x, rows, src)
    check_op(lambda t, i, s: t.clone().index_add_(1, i, s.t()[:4]), x, rows, src)


def test_index_add_rounds_alpha_as_the_cpu(seed):
    # slices add source * alpha with one rounding (the CPU's add_), a 1-D tensor's loop with two
    for shape, dim in (((300, 16), 0), ((16, 300), 1), ((3000,), 0)):
        x, src = torch.randn(shape), torch.randn(shape)
        rows = torch.randperm(shape[dim])
        expected = x.index_add(dim, rows, src, alpha=2.5)
        assert torch.equal(x.to(NEURON).index_add(dim, rows.to(NEURON), src.to(NEURON),
                                                  alpha=2.5).cpu(), expected)
        inplace = x.to(NEURON)
        inplace.index_add_(dim, rows.to(NEURON), src.to(NEURON), alpha=2.5)
        assert torch.equal(inplace.cpu(), expected)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self, seed):
    x, src = torch.randn(6), torch.randn(8)
    idx = torch.tensor([0, 0, 2, 2, 2, 5, 0, 1])
    check_op(lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=include_self),
             x, idx, src)
    xi, si = torch.randint(-9, 9, (6,)), torch.randint(-9, 9, (8,))
    check_op(lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=include_self),
             xi, idx, si)


def test_large_scatters_shared_between_cores_keep_each_rows_order(monkeypatch):
    # a share of rows per core (ops/indexing.py _rows_apart): the same bits as one core,
    # for every reduction and index_add along dim 1
    from neuron_eager.ops import workers

    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 700, generator=g).to(NEURON)
    idx = torch.randint(0, 700, (600, 500), generator=g).to(NEURON)
    src = (torch.randn(600, 500, generator=g) * 1e3).to(NEURON)
    rows = torch.randint(0, 700, (500,), generator=g).to(NEURON)
    ops = [lambda: x.scatter_add(1, idx, src), lambda: x.index_add(1, rows, src, alpha=0.5)]
    ops += [lambda r=r: x.scatter_reduce(1, idx, src, r) for r in ("sum", "prod", "amax", "mean")]
    shared = [op().cpu() for op in ops]
    monkeypatch.setattr(workers, "SPLIT_MIN", 1 << 40)
    for op, got in zip(ops, shared):
        alone = op().cpu()
        assert torch.equal(got.view(torch.int32), alone.view(torch.int32))
    torch.testing.assert_close(shared[0], x.cpu().scatter_add(1, idx.cpu(), src.cpu()))


def test_scatter_grad(seed):
    x, src = torch.randn(3, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True)
    idx = torch.tensor([[0, 1, 2, 0], [2, 0, 1, 1]])
    check_op(lambda t, i, s: t.scatter_add(0, i, s), x, idx, src, grad=True)
    check_op(lambda t, i, s: t.index_add(0, i[0, :2], s), x, idx, src, grad=True)


# -- advanced indexing ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.int16])
def test_index_tensor(dtype, seed):
    x = _x((4, 5, 6), dtype)
    i, j = torch.tensor([0, -1, 2]), torch.tensor([[1], [4]])
    check_op(lambda t, a: t[a], x, i)
    check_op(lambda t, a: t[:, a], x, i)
    check_op(lambda t, a, b: t[a, b], x, i, j)  # broadcast indices
    check_op(lambda t, a, b: t[a, :, b], x, i, j)  # separated: index dims go first
    check_op(lambda t, a: t[..., a, None], x, i)
    check_op(lambda t, a: t.transpose(0, 2)[a, 1:], x, i)
    check_op(lambda t, a: t[:, a.int()], x, i)


def test_index_masks(seed):
    x = torch.randn(4, 5, 6)
    check_op(lambda t: t[t > 0], x)
    check_op(lambda t: t[:, t[0, :, 0] > 0], x)
    check_op(lambda t: t[t[:, :, 0] > 0, 1:3], x)
    check_op(lambda t: t[torch.tensor([True, False, True, True], device=t.device)], x)
    check_op(lambda t: t[t > 100], x)  # empty selection
    check_op(lambda t: torch.where(t > 0), x)
    check_op(lambda t: torch.nonzero(t), torch.tensor([[0.0, -0.0, 2], [float("nan"), 0, 1]]))
    check_op(torch.nonzero, torch.tensor(3.0))
    check_op(lambda t: torch.argwhere(t > 0.5), torch.rand(3, 4).t())
    check_op(lambda t: torch.nonzero(t[:, ::2, 1:] > 0.3), torch.randn(5, 6, 300))  # strided rows


@pytest.mark.parametrize("x", [torch.tensor([[0, 1, 2], [3, 0, 4]]), torch.zeros(2, 3),
                               torch.tensor(5), torch.tensor(0), torch.tensor([1.0, 0.0, 2.0])])
def test_nonzero_layout_is_the_cpus(x):
    """The CPU's nonzero is column-major (strides (1, n)), so each coordinate is dense."""
    expected, actual = torch.nonzero(x), torch.nonzero(x.to("neuron"))
    assert actual.shape == expected.shape and actual.stride() == expected.stride()
    assert torch.equal(actual.cpu(), expected)
    for e, a in zip(torch.nonzero(x, as_tuple=True), torch.nonzero(x.to("neuron"), as_tuple=True)):
        assert a.stride() == e.stride() and torch.equal(a.cpu(), e)


def test_index_grad(seed):
    x = torch.randn(5, 4, requires_grad=True)
    check_op(lambda t, i: t[i] * 3, x, torch.tensor([0, 0, 4]), grad=True)
    check_op(lambda t: t[t > 0].sum(), x, grad=True)
    check_op(lambda t, i: t[i, i.flip(0)], x, torch.tensor([0, 3, 1]), grad=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_put(dtype, seed):
    x = _x((5, 4), dtype)
    i = torch.tensor([0, 2, 2, -1])
    v = _x((4,), dtype)

    def put(t, a, vals, acc):
        t = t.clone()
        t.index_put_((a,), vals, accumulate=acc)
        return t

    check_op(lambda t, a: put(t, a, torch.ones((), dtype=t.dtype, device=t.device), False), x, i)
    check_op(lambda t, a, w: put(t, a, w, True), x, i, v[:, None].expand(4, 4).contiguous())
    check_op(lambda t, a, w: t.index_put((a, a.flip(0)), w, accumulate=True), x, i, v)
    check_op(lambda t, a, w: torch.ops.aten._index_put_impl_(t.clone(), (None, a[:2]), w[:2],
                                                             True, True), x, i, v)

    def setitem(t, a, w):
        t = t.clone()
        t[a, 1:] = w[:3]
        t[t > 0.5] = 0.0
        t[:, a[:2]] += 1
        return t

    check_op(setitem, x, i, v)


def test_index_put_cpu_indices(seed):
    x, idx = torch.randn(5, 3), torch.tensor([4, 0])
    dev = x.to(NEURON)
    dev[idx] = torch.ones(3, device=NEURON)  # host index tensor, as CUDA accepts
    dev.index_put_((idx,), torch.full((3,), 2.0, device=NEURON), accumulate=True)
    x[idx] = 1.0
    x.index_put_((idx,), torch.full((3,), 2.0), accumulate=True)
    torch.testing.assert_close(dev.cpu(), x)
    torch.testing.assert_close(dev[idx].cpu(), x[idx])


def test_out_of_range_raises_before_writing(seed):
    x = torch.randn(4, 5)
    bad = torch.tensor([0, 1, 9])
    check_error(lambda t, i: t.index_select(0, i), x, bad)
    check_error(lambda t, i: t[i], x, bad)
    check_error(lambda t, i: t[i], x, torch.tensor([-5]))
    check_error(lambda t, i: t.gather(0, i[None]), x, bad)
    check_error(lambda t, i: F.embedding(i, t), x, bad)
    check_error(lambda t, i: t.index_add(0, i, torch.ones(3, 5, device=t.device)), x, bad)
    check_error(lambda t, i: t[i, i[:3]], x, torch.tensor([0, 1]).repeat(2))  # no broadcast
    check_error(lambda t: t[torch.ones(3, dtype=torch.bool, device=t.device)], x)
    check_error(lambda t: t[0.5 * torch.ones(1, device=t.device)], x)
    for fn in (lambda t, i: t.index_put_((i,), torch.ones((), device=t.device)),
               lambda t, i: t.scatter_(0, i[None], 1.0),
               lambda t, i: t.index_add_(0, i, torch.ones(3, 5, device=t.device))):
        dev = check_error(fn, x, bad)
        torch.testing.assert_close(dev[0].cpu(), x)  # nothing was written


# -- masked ops ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.int8])
def test_masked(dtype, seed):
    x = _x((4, 5), dtype)
    m = torch.rand(4, 5) > 0.5
    check_op(lambda t, k: t.masked_fill(k, 3), x, m)
    check_op(lambda t, k: t.masked_fill(k[0], -1), x, m)  # broadcast mask
    check_op(lambda t, k: t.clone().masked_fill_(k, torch.tensor(2)), x, m)
    check_op(lambda t, k: t.t().masked_select(k.t()), x, m)
    check_op(lambda t, k: t.masked_select(k[1]), x, m)
    check_op(lambda t, k, s: t.masked_scatter(k, s), x, m, _x((20,), dtype))
    check_op(lambda t, k, s: t.clone().masked_scatter_(k[0], s), x, m, _x((30,), dtype))


def test_masked_grad(seed):
    x = torch.randn(3, 4, requires_grad=True)
    m = torch.rand(3, 4) > 0.5
    check_op(lambda t, k: t.masked_fill(k, 0.0) * t, x, m, grad=True)
    check_op(lambda t, k: t.masked_select(k), x, m, grad=True)
    check_op(lambda t, k: torch.zeros_like(t).masked_scatter(k, t), x, m, grad=True)
    check_error(lambda t: t.masked_fill(t > 0, torch.ones(2, device=t.device)), x.detach())
    check_error(lambda t: t.masked_scatter(t > -10, torch.ones(2, device=t.device)), x.detach())


@pytest.mark.parametrize("dtype", DTYPES + [torch.int32])
def test_tril_triu(dtype, seed):
    x = _x((2, 4, 5), dtype)
    for k in (0, 1, -2):
        check_op(lambda t: t.tril(k), x)
        check_op(lambda t: t.triu(k), x)
    check_op(lambda t: t.transpose(1, 2).tril(), x)
    check_op(lambda t: t.clone().triu_(1), x)
    check_op(lambda t: torch.tril(t) * 2, torch.randn(4, 4, requires_grad=True), grad=True)


# -- rearranging -------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:float64 on neuron")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cat_stack(dtype, seed):
    a, b = _x((2, 3), dtype), _x((4, 3), dtype)
    check_op(lambda p, q: torch.cat([p, q]), a, b)
    check_op(lambda p, q: torch.cat([p.t(), q.t()], dim=-1), a, b)
    check_op(lambda p, q: torch.cat([p, torch.empty(0, device=p.device, dtype=p.dtype), q]), a, b)
    check_op(lambda p, q: torch.stack([p, q[:2], p]), a, b)
    check_op(lambda p, q: torch.stack([p, q[1:3]], dim=2), a, b)
    check_op(lambda p, q: torch.cat([p, q.double(), q.int()]), a, b)  # dtype promotion
    out = torch.empty(6, 3, dtype=dtype, device=NEURON)
    torch.cat([a.to(NEURON), b.to(NEURON)], out=out)
    torch.testing.assert_close(out.cpu(), torch.cat([a, b]))
    check_error(lambda p, q: torch.cat([p, q.t()]), a, b)
    check_op(lambda p, q: torch.cat([p, q]) * torch.stack([q, q]).sum(0).mean(),
             a.float().requires_grad_(), b.float().requires_grad_(), grad=True)


def test_cat_stack_large_converted_and_channels_last(seed):
    # results from 2 MB copy part by part (split over the cores); smaller ones in one call
    a, b = torch.randn(600, 700), torch.randn(600, 300)
    check_op(lambda p, q: torch.cat([p, q], 1), a, b)
    check_op(lambda p: torch.stack([p, p * 2], 1), a)
    check_op(lambda p, q: torch.cat([p, q.half()], 1), a, b)  # promotion, part by part
    check_op(lambda *ts: torch.cat(ts), *[torch.randn(4) for _ in range(50)])
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    for fn in (lambda t: torch.cat([t, t], 1), lambda t: torch.cat([t, t]),
               lambda t: torch.stack([t, t], 2)):
        assert fn(x.to(NEURON)).stride() == fn(x).stride()
        check_op(fn, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pad_repeat_flip_roll(dtype, seed):
    x = _x((3, 4, 5), dtype)
    check_op(lambda t: F.pad(t, (1, 2)), x)
    check_op(lambda t: F.pad(t, (2, -1, 0, 3, 1, 1), value=1.5), x)
    check_op(lambda t: t.repeat(2, 1, 3), x)
    check_op(lambda t: t.t().repeat(2, 1, 1, 2), x[0])
    check_op(lambda t: t.flip(0, 2), x)
    check_op(lambda t: t.transpose(0, 1).flip(-1), x)
    check_op(lambda t: t.roll(2, 1), x)
    check_op(lambda t: t.roll((1, -3), (0, 2)), x)
    check_op(lambda t: t.roll(7), x)
    y = torch.randn(3, 4, requires_grad=True)
    check_op(lambda t: F.pad(t, (1, 1, 2, 0)) * 2, y, grad=True)
    check_op(lambda t: t.repeat(2, 3), y, grad=True)
    check_op(lambda t: t.flip(0).roll(1, 1) * t, y, grad=True)


def test_zero_dim_and_index_fill(seed):
    s, i0 = torch.tensor(2.5), torch.tensor(0)
    check_op(lambda t, i: t.index_select(0, i), s, i0)
    check_op(lambda t, i: t.gather(0, i), s, i0)
    check_op(lambda t, i: t.scatter(0, i, 7.0), s, i0)
    check_op(lambda t, i: t.scatter_add(0, i, t * 2), s, i0)
    check_op(lambda t, i: t.index_add(0, i, t), s, i0)
    x = torch.randn(4, 5)
    check_op(lambda t, i: t.index_fill(1, i, -2.0), x, torch.tensor([0, -1]))
    check_op(lambda t, i: t.clone().index_fill_(0, i, torch.tensor(3.0)), x, torch.tensor([2]))
    # in place with a Python number: the Scalar overload, not the Tensor one
    check_op(lambda t, i: t.clone().index_fill_(1, i, -1.0), x, torch.tensor([0, 2]))
    check_op(lambda t, i: t.clone().index_fill_(0, i, 5), x, torch.tensor([1]))
    check_error(lambda t, i: t.index_fill(0, i, 1.0), x, torch.tensor([4]))
    check_op(lambda t: torch.where(t > 100), x)  # empty result, unbound into views


def test_meta_cache_counts():
    from neuron_eager.ops import indexing

    x, i = torch.randn(3, 4, device=NEURON), torch.tensor([2, 0], device=NEURON)
    x.index_select(1, i)
    before = dict(indexing.meta_stats)
    x.index_select(1, i)
    assert indexing.meta_stats["hits"] == before["hits"] + 1
    assert indexing.meta_stats["misses"] == before["misses"]


def test_nothing_fell_back():
    neuron_eager.clear_op_tracking()
    x = torch.randn(6, 6, device=NEURON)
    x[x > 0] = 1.0
    torch.cat([x.index_select(0, torch.tensor([1], device=NEURON)), x.tril()]).flip(0)
    assert neuron_eager.get_fallback_ops() == {}


def test_one_hot_in_inference_mode_runs_on_the_device():
    """Inference tensors skip the autograd key our one_hot is registered on: ATen's composite
    runs instead and checks the classes with _assert_async, which fell back to the CPU."""
    neuron_eager.clear_op_tracking()
    y = torch.tensor([0, 3, 1, 6])
    with torch.inference_mode():
        got = F.one_hot(y.to(NEURON), 7)
        torch._assert_async(torch.tensor(True, device=NEURON), "true")
    assert torch.equal(got.cpu(), F.one_hot(y, 7))
    assert neuron_eager.get_fallback_ops() == {}
    with torch.inference_mode(), pytest.raises(  # (the composite's message, as on CUDA, has
            RuntimeError, match="Class values must be smaller than num_classes"):  # a prefix)
        F.one_hot(y.to(NEURON), 5)


# -- put, index_reduce, embedding_bag ---------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + [torch.int32])
def test_put(dtype, seed):
    x, src = _x((4, 5), dtype), _x((2, 3), dtype)
    idx = torch.tensor([[1, -1, 7], [19, 7, 0]])
    check_op(lambda t, i, s: t.put(i, s[:, :3]), x, idx[:, :3].clamp(max=18), src)
    check_op(lambda t, i, s: t.put(i, s, accumulate=True), x, idx, src)
    check_op(lambda t, i, s: t.t().put(i, s, accumulate=True), x, idx, src)  # strided self
    check_error(lambda t, i, s: t.put(i, s), x, torch.tensor([[20, 0, 0], [0, 0, 0]]), src)
    check_error(lambda t, i, s: t.put(i, s), x, idx[:1], src)


def test_put_grad(seed):
    check_op(lambda t, i, s: t.put(i, s, accumulate=True), torch.randn(3, 4).requires_grad_(),
             torch.tensor([1, 1, -2]), torch.randn(3).requires_grad_(), grad=True)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self, seed):
    idx = torch.tensor([1, 3, 1, 0])
    for dtype in DTYPES + [torch.int32] if include_self else [torch.float32]:
        x, src = _x((5, 6), dtype), _x((5, 4), dtype)
        check_op(lambda t, i, s: t.index_reduce(1, i, s, reduce, include_self=include_self),
                 x, idx, src)
    check_op(lambda t, i, s: t.index_reduce(0, i, s, reduce, include_self=include_self),
             torch.randn(4, 3).requires_grad_(), idx, torch.randn(4, 3).requires_grad_(),
             grad=True)
    check_error(lambda t, i, s: t.index_reduce(0, i, s, "sum"), torch.ones(2), idx[:1],
                torch.ones(1))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode, seed):
    w = torch.randn(10, 3)
    idx, off = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4, 4, 6])
    for pad in (None, 2):
        check_op(lambda i, t, o: F.embedding_bag(i, t, o, mode=mode, padding_idx=pad), idx,
                 w.clone().requires_grad_(), off, grad=True)
    check_op(lambda i, t, o: F.embedding_bag(i, t, o, mode=mode, include_last_offset=True),
             idx, w.bfloat16(), torch.tensor([0, 4, 4, 8]))
    check_op(lambda i, t: F.embedding_bag(i, t, mode=mode), idx.reshape(2, 4).int(), w)
    if mode == "sum":
        check_op(lambda i, t, o, p: F.embedding_bag(i, t, o, mode="sum", per_sample_weights=p),
                 idx, w.clone().requires_grad_(), off, torch.randn(8).requires_grad_(),
                 grad=True)
    # torch.embedding_bag's bag_size and max_indices too, with an empty and a padded bag
    check_op(lambda t, i, o: torch.embedding_bag(t, i, o, False, ["sum", "mean", "max"].index(
        mode), False, None, False, 2), w.clone().requires_grad_(), idx, off, grad=True)


@pytest.mark.parametrize("psw", [torch.ones(8, dtype=torch.bfloat16), torch.ones(7),
                                 torch.ones(8, 1)], ids=["bf16", "short", "2-d"])
def test_embedding_bag_refuses_the_cpus_bad_sample_weights(psw):
    check_error(lambda t, i, o, p: F.embedding_bag(i, t, o, mode="sum", per_sample_weights=p),
                torch.randn(10, 3), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]),
                torch.tensor([0, 4]), psw)


def test_index_put_accumulate_rounds_like_cpu(seed):
    # duplicates add into the bf16/fp16 destination one at a time, as on the CPU
    for dtype in (torch.bfloat16, torch.float16):
        v = torch.tensor([1.0] + [2.0 ** -8] * 8).to(dtype)
        i = torch.zeros(9, dtype=torch.long)
        check_op(lambda t, a, w: t.index_put((a,), w, accumulate=True), torch.zeros(1).to(dtype),
                 i, v, rtol=0, atol=0)
    x, mask = torch.randn(5, 5).bfloat16(), torch.rand(10, 10) > 0.3
    rows, cols = torch.randint(0, 5, (10, 1)), torch.randint(0, 5, (1, 10))
    check_op(lambda t, m, r, c, v: torch.ops.aten._unsafe_masked_index_put_accumulate(
        t, m, [r, c], v), x, mask, rows, cols, torch.randn(10, 10).bfloat16(), rtol=0, atol=0)


# -- nonzero_static, segment_reduce, rot90, resize_as_, linspace / logspace ---------------------
def test_nonzero_static(seed):
    m = torch.tensor([[1.0, 0, 3], [0, -0.0, 2]])
    for size in (0, 1, 3, 6):
        check_op(lambda t: torch.nonzero_static(t, size=size, fill_value=-3), m)
    check_op(lambda t: torch.nonzero_static(t.t(), size=4), m > 0)
    check_op(lambda t: torch.nonzero_static(t, size=2), torch.tensor(3))
    check_error(lambda t: torch.nonzero_static(t, size=-1), m)


@pytest.mark.parametrize("reduce", ["max", "min", "sum", "mean", "prod"])
def test_segment_reduce(reduce, seed):
    x = torch.tensor([1.0, 5, 2, 5, -1, 3, 0, 0, 2])
    lengths, offsets = torch.tensor([2, 0, 4, 3]), torch.tensor([0, 2, 2, 6, 9])
    sr = torch.ops.aten.segment_reduce
    for initial in (None, 4.0):
        check_op(lambda t, n: sr(t, reduce, lengths=n, initial=initial),
                 x.clone().requires_grad_(), lengths, grad=True)
        check_op(lambda t, o: sr(t, reduce, offsets=o, initial=initial),
                 x.clone().requires_grad_(), offsets, grad=True)
    # a NaN wins max and min and gets their gradient; prod's for a NaN or a 0 is the others'
    nans = torch.tensor([float("nan"), 1.0, 0, -1, 2, 3, 0, 0, 5, float("inf"), 0])
    check_op(lambda t, n: sr(t, reduce, lengths=n), nans.requires_grad_(),
             torch.tensor([2, 1, 3, 3, 2]), grad=True)
    data, lens = torch.randn(2, 6, 3), torch.tensor([[2, 0, 3, 1], [1, 1, 1, 3]])
    check_op(lambda t, n: sr(t, reduce, lengths=n, axis=1), data.requires_grad_(), lens,
             grad=True)
    check_op(lambda t, n: sr(t, reduce, lengths=n, axis=1), data.detach().bfloat16(), lens)


@pytest.mark.parametrize("dtype", DTYPES + [torch.bool])
def test_rot90_and_resize_as(dtype, seed):
    x = _x((3, 4, 2), dtype) if dtype != torch.bool else torch.rand(3, 4, 2) > 0.5
    for k in (-1, 0, 1, 2, 3, 6):
        check_op(lambda t: torch.rot90(t, k, [0, 2]), x)
    check_error(lambda t: torch.rot90(t, 1, [1, 1]), x)
    check_op(lambda t, o: t.clone().resize_as_(o), x, torch.ones(2, 5))
    if dtype == torch.float32:
        check_op(lambda t: torch.rot90(t, 1, [1, 2]) * 2, x.requires_grad_(), grad=True)


@pytest.mark.parametrize("dtype", [None, torch.int32, torch.int64, torch.bfloat16])
def test_linspace_logspace_tensor_bounds(dtype):
    start, end = torch.tensor(1.5), torch.tensor(-3.7)
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    check_op(lambda s, e: torch.linspace(s, e, 5, dtype=dtype, device=s.device), start, end,
             **tol)
    check_op(lambda e: torch.linspace(2, e, 7, dtype=dtype, device=e.device), end, **tol)
    check_op(lambda s: torch.logspace(s, 3.7, 5, base=3, dtype=dtype, device=s.device), start)
    check_op(lambda s, e: torch.logspace(s, e, 6, dtype=dtype, device=s.device), end, start)
    check_op(lambda s: torch.logspace(-1.5, 2.7, 7, dtype=dtype, device=s.device), start)
    check_op(lambda s: torch.logspace(2, 2.7, 1, dtype=dtype, device=s.device), start)
    check_error(lambda s: torch.logspace(s, 3, 4, device=s.device), torch.ones(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_arange_linspace_logspace_into_out_tensors(dtype):
    # resized as the CPU resizes them, or written into a slice (torch.fft.fftfreq's way)
    calls = [lambda o: torch.arange(5, out=o), lambda o: torch.arange(1, 9, 3, out=o),
             lambda o: torch.linspace(-2, 3, 6, out=o), lambda o: torch.logspace(0, 2, 3, out=o)]
    for call in calls:
        for size in (0, 3, 8):
            with warnings.catch_warnings(record=True) as theirs:
                warnings.simplefilter("always")
                want = torch.zeros(size, dtype=dtype)
                call(want)
            with warnings.catch_warnings(record=True) as ours:
                warnings.simplefilter("always")
                got = torch.zeros(size, dtype=dtype, device="neuron")
                call(got)
            torch.testing.assert_close(got.cpu(), want)
            assert [str(w.message)[:40] for w in ours if "out tensor" in str(w.message)] == \
                [str(w.message)[:40] for w in theirs if "out tensor" in str(w.message)]
    check_op(lambda o: (torch.arange(2, out=o[2:4]), o)[1], torch.zeros(8, dtype=dtype))
    for n, d in ((6, 1.0), (7, 0.3)):
        check_op(lambda t: torch.fft.fftfreq(n, d, device=t.device) + t, torch.zeros(n))
        check_op(lambda t: torch.fft.rfftfreq(n, d, device=t.device) + t,
                 torch.zeros(n // 2 + 1))


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_embedding_max_norm_renormalises_looked_up_rows(norm_type, seed):
    def run(weight, idx):
        emb = torch.nn.Embedding.from_pretrained(weight.detach().clone(), freeze=False,
                                                 max_norm=1.0, norm_type=norm_type)
        out = emb(idx)
        return out, emb.weight.detach().clone()  # rows looked up are scaled in place

    check_op(run, torch.randn(10, 4) * 3, torch.tensor([[1, 2, 1], [3, 9, 2]]))


def test_bags_and_segments_with_strided_operands():
    """Strided per-sample weights and data reach the kernels as contiguous copies that must
    stay alive while they read them (Note [Blocks still seen])."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(10, 4, generator=g).requires_grad_()
    idx, off = torch.randint(0, 10, (12,), generator=g), torch.tensor([0, 3, 7])
    psw = torch.rand(12, 2, generator=g)
    check_op(lambda i, t, o, p: F.embedding_bag(i, t, o, mode="sum", per_sample_weights=p[:, 0]),
             idx, w, off, psw, grad=True)
    data = torch.randn(3, 6, generator=g).requires_grad_()
    lengths = torch.tensor([2, 3, 1])
    check_op(lambda d, n: torch.segment_reduce(d.T, "max", lengths=n), data, lengths, grad=True)


@pytest.mark.parametrize("case", ["kv cache step", "rows of a transposed matrix", "repeated index",
                                  "0-dim", "bf16 columns", "int64 rows"])
def test_index_copy_writes_what_the_cpu_writes(case):
    """index_copy_ runs as one scatter launch (a KV cache's write per generated token; the
    decomposition took 160 us); a repeated index keeps the last source slice, as the CPU."""
    g = torch.Generator().manual_seed(3)
    x, dim, index, source = {
        "kv cache step": (torch.zeros(2, 4, 8, 16), 2, torch.tensor([5]),
                          torch.randn(2, 4, 1, 16, generator=g)),
        "rows of a transposed matrix": (torch.randn(6, 5, generator=g).t(), 1,
                                        torch.tensor([4, 0, 2]), torch.randn(5, 3, generator=g)),
        "repeated index": (torch.zeros(5, 3), 0, torch.tensor([1, 3, 1]),
                           torch.randn(3, 3, generator=g)),
        "0-dim": (torch.tensor(1.5), 0, torch.tensor(0), torch.tensor(-2.0)),
        "bf16 columns": (torch.zeros(3, 7, dtype=torch.bfloat16), -1, torch.tensor([6, 0]),
                         torch.randn(3, 2, generator=g).bfloat16()),
        "int64 rows": (torch.zeros(4, 2, dtype=torch.int64), 0,
                                      torch.tensor([3, 2]), torch.tensor([[1, 2], [3, 4]])),
    }[case]
    dev = x.to(NEURON) if x.is_contiguous() else x.t().contiguous().to(NEURON).t()
    out = dev.index_copy(dim, index.to(NEURON), source.to(NEURON))
    assert dev.index_copy_(dim, index.to(NEURON), source.to(NEURON)) is dev
    expected = x.index_copy(dim, index, source)
    assert out.stride() == expected.stride()
    assert dev.stride() == x.stride()
    for got in (out, dev):
        assert torch.equal(got.cpu(), expected)


INDEX_FILLS = {  # index_fill_ writes in place (it filled a copy, then copied it back)
    "columns": lambda d: torch.arange(12., device=d).view(3, 4).index_fill_(
        1, torch.tensor([0, 3], device=d), -1.0),
    "a row of a transposed view": lambda d: torch.arange(12., device=d).view(3, 4).t()
    .index_fill_(0, torch.tensor([2], device=d), 5),
    "0-dim": lambda d: torch.tensor(3., device=d).index_fill_(0, torch.tensor(0, device=d), 7.),
    "a tensor value, negative index": lambda d: torch.arange(6, device=d).index_fill_(
        0, torch.tensor([1, -1], device=d), torch.tensor(9, device=d)),
    "an expanded tensor": lambda d: torch.zeros(3, device=d).expand(2, 3).index_fill_(
        1, torch.tensor([1], device=d), 1.0),
}


@pytest.mark.parametrize("name", INDEX_FILLS)
def test_index_fill_writes_what_the_cpu_writes(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the expanded tensor's deprecation, on both)
        got, expected = INDEX_FILLS[name]("neuron"), INDEX_FILLS[name]("cpu")
    assert got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)


def test_deprecated_indexing_warns_as_on_cpu():
    """uint8 masks and index_put_ into an expanded tensor: the CPU's deprecation warnings,
    once per call, at the user's line."""
    seen = []
    for d in ("cpu", NEURON):
        x = torch.zeros(3, device=d)
        mask = torch.tensor([1, 0, 1], dtype=torch.uint8, device=d)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x[mask]
            torch.zeros(1, device=d).expand(3).index_put_(
                (torch.tensor([0], device=d),), torch.tensor(5., device=d))
            y = torch.zeros(1, device=d).expand(3)
            y[torch.tensor([0], device=d)] = 5
            x.index_put_((mask,), torch.tensor([2., 3.], device=d))
        seen.append([(w.filename, w.lineno, str(w.message).split(" (Triggered")[0])
                     for w in caught])
    assert len(seen[0]) == 4 and seen[1] == seen[0]
