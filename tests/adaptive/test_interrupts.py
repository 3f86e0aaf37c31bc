"""Ctrl-C inside adaptive eager's recording or flush (Note [Interrupts] in
adaptive/interrupts.py): the KeyboardInterrupt comes at the user's line, after the recorded
ops are done, and every tensor keeps the value plain eager gives it."""
import signal
import time

import pytest
import torch

import neuron_eager
from neuron_eager.adaptive import recording

NEURON = "neuron"


def _accumulate(acc, x):
    acc.add_((x * 0.5).exp())
    acc.mul_(0.5)


def _interrupting(monkeypatch, name):
    """recording.<name>, sending a SIGINT (Ctrl-C) before it runs, once."""
    function = getattr(recording, name)

    def run(*args, **kwargs):
        monkeypatch.setattr(recording, name, function)
        signal.raise_signal(signal.SIGINT)  # (Python's handler runs at the next bytecode)
        return function(*args, **kwargs)

    monkeypatch.setattr(recording, name, run)


def _wait_for_the_interrupt():
    """The held interrupt comes once the recorder's lock is free, from another thread: it
    lands a moment later, as a Ctrl-C does."""
    for _ in range(5000):
        time.sleep(0.001)


@pytest.mark.parametrize("where", ["run_region", "_add_node"])
def test_ctrl_c_waits_until_what_was_recorded_is_consistent(where, monkeypatch):
    """Interrupted in a flush (a kernel's compile) or while recording an in-place op, the
    accumulator still ends with every update its lines made (they broke it, or lost one)."""
    x = torch.linspace(-1, 1, 12, device=NEURON)
    expected = torch.zeros(12, device=NEURON)
    for _ in range(2):
        _accumulate(expected, x)
    expected = expected.add_(1.0).cpu()
    with neuron_eager.adaptive_eager():
        acc = torch.zeros(12, device=NEURON)
        _accumulate(acc, x)
        acc.sum().item()
        _accumulate(acc, x)
        _interrupting(monkeypatch, where)
        with pytest.raises(KeyboardInterrupt):
            if where == "run_region":
                acc.sum().item()  # the flush is interrupted
            else:
                acc.add_(1.0)  # its recording is interrupted: the KeyboardInterrupt comes after
            _wait_for_the_interrupt()
        if where == "run_region":
            acc.add_(1.0)
        assert torch.equal(acc.cpu(), expected)
        assert torch.equal((acc * 2).cpu(), expected * 2)  # and it still computes


def test_ctrl_c_elsewhere_interrupts_at_once():
    with neuron_eager.adaptive_eager(), pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


_PLAIN_EAGER_INTERRUPT = r"""
import signal, time
import torch, neuron_eager
from neuron_eager.adaptive import interrupts
from neuron_eager.device_sim import core
assert signal.getsignal(signal.SIGINT) is interrupts._handler  # at import, adaptive eager off
x = torch.ones(1000, device="neuron")
(x + 1).sum().item()
base = torch.neuron.memory_allocated()
malloc = core.hbm.malloc

def interrupted_malloc(*args):  # a Ctrl-C in the allocator's bookkeeping
    core.hbm.malloc = malloc
    signal.raise_signal(signal.SIGINT)
    return malloc(*args)

core.hbm.malloc = interrupted_malloc
try:
    y = x * 3
    for _ in range(5000):
        time.sleep(0.001)
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted after the op", torch.equal(y.cpu(), torch.full((1000,), 3.0)))
del y
print("allocated back", torch.neuron.memory_allocated() == base)
"""


def test_ctrl_c_in_plain_eager_waits_for_the_op():
    # plain eager (the default) held no interrupt: one in the allocator could leave HBM
    # counted as allocated, or be swallowed in a storage's finalizer
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _PLAIN_EAGER_INTERRUPT], capture_output=True,
                         text=True, timeout=300)
    assert run.stdout.split("\n")[:2] == ["interrupted after the op True", "allocated back True"
                                          ], run.stdout + run.stderr
