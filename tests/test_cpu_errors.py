"""Bad arguments raise what the CPU raises (type and words) and change nothing, and valid
calls that once ran wrong (a device argument ignored, a layout dropped) now give the
CPU's answer. Each case runs the same program on the CPU and on neuron."""
import copy
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from checks import outcome
from neuron_eager.ops import numerics


def _t(device, values, **kwargs):
    return torch.tensor(values, device=device, **kwargs)


def _expanded(device):
    return torch.zeros(3, device=device).expand(4, 3)


ERRORS = {
    "a CPU 0-dim tensor updated in place by a neuron one": lambda d: torch.tensor(1.).add_(
        torch.tensor(2., device=d)) if d != "cpu" else __outcome_error(
        "Expected all tensors to be on the same device, but found at least two devices, "
        "neuron:0 and cpu!"),
    **{f"{name} out= of another dtype": (lambda name: lambda d: getattr(torch, name)(
        _t(d, [1.5, -2.0]), out=torch.empty(2, dtype=torch.half, device=d)))(name)
       for name in ("abs", "neg", "sign", "ceil", "round", "frac")},
    "signbit out= of float": lambda d: torch.signbit(_t(d, [1.5, -2.0]), out=torch.empty(
        2, device=d)),
    # (a divisor that wraps to 0 in the tensor's type: Note [Integer scalars wrap])
    "uint8 // 256": lambda d: torch.arange(3, dtype=torch.uint8, device=d) // 256,
    "int8 % 2**31": lambda d: torch.arange(3, dtype=torch.int8, device=d) % 2 ** 31,
    "uint8 // tensor(256)": lambda d: torch.arange(3, dtype=torch.uint8, device=d) // _t(d, 256),
    "fill_ of an expanded tensor with a neuron 0-dim value": lambda d: _expanded(d).fill_(
        _t(d, 1.)),
    "index_add_ of a scalar, two indices": lambda d: torch.zeros((), device=d).index_add_(
        0, _t(d, [0, 0]), torch.ones((), device=d)),
    "ctc_loss with more concatenated targets than their lengths": lambda d: F.ctc_loss(
        torch.zeros(12, 2, 6, device=d).log_softmax(-1), torch.ones(9, dtype=torch.long,
                                                                    device=d), [12, 10], [4, 3]),
    "index_select 2-D index": lambda d: torch.arange(5., device=d).index_select(
        0, _t(d, [[1, 2]])),
    "index_select float index": lambda d: torch.arange(5., device=d).index_select(
        0, _t(d, [1.])),
    "index_select dim": lambda d: torch.arange(5., device=d).index_select(1, _t(d, [1])),
    "index_add source shape": lambda d: torch.zeros(3, 2, device=d).index_add(
        0, _t(d, [0, 1]), torch.ones(2, 5, device=d)),
    "index_add_ source shape": lambda d: torch.zeros(3, 2, device=d).index_add_(
        0, _t(d, [0, 1]), torch.ones(2, 5, device=d)),
    "index_add count": lambda d: torch.zeros(3, 2, device=d).index_add(
        0, _t(d, [0, 1, 2]), torch.ones(2, 2, device=d)),
    "index_add float index": lambda d: torch.zeros(3, 2, device=d).index_add(
        0, _t(d, [0., 1.]), torch.ones(2, 2, device=d)),
    "index_add 2-D index": lambda d: torch.zeros(3, 2, device=d).index_add(
        0, _t(d, [[0, 1]]), torch.ones(2, 2, device=d)),
    "index_add dtypes": lambda d: torch.zeros(3, 2, device=d).index_add(
        0, _t(d, [0, 1]), torch.ones(2, 2, dtype=torch.int64, device=d)),
    "index_fill float index": lambda d: torch.zeros(3, 2, device=d).index_fill(
        0, _t(d, [0.]), 1.),
    "index_fill 2-D index": lambda d: torch.zeros(3, 2, device=d).index_fill(
        0, _t(d, [[0]]), 1.),
    "index_reduce source shape": lambda d: torch.zeros(3, 2, device=d).index_reduce(
        0, _t(d, [0, 1]), torch.ones(2, 5, device=d), "amax"),
    "index_reduce count": lambda d: torch.zeros(3, 2, device=d).index_reduce(
        0, _t(d, [0, 1, 2]), torch.ones(2, 2, device=d), "amax"),
    "as_strided past the storage": lambda d: torch.zeros(10, device=d).as_strided(
        (3,), (1,), 20),
    "empty_strided negative stride": lambda d: torch.empty_strided((2, 3), (3, -1), device=d),
    "arange to nan": lambda d: torch.arange(0, float("nan"), device=d),
    "index_select of a scalar by two indices": lambda d: torch.index_select(
        torch.tensor(3.5, device=d), 0, _t(d, [0, 0])),
    "kthvalue over an empty dim": lambda d: torch.zeros(2, 0, device=d).kthvalue(1, 1),
    "median over an empty dim": lambda d: torch.zeros(2, 0, device=d).median(1),
    "roll of a scalar along -1": lambda d: torch.roll(torch.tensor(1., device=d), -2, dims=-1),
    "arange from -inf": lambda d: torch.arange(float("-inf"), 3, device=d),
    "bilinear upsampling of no channels": lambda d: F.interpolate(
        torch.zeros(2, 0, 5, 5, device=d), scale_factor=2, mode="bilinear"),
    "embedding_bag float indices": lambda d: F.embedding_bag(
        _t(d, [1., 2.]), torch.ones(4, 3, device=d), _t(d, [0])),
    "ctc_loss of an empty batch": lambda d: F.ctc_loss(
        torch.zeros(5, 0, 4, device=d), torch.zeros(0, 3, dtype=torch.long, device=d),
        torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)),
    "reflection pad 1-d to nothing": lambda d: F.pad(torch.zeros(2, 3, 6, device=d), [-3, -3],
                                                     mode="reflect"),
    "replication pad 1-d to nothing": lambda d: F.pad(torch.zeros(2, 3, 3, device=d), [-2, -1],
                                                      mode="replicate"),
    "new_empty_strided negative stride": lambda d: torch.zeros(3, device=d).new_empty_strided(
        (2,), (-1,)),
    "linspace bound past int8": lambda d: torch.linspace(0, 300, 4, dtype=torch.int8, device=d),
    "bucketize 2-D boundaries": lambda d: torch.bucketize(_t(d, [1., 2.]), _t(d, [[1., 2.]])),
    "one_hot too large": lambda d: torch.nn.functional.one_hot(_t(d, [0, 5]), 3),
    "one_hot negative": lambda d: torch.nn.functional.one_hot(_t(d, [-1]), 3),
    "one_hot int32": lambda d: torch.nn.functional.one_hot(_t(d, [1], dtype=torch.int32), 3),
    "clamp of bool by a bool": lambda d: torch.clamp(_t(d, [True, False]), min=True),
    "clamp_max_ of bool": lambda d: _t(d, [True, False]).clamp_max_(False),
    "clamp of bool by two bools": lambda d: torch.clamp(_t(d, [True]), True, False),
    "clamp of bool by two bool tensors": lambda d: torch.clamp(
        _t(d, [True]), _t(d, [False]), _t(d, [True])),
    "hardtanh of bool": lambda d: torch.nn.functional.hardtanh(_t(d, [True])),
    "index_select along dim 1 out of range": lambda d: torch.zeros(2, 3, 4, device=d).index_select(
        1, _t(d, [3])),
    "index_select along dim 2 out of range": lambda d: torch.zeros(2, 3, 4, device=d).index_select(
        2, _t(d, [-5])),
    "an index into a dim of size 0": lambda d: torch.zeros(0, 3, device=d)[[3]],
    "index_put_ into a dim of size 0": lambda d: torch.zeros(0, 3, device=d).index_put_(
        (_t(d, [0]), _t(d, [9])), _t(d, 1.)),
    "view of a transposed tensor as a narrower dtype": lambda d: torch.zeros(
        3, 4, device=d).t().view(torch.int8),
    "_assert_async of zero": lambda d: torch._assert_async(_t(d, 0.)),
    "_assert_async of zero, with a message": lambda d: torch._assert_async(_t(d, 0), "no!"),
    "_assert_async of two values": lambda d: torch._assert_async(_t(d, [1, 1])),
    "_assert_async of no value": lambda d: torch._assert_async(_t(d, []), "empty"),
    "embedding_bag last offset": lambda d: torch.nn.functional.embedding_bag(
        _t(d, [0, 1]), torch.ones(3, 2, device=d), _t(d, [0, 3])),
    "embedding_bag first offset": lambda d: torch.nn.functional.embedding_bag(
        _t(d, [0, 1]), torch.ones(3, 2, device=d), _t(d, [1, 2])),
    "cat of 0-dim tensors": lambda d: torch.cat([_t(d, 1.), _t(d, 2.)]),
    "cat into an input that must grow": lambda d: (lambda x: torch.cat([x, x], out=x))(
        torch.arange(4., device=d)),
    "copy_ of another size": lambda d: torch.zeros(3, device=d).copy_(torch.ones(2, device=d)),
    "copy_ that broadcasts out": lambda d: torch.zeros(3, device=d).copy_(
        torch.ones(3, 3, device=d)),
    "gather index too large": lambda d: torch.zeros(3, 4, device=d).gather(
        0, torch.zeros(5, 5, dtype=torch.long, device=d)),
    "grid_sample grid of 3 coords": lambda d: torch.nn.functional.grid_sample(
        torch.ones(1, 1, 3, 3, device=d), torch.zeros(1, 2, 2, 3, device=d),
        align_corners=False),
    # ops the CPU has no bool (or integer) kernel for
    "abs of bool": lambda d: _t(d, [True, False]).abs(),
    "abs_ of bool": lambda d: _t(d, [True, False]).abs_(),
    "floor of bool": lambda d: _t(d, [True, False]).floor(),
    "round of bool": lambda d: _t(d, [True, False]).round(),
    "bool // bool": lambda d: _t(d, [True, False]) // True,
    "bool % bool": lambda d: _t(d, [True, False]) % _t(d, [True, True]),
    "fmod of bool": lambda d: torch.fmod(_t(d, [True, False]), True),
    "bool div trunc": lambda d: torch.div(_t(d, [True]), True, rounding_mode="trunc"),
    "lerp of ints": lambda d: torch.lerp(_t(d, [3, 0]), _t(d, [1, 2]), 0.5),
    "lerp of bools, weight tensor": lambda d: torch.lerp(_t(d, [True]), _t(d, [False]),
                                                         _t(d, [True])),
    "lerp end of another dtype": lambda d: torch.lerp(_t(d, [1.]), _t(d, [2.], dtype=torch.half),
                                                      0.5),
    "lerp weight of another dtype": lambda d: torch.lerp(_t(d, [1.]), _t(d, [2.]),
                                                         _t(d, [.5], dtype=torch.half)),
    "addcmul of bools": lambda d: torch.addcmul(_t(d, [True]), _t(d, [True]), _t(d, [False])),
    "addcdiv of integers": lambda d: torch.addcdiv(_t(d, [1.]), _t(d, [3]), _t(d, [2])),
    "logaddexp of integers": lambda d: torch.logaddexp(_t(d, [1]), _t(d, [2])),
    "threshold of bools": lambda d: torch.nn.functional.threshold(_t(d, [True]), 0.5, 1.),
    "fill_ with an imaginary part": lambda d: torch.ones(2, device=d).fill_(1j),
    # valid: -1 would wrap to 255 (it once gave [1, 1] for [3, 0])
    "hardtanh of uint8 below 0": lambda d: torch.nn.functional.hardtanh(
        _t(d, [3, 0], dtype=torch.uint8)),
    "round(decimals) of int": lambda d: torch.round(_t(d, [15]), decimals=-1),
    "topk of bools": lambda d: torch.topk(_t(d, [True, False, True]), 2),
    "searchsorted of bools": lambda d: torch.searchsorted(_t(d, [False, True]),
                                                          _t(d, [True])),
    "searchsorted of a bool scalar": lambda d: torch.searchsorted(_t(d, [False, True]), True),
    "bucketize of bools": lambda d: torch.bucketize(_t(d, [True]), _t(d, [False, True])),
    "isin of bools": lambda d: torch.isin(_t(d, [True]), _t(d, [False, True])),
    "isin of a float and a bool": lambda d: torch.isin(_t(d, [1.]), True),
    # valid-looking: clamped [1, 2, 3] to [1, 1, 1] with max 1.5
    "in-place clamp of ints, float bound": lambda d: _t(d, [1, 2, 3]).clamp_max_(1.5),
    "in-place clamp of int32, float bounds": lambda d: _t(d, [1, 2], dtype=torch.int32).clamp_(
        0.5, 2.5),
    # valid-looking: filled 44 and inf
    "masked_fill of uint8 with a tensor 300": lambda d: torch.zeros(
        2, dtype=torch.uint8, device=d).masked_fill(_t(d, [True, False]), _t(d, 300)),
    "masked_fill of fp16 with a tensor 1e5": lambda d: torch.zeros(
        2, dtype=torch.half, device=d).masked_fill(_t(d, [True, False]), _t(d, 1e5)),
    "unique of a 0-dim tensor along dim 0": lambda d: torch.unique(_t(d, 5), dim=0),
    # raised another type or other words (a sweep of 79 programs, 2026-12-06)
    "index_add index out of range": lambda d: torch.zeros(3, device=d).index_add(
        0, _t(d, [4]), torch.ones(1, device=d)),
    "index_copy index out of range": lambda d: torch.zeros(3, device=d).index_copy(
        0, _t(d, [4]), torch.ones(1, device=d)),
    "take index out of range": lambda d: torch.zeros(3, device=d).take(_t(d, [7])),
    "embedding_bag index out of range": lambda d: torch.nn.functional.embedding_bag(
        _t(d, [1, -1]), torch.zeros(3, 2, device=d), _t(d, [0])),
    "pixel_unshuffle of an odd height": lambda d: torch.nn.functional.pixel_unshuffle(
        torch.zeros(1, 1, 3, 3, device=d), 2),
    "pixel_shuffle of 12 channels by 5": lambda d: torch.nn.functional.pixel_shuffle(
        torch.zeros(1, 12, 3, 4, device=d), 5),
    "pixel_unshuffle by 0": lambda d: torch.nn.functional.pixel_unshuffle(
        torch.zeros(1, 1, 4, 4, device=d), 0),
    "histc with max below min": lambda d: torch.histc(torch.zeros(3, device=d), 4, 2, 1),
    "masked_select of a longer mask": lambda d: torch.zeros(3, device=d).masked_select(
        torch.ones(4, dtype=torch.bool, device=d)),
    "unfold with a kernel larger than the image": lambda d: torch.nn.functional.unfold(
        torch.zeros(1, 2, 4, 4, device=d), 5),
    "unfold with stride 0": lambda d: torch.nn.functional.unfold(
        torch.zeros(1, 2, 4, 4, device=d), 3, stride=0),
    "fold of channels not divisible by the kernel": lambda d: torch.nn.functional.fold(
        torch.zeros(1, 17, 4, device=d), (4, 4), 3),
    "fold of the wrong number of blocks": lambda d: torch.nn.functional.fold(
        torch.zeros(1, 18, 5, device=d), (4, 4), 3),
    "_foreach_norm inf of an empty tensor": lambda d: torch._foreach_norm(
        [torch.zeros(0, device=d)], float("inf")),
    # valid-looking: searched through the sorter as given
    "searchsorted with an int32 sorter": lambda d: torch.searchsorted(
        _t(d, [3., 1., 2.]), _t(d, [0., 1.5]), sorter=_t(d, [1, 2, 0], dtype=torch.int32)),
    "searchsorted with a sorter index out of range": lambda d: torch.searchsorted(
        _t(d, [3., 1., 2.]), _t(d, [0., 1.5]), sorter=_t(d, [1, 2, 7])),
    "searchsorted with a negative sorter index": lambda d: torch.searchsorted(
        _t(d, [3., 1., 2.]), _t(d, [0., 1.5]), sorter=_t(d, [-1, 2, 0])),
    # writes into an expanded tensor (several elements, one memory location): ran before
    "index_add_ of an expanded tensor": lambda d: _expanded(d).index_add_(
        1, _t(d, [0, 2]), torch.ones(4, 2, device=d)),
    "index_copy_ of an expanded tensor": lambda d: _expanded(d).index_copy_(
        1, _t(d, [0, 2]), torch.ones(4, 2, device=d)),
    "masked_scatter_ of an expanded tensor": lambda d: _expanded(d).masked_scatter_(
        torch.ones(4, 3, dtype=torch.bool, device=d), torch.ones(12, device=d)),
    "uniform_ of an expanded tensor": lambda d: _expanded(d).uniform_(),
    "normal_ of an expanded tensor": lambda d: _expanded(d).normal_(),
    "bernoulli_ of an expanded tensor": lambda d: _expanded(d).bernoulli_(0.5),
    "random_ of an expanded tensor": lambda d: _expanded(d).random_(0, 5),
    # arguments the meta kernels and decompositions let through, which read past memory or
    # wrapped around (garbage, and a crash in a transposed convolution's backward)
    "conv2d negative padding": lambda d: F.conv2d(_image(d), _taps(d), padding=-1),
    "conv2d dilation 0": lambda d: F.conv2d(_image(d), _taps(d), dilation=0),
    "conv2d stride 0": lambda d: F.conv2d(_image(d), _taps(d), stride=0),
    "conv2d bias of 3 for 1 channel": lambda d: F.conv2d(_image(d), _taps(d), _t(d, [1., 2, 3])),
    "conv_transpose2d output_padding >= stride": lambda d: F.conv_transpose2d(
        _image(d), _taps(d), stride=2, output_padding=2),
    "conv_transpose2d input channels": lambda d: F.conv_transpose2d(
        torch.ones(1, 3, 4, 4, device=d), torch.ones(1, 2, 3, 3, device=d)),
    "unfold negative padding": lambda d: F.unfold(_image(d), 3, padding=-1),
    "embedding_bag decreasing offsets": lambda d: F.embedding_bag(
        _t(d, [0, 1, 2, 1]), torch.ones(3, 2, device=d), _t(d, [0, 3, 1])),
    "reflection pad as wide as its dim": lambda d: F.pad(_image(d)[0], (5, 5), mode="reflect"),
    "reflection pad 2-d past its dim": lambda d: F.pad(_image(d), (0, 0, 6, 0), mode="reflect"),
    "interpolate to size 0": lambda d: F.interpolate(_image(d), size=0),
    "bilinear interpolate to size 0": lambda d: F.interpolate(_image(d), size=(0, 3),
                                                              mode="bilinear"),
    "smooth_l1_loss negative beta": lambda d: F.smooth_l1_loss(
        _t(d, [1., 2.]), _t(d, [0., 0.]), beta=-1.0),
    "max_unpool2d index -1": lambda d: F.max_unpool2d(
        torch.ones(1, 1, 2, 2, device=d), _t(d, [[[[0, 1], [2, -1]]]]), 2),
    "max_unpool2d index past the plane": lambda d: F.max_unpool2d(
        torch.ones(1, 1, 2, 2, device=d), _t(d, [[[[0, 1], [2, 99]]]]), 2),
    "searchsorted side 'middle'": lambda d: torch.searchsorted(
        _t(d, [1., 2.]), _t(d, [1.5]), side="middle"),
    "searchsorted side and right opposite": lambda d: torch.searchsorted(
        _t(d, [1., 2.]), _t(d, [1.5]), side="left", right=True),
    "binary_cross_entropy float64 target": lambda d: F.binary_cross_entropy(
        torch.full((3,), 0.5, device=d), _t(d, [0., 1., 1.], dtype=torch.float64)),
    "binary_cross_entropy int64 target": lambda d: F.binary_cross_entropy(
        torch.full((3,), 0.5, device=d), _t(d, [0, 1, 1])),
    "multi_margin_loss float target": lambda d: F.multi_margin_loss(
        torch.ones(2, 3, device=d), _t(d, [0., 2.])),
    "multi_margin_loss int32 target": lambda d: F.multi_margin_loss(
        torch.ones(2, 3, device=d), _t(d, [0, 2], dtype=torch.int32)),
    "multilabel_margin_loss int32 target": lambda d: F.multilabel_margin_loss(
        torch.ones(2, 3, device=d), _t(d, [[0, -1, 0], [2, 1, -1]], dtype=torch.int32)),
    "huber_loss backward of a float64 target": lambda d: F.huber_loss(
        torch.ones(3, device=d, requires_grad=True), _t(d, [0., 2., 1.],
                                                       dtype=torch.float64)).backward(),
    "searchsorted of 0-dim boundaries": lambda d: torch.searchsorted(_t(d, 1.), _t(d, [.5])),
    "searchsorted of 0-dim boundaries and value": lambda d: torch.searchsorted(_t(d, 1.), .5),
    "histogram with one bin edge": lambda d: torch.histogram(_t(d, [.5]), _t(d, [0.])),
    "histogram edges of another dtype": lambda d: torch.histogram(
        _t(d, [.5]), _t(d, [0., 1.], dtype=torch.float16)),
    "histogramdd with 0 bins": lambda d: torch.histogramdd(_t(d, [[.5]]), [0]),
    "histc with 0 bins": lambda d: torch.histc(_t(d, [.5]), 0),
    "segment_reduce lengths past the data": lambda d: torch.segment_reduce(
        torch.arange(6., device=d), "sum", lengths=_t(d, [3, 4])),
    "take with an int32 index": lambda d: torch.arange(4., device=d).take(
        _t(d, [0, 3], dtype=torch.int32)),
    # the CPU's words where ours differed (Note [Errors in the CPU's words] in ops/meta.py)
    "softmax of int64 over the last dim": lambda d: F.softmax(_t(d, [[1, 2]]), -1),
    "log_softmax of int64 over another dim": lambda d: F.log_softmax(_t(d, [[1, 2]]), 0),
    "multi_margin_loss target out of range": lambda d: F.multi_margin_loss(
        torch.ones(2, 3, device=d), _t(d, [0, 5])),
    "embedding with float indices": lambda d: F.embedding(_t(d, [0., 1.]),
                                                          torch.ones(3, 2, device=d)),
    "aminmax of an empty tensor": lambda d: torch.empty(0, device=d).aminmax(),
    "index_copy of another dtype": lambda d: torch.zeros(3, 2, device=d).index_copy(
        0, _t(d, [0, 1]), torch.ones(2, 2, dtype=torch.half, device=d)),
    "gather with a float index": lambda d: torch.gather(torch.ones(2, 2, device=d), 1,
                                                        _t(d, [[0.], [1.]])),
    "matrix_power of int64 to -1": lambda d: _t(d, [[1, 0], [0, 1]]).matrix_power(-1),
    "add of ints with a float alpha": lambda d: torch.add(_t(d, [1, 2]), _t(d, [1, 2]),
                                                          alpha=2.5),
    "add of floats with a bool alpha": lambda d: torch.add(_t(d, [1., 2]), 1, alpha=True),
    # writes into memory an argument lies in (Note [Writes into their own inputs])
    "x[idx] = part of x": lambda d: _setitem(torch.arange(8., device=d), _t(d, [1, 2]),
                                             lambda x: x[:2]),
    "index_add_ from itself": lambda d: (lambda x: x.index_add_(0, _t(d, [1, 2]), x[:2]))(
        torch.arange(8., device=d)),
    "scatter_ from itself": lambda d: (lambda x: x.scatter_(0, _t(d, [1, 2]), x[:2]))(
        torch.arange(8., device=d)),
    "gather out= its input": lambda d: (lambda x: torch.gather(x, 0, _t(d, [1, 0]), out=x))(
        torch.arange(2., device=d)),
    # values that do not fit the written dtype
    "index_fill of float16 past its range": lambda d: torch.zeros(3, dtype=torch.half,
                                                                 device=d).index_fill(
        0, _t(d, [0]), 70000.),
    "masked_fill of uint8 with a negative float": lambda d: torch.zeros(
        2, dtype=torch.uint8, device=d).masked_fill(_t(d, [True, False]), -1.7),
    "scalar_tensor past float32's range": lambda d: torch.scalar_tensor(1e39, device=d),
    "full of float16 past its range": lambda d: torch.full((2,), 70000, dtype=torch.half,
                                                           device=d),
    "empty of a negative size": lambda d: torch.empty(2, -1, -5, device=d),
    "randn of a negative size": lambda d: torch.randn(3, -1, device=d),
    "new_full of a negative size": lambda d: torch.ones(3, device=d).new_full((2, -1), 3.),
    "zeros of a negative size": lambda d: torch.zeros(2, -3, device=d),
    "_foreach_add_ of a 1-D tensor": lambda d: torch._foreach_add_(
        [torch.ones(3, device=d)], torch.ones(3, device=d)),
    "_foreach_mul of a (1, 1) tensor": lambda d: torch._foreach_mul(
        [torch.ones(3, device=d)], torch.ones(1, 1, device=d)),
    "interpolate of int64": lambda d: F.interpolate(
        torch.ones(1, 2, 4, 4, dtype=torch.int64, device=d), scale_factor=2),
    "bilinear interpolate of int32": lambda d: F.interpolate(
        torch.ones(1, 2, 4, 4, dtype=torch.int32, device=d), scale_factor=2, mode="bilinear"),
    "trilinear interpolate of uint8": lambda d: F.interpolate(
        torch.ones(1, 2, 2, 4, 4, dtype=torch.uint8, device=d), scale_factor=2,
        mode="trilinear"),
    "conv2d of bf16 with a float weight and no bias": lambda d: F.conv2d(
        torch.ones(1, 3, 5, 5, dtype=torch.bfloat16, device=d), torch.ones(2, 3, 3, 3, device=d)),
    "conv_transpose2d of fp16 with a float weight": lambda d: F.conv_transpose2d(
        torch.ones(1, 3, 5, 5, dtype=torch.float16, device=d), torch.ones(3, 2, 3, 3, device=d),
        torch.ones(2, device=d)),
    "deepcopy of a non-leaf": lambda d: copy.deepcopy(
        torch.ones(3, device=d, requires_grad=True) * 2),
    "cross_entropy with a float target of another shape": lambda d: F.cross_entropy(
        torch.ones(4, 5, device=d), torch.ones(4, 6, device=d)),
    "nll_loss with a float target and a wrong weight": lambda d: F.nll_loss(
        torch.ones(4, 5, device=d), torch.ones(4, device=d), weight=torch.ones(3, device=d)),
    "nll_loss 2-D with a wrong weight and target": lambda d: F.nll_loss(
        torch.ones(2, 5, 3, 3, device=d), torch.zeros(2, 3, 4, dtype=torch.long, device=d),
        weight=torch.ones(2, device=d)),
    "empty_strided of a negative size": lambda d: torch.empty_strided((2, -3), (1, 1), device=d),
    "randperm of a negative size": lambda d: torch.randperm(-2, device=d),
    "channels_last of a 3-d tensor": lambda d: torch.ones(2, 3, 4, device=d).contiguous(
        memory_format=torch.channels_last),
    "an inference tensor's view updated outside inference_mode": lambda d: _inference(d)[0].add_(1),
    "heaviside of float32 and float64": lambda d: torch.heaviside(
        _t(d, [1., 0.]), _t(d, [0.5], dtype=torch.float64)),
    "cdist of float32 and float64": lambda d: torch.cdist(
        torch.ones(2, 3, device=d), torch.ones(2, 3, device=d, dtype=torch.float64)),
    # out= of another dtype that the CPU refuses (it casts only elementwise results and sums)
    "mm out= float16": lambda d: torch.mm(torch.ones(2, 2, device=d), torch.ones(2, 2, device=d),
                                          out=torch.empty(0, dtype=torch.half, device=d)),
    "max indices out= int32": lambda d: torch.max(torch.ones(2, 2, device=d), 1, out=(
        torch.empty(0, device=d), torch.empty(0, dtype=torch.int32, device=d))),
    "sort indices out= int32": lambda d: torch.sort(torch.ones(2, 2, device=d), out=(
        torch.empty(0, device=d), torch.empty(0, dtype=torch.int32, device=d))),
    "gather out= float16": lambda d: torch.gather(
        torch.ones(2, 2, device=d), 1, _t(d, [[0], [1]]),
        out=torch.empty(0, dtype=torch.half, device=d)),
    # dtypes the CPU has no kernel for (bool ** bool, ~float, a bool arange) or checks later
    "pow of two bool tensors": lambda d: torch.pow(_t(d, [True, False]), _t(d, [True, True])),
    "pow_ of bool by bool": lambda d: _t(d, [True, False]).pow_(_t(d, [False, True])),
    "True ** bool tensor": lambda d: torch.pow(True, _t(d, [True, False])),
    "bitwise_not of float": lambda d: torch.ones(2, device=d).bitwise_not(),
    "bitwise_not_ of float": lambda d: torch.ones(2, device=d).bitwise_not_(),
    "arange of bool": lambda d: torch.arange(3, dtype=torch.bool, device=d),
    "kthvalue k out of range on bool": lambda d: torch.kthvalue(_t(d, [True, False]), 5),
    "where of a float condition": lambda d: torch.where(
        torch.ones(2, device=d), torch.ones(2, device=d), torch.zeros(2, device=d)),
    # messages that name the value's type say Tensor, as the CPU's
    "divmod of a tensor": lambda d: divmod(torch.ones(2, device=d), 2),
    "a format spec for a tensor of two elements": lambda d: "{:.2f}".format(
        torch.ones(2, device=d)),
    "resize_ to preserve_format": lambda d: torch.ones(2, 3, device=d).resize_(
        3, 2, memory_format=torch.preserve_format),
    "dropout of integers while training": lambda d: F.dropout(_t(d, [1, 2, 3]), 0.5, True),
    "native_dropout of bools": lambda d: torch.native_dropout(_t(d, [True, False]), 0.5, True),
    "masked_scatter with a uint8 mask": lambda d: torch.zeros(3, device=d).masked_scatter(
        _t(d, [1, 0, 1], dtype=torch.uint8), torch.ones(3, device=d)),
    "masked_scatter of another dtype": lambda d: torch.zeros(3, device=d).masked_scatter(
        torch.ones(3, dtype=torch.bool, device=d), torch.ones(3, device=d).bfloat16()),
    "index_copy_ past a 0-dim tensor": lambda d: torch.tensor(1.5, device=d).index_copy_(
        0, _t(d, 1), torch.tensor(2.0, device=d)),
    "index_copy_ before a 0-dim tensor": lambda d: torch.tensor(1.5, device=d).index_copy_(
        0, _t(d, -1), torch.tensor(2.0, device=d)),
    "index_fill_ of its own index": lambda d: (lambda x: x.index_fill_(0, x[:1], 0))(
        torch.arange(5, device=d)),
    "index_copy_ of too few indices": lambda d: torch.zeros(2, 3, 4, device=d).index_copy_(
        1, _t(d, [1]), torch.ones(2, 2, 4, device=d)),
    # a view's error names the CPU's tensor type, not the meta kernel's (MetaFloatType)
    "a cache slot assigned the wrong shape": lambda d: _setitem(
        torch.zeros(2, 3, 5, 4, device=d), (slice(None), slice(None), 2),
        lambda x: torch.ones(2, 3, 2, 4, device=d)),
}


def _setitem(x, index, value_of):
    x[index] = value_of(x)
    return x


def _inference(device):
    with torch.inference_mode():
        return torch.ones(2, 3, device=device)


def _image(device):
    return torch.arange(25., device=device).view(1, 1, 5, 5)


def _taps(device):
    return torch.ones(1, 1, 3, 3, device=device)


@pytest.mark.parametrize("name", ERRORS)
def test_bad_arguments_raise_as_on_cpu(name):
    cpu, neuron = outcome(ERRORS[name], "cpu"), outcome(ERRORS[name], "neuron")
    assert isinstance(cpu, tuple), f"the CPU accepts this: {cpu}"
    assert neuron == cpu


def test_failed_index_add_changes_nothing():
    x = torch.zeros(3, 2, device="neuron")
    with pytest.raises(RuntimeError):
        x.index_add_(0, _t("neuron", [0, 1]), torch.ones(2, 100000, device="neuron"))
    assert torch.equal(x.cpu(), torch.zeros(3, 2))


def _in_inference_mode(device):
    # (expand_as reached the device undecomposed; a meta stand-in of x next to a neuron
    # `other` was refused as two devices)
    with torch.inference_mode():
        e = torch.arange(8., device=device).view(2, 4)
        return torch.cat([F.normalize(e, dim=-1).view(-1), e[:1].expand_as(e).reshape(-1),
                          e[:1].expand_as(torch.empty(2, 4)).reshape(-1)])


def _into_long(reduce):
    """A float reduction written into an int64 `out=`: computed in int64, inputs truncated."""
    def run(d):
        out = torch.empty(0, dtype=torch.long, device=d)
        reduce(_t(d, [[0.6, 0.6, 1.7], [2.5, -0.6, 3.9]]), out)
        return out
    return run


VALUES = {
    # the CPU checks indices in its loop: none when the result has no elements
    "an index out of range into an empty result": lambda d: torch.zeros(0, 3, device=d)[:, [3]],
    "index_put_ out of range with nothing to write": lambda d: torch.zeros(
        3, 0, device=d).index_put_((_t(d, [7]),), _t(d, 1.), accumulate=True),
    "bool ** True (the CPU's exponent-1 shortcut)": lambda d: torch.pow(_t(d, [True, False]), True),
    "bool ** 2": lambda d: torch.pow(_t(d, [True, False]), 2),
    # fills of an expanded tensor: refused before; the CPU writes each location once (a
    # deprecation warning), so every alias shows the fill
    "masked_fill_ of an expanded tensor": lambda d: _expanded(d).masked_fill_(
        _t(d, [[True, False, False]] + [[False, False, True]] * 3), 1.0).clone(),
    "tril_ of an expanded tensor": lambda d: torch.arange(
        1., 4., device=d).expand(3, 3).tril_().clone(),
    "triu_ of an expanded column": lambda d: torch.arange(
        1., 4., device=d)[:, None].expand(3, 4).triu_(2).clone(),
    "index_fill_ of an expanded tensor": lambda d: _expanded(d).index_fill_(
        1, _t(d, [1]), 5.0).clone(),
    # out= of another dtype: refused before, where the CPU computes in out's dtype
    "sum into long": _into_long(lambda x, out: torch.sum(x, 1, out=out)),
    "cumsum into long": _into_long(lambda x, out: torch.cumsum(x, 1, out=out)),
    "cumprod into long": _into_long(lambda x, out: torch.cumprod(x, 1, out=out)),
    "prod into long": _into_long(lambda x, out: torch.prod(x, 1, out=out)),
    # dtype= converts the input first (1.003 is 1.0 in bf16): the sums were 1003 and 20
    "sum, prod, cumsum, nansum with dtype=bfloat16": lambda d: torch.stack([
        f(torch.full((1000,), 1.003, device=d)).float() for f in (
            lambda t: t.sum(dtype=torch.bfloat16), lambda t: t.prod(dtype=torch.bfloat16),
            lambda t: t.cumsum(0, dtype=torch.bfloat16)[-1],
            lambda t: t.nansum(dtype=torch.bfloat16),
            lambda t: (t - 0.0026).prod(dtype=torch.float16),  # (1.0004: 1.0 in fp16)
            lambda t: torch.sum(t, 0, out=torch.empty((), dtype=torch.half, device=d)))]),
    "int32 sums that overflow wrap": lambda d: torch.stack([
        torch.full((5,), 2 ** 30, dtype=torch.int32, device=d).sum(dtype=torch.int32),
        torch.full((100000,), 30000, dtype=torch.int32, device=d).sum(dtype=torch.int32)]),
    "float16 x[i] = 70000 and full((1,), 70000) store inf": lambda d: torch.cat([
        _setitem(torch.zeros(2, dtype=torch.half, device=d), 0, lambda x: 70000),
        torch.full((1,), 70000, dtype=torch.half, device=d)]),
    "copy_ between views of the same memory (the CPU returns first)": lambda d: (
        lambda x: torch.stack([x[1:].copy_(x[:-1]), x.copy_(x)[1:]]))(
        torch.arange(3., device=d).expand(3, 3)),
    "xlogy of bf16 and fp16 by a Python number rounds it to the dtype": lambda d: torch.cat([
        torch.xlogy(_t(d, [0.5, 2.0, 7.0], dtype=torch.bfloat16), 1.01).float(),
        torch.xlogy(_t(d, [0.5, 2.0], dtype=torch.float16), 70000.0).float()]),
    "expand_as and F.normalize in inference mode": lambda d: _in_inference_mode(d),
    "resize_as_ with a template on another device": lambda d: torch.cat([
        torch.zeros(6, device=d).resize_as_(torch.empty(2, 2)).fill_(1).view(-1),
        torch.zeros(6, device=d).resize_as_(torch.empty(1, 3, device="meta")).fill_(2).view(
            -1)]),
    "a CPU tensor written through a mask with a 0-dim value of the device": lambda d:
        _setitem(torch.zeros(3), torch.tensor([True, False, True]), lambda x: _t(d, 2.)),
    "is_set_to": lambda d: (lambda x: torch.tensor([x.is_set_to(x), x.is_set_to(x[:]),
                                                    x.is_set_to(x[1:]), x.is_set_to(x.t())]))(
        torch.ones(3, 3, device=d)),
    "ldexp past fp32's largest power of two": lambda d: torch.ldexp(
        _t(d, [0.5, 0.75, 3.0, 1.0]), _t(d, [128, 129, -150, -149])),
    "gather out= of the same dtype": lambda d: torch.gather(
        torch.arange(4., device=d).view(2, 2), 1, _t(d, [[1], [0]]),
        out=torch.empty(0, device=d)),
    "clamp with a NaN bound": lambda d: torch.clamp(_t(d, [1., 2.]), min=float("nan")),
    "maximum of +-0 ties": lambda d: 1 / torch.maximum(_t(d, [0.0, -0.0]), _t(d, [-0.0, 0.0])),
    "minimum of +-0 ties": lambda d: 1 / torch.minimum(_t(d, [0.0, -0.0]), _t(d, [-0.0, 0.0])),
    "x ** 0.5 at -inf and -0": lambda d: (_t(d, [float("-inf"), -0.0, 4.0]) ** 0.5).nan_to_num(
        nan=7.0).copysign(_t(d, [1.0, 1.0, 1.0])) * (1 / _t(d, [float("-inf"), -0.0, 4.0]) ** 0.5
                                                     ).nan_to_num(nan=7.0).sign(),
    "hypot at extremes": lambda d: torch.hypot(_t(d, [3e19, 3e-25, float("inf"), 0.0]),
                                               _t(d, [4e19, 4e-25, float("nan"), 0.0])),
    "where(mask, fp16, -1e9) masks with -inf": lambda d: torch.where(
        _t(d, [True, False]), torch.ones(2, device=d).half(), -1e9),
    "scalar_tensor past fp16's range rounds": lambda d: torch.stack([
        torch.scalar_tensor(v, dtype=torch.half, device=d) for v in (-1e9, 65519.0, 7e4)]),
    "scatter_reduce's max and min aliases": lambda d: torch.stack([
        torch.zeros(3, device=d).scatter_reduce(0, _t(d, [0, 0, 2]), _t(d, [5., -1, -3]), r,
                                                include_self=False) for r in ("max", "min")]),
    "masked_select and masked_scatter past 4 dims": lambda d: torch.cat([
        torch.arange(720., device=d).view(2, 3, 4, 5, 6).permute(4, 3, 2, 1, 0).masked_select(
            torch.arange(720, device=d).view(6, 5, 4, 3, 2) % 3 == 0),
        torch.zeros(2, 3, 4, 5, 6, device=d).masked_scatter_(
            torch.arange(48, device=d).view(2, 1, 4, 1, 6) % 2 == 0,
            torch.arange(720., device=d)).view(-1)]),
    "x[mask] = one value of another dtype": lambda d: torch.stack([
        torch.zeros(2, 3, device=d).index_put_((torch.arange(6, device=d).view(2, 3) % 2 == 0,),
                                               v) for v in (_t(d, 1), _t(d, [7]))]),
    "cpu tensor, neuron index": lambda d: torch.arange(5.)[_t(d, [1, 3])] if d != "cpu" else
    __outcome_error("indices should be either on cpu or on the same device as the indexed "
                   "tensor (cpu)"),
}


def __outcome_error(message):
    raise RuntimeError(message)


@pytest.mark.parametrize("name", VALUES)
@pytest.mark.filterwarnings("ignore:Use of .* on expanded tensors is deprecated")
def test_values_as_on_cpu(name):
    cpu, neuron = outcome(VALUES[name], "cpu"), outcome(VALUES[name], "neuron")
    if isinstance(cpu, tuple):
        assert neuron == cpu
    else:
        torch.testing.assert_close(neuron, cpu, equal_nan=True, rtol=2e-7, atol=0)


LIKE = [
    lambda x, d: torch.zeros_like(x, device=d), lambda x, d: torch.ones_like(x, device=d),
    lambda x, d: torch.full_like(x, 2.5, device=d), lambda x, d: torch.empty_like(x, device=d),
    lambda x, d: torch.rand_like(x, device=d), lambda x, d: torch.randn_like(x, device=d),
    lambda x, d: torch.randint_like(x, 5, device=d), lambda x, d: x.new_zeros(2, device=d),
    lambda x, d: x.new_ones(2, device=d), lambda x, d: x.new_full((2,), 3., device=d),
    lambda x, d: x.new_empty(2, device=d), lambda x, d: x.new_empty_strided((2,), (1,), device=d),
]


@pytest.mark.parametrize("k", range(len(LIKE)))
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_like_and_new_factories_make_their_result_where_asked(k, device):
    x = torch.randn(3, 4, device="neuron").t()
    out = LIKE[k](x, device)
    expected = LIKE[k](x.cpu(), device)
    assert out.device.type == device
    assert (out.shape, out.dtype, out.stride()) == (expected.shape, expected.dtype,
                                                     expected.stride())
    if device == "cpu" and k in (0, 1, 2, 7, 8, 9):
        assert torch.equal(out, expected)


def test_to_meta_and_memory_formats_as_on_cpu():
    x = torch.randn(2, 3, 4, 5)
    n = x.to("neuron")
    meta = n.t().to("meta") if n.dim() == 2 else n.permute(0, 2, 3, 1).to("meta")
    assert meta.device.type == "meta" and meta.stride() == x.permute(0, 2, 3, 1).to(
        "meta").stride()
    cl = x.to("neuron", memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    assert cl.stride() == x.to(memory_format=torch.channels_last).stride()
    assert torch.equal(cl.cpu(), x)
    assert n.permute(0, 2, 3, 1).cpu().stride() == x.permute(0, 2, 3, 1).clone().stride()
    assert n.permute(0, 2, 3, 1).float().stride() == x.permute(0, 2, 3, 1).float().stride()
    m = torch.nn.Conv2d(3, 4, 3).to("neuron").to(memory_format=torch.channels_last)
    assert m.weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.nn.Linear(2, 2).to("neuron").to("meta").weight.device.type == "meta"
    with torch.device("meta"):
        empty = torch.nn.Linear(2, 2)
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        empty.to("neuron")
    assert empty.to_empty(device="neuron").weight.device.type == "neuron"


@pytest.mark.parametrize("make", [
    lambda: torch.ones(2, device="neuron:1"), lambda: torch.ones(2).to("neuron:1"),
    lambda: torch.ones(2, device="neuron").to("neuron:2"),
    lambda: torch.zeros_like(torch.ones(2, device="neuron"), device="neuron:1"),
    lambda: torch.arange(3, device="neuron:1"), lambda: torch.randperm(3, device="neuron:1"),
    lambda: torch.neuron.set_device(1)])
def test_other_device_ordinals_are_refused(make):
    with pytest.raises(RuntimeError, match="neuron:[12] does not exist"):
        make()


def test_a_negative_device_index_is_ignored_as_on_cuda():
    torch.neuron.set_device(-1)  # (torch.cuda: "if device >= 0")
    with torch.neuron.device(-1):
        assert torch.neuron.current_device() == 0


def test_record_stream_and_storage_numel_queries():
    t = torch.ones(3, device="neuron")
    t.record_stream(torch.neuron.current_stream())
    t.record_stream(torch.Stream("neuron"))
    with pytest.raises(RuntimeError, match="expected a neuron stream"):
        t.record_stream(object())
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.randn(5, device="neuron"), torch.ones(5, device="neuron"))
        tangent = fwAD.unpack_dual(dual.sin()).tangent
    assert torch.allclose(tangent.cpu(), fwAD.unpack_dual(dual).primal.cpu().cos())
    assert neuron_eager.get_fallback_ops() == {}


def test_deepcopy_as_on_cpu():
    for device in ("cpu", "neuron"):
        p = torch.nn.Parameter(torch.ones(2, device=device))
        p.grad = torch.ones(2, device=device)
        q = copy.deepcopy(p)
        assert isinstance(q, torch.nn.Parameter) and q.grad is None and q.requires_grad
        t = torch.ones(2, device=device, requires_grad=True)
        t.grad = torch.full((2,), 3.0, device=device)
        assert torch.equal(copy.deepcopy(t).grad.cpu(), torch.full((2,), 3.0))
        a = torch.arange(6.0, device=device)
        a2, view = copy.deepcopy([a, a[1:3]])
        a2[1] = 100
        assert view.cpu().tolist() == [100.0, 2.0] and a[1].item() == 1.0


def test_barebones_unsigned_types_say_what_they_support():
    x = torch.ones(3, dtype=torch.uint16, device="neuron")
    with pytest.raises(NotImplementedError, match="add has no neuron kernel for torch.uint16"):
        x + 1
    assert torch.equal(x.to(torch.int32).cpu(), torch.ones(3, dtype=torch.int32))
    assert torch.ones(2, device="neuron").to(torch.uint32).cpu().tolist() == [1, 1]


@pytest.mark.parametrize("program,op", [
    (lambda: torch.arange(100000, device="neuron").sum(), "sum"),
    (lambda: torch.full((3,), 2 ** 30, device="neuron").cumsum(0), "cumsum"),
    (lambda: torch.arange(1, 16, device="neuron").prod(), "prod"),
    (lambda: torch.arange(1, 4, device="neuron") * 2654435761, "mul"),
    (lambda: torch.tensor([70000], device="neuron").pow(2), "pow"),
])
def test_int64_results_that_wrap_warn_and_wrap_as_int32(program, op, monkeypatch):
    monkeypatch.setattr(numerics, "_wrap_warned", set())
    with pytest.warns(UserWarning, match=f"{op} of int64 values left the int32 range"):
        out = program()
    exact = _on_cpu(program)  # the same program on the CPU, wrapped to int32 by hand
    assert torch.equal(out.cpu(), exact.to(torch.int32).to(torch.int64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # results inside int32: no warning
        assert torch.arange(10, device="neuron").sum().item() == 45
        program()  # warned once per op


@pytest.mark.parametrize("sightings", [1, 3])  # op by op, then where the region would fuse
def test_int64_wraps_warn_at_the_recorded_line_in_adaptive_eager(sightings, monkeypatch):
    monkeypatch.setattr(numerics, "_wrap_warned", set())
    x = torch.tensor([3, 5], device="neuron")
    big = torch.tensor([2 ** 30, 5], device="neuron")
    with neuron_eager.adaptive_eager():
        for a in [x] * (sightings - 1) + [big]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                b = a * 4; line = sys._getframe().f_lineno  # noqa: E702
                c = b + 1
                got = c.cpu()  # the sync point runs the region
    assert torch.equal(got, (big.cpu() * 4 + 1).to(torch.int32).to(torch.int64))
    wraps = [w for w in caught if "left the int32 range" in str(w.message)]
    assert [(w.filename, w.lineno) for w in wraps] == [(__file__, line)]


def _on_cpu(program):
    import inspect
    source = inspect.getsource(program).split("lambda:")[1].split(', "')[0]
    return eval(source.replace('"neuron"', '"cpu"'))


LAYOUT_OPS = {"flip": lambda t: t.flip(-1), "roll": lambda t: t.roll(1, -1),
              "roll over two dims": lambda t: t.roll((1, 1), (0, 1)),
              "constant pad": lambda t: torch.nn.functional.pad(t, (1, 1)),
              "sort values": lambda t: t.sort(-1).values, "sort indices": lambda t: t.sort(0)[1],
              "topk": lambda t: t.topk(2, -1).values,
              **{f"rot90 k={k}": (lambda t, k=k: t.rot90(k, (0, 1))) for k in range(4)},
              # resize_ to the same shape changes nothing (it made a transposed tensor
              # contiguous over the same bytes: other values)
              "resize_ to its own shape": lambda t: t.clone().resize_(t.shape)}


@pytest.mark.parametrize("name", LAYOUT_OPS)
def test_results_take_the_cpus_layout(name):
    # channels-last models kept their layout through conv and pooling, and lost it here
    for x in (torch.randn(2, 4, 6, 8).contiguous(memory_format=torch.channels_last),
              torch.randn(2, 3, 4, 5, 6).contiguous(memory_format=torch.channels_last_3d),
              torch.randn(4, 6).t()):
        cpu, neuron = LAYOUT_OPS[name](x), LAYOUT_OPS[name](x.to("neuron"))
        assert neuron.stride() == cpu.stride()
        assert torch.equal(neuron.cpu(), cpu)


@pytest.mark.parametrize("shape,fmt", [((2, 3, 4, 5), torch.channels_last),
                                       ((2, 3, 4, 5, 6), torch.channels_last_3d),
                                       ((4, 5), torch.contiguous_format)])
def test_resize_takes_the_memory_format_as_on_cpu(shape, fmt):
    # the format was ignored: convert_conv2d_weight_memory_format left conv weights NCHW
    for source in (torch.randn(shape), torch.empty(0)):
        cpu = source.clone().resize_(shape, memory_format=fmt)
        neuron = source.to("neuron").resize_(shape, memory_format=fmt)
        assert neuron.stride() == cpu.stride()
    conv = torch.nn.Conv2d(3, 4, 3).to("neuron")
    torch.nn.utils.convert_conv2d_weight_memory_format(conv, torch.channels_last)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("adaptive_on", [False, True])
def test_a_grown_storage_is_still_shared_with_views(adaptive_on):
    """resize_ (and an out= argument resized by an op) grows the storage in place, as the
    CPU's StorageImpl: views made before, and read before, see the new memory."""
    from neuron_eager import adaptive

    results = []
    for device in ("cpu", "neuron"):
        if device == "neuron" and adaptive_on:
            adaptive.enable()
        try:
            x = torch.tensor([3., 6., 9.], device=device)
            v, w = x[:2], x[1:]
            str(v), x.add_(1)  # (the view's data read: its cached arrays exist)
            x.resize_(40)
            x[:3] = torch.tensor([1., 2., 3.], device=device)
            torch._foreach_mul_([v, w], 10.)  # (kernels reading the views' addresses)
            o = torch.zeros(2, device=device)
            u = o[1:]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (the out= resize warning)
                torch.mul(torch.ones(30, device=device), 2, out=o)
            results.append([t.cpu() for t in (x[:3], v, w, u)] + [
                v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()])
        finally:
            adaptive.disable()
    cpu, neuron = results
    assert neuron[-1] and cpu[-1]
    for got, expected in zip(neuron[:-1], cpu[:-1]):
        assert torch.equal(got, expected), (got, expected)


def test_the_out_resize_warning_names_the_users_line():
    # warnings filtered by module or line behave as on the CPU
    places = []
    for device in ("cpu", "neuron"):
        a = torch.ones(10, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = torch.empty(3, device=device)
            torch.add(a, a, out=out); line = sys._getframe().f_lineno  # noqa: E702
        places += [(w.filename, w.lineno - line, str(w.message).split(" (Triggered")[0])
                   for w in caught]
    assert len(places) == 2 and places[0] == places[1] and places[0][0] == __file__
