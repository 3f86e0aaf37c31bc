"""Large float32 add/sub/mul/div results written with streaming stores (ops/streaming.py):
the same bits as the CPU, at any alignment, with tensor and scalar operands."""
import numpy as np
import pytest
import torch

import neuron_eager  # noqa: F401
from neuron_eager.ops import streaming, workers

N = workers.SPLIT_MIN + 37  # split across the engine workers, odd lengths: heads and tails


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("name,fn", [("add_plain", torch.add), ("sub_plain", torch.sub),
                                     ("mul", torch.mul), ("div", torch.div)])
def test_streaming_kernels_give_the_cpu_bits(name, fn, monkeypatch):
    monkeypatch.setattr(streaming, "MIN_BYTES", 0)  # (the real threshold: 3/4 of the L3)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(N + 8, generator=g), torch.randn(N + 8, generator=g)
    y[::5] = 0.0  # division by zero: inf and nan, as IEEE says
    y[1::9] = float("nan")
    on = x.to("neuron"), y.to("neuron")
    for start in (0, 1, 3):  # out and operands at other offsets from a 32-byte boundary
        a, b = x[start:start + N], y[:N]
        got = fn(on[0][start:start + N], on[1][:N]).cpu()
        want = fn(a, b)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(_bits(got)[~want.isnan()], _bits(want)[~want.isnan()])
    got, want = fn(on[1][:N], 0.1).cpu(), fn(y[:N], 0.1)  # a Python scalar, rounded to fp32
    assert torch.equal(_bits(got)[~want.isnan()], _bits(want)[~want.isnan()])
    assert streaming.KERNELS[name].signatures  # the streaming kernel ran


def test_small_results_and_other_dtypes_keep_the_generated_kernels():
    out = torch.empty(16).numpy()
    assert streaming.kernel_for("add_plain", out, [out, out]) is None  # under the threshold
    big = torch.empty(streaming.MIN_BYTES // 2, dtype=torch.float16).numpy()
    assert streaming.kernel_for("add_plain", big, [big, big]) is None
    assert streaming.kernel_for("maximum", out, [out, out]) is None


def test_the_threshold_counts_the_arrays_a_loop_reads():
    third = torch.empty(streaming.MIN_BYTES // 12 + 1).numpy()  # a third of MIN_BYTES
    assert streaming.kernel_for("add_plain", third, [third, third]) is not None
    assert streaming.kernel_for("add_plain", third, [third, np.float32(1)]) is None
