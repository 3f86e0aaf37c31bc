"""ops/meta.py: cached meta runs give the CPU's checks and output metadata."""
import pytest
import torch
import torch.nn.functional as F

import neuron_eager  # noqa: F401
from neuron_eager.ops import meta

N = torch.device("neuron")


def test_bad_arguments_raise_every_time():
    x = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match="normalized_shape=\\[5\\]"):
        F.layer_norm(x, (5,))
    for _ in range(2):  # a failed run is not cached: it raises again
        with pytest.raises(RuntimeError, match="normalized_shape=\\[5\\]"):
            F.layer_norm(x.to(N), (5,))


def test_repeated_calls_reuse_the_run_and_match_cpu():
    x, w = torch.randn(3, 5, 8), torch.randn(8)
    expected = torch.ops.aten.native_layer_norm(x, [8], w, None, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.to(N), [8], w.to(N), None, 1e-5)
    size = len(meta._cache)
    again = torch.ops.aten.native_layer_norm(x.to(N), [8], w.to(N), None, 1e-5)
    assert len(meta._cache) == size
    for e, g, a in zip(expected, got, again):
        assert g.shape == a.shape == e.shape and g.dtype == a.dtype == e.dtype
        torch.testing.assert_close(a.cpu(), e, rtol=1e-5, atol=1e-5)


def test_signature_tells_layouts_and_values_apart():
    t = torch.empty(2, 3)
    assert meta._signature(t) != meta._signature(t.t().contiguous().t())
    assert meta._signature([1, 2]) != meta._signature((1, 2))
    assert meta._signature(1e-5) != meta._signature(1e-6)


@pytest.mark.parametrize("call", [
    lambda x, grid: F.interpolate(x, scale_factor=2, mode="bilinear"),
    lambda x, grid: F.grid_sample(x, grid, align_corners=False),
    lambda x, grid: F.avg_pool2d(x, 2),
    lambda x, grid: torch.arange(0.5, 4, device=x.device) + x,
    lambda x, grid: F.interpolate(x, scale_factor=2, mode="nearest"),
    lambda x, grid: torch.diag_embed(x[0, 0]),
])
def test_kernels_checking_on_meta_run_each_signature_once(call, monkeypatch):
    """Resampling, grid sampling, pooling, factories and diag_embed check their arguments on
    meta tensors (some meta kernels are Python decompositions: bilinear upsampling's took
    ~36 ms a call, arange's ~1 ms, diag_embed's 0.4 ms)."""
    x, grid = torch.randn(1, 2, 4, 4), torch.rand(1, 3, 3, 2) * 2 - 1
    expected = call(x, grid)
    x, grid = x.to(N), grid.to(N)
    runs = []
    real = meta._run_meta
    monkeypatch.setattr(meta, "_run_meta", lambda *a: runs.append(a) or real(*a))
    meta._cache.clear()
    first, second = call(x, grid), call(x, grid)
    assert len(runs) == 1
    for got in (first, second):
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=1e-6)


def test_factories_follow_the_default_dtype():
    for dtype in (torch.float64, torch.float32):
        with torch.device("cpu"):
            previous = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                assert torch.arange(0.0, 3, device=N).dtype == dtype
                assert torch.full((2,), 1.5, device=N).dtype == dtype
            finally:
                torch.set_default_dtype(previous)


def test_normal_of_tensors_runs_its_meta_check_once(monkeypatch):
    mean, std = torch.randn(4, 5, device=N), torch.rand(4, 5, device=N)
    runs = []
    real = meta._run_meta
    monkeypatch.setattr(meta, "_run_meta", lambda *a: runs.append(a) or real(*a))
    meta._cache.clear()
    for _ in range(2):
        assert torch.normal(mean, std).shape == (4, 5)
    assert len(runs) == 1
    with pytest.raises(RuntimeError, match="must match the size"):
        torch.normal(mean, torch.ones(3, device=N))
