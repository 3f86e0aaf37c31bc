"""Trainium numerics in one place: storage <-> compute conversions and rounding.

Engines compute in fp32 (PSUM accumulates in fp32). A 16-bit float is stored
as its bit pattern (uint16), widened exactly to fp32 on load and rounded to
nearest-even on store; with NEURON_RT_STOCHASTIC_ROUNDING_EN=1 the store
rounds stochastically instead. 64-bit types follow TorchNeuron's eager policy:
float64 computes as float32, int64 as int32, results stored as declared.
Every conversion here is bit-exact against `torch.Tensor.to` (tested).
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from neuron_eager.device_sim import config
from neuron_eager.ops.jit import njit
from neuron_eager.ops.sourceline import warn_at_user_line

# -- bit casts ---------------------------------------------------------------------------


@intrinsic
def u32_as_f32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@intrinsic
def f32_as_u32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


# -- bfloat16 ----------------------------------------------------------------------------
# Note [Conversions inline in LLVM]
# Every kernel loads each operand and stores each result through the small functions below
# (decoders, casts, loaders, storers). They were jitted with inline="always", which makes
# Numba copy the callee's IR into every call site (a deep copy, ~20 ms a site on a slow
# host): most of the time of a fused kernel's compile (a 32-op region with a multiply chain
# 1.56 -> 0.68 s). As ordinary jitted functions they are compiled once per signature and
# LLVM inlines them into the loops, which vectorize as before (fp32/bf16/fp16 4M adds and
# casts, a fused GELU chain: same times) and compute the same bits. Large op bodies still
# need Numba's inlining (Note [Inlined op bodies] in elementwise.py).


@njit
def bf16_to_f32(bits):
    return u32_as_f32(np.uint32(bits) << np.uint32(16))


@njit
def f32_to_bf16(x):
    """Round to nearest even. NaN becomes 0xFFFF, as torch's (vectorised) conversion gives."""
    x = np.float32(x)
    if x != x:
        return np.uint16(0xFFFF)
    u = f32_as_u32(x)
    bias = ((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return np.uint16((u + bias) >> np.uint32(16))


@njit
def f32_to_bf16_stochastic(x, noise):
    """Stochastic rounding: add 16 random low bits, then truncate. Unbiased in expectation."""
    x = np.float32(x)
    if x != x:
        return np.uint16(0xFFFF)
    u = f32_as_u32(x)
    if (u & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
        return np.uint16(u >> np.uint32(16))  # inf stays inf
    return np.uint16((u + (np.uint32(noise) & np.uint32(0xFFFF))) >> np.uint32(16))


# -- float16 -----------------------------------------------------------------------------


# Note [Cheap fp16 conversions]
# Every recorded fp16 op stores and reloads its value through these two functions, inlined
# into each fused kernel; an int->float conversion, a rint and branches for the subnormal
# halves made LLVM compile an fp16 chain 6x slower than the bf16 one. Subnormals instead go
# through one exact float addition each: x + 0.5 rounds x to a multiple of 2**-24 (the ulp
# there), ties to even, and 2**-14 * (1 + m/1024) - 2**-14 is m * 2**-24 exactly. The
# other cases are selects. Same bits as before for every input (all 2^32 fp32 patterns and
# all 2^16 halves compared).
@njit
def f16_to_f32(bits):
    h = np.uint32(bits)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    exp = (h >> np.uint32(10)) & np.uint32(0x1F)
    man = h & np.uint32(0x3FF)
    normal = sign | ((exp + np.uint32(112)) << np.uint32(23)) | (man << np.uint32(13))
    quiet = np.uint32(0x400000) if man else np.uint32(0)  # NaNs come out quiet, as torch's
    special = sign | np.uint32(0x7F800000) | quiet | (man << np.uint32(13))  # inf, NaN
    tiny = sign | f32_as_u32(u32_as_f32(np.uint32(113 << 23) | (man << np.uint32(13)))
                             - np.float32(6.103515625e-05))  # zero, subnormal
    value = special if exp == np.uint32(0x1F) else normal
    return u32_as_f32(tiny if exp == np.uint32(0) else value)


@njit
def f32_to_f16(x):
    """Round to nearest even, with subnormals, overflow to inf, NaN as sign|0x7E00."""
    u = f32_as_u32(np.float32(x))
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    mag = u & np.uint32(0x7FFFFFFF)
    # normal halves: ties-to-even on the 13 dropped bits (a carry may bump the exponent)
    normal = ((mag + np.uint32(0xFFF) + ((mag >> np.uint32(13)) & np.uint32(1)))
              >> np.uint32(13)) - np.uint32(112 << 10)
    tiny = f32_as_u32(u32_as_f32(mag) + np.float32(0.5)) - np.uint32(0x3F000000)
    half = tiny if mag < np.uint32(0x38800000) else normal  # below 2**-14: subnormal
    half = np.uint32(0x7C00) if mag >= np.uint32(0x477FF000) else half  # 65520 up: inf
    half = np.uint32(0x7E00) if mag > np.uint32(0x7F800000) else half  # NaN
    return np.uint16(sign | half)


@njit
def f32_to_f16_stochastic(x, noise):
    """Round up with probability equal to the discarded fraction of a half ulp step."""
    x = np.float32(x)
    down_bits = f32_to_f16(x)
    down = f16_to_f32(down_bits)
    if down != down or down == x or np.isinf(x):
        return down_bits
    # the neighbour on the other side of x: one step of magnitude up or down, in x's sign
    # (down keeps it, -0.0 too: its other neighbour is -2**-24, not +2**-24)
    if abs(down) < abs(x):
        other_bits = np.uint16(down_bits + np.uint16(1))
    else:
        other_bits = np.uint16(down_bits - np.uint16(1))
    other = f16_to_f32(other_bits)
    p = (np.float64(x) - np.float64(down)) / (np.float64(other) - np.float64(down))
    r = (np.uint32(noise) & np.uint32(0xFFFFFF)) * (1.0 / 16777216.0)
    return other_bits if r < p else down_bits


# -- load/store tables -------------------------------------------------------------------
# A "code" names a storage format; a "compute" type names what engines compute in.
CODE = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
        torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
        torch.uint8: "u8", torch.bool: "b"}
FLOAT_CODES = ("f32", "f64", "bf16", "f16")


def compute_type(dtype: torch.dtype) -> str:
    """What an engine computes a value of `dtype` in: 'f32', 'int' or 'bool'."""
    if dtype.is_floating_point:
        return "f32"
    if dtype == torch.bool:
        return "bool"
    return "int"


@njit
def identity(x):
    return x


@njit
def round_to_bf16(x):
    """fp32 -> its value rounded to bf16 (ties to even), as an fp32: for op bodies that
    round an intermediate where the CPU's bf16 kernel does."""
    return bf16_to_f32(f32_to_bf16(x))


@njit
def round_to_tf32(x):
    """fp32 -> the nearest value with a 10-bit mantissa (ties to even); inf/NaN unchanged."""
    u = f32_as_u32(np.float32(x))
    if (u & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
        return np.float32(x)
    u = u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))
    return u32_as_f32(u & np.uint32(0xFFFFE000))


@njit
def round_to_f16(x):
    """f16_to_f32(f32_to_f16(x)) in one step, for fused kernels (Note [Cheap fp16
    conversions]): the fp32 value of x rounded to fp16, ties to even, overflow to inf,
    NaN as sign|0x7FC00000."""
    u = f32_as_u32(np.float32(x))
    sign = u & np.uint32(0x80000000)
    mag = u & np.uint32(0x7FFFFFFF)
    normal = (mag + np.uint32(0xFFF) + ((mag >> np.uint32(13)) & np.uint32(1))) & \
        np.uint32(0xFFFFE000)
    tiny = f32_as_u32((u32_as_f32(mag) + np.float32(0.5)) - np.float32(0.5))
    value = tiny if mag < np.uint32(0x38800000) else normal
    value = np.uint32(0x7F800000) if mag >= np.uint32(0x477FF000) else value
    value = np.uint32(0x7FC00000) if mag > np.uint32(0x7F800000) else value
    return u32_as_f32(sign | value)


# One jitted function per conversion: a second copy of the same code would have the same
# disk-cache key, so a fresh process would load one copy's machine code for the other
# (Note [Plain kernels on disk] in ops/jit.py), and `_decoder` runs once per loader.
_AS_F32 = njit(lambda x: np.float32(x))
_AS_I32 = njit(lambda x: np.int64(np.int32(x)))  # int64 is computed in 32 bits
_NONZERO = njit(lambda x: x != 0)


# fp32 inputs rounded on load, for auto-cast (see `load_code`)
_AUTO_CAST_DECODERS = {
    "f32>bf16": njit(lambda x: bf16_to_f32(f32_to_bf16(x))),
    "f32>fp16": njit(lambda x: f16_to_f32(f32_to_f16(x))),
    "f32>tf32": round_to_tf32,
}


def load_code(dtype: torch.dtype, scope: str = "all") -> str:
    """The loader format for an input of `dtype` to an op of auto-cast `scope`.

    Mirrors the Neuron compiler's --auto-cast: with config.auto_cast "matmult", fp32 inputs
    of matmuls and convolutions (scope "matmult") are rounded to config.auto_cast_type; with
    "all", fp32 inputs of elementwise ops too (scope "all").
    """
    if dtype == torch.float32 and config.auto_cast != "none" and (
            scope == "matmult" or config.auto_cast == "all"):
        return "f32>" + config.auto_cast_type
    return CODE[dtype]


def _decoder(code: str):
    """Stored element -> its natural engine value."""
    if code in _AUTO_CAST_DECODERS:
        return _AUTO_CAST_DECODERS[code]
    if code == "bf16":
        return bf16_to_f32
    if code == "f16":
        return f16_to_f32
    if code == "f64":
        return _AS_F32
    if code == "i64":
        return _AS_I32
    return identity


_INT32_LOW, _INT32_HIGH = np.float32(-2.0 ** 31), np.float32(2.0 ** 31)


# Note [Float to int]
# A float becomes an integer as the CPU's conversion does it (cvttss2si, toward zero): NaN,
# infinities and values outside the int32 range give INT32_MIN, and int8/int16/uint8 keep
# the low bits of that int32 (torch.tensor([3e10]).to(torch.int16) is 0, of 70000.0 4464).
# A plain `int64(x)` is undefined in LLVM for those values: vector and scalar code gave
# different answers, fp32 and bf16 sources others again. int64 is computed as int32
# (TorchNeuron's policy), so an int64 result is that int32 too (the CPU gives INT64_MIN for
# NaN, and the exact value beyond int32).
@njit
def float_to_int(x):
    # (statements, not a ternary: an inlined ternary sets off NumbaIRAssumptionWarning)
    v = x
    if not (x >= _INT32_LOW and x < _INT32_HIGH):  # (NaN too)
        v = _INT32_LOW
    return np.int64(np.int32(v))


def to_int64(x):
    """int64(x) in jitted code: a float by Note [Float to int], an integer as it is."""


@overload(to_int64, inline="always")
def _to_int64(x):
    if isinstance(x, types.Float):
        return lambda x: float_to_int(x)
    return lambda x: np.int64(x)


_CASTS = {
    "f32": _AS_F32,
    "int": njit(lambda x: to_int64(x)),
    "bool": _NONZERO,
}
_loaders: dict = {}
_composed: dict = {}  # (decoder, cast) -> their loader
_storers: dict = {}


def loader(code: str, compute: str):
    """A jitted function: stored element of format `code` -> value in `compute`."""
    key = (code, compute)
    fn = _loaders.get(key)
    if fn is None:
        decode, cast = _decoder(code), _CASTS[compute]
        if code == "b" and compute == "bool":
            fn = identity
        else:  # (one per pair: most integer formats share a decoder, see _AS_F32's comment)
            fn = _composed.get((decode, cast))
            if fn is None:
                fn = _composed[decode, cast] = njit(lambda x: cast(decode(x)))
        _loaders[key] = fn
    return fn


_INT_STORE = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "u8": np.uint8}


def storer(code: str, stochastic: bool = False):
    """A jitted function: computed value -> stored element of format `code`.

    Stochastic storers take a second argument, 32 random bits.
    """
    key = (code, stochastic)
    fn = _storers.get(key)
    if fn is None:
        if code == "bf16":
            fn = f32_to_bf16_stochastic if stochastic else f32_to_bf16
        elif code == "f16":
            fn = f32_to_f16_stochastic if stochastic else f32_to_f16
        elif code == "f32":
            fn = _AS_F32
        elif code == "f64":
            fn = njit(lambda x: np.float64(np.float32(x)))
        elif code == "i64":
            fn = njit(lambda x: np.int64(np.int32(to_int64(x))))
        elif code == "i64x":  # exact, for results wrapped and checked later (wrap_int64)
            fn = njit(lambda x: np.int64(x))
        elif code == "b":
            fn = _NONZERO
        else:
            cast = _INT_STORE[code]
            fn = njit(lambda x: cast(to_int64(x)))
        _storers[key] = fn
    return fn


# -- int64 computed as int32 (TorchNeuron's policy) -------------------------------------------
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
int64_warned = False  # the data warning: once per process
_wrap_warned: set = set()  # ops whose int64 results wrapped, warned once each


def warn_int64_range(*values) -> None:
    """Warn once when int64 values outside int32's range reach the device: host copies keep
    them, but ops compute int64 as int32 (TorchNeuron's policy) and wrap them."""
    global int64_warned
    if int64_warned:
        return
    for v in values:
        if isinstance(v, np.ndarray):
            if v.dtype.kind == "f":  # inf and NaN have no integer value on any device (T5
                v = v[np.isfinite(v)]  # casts log(0) = -inf to int64, then masks it out)
            out = v.size and (v.min() < INT32_MIN or v.max() > INT32_MAX)
        else:
            out = isinstance(v, int) and not INT32_MIN <= v <= INT32_MAX
        if out:
            int64_warned = True
            warn_at_user_line("int64 values outside the int32 range reached neuron: ops "
                              "compute int64 as int32, as on Trainium (TorchNeuron's policy), "
                              "so arithmetic on them wraps and floats beyond it convert to "
                              "-2147483648, as to int32 (copies from the host keep them).")
            return


def wrap_int64(values: np.ndarray, op: str) -> None:
    """Exact int64 results of `op` (a sum, product or scan), wrapped to int32 in place as
    Trainium computes them; the first wrap of each op warns, since the CPU keeps them."""
    if values.size and (values.min() < INT32_MIN or values.max() > INT32_MAX):
        if op not in _wrap_warned:
            _wrap_warned.add(op)
            warn_at_user_line(f"{op} of int64 values left the int32 range on neuron and "
                              f"wrapped: ops compute int64 as int32, as on Trainium "
                              f"(TorchNeuron's policy), where the CPU keeps 64 bits; compute "
                              f"such values on the CPU if you need them.")
        np.copyto(values, values.astype(np.int32))


# The C++ names c10 gives the dtypes in its overflow message.
_C_NAMES = {torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t",
            torch.int32: "int", torch.int64: "int64_t", torch.float16: "c10::Half",
            torch.bfloat16: "c10::BFloat16", torch.float32: "float"}


def check_fits(value, dtype: torch.dtype) -> None:
    """Raise as c10 does where an op converts a Python scalar to `dtype` with a check (fill,
    clamp, masked_fill, index_fill): integers out of the type's range (an unsigned type takes
    integers from -max, floats from 0, as c10 allows), finite floats beyond its largest value.
    Infinities and NaN fit floats."""
    if fits_every_dtype(value):
        return
    if dtype == torch.bool or dtype == torch.float64 or isinstance(value, bool):
        return
    if isinstance(value, complex):  # c10 converts a complex scalar with no imaginary part
        if value.imag != 0:
            raise RuntimeError(f"value cannot be converted to type {_C_NAMES[dtype]} without "
                               f"overflow")
        value = value.real
    if dtype.is_floating_point:
        value = float(value)
        if math.isfinite(value) and abs(value) > torch.finfo(dtype).max:
            raise RuntimeError(f"value cannot be converted to type {_C_NAMES[dtype]} without "
                               f"overflow")
        return
    if dtype == torch.int64 and not isinstance(value, float):
        warn_int64_range(int(value))  # (stored whole, but ops compute it as int32)
    if dtype in _C_NAMES:
        info = torch.iinfo(dtype)
        # (c10 lets an integer into an unsigned type from -max, a float only from 0)
        low = -info.max if info.min == 0 and not isinstance(value, float) else info.min
        if isinstance(value, float) and not math.isfinite(value) or not low <= value <= info.max:
            raise RuntimeError(f"value cannot be converted to type {_C_NAMES[dtype]} without "
                               f"overflow")


def fits_every_dtype(value) -> bool:
    """A Python int in int8's range (not a bool): the usual 1s and 0s of alpha, beta and
    limits fit every type, so no dtype need be found to check them."""
    return type(value) is int and -127 <= value <= 127


def check_fits_compute(value, dtype: torch.dtype) -> None:
    """`check_fits` for a scalar the CPU converts to the compute type of a `dtype` result:
    float32 for 16-bit floats (addcmul's value, lerp's weight, leaky_relu's slope, addmm's
    beta), the type itself otherwise."""
    check_fits(value, torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype)


def check_alpha(alpha, dtype: torch.dtype) -> None:
    """The CPU's checks of add's and sub's alpha against the result's dtype (an integer result
    would silently truncate a float alpha; a value beyond the dtype's range raises)."""
    if isinstance(alpha, bool) and dtype != torch.bool:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if isinstance(alpha, complex):
        raise RuntimeError("For non-complex input tensors, argument alpha must not be a complex "
                           "number.")
    if not dtype.is_floating_point and not isinstance(alpha, numbers.Integral):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating "
                           "point number.")
    check_fits(alpha, dtype)


def encode_scalar(value, dtype: torch.dtype):
    """The stored form of a Python scalar in `dtype` (as torch would round it)."""
    kind = type(value)
    # (a float's sign is in the key: -0.0 == 0.0; a NaN finds no entry and is encoded anew)
    key = (kind, value, dtype, math.copysign(1.0, value)) if kind is float else \
        (kind, value, dtype) if kind is int or kind is bool else None
    stored = _encoded.get(key) if key is not None else None
    if stored is None:
        check_fits(value, dtype)
        t = torch.tensor(value.real if isinstance(value, complex) else value, dtype=dtype)
        stored = np.uint16(t.view(torch.int16).item() & 0xFFFF) \
            if dtype in (torch.bfloat16, torch.float16) else t.numpy()[()]
        if key is not None:
            if len(_encoded) >= 4096:
                _encoded.clear()
            _encoded[key] = stored
    return stored


_encoded: dict = {}  # (type, value, dtype[, sign]) -> stored form (fills repeat a few values)


def reduced_scalar(v: float, dtype: torch.dtype) -> float:
    """`v` rounded to bf16/fp16 through float32, as the CPU rounds a Python number for such a
    dtype (a CPU op: several microseconds, so the values an optimizer or schedule passes
    again are remembered)."""
    key = (dtype, v, math.copysign(1.0, v))  # (-0.0 == 0.0 as a key; NaNs never match)
    r = _reduced_values.get(key)
    if r is None:
        with np.errstate(over="ignore"):  # (beyond float32: inf, as the CPU's cast)
            r = torch.tensor(np.float32(v)).to(dtype).item()
        if v == v:
            if len(_reduced_values) >= 4096:
                _reduced_values.clear()
            _reduced_values[key] = r
    return r


_reduced_values: dict = {}  # (dtype, value, its sign) -> the value rounded to dtype


def _to_f32(value, _f32=np.float32):
    """A Python scalar as an fp32 kernel argument; one past fp32's range is +-inf, as the CPU
    casts it, without NumPy's overflow warning."""
    if -3.4e38 < value < 3.4e38:
        return _f32(value)
    with np.errstate(over="ignore"):
        return _f32(value)


SCALAR_CAST = {"f32": _to_f32, "bool": bool, "int": np.int64}


def scalar_for(value, compute: str, common: torch.dtype | None = None):
    """A Python scalar as a kernel argument in the compute type (`scalar_cast`)."""
    return scalar_cast(compute, common)(value)


def _int_wrapper(bits: int, signed: bool):
    mask, top = (1 << bits) - 1, 1 << (bits - 1)

    def wrap(value):
        v = int(value) & mask
        return np.int64(v - (1 << bits) if signed and v >= top else v)
    return wrap


# Note [Integer scalars wrap]
# TensorIterator casts a Python integer to the operands' common dtype before the op, so on a
# uint8 tensor `x // -1` divides by 255 and `x < -1` compares with 255; an int8 `x % 300`
# takes 300 as 44. Kernels compute integers in int64, so the cast happens here, on the host.
_NARROW_INTS = {torch.uint8: _int_wrapper(8, False), torch.int8: _int_wrapper(8, True),
                torch.int16: _int_wrapper(16, True), torch.int32: _int_wrapper(32, True)}


def scalar_cast(compute: str, common: torch.dtype | None = None):
    """The conversion of a Python scalar to a kernel argument for operands whose common
    dtype is `common` (Note [Integer scalars wrap])."""
    if compute == "int" and common in _NARROW_INTS:
        return _NARROW_INTS[common]
    return SCALAR_CAST[compute]


# -- the order of fp32 sums -------------------------------------------------------------------
# Note [Sum order]
# A float row (a sum or mean, alone or inside a fused row kernel) is added in blocks of
# SUM_BLOCK elements. Inside a block, element i goes to lane i % SUM_LANES; each lane adds its
# elements in order into an fp32 partial sum starting at +0. The lanes are then folded
# pairwise (lane q += lane q + h, for h = 32, 16, ..., 1) and lane 0 is the block's sum; the
# block sums are added in order into the row's total, from +0. Why this order: the 64 lanes
# are independent chains that LLVM vectorizes (four AVX-512 registers' worth), so a row is
# summed at memory speed, where one chain per block of 256 (the order before) waited an
# add's latency per element: sum(-1) of a 1024 x 1024 fp32 tensor 0.62 -> 0.28 ms, and
# softmax, which also summed as it exponentiated, 7.1 -> 1.0 ms. Chains stay short (64
# additions within a block, n / 4096 across blocks, 6 fold levels): the fp32 error is no
# larger than that order's. Past ~1e7 elements the chain of block sums shows: a sum of 1e7
# values in [0.5, 1.5) was 6e-7 off (relative; the CPU's pairwise sum 8.5e-8), of 4e7 2.3e-6
# (the CPU's 5.6e-8). Folding the block sums pairwise would cure it (in every row kernel,
# fused ones included, to keep adaptive eager's bits): not done.
# Lanes that got no element hold +0 and never -0 (+0 + -0 is +0), so folding them is exact:
# a block of m < 64 elements skips the levels h >= m, with the same bits.
# A NaN block sum is the one quiet NaN, +nan: when two NaNs meet (a NaN element and the
# -nan of inf + -inf), x86 keeps the first operand's, and LLVM may order an add's operands
# otherwise in a fused kernel than in plain eager's, so the sign would depend on the kernel.
SUM_LANES = 64  # (fold_lanes spells out the levels of 64)
SUM_BLOCK = 4096
SUM_QUAD = 4 * SUM_LANES  # elements a lane loop adds per pass (Note [Lanes in registers])
_QUIET_NAN = np.float32(np.nan)


# Note [Lanes in registers]
# The lane loop, vectorized over the 64 lanes, keeps them in memory (`lanes` might alias the
# values, so LLVM cannot hold them in registers): each pass of 64 elements loads the lanes,
# adds and stores them back, and the next pass waits for that store. So the loops take four
# passes at a time: each lane adds its next four elements one after another in a register
# (the same additions in the same order, so the same bits) and is stored once. 1M fp32 on one
# core: 85 -> 55 us. A loop over k of four spelled-out adds unrolls the same way.


@njit(inline="always")
def fold_lanes(lanes, used):
    """The sum of the first `used` lanes in the fold order (Note [Sum order]); the other
    lanes must hold +0. (Levels spelled out: constant trip counts vectorize.)"""
    if used > 32:
        for q in range(32):
            lanes[q] += lanes[q + 32]
    if used > 16:
        for q in range(16):
            lanes[q] += lanes[q + 16]
    if used > 8:
        for q in range(8):
            lanes[q] += lanes[q + 8]
    if used > 4:
        for q in range(4):
            lanes[q] += lanes[q + 4]
    if used > 2:
        lanes[0] += lanes[2]
        lanes[1] += lanes[3]
    if used > 1:
        lanes[0] += lanes[1]
    return quiet_nan(lanes[0])


def quiet_nan(x):
    """x, with any NaN made the one quiet NaN (Note [Sum order]); integers as they are (a
    select against a float NaN would make an integer sum a float, whose int32 store then
    saturated where the CPU's wraps)."""


@overload(quiet_nan)
def _quiet_nan(x):
    if isinstance(x, types.Float):
        def quiet(x):
            if x != x:
                return _QUIET_NAN
            return x
        return quiet
    return lambda x: x


@njit(inline="always")
def lane_sum(values, n, lanes):
    """The fp32 sum of values[0:n] in the order of Note [Sum order]; `lanes` is scratch of
    SUM_LANES fp32."""
    total = np.float32(0)
    # the lane loop runs to `width` (SUM_LANES, read from the array): LLVM unrolls a loop of
    # constant trip count, and cannot vectorize the unrolled adds (`lanes` may alias `values`)
    width = lanes.size
    for b0 in range(0, n, SUM_BLOCK):
        end = min(b0 + SUM_BLOCK, n)
        for q in range(width):
            lanes[q] = np.float32(0)
        whole = b0 + (end - b0) // SUM_LANES * SUM_LANES
        quads = b0 + (end - b0) // SUM_QUAD * SUM_QUAD
        for c0 in range(b0, quads, SUM_QUAD):  # (Note [Lanes in registers])
            for q in range(width):
                at = np.uint64(c0) + np.uint64(q)
                acc = lanes[q]
                acc += values[at]
                acc += values[at + np.uint64(SUM_LANES)]
                acc += values[at + np.uint64(2 * SUM_LANES)]
                acc += values[at + np.uint64(3 * SUM_LANES)]
                lanes[q] = acc
        for c0 in range(quads, whole, SUM_LANES):
            for q in range(width):
                lanes[q] += values[np.uint64(c0) + np.uint64(q)]
        for c in range(whole, end):
            lanes[c - whole] += values[np.uint64(c)]  # (unsigned: no wraparound select)
        total += fold_lanes(lanes, min(end - b0, SUM_LANES))
    return total


@njit(inline="always")
def deviation_sums(values, n, mu, lanes, lanes2):
    """(sum of d, sum of d * d) for d = values[j] - mu, j < n, each in the order of Note [Sum
    order], in one pass; `lanes` and `lanes2` are scratch of SUM_LANES fp32."""
    s1 = np.float32(0)
    s2 = np.float32(0)
    width = lanes.size  # (as in lane_sum)
    for b0 in range(0, n, SUM_BLOCK):
        end = min(b0 + SUM_BLOCK, n)
        for q in range(width):
            lanes[q] = np.float32(0)
            lanes2[q] = np.float32(0)
        whole = b0 + (end - b0) // SUM_LANES * SUM_LANES
        quads = b0 + (end - b0) // SUM_QUAD * SUM_QUAD
        for c0 in range(b0, quads, SUM_QUAD):  # (Note [Lanes in registers])
            for q in range(width):
                at = np.uint64(c0) + np.uint64(q)
                acc, acc2 = lanes[q], lanes2[q]
                for k in range(4):
                    d = values[at + np.uint64(k * SUM_LANES)] - mu
                    acc += d
                    acc2 += d * d
                lanes[q], lanes2[q] = acc, acc2
        for c0 in range(quads, whole, SUM_LANES):
            for q in range(width):
                d = values[np.uint64(c0) + np.uint64(q)] - mu
                lanes[q] += d
                lanes2[q] += d * d
        for c in range(whole, end):
            d = values[c] - mu
            lanes[c - whole] += d
            lanes2[c - whole] += d * d
        used = min(end - b0, SUM_LANES)
        s1 += fold_lanes(lanes, used)
        s2 += fold_lanes(lanes2, used)
    return s1, s2


# Note [Amax by keys]
# Eager amax keeps the first element, then any greater one, and the first NaN. Without NaNs
# that is the row's maximum, except for the sign of a zero maximum (the first of -0.0 and
# 0.0 wins). So a row's maximum is found on integer keys of the fp32 bit patterns (order-
# preserving: the sign bit flips the other bits of negatives), which LLVM vectorizes where
# the float compare-and-branch loop ran one element at a time (4x faster); a row with a NaN
# or a zero maximum is scanned again the eager way. The same for the minimum.
@njit(inline="always")
def row_extreme(values, n, want_max):
    """The maximum (or minimum) of values[0:n], n >= 1, as an eager compare-and-keep loop
    finds it: the first NaN, else the first of the largest (smallest) values, so a zero
    result keeps the first zero's sign (Note [Amax by keys])."""
    best = np.int32(-2147483648) if want_max else np.int32(2147483647)
    nan = np.uint32(0)
    for i in range(n):
        bits = f32_as_u32(values[i])
        key = np.int32(bits)
        key ^= (key >> 31) & 0x7FFFFFFF
        best = max(best, key) if want_max else min(best, key)
        nan |= np.uint32((bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000))
    m = u32_as_f32(np.uint32(best ^ ((best >> 31) & 0x7FFFFFFF)))
    if nan != 0 or m == 0:
        m = values[0]
        if m == m:
            for i in range(1, n):
                x = values[i]
                if x != x:
                    return x
                if (x > m) if want_max else (x < m):
                    m = x
    return m


@njit(inline="always")
def first_equal(values, n, m):
    """The index of the first of values[0:n] equal to m (the first NaN when m is NaN), which
    must be there. Groups of SUM_LANES are tested whole (a vectorized test) before one is
    searched element by element."""
    nan = m != m
    c = 0
    while c + SUM_LANES <= n:
        hit = False
        for q in range(SUM_LANES):
            v = values[np.uint64(c + q)]
            hit |= (v != v) if nan else (v == m)
        if hit:
            break
        c += SUM_LANES
    if nan:
        while values[c] == values[c]:
            c += 1
    else:
        while values[c] != m:
            c += 1
    return c


@njit(inline="always")
def row_max(values, n):
    """row_extreme's maximum."""
    return row_extreme(values, n, True)


# -- stochastic-rounding noise ---------------------------------------------------------------
# Note [stochastic rounding noise]
# Stochastic storers take 32 random bits per element from the calling thread's Numba RNG.
# Before every stochastic kernel that RNG is reseeded from a stream derived from the device
# seed (`torch.neuron.manual_seed` resets it) and a launch counter, so rounding noise is
# reproducible under a seed and independent of the host, and turning stochastic rounding on
# does not shift the device's other random numbers (dropout masks, randn...).
_noise = {"seed": 0, "launch": 0}
_MASK64 = (1 << 64) - 1


@njit(nogil=True)
def _seed_thread_rng(seed):
    np.random.seed(seed)


def reset_noise(seed: int, launch: int = 0) -> None:
    _noise["seed"], _noise["launch"] = seed & _MASK64, launch & _MASK64


def noise_state() -> tuple[int, int]:
    """(seed, launches so far): part of torch.neuron.get_rng_state(), so that restoring the
    state repeats the rounding too."""
    return _noise["seed"], _noise["launch"]


def _mix(x: int) -> int:
    """splitmix64's finaliser: distinct launch numbers give unrelated seeds."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def seed_noise() -> None:
    """Seed this thread's rounding noise for the next stochastic kernel launch."""
    launch = _noise["launch"]
    _noise["launch"] = launch + 1
    _seed_thread_rng(_mix(_noise["seed"] ^ _mix(launch)) & 0xFFFFFFFF)


def with_noise(kernel):
    """`kernel`, seeding the rounding noise before each call (for stochastic kernels)."""

    def run(*args):
        seed_noise()
        return kernel(*args)

    run.py_kernel = kernel
    return run
