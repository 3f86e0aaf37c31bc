"""`torch._grouped_mm`: one matrix product per group (mixture-of-experts layers: tokens
sorted by expert, `offs` the running ends of the groups), as Tensor-engine products with
fp32 PSUM accumulation, each group rounded once.

The CPU's checks and layouts are kept: float32/bfloat16/float16 inputs of one dtype, int32
offsets exactly when a 2-D operand is grouped, 16-byte aligned strides, no bias, the inputs'
dtype out, and a result whose row stride is padded to 16 bytes. The four forms:
2-D x 3-D (rows of `a` grouped, expert g's matrix b[g]), 3-D x 2-D (columns of `b`),
2-D x 2-D (the contraction grouped: one result per group) and 3-D x 3-D (a batched product,
no offsets). Offsets past the end are clamped, as slicing clamps them. Rows (2-D x 3-D)
or columns (3-D x 2-D) that no group covers are zeros (the CPU leaves them uninitialised).
"""
from __future__ import annotations

import torch

from neuron_eager.ops import tensor as T
from neuron_eager.ops.matmul import gemm
from neuron_eager.ops.registry import register

aten = torch.ops.aten
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _check_layout(m) -> None:
    """The CPU's: row- or column-major in the last two dims, the long stride 16-byte aligned."""
    align = 16 // m.element_size()
    *_, rows, cols = m.shape
    *_, s_rows, s_cols = m.stride()
    if s_rows == 1 and s_cols >= max(1, rows):
        long = s_cols
    elif s_cols == 1 and s_rows >= max(1, cols):
        long = s_rows
    else:
        raise RuntimeError(f"Invalid strides/sizes, got {list(m.stride())} for strides and "
                           f"{list(m.shape)} for sizes")
    if long % align:
        raise RuntimeError("strides should be multiple of 16 bytes")


def _check(a, b, offs, bias, out_dtype) -> None:
    for name, m in (("mat_a", a), ("mat_b", b)):
        if m.dtype not in _FLOATS:
            raise RuntimeError(f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got "
                               f"{T.dtype_name(m.dtype)}")
    for name, m in (("mat_a", a), ("mat_b", b)):
        if m.dim() not in (2, 3):
            raise RuntimeError(f"{name} has to be 2 or 3d")
    if (a.dim() == 3 or b.dim() == 3) and a.shape[-1] != b.shape[-2]:
        raise RuntimeError("contraction dimension of mat_a and mat_b must match")
    _check_layout(a)
    _check_layout(b)
    if (offs is not None) != (a.dim() == 2 or b.dim() == 2):
        raise RuntimeError("Have to provide offsets if there is a 2d matrix, or no offset if "
                           "both matrices are 3d")
    if offs is not None:
        if offs.dim() != 1:
            raise RuntimeError("offs has to be 1D")
        if offs.dtype != torch.int32:
            raise RuntimeError("Offsets have to be int32")
    if bias is not None:
        raise RuntimeError("Bias not supported yet")
    if out_dtype is not None and out_dtype != a.dtype:
        raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
    groups = offs.shape[0] if offs is not None else None
    if a.dim() == 2 and b.dim() == 3 and groups != b.shape[0] or \
            a.dim() == 3 and b.dim() == 2 and groups != a.shape[0]:
        raise RuntimeError("matrix batch sizes have to match")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise RuntimeError("batched dimension has to match")
    if a.dtype != b.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                           f"{T.CPP_NAMES[a.dtype]} != {T.CPP_NAMES[b.dtype]}")


def _product(out, a, b) -> None:
    """out (contiguous, M x N) = a @ b."""
    (m, k), n = a.shape, b.shape[1]
    gemm(out, (1, 1, 1, m, n, k), a, (0, 0, 0, *a.stride()), b, (0, 0, 0, *b.stride()))


def _groups(offs, size: int):
    """(group, start, end) of each non-empty group, ends clamped to `size`."""
    start = 0
    for g, end in enumerate(offs.tolist()):
        end = min(max(end, 0), size)
        if end > start:
            yield g, start, end
        start = max(start, end)


@register(aten._grouped_mm.default)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    _check(a, b, offs, bias, out_dtype)
    if a.dim() == 3 and b.dim() == 3:
        result = aten.bmm.default(a, b)
    elif a.dim() == 2 and b.dim() == 3:  # expert g multiplies rows [start, end) by b[g]
        result = T.empty((a.shape[0], b.shape[2]), a.dtype)
        aten.zero_.default(result)
        for g, s, e in _groups(offs, a.shape[0]):
            _product(aten.slice.Tensor(result, 0, s, e), aten.slice.Tensor(a, 0, s, e),
                     aten.select.int(b, 0, g))
    elif a.dim() == 3:  # columns [start, end) of b and of the result
        result = T.empty((a.shape[1], b.shape[1]), a.dtype)
        aten.zero_.default(result)
        for g, s, e in _groups(offs, b.shape[1]):
            part = T.empty((a.shape[1], e - s), a.dtype)
            _product(part, aten.select.int(a, 0, g), aten.slice.Tensor(b, 1, s, e))
            aten.copy_.default(aten.slice.Tensor(result, 1, s, e), part)
    else:  # the contraction is grouped: one product per group
        result = T.empty((offs.shape[0], a.shape[0], b.shape[1]), a.dtype)
        aten.zero_.default(result)
        for g, s, e in _groups(offs, a.shape[1]):
            _product(aten.select.int(result, 0, g), aten.slice.Tensor(a, 1, s, e),
                     aten.slice.Tensor(b, 0, s, e))
    return _padded(result)


def _padded(result):
    """The CPU's layout: the last dim's stride rounded up to 16 bytes."""
    align = 16 // result.element_size()
    n = result.shape[-1]
    padded = (n + align - 1) // align * align
    if padded == n:
        return result
    strides = (padded, 1) if result.dim() == 2 else (result.shape[1] * padded, padded, 1)
    out = T.empty(result.shape, result.dtype, strides)
    return aten.copy_.default(out, result)
