"""What a region reads and writes: its nodes in order, external inputs and external outputs.

Any set of node ids of a Program can be fed in (the planner's regions, a user's selection, a test's
hand-picked chain); this works out the boundary itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Program
from .kernel import CodegenError


@dataclass
class RegionIO:
    nodes: list[str]     # the region's nodes in topological order
    inputs: list[str]    # value ids read from outside, in order of first use
    outputs: list[str]   # value ids used outside the region or returned by the program
    produced: set[str]   # every value the region computes


def region_io(program: Program, node_ids) -> RegionIO:
    """The region's nodes in order, what it reads and what leaves it. Asked many times per region
    (planning, codegen, verification, each tuning variant): memoized per structure of the program."""
    ids = list(dict.fromkeys(node_ids))
    memo, key = program.memo("region_io"), (tuple(ids), tuple(program.outputs))
    known = memo.get(key)
    if known is None:
        known = memo[key] = _region_io(program, ids)
    return RegionIO(list(known.nodes), list(known.inputs), list(known.outputs), set(known.produced))


def _region_io(program: Program, ids: list[str]) -> RegionIO:
    if not ids:
        raise CodegenError("the region has no nodes")
    for nid in ids:
        if nid not in program.nodes:
            raise CodegenError(f"the region names node '{nid}', which the program does not have")
    members = set(ids)
    order = [nid for nid in program.topo_order() if nid in members]
    produced = {v for nid in order for v in program.nodes[nid].outputs}
    inputs: list[str] = []
    for nid in order:
        node = program.nodes[nid]
        for port, vid in enumerate(node.inputs):
            if vid is None:
                if port < node.opdef.arity()[0]:
                    raise CodegenError(f"{node.name} ({node.op}) has its input "
                                       f"'{node.opdef.port_name(port)}' unconnected", node_id=nid)
                continue
            if vid not in produced and vid not in inputs:
                inputs.append(vid)
    outputs = []
    readers = program.consumer_map()
    for nid in order:
        for vid in program.nodes[nid].outputs:
            used_outside = any(c not in members for c, _ in readers.get(vid, ()))
            if used_outside or vid in program.outputs:
                outputs.append(vid)
    if not outputs:
        raise CodegenError("the region's results are never used (no value leaves it)")
    return RegionIO(order, inputs, outputs, produced)


def contiguous_strides(shape) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


class BroadcastIndex:
    """Index arithmetic that maps a flat index of the iteration space to each operand's offset.

    Dimensions of size 1 are dropped and neighbouring dimensions merged where every operand either
    spans both or broadcasts over both, so a bias over channels of [N, C, H, W] costs one division and
    one modulo: offset = (i / (H*W)) % C.
    """

    def __init__(self, space: tuple[int, ...], operand_shapes: list[tuple[int, ...]]):
        self.space = tuple(space)
        r = len(space)
        padded = [(1,) * (r - len(s)) + tuple(s) for s in operand_shapes]
        for s in padded:
            for d, (a, b) in enumerate(zip(s, space)):
                if a not in (1, b):
                    raise CodegenError(f"shape {list(s)} does not broadcast to the region's {list(space)}")
        keep = [d for d in range(r) if space[d] != 1]
        # each group of merged dims: (list of dims, tuple of per-operand spans flags)
        groups: list[tuple[list[int], tuple[bool, ...]]] = []
        for d in keep:
            flags = tuple(s[d] != 1 for s in padded)
            if groups and groups[-1][1] == flags:
                groups[-1][0].append(d)
            else:
                groups.append(([d], flags))
        self.sizes = [math.prod(space[d] for d in dims) for dims, _ in groups]
        self.inner = [math.prod(self.sizes[g + 1:]) for g in range(len(groups))]
        # per operand: stride of each merged dim (0 where it broadcasts)
        self.strides: list[list[int]] = []
        for k, s in enumerate(padded):
            own = contiguous_strides(s)
            self.strides.append([own[dims[-1]] if flags[k] else 0 for dims, flags in groups])
        self.numel = math.prod(space)

    def is_full(self, k: int) -> bool:
        """The operand spans the whole iteration space with the same layout: its offset is the index."""
        return all(st == inner for st, inner in zip(self.strides[k], self.inner)) and \
            len(self.strides[k]) == len(self.inner)

    def is_scalar(self, k: int) -> bool:
        return all(st == 0 for st in self.strides[k])

    def offset_expr(self, k: int, index: str, size_names: list[str], inner_names: list[str],
                    stride_names: list[str | None]) -> str:
        """C expression of operand k's offset; constants are referred to by the given names."""
        if self.is_full(k):
            return index
        terms = []
        for g, st in enumerate(self.strides[k]):
            if st == 0:
                continue
            q = index if self.inner[g] == 1 else f"{index} / {inner_names[g]}"
            coord = q if g == 0 else f"({q}) % {size_names[g]}"
            if g == 0 and self.inner[g] != 1:
                coord = f"({q})"
            terms.append(coord if st == 1 else f"{coord} * {stride_names[g]}")
        return " + ".join(terms) if terms else "0"
