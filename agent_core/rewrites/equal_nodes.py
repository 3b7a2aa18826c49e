"""One node for two that compute the same thing: the same op, attributes and inputs.

Programs written out by hand or traced from models often compute a value twice (48_Mamba2's chunk
scan takes `torch.cumsum` of the same tensor in two places; a block recomputes `x.mean(-1)` for two
terms). The later node's readers read the earlier node's outputs, so the value is computed and
written once. Every op of the library is a function of its inputs (ops that draw random numbers are
refused at import); opaque nodes run code of their own and are left alone.
"""
from __future__ import annotations

from ..ir import Program
from .edits import Rewrite
from .edits import node_label as _n


def merge_equal_nodes(program: Program, nid: str) -> Rewrite | None:
    """The later of two nodes with the same op, attributes and inputs: its readers read the other's
    outputs."""
    node = program.nodes[nid]
    first = next((v for v in node.inputs if v), None)
    if first is None or node.opdef.category == "opaque":
        return None
    if not any(program.consumers(v) or v in program.outputs for v in node.outputs):
        return None
    order = None
    for oid, _ in program.consumers(first):
        other = program.nodes[oid]
        if oid == nid or other.op != node.op or other.inputs != node.inputs or other.attrs != node.attrs \
                or len(other.outputs) != len(node.outputs):
            continue
        if any(v in program.outputs and w in program.outputs for v, w in zip(node.outputs, other.outputs)):
            continue     # two outputs of the program stay two values
        order = order or {n: i for i, n in enumerate(program.topo_order())}
        if order[oid] < order[nid]:
            pairs = dict(zip(node.outputs, other.outputs))
            return Rewrite("merge_equal_nodes",
                           f"{_n(program, nid)} computes what {_n(program, oid)} already does (the same "
                           f"inputs and attributes); its readers read that value.",
                           lambda p, pairs=pairs: dict(pairs), nid)
    return None
