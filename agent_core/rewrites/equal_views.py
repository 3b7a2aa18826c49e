"""One value for two chains of views that read the same elements of the same source in the same order.

A lowered einsum writes its own permutes and reshapes for each operand it reads, so a tensor two
einsums read the same way arrives twice, through chains of different ranks (48_Mamba2's C blocks:
reshape, permute, permute, reshape in both, 7-d in one and 6-d in the other). Composed down to the
source, both are one strided view with one shape; the later chain's readers can read the earlier
value, and a kernel that wrote both (the same 134 MB twice) writes it once.
"""
from __future__ import annotations

from ..codegen import views as V
from ..ir import Program
from .edits import Rewrite
from .edits import node_label as _n

CHAIN_OPS = frozenset({"reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose",
                       "contiguous", "expand", "slice", "select"})


def _link(program: Program, vid: str):
    """The node making vid when it is one step of a chain (one input, one output), else None."""
    nid = program.values[vid].producer
    node = program.nodes.get(nid) if nid else None
    if node is None or node.op not in CHAIN_OPS or len(node.outputs) != 1:
        return None
    ins = [v for v in node.inputs if v]
    return node if len(ins) == 1 else None


def _source(program: Program, vid: str) -> tuple[str, list]:
    """(the value the chain making vid starts from, the chain's nodes from it to vid)."""
    chain = []
    node = _link(program, vid)
    while node is not None:
        chain.append(node)
        vid = node.inputs[0]
        node = _link(program, vid)
    return vid, chain[::-1]


def _key(program: Program, src: str, chain) -> tuple | None:
    """What the chain reads of src, as one view (shape, strides, offset, mask) plus its shape and
    dtype; None when it is not one plain view."""
    from ..codegen.layout_tiled import single_view
    vals = program.values
    lay = V.Layout.of(src, vals[src].shape)
    try:
        for node in chain:
            lay = V.apply_op(node.op, node.attrs, [lay])[0]
    except (V.ViewError, KeyError, IndexError):
        return None
    read = lay.single
    if read is None or read.source != src:
        return None
    view = single_view([read.stack])
    if view is None:
        return None
    out = vals[chain[-1].outputs[0]]
    return view.shape, view.strides, view.offset, view.mask, tuple(out.shape), out.dtype


def _chains_from(program: Program, src: str):
    """Every value a chain of CHAIN_OPS makes from src: (value, its chain)."""
    todo = [(src, [])]
    while todo:
        vid, chain = todo.pop()
        for nid, _ in program.consumers(vid):
            node = program.nodes[nid]
            if _link(program, node.outputs[0]) is node:
                todo.append((node.outputs[0], chain + [node]))
                yield node.outputs[0], chain + [node]


def _view_key(program: Program, vid: str) -> tuple | None:
    """_key of the chain that makes vid from its source, kept while the program's structure is
    unchanged: every chain from one source is compared with every other, so 34_VanillaRNNHidden's 256
    x[t] selects composed 65,000 views (and read the structure 265,000 times: 104 s of its rewrites on
    the CPU)."""
    keys = program.memo("equal_view_keys")
    if vid not in keys:
        keys[vid] = _key(program, *_source(program, vid))
    return keys[vid]


def merge_equal_views(program: Program, nid: str) -> Rewrite | None:
    """The last node of a chain of views whose value an earlier chain from the same source already
    makes (same elements, order and shape): its readers read that value."""
    with program.frozen():        # nothing is edited while the rule looks: the structure is read once
        return _merge_equal_views(program, nid)


def _merge_equal_views(program: Program, nid: str) -> Rewrite | None:
    node = program.nodes[nid]
    if node.op not in CHAIN_OPS or len(node.outputs) != 1 or _link(program, node.outputs[0]) is not node:
        return None
    v = node.outputs[0]
    if v in program.outputs or not program.consumers(v):
        return None
    src, chain = _source(program, v)
    key = _view_key(program, v)
    if key is None:
        return None
    order = None
    shape = program.values[v].shape
    for w, other in _chains_from(program, src):
        if w == v or program.values[w].shape != shape or any(n.id == nid for n in other) \
                or _view_key(program, w) != key:     # the shape first: composing views costs more
            continue
        order = order or {n: i for i, n in enumerate(program.topo_order())}
        if order[other[-1].id] < order[nid]:
            return Rewrite("merge_equal_views",
                           f"{_n(program, nid)} reads {program.values[src].name} through "
                           f"{len(chain)} views as {_n(program, other[-1].id)} already does (same elements, order "
                           f"and shape {list(key[4])}); its readers read that value.",
                           lambda p, v=v, w=w: {v: w}, nid)
    return None
