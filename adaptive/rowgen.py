"""Row kernels: a region's elementwise ops fused with sum/mean/amax over trailing dims.

Every array of a row group is seen as a 2-D (rows, cols) view (broadcast dims stride 0).
Nodes have a role: "full" (one value per element), "row" (one per row: a keepdim
reduction result and what is computed from it) or "red" (a reduction). Each row is walked
in passes: pass p computes the full nodes that need the reductions finished in pass p - 1
(recomputing cheaper earlier full values instead of storing them: Note [Passes]). Sums
add in the eager sum kernel's order (Note [Sum order] in ops/numerics.py), and amax keeps
the first NaN, so the bits are those of plain eager (Note [Bit-identical fusion]). When a
pass computes transcendentals, reduced values go to a row buffer first and the sum runs
over the buffer in L1; plain arithmetic passes add each value to its lane as they go.
"""
from __future__ import annotations

import torch

from neuron_eager.ops import numerics
from neuron_eager.ops import tensor as T

# Note [Passes]
# A hand-written softmax `e = (x - x.amax(-1, keepdim=True)).exp(); e / e.sum(-1, keepdim=True)`
# is one row group: pass 0 finds the max, pass 1 computes e and sums it, pass 2 computes e
# again and divides. The row (a few KB) stays in cache between passes, so HBM sees x read
# once and the result written once, where plain eager moves five tensors.

SUM_BLOCK, SUM_LANES, SUM_QUAD = numerics.SUM_BLOCK, numerics.SUM_LANES, numerics.SUM_QUAD


def schedule(nodes) -> tuple[list[int], list[int]]:
    """(pass, avail) per node: the pass a full node or reduction runs in, and the pass from
    which its value can be read (a reduction's value after its pass ends)."""
    passes, avail = [0] * len(nodes), [0] * len(nodes)
    for j, (role, _, operands, _, _) in enumerate(nodes):
        deps = [avail[ref] for kind, ref, *_ in operands if kind == "v"]
        start = max(deps, default=0)
        passes[j] = start
        avail[j] = start + 1 if role == "red" else start
    return passes, avail


def source(spec) -> tuple[str, dict]:
    """Kernel source and recipes for a row group `spec`: ("r", nodes, stores, n_out, n_in,
    n_scalars, kinds); each node is (role, op, operands, compute, out_code) where
    `op` is an Elementwise for "full"/"row" nodes and "sum"/"mean"/"amax" for "red" nodes;
    operands as in codegen.source; arrays are 2-D (rows, cols) views, but inputs of kind
    "col" (one value per column, the same for every row) are their 1-D vectors."""
    _, nodes, stores, n_out, n_in, n_scalars, kinds = spec
    names = [f"o{k}" for k in range(n_out)] + [f"a{k}" for k in range(n_in)] + \
        [f"s{k}" for k in range(n_scalars)]
    recipes: dict = {}
    store_of = {j: k for j, k in stores}
    passes, avail = schedule(nodes)
    lines = [f"def kernel({', '.join(names)}):",
             "    rows, cols = o0.shape[0], o0.shape[1]"]
    lines += [f"    buf{j} = np.empty(cols, np.float32)"
              for j, node in enumerate(nodes) if node[0] == "red"]
    lines += [f"    ln{j} = np.empty({SUM_LANES}, np.float32)"
              for j, node in enumerate(nodes) if node[0] == "red" and node[1] != "amax"]
    lines.append("    for r in range(rows):")

    # fp16 element values held as their fp32 values (Note [fp16 values stay fp32] in codegen)
    held = {j for j, node in enumerate(nodes) if node[0] != "red" and node[4] == "f16"}

    def local(ref):
        """The local holding node ref's value."""
        return f"v{ref}"

    def stored(j):
        """Node j's local as its output array stores it."""
        if j in held:
            recipes[f"e{j}"] = ("storer", "f16")
            return f"e{j}({local(j)})"
        return local(j)

    def element(ref, col):
        return f"a{ref}[{col}]" if kinds[ref] == "col" else f"a{ref}[r, {col}]"

    def value(j, pad, col):
        role, op, operands, compute, out_code = nodes[j]
        recipes[f"st{j}"] = ("rounder", "f16") if j in held else ("storer", out_code)
        args = []
        for i, (kind, ref, *code) in enumerate(operands):
            if kind == "s":
                args.append(f"s{ref}")
                continue
            load = "f32" if kind == "v" and ref in held else code[0]
            recipes[f"l{j}_{i}"] = ("loader", load, compute)
            if kind == "v":
                arg = local(ref)
            else:
                arg = element(ref, col) if kind == "a" else f"s{ref}"
            args.append(f"l{j}_{i}({arg})")
        recipes[f"f{j}"] = ("op", op.name)
        return f"{pad}{local(j)} = st{j}(f{j}({', '.join(args)}))"

    last = max(avail, default=0)
    work = []  # per pass: (pass, reductions, values computed, values read from a keep buffer)
    for p in range(last + 1):
        reds = [j for j, node in enumerate(nodes) if node[0] == "red" and passes[j] == p]
        here = [j for j, node in enumerate(nodes) if node[0] == "full" and passes[j] == p]
        needed, reused = set(here), set()
        for j in reversed(range(len(nodes))):  # full values these read, recomputed here...
            if j in needed and passes[j] < p and nodes[j][1].engine == "scalar":
                reused.add(j)  # ...unless a transcendental: kept (Note [Keep buffers])
                continue
            if j in needed or j in reds:
                for kind, ref, *_ in nodes[j][2]:
                    if kind == "v" and nodes[ref][0] == "full":
                        needed.add(ref)
        work.append((p, reds, here, needed, reused))
    kept = set().union(*(reused for *_, reused in work))
    lines[2:2] = [f"    keep{j} = np.empty(cols, "
                  f"{'np.float32' if j in held else _np_type(nodes[j][4])})" for j in sorted(kept)]
    for p, reds, here, needed, reused in work:
        for j, node in enumerate(nodes):
            if node[0] == "row" and avail[j] == p:
                lines.append(value(j, " " * 8, "0"))
                if j in store_of:
                    lines.append(f"        o{store_of[j]}[r, 0] = {stored(j)}")
        if not reds and not here:
            continue
        # transcendentals are worth vectorizing: their reductions go through a row buffer
        buffered = any(nodes[j][1].engine == "scalar" for j in needed - reused)
        streamed = [] if buffered else [j for j in reds if nodes[j][1] != "amax"]

        def column(pad, col, lane):
            out = []
            for j in sorted(needed):
                if j in reused:
                    out.append(f"{pad}v{j} = keep{j}[{col}]")
                    continue
                out.append(value(j, pad, col))
                if j in kept and passes[j] == p:
                    out.append(f"{pad}keep{j}[{col}] = v{j}")
                if j in store_of and passes[j] == p:
                    out.append(f"{pad}o{store_of[j]}[r, {col}] = {stored(j)}")
            for j in reds:
                out.append(_red_step(j, nodes[j], recipes, j not in streamed, local, element,
                                     pad, col, lane, held))
            return out

        if not streamed:
            lines.append("        for c in range(cols):")
            lines += column(" " * 12, "c", "")
        else:
            lines += _streamed_loops(streamed, column, recipes)
        for j in reds:
            lines += _sum_result(j, nodes[j][1]) if j in streamed else \
                _red_end(j, nodes[j][1], recipes)
            if j in store_of:
                lines.append(f"        o{store_of[j]}[r, 0] = v{j}")
            recipes[f"st{j}"] = ("storer", nodes[j][4])
    return "\n".join(lines) + "\n", recipes


# Note [Keep buffers]
# A later pass needs the values of an earlier one again (softmax divides the exponentials
# it summed). Plain arithmetic is recomputed from the row, which is still in cache; a
# transcendental (exp, tanh, ...) costs more than a load, so the pass that computes it also
# writes it, in its stored form, to a row buffer that later passes read.
def _np_type(out_code: str) -> str:
    """The NumPy type of a value stored with `out_code` (a float's storage format)."""
    dtype = next(d for d, code in numerics.CODE.items() if code == out_code)
    return "np.bool_" if dtype == torch.bool else f"np.{T.STORAGE_DTYPE[dtype].name}"


def _red_step(j, node, recipes, buffered: bool, local, element, pad: str, col: str,
              lane: str | None, held: set) -> str:
    """Inside a column loop. Buffered: the value goes to the row buffer (no carried
    dependency: LLVM vectorizes the loop; the ordered reduction runs after). Streamed (sums
    in plain-arithmetic passes): added to its lane (Note [Sum order] in ops/numerics.py);
    `lane` is then the lane's index."""
    _, name, operands, compute, _ = node
    kind, ref, code = operands[0]
    recipes[f"l{j}_0"] = ("loader", "f32" if kind == "v" and ref in held else code, compute)
    arg = local(ref) if kind == "v" else element(ref, col)
    if buffered:
        return f"{pad}buf{j}[{col}] = l{j}_0({arg})"
    if lane is None:  # (a lane held in a register: _streamed_loops)
        return f"{pad}acc{j} += l{j}_0({arg})"
    return f"{pad}ln{j}[{lane}] += l{j}_0({arg})"


def _streamed_loops(streamed: list, column, recipes) -> list[str]:
    """A streamed pass's loops, in the lanes of Note [Sum order] (ops/numerics.py): whole
    groups of SUM_LANES columns, one column per lane, then the rest of the block; the lanes
    are folded at the end of each block. `column(pad, col, lane)` gives the lines for one
    column, or with lane None, for one column of four added in turn to a lane's register.
    (The lane loop runs to `width`, read from an array: a constant trip count would be
    unrolled, and the unrolled lanes not vectorized.)"""
    recipes["fold_lanes"] = ("row", "fold_lanes")
    lines = [f"        t{j} = np.float32(0.0)" for j in streamed]
    lines += [f"        width = ln{streamed[0]}.size",
              f"        for b0 in range(0, cols, {SUM_BLOCK}):",
              f"            end = min(b0 + {SUM_BLOCK}, cols)",
              "            for q in range(width):"]
    lines += [f"                ln{j}[q] = np.float32(0.0)" for j in streamed]
    lines += [f"            whole = b0 + (end - b0) // {SUM_LANES} * {SUM_LANES}",
              f"            quads = b0 + (end - b0) // {SUM_QUAD} * {SUM_QUAD}",
              f"            for c0 in range(b0, quads, {SUM_QUAD}):",
              "                for q in range(width):"]
    # four lane groups a pass, each lane in a register (Note [Lanes in registers])
    lines += [f"                    acc{j} = ln{j}[q]" for j in streamed]
    for k in range(SUM_QUAD // SUM_LANES):
        lines += column(" " * 20, f"np.uint64(c0) + np.uint64({k * SUM_LANES}) + np.uint64(q)",
                        None)
    lines += [f"                    ln{j}[q] = acc{j}" for j in streamed]
    lines += [f"            for c0 in range(quads, whole, {SUM_LANES}):",
              "                for q in range(width):"]
    # column indices unsigned: a signed one may be negative for all LLVM knows, so it would
    # be wrapped around and every load gathered (3x slower than vector loads)
    lines += column(" " * 20, "np.uint64(c0) + np.uint64(q)", "q")
    lines.append("            for c in range(whole, end):")
    lines += column(" " * 16, "np.uint64(c)", "c - whole")
    lines += [f"            t{j} += fold_lanes(ln{j}, min(end - b0, {SUM_LANES}))"
              for j in streamed]
    return lines


def _red_end(j, name, recipes) -> list[str]:
    """After the column loop, over the row buffer: sums in the eager kernel's order (Note
    [Sum order] in ops/numerics.py); amax as Note [Amax by keys] there."""
    if name == "amax":
        recipes["row_max"] = ("row", "row_max")
        return [f"        v{j} = st{j}(row_max(buf{j}, cols))"]
    recipes["lane_sum"] = ("row", "lane_sum")
    return [f"        t{j} = lane_sum(buf{j}, cols, ln{j})"] + _sum_result(j, name)


def _sum_result(j, name) -> list[str]:
    """The stored sum or mean of row total t{j}, as the eager kernel rounds it."""
    if name == "mean":
        return [f"        v{j} = st{j}(t{j} / np.float32(cols))"]
    return [f"        v{j} = st{j}(t{j})"]
