"""Batches: small groups (the same kernel on tensors of different shapes, or other kernels)
run as one launch (fusion.py, Note [Batches]), with the bits of plain eager."""
import pytest
import torch

from neuron_eager import adaptive
from neuron_eager.adaptive import fusion
from neuron_eager.device_sim import core

N = torch.device("neuron")
SHAPES = [(16, 8), (8,), (3, 5, 7), (40,)]


@pytest.fixture(autouse=True)
def _plain_after():
    adaptive.reset_stats()
    yield
    adaptive.disable()


def tensors(seed: int, shapes=SHAPES) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(N) for s in shapes]


def bits(ts) -> list[torch.Tensor]:
    return [t.detach().cpu().view(torch.int16 if t.element_size() == 2 else torch.int32)
            for t in ts]


def adam_like(params, grads, moms, lr):
    """One in-place update chain per parameter, as a hand-written optimizer issues it."""
    for p, g, m in zip(params, grads, moms):
        m.mul_(0.9).add_(g, alpha=0.1)
        p.addcdiv_(m, (m * m).sqrt_().add_(1e-8), value=-lr)


def run(adaptive_on: bool, steps: int = 4) -> tuple[list, list]:
    params, grads, moms = tensors(0), tensors(1), [torch.zeros(s, device=N) for s in SHAPES]
    launches = []
    with adaptive.adaptive_eager(adaptive_on):
        for k in range(steps):
            before = core.kernels_launched
            adam_like(params, grads, moms, lr=0.01 * (k + 1))  # a new lr: no new kernel
            torch.neuron.synchronize()
            launches.append(core.kernels_launched - before)
    return bits(params + moms), launches


def test_one_launch_for_all_parameters_same_bits():
    expected, plain = run(False)
    got, launches = run(True)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert plain[0] == 6 * len(SHAPES)  # mul_, add_, mul, sqrt_, add_, addcdiv_ per tensor
    assert launches[-1] == 1  # compiled by the second sighting: one batch kernel
    history = adaptive.explain(1)
    assert f"one launch for {len(SHAPES)} groups" in history


def test_a_batch_whose_kernels_do_not_compile_runs_each_member_once(monkeypatch):
    # members run op by op in turn; the head's own ops only (its all_nodes() are the whole
    # batch's: the later members' in-place updates were applied twice)
    from neuron_eager.adaptive import codegen

    expected, _ = run(False)
    monkeypatch.setattr(fusion, "_plans", {})
    monkeypatch.setattr(codegen, "kernel_for", lambda *args: (codegen.FAILED, False))
    got, _ = run(True)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert "the kernel did not compile" in adaptive.explain(1)


def test_groups_of_different_kernels_share_one_launch():
    """Parameters with and without weight decay, a bf16 one and a row group (a sum of
    squares per row): four kinds of loop, one launch, the bits of plain eager."""
    def step(params, grads, moms, rows, lr):
        for k, (p, g, m) in enumerate(zip(params, grads, moms)):
            if k % 2:
                p.mul_(1 - lr * 0.01)  # weight decay on every other parameter
            m.mul_(0.9).add_(g, alpha=0.1)
            p.addcdiv_(m, (m * m).sqrt_().add_(1e-8), value=-lr)
        return (rows * rows).sum(-1, keepdim=True)

    def run(on):
        params, grads = tensors(3), tensors(4)
        params[2], grads[2] = params[2].bfloat16(), grads[2].bfloat16()
        moms = [torch.zeros_like(p) for p in params]
        rows = tensors(5, [(5, 6)])[0]
        with adaptive.adaptive_eager(on):
            for k in range(3):
                before = core.kernels_launched
                norms = step(params, grads, moms, rows, lr=0.01 * (k + 1))
                torch.neuron.synchronize()
                launches = core.kernels_launched - before
        return bits(params + moms + [norms]), launches

    expected, _ = run(False)
    got, launches = run(True)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert launches == 1
    assert "one launch for 5 groups" in adaptive.explain(1)


def test_batchable_groups_around_other_groups_same_bits():
    """Groups of one spec with other groups between them (one reading a row group's
    result): the bits of plain eager whichever way they are batched."""
    def program():
        x, y, z = tensors(2, [(32,), (8, 4), (32,)])
        a = (x * 2).exp() + 1  # group 0 (spec S)
        mid = (y.sum(-1, keepdim=True) * y).flatten()  # a row group of another spec
        c = (z * mid).exp() + 1  # spec S again... but it reads `mid`
        return [a, mid, c]

    adaptive.disable()
    expected = bits(program())
    with adaptive.adaptive_eager():
        for _ in range(3):
            got = bits(program())
            assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_may_move_rules():
    """Unit check of the rule on a hand-made region: reading a value computed in between,
    or writing memory read in between, keeps a group in place."""
    class Node:
        def __init__(self, refs, target=None):
            self.refs, self.target = refs, target

    nodes = [Node([("i", 0)]), Node([("i", 1)]), Node([("n", 1)]), Node([("i", 2)], target=0)]
    first, between, reader, writer = (fusion.Group(j, (4,)) for j in range(4))
    assert fusion._may_move(nodes, first, [between])
    assert not fusion._may_move(nodes, reader, [between])  # reads node 1, made in between
    assert not fusion._may_move(nodes, writer, [first])  # writes input 0, which node 0 reads


def test_in_place_chains_read_through_their_outputs():
    # the fused loop reads each updated tensor through the output it writes (Note [In-place
    # loops] in ops/kernelgen.py: separate arrays on one memory keep LLVM from vectorising),
    # and gives plain eager's bits
    shapes = [(300, 1000)]  # large: one group of its own, not a batch
    results = {}
    for on in (False, True):
        params, grads = tensors(0, shapes), tensors(1, shapes)
        moms = [torch.zeros(s, device=N) for s in shapes]
        adaptive.enable() if on else adaptive.disable()
        for _ in range(3):
            adam_like(params, grads, moms, 1e-3)
            torch.neuron.synchronize()
        results[on] = bits(params + moms)
    adaptive.disable()
    assert all(torch.equal(a, b) for a, b in zip(results[False], results[True]))
    plan = fusion.history[-1][2]
    (group,) = [g for g in plan.groups if g.spec is not None]
    aliases = dict(group.spec[6])
    assert len(aliases) == 2  # p and m are read through o-arrays; g is a separate input
    assert len(group.aliased) == 2
