"""Random sampling (ops/sampling.py): reproducibility, statistics, errors, no fallback."""
import math

import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from checks import NEURON

N = 200_000


def _host(t):
    return t.cpu().double()


def _samplers():
    return {
        "rand": lambda: torch.rand(64, device=NEURON),
        "randn_bf16": lambda: torch.randn(64, device=NEURON, dtype=torch.bfloat16),
        "randint": lambda: torch.randint(-5, 5, (64,), device=NEURON),
        "randperm": lambda: torch.randperm(64, device=NEURON),
        "normal": lambda: torch.normal(torch.zeros(64, device=NEURON), 2.0),
        "bernoulli": lambda: torch.bernoulli(torch.full((64,), 0.3, device=NEURON)),
        "exponential": lambda: torch.empty(64, device=NEURON).exponential_(),
        "dropout": lambda: F.dropout(torch.ones(64, device=NEURON), 0.5),
        "multinomial": lambda: torch.multinomial(torch.ones(64, device=NEURON), 8),
        "multinomial_r": lambda: torch.multinomial(torch.ones(3, 8, device=NEURON), 5, True),
        "randn_like": lambda: torch.randn_like(torch.empty(8, device=NEURON)),
        "geometric": lambda: torch.empty(64, device=NEURON).geometric_(0.3),
        "cauchy": lambda: torch.empty(64, device=NEURON).cauchy_(),
        "log_normal": lambda: torch.empty(64, device=NEURON, dtype=torch.bfloat16).log_normal_(),
        "rrelu": lambda: F.rrelu(torch.linspace(-1, 1, 64, device=NEURON), training=True),
        "gamma": lambda: torch._standard_gamma(torch.linspace(0.1, 5, 64, device=NEURON)),
        "dirichlet": lambda: torch.distributions.Dirichlet(
            torch.linspace(0.1, 5, 64, device=NEURON).view(8, 8)).sample(),
        "poisson": lambda: torch.poisson(torch.linspace(0, 40, 64, device=NEURON)),
    }


@pytest.mark.parametrize("name", list(_samplers()))
def test_reproducible_and_native(name):
    fn = _samplers()[name]
    cpu_state = torch.get_rng_state()
    torch.neuron.manual_seed(123)
    first = fn().cpu()
    torch.neuron.manual_seed(123)
    neuron_eager.clear_op_tracking()
    again = fn().cpu()
    assert neuron_eager.get_fallback_ops() == {}
    assert torch.equal(first, again)
    torch.neuron.manual_seed(124)
    assert not torch.equal(first, fn().cpu())
    assert torch.equal(torch.get_rng_state(), cpu_state)  # the CPU generator is untouched


def test_rng_state_roundtrip():
    torch.neuron.manual_seed(7)
    state = torch.neuron.get_rng_state()
    a = torch.randn(10, device=NEURON).cpu()
    torch.neuron.set_rng_state(state)
    assert torch.equal(a, torch.randn(10, device=NEURON).cpu())
    assert not torch.equal(a, torch.randn(10, device=NEURON).cpu())  # the offset advanced


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_uniform_and_normal_statistics(dtype, seed):
    u = _host(torch.rand(N, device=NEURON, dtype=dtype))
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.std() - 1 / math.sqrt(12)) < 0.01
    v = _host(torch.empty(N, device=NEURON, dtype=dtype).uniform_(-3, 5))
    assert -3 <= v.min() and v.max() < 5 and abs(v.mean() - 1) < 0.05
    z = _host(torch.randn(N, device=NEURON, dtype=dtype))
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02
    assert abs((z.abs() < 1).double().mean() - 0.6827) < 0.01  # the shape, not just moments
    w = _host(torch.empty(N, device=NEURON, dtype=dtype).normal_(2, 0.5))
    assert abs(w.mean() - 2) < 0.01 and abs(w.std() - 0.5) < 0.01
    e = _host(torch.empty(N, device=NEURON, dtype=dtype).exponential_(4))
    assert e.min() >= 0 and abs(e.mean() - 0.25) < 0.01


def test_strided_inplace_and_storer(seed):
    x = torch.zeros(300, 400, device=NEURON)
    x.t()[:, ::2].uniform_(1, 2)
    host = x.cpu()
    assert (host[::2] >= 1).all() and (host[1::2] == 0).all()
    b = torch.rand(1000, device=NEURON, dtype=torch.bfloat16).cpu()
    assert torch.equal(b, b.float().bfloat16())  # representable bf16 values


def test_normal_functional_forms(seed):
    mean = torch.linspace(-2, 2, N, device=NEURON)
    std = torch.full((N,), 0.5, device=NEURON)
    for out, m, s in [(torch.normal(mean, 0.5), mean, 0.5),
                      (torch.normal(1.0, std), 1.0, 0.5),
                      (torch.normal(mean, std), mean, 0.5),
                      (torch.normal(3.0, 2.0, (N,), device=NEURON), 3.0, 2.0)]:
        assert out.device.type == "neuron" and out.shape == (N,)
        resid = _host(out - m)
        assert abs(resid.mean()) < 0.02 and abs(resid.std() - s) < 0.02
    assert torch.normal(mean[:3].bfloat16(), 1.0).dtype == torch.bfloat16
    assert torch.normal(torch.zeros(3, device=NEURON), torch.ones(2, 3, device=NEURON)).shape \
        == (2, 3)


def test_bernoulli(seed):
    for p in (0.0, 0.2, 1.0):
        b = _host(torch.empty(N, device=NEURON).bernoulli_(p))
        assert abs(b.mean() - p) < 0.01 and set(b.unique().tolist()) <= {0.0, 1.0}
    probs = torch.rand(N)
    b = _host(torch.bernoulli(probs.to(NEURON)))
    assert abs(b.mean() - probs.double().mean()) < 0.01
    assert abs(b[probs.double() < 0.1].mean() - 0.05) < 0.01
    t = torch.empty(N, device=NEURON, dtype=torch.bool).bernoulli_(torch.tensor(0.7))
    assert abs(_host(t).mean() - 0.7) < 0.01
    assert abs(_host(torch.ops.aten.bernoulli.p(torch.empty(N, device=NEURON), 0.4)).mean()
               - 0.4) < 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout(dtype, seed):
    x = torch.randn(400, 500, dtype=dtype).to(NEURON).requires_grad_()
    p = 0.3
    out = F.dropout(x, p)
    kept = out.detach().cpu() != 0
    assert abs(kept.double().mean() - (1 - p)) < 0.01
    expected = (x.detach().cpu().float() / (1 - p)).to(dtype)
    torch.testing.assert_close(out.detach().cpu()[kept], expected[kept])
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(x.grad.cpu(), (kept.float() / (1 - p)).to(dtype))
    assert torch.equal(F.dropout(x, p, training=False).detach().cpu(), x.detach().cpu())
    assert (F.dropout(x, 1.0).detach().cpu() == 0).all()
    y, mask = torch.ops.aten.native_dropout(x.detach(), 0.5, False)
    assert torch.equal(y.cpu(), x.detach().cpu()) and mask.cpu().all()


def test_integers(seed):
    r = _host(torch.randint(3, 10, (N,), device=NEURON))
    assert r.min() == 3 and r.max() == 9 and abs(r.mean() - 6) < 0.05
    for dtype, hi in [(torch.uint8, 255), (torch.int8, 127), (torch.bfloat16, 256),
                      (torch.float32, 2 ** 24), (torch.bool, 1)]:
        v = _host(torch.empty(N, device=NEURON, dtype=dtype).random_())
        assert v.min() >= 0 and v.max() <= hi and v.max() > hi * 0.99
    big = torch.empty(N, device=NEURON, dtype=torch.int64).random_(-2 ** 40, 2 ** 40).cpu()
    assert big.min() < -2 ** 39 and big.max() > 2 ** 39
    assert _host(torch.empty(N, device=NEURON).random_(5)).max() == 4
    assert torch.randint_like(torch.empty(9, device=NEURON), 2, 4).cpu().unique().tolist() \
        == [2.0, 3.0]
    perm = torch.randperm(1000, device=NEURON)
    assert perm.dtype == torch.int64 and torch.equal(perm.cpu().sort().values, torch.arange(1000))
    assert torch.randperm(5, device=NEURON, dtype=torch.float32).dtype == torch.float32
    out = torch.empty(0, dtype=torch.int64, device=NEURON)
    torch.randperm(7, out=out)
    assert torch.equal(out.cpu().sort().values, torch.arange(7))


def test_multinomial(seed):
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    draws = torch.multinomial(probs.to(NEURON), N, replacement=True).cpu()
    freq = torch.bincount(draws, minlength=4).double() / N
    torch.testing.assert_close(freq, probs.double(), atol=0.01, rtol=0)
    rows = torch.multinomial(torch.rand(50, 20).to(NEURON) + 0.01, 20).cpu()
    assert all(torch.equal(r.sort().values, torch.arange(20)) for r in rows)
    first = torch.multinomial(torch.tensor([[1.0, 1, 8]] * 20000).to(NEURON), 1).cpu()
    assert abs((first == 2).double().mean() - 0.8) < 0.01  # without replacement: ~ p


def test_multinomial_of_tiny_probabilities(seed):
    # E / p overflowed to inf for a denormal p, the key of a p of 0: a zero-probability
    # category was drawn, and equal tiny ones were ranked by index
    rows = 20000
    banned = torch.multinomial(torch.tensor([[0.0, 1e-40, 1.0]] * rows).to(NEURON), 2).cpu()
    assert not (banned == 0).any()
    second = torch.multinomial(torch.tensor([[1e-40, 1e-40, 1.0]] * rows).to(NEURON), 2).cpu()
    assert abs((second[:, 1] == 0).double().mean() - 0.5) < 0.03
    tiny64 = torch.tensor([[0.0, 1e-300, 1.0]] * 100, dtype=torch.float64)
    assert not (torch.multinomial(tiny64.to(NEURON), 2).cpu() == 0).any()
    # float64 probabilities below float32's range sample (they underflowed to a zero sum)
    draws = torch.multinomial(torch.tensor([1e-50, 3e-50], dtype=torch.float64).to(NEURON),
                              N, True).cpu()
    assert abs((draws == 1).double().mean() - 0.75) < 0.02


@pytest.mark.parametrize("fn", [
    lambda d: torch.empty(3, device=d).uniform_(1, 0),
    lambda d: torch.empty(3, device=d).normal_(0, -1),
    lambda d: torch.normal(torch.zeros(3, device=d), -torch.ones(3, device=d)),
    lambda d: torch.empty(3, device=d).bernoulli_(1.5),
    lambda d: torch.empty(3, device=d).exponential_(-1),
    lambda d: torch.empty(3, device=d).random_(5, 2),
    lambda d: torch.multinomial(torch.tensor([1.0, 0, 0], device=d), 4),
    lambda d: torch.multinomial(torch.tensor([-1.0, 0, 0], device=d), 2),
    lambda d: torch.multinomial(torch.zeros(3, device=d), 2, True),
    lambda d: torch.empty(3, device=d, dtype=torch.int64).uniform_(),
    lambda d: torch.empty(3, device=d).geometric_(1),
    lambda d: torch.empty(3, device=d, dtype=torch.bool).geometric_(0.5),
    lambda d: torch.empty(3, device=d).cauchy_(0, 0),
    lambda d: torch.empty(3, device=d, dtype=torch.int32).cauchy_(),
    lambda d: torch.empty(3, device=d).log_normal_(0, 0),
    lambda d: torch.empty(3, device=d, dtype=torch.int32).log_normal_(),
    # bounds the dtype cannot hold (a sweep found wrapped or inf values drawn instead)
    lambda d: torch.randint(0, 300, (6,), dtype=torch.uint8, device=d),
    lambda d: torch.randint(-1, 3, (6,), dtype=torch.uint8, device=d),
    lambda d: torch.randint(0, 2 ** 17, (4,), dtype=torch.int16, device=d),
    lambda d: torch.randint(0, 3, (6,), dtype=torch.bool, device=d),
    lambda d: torch.randint(0, 2 ** 30, (3,), dtype=torch.float16, device=d),
    lambda d: torch.empty(3, dtype=torch.int8, device=d).random_(200),
    lambda d: torch.empty(3, dtype=torch.int32, device=d).random_(0, 2 ** 40),
    lambda d: torch.empty(3, device=d).uniform_(0, float("inf")),
    lambda d: torch.empty(3, device=d).uniform_(-3e38, 3e38),
    lambda d: torch.empty(3, dtype=torch.float16, device=d).uniform_(0, 1e5),
    lambda d: torch.randperm(300, dtype=torch.uint8, device=d),
    lambda d: torch.randperm(129, dtype=torch.int8, device=d),
    lambda d: torch.randperm(3000, dtype=torch.float16, device=d),
    lambda d: torch.randperm(3, dtype=torch.bool, device=d),
])
def test_errors_match_cpu(fn):
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(type(cpu.value)) as ours:
        fn(NEURON)
    assert str(ours.value).split("\n")[0] == str(cpu.value).split("\n")[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_geometric_cauchy_log_normal_statistics(dtype, seed):
    g = _host(torch.empty(N, device=NEURON, dtype=dtype).geometric_(0.25))
    assert g.min() >= 1 and torch.equal(g, g.round()) and abs(g.mean() - 4) < 0.05
    gi = _host(torch.empty(N, device=NEURON, dtype=torch.int32).geometric_(0.5))
    assert gi.min() >= 1 and abs(gi.mean() - 2) < 0.03
    c = _host(torch.empty(N, device=NEURON, dtype=dtype).cauchy_(1.0, 2.0))
    assert abs(c.median() - 1) < 0.05  # quartiles at median -+ sigma
    assert abs(c.quantile(0.75) - 3) < 0.1 and abs(c.quantile(0.25) + 1) < 0.1
    ln = _host(torch.empty(N, device=NEURON, dtype=dtype).log_normal_(0.5, 0.25)).log()
    assert abs(ln.mean() - 0.5) < 0.01 and abs(ln.std() - 0.25) < 0.01
    f = _host(torch.ops.aten.geometric(torch.empty(10, device=NEURON), 0.5))
    assert f.min() >= 1


def test_rrelu_training_and_eval(seed):
    x = torch.randn(1000)
    noise = torch.empty(1000, device=NEURON)
    out = torch.ops.aten.rrelu_with_noise(x.to(NEURON), noise, 0.1, 0.3, True).cpu()
    r = noise.cpu()
    neg = x <= 0
    assert torch.equal(r[~neg], torch.ones(int((~neg).sum())))
    assert r[neg].min() >= 0.1 and r[neg].max() <= 0.3
    torch.testing.assert_close(out, x * r)
    y = x.to(NEURON).requires_grad_()
    F.rrelu(y, 0.1, 0.3, training=True).sum().backward()
    assert torch.all((y.grad.cpu() == 1) | ((y.grad.cpu() >= 0.1) & (y.grad.cpu() <= 0.3)))
    from checks import check_op
    check_op(lambda t: F.rrelu(t, 0.1, 0.3, training=False), x.requires_grad_(), grad=True)


@pytest.mark.parametrize("shape", [0.05, 0.5, 1.0, 3.0, 50.0])
def test_gamma_has_its_distributions_moments(shape):
    # Note [Gamma by rejection] in ops/gamma.py: mean and variance are both the shape
    torch.neuron.manual_seed(0)
    x = _host(torch._standard_gamma(torch.full((N,), shape, device=NEURON)))
    se = math.sqrt(shape / N)  # of the mean
    assert abs(x.mean().item() - shape) < 5 * se
    assert abs(x.var().item() / shape - 1) < 0.05 + 5 * math.sqrt(2 / N)
    assert (x > 0).all()


def test_gamma_special_shapes_and_dtypes_are_the_cpus():
    alpha = torch.tensor([0.0, -1.0, float("nan"), float("inf"), 1e-30])
    got = torch._standard_gamma(alpha.to(NEURON)).cpu()
    assert torch.equal(got, torch._standard_gamma(alpha))  # the smallest normal, and inf
    for dtype in (torch.bfloat16, torch.float16):
        with pytest.raises(NotImplementedError, match="gamma_cpu"):
            torch._standard_gamma(torch.ones(2, dtype=dtype, device=NEURON))


def test_dirichlet_and_beta_sample_on_the_device():
    torch.neuron.manual_seed(1)
    neuron_eager.clear_op_tracking()
    a = torch.tensor([0.5, 2.0, 5.0])
    x = _host(torch.distributions.Dirichlet(a.to(NEURON)).sample((N,)))
    assert torch.allclose(x.sum(-1), torch.ones(N, dtype=torch.float64), atol=1e-6)
    assert (x > 0).all() and (x < 1).all()
    assert torch.allclose(x.mean(0), (a / a.sum()).double(), atol=3e-3)
    b = _host(torch.distributions.Beta(torch.tensor([2.0], device=NEURON),
                                       torch.tensor([3.0], device=NEURON)).sample((N,)))
    assert abs(b.mean().item() - 0.4) < 3e-3 and abs(b.var().item() - 0.04) < 2e-3
    assert neuron_eager.get_fallback_ops() == {}


@pytest.mark.parametrize("rate", [0.3, 3.0, 9.5, 10.0, 37.0, 1e4])
def test_poisson_follows_its_probability_mass(rate):
    # Note [Poisson by rejection] in ops/poisson.py: both methods, against the exact pmf
    torch.neuron.manual_seed(2)
    neuron_eager.clear_op_tracking()
    k = torch.poisson(torch.full((N,), rate, device=NEURON)).cpu().long()
    assert neuron_eager.get_fallback_ops() == {}
    counts = torch.bincount(k).double()
    ks = torch.arange(len(counts), dtype=torch.float64)
    expected = N * torch.exp(-rate + ks * math.log(rate) - torch.lgamma(ks + 1))
    used = expected > 20
    chi2 = (((counts - expected) ** 2) / expected)[used].sum().item()
    dof = int(used.sum()) - 1
    assert chi2 < dof + 5 * math.sqrt(2 * dof)  # far out in the tail of chi2(dof)


def test_poisson_special_rates_dtypes_and_errors_are_the_cpus():
    rates = torch.tensor([0.0, float("inf"), 1e8])
    got = torch.poisson(rates.to(NEURON)).cpu()
    assert got[0] == 0 and got[1] == torch.poisson(rates[1:2])[0]  # inf: the CPU's -2^63
    assert abs(got[2].item() - 1e8) < 7 * 1e4
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        x = torch.poisson(torch.full((1000,), 4.0, dtype=dtype, device=NEURON))
        assert x.dtype == dtype and abs(x.double().mean().item() - 4) < 0.5
    for bad in (-1.0, float("nan")):
        rate = torch.tensor([1.0, bad])
        with pytest.raises(RuntimeError, match="invalid Poisson rate") as cpu_error:
            torch.poisson(rate)
        state = torch.neuron.get_rng_state()
        with pytest.raises(RuntimeError) as ours:
            torch.poisson(rate.to(NEURON))
        assert str(ours.value) == str(cpu_error.value)
        assert torch.equal(torch.neuron.get_rng_state(), state)  # nothing drawn
    with pytest.raises(NotImplementedError, match="poisson_cpu"):
        torch.poisson(torch.ones(2, dtype=torch.long, device=NEURON))


def _gamma_grad_grid():
    """Shapes and samples across the three pieces of Note [Pathwise gradients]."""
    g = torch.Generator().manual_seed(3)
    alpha = torch.logspace(-2, 2.5, 40).repeat_interleave(50)
    x = torch._standard_gamma(alpha, generator=g).clamp_min(1e-30)
    return alpha, x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gamma_sample_gradient_is_the_cpus(dtype):
    alpha, x = (t.to(dtype) for t in _gamma_grad_grid())
    assert (x < 0.8).any() and ((alpha > 8) & ((x - alpha).abs() < 0.1 * alpha)).any()
    got = torch._standard_gamma_grad(alpha.to(NEURON), x.to(NEURON)).cpu()
    # both evaluate in double; float64 inputs pass through fp32 on the engines
    want = torch._standard_gamma_grad(alpha.float(), x.float()).to(dtype)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    with pytest.raises(NotImplementedError, match="_standard_gamma_grad_cpu"):
        torch._standard_gamma_grad(alpha.bfloat16().to(NEURON), x.bfloat16().to(NEURON))


def test_dirichlet_sample_gradient_is_the_cpus():
    g = torch.Generator().manual_seed(4)
    a = torch.logspace(-1.5, 2, 30).repeat_interleave(30)
    b = torch.logspace(-1.5, 2, 30).repeat(30)
    x = torch._sample_dirichlet(torch.stack([a, b], -1), generator=g)[:, 0].clamp(1e-6, 1 - 1e-6)
    got = torch._dirichlet_grad(x.to(NEURON), a.to(NEURON), (a + b).to(NEURON)).cpu()
    # the CPU's float32 kernel runs its series near 0 and 1 in float (off by up to 1e-3
    # there); its float64 kernel is the reference for ours, which runs in double
    want = torch._dirichlet_grad(x.double(), a.double(), (a + b).double()).float()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    torch.testing.assert_close(got, torch._dirichlet_grad(x, a, a + b), rtol=2e-3, atol=0)


def test_rsample_backward_runs_on_the_device():
    neuron_eager.clear_op_tracking()
    torch.neuron.manual_seed(5)
    conc = torch.tensor([0.5, 2.0, 9.0], device=NEURON, requires_grad=True)
    dists = [torch.distributions.Gamma(conc, 2.0), torch.distributions.Beta(conc, conc + 1),
             torch.distributions.Dirichlet(torch.stack([conc, conc + 1], -1)),
             torch.distributions.StudentT(conc + 1)]
    for d in dists:
        conc.grad = None
        d.rsample((4,)).pow(2).sum().backward()
        assert torch.isfinite(conc.grad.cpu()).all()
    assert neuron_eager.get_fallback_ops() == {}
    # Gamma's gradient through the sampled values: what the CPU computes for those values
    conc.grad = None
    x = torch._standard_gamma(conc.expand(4, 3))
    x.sum().backward()
    want = torch._standard_gamma_grad(conc.detach().cpu().expand(4, 3), x.detach().cpu()).sum(0)
    torch.testing.assert_close(conc.grad.cpu(), want)


def test_exponential_and_race_draws_are_never_zero():
    # a 0 from -log(1 - u) at u = 0 (one draw in 2**24) won multinomial's exponential race for
    # a category of probability 1e-26 (~0.5% of sampled tokens over 50,000 of them) and made
    # gumbel_softmax's noise infinite
    import numpy as np

    from neuron_eager.ops.random import uniform01_inside
    from neuron_eager.ops.sampling import _TRANSFORMS

    for word in (0, 255, 256, 511, 2 ** 31, 2 ** 32 - 512, 2 ** 32 - 1):
        u = uniform01_inside(np.uint32(word))
        assert 0 < u < 1
        assert _TRANSFORMS["exponential"](np.uint32(word), np.uint32(0), np.float32(1),
                                          np.float32(0)) > 0
        assert _TRANSFORMS["geometric"](np.uint32(word), np.uint32(0), np.float32(0.5),
                                        np.float32(math.log1p(-0.5))) >= 1
    probs = torch.full((3, 50_000), 1e-26)
    probs[:, 7] = 1.0
    torch.neuron.manual_seed(0)
    assert (torch.multinomial(probs.to(NEURON), 1).cpu() == 7).all()


@pytest.mark.parametrize("mean_dtype,std_dtype", [(torch.bfloat16, torch.float32),
                                                  (torch.float32, torch.float64),
                                                  (torch.int64, torch.float32)])
def test_normal_of_two_tensors_takes_the_means_dtype(mean_dtype, std_dtype):
    mean, std = torch.zeros(4, dtype=mean_dtype), torch.ones(4, dtype=std_dtype)
    try:
        want = torch.normal(mean, std).dtype
    except NotImplementedError as e:
        with pytest.raises(NotImplementedError, match=str(e).replace('"', '.')):
            torch.normal(mean.to(NEURON), std.to(NEURON))
        return
    assert torch.normal(mean.to(NEURON), std.to(NEURON)).dtype == want


@pytest.mark.parametrize("dtype, low, high", [
    (torch.bfloat16, 250, 260), (torch.bfloat16, 0, 1000), (torch.bfloat16, -300, 300),
    (torch.float16, 2040, 2060), (torch.float32, 2 ** 24, 2 ** 24 + 4),
    (torch.float64, 2 ** 53, 2 ** 53 + 8)])
def test_random_integers_in_a_float_type_stay_below_to(dtype, low, high, seed):
    # (Note [Random integers in a float type]: `to - 1` rounded to `to` was drawn)
    with pytest.warns(UserWarning, match="out of bounds"):
        want = torch.empty(20000, dtype=dtype).random_(low, high).unique()
    with pytest.warns(UserWarning, match="out of bounds"):
        got = torch.empty(20000, dtype=dtype, device=NEURON).random_(low, high).cpu().unique()
    assert torch.equal(got, want)


FACTORIES_WITH_OUT = {
    "rand": lambda o: torch.rand(3, out=o), "randint": lambda o: torch.randint(9, (3,), out=o),
    "randint low": lambda o: torch.randint(2, 9, (1, 3), out=o),
    "normal": lambda o: torch.normal(0.0, 1.0, (3, 1), out=o)}


@pytest.mark.parametrize("name", FACTORIES_WITH_OUT)
def test_random_factories_with_out_draw_on_the_device(name):
    # (they fell back to the CPU: drawn from its generator, and an out= of another shape
    # was half written and not resized)
    fn = FACTORIES_WITH_OUT[name]
    want = fn(torch.empty(5))
    neuron_eager.clear_op_tracking()
    cpu_state = torch.get_rng_state()
    draws = []
    for _ in range(2):
        torch.neuron.manual_seed(7)
        out = torch.full((5,), -1.0, device=NEURON)
        with pytest.warns(UserWarning, match="resized"):
            assert fn(out) is out
        draws.append(out.cpu())
    assert draws[0].shape == want.shape and torch.equal(draws[0], draws[1])
    assert (draws[0] != -1).all()
    assert neuron_eager.get_fallback_ops() == {}
    assert torch.equal(torch.get_rng_state(), cpu_state)
    bad = torch.full((5,), 7, dtype=torch.int64, device=NEURON)
    if name in ("rand", "normal"):  # a refused call leaves out as it was
        with pytest.raises(NotImplementedError):
            fn(bad)
        assert bad.shape == (5,) and (bad.cpu() == 7).all()
