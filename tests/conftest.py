import pytest
import torch

import neuron_eager


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache_dir(tmp_path_factory):
    """Fused kernels cached on disk (and by subprocesses) go to this session's temp folder,
    never to the user's ~/.cache."""
    patch = pytest.MonkeyPatch()
    patch.setenv("NEURON_EAGER_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _fresh_tracking():
    """Each test starts with clean op counters and the CPU fallback switched on."""
    neuron_eager.clear_op_tracking()
    fallback = neuron_eager.config.cpu_fallback
    yield
    neuron_eager.config.cpu_fallback = fallback


@pytest.fixture
def native_only():
    """Run the test with CPU fallback switched off: any unimplemented op raises."""
    neuron_eager.config.cpu_fallback = False
    yield
    neuron_eager.config.cpu_fallback = True


@pytest.fixture
def seed():
    torch.manual_seed(0)
    torch.neuron.manual_seed(0)
    return 0
