import os
import tempfile

import pytest
import torch

# Kernels are cached on disk here (plain ones: ops/jit.py reads it when ops/ is imported), by
# this process, the other test workers, their subprocesses and later runs; never in the
# user's ~/.cache. Its fingerprint subfolder changes with any source edit: nothing stale is
# reused. Tests of the cache itself set their own folders.
os.environ.setdefault("NEURON_EAGER_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"neuron-eager-test-kernels-{os.getuid()}"))

# Every kernel checks its indices here (Numba reads this when first imported): an access out
# of bounds raises IndexError instead of reading or corrupting memory. A separate machine-code
# cache (diskcache.fingerprint keys on it), so users' kernels are not the checked ones.
os.environ.setdefault("NUMBA_BOUNDSCHECK", "1")

import neuron_eager  # noqa: E402


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
