"""What adaptive eager records: the policy's knobs (Options), one recorded op (Node) and the
ops recorded since the last flush with the tensors they read (Region)."""
from __future__ import annotations

from dataclasses import dataclass

from neuron_eager.ops import foreach
from neuron_eager.ops import tensor as T

NeuronTensor = T.NeuronTensor


@dataclass
class Options:
    """The adaptive policy's knobs (change at run time: `adaptive.options.max_ops = 64`)."""

    compile_after: int = 2  # sightings of a region before it runs as fused kernels
    max_ops: int = 256  # a region this long is flushed (the buffer limit)
    alone_skip: int = 8  # eager sightings of an op that ran alone (Note [Ops that run alone]
                      # in recording.py)

    @property
    def foreach_record_min(self) -> int:
        """Elements per tensor (on average) from which a foreach op's per-tensor steps are
        recorded and fused instead of run as one multi-tensor launch; 0 records them all
        (Note [Foreach in adaptive eager] in ops/foreach.py)."""
        return foreach.RECORD_MIN

    @foreach_record_min.setter
    def foreach_record_min(self, elements: int) -> None:
        if isinstance(elements, bool) or not isinstance(elements, int) or elements < 0:
            raise ValueError(f"foreach_record_min must be an int >= 0, got {elements!r}")
        foreach.RECORD_MIN = elements

    def __setattr__(self, name: str, value) -> None:
        # (as neuron_eager.config: a typo or a value the policy cannot use is refused here,
        # not met at the next flush or silently ignored)
        least = _LEAST.get(name)
        if least is None and name != "foreach_record_min":
            raise AttributeError(f"adaptive.options has no setting {name!r}; the settings are "
                                 f"{', '.join(sorted([*_LEAST, 'foreach_record_min']))}")
        if least is not None and (isinstance(value, bool) or not isinstance(value, int) or
                                  value < least):
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return (f"Options(compile_after={self.compile_after}, max_ops={self.max_ops}, "
                f"alone_skip={self.alone_skip}, foreach_record_min={self.foreach_record_min})")


_LEAST = {"compile_after": 1, "max_ops": 1, "alone_skip": 0}  # each setting's smallest value
options = Options()


class Node:
    """One recorded op: what to run (op, operand refs, parameters) and where it came from.

    refs: ("n", j) the result of node j of the region, ("i", m) region input m (a tensor
    with data), ("s", k) scalar k (a Python scalar or CPU 0-dim tensor; `scalars[k]` is it
    cast to the compute type, `raw[k]` as given). `key` is the node's part of the region's
    signature: no scalar values, so a new learning rate is not a new kernel.
    """

    __slots__ = ("index", "op", "refs", "params", "scalars", "raw", "dtype", "compute",
                 "shape", "outs", "where", "site", "key", "region", "error", "runner",
                 "inplace", "target", "views", "stride", "offset", "default_dtype")

    def alive(self) -> bool:
        return alive_count(self.outs) != 0

    def add_view(self, ref) -> None:  # (a tensor seeing this node's memory: _record_inplace)
        if self.views is None:
            self.views = []
        self.views.append(ref)


class Region:
    """The ops recorded since the last flush, in order, and the tensors they read.

    Nodes name their region by its serial number, not by reference: no reference cycle
    keeps tensors alive until the garbage collector runs (Note [No cycles]).
    """

    __slots__ = ("nodes", "inputs", "input_index", "descs", "sigs", "memory", "serial",
                 "carried")
    _count = 0

    def __init__(self):
        Region._count += 1
        self.serial = Region._count
        self.nodes: list[Node] = []
        self.carried = 0  # its first nodes, left pending by a partial flush (Note
        # [Partial flush] in recording.py)
        self.inputs: list[NeuronTensor] = []
        self.input_index: dict[int, int] = {}
        self.descs: list[tuple] = []  # (dtype, shape, stride) per input
        self.sigs: list[tuple] = []  # (dtype, shape) per input: its part of a signature
        self.memory: list[tuple] = []  # (storage, offset) per input, when it was read

    def input(self, t: NeuronTensor) -> int:
        m = self.input_index.get(id(t))
        storage = t.__dict__.get("_storage")  # None: computed by an earlier part of a flush
        if m is None or self.memory[m][0] is not storage:
            # new, or its memory changed since it was read (Note [Inputs are read when
            # recorded]); the region holds the tensor, so its id stays unique
            m = self.input_index[id(t)] = len(self.inputs)
            self.inputs.append(t)
            desc = (t.dtype, t.shape, t.stride())
            self.descs.append(desc)
            self.sigs.append(desc[:2])
            self.memory.append((storage, None if storage is None else t.storage_offset()))
        return m

    def read(self, m: int) -> NeuronTensor:
        """Input m as it was when recorded (Note [Inputs are read when recorded])."""
        t = self.inputs[m]
        storage, offset = self.memory[m]
        if storage is None or (t.__dict__.get("_storage") is storage and
                               t.storage_offset() == offset):
            return t
        dtype, shape, stride = self.descs[m]
        return T.make(storage, shape, stride, offset, dtype)


# Note [Inputs are read when recorded]
# A recorded op reads its inputs' memory as it is at the op, as plain eager would. Writes
# into that memory are ops (recorded, or a flush first), but a tensor can also be given other
# memory without any op: `x.data = y`, torch.utils.swap_tensors (Module.to(dtype) uses both).
# So a region keeps each input's storage and offset from when it was first read; a later read
# of a tensor whose memory changed is a new input, and the flush reads the kept memory.


# Note [No cycles]
# Storage returns to the allocator when its last tensor dies (NeuronStorage.__del__). A
# reference cycle through recorded state would hold inputs and results until the cyclic
# garbage collector runs, at an arbitrary allocation: HBM stays in use longer, and the
# allocator is entered from inside itself. So nodes hold their region's serial number,
# pending tensors hold their node, nodes hold weak references to their results, and a failed
# region keeps its error as text.


def alive_count(refs) -> int:
    """How many tensors behind these weak references are alive."""
    n = 0
    for ref in refs:
        if ref() is not None:
            n += 1
    return n


def move(source: Region, moved: list, target: Region, kept: dict) -> None:
    """Renumber `moved` nodes of `source` into `target`; reads of a node now computed
    elsewhere (`kept`: index -> its pending reference) become reads of a region input."""
    index = {n.index: k for k, n in enumerate(moved)}
    inputs: dict = {}

    def new_input(m):
        if m not in inputs:
            inputs[m] = len(target.inputs)
            target.inputs.append(source.inputs[m])
            target.descs.append(source.descs[m])
            target.sigs.append(source.sigs[m])
            target.memory.append(source.memory[m])
        return inputs[m]

    for k, n in enumerate(moved):
        refs = []
        for kind, ref in n.refs:
            if kind == "n" and ref in index:
                refs.append(("n", index[ref]))
            elif kind == "n":
                refs.append(("i", target.input(kept[ref])))
            elif kind == "i":
                refs.append(("i", new_input(ref)))
            else:
                refs.append((kind, ref))
        n.refs, n.index, n.region = tuple(refs), k, target.serial
        if n.target is not None:
            n.target = new_input(n.target)
        key = n.key
        n.key = (key[0], n.refs) + key[2:7] + (n.target,)
        target.nodes.append(n)
    by_index = {m: key for key, m in source.input_index.items()}
    for m, k in inputs.items():
        if m in by_index:  # later reads of the same tensor find it (not stand-ins)
            target.input_index[by_index[m]] = k
