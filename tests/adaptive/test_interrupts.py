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
