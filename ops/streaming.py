"""Streaming stores for large float32 results: add, sub, mul and div written around the cache.

A large elementwise result is written once and not read again before it leaves the cache, so
writing it through the cache costs a read of every line first (read-for-ownership) and
evicts the operands. Non-temporal stores write whole lines straight to memory, as memcpy
does above about 3/4 of the last-level cache (glibc's threshold, used here for the bytes the
loop touches). LLVM's loop vectorizer will not emit them (it cannot prove the stores
aligned), so the loop is written in LLVM IR: 8-float vectors, aligned non-temporal stores,
a scalar head up to the first 32-byte boundary and a scalar tail. The operations are single
IEEE fp32 adds, subtracts, multiplies and divides, so the bits are those of the generated
kernels (tests compare).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from neuron_eager.device_sim.config import config
from neuron_eager.ops.jit import njit

LANES = 8  # float32 lanes in a 32-byte vector
_OPCODES = {0: "fadd", 1: "fsub", 2: "fmul", 3: "fdiv"}
KERNEL_OPS = {"add_plain": 0, "sub_plain": 1, "mul": 2, "div": 3}  # Elementwise op names


def _threshold_bytes() -> int:
    """3/4 of the last-level cache (8 MiB assumed when the system does not say)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip()
        size = int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]]
    except (OSError, ValueError, KeyError):
        size = 8 << 20
    return size * 3 // 4


MIN_BYTES = _threshold_bytes()


@intrinsic
def _vector_body(typingctx, out, a, b, start, count, opcode):
    """out[start + 8k + i] = a op b for k < count, i < 8, with non-temporal stores (out at
    `start` is 32-byte aligned); a scalar operand is broadcast. Ends with a fence: the
    stores are weakly ordered, and another thread reads them once this slice says done."""
    if not isinstance(opcode, types.IntegerLiteral):
        return None
    name = _OPCODES[opcode.literal_value]
    operand_types = (a, b)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        vec = ir.VectorType(f32, LANES)
        arrays = [context.make_array(t)(context, builder, v) if isinstance(t, types.Array)
                  else None for t, v in zip((out,) + operand_types, args[:3])]
        splats = []
        for t, v in zip(operand_types, args[1:3]):
            if isinstance(t, types.Array):
                splats.append(None)
            else:
                lane = context.cast(builder, v, t, types.float32)
                splat = ir.Constant(vec, ir.Undefined)
                for i in range(LANES):
                    splat = builder.insert_element(splat, lane, ir.Constant(ir.IntType(32), i))
                splats.append(splat)
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        start_v, count_v = args[3], args[4]
        with cgutils.for_range(builder, count_v) as loop:
            index = builder.add(start_v, builder.mul(loop.index,
                                                     ir.Constant(loop.index.type, LANES)))
            values = []
            for array, splat in zip(arrays[1:], splats):
                if splat is not None:
                    values.append(splat)
                else:
                    where = builder.bitcast(builder.gep(array.data, [index]), vec.as_pointer())
                    values.append(builder.load(where, align=4))
            result = getattr(builder, name)(values[0], values[1])
            where = builder.bitcast(builder.gep(arrays[0].data, [index]), vec.as_pointer())
            store = builder.store(result, where, align=32)
            store.set_metadata("nontemporal", nontemporal)
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(out, a, b, start, count, opcode), codegen


def _kernel(opcode: int):
    """kernel(out, a, b) over flat float32 arrays (or one float32 scalar), as the generated
    elementwise kernels are called."""

    def kernel(out, a, b):
        n = out.shape[0]
        head = min(n, ((32 - out.ctypes.data % 32) % 32) // 4)
        for i in range(head):
            out[i] = _scalar(a, b, i, opcode)
        body = (n - head) // LANES
        _vector_body(out, a, b, head, body, opcode)
        for i in range(head + body * LANES, n):
            out[i] = _scalar(a, b, i, opcode)

    return njit(nogil=True, error_model="numpy")(kernel)


def _at(x, i):
    """x[i] for an array, x for a scalar (resolved when compiled)."""


@overload(_at, inline="always")
def _at_typed(x, i):
    if isinstance(x, types.Array):
        return lambda x, i: x[i]
    return lambda x, i: x


@njit(inline="always", error_model="numpy")
def _scalar(a, b, i, opcode):
    x, y = np.float32(_at(a, i)), np.float32(_at(b, i))
    if opcode == 0:
        return x + y
    if opcode == 1:
        return x - y
    if opcode == 2:
        return x * y
    return x / y


KERNELS = {name: _kernel(code) for name, code in KERNEL_OPS.items()}


def kernel_for(op_name: str, out: np.ndarray, args: list):
    """The streaming kernel for this call, or None: a float32 result from float32 arrays or
    scalars of an op in KERNEL_OPS, whose loop touches at least MIN_BYTES (the result and
    the arrays it reads: what must fit in the cache for the result to be worth keeping
    there; a 4M-element add's 48 MB on a 32 MB L3 ran 1.18 ms cached, 1.00 ms streamed)."""
    if not config.streaming_stores or out.dtype != np.float32:
        return None
    kernel = KERNELS.get(op_name)
    if kernel is None or len(args) != 2:
        return None
    touched = out.nbytes
    for a in args:
        if isinstance(a, np.ndarray):
            if a.dtype != np.float32:
                return None
            touched += a.nbytes
        elif not isinstance(a, np.float32):
            return None
    return kernel if touched >= MIN_BYTES else None
