"""The cost model and the simulated clock, without torch: each test recomputes the
documented formula (docs/cost-model.md) from the spec's figures."""
import math

import pytest

from neuron_eager.device_sim import config
from neuron_eager.device_sim.clock import Clock
from neuron_eager.device_sim.core import NeuronCore
from neuron_eager.device_sim.cost import CostModel
from neuron_eager.device_sim.spec import CHIPS


def _dma(model, nbytes, transfers):
    bw = min(16 * 25.0, model.spec.hbm_bandwidth / model.spec.cores_per_chip / 1e9)
    return math.ceil(transfers / 16) * 1300.0 + nbytes / bw


@pytest.mark.parametrize("chip", ["trn1", "trn2", "trn3"])
def test_elementwise_add_matches_formula(chip):
    model = CostModel(CHIPS[chip])
    n = 64
    nbytes = 3 * 4 * n  # two fp32 inputs read, one written
    c = model.cost("vector", n, nbytes)
    dma = _dma(model, nbytes, transfers=2)
    cycles = math.ceil(n / 128) * 1 + 1 * 160
    engine = cycles / CHIPS[chip].clock_vector_hz * 1e9
    assert c.transfers == 2 and c.tiles == 0
    assert c.dma_ns == pytest.approx(dma) and c.engine_ns == pytest.approx(engine)
    assert c.duration_ns == pytest.approx(10_000 + dma + engine)  # one stage: no overlap


def test_worked_example_add_trn2():
    # docs/cost-model.md, worked example 1
    assert CostModel(CHIPS["trn2"]).cost("vector", 64, 768).duration_ns == \
        pytest.approx(11469.83, abs=0.01)


def test_matmul_matches_formula_fp32_and_bf16():
    model = CostModel(CHIPS["trn2"])
    m = k = n = 256
    nbytes = 3 * 4 * m * n
    c = model.cost("tensor", m * k * n, nbytes, matmul=(1, m, k, n), dtype="fp32")
    tiles = 2 * 2 * 1  # ceil(M/128) * ceil(K/128) * ceil(N/512)
    cycles = tiles * max(256, 64) * 4  # fp32: a quarter of the bf16 rate
    engine = cycles / 2.4e9 * 1e9
    dma = _dma(model, nbytes, transfers=math.ceil(nbytes / (128 * 2048)) + 1)
    stages = math.ceil(nbytes / (128 * 2048))
    assert c.tiles == tiles and c.engine_ns == pytest.approx(engine)
    assert c.duration_ns == pytest.approx(10_000 + max(dma, engine) + min(dma, engine) / stages)
    assert c.duration_ns == pytest.approx(14038.36, abs=0.01)  # worked example 2
    bf16 = model.cost("tensor", m * k * n, nbytes // 2, matmul=(1, m, k, n), dtype="bf16")
    assert bf16.engine_ns == pytest.approx(engine / 4)


def test_matmul_tiles_edges():
    model = CostModel(CHIPS["trn2"])
    assert model.matmul_tiles(1, 128, 128, 512) == (1, 512)
    assert model.matmul_tiles(1, 129, 128, 512) == (2, 1024)
    assert model.matmul_tiles(1, 128, 128, 10) == (1, 64)  # issue interval floor
    assert model.matmul_tiles(3, 128, 256, 1024 + 100) == (3 * 2 * 3, 3 * 2 * (1024 + 100))


def test_auto_cast_runs_fp32_matmul_at_bf16_rate(monkeypatch):
    model = CostModel(CHIPS["trn2"])
    slow = model.cost("tensor", 128 ** 3, 0, matmul=(1, 128, 128, 128), dtype="fp32")
    monkeypatch.setattr(config, "auto_cast", "matmult")
    fast = model.cost("tensor", 128 ** 3, 0, matmul=(1, 128, 128, 128), dtype="fp32")
    assert slow.engine_ns == pytest.approx(4 * fast.engine_ns)


def test_the_core_reprices_a_cached_matmul_when_auto_cast_changes(monkeypatch):
    core = NeuronCore(CHIPS["trn2"], 1 << 20)
    args = ("tensor", 128 ** 3, 0)
    kwargs = dict(matmul=(1, 128, 128, 128), dtype="fp32")
    slow = core.launch(*args, **kwargs)
    assert core.launch(*args, **kwargs) == slow  # (priced once, from the cache)
    monkeypatch.setattr(config, "auto_cast", "matmult")
    assert core.launch(*args, **kwargs) == core.cost_model.cost(*args, **kwargs) != slow


def test_large_copy_is_bandwidth_bound():
    model = CostModel(CHIPS["trn2"])
    nbytes = 1 << 30
    c = model.cost("dma", 0, nbytes)
    assert c.engine_ns == 0
    assert c.duration_ns == pytest.approx(10_000 + _dma(model, nbytes, nbytes // (1 << 18) + 1))


def test_overlap_of_dma_and_compute_grows_with_stages():
    model = CostModel(CHIPS["trn2"])
    c = model.cost("gpsimd", 1 << 24, 1 << 26)
    stages = (1 << 26) // (128 * 2048)
    body = max(c.dma_ns, c.engine_ns) + min(c.dma_ns, c.engine_ns) / stages
    assert c.duration_ns == pytest.approx(c.overhead_ns + body)


def test_launch_overhead_is_a_parameter():
    model = CostModel(CHIPS["trn2"], launch_overhead_ns=0.0)
    assert model.cost("vector", 0, 0).duration_ns == 0.0


def test_clock_overlaps_streams_on_different_engines():
    clock = Clock()
    s1, s2 = clock.new_stream(), clock.new_stream()
    clock.current = s1
    assert clock.schedule("tensor", 100_000) == (0, 100_000)  # picoseconds
    clock.current = s2
    assert clock.schedule("vector", 40_000) == (0, 40_000)  # overlaps
    assert clock.schedule("tensor", 10_000) == (100_000, 110_000)  # waits for the engine
    assert clock.synchronize() == 110_000
    clock.current = s1
    assert clock.schedule("vector", 1000) == (110_000, 111_000)  # after the host's wait


def test_launch_blocking_serialises(monkeypatch):
    monkeypatch.setattr(config, "launch_blocking", True)
    clock = Clock()
    s1, s2 = clock.new_stream(), clock.new_stream()
    clock.current = s1
    clock.schedule("tensor", 100_000)
    clock.current = s2
    assert clock.schedule("vector", 40_000) == (100_000, 140_000)


def test_core_prices_matmuls_and_records():
    core = NeuronCore(CHIPS["trn2"], 1 << 20)
    hinted = core.launch("tensor", 256 ** 3, 3 * 4 * 256 * 256, matmul=(1, 256, 256, 256),
                         dtype="fp32")
    explicit = core.cost_model.cost("tensor", 256 ** 3, 3 * 4 * 256 * 256,
                                    matmul=(1, 256, 256, 256), dtype="fp32")
    assert hinted == explicit
    core.clock.start_recording()
    core.launch("vector", 64, 768)
    (record,) = core.clock.stop_recording()
    assert record.engine == "vector" and record.end_ns - record.start_ns == \
        pytest.approx(11469.83, abs=0.01)
    assert core.kernels_launched == 2
