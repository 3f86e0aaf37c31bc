"""Small product ops: trace, addr (outer product update), linalg_cross, _trilinear, block_diag.

Each is composed from registered neuron ops or one elementwise kernel, so 16-bit floats
compute in fp32 and round once: addr and cross are single fused elementwise launches,
trace a diagonal view summed in fp32, _trilinear an einsum (bmm with fp32 accumulation).
"""
from __future__ import annotations

import torch

from neuron_eager.ops import elementwise as E
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import fill
from neuron_eager.ops.indexing import meta_call
from neuron_eager.ops.jit import njit
from neuron_eager.ops.registry import register

aten = torch.ops.aten


# -- trace -----------------------------------------------------------------------------------
@register(aten.trace.default)
def trace(x):
    if x.dim() != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {x.dim()}")
    if x.dtype == torch.bool:
        raise NotImplementedError("\"trace\" not implemented for 'Bool'")
    # a strided view of the diagonal, summed like sum(): fp32 accumulation, ints as int64
    return aten.sum.default(aten.diagonal.default(x))


# -- addr: beta * self + alpha * outer(vec1, vec2), one launch --------------------------------
_ADDR = E.Elementwise("addr", njit(lambda s, a, b, beta, alpha: beta * s + alpha * (a * b)),
                      nparams=2)
_ADDR_NO_SELF = E.Elementwise("addr0", njit(lambda a, b, alpha: alpha * (a * b)), nparams=1)
_ADDR_BOOL = E.Elementwise("addr_bool", njit(
    lambda s, a, b, beta, alpha: (beta and s) or (alpha and a and b)), nparams=2)


@register(aten.addr.default)
def addr(x, vec1, vec2, *, beta=1, alpha=1):
    meta = meta_call(aten.addr.default, x, vec1, vec2, beta=beta, alpha=alpha)
    col, row = vec1.reshape(-1, 1), vec2.reshape(1, -1)
    # laid out by TensorIterator over (self, vec1, vec2), self included even where beta == 0
    out = T.empty(meta.shape, meta.dtype, E.output_strides([x, col, row], meta.shape))
    if meta.dtype == torch.bool:
        return E.run(_ADDR_BOOL, [x, col, row], [bool(beta), bool(alpha)], out=out)
    if beta == 0:  # self is ignored, NaN and inf included, as on the CPU
        if E.result_type(col, row) != meta.dtype:  # (self's dtype still counts: computed in
            col, row = col.to(meta.dtype), row.to(meta.dtype)  # it, not rounded to theirs)
        return E.run(_ADDR_NO_SELF, [col, row], [alpha], out=out)
    return E.run(_ADDR, [x, col, row], [beta, alpha], out=out)


# -- linalg_cross ------------------------------------------------------------------------------
_CROSS = E.Elementwise("cross", njit(lambda a1, b2, a2, b1: a1 * b2 - a2 * b1))


@register(aten.linalg_cross.default)
def linalg_cross(a, b, *, dim=-1):
    if a.dtype != b.dtype:
        raise RuntimeError(f"expected scalar type {T.dtype_name(a.dtype)} but found "
                           f"{T.dtype_name(b.dtype)}")
    meta = meta_call(aten.linalg_cross.default, a, b, dim=dim)
    out = T.empty(meta.shape, meta.dtype)
    if not out.numel():
        return out
    dim = dim % len(meta.shape)
    shape = list(meta.shape)
    shape[dim] = 1
    a, b = a.expand(meta.shape), b.expand(meta.shape)
    for k in range(3):  # out_k = a_{k+1} b_{k+2} - a_{k+2} b_{k+1}, one rounding each
        i, j = (k + 1) % 3, (k + 2) % 3
        E.run(_CROSS, [a.narrow(dim, i, 1), b.narrow(dim, j, 1), a.narrow(dim, j, 1),
                       b.narrow(dim, i, 1)], out=out.narrow(dim, k, 1))
    return out


# -- _trilinear (nn.functional.bilinear) -------------------------------------------------------
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@register(aten._trilinear.default)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """sum over `sumdim` of i1 * i2 * i3, each unsqueezed at its `expand` dims, as an einsum."""
    meta = meta_call(aten._trilinear.default, i1, i2, i3, expand1, expand2, expand3, sumdim,
                     unroll_dim)
    total = i1.dim() + len(expand1)
    subs = []
    for t, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        letters = [_LETTERS[d] for d in range(total) if d not in expand]
        subs.append("".join(letters))
    keep = "".join(_LETTERS[d] for d in range(total) if d not in sumdim)
    out = aten.einsum.default(f"{subs[0]},{subs[1]},{subs[2]}->{keep}", [i1, i2, i3])
    # _trilinear keeps summed dims as size 1
    return out.reshape(meta.shape)


# -- block_diag ---------------------------------------------------------------------------------
@register(aten.block_diag.default)
def block_diag(tensors):
    meta = meta_call(aten.block_diag.default, list(tensors))
    # the CPU promotes like result_type (0-dim tensors rank below the others); the meta
    # reference does not
    dtype = E.result_type(*tensors) if tensors else meta.dtype
    out = fill(T.empty(meta.shape, dtype), 0)
    r = c = 0
    for t in tensors:
        block = t.reshape(1, -1) if t.dim() < 2 else t
        rows, cols = block.shape
        if rows and cols:
            E.copy_into(out[r:r + rows, c:c + cols], block)
        r, c = r + rows, c + cols
    return out
