"""Each touch of torch internals (ops/_compat.py), checked so a torch upgrade fails loudly."""
import copy
import subprocess
import sys

import pytest
import torch

import neuron_eager  # noqa: F401
from neuron_eager.ops import _compat


def test_backend_renamed_with_hooks_and_guard():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert hasattr(torch.Tensor, "neuron") and hasattr(torch.nn.Module, "neuron")
    x = torch.ones(2).to("neuron")  # needs the device guard
    x.requires_grad_()
    (x * 2).sum().backward()  # so does the autograd engine


def test_set_metadata_edits_a_wrapper_in_place():
    x = torch.arange(6.0).to("neuron")
    _compat.set_metadata(x, (2, 3), (3, 1), 0)
    assert x.shape == (2, 3) and x.stride() == (3, 1) and x.device.type == "neuron"


def test_foreach_support_registered():
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    assert neuron_eager.NeuronTensor in optimizer._foreach_supported_types
    assert neuron_eager.NeuronTensor in _foreach_utils._foreach_supported_types


def test_accelerator_memory_and_synchronize_answer_for_neuron():
    before = torch.accelerator.memory_allocated()
    x = torch.empty(4096, device="neuron")
    assert torch.accelerator.memory_allocated() > before
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == \
        torch.neuron.memory_allocated()
    torch.accelerator.synchronize()
    del x


def test_accelerator_calls_that_need_cpp_hooks_answer_for_neuron():
    # Unpatched, the resets and empty_cache hit a c10 internal assert, set_stream refused
    # torch.neuron.Stream and empty_host_cache crashed the process: hence a subprocess.
    script = """
import torch, neuron_eager
A = torch.accelerator
x = torch.empty(1 << 20, device="neuron")
A.reset_peak_memory_stats()
assert A.max_memory_allocated() == torch.neuron.memory_allocated()
del x
A.empty_cache()
assert A.memory_reserved() == torch.neuron.memory_reserved()
A.reset_accumulated_memory_stats()
A.empty_host_cache()
assert A.get_memory_info() == torch.neuron.mem_get_info()
assert torch.float32 in A.get_device_capability()["supported_dtypes"]
assert torch.complex64 not in A.get_device_capability()["supported_dtypes"]
s = torch.neuron.Stream()
A.set_stream(s)
assert A.current_stream() == s == torch.neuron.current_stream()
A.set_stream(torch.neuron.default_stream())
A.set_device_index(0)
A.set_device_index(-1)
try:
    A.set_device_index(1)
except RuntimeError as e:
    assert "neuron:1 does not exist" in str(e)
else:
    raise AssertionError("set_device_index(1) was accepted")
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_pinned_memory_and_dataloader_pinning():
    x = torch.randn(3)
    pinned = x.pin_memory()
    assert torch.equal(pinned, x) and not pinned.is_pinned()
    data = torch.utils.data.TensorDataset(torch.randn(8, 2))
    batch = next(iter(torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)))[0]
    assert batch.shape == (4, 2)
    assert batch.to("neuron").device.type == "neuron"
    on_device = x.to("neuron")  # refused as CUDA refuses its tensors, not a CPU fallback
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        on_device.pin_memory()
    assert not on_device.is_pinned()


@pytest.mark.parametrize("inputs_on", ["cpu", "neuron"])
def test_data_parallel_trains_on_one_neuroncore_as_on_one_gpu(inputs_on):
    # (Note [DataParallel on one NeuronCore]: torch._C._scatter is missing from a CPU build)
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))

    def train(model, x, y):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return [loss.detach().cpu()] + [p.detach().cpu() for p in model.parameters()]

    want = train(copy.deepcopy(base), x, y)
    parallel = torch.nn.DataParallel(copy.deepcopy(base))  # moved to neuron:0, as to cuda:0
    assert {p.device.type for p in parallel.parameters()} == {"neuron"}
    got = train(parallel, x.to(inputs_on), y.to("neuron"))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    gathered = torch.nn.parallel.comm.gather([torch.ones(2, device="neuron")] * 2, 0, "cpu")
    assert torch.equal(gathered, torch.ones(4))


def test_wrapper_rebuild_function_is_allowed_by_weights_only_load():
    import io

    buf = io.BytesIO()
    torch.save({"w": torch.ones(2).to("neuron")}, buf)
    buf.seek(0)
    assert torch.load(buf)["w"].device.type == "neuron"


def test_torch_lapack_library_exports_what_linalg_calls_or_is_absent():
    lib = _compat.torch_lapack_library()
    assert lib is None or all(hasattr(lib, f"{name}_") for name in ("sgesdd", "ssyevd"))


def test_prefer_512_bit_vectors():
    """On AVX-512 CPUs Numba's shared target machine drops LLVM's 256-bit preference."""
    from numba.core.registry import cpu_target

    from neuron_eager.ops import _compat

    features = getattr(cpu_target.target_context.codegen(), "_tm_features", "")
    assert _compat.prefer_512_bit_vectors() == ("+avx512f" in features.split(","))
    if "+avx512f" in features.split(","):
        assert "-prefer-256-bit" in cpu_target.target_context.codegen()._tm_features


def test_numba_function_cache_keeps_machine_code_where_and_as_told(tmp_path):
    """The FunctionCache class from numba_function_cache saves to the folder given, under the
    key given, and a fresh dispatcher of the same function loads it."""
    import numba

    cache = _compat.numba_function_cache(lambda: tmp_path, lambda fn: "the key")

    def add_one(x):
        return x + 1

    def dispatcher():
        d = numba.njit(add_one)
        d._cache = cache(add_one)
        return d

    first = dispatcher()
    assert first(1) == 2 and sum(first.stats.cache_misses.values()) == 1
    assert list(tmp_path.glob("*add_one*.nbi"))
    second = dispatcher()
    assert second(2) == 3 and sum(second.stats.cache_hits.values()) == 1


def test_make_fx_traces_untracked_neuron_tensors_as_constants():
    from torch.fx.experimental import proxy_tensor

    assert neuron_eager.NeuronTensor in proxy_tensor.HANDLED_TYPES


def test_backward_entry_point_is_wrapped_once():
    import torch.autograd.graph as graph

    from neuron_eager.ops import backward_errors

    wrapped = torch.autograd._engine_run_backward
    assert wrapped is graph._engine_run_backward and wrapped._neuron_wrapped
    _compat.install_backward_errors(backward_errors)  # idempotent
    assert torch.autograd._engine_run_backward is wrapped
    assert torch._C._current_graph_task_id() == -1  # outside backward (in_backward relies on it)


@pytest.mark.parametrize("make", [torch.jit.script, lambda m: torch.jit.trace(
    m, (torch.randn(3, 8),))])
def test_script_modules_move_to_neuron_and_back(make):
    """ScriptModule.to() went through the tied-parameter shim, which asked its parameter
    table (a wrapper without .get) for each parameter."""
    import warnings

    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    x = torch.randn(3, 8)
    want = eager(x)
    want.sum().backward()
    module = make(eager)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "held elsewhere" warning: torch's own behaviour)
        module.to("neuron")
    got = module(x.to("neuron"))
    got.sum().backward()
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(module.state_dict()["0.weight"].cpu(), eager[0].weight)
    module.to(torch.float64).to("cpu")


def test_saved_script_modules_load_onto_neuron_and_neuron_ones_save():
    # Note [TorchScript on neuron]
    import io

    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 8)
    want = eager(x)
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(eager), buffer)
    for load in (lambda b: torch.jit.load(b).to("neuron"),
                 lambda b: torch.jit.load(b, map_location="neuron")):
        buffer.seek(0)
        module = load(buffer)
        assert {p.device.type for p in module.parameters()} == {"neuron"}
        got = module(x.to("neuron"))
        torch.testing.assert_close(got.cpu(), want)
        again = io.BytesIO()
        torch.jit.save(module, again)  # (a CPU copy: C++ cannot read neuron memory)
        assert module(x.to("neuron")).device.type == "neuron"  # (the module itself stays)
        again.seek(0)
        torch.testing.assert_close(torch.jit.load(again, map_location="neuron")(
            x.to("neuron")).cpu(), want)


_COMPILED_BACKWARD = """
import warnings, torch, neuron_eager
m = torch.nn.Linear(3, 2).to("neuron")
@torch.compile
def step(x):
    loss = m(x).sum()
    loss.backward()
    return loss
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    step(torch.ones(2, 3, device="neuron"))
assert torch.equal(m.weight.grad.cpu(), torch.full((2, 3), 2.0)), m.weight.grad
print([str(w.message)[:80] for w in caught if "atexit" in str(w.message)])
"""


def test_a_compiled_step_with_backward_warns_nothing_of_ours():
    """The first backward registers an exit hook (Note [Exit after backward]); Dynamo, tracing
    a compiled step's backward, warned that it cannot trace atexit.register. A fresh
    process: the hook is registered once per process."""
    run = subprocess.run([sys.executable, "-c", _COMPILED_BACKWARD], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("[]"), run.stdout + run.stderr


def test_torch_function_modes_are_counted_and_turned_off_as_host_side_expects():
    # (Note [Host tensors under a default device]: set_default_device is a function mode)
    assert _compat.function_modes() == 0
    with torch.device("meta"):
        assert _compat.function_modes() == 1
        assert _compat.host_side(lambda: torch.empty(1).device)() == torch.device("cpu")
        assert torch.empty(1).device == torch.device("meta")


def test_jit_trace_records_the_users_ops_not_the_devices():
    # (the tracer recorded the simulator's own calls: cross_entropy's trace failed with an
    # internal assert, and the user got TracerWarnings pointing into neuron_eager)
    import warnings
    import torch.nn.functional as F

    x = torch.randn(4, 5)
    target = torch.tensor([0, 1, 4, 2])

    def loss(x):
        return F.cross_entropy(x * 2, target.to(x.device)) if x.sum() != 0 else x.sum()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(loss, x.to("neuron"), check_trace=False)
    torch.testing.assert_close(traced(x.to("neuron")).cpu(), loss(x))
    assert not [w for w in caught if "neuron_eager" in w.filename or "/ops/" in w.filename]


def test_control_flow_ops_run_in_eager_on_neuron():
    # Note [Control flow ops in eager]: they ran through Dynamo with fullgraph=True and failed
    from torch._higher_order_ops import while_loop

    results = {}
    for device in ("cpu", "neuron"):
        x = torch.linspace(-1, 2, 6, device=device, requires_grad=True)
        picked = [torch.cond(x.sum() > threshold, lambda t: t.sin(), lambda t: t.cos(), (x,))
                  for threshold in (0.0, 100.0)]
        sum(p.sum() for p in picked).backward()
        count, value = while_loop(lambda i, v: i.sum() < 5, lambda i, v: (i + 1, v * 2),
                                  (torch.zeros(1, device=device), torch.ones(3, device=device)))
        results[device] = [t.detach().cpu() for t in (*picked, x.grad, count, value)]
    for got, want in zip(results["neuron"], results["cpu"]):
        torch.testing.assert_close(got, want)
    with pytest.raises(RuntimeError, match="single-element tensor"):
        torch.cond(torch.ones(2, device="neuron") > 0, lambda t: t, lambda t: t,
                   (torch.ones(1, device="neuron"),))


def test_printing_and_host_reads_inside_a_compiled_function():
    # Dynamo inlined the host-side methods and failed on np.copyto of fake tensors (printing,
    # tolist) or recursed (untyped_storage): they now break the graph, as on the CPU
    import contextlib
    import io

    def f(x):
        y = x * 2
        print(y, f"{y.sum():.2f}", y.tolist(), y.untyped_storage().nbytes())
        return y.sum()

    printed = {}
    for device in ("cpu", "neuron"):
        torch._dynamo.reset()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            result = torch.compile(f)(torch.arange(3.0, device=device))
        printed[device] = out.getvalue().replace(", device='neuron:0'", "")
        assert result.item() == 6.0
    assert printed["neuron"] == printed["cpu"]
