"""The dtypes the CPU's kernels refuse are refused on neuron too, in the CPU's words
(ops/cpu_dtypes.py); the table is checked against the CPU in both directions: each dtype it
lists runs on the CPU, each other dtype raises there and on neuron alike."""
import pytest
import torch
import torch.nn.functional as F

import neuron_eager  # noqa: F401
from neuron_eager.ops import cpu_dtypes

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


def _x4(dt, d):
    return (torch.arange(2 * 3 * 4 * 4) % 5).view(2, 3, 4, 4).to(dt).to(d)


def _v(dt, d, n=6):
    return (torch.arange(n) % 3).to(dt).to(d)


def _i(values, d):
    return torch.tensor(values, device=d)


# one call per kernel name of the table, its first tensor argument in the dtype under test
CALLS = {
    "avg_pool2d": lambda dt, d: F.avg_pool2d(_x4(dt, d), 2),
    "avg_pool3d_out_frame": lambda dt, d: F.avg_pool3d(_x4(dt, d)[None], 2),
    "im2col_out_cpu": lambda dt, d: F.unfold(_x4(dt, d), 2),
    "col2im_out_cpu": lambda dt, d: F.fold(F.unfold(_x4(torch.float32, d), 2).to(dt), (4, 4), 2),
    "index_func_": lambda dt, d: _v(dt, d).index_reduce(0, _i([0, 1], d), _v(dt, d, 2), "amax"),
    "bernoulli_tensor_cpu_p_": lambda dt, d: torch.bernoulli(torch.zeros(3, dtype=dt, device=d)),
    "smooth_l1_cpu": lambda dt, d: F.smooth_l1_loss(_v(dt, d), _v(dt, d)),
    "huber_cpu": lambda dt, d: F.huber_loss(_v(dt, d), _v(dt, d)),
    "binary_cross_entropy": lambda dt, d: F.binary_cross_entropy(_v(dt, d).clamp(0, 1),
                                                                 _v(dt, d).clamp(0, 1)),
    "nll_loss_out_frame": lambda dt, d: F.nll_loss(_x4(dt, d)[0, 0], _i([0, 1, 2, 3], d)),
    "nll_loss2d_forward_out_frame": lambda dt, d: F.nll_loss(_x4(dt, d),
                                                             _i([[[0] * 4] * 4] * 2, d)),
    "_segment_reduce_cpu": lambda dt, d: torch.segment_reduce(_v(dt, d), "sum",
                                                              lengths=_i([2, 4], d)),
    "cross": lambda dt, d: torch.linalg.cross(_v(dt, d, 3), _v(dt, d, 3)),
    "reflection_pad1d": lambda dt, d: F.pad(_x4(dt, d)[0], (1, 1), mode="reflect"),
    "reflection_pad2d": lambda dt, d: F.pad(_x4(dt, d), (1, 1, 1, 1), mode="reflect"),
    "reflection_pad3d": lambda dt, d: F.pad(_x4(dt, d)[None], (1,) * 6, mode="reflect"),
    "batch_norm": lambda dt, d: F.batch_norm(_x4(dt, d), None, None, training=True),
    "GroupNormKernelImpl": lambda dt, d: F.group_norm(_x4(dt, d), 3),
    "bincount_cpu": lambda dt, d: torch.bincount(_v(dt, d)),
    "embedding_bag": lambda dt, d: F.embedding_bag(_i([0, 1, 2], d), _x4(dt, d)[0, 0],
                                                   _i([0, 2], d)),
    # refused in their modules, in the CPU's words
    "linspace_cpu": lambda dt, d: torch.linspace(0, 4, 5, dtype=dt, device=d),
    "arange_cpu": lambda dt, d: torch.arange(5, dtype=dt, device=d),
    "exponential": lambda dt, d: torch.empty(3, dtype=dt, device=d).exponential_(),
    "multinomial": lambda dt, d: torch.multinomial(_v(dt, d) + 1, 2),
}
TAKES = {name: takes for _, name, takes in cpu_dtypes.REFUSALS}
TAKES.update(embedding_bag=cpu_dtypes.FLOATS, linspace_cpu=set(DTYPES) - {torch.bool},
             arange_cpu=set(DTYPES) - {torch.bool}, exponential=cpu_dtypes.FLOATS,
             multinomial=cpu_dtypes.FLOATS)


def _error(fn, dt, device):
    try:
        fn(dt, device)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e).splitlines()[0].split(" but got ")[0]  # (embedding_bag names
        # the device's tensor type)
    return None


def test_every_entry_of_the_table_is_tried():
    assert set(TAKES) == set(CALLS)


@pytest.mark.parametrize("name", CALLS)
def test_refused_dtypes_raise_as_on_cpu(name):
    for dt in DTYPES:
        cpu = _error(CALLS[name], dt, "cpu")
        if dt in TAKES[name]:  # (the CPU's bf16/fp16 gaps are computed, as on CUDA)
            assert cpu is None or dt in (torch.bfloat16, torch.float16), (dt, cpu)
        else:
            assert cpu is not None, f"the CPU takes {dt}"
            assert _error(CALLS[name], dt, "neuron") == cpu, dt
