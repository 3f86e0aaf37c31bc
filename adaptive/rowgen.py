"""Row kernels: a region's elementwise ops fused with sum/mean/amax over trailing dims.

Every array of a row group is seen as a 2-D (rows, cols) view (broadcast dims stride 0).
Nodes have a role: "full" (one value per element), "row" (one per row: a keepdim
reduction result and what is computed from it) or "red" (a reduction). Each row is walked
in passes: pass p computes the full nodes that need the reductions finished in pass p - 1
(recomputing cheaper earlier full values instead of storing them: Note [Passes]). Sums
accumulate in blocks of reduction.BLOCK exactly as the eager sum kernel does, and amax
keeps the first NaN, so the bits are those of plain eager (Note [Bit-identical fusion]).
When a pass computes transcendentals, reduced values go to a row buffer first: the column
loop stays free of carried dependencies (vectorizable) and the ordered sum runs over the
buffer in L1; plain arithmetic passes reduce as they go.
"""
from __future__ import annotations

from neuron_eager.ops import reduction

# Note [Passes]
# A hand-written softmax `e = (x - x.amax(-1, keepdim=True)).exp(); e / e.sum(-1, keepdim=True)`
# is one row group: pass 0 finds the max, pass 1 computes e and sums it, pass 2 computes e
# again and divides. The row (a few KB) stays in cache between passes, so HBM sees x read
# once and the result written once, where plain eager moves five tensors.

BLOCK = reduction.BLOCK


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
    n_scalars); each node is (role, op, operands, compute, out_code) where `op` is an
    Elementwise for "full"/"row" nodes and "sum"/"mean"/"amax" for "red" nodes; operands
    as in codegen.source; arrays are 2-D (rows, cols) views."""
    _, nodes, stores, n_out, n_in, n_scalars = spec
    names = [f"o{k}" for k in range(n_out)] + [f"a{k}" for k in range(n_in)] + \
        [f"s{k}" for k in range(n_scalars)]
    recipes: dict = {}
    store_of = {j: k for j, k in stores}
    passes, avail = schedule(nodes)
    lines = [f"def kernel({', '.join(names)}):",
             "    rows, cols = o0.shape[0], o0.shape[1]"]
    lines += [f"    buf{j} = np.empty(cols, np.float32)"
              for j, node in enumerate(nodes) if node[0] == "red"]
    lines.append("    for r in range(rows):")

    def value(j, pad, col):
        role, op, operands, compute, out_code = nodes[j]
        recipes[f"st{j}"] = ("storer", out_code)
        args = []
        for i, (kind, ref, *code) in enumerate(operands):
            if kind == "s":
                args.append(f"s{ref}")
                continue
            recipes[f"l{j}_{i}"] = ("loader", code[0], compute)
            arg = {"v": f"v{ref}", "a": f"a{ref}[r, {col}]", "t": f"s{ref}"}[kind]
            args.append(f"l{j}_{i}({arg})")
        recipes[f"f{j}"] = ("op", op.name)
        return f"{pad}v{j} = st{j}(f{j}({', '.join(args)}))"

    last = max(avail, default=0)
    for p in range(last + 1):
        for j, node in enumerate(nodes):
            if node[0] == "row" and avail[j] == p:
                lines.append(value(j, " " * 8, "0"))
                if j in store_of:
                    lines.append(f"        o{store_of[j]}[r, 0] = v{j}")
        reds = [j for j, node in enumerate(nodes) if node[0] == "red" and passes[j] == p]
        here = [j for j, node in enumerate(nodes) if node[0] == "full" and passes[j] == p]
        if not reds and not here:
            continue
        needed = set(here)
        for j in reversed(range(len(nodes))):  # full values these read, recomputed here
            if j in needed or j in reds:
                for kind, ref, *_ in nodes[j][2]:
                    if kind == "v" and nodes[ref][0] == "full":
                        needed.add(ref)
        # transcendentals are worth vectorizing: their reductions go through a row buffer
        buffered = any(nodes[j][1].engine == "scalar" for j in needed)
        if not buffered:
            for j in reds:
                lines += _red_init(j, nodes[j][1])
        lines.append("        for c in range(cols):")
        for j in sorted(needed):
            lines.append(value(j, " " * 12, "c"))
            if j in store_of and passes[j] == p:
                lines.append(f"            o{store_of[j]}[r, c] = v{j}")
        for j in reds:
            lines += _red_step(j, nodes[j], recipes, buffered)
        for j in reds:
            lines += _red_end(j, nodes[j][1]) if buffered else \
                _red_end_streamed(j, nodes[j][1])
            if j in store_of:
                lines.append(f"        o{store_of[j]}[r, 0] = v{j}")
            recipes[f"st{j}"] = ("storer", nodes[j][4])
    return "\n".join(lines) + "\n", recipes


def _red_init(j, name) -> list[str]:
    """Before a streaming column loop: the reduction's running state."""
    if name == "amax":
        return [f"        m{j} = np.float32(0.0)", f"        d{j} = False"]
    return [f"        t{j} = np.float32(0.0)", f"        part{j} = np.float32(0.0)"]


def _red_step(j, node, recipes, buffered: bool) -> list[str]:
    """Inside the column loop. Buffered: the value goes to the row buffer (no carried
    dependency: LLVM vectorizes the loop; the ordered reduction runs after). Streaming:
    the eager kernel's order right here (cheaper when the loop is plain arithmetic)."""
    _, name, operands, compute, _ = node
    kind, ref, code = operands[0]
    recipes[f"l{j}_0"] = ("loader", code, compute)
    arg = f"v{ref}" if kind == "v" else f"a{ref}[r, c]"
    pad = " " * 12
    if buffered:
        return [f"{pad}buf{j}[c] = l{j}_0({arg})"]
    if name == "amax":  # the first element, then the first NaN wins
        return [f"{pad}x{j} = l{j}_0({arg})",
                f"{pad}if c == 0:",
                f"{pad}    m{j} = x{j}",
                f"{pad}    d{j} = x{j} != x{j}",
                f"{pad}elif not d{j}:",
                f"{pad}    if x{j} != x{j}:",
                f"{pad}        m{j} = x{j}",
                f"{pad}        d{j} = True",
                f"{pad}    elif x{j} > m{j}:",
                f"{pad}        m{j} = x{j}"]
    return [f"{pad}part{j} += l{j}_0({arg})",
            f"{pad}if c % {BLOCK} == {BLOCK - 1}:",
            f"{pad}    t{j} += part{j}",
            f"{pad}    part{j} = np.float32(0.0)"]


def _red_end_streamed(j, name) -> list[str]:
    if name == "amax":
        return [f"        v{j} = st{j}(m{j})"]
    return [f"        if cols % {BLOCK} != 0:", f"            t{j} += part{j}"] + \
        _sum_result(j, name)


def _red_end(j, name) -> list[str]:
    """After the column loop: the eager kernel's exact order over the row buffer (blocks of
    BLOCK summed in order for sum/mean; the first element, then the first NaN, for amax)."""
    if name == "amax":
        return [f"        m{j} = buf{j}[0]",
                f"        if m{j} == m{j}:",
                "            for i in range(1, cols):",
                f"                x{j} = buf{j}[i]",
                f"                if x{j} != x{j}:",
                f"                    m{j} = x{j}",
                "                    break",
                f"                if x{j} > m{j}:",
                f"                    m{j} = x{j}",
                f"        v{j} = st{j}(m{j})"]
    return [f"        t{j} = np.float32(0.0)",
            f"        for start in range(0, cols, {BLOCK}):",
            f"            part{j} = np.float32(0.0)",
            f"            for i in range(start, min(start + {BLOCK}, cols)):",
            f"                part{j} += buf{j}[i]",
            f"            t{j} += part{j}"] + _sum_result(j, name)


def _sum_result(j, name) -> list[str]:
    """The stored sum or mean of row total t{j}, as the eager kernel rounds it."""
    if name == "mean":
        return [f"        v{j} = st{j}(t{j} / np.float32(cols))"]
    return [f"        v{j} = st{j}(t{j})"]
