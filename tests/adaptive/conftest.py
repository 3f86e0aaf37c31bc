import pytest

from neuron_eager.device_sim import core


@pytest.fixture(autouse=True)
def _poisoned_hbm():
    """Fresh HBM blocks hold 0xFF bytes here: a fused kernel that skips part of its output
    cannot pass by reusing a cached block that still holds plain eager's result."""
    core.hbm.poison = True
    yield
    core.hbm.poison = False


@pytest.fixture
def plain_after():
    """Counters zeroed before the test; plain eager again after it."""
    from neuron_eager import adaptive

    adaptive.reset_stats()
    yield
    adaptive.disable()
