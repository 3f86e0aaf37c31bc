"""The CPU's checks of writes whose memory overlaps: elements of the written tensor that share
memory (an expanded view), and inputs that share only part of the output's memory."""
from __future__ import annotations

import torch


def _dense(shape, stride) -> bool:
    """Whether a layout covers its elements' span exactly once (some order of its dims is
    contiguous): torch's is_non_overlapping_and_dense."""
    dims = sorted((st, n) for n, st in zip(shape, stride) if n != 1)
    expected = 1
    for st, n in dims:
        if st != expected:
            return False
        expected *= n
    return True


def elements_apart(shape, stride) -> bool:
    """Whether no two elements of a layout can share memory: taken by increasing stride,
    each dim's stride passes the farthest element the smaller dims reach. (Conservative:
    a few interleaved layouts that never meet answer False.)"""
    reach = 0
    for st, n in sorted((abs(st), n) for n, st in zip(shape, stride) if n != 1):
        if st <= reach:
            return False
        reach += st * (n - 1)
    return True


def has_internal_overlap(t: "torch.Tensor") -> bool:
    """Whether elements of `t` share memory (an expanded view: a stride of 0 over a dim
    longer than 1)."""
    if t.__dict__.get("_key") is not None:
        return False  # C-contiguous (the common case: no stride to look at)
    return any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride()))


def check_no_internal_overlap(out: "torch.Tensor") -> None:
    """The CPU's error for writing a tensor whose elements share memory."""
    if has_internal_overlap(out):
        raise RuntimeError("unsupported operation: more than one element of the written-to "
                           "tensor refers to a single memory location. Please clone() the "
                           "tensor before performing the operation.")


def check_no_partial_overlap(out: "torch.Tensor", a: "torch.Tensor") -> None:
    """The CPU's error when `out` is written while `a`, in the same memory, is read and the
    two share only some elements (the same view, or disjoint parts, are fine). Layouts that
    are not dense are not checked, as on the CPU."""
    if a is out or a._storage is not out._storage or not a.numel() or not out.numel():
        return
    if not (_dense(out.shape, out.stride()) and _dense(a.shape, a.stride())):
        return
    item_out, item_a = out.element_size(), a.element_size()
    out_begin, a_begin = out.storage_offset() * item_out, a.storage_offset() * item_a
    out_end, a_end = out_begin + out.numel() * item_out, a_begin + a.numel() * item_a
    if out_begin == a_begin and out_end == a_end and out.stride() == a.stride():
        return
    if out_begin < a_end and a_begin < out_end:
        raise RuntimeError("unsupported operation: some elements of the input tensor and the "
                           "written-to tensor refer to a single memory location. Please clone() "
                           "the tensor before performing the operation.")
