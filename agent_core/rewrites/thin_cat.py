"""A cat of pieces one element thick along its dim (a router's top-2 weights side by side, each a max
over the experts): a reduction over that dim is a fold of the pieces, and a pointwise op of the cat
against a value broadcast along it is the cat of the op over each piece. Both keep the pieces per-row
values, which the row kernel that computes them goes on with and stores piece by piece
(codegen/row_cat.py), where the cat would have ended that kernel (a layout op after its reductions).
"""
from __future__ import annotations

from ..ir import Program
from ..ops import FLOAT_DTYPES
from ..ops.common import norm_dims
from .edits import Rewrite, node_label as _n, producer as _producer, reduced_dims as _reduced_dims

FOLDS = {"sum": "add", "mean": "add", "max": "maximum", "min": "minimum", "amax": "maximum", "amin": "minimum"}
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")


def _thin_cat(program: Program, vid: str):
    """(the cat node making vid, its dim) where every piece is one element thick along that dim; else
    None."""
    c = _producer(program, vid)
    if c is None or c.op != "cat":
        return None
    shape = program.values[vid].shape
    d = norm_dims([c.attrs.get("dim", 0)], len(shape))[0]
    pieces = [v for v in c.inputs if v]
    if len(pieces) < 2 or any(program.values[v].shape[d] != 1 for v in pieces):
        return None
    return c, d


def reduce_of_thin_cat(program: Program, nid: str) -> Rewrite | None:
    """sum / mean / max / min over the dim of a thin cat: the pieces added (then divided by their
    count), or their elementwise maximum / minimum (NaN kept, as torch's max keeps it)."""
    n = program.nodes[nid]
    if n.op not in FOLDS or len(n.outputs) != 1 or not n.inputs or n.inputs[0] is None:
        return None
    x = n.inputs[0]
    if program.values[x].dtype not in FLOAT_DTYPES:
        return None
    thin = _thin_cat(program, x)
    if thin is None or _reduced_dims(n, len(program.values[x].shape)) != [thin[1]]:
        return None
    c = thin[0]
    pieces, out = [v for v in c.inputs if v], n.outputs[0]
    oshape = program.values[out].shape

    def build(p):
        acc = pieces[0]
        for v in pieces[1:]:
            acc = p.add_node(FOLDS[n.op], [acc, v], {}).outputs[0]
        if n.op == "mean":
            acc = p.add_node("div_scalar", [acc], {"value": float(len(pieces))}).outputs[0]
        if tuple(p.values[acc].shape) != tuple(oshape):
            acc = p.add_node("reshape", [acc], {"shape": list(oshape)}).outputs[0]
        return {out: acc}
    return Rewrite("reduce_of_thin_cat", f"{_n(program, nid)} reduces {_n(program, c.id)}, {len(pieces)} pieces "
                   f"one element thick: it is their {FOLDS[n.op]}, elementwise, and the cat is not read.", build, nid)


def pointwise_of_thin_cat(program: Program, nid: str) -> Rewrite | None:
    """op(cat(a, b), s) with s of size 1 along the cat's dim (a divisor broadcast along it) is
    cat(op(a, s), op(b, s)): the op runs on each piece."""
    n = program.nodes[nid]
    if n.op not in BINARY or len(n.outputs) != 1 or len([v for v in n.inputs if v]) != 2:
        return None
    out = n.outputs[0]
    oshape = program.values[out].shape
    for port in (0, 1):
        x, s = n.inputs[port], n.inputs[1 - port]
        xshape, sshape = program.values[x].shape, program.values[s].shape
        thin = _thin_cat(program, x)
        if thin is None or tuple(xshape) != tuple(oshape) or len(sshape) > len(oshape):
            continue
        c, d = thin
        lead = len(oshape) - len(sshape)       # s broadcasts from the right
        if d >= lead and sshape[d - lead] != 1:
            continue
        pieces = [v for v in c.inputs if v]

        def build(p, c=c, pieces=pieces, port=port, s=s):
            outs = []
            for v in pieces:
                ins = [v, s] if port == 0 else [s, v]
                outs.append(p.add_node(n.op, ins, dict(n.attrs)).outputs[0])
            return {out: p.add_node("cat", outs, dict(c.attrs)).outputs[0]}
        return Rewrite("pointwise_of_thin_cat", f"{_n(program, nid)} of {_n(program, c.id)} ({len(pieces)} pieces one "
                       f"element thick) and a value broadcast along it runs on each piece: "
                       f"the cat comes after it.", build, nid)
    return None
