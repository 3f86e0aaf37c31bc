"""Registration: the device name, torch.neuron, torch.accelerator, generated methods."""
import gc
import io
import os
import subprocess
import sys

import pytest
import torch

import neuron_eager


def test_device_is_registered():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.device("neuron").type == "neuron"
    assert torch.neuron is neuron_eager.device
    assert torch.neuron.is_available() and torch.neuron.is_initialized()
    assert torch.neuron.device_count() == 1 and torch.neuron.current_device() == 0


def test_accelerator_answers_for_neuron():
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 1
    torch.accelerator.synchronize()
    gc.collect()  # (else an earlier test's cyclic garbage may be freed in between)
    base = torch.accelerator.memory_allocated()
    x = torch.empty(1000, device="neuron")
    assert torch.accelerator.memory_allocated() >= base + 4000
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated()
    del x


def test_generated_methods():
    t = torch.arange(3.0).neuron()
    assert t.device == torch.device("neuron", 0) and t.is_neuron
    module = torch.nn.Linear(2, 2).neuron()
    assert all(p.device.type == "neuron" for p in module.parameters())


def test_device_functions():
    props = torch.neuron.get_device_properties(0)
    assert props.total_memory == neuron_eager.device_sim.core.hbm.capacity
    assert "NeuronCore" in props.name and "NeuronCore" in torch.neuron.get_device_name()
    torch.neuron.set_device(0)
    torch.neuron.set_device("neuron:0")
    with torch.neuron.device(0):
        pass
    with pytest.raises(RuntimeError, match="does not exist"):
        torch.neuron.set_device(1)
    torch.neuron.synchronize()
    assert torch.neuron.get_amp_supported_dtype() == [torch.float32, torch.float16,
                                                      torch.bfloat16]
    assert torch.neuron.is_bf16_supported()


def test_default_chip_is_a_trn2_core_share():
    spec = neuron_eager.device_sim.core.spec
    assert spec.name == "trn2"
    assert spec.hbm_per_core == 96 * 2**30 // 8


def test_rng_functions_roundtrip():
    torch.neuron.manual_seed(123)
    assert torch.neuron.initial_seed() == 123
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.rand(5, device="neuron").cpu()
    torch.neuron.set_rng_state(state)
    b = torch.rand(5, device="neuron").cpu()
    assert torch.equal(a, b)
    torch.neuron.manual_seed_all(7)
    assert torch.neuron.initial_seed() == 7
    torch.neuron.seed()
    torch.neuron.seed_all()


def test_manual_seed_reproduces_and_leaves_cpu_generator_alone():
    torch.manual_seed(0)
    cpu_state = torch.get_rng_state()
    torch.neuron.manual_seed(42)
    a = torch.randn(100, device="neuron").cpu()
    torch.neuron.manual_seed(42)
    b = torch.randn(100, device="neuron").cpu()
    assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    torch.neuron.manual_seed(43)
    assert not torch.equal(torch.randn(100, device="neuron").cpu(), a)


def test_seeds_take_the_cpus_range():
    # negative seeds wrap to 64 bits as on the CPU; past the range both refuse
    for seed in (-1, -(2 ** 63), 2 ** 64 - 1):
        torch.manual_seed(seed)
        torch.neuron.manual_seed(seed)
        assert torch.neuron.initial_seed() == torch.initial_seed()
    for seed in (2 ** 64, -(2 ** 63) - 1):
        with pytest.raises(ValueError) as cpu:
            torch.manual_seed(seed)
        with pytest.raises(ValueError, match=str(cpu.value)):
            torch.neuron.manual_seed(seed)
    torch.manual_seed(0)


def test_op_tracking():
    neuron_eager.clear_op_tracking()
    x = torch.ones(4, device="neuron")
    (x + x).cpu()
    executed = neuron_eager.get_executed_ops()
    assert executed.get("aten::add.Tensor") == 1
    assert neuron_eager.get_fallback_ops() == {}
    neuron_eager.clear_op_tracking()
    assert neuron_eager.get_executed_ops() == {}


def test_torch_manual_seed_also_seeds_the_device():
    torch.manual_seed(5)
    a = torch.rand(8, device="neuron").cpu()
    torch.manual_seed(5)
    assert torch.equal(torch.rand(8, device="neuron").cpu(), a)
    assert torch.neuron.initial_seed() == 5


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputes_dropout_with_the_forward_mask(reentrant):
    """torch.utils.checkpoint restores the device RNG for the recomputed forward (it asks
    torch.neuron._initialized): the gradient of sum(dropout(x)) is the forward's mask."""
    import torch.utils.checkpoint as checkpoint

    x = torch.ones(64, device="neuron", requires_grad=True)
    torch.manual_seed(3)
    out = checkpoint.checkpoint(torch.nn.Dropout(0.5), x, use_reentrant=reentrant)
    out.sum().backward()
    assert 0 < int((out == 0).sum()) < 64
    assert torch.equal(x.grad.cpu(), out.detach().cpu())


def test_settings_read_at_import_refuse_a_change_naming_the_way():
    config = neuron_eager.config
    for name, value, way in [("chip", "trn1", "NEURON_EAGER_CHIP"),
                             ("hbm_bytes", 1 << 20, "NEURON_EAGER_HBM_BYTES"),
                             ("launch_overhead_ns", 1.0, "set_cost_model"),
                             ("adaptive", not config.adaptive, "adaptive.enable")]:
        before = getattr(config, name)
        with pytest.raises(ValueError, match=way):
            setattr(config, name, value)
        assert getattr(config, name) == before
        setattr(config, name, before)  # (the same value: nothing changes, nothing raised)
    config.cpu_fallback = False  # read at each use: changes at run time
    config.cpu_fallback = True


def test_a_setting_that_does_not_exist_or_a_wrong_kind_of_value_is_refused():
    config = neuron_eager.config
    for name, value, error, words in [
            ("cpu_falback", False, AttributeError, "did you mean 'cpu_fallback'"),
            ("cpu_fallback", "0", TypeError, "NEURON_EAGER_CPU_FALLBACK"),
            ("launch_blocking", "maybe", TypeError, "True or False"),
            ("stochastic_rounding", 1, TypeError, "True or False")]:
        before = getattr(config, name, None)
        with pytest.raises(error, match=words):
            setattr(config, name, value)
        assert getattr(config, name, None) == before


@pytest.mark.parametrize("variable,value,words", [
    ("NEURON_EAGER_LAUNCH_OVERHEAD_NS", "-1000", ">= 0"),
    ("NEURON_EAGER_LAUNCH_OVERHEAD_NS", "fast", "NEURON_EAGER_LAUNCH_OVERHEAD_NS must be a"),
    ("NEURON_EAGER_HBM_BYTES", "0", "positive"),
    ("NEURON_EAGER_HBM_BYTES", "lots", "NEURON_EAGER_HBM_BYTES: cannot read"),
    ("NEURON_EAGER_ADAPTIVE", "disabled", "NEURON_EAGER_ADAPTIVE must be 1 or 0"),
    ("NEURON_EAGER_CPU_FALLBACK", "none", "NEURON_EAGER_CPU_FALLBACK must be 1 or 0")])
def test_a_bad_environment_setting_is_refused_at_import_naming_it(variable, value, words):
    run = subprocess.run([sys.executable, "-c", "import neuron_eager"], capture_output=True,
                         text=True, env=dict(os.environ, **{variable: value}), timeout=300)
    assert run.returncode != 0 and words in run.stderr, run.stderr[-1500:]


def _program_under_a_default_device():
    """What a script does after torch.set_default_device(...): factories without a device,
    printing, host reads, ops whose kernels make host tensors, torch.save and load."""
    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.GELU(), torch.nn.Linear(5, 2))
    with torch.no_grad():  # (the device's generator is not the CPU's)
        for p in model.parameters():
            p.copy_(torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 1]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    y = model(x)
    return {"repr": repr(y.detach()).replace(", device='neuron:0'", ""), "list": y.tolist(),
            "item": loss.item(), "sorted": torch.sort(y.flatten()).values.tolist(),
            "unique": torch.tensor([3, 1, 3]).unique().tolist(),
            "nonzero": (y > 0).nonzero().tolist(), "numpy": y.detach().numpy(force=True),
            "loaded": loaded["model"]["0.weight"].tolist(),
            "moment": loaded["opt"]["state"][0]["exp_avg"].tolist(),
            "rng_state_device": torch.get_rng_state().device.type}


@pytest.mark.parametrize("adaptive", [False, True], ids=["plain", "adaptive"])
def test_a_default_device_of_neuron_keeps_host_tensors_on_the_host(adaptive):
    # Note [Host tensors under a default device]: printing, .tolist(), sort and torch.save
    # made their CPU tensors on the default device and failed
    with torch.device("cpu"):
        want = _program_under_a_default_device()
    with torch.device("neuron"), neuron_eager.adaptive_eager(adaptive):
        got = _program_under_a_default_device()
        assert torch.neuron.get_rng_state().device.type == "cpu"  # (as torch.cuda's)
    assert got.keys() == want.keys()
    for key in want:
        if key in ("repr", "rng_state_device"):
            assert got[key] == want[key] if key == "rng_state_device" else \
                got[key].startswith("tensor([[")
        else:
            torch.testing.assert_close(torch.as_tensor(got[key]), torch.as_tensor(want[key]),
                                       rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make", [
    lambda x: torch.zeros_like(x, layout=torch.sparse_coo),
    lambda x: torch.empty_like(x, layout=torch.sparse_csr),
    lambda x: x.new_zeros(2, layout=torch.sparse_coo),
    lambda x: x.new_empty(2, pin_memory=True), lambda x: torch.ones_like(x, pin_memory=True),
    lambda x: torch.empty(2, device=x.device, pin_memory=True)])
def test_factories_refuse_layouts_and_pinning_a_device_tensor_cannot_have(make):
    # (the *_like and new_* factories ignored them: a dense, "pinned" neuron tensor came back)
    with pytest.raises(RuntimeError, match="not supported on neuron|Only dense CPU tensors"):
        make(torch.ones(2, 2, device="neuron"))


def test_quantized_tensors_are_refused_with_a_way_out():
    with pytest.warns(UserWarning):  # (torch: quantized tensor creation is deprecated)
        q = torch.quantize_per_tensor(torch.randn(4), 0.1, 3, torch.quint8)
    for move in (lambda: q.to("neuron"), lambda: torch.empty(2, dtype=torch.qint8,
                                                             device="neuron")):
        with pytest.raises(RuntimeError, match=r"quantized tensors \(torch.q.*dequantize"):
            move()
    assert torch.equal(q.dequantize().to("neuron").cpu(), q.dequantize())
