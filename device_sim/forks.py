"""Locks made anew in a child process forked while another thread held them.

Note [Forking with threads]
`os.fork()` copies a lock in the state it had at that moment, but not the thread holding
it: a child forked while another thread ran a neuron op (recording it, allocating HBM,
compiling with Numba) waited forever on that lock (DataLoader workers forked by a process
whose second thread trains). Each lock the simulator takes is registered here and replaced
by a new one in the child, as CPU tensors' code lets a child go on. The state the lock
guarded is whatever the other thread had made of it; CUDA refuses to run in such a child.
"""
from __future__ import annotations

import os
import weakref

_renewals: list = []  # (weak reference to the owner, attribute, factory)


def renew_after_fork(owner, attribute: str, factory) -> None:
    """In a forked child, `owner.attribute = factory()` (while `owner` lives)."""
    if len(_renewals) > 64:
        _renewals[:] = [r for r in _renewals if r[0]() is not None]
    _renewals.append((weakref.ref(owner), attribute, factory))


def _renew() -> None:
    for ref, attribute, factory in _renewals:
        owner = ref()
        if owner is not None:
            setattr(owner, attribute, factory())


os.register_at_fork(after_in_child=_renew)
