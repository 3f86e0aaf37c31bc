"""Random sampling ops, all drawn from the device generator (ops/random.py, Philox4x32-10).

Element i of a sampling kernel uses counter offset+i, so a result depends only
on torch.neuron's seed and the sequence of calls; the CPU generator is never
touched. Values are computed in fp32 and rounded once into the output dtype.
Factories (rand, randn, randint, normal.float_float) reach these as empty + `op_`.
Also here: geometric / cauchy / log_normal, and rrelu's random slopes in training.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from neuron_eager.device_sim import core
from neuron_eager.ops import elementwise as E
from neuron_eager.ops import kernelgen, numerics, workers
from neuron_eager.ops import overlap
from neuron_eager.ops import tensor as T
from neuron_eager.ops.copy import honours_device, like_strides
from neuron_eager.ops.factories import on_device_zero
from neuron_eager.ops.fastmath import cos_f32, log_f32
from neuron_eager.ops.jit import njit
from neuron_eager.ops.random import (default_generator, philox, uniform01, uniform01_inside,
                                     uniform01_open)
from neuron_eager.ops.registry import register
from neuron_eager.ops.meta import meta_run

aten = torch.ops.aten
NeuronTensor = T.NeuronTensor
_JIT = kernelgen.JIT_OPTIONS
_F32 = np.float32
_TWO_PI = _F32(6.2831855)
_NO_P = np.empty(0, np.float32)


# -- transforms: two random words (+ two parameters) -> an fp32 value --------------------------
@njit(inline="always")
def normal01(w0, w1):
    """A standard normal (Box-Muller); u1 lies in (0, 1] so the log is finite. The log and
    cosine are the engines' approximations (ops/fastmath.py): NumPy's are libm calls, one
    element at a time (randn of 1M took 38 ms)."""
    u1 = uniform01_open(w0)
    u2 = uniform01(w1)
    return np.sqrt(_F32(-2) * log_f32(u1)) * cos_f32(_TWO_PI * u2)


_TRANSFORMS = {
    "uniform": njit(inline="always")(lambda w0, w1, a, b: a + (b - a) * uniform01(w0)),
    "normal": njit(inline="always")(lambda w0, w1, a, b: a + b * normal01(w0, w1)),
    "exponential": njit(inline="always")(  # (u in (0, 1): every draw is > 0)
        lambda w0, w1, a, b: -np.log(uniform01_inside(w0)) / a),
    "bernoulli": njit(inline="always")(
        lambda w0, w1, a, b: _F32(1) if uniform01(w0) < a else _F32(0)),
    # u in (0, 1) so the log is finite and every draw is >= 1; b = log1p(-p) from the host
    "geometric": njit(inline="always")(
        lambda w0, w1, a, b: np.ceil(np.log(uniform01_inside(w0)) / b)),
    "cauchy": njit(inline="always")(
        lambda w0, w1, a, b: a + b * np.tan(_F32(np.pi) * (uniform01(w0) - _F32(0.5)))),
    "log_normal": njit(inline="always")(lambda w0, w1, a, b: np.exp(a + b * normal01(w0, w1))),
}


def _make_sampler(transform, store, load, upper_open):
    @njit(inline="always")
    def draw(w0, w1, a, b):
        v = store(transform(w0, w1, a, b))
        if upper_open and load(v) >= b:  # rounding reached `to`: [from, to) stays open
            v = store(a)
        return v

    @njit(**_JIT)
    def sample(out, key, counter, a, b, p):
        if p.shape[0]:  # a per-element parameter (bernoulli with a probability tensor)
            for i in range(out.shape[0]):
                w0, w1 = philox(counter + np.uint64(i), key)
                out[i] = draw(w0, w1, p[i], b)
        else:  # (a loop of its own: the test inside made randn's loop 6x slower)
            for i in range(out.shape[0]):
                w0, w1 = philox(counter + np.uint64(i), key)
                out[i] = draw(w0, w1, a, b)

    return sample


_samplers: dict = {}


def _sampler(name: str, code: str):
    key = (name, code)
    fn = _samplers.get(key)
    if fn is None:
        load = numerics.loader(code, "f32") if code in numerics.FLOAT_CODES else numerics.identity
        fn = _samplers[key] = _make_sampler(_TRANSFORMS[name], numerics.storer(code), load,
                                            name == "uniform" and code in numerics.FLOAT_CODES)
    return fn


def check_generator(generator):
    if generator is not None:
        raise RuntimeError("neuron sampling draws from the device generator (seed it with "
                           "torch.neuron.manual_seed); torch.Generator objects are not supported")


def fill_random(x: NeuronTensor, name: str, a=0.0, b=0.0, p: np.ndarray = _NO_P) -> NeuronTensor:
    """Fill x with samples of distribution `name`, one Philox counter per element."""
    overlap.check_no_internal_overlap(x)  # (an expanded x: the CPU refuses, its draws would race)
    n = x.numel()
    if n == 0:
        return x
    target = x if x.is_contiguous() else T.empty(x.shape, x.dtype)
    key, counter = default_generator.take(n)
    sample, out = _sampler(name, numerics.CODE[x.dtype]), target._nd.reshape(-1)
    a, b = _F32(a), _F32(b)
    # element i draws from counter + i wherever it runs: large fills a share per core
    workers.share_rows(lambda lo, hi: sample(out[lo:hi], key, counter + np.uint64(lo), a, b,
                                             p[lo:hi] if p.shape[0] else p), n, n, [])
    core.launch("gpsimd", n, target._nd.nbytes)
    return x if target is x else E.copy_into(x, target)


def _float_only(x, op):
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f"\"{op}\" not implemented for '{T.dtype_name(x.dtype)}'")


def _cpu_checks(method: str, x, *args) -> None:
    """The CPU's argument checks (and warnings) of a sampler, run on an empty CPU tensor of
    x's dtype: bounds that the dtype cannot hold, ranges it cannot draw evenly. Nothing is
    drawn, the CPU's generator is left as it was."""
    getattr(torch.empty(0, dtype=x.dtype), method)(*args)


@register(aten.uniform_.default)
def uniform_(x, from_=0.0, to=1.0, *, generator=None):
    check_generator(generator)
    _cpu_checks("uniform_", x, from_, to)
    return fill_random(x, "uniform", from_, to)


@register(aten.normal_.default)
def normal_(x, mean=0.0, std=1.0, *, generator=None):
    check_generator(generator)
    _float_only(x, "normal_kernel_cpu")
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")
    return fill_random(x, "normal", mean, std)


@register(aten.exponential_.default)
def exponential_(x, lambd=1.0, *, generator=None):
    check_generator(generator)
    if not x.dtype.is_floating_point:
        raise RuntimeError("Exponential distribution is a continuous probability distribution. "
                           f"dtype must be a floating point but you specified "
                           f"{T.dtype_name(x.dtype)}")
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd:g}")
    return fill_random(x, "exponential", lambd)


@register(aten.geometric_.default)
def geometric_(x, p, *, generator=None):
    check_generator(generator)
    if x.dtype == torch.bool:
        raise NotImplementedError("\"geometric_cpu\" not implemented for 'Bool'")
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p:g}")
    return fill_random(x, "geometric", p, math.log1p(-p))


@register(aten.cauchy_.default)
def cauchy_(x, median=0.0, sigma=1.0, *, generator=None):
    check_generator(generator)
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"Cauchy distribution is a continuous probability distribution. dtype "
                           f"must be a floating point but you specified {T.CPP_NAMES[x.dtype]}")
    if not sigma > 0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma:g}")
    return fill_random(x, "cauchy", median, sigma)


@register(aten.log_normal_.default)
def log_normal_(x, mean=1.0, std=2.0, *, generator=None):
    check_generator(generator)
    _float_only(x, "log_normal_cpu")
    if not std > 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std:g}")
    return fill_random(x, "log_normal", mean, std)


def _fresh(x):
    return T.empty(x.shape, x.dtype)


# the functional forms: a fresh tensor of x's layout filled in place
register(aten.geometric.default)(lambda x, p, *, generator=None: geometric_(
    _fresh(x), p, generator=generator))
register(aten.cauchy.default)(lambda x, median=0.0, sigma=1.0, *, generator=None: cauchy_(
    _fresh(x), median, sigma, generator=generator))
register(aten.log_normal.default)(lambda x, mean=1.0, std=2.0, *, generator=None: log_normal_(
    _fresh(x), mean, std, generator=generator))


# -- rrelu: a random negative slope per element in training, the mean slope in eval ------------
def _make_rrelu(load, store):
    @njit(**_JIT)
    def rrelu(out, noise, x, key, counter, lower, upper):
        for i in range(x.shape[0]):
            v = load(x[i])
            if v <= 0:
                w0, _ = philox(counter + np.uint64(i), key)
                r = lower + (upper - lower) * uniform01(w0)
                out[i] = store(v * r)
                noise[i] = store(r)
            else:
                out[i] = x[i]
                noise[i] = store(_F32(1))

    return rrelu


_rrelus: dict = {}


def _rrelu(x, noise, lower, upper, training):
    _float_only(x, "rrelu_with_noise_out_cpu")
    if not training:  # deterministic: leaky_relu with the mean slope; noise untouched
        out = aten.leaky_relu.default(x, (lower + upper) / 2)  # (contiguous, as the CPU's)
        return (out if out.is_contiguous() else out.contiguous()), noise
    code = numerics.CODE[x.dtype]
    kernel = _rrelus.get(code)
    if kernel is None:
        kernel = _rrelus[code] = _make_rrelu(numerics.loader(code, "f32"), numerics.storer(code))
    src = x.contiguous()
    out, sampled = T.empty(x.shape, x.dtype), T.empty(x.shape, x.dtype)
    if x.numel():
        key, counter = default_generator.take(x.numel())
        kernel(out._nd.reshape(-1), sampled._nd.reshape(-1), src._nd.reshape(-1), key, counter,
               _F32(lower), _F32(upper))
        core.launch("gpsimd", x.numel(), 3 * out._nd.nbytes)
    return out, sampled


@register(aten.rrelu_with_noise.default)
def rrelu_with_noise(x, noise, lower=0.125, upper=1.0 / 3, training=False, generator=None):
    check_generator(generator)
    out, sampled = _rrelu(x, noise, lower, upper, training)
    if sampled is not noise:
        E.copy_into(noise, sampled)
    return out


@register(aten.rrelu_with_noise_functional.default)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1.0 / 3, training=False,
                                generator=None):
    check_generator(generator)
    out, sampled = _rrelu(x, noise, lower, upper, training)
    return out, (E.copy_into(T.empty(noise.shape, noise.dtype), noise) if sampled is noise
                 else sampled)


# -- *_like factories (they arrive with a tensor, so through the op table) -------------------
def _like(x, dtype, memory_format):
    from neuron_eager.ops.copy import uninitialized_like

    return uninitialized_like(x, dtype, memory_format)


@honours_device(aten.rand_like.default, aten.rand_like.generator)
def rand_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    return uniform_(_like(x, dtype, memory_format), generator=generator)


@honours_device(aten.randn_like.default, aten.randn_like.generator)
def randn_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    return normal_(_like(x, dtype, memory_format), generator=generator)


@honours_device(aten.randint_like.default, aten.randint_like.Tensor, aten.randint_like.low_dtype,
          aten.randint_like.generator, aten.randint_like.Tensor_generator,
          aten.randint_like.low_generator_dtype)
def randint_like(x, *bounds, generator=None, dtype=None, layout=None, device=None,
                 pin_memory=None, memory_format=None):
    low, high = (0, bounds[0]) if len(bounds) == 1 else bounds
    high = high.item() if isinstance(high, torch.Tensor) else high
    return random_from(_like(x, dtype, memory_format), low, high, generator=generator)


# -- normal with tensor mean / std ------------------------------------------------------------
_AFFINE = E.Elementwise("normal_affine", njit(lambda z, m, s: m + s * z))


def _normal(op, mean, std, generator):
    check_generator(generator)
    meta = meta_run(op, mean, std)  # (a Python ref, ~0.3 ms a run: cached)
    if isinstance(std, torch.Tensor):
        if T.cpu_alias(std).lt(0).any():  # the host reads the check, as the CPU does
            raise RuntimeError("normal expects all elements of std >= 0.0")
    elif std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")
    # (two tensors: the CPU draws into empty_like(mean) and scales it in place, so the
    # result has the mean's dtype, which must be a float type)
    dtype = mean.dtype if op is aten.normal.Tensor_Tensor else meta.dtype
    if not dtype.is_floating_point:
        raise NotImplementedError(f'"normal_kernel_cpu" not implemented for '
                                  f"'{T.dtype_name(dtype)}'")
    z = fill_random(T.empty(meta.shape, torch.float32), "normal", 0.0, 1.0)
    return E.run(_AFFINE, [z, mean, std], out=T.empty(meta.shape, dtype))


@register(aten.normal.Tensor_float)
def normal_tensor_float(mean, std=1.0, *, generator=None):
    return _normal(aten.normal.Tensor_float, mean, std, generator)


@register(aten.normal.float_Tensor)
def normal_float_tensor(mean, std, *, generator=None):
    return _normal(aten.normal.float_Tensor, mean, std, generator)


@register(aten.normal.Tensor_Tensor)
def normal_tensor_tensor(mean, std, *, generator=None):
    return _normal(aten.normal.Tensor_Tensor, mean, std, generator)


# -- bernoulli, dropout ---------------------------------------------------------------------
@register(aten.bernoulli_.float)
def bernoulli_float_(x, p=0.5, *, generator=None):
    check_generator(generator)
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p:g}")
    return fill_random(x, "bernoulli", p)


def _probabilities(p: torch.Tensor, shape) -> np.ndarray:
    """p broadcast to `shape`, as contiguous fp32 values, after the CPU's range check."""
    if not isinstance(p, NeuronTensor):
        p = T.from_cpu(p)
    values = E.copy_into(T.empty(shape, torch.float32), p)._nd.reshape(-1)
    if values.size and not (values.min() >= 0 and values.max() <= 1):
        raise RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could "
                           "this error message be improved?  If so, please report an "
                           "enhancement request to PyTorch.)")
    return values


@register(aten.bernoulli_.Tensor)
def bernoulli_tensor_(x, p, *, generator=None):
    check_generator(generator)
    return fill_random(x, "bernoulli", p=_probabilities(p, x.shape))


@register(aten.bernoulli.default)
def bernoulli(x, *, generator=None):
    check_generator(generator)
    return fill_random(T.empty(x.shape, x.dtype), "bernoulli", p=_probabilities(x, x.shape))


@register(aten.bernoulli.Tensor)
def bernoulli_tensor(x, p, *, generator=None):
    return bernoulli_tensor_(T.empty(x.shape, x.dtype), p, generator=generator)


@register(aten.bernoulli.p)
def bernoulli_p(x, p, *, generator=None):
    return bernoulli_float_(T.empty(x.shape, x.dtype), p, generator=generator)


def _make_dropout(load, store):
    @njit(**_JIT)
    def dropout(out, mask, x, key, counter, p, scale):
        for i in range(x.shape[0]):
            w0, _ = philox(counter + np.uint64(i), key)
            keep = uniform01(w0) >= p
            mask[i] = keep
            out[i] = store(load(x[i]) * scale if keep else _F32(0))

    return dropout


_dropouts: dict = {}


@register(aten.native_dropout.default)
def native_dropout(x, p, train):
    strides = like_strides(x, None)  # (results keep x's layout, as the CPU's: channels-last)
    if train is False:
        return E.copy_into(T.empty(x.shape, x.dtype, strides), x), \
            E.copy_into(T.empty(x.shape, torch.bool, strides), T.from_cpu(torch.tensor(True)))
    if not 0 <= p <= 1:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
    if 0 < p < 1 and not x.dtype.is_floating_point:  # (the CPU's x * float mask, in place)
        raise RuntimeError(f"result type Float can't be cast to the desired output type "
                           f"{T.dtype_name(x.dtype)}")
    code = numerics.CODE[x.dtype]
    kernel = _dropouts.get(code)
    if kernel is None:
        kernel = _dropouts[code] = _make_dropout(numerics.loader(code, "f32"),
                                                 numerics.storer(code))
    out, mask = T.empty(x.shape, x.dtype, strides), T.empty(x.shape, torch.bool, strides)
    src = x.contiguous() if strides is None else x if x.stride() == tuple(strides) else \
        x.clone(memory_format=torch.preserve_format)  # (x itself when dense in its order)
    flats = _in_memory_order(out, mask, src)
    if flats is None:  # (a layout whose memory order is not one flat run: contiguous)
        out, mask = T.empty(x.shape, x.dtype), T.empty(x.shape, torch.bool)
        flats = [t._nd.reshape(-1) for t in (out, mask, x.contiguous())]
    if x.numel():
        key, counter = default_generator.take(x.numel())
        scale = _F32(0) if p == 1 else _F32(1.0 / (1.0 - p))
        kernel(*flats, key, counter, _F32(p), scale)  # (draws in memory order)
        core.launch("gpsimd", x.numel(), 2 * out._nd.nbytes + mask._nd.nbytes)
    return out, mask


def _in_memory_order(*tensors) -> list | None:
    """Flat views of dense tensors of one layout, in their memory order (None if one is not a
    single run in that order)."""
    order = E.memory_order(tensors[0].stride())
    views = [t._nd.transpose(order) for t in tensors]
    if not all(v.flags.c_contiguous for v in views):
        return None
    return [v.reshape(-1) for v in views]


_DROPOUT_BACKWARD = E.Elementwise("dropout_backward", njit(lambda g, m, s: g * m * s))


@register(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    # the scale takes part in type promotion, as on the CPU (an integer grad gives float)
    return E.run(_DROPOUT_BACKWARD, [grad, mask, scale])


# -- integers: random_, randperm, multinomial -----------------------------------------------
@njit(inline="always")
def _word64(w0, w1):
    return (np.uint64(w1) << np.uint64(32)) | np.uint64(w0)


def _make_random(store):
    @njit(**_JIT)
    def random(out, key, counter, start, span):
        """start + (random % span); 32-bit draws when the span fits (as the CPU), 0 = 2**64."""
        for i in range(out.shape[0]):
            w0, w1 = philox(counter + np.uint64(i), key)
            if span == np.uint64(0):
                v = np.int64(_word64(w0, w1))
            elif span <= np.uint64(0xFFFFFFFF):
                v = start + np.int64(np.uint64(w0) % span)
            else:
                v = start + np.int64(_word64(w0, w1) % span)
            out[i] = store(v)

    return random


def _random_store(code: str):
    if code == "f64":
        return njit(inline="always")(lambda v: np.float64(v))
    if code in numerics.FLOAT_CODES:
        store = numerics.storer(code)
        return njit(inline="always")(lambda v: store(np.float32(v)))
    if code == "i64":
        return njit(inline="always")(lambda v: v)
    return numerics.storer(code)


_randoms: dict = {}


def _upper(dtype: torch.dtype) -> int:
    """The largest value random_ draws by default (inclusive), as the CPU."""
    if dtype == torch.bool:
        return 1
    if dtype.is_floating_point:
        return 1 << {torch.float32: 24, torch.float64: 53, torch.bfloat16: 8,
                     torch.float16: 11}[dtype]
    return torch.iinfo(dtype).max


def _fill_integers(x, start: int, span: int):
    overlap.check_no_internal_overlap(x)
    code = numerics.CODE[x.dtype]
    kernel = _randoms.get(code)
    if kernel is None:
        kernel = _randoms[code] = _make_random(_random_store(code))
    n = x.numel()
    if n:
        target = x if x.is_contiguous() else T.empty(x.shape, x.dtype)
        key, counter = default_generator.take(n)
        kernel(target._nd.reshape(-1), key, counter, np.int64(start),
               np.uint64(span & 0xFFFFFFFFFFFFFFFF))
        core.launch("gpsimd", n, target._nd.nbytes)
        if code == "i64" and not numerics.INT32_MIN <= start <= start + span - 1 <= \
                numerics.INT32_MAX:
            numerics.warn_int64_range(target._nd)  # (drawn past int32: ops will wrap them)
        if target is not x:
            E.copy_into(x, target)
    return x


@register(aten.random_.default)
def random_(x, *, generator=None):
    check_generator(generator)
    return _fill_integers(x, 0, _upper(x.dtype) + 1)


@register(getattr(aten.random_, "from"))  # `from` is a Python keyword
def random_from(x, from_, to=None, *, generator=None):
    check_generator(generator)
    _cpu_checks("random_", x, from_, to)
    to = _upper(x.dtype) + 1 if to is None else to
    if x.dtype.is_floating_point:
        from_, to = _representable_bounds(x.dtype, from_, to)
    return _fill_integers(x, from_, to - from_)


def _as_stored(dtype: torch.dtype, v: int) -> int:
    """v rounded to `dtype` as the CPU casts an int64 (through float for 16-bit types)."""
    return int(torch.tensor(v).to(dtype).item())


# Note [Random integers in a float type]
# A draw v in [from, to) is stored rounded to nearest, so near the top of a float type's
# exact range (bf16 above 256, fp32 above 2^24) `to - 1` could round up to `to` itself. The
# CPU (DistributionTemplates' update_from/update_to) first moves the bounds in by one step
# of the type's spacing where the rounded bound leaves the range: bf16 random_(250, 260)
# draws 250..257 and stores at most 256, never 260.
def _representable_bounds(dtype: torch.dtype, from_: int, to: int) -> tuple:
    digits = {torch.float32: 24, torch.float64: 53, torch.bfloat16: 8, torch.float16: 11}[dtype]
    below = _as_stored(dtype, from_ + 1)
    if below < from_:
        from_ = below + (1 << ((from_ + 1).bit_length() - digits))  # (one spacing)
    above = _as_stored(dtype, to - 1)
    if above >= to:
        to = above - (1 << ((to - 1).bit_length() - digits))
    return from_, to


@register(aten.random_.to)
def random_to(x, to, *, generator=None):
    return random_from(x, 0, to, generator=generator)


@njit(**_JIT)
def _randperm(out, key, counter):
    """Fisher-Yates on the GpSimd engine: swap i with a uniform j <= i, from the top down."""
    n = out.shape[0]
    for i in range(n):
        out[i] = i
    for i in range(n - 1, 0, -1):
        w0, w1 = philox(counter + np.uint64(i), key)
        j = np.int64(_word64(w0, w1) % np.uint64(i + 1))
        out[i], out[j] = out[j], out[i]


# the largest n per float type (every integer below it exact), as the CPU writes it
_RANDPERM_LIMITS = {torch.float16: (2049, "2049", "Half"),
                    torch.float32: (2 ** 24 + 1, "2^24+1", "Float"),
                    torch.float64: (2 ** 53 + 1, "2^53+1", "Double")}


def randperm_into(out: NeuronTensor, n: int) -> NeuronTensor:
    if n < 0:
        raise RuntimeError(f"n must be non-negative, got{n}")
    _check_randperm(n, out.dtype)
    perm = T.empty((n,), torch.int64)
    if n:
        key, counter = default_generator.take(n)
        _randperm(perm._nd, key, counter)
        core.launch("gpsimd", n, 2 * perm._nd.nbytes)
    if tuple(out.shape) != (n,):
        from neuron_eager.ops.views import resize_

        resize_(out, (n,))
    return E.copy_into(out, perm) if n else out


def _check_randperm(n: int, dtype: torch.dtype) -> None:
    """The CPU's: a float type must hold every integer below n exactly, an integer type n - 1;
    bf16 is not checked (the CPU does not)."""
    if dtype == torch.bool:
        raise NotImplementedError("\"randperm\" not implemented for 'Bool'")
    limit = _RANDPERM_LIMITS.get(dtype)
    if limit is not None and n > limit[0]:
        raise RuntimeError(f"n cannot be greater than {limit[1]} for {limit[2]} type.")
    if not dtype.is_floating_point and n:
        numerics.check_fits(n - 1, dtype)


@register(aten.randperm.generator_out)
def randperm_generator_out(n, *, generator=None, out):
    check_generator(generator)
    return randperm_into(out, n)


@register(aten.randperm.out)
def randperm_out(n, *, out):
    return randperm_into(out, n)


def _drawn_into(out: NeuronTensor, size, draw) -> NeuronTensor:
    """A random factory's out= form: `draw` (a sampler filling its argument) into `out`
    resized to `size`, the sampler's checks made first on an empty tensor, so that a refused
    call leaves `out` as it was."""
    from neuron_eager.ops.views import resize_output

    draw(T.empty((0,), out.dtype))
    resize_output(out, tuple(size))
    return draw(out)


@register(aten.rand.out)
def rand_out(size, *, out):
    return _drawn_into(out, size, uniform_)


@register(aten.randint.out, aten.randint.generator_out)
def randint_out(high, size, *, generator=None, out):
    check_generator(generator)
    return _drawn_into(out, size, lambda x: random_from(x, 0, high))


@register(aten.randint.low_out, aten.randint.low_generator_out)
def randint_low_out(low, high, size, *, generator=None, out):
    check_generator(generator)
    return _drawn_into(out, size, lambda x: random_from(x, low, high))


@register(aten.normal.float_float_out)
def normal_float_float_out(mean, std, size, *, generator=None, out):
    check_generator(generator)
    return _drawn_into(out, size, lambda x: normal_(x, mean, std))


def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    check_generator(generator)
    return randperm_into(T.empty(T.requested_shape((n,)), dtype or torch.int64), n)


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("randperm", on_device_zero(randperm), "PrivateUse1")  # (factories' checks)
_lib.impl("randperm.generator", on_device_zero(randperm), "PrivateUse1")


@njit(**_JIT)
def _multinomial_replace(out, probs, key, counter):
    """Inverse-CDF sampling per row: a binary search of u * total in the running sums."""
    rows, k = probs.shape
    n = out.shape[1]
    cdf = np.empty(k, probs.dtype)  # (float64 probabilities stay float64: 1e-50 is one)
    for r in range(rows):
        cdf[0] = probs[r, 0]
        for c in range(1, k):
            cdf[c] = cdf[c - 1] + probs[r, c]
        total = cdf[k - 1]
        for s in range(n):
            w0, _ = philox(counter + np.uint64(r * n + s), key)
            u = uniform01(w0) * total
            lo, hi = 0, k - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if cdf[mid] > u:
                    hi = mid
                else:
                    lo = mid + 1
            while probs[r, lo] == 0 and lo > 0:  # u rounded up to the total
                lo -= 1
            out[r, s] = lo


@njit(**_JIT)
def _multinomial_once(out, probs, key, counter):
    """Without replacement: the n smallest E/p with E ~ Exp(1) (an exponential race),
    compared as log(E) - log(p): E/p overflows to inf for a tiny p, the key of a p of 0."""
    rows, k = probs.shape
    n = out.shape[1]
    keys = np.empty(k, probs.dtype)
    for r in range(rows):
        for c in range(k):
            w0, _ = philox(counter + np.uint64(r * k + c), key)
            e = -np.log(uniform01_inside(w0))  # (> 0: a 0 would beat any probability)
            keys[c] = np.log(e) - np.log(probs[r, c]) if probs[r, c] > 0 else np.inf
        order = np.argsort(keys, kind="mergesort")
        for s in range(n):
            out[r, s] = order[s]


@register(aten.multinomial.default)
def multinomial(probs, num_samples, replacement=False, *, generator=None):
    check_generator(generator)
    if probs.dim() not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not probs.dtype.is_floating_point:  # (the CPU names bool Long: it converts it first)
        named = torch.int64 if probs.dtype == torch.bool else probs.dtype
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{T.dtype_name(named)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    k = probs.shape[-1]
    if not replacement and num_samples > k:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    rows = probs.shape[0] if probs.dim() == 2 else 1
    p = E.copy_into(T.empty((rows, k), torch.float64 if probs.dtype == torch.float64 else
                            torch.float32), probs.reshape(rows, k))
    host = T.cpu_alias(p)  # validation reads, as the CPU kernel checks before sampling
    if not torch.isfinite(host).all() or (host < 0).any():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if (host.sum(1) <= 0).any():
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    out = T.empty((rows, num_samples), torch.int64)
    key, counter = default_generator.take(rows * (num_samples if replacement else k))
    (_multinomial_replace if replacement else _multinomial_once)(out._nd, p._nd, key, counter)
    core.launch("gpsimd", rows * max(k, num_samples), p._nd.nbytes + out._nd.nbytes)
    return out if probs.dim() == 2 else out.reshape(num_samples)
