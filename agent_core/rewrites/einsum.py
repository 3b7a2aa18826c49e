"""einsum written out as the ops torch runs for it: permutes, reshapes, bmm, mul and sum.

Why: run as a library call, torch.einsum is one opaque node. Inside it torch aligns the operands,
copies each into a bmm's [batch, rows, k] layout, multiplies pairs left to right (or along
opt_einsum's path where torch has it), and returns a permuted view that a generated consumer must
copy again to read. Written out, the planner sees the products: a pairwise product with nothing
summed is a pointwise `mul` that fuses with its neighbours (Mamba2's C B^T times exp(segsum) then
needs neither L nor the product in memory twice), the copies fold into the kernels around them, and
operands that are parameters fold once (fold_constants). The estimate also stops counting the naive
product of every index (2 x 2048 x 2 x 64 x 64 x 8 x 16 x 64 FLOPs for Mamba2's diagonal block, 275
GFLOP, 5.4 ms at the roofline) and counts the bmm's torch runs (21 GFLOP).

The steps are taken from torch itself: torch.einsum runs on meta tensors of the operands' shapes and
every aten op it issues is recorded. So the pairs, their order, which operand of each bmm is left and
which dims it batches, sums and keeps are torch's, and each bmm sums the same products in the same
order as the einsum it replaces. That matters beyond style: a program like Mamba2's scan (exp of
running sums of 64 normals, products up to 1e15 that cancel) is so ill-conditioned that even the
exact result is hundreds of times atol = rtol = 1e-4 away from torch's float32 one; only the same
grouping of products passes. An einsum whose recording has an op outside the few below (a diagonal
for a repeated label, an empty operand) is left to torch, as is a 2-operand einsum that is one plain
(batched) a @ b or a @ b^T (one bmm on views already: nothing to gain, and raise_attention reads
that form).
"""
from __future__ import annotations

from ..ir import Program
from ..ops.einsum_plan import Unsupported, plan_flops, torch_steps
from .edits import Rewrite
from .raise_attention import _einsum_form


def lower_einsum(program: Program, nid: str) -> Rewrite | None:
    """The rule: an einsum of float32 operands as torch's own steps (module docstring)."""
    n = program.nodes[nid]
    if n.op != "einsum" or len(n.outputs) != 1 or any(v is None for v in n.inputs):
        return None
    eq = n.attrs["equation"]
    if len(n.inputs) == 2 and _einsum_form(eq) is not None:
        return None
    vals = program.values
    if any(vals[v].dtype != "float32" for v in n.inputs):
        return None
    try:
        steps, operands, result = torch_steps(eq, [tuple(vals[v].shape) for v in n.inputs])
    except Unsupported:
        return None
    if not any(op in ("bmm", "mul") for op, *_ in steps):
        return None          # one operand summed or permuted: nothing torch does differently
    out = n.outputs[0]
    if tuple(result.shape) != tuple(vals[out].shape):
        return None
    bmms = [(tuple(ins[0].shape), tuple(ins[1].shape)) for op, ins, _, _ in steps if op == "bmm"]
    muls = sum(op == "mul" for op, *_ in steps)
    sums = sum(op == "sum" for op, *_ in steps)

    def build(p):
        held = list(operands)                 # keeps the recorded tensors alive, so ids stay unique
        env = {id(t): v for t, v in zip(operands, n.inputs)}
        source = {}                           # a reshape we added -> the value it reshapes
        for op, ins, attrs, t in steps:
            held.append(t)
            srcs = [env[id(x)] for x in ins]
            if op == "same":
                env[id(t)] = srcs[0]
                continue
            if op == "reshape":
                base = source.get(srcs[0], srcs[0])       # a chain of reshapes is one reshape
                if tuple(p.values[base].shape) == tuple(t.shape):
                    env[id(t)] = base
                    continue
                v = p.add_node("reshape", [base], attrs).outputs[0]
                source[v] = base
                env[id(t)] = v
                continue
            if op == "permute" and attrs["dims"] == list(range(len(attrs["dims"]))):
                env[id(t)] = srcs[0]
                continue
            env[id(t)] = p.add_node(op, srcs, attrs).outputs[0]
        v = env[id(result)]
        if v in n.inputs:      # the result is an operand relabelled: give it a node of its own
            v = p.add_node("reshape", [v], {"shape": list(result.shape)}).outputs[0]
        return {out: v}

    pieces = []
    if bmms:
        desc = ", ".join(f"[{a[0]}, {a[1]}, {a[2]}] @ [{b[1]}, {b[2]}]" for a, b in bmms)
        pieces.append(f"{len(bmms)} bmm{'s' if len(bmms) > 1 else ''} ({desc})")
    if muls:
        pieces.append(f"{muls} elementwise product{'s' if muls > 1 else ''}")
    if sums:
        pieces.append(f"{sums} sum{'s' if sums > 1 else ''}")
    naive = program.node_flops(nid)
    ours = plan_flops(eq, [tuple(vals[v].shape) for v in n.inputs]) or 0
    flops = (f" ({_g(ours)} FLOPs, not the {_g(naive)} of every index at once)" if naive > 2 * ours
             else "")
    return Rewrite("lower_einsum", f"{n.name} (einsum '{eq}') written out as torch runs it: "
                   f"{' and '.join(pieces)}{flops}, with the permutes and reshapes between them, so the "
                   "products and copies fuse with the kernels around them and each bmm sums what torch's "
                   "does, in its order.", build, nid)


def _g(flops: int) -> str:
    return f"{flops / 1e9:.3g} G" if flops >= 1e8 else f"{flops:,}"


