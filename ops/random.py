"""Random numbers from the device's own generator (Philox4x32-10, counter-based).

The state is (seed, offset), as on CUDA: every random kernel draws counters
offset .. offset+n-1 and advances the offset, so results depend only on the
seed and the sequence of calls, never on the host. `torch.neuron.manual_seed`
makes them reproducible; the CPU generator is never touched.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import torch

from neuron_eager.device_sim import core, forks
from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T
from neuron_eager.ops.jit import njit

aten = torch.ops.aten
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


@njit(inline="always")
def philox(counter, key):
    """Two 32-bit random words for a 64-bit counter and 64-bit key (Philox4x32-10)."""
    return philox_stream(counter, np.uint32(0), key)


@njit(inline="always")
def philox_stream(counter, stream, key):
    """philox's words from another stream of the same counter (the counter's third word):
    for kernels that draw a varying number of values per element (rejection sampling)."""
    c0 = np.uint32(counter & _MASK32)
    c1 = np.uint32(counter >> np.uint64(32))
    c2 = np.uint32(stream)
    c3 = np.uint32(0)
    k0 = np.uint32(key & _MASK32)
    k1 = np.uint32(key >> np.uint64(32))
    for _ in range(10):
        p0 = _M0 * np.uint64(c0)
        p1 = _M1 * np.uint64(c2)
        n0 = np.uint32(p1 >> np.uint64(32)) ^ c1 ^ k0
        n2 = np.uint32(p0 >> np.uint64(32)) ^ c3 ^ k1
        c1 = np.uint32(p1 & _MASK32)
        c3 = np.uint32(p0 & _MASK32)
        c0, c2 = n0, n2
        k0 = np.uint32(k0 + _W0)
        k1 = np.uint32(k1 + _W1)
    return c0, c1


@njit(inline="always")
def uniform01(word):
    """A float32 in [0, 1) from the top 24 bits of a random word."""
    return np.float32(word >> np.uint32(8)) * np.float32(5.9604644775390625e-08)


@njit(inline="always")
def uniform01_inside(word):
    """A float32 in (0, 1), never 0 or 1: the midpoints of 2**23 equal steps, from the top 23
    bits of a random word (with 24, k + 0.5 rounds to an integer in fp32 above 2**23, and the
    last step to 1.0). -log of it is positive: an exponential draw of 0 would win every
    exponential race (CUDA guards against it too)."""
    return (np.float32(word >> np.uint32(9)) + np.float32(0.5)) * np.float32(2.0 ** -23)


@njit(inline="always")
def uniform01_open(word):
    """A float32 in (0, 1] from the top 24 bits of a random word (its log is finite)."""
    return (np.float32(word >> np.uint32(8)) + np.float32(1)) * np.float32(5.9604644775390625e-08)


class Generator:
    """The NeuronCore's random state: a seed and a counter offset."""

    def __init__(self, seed: int = 67280421310721, rounding_noise: bool = False):
        self._lock = threading.Lock()
        forks.renew_after_fork(self, "_lock", threading.Lock)  # (Note [Forking with threads])
        self._rounding_noise = rounding_noise  # the device's: seeds stochastic rounding too
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> "Generator":
        seed = int(seed)
        if not -(1 << 63) <= seed < 1 << 64:  # (the CPU's range and words)
            raise ValueError("Overflow when unpacking long long")
        self._seed = seed & 0xFFFFFFFFFFFFFFFF
        self._offset = 0
        if self._rounding_noise:
            numerics.reset_noise(self._seed)  # Note [stochastic rounding noise]
        return self

    def seed(self) -> int:
        self.manual_seed(time.time_ns() ^ id(self))
        return self._seed

    def initial_seed(self) -> int:
        return self._seed

    def take(self, n: int) -> tuple[np.uint64, np.uint64]:
        """Reserve n counters; returns (key, first counter)."""
        with self._lock:
            offset = self._offset
            self._offset += n
        return np.uint64(self._seed), np.uint64(offset)

    def get_state(self) -> torch.Tensor:
        """The seed and offset (16 bytes, as CUDA's); the device's adds its rounding noise's
        seed and launch count (32 bytes: Note [stochastic rounding noise])."""
        words = [self._seed, self._offset]
        if self._rounding_noise:
            words += numerics.noise_state()
        return torch.from_numpy(np.array(words, dtype=np.uint64).view(np.uint8))

    def set_state(self, state: torch.Tensor) -> None:
        sizes = (16, 32) if self._rounding_noise else (16,)
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or \
                state.numel() not in sizes:
            raise RuntimeError(f"expected a {' or '.join(map(str, sizes))}-byte torch.uint8 "
                               f"state from torch.neuron.get_rng_state()")
        words = [int(w) for w in state.cpu().numpy().view(np.uint64)]
        self._seed, self._offset = words[:2]
        if len(words) == 4:
            numerics.reset_noise(*words[2:])


default_generator = Generator(rounding_noise=True)


class PerElementSampler:
    """A kernel drawing one value per element of a floating input (a rate, a shape), made
    per dtype from `make(load, store)` (numerics' loader to fp32 and storer), whose
    `kernel(out, src, key, counter)` gives element i counter + i. `make` may return more
    kernels in a tuple (a validity check first, say)."""

    def __init__(self, make):
        self._make, self._made = make, {}

    def kernels(self, dtype: torch.dtype):
        code = numerics.CODE[dtype]
        made = self._made.get(code)
        if made is None:
            made = self._made[code] = self._make(numerics.loader(code, "f32"),
                                                 numerics.storer(code))
        return made

    def draw(self, kernel, src: "T.NeuronTensor", flat: np.ndarray) -> "T.NeuronTensor":
        """A new tensor like `src` from `kernel` over its contiguous values `flat`, on the
        GpSimd engine, with counters reserved from the device generator."""
        out = T.empty(src.shape, src.dtype)
        n = out.numel()
        key, counter = default_generator.take(n)
        kernel(out._nd.reshape(-1), flat, key, counter)
        core.launch("gpsimd", n, src._nd.nbytes + out._nd.nbytes)
        return out
