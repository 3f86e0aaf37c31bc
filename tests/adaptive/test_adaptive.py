"""Adaptive eager against plain eager: bit-identical results, sync points, fusion, errors.

Every check runs the same program in plain eager and then several times in adaptive eager
(first sighting op by op, then compiled, then from the cache) and compares the bits.
"""
import inspect
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from neuron_eager import adaptive
from neuron_eager.adaptive import codegen, fusion, launch, recording
from neuron_eager.device_sim import core
from neuron_eager.ops import router
from neuron_eager.ops import tensor as T

N = torch.device("neuron")

pytestmark = pytest.mark.usefixtures("plain_after")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The stored bits of a (CPU copy of a) tensor, so NaNs and -0.0 compare exactly."""
    t = t.detach().cpu()
    if t.dtype.is_floating_point:
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def same_bits(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.stride() == expected.stride()
    assert torch.equal(bits(actual), bits(expected)), (actual, expected)


def both_modes(fn, *args, times=3):
    """fn(*args) in plain eager, then `times` times in adaptive eager: same bits each time."""
    adaptive.disable()
    expected = fn(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    expected = [e.cpu() for e in expected]
    adaptive.enable()
    for _ in range(times):
        got = fn(*args)
        got = got if isinstance(got, tuple) else (got,)
        for g, e in zip(got, expected):
            assert g.device == N or g.device.type == "neuron"
            same_bits(g.cpu(), e)
    adaptive.disable()
    return expected


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype).to(N)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype).to(N)


# -- bit-identical chains ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_float_chain(dtype):
    x, b = rand(64, 33, dtype=dtype), rand(33, dtype=dtype, seed=1)
    both_modes(lambda: F.gelu(x * 1.7 + b).sigmoid() - torch.tanh(x) / 3)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8])
def test_int_chain_and_comparisons(dtype):
    x, y = rand(50, dtype=dtype), rand(50, dtype=dtype, seed=1)
    both_modes(lambda: ((x * 3 + y - 2).abs() & 7, (x < y) | (y > 5), (x + y) / 4))


def test_mixed_dtypes_promote_as_eager():
    x, y = rand(40, dtype=torch.bfloat16), rand(40, dtype=torch.float16, seed=1)
    i = rand(40, dtype=torch.int32, seed=2)
    both_modes(lambda: (x * y + i, (x + 1.5) * 2, i * 2.5, (i > 0) * x))


def test_broadcasts_views_and_zero_dim_operands():
    x = rand(6, 1, 5)
    y = rand(4, 1, seed=1)
    wide = rand(5, 8, seed=2)
    t = wide.t()[::2]  # a strided, transposed view: (4, 5)
    s = rand(seed=3)  # a neuron 0-dim tensor
    c = torch.tensor(0.25)  # a CPU 0-dim tensor
    both_modes(lambda: (x + y) * s - t * c)
    both_modes(lambda: F.relu(t * 2 + s).exp())


def test_zero_dim_conditions_and_masks_stay_bool():
    # a 0-dim bool mask was cast to the result's float type like a 0-dim operand of add
    x = rand(3, 4, dtype=torch.bfloat16)
    one = torch.tensor(1.0001).to(N)  # (fp32: a 0-dim operand beside bf16 ones)

    def program(x, one):
        positive = x.float().sum() > 0
        return (x.masked_fill(positive, 0.5) * 2, torch.where(positive, x * 2, one),
                torch.where(x.sum() < 0, one, x + 1), x.masked_fill(torch.tensor(True).to(N), 3))

    both_modes(program, x, one, times=4)
    w = torch.tensor([[1.0, -2.0], [0.5, 3.0]], device=N)

    def norm_double_backward(w):  # (MaskedFillBackward0 masks with `norm == 0`)
        w = w.clone().requires_grad_()
        g, = torch.autograd.grad(w.norm(), w, create_graph=True)
        return torch.autograd.grad(g.sum(), w)[0]

    both_modes(norm_double_backward, w, times=4)


def test_small_shape_inside_bigger_group():
    x, y = rand(4, 1), rand(1, 5, seed=1)
    a = x * 2  # shape (4, 1), read by a (4, 5) op of the same region
    both_modes(lambda: (torch.add(x * 2, 1) + y, x * 2))
    del a


def test_a_broadcast_mask_joins_the_scores_loop():
    scores, mask = rand(2, 4, 8, 8), torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8).to(N)

    def masked():
        return (scores * 0.5).masked_fill(mask == 0, float("-inf"))

    both_modes(masked)
    adaptive.enable()
    masked().cpu()
    assert "mul -> eq -> masked_fill  [fused (cache hit)" in adaptive.explain(1)
    # a smaller op repeated more than _REPEAT_LIMIT times per element keeps its own loop
    big = rand(fusion._REPEAT_LIMIT + 1, 8, 8)
    both_modes(lambda: (big * 0.5).masked_fill(mask[0, 0] == 0, 0.0))


def test_a_bigger_op_does_not_repeat_a_smaller_group():
    # two optimizer steps in one region: the weight's ops must not join the bias's group,
    # whose ops the weight's loop would then repeat once per row
    bias, weight = rand(8), rand(fusion._REPEAT_LIMIT + 1, 8, seed=1)

    def steps():
        return bias * 0.9 + 0.1, weight * 0.9 + 0.1

    both_modes(steps)
    adaptive.enable()
    for _ in range(2):
        _kept = steps()  # (alive: a region computes only what is referenced)
        torch.neuron.synchronize()  # (one region: .cpu() would run one output's part)
    report = adaptive.explain(1)
    # two loops (one launch): 8 + 520 elements, not one loop of 520 computing the bias's too
    assert f"one launch for 2 groups, {bias.numel() + weight.numel()} elements]" in report, report


def test_intermediates_kept_alive_are_written():
    x = rand(100)
    adaptive.disable()
    expected = [(x * 2).cpu(), (x * 2 + 1).cpu(), ((x * 2 + 1) * 3).cpu()]
    adaptive.enable()
    for _ in range(3):
        a = x * 2
        b = a + 1
        c = b * 3
        for got, e in zip((c, a, b), expected[::-1][:1] + expected[:2]):
            same_bits(got.cpu(), e)


# -- scalars are arguments --------------------------------------------------------------------
def test_new_scalar_values_reuse_the_kernel():
    x = rand(256)
    adaptive.enable()
    results = []
    for lr in (0.1, 0.2, 0.3, 0.4):
        results.append((x * lr + lr).neg().cpu())
    assert adaptive.stats()["cache_misses"] == 1
    assert adaptive.stats()["cache_hits"] == 2
    adaptive.disable()
    for lr, got in zip((0.1, 0.2, 0.3, 0.4), results):
        same_bits(got, (x * lr + lr).neg().cpu())


# -- fusion happens -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_place_activations_fuse(dtype):
    # nn.ReLU/ReLU6/SiLU/LeakyReLU(inplace=True) in CNNs: recorded, not region boundaries
    x = rand(64, 33, dtype=dtype)

    def program():
        a = F.relu6(x * 2 + 1, inplace=True) * 3
        b = F.relu(x - 0.5, inplace=True) + a
        c = F.silu(b * 1.5, inplace=True) - 1
        return F.leaky_relu(c * 0.7, 0.2, inplace=True) * 2

    both_modes(program)
    adaptive.enable()
    for _ in range(2):
        program()
    before = core.kernels_launched
    program().cpu()
    assert core.kernels_launched - before - 1 == 1  # one fused kernel (minus the host copy)


def test_repeated_chain_fuses_into_one_kernel():
    x, b = rand(1000), rand(1000, seed=1)

    def chain():
        return F.gelu(x * 2 + b).relu() - 1

    before = core.kernels_launched
    chain()
    plain = core.kernels_launched - before
    adaptive.enable()
    launches = []
    for _ in range(3):
        before = core.kernels_launched
        y = chain()
        y.cpu()
        launches.append(core.kernels_launched - before - 1)  # minus the copy to the host
    s = adaptive.stats()
    assert plain == 5 and launches == [5, 1, 1]
    assert s["fused_kernels"] == 2 and s["cache_misses"] == 1 and s["cache_hits"] == 1
    assert s["ops_recorded"] == 15 and s["hbm_bytes_not_moved"] > 0
    assert "fused (cache hit)" in adaptive.explain()
    assert "test_adaptive.py" in adaptive.explain()
    line = test_repeated_chain_fuses_into_one_kernel.__code__.co_firstlineno
    explained = adaptive.explain(1)
    # the line that synced (y.cpu()), each op with its line, and users' op names
    assert f"flushed by .cpu() or .to() (aten::_to_copy) at {__file__}:{line + 14}:" in explained
    assert f"{__file__}:{line + 4} (mul, add, gelu, relu, sub)" in explained
    assert "_plain" not in explained


def test_a_long_loop_splits_into_kernels_of_one_size_that_share_code():
    # Note [Kernel size]: 200 recorded ops make six 32-op pieces (one kernel) and an 8-op
    # tail, run in one launch (Note [Batches])
    x = rand(100)

    def loop():
        b = x
        for _ in range(100):
            b = b * 1.5 + 0.25
        return b

    both_modes(loop)
    s = adaptive.stats()
    assert s["cache_misses"] == 2 and s["ops_recorded"] == 600
    history = [entry for entry in fusion.history if entry[1] == 200]
    (launch,) = history[-1][2].groups
    assert [len(g.nodes) for g in launch.batch] == [32] * 6 + [8]


@pytest.mark.parametrize("large", [False, True])
def test_foreach_steps_fuse_only_over_large_tensors(large, monkeypatch):
    """Note [Foreach in adaptive eager]: small tensors get one multi-tensor launch per foreach
    op, as in plain eager; large ones (options.foreach_record_min lowered to count these as
    large) have their steps recorded and fused into one launch for the whole update."""
    if large:
        monkeypatch.setattr(adaptive.options, "foreach_record_min", 64)
    with pytest.raises(ValueError, match="foreach_record_min"):
        adaptive.options.foreach_record_min = -1
    grads = [rand(8, 8, seed=k) for k in range(3)]

    def update(params, bufs):
        torch._foreach_mul_(bufs, 0.9)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-0.1)
        return tuple(params + bufs)

    def fresh():
        return [rand(8, 8, seed=10 + k) for k in range(3)], [rand(8, 8, seed=20 + k)
                                                             for k in range(3)]

    both_modes(lambda: update(*fresh()))  # same bits, and the kernels are compiled
    adaptive.enable()
    for sighting in range(2):  # (the second runs the compiled kernels)
        params, bufs = fresh()
        adaptive.reset_stats()
        before = core.kernels_launched
        update(params, bufs)
        torch.neuron.synchronize()
    assert core.kernels_launched - before == (1 if large else 3)
    stats = adaptive.stats()
    assert stats["ops_recorded"] == (9 if large else 0)
    assert stats["foreach_ops_run_eagerly"] == (0 if large else 3)


def test_an_op_that_ran_alone_runs_eagerly_and_is_recorded_again_later():
    x, w = rand(64, 32), rand(32, 8, seed=1)

    def step():
        return F.gelu(x) @ w  # the matmul flushes the GELU's region: it ran alone

    adaptive.disable()
    expected = step().cpu()
    adaptive.enable()
    skip = recording.options.alone_skip
    results = [step() for _ in range(skip + 3)]
    s = adaptive.stats()
    # recorded, `skip` sightings eagerly, recorded again (alone again), eagerly
    assert s["ops_recorded"] == 2 and s["ops_run_alone"] == skip + 1
    for r in results:
        same_bits(r.cpu(), expected)


def test_an_op_that_finds_company_is_forgotten(monkeypatch):
    x = rand(64, 32)
    monkeypatch.setattr(recording.options, "alone_skip", 1)
    monkeypatch.setattr(recording, "_alone", {})  # (sites other tests left)

    def act(t):
        return F.gelu(t)  # one site, used alone and in a chain

    adaptive.enable()
    for _ in range(2):
        act(x).cpu()  # recorded and alone, then once eagerly
    assert adaptive.stats()["ops_run_alone"] == 1 and recording._alone
    for _ in range(3):
        (act(x) * 2).cpu()  # recorded again, with company: forgotten
    assert adaptive.stats()["ops_run_alone"] == 1 and not recording._alone


def test_dead_results_are_not_computed():
    x = rand(100)
    adaptive.enable()
    before = core.kernels_launched
    x * 2 + 1  # noqa: B018  (nobody reads it)
    (x - 1).cpu()
    assert core.kernels_launched - before == 2  # the sub and the copy


# -- sync points -------------------------------------------------------------------------------
def test_print_item_bool_tolist_cpu(capsys):
    x = rand(5)
    adaptive.disable()
    expected = x * 2 + 1
    expected_repr = repr(expected)
    adaptive.enable()
    y = x * 2 + 1
    assert "_node" in y.__dict__
    print(y)
    assert capsys.readouterr().out.strip() == expected_repr
    assert (x * 2 + 1)[1].item() == expected[1].item()
    assert (x * 2 + 1).tolist() == expected.tolist()
    assert bool(((x * 2 + 1) == expected).all())
    same_bits((x * 2 + 1).cpu(), expected.cpu())
    z = (x * 2 + 1).sum()  # a non-fusible op reads a pending tensor
    assert z.item() == expected.sum().item()


@pytest.mark.parametrize("layout", ["transposed result", "channels-last memory",
                                    "step-sliced result"])
def test_in_place_ops_keep_the_tensors_layout(layout):
    # Note [In-place layouts]: values, views, reductions and later results' strides
    t, c = rand(2, 3), torch.randn(2, 3, 2, 2).to(memory_format=torch.channels_last)
    make = {"transposed result": lambda: t.t() * 1,
            "channels-last memory": lambda: c.to(N),
            "step-sliced result": lambda: rand(4, 6)[:, ::2].exp()}[layout]

    def program():
        x = make()
        x.add_(1)
        x.mul_(2)
        y = x * 1 + x  # (before a view of x flushes the region)
        return x, y, x[0] * 1, x.sum(0), x.detach() + 0

    both_modes(program)
    plain = [r.stride() for r in program()]
    with neuron_eager.adaptive_eager():
        assert [r.stride() for r in program()] == plain  # known while still pending


def test_in_place_ops_on_elements_sharing_memory_see_each_write():
    # as_strided_ makes x = [[m0, m1], [m1, m2]]: add_ increments m1 twice, and x then reads
    # the memory's values, as on the CPU ([1, 2, 2, 1])
    def program():
        x = torch.zeros(3, device=N)
        x.as_strided_((2, 2), (1, 1))
        x.add_(1)
        x.mul_(3)
        return x * 1

    expected = both_modes(program)[0]
    cpu = torch.zeros(3)
    cpu.as_strided_((2, 2), (1, 1))
    assert torch.equal(expected, (cpu.add_(1).mul_(3) * 1))


def test_maximum_out_into_a_transposed_state_tensor():
    # the core of Adamax(foreach=False) on a transposed parameter (Note [In-place layouts])
    def program():
        torch.manual_seed(0)
        e, m = torch.zeros(6, 4, device=N).t(), torch.zeros(6, 4, device=N).t()
        for _ in range(3):
            g = torch.randn(6, 4).t().to(N)
            m.lerp_(g, 0.1)
            torch.maximum(e.mul_(0.9), g.abs().add_(1e-8), out=e)
        return e, m

    both_modes(program)


def test_in_place_and_views_on_pending_tensors():
    x = rand(4, 6)

    def program():
        y = x * 2
        y.add_(1)  # in-place on a pending tensor: flushed first
        v = (x + 3).t()  # a view of a pending tensor
        w = x - 1
        w[0] = 0  # a write through a view
        return y, v * 2, w

    both_modes(program)


@pytest.mark.parametrize("setting, value", [("auto_cast", "all"), ("stochastic_rounding", True)])
def test_ops_recorded_before_a_numerics_setting_changes_run_under_the_old_one(setting, value,
                                                                               monkeypatch):
    x = rand(64, 64)

    def program():
        y = (x * 1.000001 + 0.3333).bfloat16()  # issued under the default setting
        monkeypatch.setattr(neuron_eager.config, setting, value)
        try:
            out = y * 1
            torch.neuron.synchronize()  # (while the new setting holds)
            return out
        finally:
            monkeypatch.undo()

    expected = both_modes(program)[0]
    monkeypatch.setattr(neuron_eager.config, setting, value)
    changed = (x * 1.000001 + 0.3333).bfloat16()  # all under the new setting
    assert not torch.equal(changed.cpu(), expected)  # else the test could not see it


def test_in_place_masked_fill_is_recorded():
    # (maximum's backward fills in place: RWKV's loop flushed at each of its maximum calls)
    x, y = rand(64), rand(64, seed=1)

    def program():
        z = x * 2
        z.masked_fill_(z < y, -1.5)
        return z + y

    both_modes(program)
    adaptive.enable()
    program().sum().item()
    assert "mul -> lt -> masked_fill -> add" in adaptive.explain(1)


def test_writing_an_input_flushes_first():
    adaptive.enable()
    x = rand(8)
    y = x * 2  # pending: reads x
    old = (x.cpu() * 2)
    x.add_(1)  # writes x: y must still see the old values
    same_bits(y.cpu(), old)


def test_buffer_limit_flushes():
    x = rand(10)
    adaptive.enable()
    y = x
    for _ in range(recording.options.max_ops + 3):
        y = y + 1
    assert adaptive.stats()["flush_reasons"].get("buffer limit") == 1
    adaptive.disable()
    expected = x
    for _ in range(recording.options.max_ops + 3):
        expected = expected + 1
    same_bits(y.cpu(), expected.cpu())


# -- errors ------------------------------------------------------------------------------------
def test_errors_raise_at_the_users_line():
    x, y = rand(3, 4), rand(5)
    i = rand(4, dtype=torch.int32)
    messages = []
    for mode in (False, True):
        if mode:
            adaptive.enable()
        pending = x * 2
        with pytest.raises(RuntimeError) as shape_error:
            pending + y
        with pytest.raises(NotImplementedError) as dtype_error:
            F.gelu(i)
        with pytest.raises(RuntimeError) as mask_error:  # (the CPU names the mask's size first)
            pending.masked_fill(torch.zeros(3, 2, dtype=torch.bool, device=x.device), 0.0)
        messages.append((str(shape_error.value), str(dtype_error.value), str(mask_error.value)))
        assert any(str(e.path) == __file__ and "pending + y" in str(e.statement)
                   for e in shape_error.traceback)  # raised by the user's line itself
        same_bits(pending.cpu(), (x.cpu() * 2))  # the region survives the error
    assert messages[0] == messages[1]


def test_compile_failure_warns_once_and_runs_op_by_op(monkeypatch):
    real_source = codegen.source
    # the real source without its helpers: Numba's typing fails on the first call
    monkeypatch.setattr(codegen, "source", lambda spec: (real_source(spec)[0], {}))
    monkeypatch.setattr(codegen, "_kernels", {})
    monkeypatch.setattr(codegen, "_warned", set())
    monkeypatch.setattr(fusion, "_plans", {})
    x = rand(50)
    with pytest.warns(RuntimeWarning, match="did not compile"):
        both_modes(lambda: (x * 5 - 2).abs(), times=4)
    assert adaptive.stats()["compile_failures"] == 1
    assert adaptive.stats()["fused_kernels"] == 0


def test_python_ints_wrap_to_narrow_ints_when_recorded():
    u = torch.tensor([0, 1, 200, 255], dtype=torch.uint8, device=N)

    def program():
        r = (u // -1) + (u % 300) + (u < -1).to(torch.uint8) + u.clamp_min(-1)
        inplace = u.clone()
        inplace //= -1
        return r, inplace

    both_modes(program)
    host = u.cpu()
    same_bits(program()[0].cpu(), (host // -1) + (host % 300) + (host < -1).to(torch.uint8)
              + host.clamp_min(-1))


# -- autograd ------------------------------------------------------------------------------------
def test_backward_matches_plain_eager():
    w0, b0, x = rand(16, 8), rand(8, seed=1), rand(16, 8, seed=2)

    def step():
        w = w0.detach().requires_grad_(True)
        b = b0.detach().requires_grad_(True)
        h = F.gelu(x * w + b)
        loss = (torch.tanh(h) * 0.5 + h.sigmoid()).sum()
        loss.backward()
        return loss.detach(), w.grad, b.grad

    both_modes(step)
    adaptive.enable()
    threads = set()
    recorded = recording._add_node

    def spy(*a, **kw):
        threads.add(threading.get_ident())
        return recorded(*a, **kw)

    recording._add_node = spy
    try:
        step()
    finally:
        recording._add_node = recorded
    assert len(threads) == 2  # the backward's elementwise ops were recorded on its thread


# -- switching ---------------------------------------------------------------------------------
def test_api_and_plain_eager_untouched_when_off():
    assert not adaptive.is_enabled() and T._dispatcher is router.dispatch
    with neuron_eager.adaptive_eager():
        assert adaptive.is_enabled() and T._dispatcher is recording.dispatch
        y = rand(3) + 1
    assert "_node" not in y.__dict__  # leaving the block ran it
    assert not adaptive.is_enabled() and T._dispatcher is router.dispatch


def test_environment_variable_enables_at_import():
    code = "import neuron_eager; print(neuron_eager.adaptive.is_enabled())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"NEURON_EAGER_ADAPTIVE": "1", "PATH": ""}, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


def test_neuron_synchronize_runs_recorded_work():
    x = torch.randn(64, device="neuron")
    with adaptive.adaptive_eager():
        y = x * 2 + 1
        torch.neuron.synchronize()
        assert adaptive.stats()["flush_reasons"].get("synchronize") == 1
        same_bits(y, (x.cpu() * 2 + 1))


def test_recorded_ops_count_as_executed_like_plain_eager():
    x = torch.randn(64, device="neuron")

    def program():
        neuron_eager.clear_op_tracking()
        (torch.relu(x * 2 + 1) - x).sum().item()
        return neuron_eager.get_executed_ops()

    plain = program()
    with adaptive.adaptive_eager():
        for _ in range(3):  # op by op, compiled, cached
            assert program() == plain


def test_recorded_ops_are_counted_after_the_kernel_table_changes():
    """get_executed_ops() counts recorded ops as plain eager would, also after the router
    rebuilt its entries (tests hide kernels with checks.without_kernel)."""
    adaptive.enable()
    x = torch.ones(4, device=N)
    (x + x).cpu()  # the op table is in use
    router._entries.clear()
    neuron_eager.clear_op_tracking()
    (x * 3).cpu()
    assert neuron_eager.get_executed_ops().get("aten::mul.Tensor") == 1


# -- fp16 values held as fp32 inside fused kernels (Note [fp16 values stay fp32]) -----------
@pytest.mark.parametrize("cols", [7, 1100])
def test_fp16_chains_rows_and_keep_buffers_with_special_values(cols):
    x = rand(3, cols, dtype=torch.float16, seed=4)
    specials = torch.tensor([6e-8, -3e-6, 65504.0, -70000.0, float("nan"), float("inf"), 0.0,
                             -0.0, 1e-4, 2.0 ** -14], dtype=torch.float16)
    x[0, :min(cols, 10)] = specials[:min(cols, 10)].to(N)

    def program():
        y = x * 1.7 + 0.25  # fp16 intermediates, also stored
        e = torch.exp(y - y.amax(-1, keepdim=True))  # a kept transcendental
        soft = e / e.sum(-1, keepdim=True)
        tiny = y * 1e-4 - 3e-5  # subnormal halves
        big = y * 1000.0  # overflow to inf
        return y, soft, tiny, big, tiny.sum(-1), (big - y).mean(-1)

    both_modes(program)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_interpolate_of_a_channels_last_input(mode):
    """torch's decomposition ends in aten.contiguous(memory_format=channels_last) on a pending
    tensor: annotated as a view, but a copy for that layout; recorded as a view, it read the
    NCHW data with channels-last strides (values off by up to 2.4)."""
    def program():
        torch.manual_seed(0)
        x = torch.randn(1, 2, 3, 3).to(memory_format=torch.channels_last).to(N)
        return F.interpolate(x * 1, scale_factor=2, mode=mode), \
            F.interpolate(x, size=(3, 3), mode=mode)

    both_modes(program)


def test_detaching_a_pending_view_keeps_its_layout():
    # autograd and users detach views of recorded results: the detached tensor is the view
    # (its strides and offset), not the view's elements laid out from the start
    x = torch.randn(3, 5)
    views = [lambda t: t.narrow(1, 4, 1), lambda t: t.t(), lambda t: t[1:, ::2],
             lambda t: t.unsqueeze(0).expand(2, 3, 5)]
    for view in views:
        with adaptive.adaptive_eager():
            d = view(torch.tanh(x.to("neuron"))).detach()
            shown = (d.stride(), d.storage_offset(), d.cpu())
        plain = view(torch.tanh(x.to("neuron"))).detach()
        assert shown[:2] == (plain.stride(), plain.storage_offset())
        assert torch.equal(shown[2], plain.cpu())


def test_as_strided_of_a_pending_tensor_is_checked_as_in_plain_eager():
    adaptive.enable()
    y = torch.ones(4, 6, device="neuron") * 2
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        y.as_strided((30,), (1,)).cpu()
    assert torch.equal(((torch.ones(4, 6, device="neuron") * 2).as_strided((2, 3), (6, 1), 1)
                        ).cpu(), torch.full((2, 3), 2.0))


def test_blocks_in_two_threads_keep_the_latest_open_mode():
    """Note [Blocks from many threads]: A opens, B opens, A closes (B's block still on),
    B closes: back to the mode from before."""
    adaptive.disable()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with adaptive.adaptive_eager():
            a_in.set()
            b_in.wait()
        a_out.set()

    def b():
        a_in.wait()
        with adaptive.adaptive_eager():
            b_in.set()
            a_out.wait()
            seen["inside B after A left"] = adaptive.is_enabled()

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"inside B after A left": True} and not adaptive.is_enabled()


def test_a_profiler_stopped_under_adaptive_eager_leaves_no_dispatcher_behind():
    plain = T._dispatcher
    for _ in range(2):  # (starting again while it is still in the chain must not loop)
        with torch.profiler.profile() as prof:
            adaptive.enable()
            (torch.ones(4, device="neuron") * 2).sum().item()
        assert any(e.key.startswith("neuron::") for e in prof.key_averages())
    adaptive.disable()
    assert T._dispatcher is plain


def test_casts_keep_plain_eagers_strides_on_size_one_dims():
    """A contiguous tensor with other strides than the canonical ones (`(4, 1)`'s `.t()`):
    plain eager's cast keeps them, as the CPU's does, so adaptive eager's must too."""
    x = torch.randn(4, 1).t()
    plain = x.to("neuron").to(torch.bfloat16)
    adaptive.enable()
    recorded = x.to("neuron").to(torch.bfloat16)
    assert recorded.stride() == plain.stride() == x.to(torch.bfloat16).stride() == (1, 1)
    same_bits(recorded.cpu(), plain.cpu())


@pytest.mark.parametrize("alias", [
    lambda x: x[:3].detach(), lambda x: x.view(2, 3)[0].detach(),
    lambda x: x.reshape(3, 2).data, lambda x: torch.nn.Parameter(x[2:]),
    lambda x: x.detach()[1:].detach()])
def test_detached_views_of_a_pending_tensor_see_later_writes(alias, monkeypatch):
    # a detached view has no _base keeping the view it came from alive: it counts as a
    # view of the pending base itself, so the in-place op flushes first, as for any view
    monkeypatch.setattr(adaptive.options, "alone_skip", 0)  # (x's op is recorded every time)

    def program():
        x = torch.arange(6.0, device=N) * 2
        w = alias(x)
        x.add_(1)
        return w.detach(), x

    both_modes(program)


def test_a_failed_regions_error_names_the_op_and_line_as_users_know_them(monkeypatch):
    def failing(region, values, g, *let_go):
        raise RuntimeError("simulated kernel failure")

    adaptive.enable()
    w = torch.ones(8, device=N, requires_grad=True)
    loss = (w * 3).tanh().sum()
    loss.item()
    monkeypatch.setattr(launch, "_run_ops", failing)
    with pytest.raises(RuntimeError, match=r"recorded at <autograd backward: \w+> failed"):
        loss.backward()  # (backward ops have no line: no ":0")
        w.grad.tolist()
    x = torch.ones(8, device=N)
    with pytest.raises(RuntimeError, match=r"running add recorded at \S+test_adaptive.py:\d+ "):
        (x + 1).tolist()  # (add without alpha runs as add_plain)
    assert adaptive.explain(0) == "" and adaptive.explain(1).count("region of") == 1


def test_explain_counts_the_ops_nothing_read():
    adaptive.enable()
    x = torch.ones(8, device=N)
    for _ in range(3):
        y = x * 2 + 1  # the first two results are overwritten unread
    torch.neuron.synchronize()
    assert y.tolist() == [3.0] * 8
    assert adaptive.explain(1).startswith("region of 6 ops (4 not run: nothing read their")


def test_explain_names_the_line_of_the_block_that_ends_a_region():
    x = torch.ones(8, device=N)
    with neuron_eager.adaptive_eager():
        y = x * 2 + 1
    line = inspect.currentframe().f_lineno - 2  # (the `with` statement's exit: its first line)
    assert y.tolist() == [3.0] * 8
    assert f"flushed by adaptive eager off at {__file__}:{line}:" in adaptive.explain(1)


@pytest.mark.parametrize("name, value, error", [
    ("max_op", 3, AttributeError), ("compile_after", "x", ValueError),
    ("max_ops", 0, ValueError), ("alone_skip", -2, ValueError),
    ("compile_after", True, ValueError)])
def test_options_refuse_what_the_policy_cannot_use(name, value, error):
    # (a typo did nothing; compile_after="x" raised a TypeError at the next flush)
    before = repr(adaptive.options)
    with pytest.raises(error, match=name):
        setattr(adaptive.options, name, value)
    assert repr(adaptive.options) == before
