"""Broadcasting: the shape operands broadcast to (with the CPU's errors), their strides in
it, and the layout TensorIterator gives a new elementwise result."""
from __future__ import annotations

import torch
from torch._prims_common import compute_elementwise_output_strides

from neuron_eager.ops import tensor as T


def try_broadcast(shapes) -> tuple | None:
    """The broadcast shape of `shapes`, or None if they do not broadcast."""
    first = shapes[0]
    if all(s == first for s in shapes):
        return tuple(first)
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        for i, size in enumerate(s, n - len(s)):
            if size != 1:
                if out[i] == 1:
                    out[i] = size
                elif out[i] != size:
                    return None
    return tuple(out)


def broadcast_shape(shapes) -> tuple:
    shape = try_broadcast(shapes)
    if shape is None:
        _raise_mismatch(shapes)
    return shape


def _raise_mismatch(shapes):
    """The CPU's error for operands that do not broadcast (TensorIterator's wording: operands
    in turn against the shape so far, the first mismatch from the right)."""
    a = tuple(shapes[0])
    for b in map(tuple, shapes[1:]):
        n = max(len(a), len(b))
        for i in range(n - 1, -1, -1):
            size_a = a[i - n + len(a)] if i - n + len(a) >= 0 else 1
            size_b = b[i - n + len(b)] if i - n + len(b) >= 0 else 1
            if size_a != size_b and size_a != 1 and size_b != 1:
                raise RuntimeError(f"The size of tensor a ({size_a}) must match the size of "
                                   f"tensor b ({size_b}) at non-singleton dimension {i}")
        a = tuple(torch.broadcast_shapes(a, b))
    torch.broadcast_shapes(*shapes)  # (not reached: some pair failed above)


def broadcast_strides(t: torch.Tensor, shape) -> list[int]:
    return strides_broadcast(t.shape, t.stride(), shape)


def strides_broadcast(size, stride, shape) -> list[int]:
    """The strides of a tensor of `size` and `stride` broadcast to `shape` (0 where it
    repeats)."""
    lead = len(shape) - len(size)
    strides = [0] * lead
    for n, m, st in zip(shape[lead:], size, stride):
        strides.append(st if m == n else 0)
    return strides


# Note [Output layout]
# A new elementwise result is laid out as TensorIterator lays out the CPU's and CUDA's: its
# dims in the order the operands' strides give them (the first operand that orders a pair of
# dims decides; broadcast dims do not), dense in that order. So `x.t() * 2` is transposed
# like `x.t()`, a channels-last input gives a channels-last result, and `.view()` works on
# the result exactly where it works on CUDA. Contiguous operands give contiguous results
# without asking; other layouts are computed once per layout (prims' rule, on stand-ins).
_layouts: dict = {}


def output_strides(arrays, shape) -> tuple | None:
    """The strides of a new result of shape `shape` computed from the neuron tensors
    `arrays` (Note [Output layout]); None for contiguous."""
    if all(a._key is not None or a.numel() <= 1 for a in arrays):
        return None
    return layout_for(shape, [(a.shape, a.stride()) for a in arrays])


def layout_for(shape, layouts) -> tuple | None:
    """`output_strides` from the operands' (shape, stride) pairs (None: contiguous)."""
    key = (tuple(shape), *layouts)
    strides = _layouts.get(key, False)
    if strides is False:
        stand_ins = [_broadcast_stand_in(shape, size, stride) for size, stride in layouts]
        strides = tuple(compute_elementwise_output_strides(*stand_ins))
        if strides == T.contiguous_strides(shape):
            strides = None
        if len(_layouts) > 4096:
            _layouts.clear()
        _layouts[key] = strides
    return strides


def _broadcast_stand_in(shape, size, stride):
    """An operand of `size` and `stride` broadcast to `shape` as TensorIterator sees it: its
    prepended and broadcast dims of stride 0 (expand() gives a prepended dim of size 1 a
    stride, which reordered the result's dims: a view(-1) the CPU allows failed)."""
    strides = strides_broadcast(size, stride, shape)
    return torch.empty_strided(shape, strides, dtype=torch.uint8, device="meta")
