"""torch.save of neuron tensors: while a save runs, each memory is copied to the host once
and its tensors pickle as views of that copy (NeuronTensor.__reduce_ex__ in tensor.py)."""
from __future__ import annotations

import threading

# Note [Saving storages]
# CUDA's torch.save writes each storage once, tagged "cuda:0", with its tensors as views
# into it, so tensors that share memory (tied weights, a parameter and its view) load
# sharing it again. Inside torch.save (neuron_eager.serialization wraps it), a neuron
# tensor pickles the same way: a CPU copy of its whole memory, made once per save and
# tagged "neuron:0", and its own offset, size and stride; torch.load then moves each
# storage to neuron once (Note [Loading onto neuron]). Outside torch.save (pickle,
# multiprocessing) each tensor still travels as its own CPU copy.
state = threading.local()  # .storages: id(memory) -> (host copy, memory); .tagged; .depth


def begin_save() -> None:
    """Start a torch.save: storages copied from here on are shared (nested saves too)."""
    if getattr(state, "depth", 0) == 0:
        state.storages, state.tagged = {}, set()
    state.depth = getattr(state, "depth", 0) + 1


def end_save() -> None:
    state.depth -= 1
    if state.depth == 0:
        state.storages = state.tagged = None


def saved_here(storage) -> bool:
    """Whether `storage` (a CPU storage) is a neuron memory copied by the current save."""
    tagged = getattr(state, "tagged", None)
    return tagged is not None and storage._cdata in tagged
