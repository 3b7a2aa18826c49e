"""A cat (or stack) of per-row values after a row kernel's reductions, written by the row kernel itself.

MoE routers gather each row's top values and indices: cat((first, second), dim=-1) of two keepdim
maxima, and the same of their argmaxes. Each piece is one value per row (a keepdim R value of the row
graph, shape `keep`: the reduced dims of size 1), and the cat runs along one of those reduced dims, so
the output holds n values per row: piece j of row r lands at

    (r / inner * n + j) * inner + r % inner        (inner: elements after the reduced dims)

A stack of per-row values without keepdim along the dim they dropped is the same store. The cat is
taken out of the region before the row graph is built (its pieces become the graph's outputs) and
checked against the graph afterwards (`check`): anything else stays a refusal.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Program
from ..ops.common import norm_dim
from .kernel import CodegenError
from .region_io import RegionIO


@dataclass
class RowCat:
    value: str               # the cat's output
    node: str
    pieces: list[str]        # the values it joins, in order
    dim: int                 # along this dim of the pieces (cat) or of the output (stack)
    escapes: set[str]        # pieces that leave the region on their own too

    def offset(self, j: int, inner: int, row: str = "row") -> str:
        n = len(self.pieces)
        return f"{row} * {n} + {j}" if inner == 1 else f"({row} / {inner} * {n} + {j}) * {inner} + {row} % {inner}"


def split_row_cats(program: Program, io: RegionIO) -> tuple[RegionIO, dict[str, RowCat]]:
    """(the region without its cats of values it computes, the cats by output). Only a cat that is
    an output and reads nothing but values computed in the region is taken out."""
    nodes, produced = program.nodes, io.produced
    cats: dict[str, RowCat] = {}
    for nid in io.nodes:
        node = nodes[nid]
        if node.op not in ("cat", "stack") or node.outputs[0] not in io.outputs:
            continue
        if not all(v in produced for v in node.inputs) or any(n for n, _ in program.consumers(node.outputs[0])
                                                                if n in io.nodes):
            continue
        rank = len(program.values[node.inputs[0]].shape) + (node.op == "stack")
        cats[node.outputs[0]] = RowCat(node.outputs[0], nid, list(node.inputs), norm_dim(node.attrs.get("dim", 0), rank),
                                       {v for v in node.inputs if v in io.outputs or
                                        any(n not in io.nodes and n != nid for n, _ in program.consumers(v))})
    if not cats:
        return io, {}
    rest = [n for n in io.nodes if n not in {c.node for c in cats.values()}]
    outputs = [v for v in io.outputs if v not in cats]
    for c in cats.values():
        outputs += [v for v in c.pieces if v not in outputs]
    return RegionIO(rest, list(io.inputs), outputs, {v for n in rest for v in nodes[n].outputs}), cats


def check(program: Program, cat: RowCat, full, dims, space_of) -> None:
    """CodegenError unless every piece is one value per row, joined along a reduced dim."""
    vals, node = program.values, program.nodes[cat.node]
    keep = tuple(1 if d in dims else s for d, s in enumerate(full))
    kept = tuple(s for d, s in enumerate(full) if d not in dims)
    for v in cat.pieces:
        shape = tuple(vals[v].shape)
        along = (node.op == "cat" and shape == keep and cat.dim in dims) or \
            (node.op == "stack" and shape == kept and cat.dim == dims[0] and len(dims) == 1)
        if space_of(v) != "R" or not along:
            raise CodegenError(f"{node.name} ({node.op}) is a layout op after the reductions that joins "
                               f"'{vals[v].name}' {list(shape)}; a row kernel writes a cat of per-row values "
                               f"along the reduced dims only: split the region there", node_id=node.id)
