"""Two linears of one input whose results meet in one pointwise op, as one linear over both weights.

LLaMA-style MLPs compute silu(x W_gate) * (x W_up) with two projections of the same x. Stacked into
one weight [W_gate; W_up], they are one GEMM that reads x once, and the product becomes a gated unit
over the two halves of its output (chunk(2, -1)), which the planner puts in the GEMM's region and the
tile GEMM computes side by side (codegen/gemm_mma.py). Projections whose results go their own ways (an
attention's q, k and v) are left alone: a consumer that reads one half through a view gains nothing.
"""
from __future__ import annotations

import numpy as np

from ..ir import Program
from .edits import Rewrite, add_param, param_array, single_use
from .edits import node_label as _n

CHAIN = 4     # pointwise ops between a projection and the op where the two meet, at most


def _pointwise_chain(program: Program, vid: str) -> list[str]:
    """The nodes a value flows through while it is read once by a pointwise op: the first is its
    reader, each next one the reader of the one before (CHAIN at most)."""
    from ..codegen.pointwise import is_elementwise
    out = []
    while len(out) < CHAIN and single_use(program, vid):
        reader = program.nodes[program.consumers(vid)[0][0]]
        if not is_elementwise(reader):
            break
        out.append(reader.id)
        vid = reader.outputs[0]
    return out


def _weights(program: Program, node) -> tuple | None:
    """(weight array, bias array or None) of a linear whose weight (and bias) are parameters."""
    w = param_array(program, node.inputs[1])
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    b = param_array(program, bias) if bias else None
    if w is None or w.ndim != 2 or (bias and b is None):
        return None
    return w, b


def merge_gated_linears(program: Program, nid: str) -> Rewrite | None:
    node = program.nodes[nid]
    mine = _weights(program, node) if node.op == "linear" else None
    if mine is None:
        return None
    x, out = node.inputs[0], node.outputs[0]
    chain = _pointwise_chain(program, out)
    for cid, _ in program.consumers(x):
        other = program.nodes[cid]
        theirs = _weights(program, other) if cid != nid and other.op == "linear" else None
        if theirs is None or theirs[0].shape != mine[0].shape or (theirs[1] is None) != (mine[1] is None):
            continue
        meet = next((m for m in chain if m in _pointwise_chain(program, other.outputs[0])), None)
        if meet is None:
            continue
        (wa, ba), (wb, bb), n = mine, theirs, mine[0].shape[0]

        def build(p: Program) -> dict[str, str]:
            w = add_param(p, p.unique_name(f"{node.name}_{other.name}_weight"), np.concatenate([wa, wb]),
                          like=node.inputs[1])
            ins = [x, w] + ([add_param(p, p.unique_name(f"{node.name}_{other.name}_bias"),
                                       np.concatenate([ba, bb]), like=node.inputs[1])] if ba is not None else [])
            y = p.add_node("linear", ins, name=p.unique_name(f"{node.name}_{other.name}")).outputs[0]
            first = p.add_node("slice", [y], {"dim": -1, "start": 0, "end": n}).outputs[0]
            second = p.add_node("slice", [y], {"dim": -1, "start": n, "end": 2 * n}).outputs[0]
            return {out: first, other.outputs[0]: second}
        return Rewrite("merge_gated_linears",
                       f"{_n(program, nid)} and {_n(program, cid)} project the same input and meet in "
                       f"{_n(program, meet)}: one linear over both weights stacked ({2 * n} outputs) reads the "
                       f"input once, and the two halves of its output become a gated unit after it.", build, nid)
    return None
