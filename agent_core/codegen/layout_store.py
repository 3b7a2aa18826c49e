"""Layout ops after a row kernel's reductions, written through their views (issue #14).

A permute, transpose, flip or reshape of a value the row kernel computes per element (Qwen3's QK-norm:
RMSNorm over each head, then heads moved in front of the sequence) moves elements without changing
them. Instead of a second kernel that copies the result into its new layout, the row kernel stores
each element where the layout op would put it: the element at flat index i of X (the value the row
graph computes) goes to offset `store(i)` of Y = layout(X). That offset is a read through a view
too: Y's contiguous buffer seen through the inverse ops (permute by the inverse order, transpose the
same dims, reshape back) has X's shape, and reading it at i gives Y's offset of X's element i.

Only ops that are bijections of the elements qualify (INVERTIBLE); anything else after a reduction
is refused by view_prologue_nodes as before. float4 stores stay where every run of 4 neighbouring X
elements lands on 4 aligned neighbours of Y (the inverse view keeps the innermost dim with stride 1,
its extent, offset and other strides multiples of 4); otherwise the run is stored one lane at a time.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Program
from . import views as V
from .region_io import RegionIO

INVERTIBLE = ("permute", "transpose", "flip", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "contiguous")


@dataclass
class OutputView:
    value: str               # the region output written through the view (Y)
    source: str              # the value the row kernel computes (X)
    stack: V.ViewStack       # X's shape over Y's buffer: the offset in Y of X's element i
    vector: bool             # runs of 4 of X are aligned runs of 4 in Y
    source_escapes: bool     # X leaves the region itself too (written as it is)

    def offset(self, idx: str, lang: str = "cuda") -> str:
        """Y's offset of X's element at flat index expression `idx` (C, or Python for the tests)."""
        text, cond = V.render_read(self.stack, f"({idx})" if not idx.isidentifier() else idx, lang)
        assert cond is None, "an invertible layout op reads every element"
        return text


def _inverse(program: Program, node, lay: V.Layout) -> V.Layout:
    """The Layout of the node's input over the Layout `lay` of its output's buffer."""
    a, x = node.attrs, program.values[node.inputs[0]]
    if node.op == "permute":
        dims = [d % len(x.shape) for d in a["dims"]]
        inv = [0] * len(dims)
        for k, d in enumerate(dims):
            inv[d] = k
        return V.permute(lay, inv)
    if node.op == "transpose":
        return V.transpose(lay, a["dim0"], a["dim1"])
    if node.op == "flip":         # its own inverse
        return V.flip(lay, a["dims"])
    return V.reshape(lay, list(x.shape))      # the reshape family and contiguous: back to the input's shape


def _aligned(stack: V.ViewStack) -> bool:
    for layer in stack.layers:
        if not isinstance(layer, V.View):
            return False
        m = layer.merged()
        if not m.shape or m.shape[-1] % 4 or m.strides[-1] != 1 or m.offset % 4 or any(s % 4 for s in m.strides[:-1]):
            return False
    return True


def split_output_views(program: Program, io: RegionIO) -> tuple[RegionIO, dict[str, OutputView]]:
    """(the region without its trailing invertible layout ops, {written value: its OutputView}). A
    trailing op is one whose output is read in the region only by other trailing ops; the values
    they end in must leave the region, and the chain must start from a value computed in it."""
    nodes, vals = program.nodes, program.values
    members = set(io.nodes)
    consumers: dict[str, list[str]] = {}
    for n in io.nodes:
        for v in nodes[n].inputs:
            if v:
                consumers.setdefault(v, []).append(n)
    tail: set[str] = set()
    for n in reversed(io.nodes):
        node = nodes[n]
        if node.op not in INVERTIBLE or len(node.outputs) != 1 or not node.inputs or not node.inputs[0]:
            continue
        if vals[node.inputs[0]].producer not in members:
            continue
        if all(c in tail for c in consumers.get(node.outputs[0], [])):
            tail.add(n)
    if not tail:
        return io, {}
    out: dict[str, OutputView] = {}
    for n in io.nodes:
        if n not in tail or nodes[n].outputs[0] not in io.outputs:
            continue
        y = nodes[n].outputs[0]
        lay, cur = V.Layout.of("y", vals[y].shape), nodes[n]
        while True:
            lay = _inverse(program, cur, lay)
            src = cur.inputs[0]
            up = vals[src].producer
            if up not in tail:
                break
            cur = nodes[up]
        stack = lay.single.stack
        out[y] = OutputView(y, src, stack, _aligned(stack), src in io.outputs)
    rest = [n for n in io.nodes if n not in tail]
    outputs = [v for v in io.outputs if v not in out]
    outputs += [s for s in dict.fromkeys(o.source for o in out.values()) if s not in outputs]
    return RegionIO(rest, list(io.inputs), outputs, {v for n in rest for v in nodes[n].outputs}), out
