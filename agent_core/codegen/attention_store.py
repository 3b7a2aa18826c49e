"""The fused attention kernel's output stored through the layout ops after it (nn.MultiheadAttention's
attn.transpose(0, 1).contiguous().view(T * B, E), a [B, H, L, D] -> [B, L, H * D] merge of heads):
the region writes the last view's value, and each output element goes straight to its place there,
so no copy kernel runs after the attention.

The ops after the node must form one chain of bijective layout ops (reshape-like ops and permutes;
no slice, expand or pad, which drop or repeat elements), each read only by the next. Walking the
chain backwards from the stored value's row-major layout, with each op inverted (a permute by its
inverse, a reshape back to its input's shape), gives the attention output as a view over the stored
buffer: the strides the kernel stores through. attention_reads.strided_reads splits the batch finer
where one stride does not walk a packed dim (a reshape of a permuted view), as for the reads.
"""
from __future__ import annotations

from ..ir import Program
from . import views as V
from .kernel import CodegenError

RESHAPES = frozenset({"reshape", "view", "flatten", "unflatten", "squeeze", "unsqueeze", "contiguous"})
PERMUTES = frozenset({"permute", "transpose"})
STORE_VIEWS = RESHAPES | PERMUTES


def chain_after(program: Program, nodes, node_id: str) -> list[str]:
    """The region's nodes that read the attention node's output, directly or through each other, in
    the region's order."""
    members, after = set(nodes), set()
    frontier = list(program.nodes[node_id].outputs)
    while frontier:
        vid = frontier.pop()
        for n in nodes:
            if n not in after and vid in program.nodes[n].inputs:
                after.add(n)
                frontier.extend(program.nodes[n].outputs)
    return [n for n in nodes if n in after and n in members]


def store_layout(program: Program, node_id: str, after: list[str], outputs: list[str]) -> tuple[str, V.Layout]:
    """(the value the region writes, the attention output's Layout over it); CodegenError naming the op
    when the ops after the node are not a chain of bijective layout ops ending in the one output."""
    node = program.nodes[node_id]
    cur = node.outputs[0]
    chain = []
    for nid in after:
        n = program.nodes[nid]
        ins = [v for v in n.inputs if v is not None]
        if n.op not in STORE_VIEWS:
            raise CodegenError(f"{n.name} ({n.op}) after {node.name} is not a reshape or permute the attention "
                               f"kernel can store through", node_id=nid)
        if ins != [cur] or len(n.outputs) != 1:
            raise CodegenError(f"{n.name} after {node.name} does not continue one chain of views from its output",
                               node_id=nid)
        chain.append(n)
        cur = n.outputs[0]
    if outputs != [cur]:
        names = ", ".join(program.values[v].name for v in outputs if v != cur)
        raise CodegenError(f"the attention region must write only {program.values[cur].name} (it also writes {names})",
                           node_id=node_id)
    lay = V.Layout.of(cur, program.values[cur].shape)
    for n in reversed(chain):
        src = program.values[n.inputs[0]].shape
        if n.op == "permute":
            dims = [d % len(src) for d in n.attrs["dims"]]
            lay = V.permute(lay, [dims.index(i) for i in range(len(dims))])
        elif n.op == "transpose":
            lay = V.transpose(lay, n.attrs["dim0"], n.attrs["dim1"])
        else:
            lay = V.reshape(lay, tuple(src))
    return cur, lay
