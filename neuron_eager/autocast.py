"""`torch.autocast("neuron")`: PyTorch's CUDA autocast policy on the AutocastPrivateUse1 key.

Every op falls through the key except the overloads listed below, which are exactly the
ones torch 2.13 registers for CUDA (the AT_FORALL_* lists of ATen/autocast_mode.h, less
the cudnn-only ops, whose place the whole-sequence RNN ops take). Their kernels cast neuron
floating-point arguments (never float64, never CPU tensors) and call the op again with the
key excluded, as ATen's wrappers do.

>>> import torch, neuron_eager
>>> with torch.autocast("neuron", dtype=torch.bfloat16):
...     y = torch.ones(2, 3, device="neuron") @ torch.ones(3, 2, device="neuron")
>>> y.dtype, y.softmax(-1).dtype
(torch.bfloat16, torch.bfloat16)
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, NamedTuple

import torch
from torch._C import DispatchKey, DispatchKeySet

from neuron_eager.ops import _compat
from neuron_eager.ops.tensor import DEVICE

aten = torch.ops.aten
KEY = "AutocastPrivateUse1"
_EXCLUDE = DispatchKeySet(DispatchKey.AutocastPrivateUse1)
_TYPE = DEVICE.type
_FLOAT = torch.float32

# -- the op lists (torch 2.13, CUDA) ---------------------------------------------------------
# Cast floating args to the autocast dtype (float16 or bfloat16).
LOWER_PRECISION = (
    aten._convolution.deprecated, aten._convolution.default, aten.conv1d.default,
    aten.conv2d.default, aten.conv3d.default, aten.conv_tbc.default,
    aten.conv_transpose1d.default, aten.conv_transpose2d.input, aten.conv_transpose3d.input,
    aten.convolution.default, aten.prelu.default, aten.addmm.default, aten.addmv.default,
    aten.addr.default, aten.matmul.default, aten.einsum.default, aten.mm.default,
    aten.mv.default, aten.linalg_vecdot.default, aten.linear.default, aten.addbmm.default,
    aten.baddbmm.default, aten.bmm.default, aten.chain_matmul.default,
    aten.linalg_multi_dot.default, aten._thnn_fused_lstm_cell.default,
    aten._thnn_fused_gru_cell.default, aten.lstm_cell.default, aten.gru_cell.default,
    aten.rnn_tanh_cell.default, aten.rnn_relu_cell.default,
    aten._scaled_dot_product_flash_attention.default, aten.scaled_dot_product_attention.default,
)
# The eval fast paths of nn.MultiheadAttention and nn.TransformerEncoderLayer: they skip
# themselves under torch.is_autocast_enabled(), which asks about CUDA only, so under
# autocast("neuron") they run, and come out in the lower precision as the CPU's do.
FAST_PATHS = (aten._native_multi_head_attention.default,
              aten._transformer_encoder_layer_fwd.default)
# CUDA casts _cudnn_rnn, which nn.LSTM/GRU/RNN reach there; here they reach these.
RECURRENT_LAYERS = (
    aten.lstm.input, aten.lstm.data, aten.gru.input, aten.gru.data, aten.rnn_tanh.input,
    aten.rnn_tanh.data, aten.rnn_relu.input, aten.rnn_relu.data,
)
# Cast floating args to float32.
FP32 = (
    aten.acos.default, aten.asin.default, aten.cosh.default, aten.erfinv.default,
    aten.exp.default, aten.expm1.default, aten.log.default, aten.log10.default,
    aten.log2.default, aten.log1p.default, aten.reciprocal.default, aten.rsqrt.default,
    aten.sinh.default, aten.tan.default, aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor,
    aten.pow.Scalar, aten.softplus.default, aten.layer_norm.default,
    aten.native_layer_norm.default, aten.rms_norm.default, aten.group_norm.default,
    aten.frobenius_norm.dim, aten.nuclear_norm.default, aten.nuclear_norm.dim,
    aten.cosine_similarity.default, aten.poisson_nll_loss.default,
    aten.cosine_embedding_loss.default, aten.nll_loss.default, aten.nll_loss2d.default,
    aten.hinge_embedding_loss.default, aten.kl_div.default, aten.l1_loss.default,
    aten.smooth_l1_loss.default, aten.huber_loss.default, aten.mse_loss.default,
    aten.margin_ranking_loss.default, aten.multilabel_margin_loss.default,
    aten.soft_margin_loss.default, aten.triplet_margin_loss.default,
    aten.multi_margin_loss.default, aten.binary_cross_entropy_with_logits.default,
    aten.dist.default, aten.pdist.default, aten.cdist.default, aten.renorm.default,
    aten.logsumexp.default, aten.upsample_nearest1d.default,
    aten._upsample_nearest_exact1d.default, aten.upsample_nearest2d.default,
    aten._upsample_nearest_exact2d.default, aten.upsample_nearest3d.default,
    aten._upsample_nearest_exact3d.default, aten.upsample_linear1d.default,
    aten.upsample_bilinear2d.default, aten._upsample_bilinear2d_aa.default,
    aten.upsample_trilinear3d.default, aten.upsample_bicubic2d.default,
    aten._upsample_bicubic2d_aa.default,
)
# Ops with an optional output dtype: when the first arg is eligible and no dtype was given,
# pass dtype=float32 (the input itself is not cast).
FP32_SET_OPT_DTYPE = (
    aten.prod.default, aten.prod.dim_int, aten.softmax.int, aten.log_softmax.int,
    aten.cumprod.default, aten.cumsum.default, aten.linalg_vector_norm.default,
    aten.linalg_matrix_norm.default, aten.linalg_matrix_norm.str_ord, aten.sum.default,
    aten.sum.dim_IntList,
)
# Overloads without a dtype, re-called as their dtype-taking sibling with dtype=float32.
FP32_APPEND_DTYPE = {
    aten.norm.Scalar: aten.norm.ScalarOpt_dtype,
    aten.norm.ScalarOpt_dim: aten.norm.ScalarOpt_dim_dtype,
}
# Run in the widest floating type among the Tensor and Tensor[] args.
PROMOTE = (
    aten.addcdiv.default, aten.addcmul.default, aten.atan2.default, aten.bilinear.default,
    aten.cross.default, aten.dot.default, aten.vdot.default, aten.grid_sampler.default,
    aten.index_put.default, aten.tensordot.default, aten.scatter_add.default,
)
BCE_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional."
    "binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")
BANNED = (aten.binary_cross_entropy.default,)


# -- argument plans, read once from each schema -------------------------------------------
class _Plan(NamedTuple):
    casts: tuple[int, ...]  # positions of Tensor, Tensor? and Tensor[] arguments
    votes: tuple[int, ...]  # positions that choose the promote type: Tensor and Tensor[]
    defaults: tuple  # each positional argument's default (None where it has none)
    dtype_at: int | None  # position of a positional `dtype` argument


def _plan(op: torch._ops.OpOverload) -> _Plan:
    """Where the tensors are. Tensor?[] (index_put's indices) is neither cast nor counted,
    and Tensor? is cast but not counted, as ATen's cached_cast/prioritize overloads do."""
    casts, votes, defaults, dtype_at = [], [], [], None
    for i, arg in enumerate(op._schema.arguments):
        kind = arg.type
        inner = kind.getElementType() if isinstance(kind, (torch._C.OptionalType,
                                                           torch._C.ListType)) else None
        tensor = isinstance(kind, torch._C.TensorType)
        optional = isinstance(kind, torch._C.OptionalType) and isinstance(
            inner, torch._C.TensorType)
        listed = isinstance(kind, torch._C.ListType) and isinstance(inner, torch._C.TensorType)
        if arg.kwarg_only:
            if tensor or optional or listed:  # none of the listed ops has one; say so if added
                raise TypeError(f"{op}: keyword-only tensor argument {arg.name} is not handled")
            continue
        if tensor or optional or listed:
            casts.append(i)
        if tensor or listed:
            votes.append(i)
        if arg.name == "dtype":
            dtype_at = i
        defaults.append(arg.default_value)
    return _Plan(tuple(casts), tuple(votes), tuple(defaults), dtype_at)


# -- casting (ATen's is_eligible / cached_cast / prioritize) --------------------------------
def _eligible(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point()
            and t.dtype is not torch.float64 and t.device.type == _TYPE)


# Note [The autocast weight cache]
# ATen's cached_cast keeps the lower-precision copy of a float32 leaf that requires grad (a
# weight), made with grad enabled, until the outermost autocast block exits
# (torch.clear_autocast_cache): a model's weights are cast once per block, and a weight
# updated in place inside the block is still read as its earlier copy, on the CPU and on
# CUDA alike; a training loop written inside one `with autocast` depends on it. The cache is
# per thread, as ATen's; the copy is dropped with the weight (the weak reference).
_local = threading.local()


def _cached_cast(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not (dtype is torch.get_autocast_dtype(_TYPE) and value.dtype is _FLOAT and
            value.requires_grad and value.is_leaf and not value._is_view() and
            torch.is_grad_enabled() and torch.is_autocast_cache_enabled()):
        return value.to(dtype)
    cache = getattr(_local, "casts", None)
    if cache is None:
        cache = _local.casts = {}
    entry = cache.get(id(value))
    if entry is not None and entry[0]() is value:
        return entry[1]
    cast = cache[id(value)] = (weakref.ref(value), value.to(dtype))
    return cast[1]


def _clear_cache(clear_atens=torch.clear_autocast_cache) -> None:
    """torch.clear_autocast_cache, which torch.autocast calls on leaving its outermost block:
    ATen's cache and this module's."""
    _local.casts = None
    clear_atens()


def _cast(value, dtype: torch.dtype):
    if isinstance(value, torch.Tensor):
        return _cached_cast(value, dtype) if value.dtype is not dtype and _eligible(value) \
            else value
    if isinstance(value, (list, tuple)):
        return [_cast(v, dtype) for v in value]
    return value


def _cast_args(args: tuple, positions: tuple[int, ...], dtype: torch.dtype) -> list:
    args = list(args)
    for i in positions:
        if i < len(args):  # the dispatcher drops trailing defaulted arguments
            args[i] = _cast(args[i], dtype)
    return args


def _fill(args: tuple, defaults: tuple, n: int) -> list:
    """`args` padded to `n` positions with the schema's defaults."""
    return list(args) + list(defaults[len(args):n])


def _promote_type(args: tuple, votes: tuple[int, ...], lower: torch.dtype) -> torch.dtype:
    result = lower
    for i in votes:
        if i >= len(args):
            continue
        for t in args[i] if isinstance(args[i], (list, tuple)) else (args[i],):
            if not (isinstance(t, torch.Tensor) and t.is_floating_point()
                    and t.device.type == _TYPE) or t.dtype is torch.float64:
                continue  # float64 is ignored, as ATen does
            if result is _FLOAT or t.dtype is _FLOAT:
                result = _FLOAT
            elif t.dtype is not lower:
                raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return result


# -- kernels, one factory per policy --------------------------------------------------------
# Note [Autocast exclusion]: each kernel runs the op under an ExcludeDispatchKeyGuard for
# AutocastPrivateUse1, exactly as ATen's WrapFunction_ does: the casts and the re-call go
# through the full dispatcher (so autograd records the casts) but never reach this key again,
# also not for the ops a composite op decomposes into.
def lower_precision(op, plan: _Plan) -> Callable:
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            dtype = torch.get_autocast_dtype(_TYPE)
            return op(*_cast_args(args, plan.casts, dtype), **kwargs)
    return kernel


def fp32(op, plan: _Plan) -> Callable:
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*_cast_args(args, plan.casts, _FLOAT), **kwargs)
    return kernel


def fp32_set_opt_dtype(op, plan: _Plan) -> Callable:
    at = plan.dtype_at

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if _eligible(args[0]):  # otherwise untouched: an explicit dtype may change promotion
                if at is None:
                    if kwargs.get("dtype") is None:
                        kwargs["dtype"] = _FLOAT
                else:
                    args = _fill(args, plan.defaults, at + 1)
                    if args[at] is None:
                        args[at] = _FLOAT
            return op(*args, **kwargs)
    return kernel


def fp32_append_dtype(op, plan: _Plan, target) -> Callable:
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            dtype = _FLOAT if _eligible(args[0]) else args[0].dtype
            return target(*_fill(args, plan.defaults, len(plan.defaults)), dtype=dtype, **kwargs)
    return kernel


def promote(op, plan: _Plan) -> Callable:
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            dtype = _promote_type(args, plan.votes, torch.get_autocast_dtype(_TYPE))
            return op(*_cast_args(args, plan.casts, dtype), **kwargs)
    return kernel


def banned(op, plan: _Plan) -> Callable:
    def kernel(*args, **kwargs):
        raise RuntimeError(BCE_MESSAGE)
    return kernel


# -- registration at import ------------------------------------------------------------------
POLICY: dict[torch._ops.OpOverload, str] = {}  # every overload with a kernel on KEY -> policy
_LIBRARIES: list[torch.library.Library] = []  # registrations live as long as these objects


def _register() -> None:
    torch.clear_autocast_cache = _clear_cache
    everything = torch.library.Library("_", "IMPL")
    everything.fallback(torch.library.fallthrough_kernel, KEY)
    lib = torch.library.Library("aten", "IMPL")
    _LIBRARIES.extend((everything, lib))
    table = [(op, lower_precision) for op in LOWER_PRECISION + RECURRENT_LAYERS + FAST_PATHS]
    table += [(op, fp32) for op in FP32]
    table += [(op, fp32_set_opt_dtype) for op in FP32_SET_OPT_DTYPE]
    table += [(op, promote) for op in PROMOTE]
    table += [(op, banned) for op in BANNED]
    for op, factory in table:
        _impl(lib, op, factory.__name__, factory(op, _plan(op)))
    for op, target in FP32_APPEND_DTYPE.items():
        _impl(lib, op, "fp32_append_dtype", fp32_append_dtype(op, _plan(op), target))


def _impl(lib: torch.library.Library, op, policy: str, kernel: Callable) -> None:
    if op in POLICY:
        raise RuntimeError(f"{op} is listed twice ({POLICY[op]} and {policy})")
    POLICY[op] = policy
    _compat.keep_dynamo_out(kernel)  # (called from C++ while a compiled graph runs)
    lib.impl(op, kernel, KEY)


_register()
