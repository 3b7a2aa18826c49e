"""What a region reads and writes: its nodes in order, external inputs and external outputs.

Any set of node ids of a Program can be fed in (the planner's regions, a user's selection, a test's
hand-picked chain); this works out the boundary itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Program
from .cuda import Names
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


class Operands:
    """Loads of region inputs in an iteration space, by flat index, with broadcast offset helpers.

    computed: value -> (scalar lambda, float4 lambda or None) for values a layout prologue computes
    through views (layout_graph.ViewPrologue); they load by calling the lambda at the same index a
    tensor would be read at, float4 only where the views keep aligned runs of 4."""

    def __init__(self, program, space, vids, names: Names, prefix: str, views=None, computed=None):
        self.program, self.space = program, tuple(space)
        self.computed = computed or {}
        vals = program.values
        views = views or {}
        self.bidx = BroadcastIndex(space, [views.get(v, vals[v].shape) for v in vids]) if vids else None
        self.vids = list(vids)
        self.helpers, self.consts, self.fn = [], [], {}
        sizes = [f"k{prefix}Size{g}" for g in range(len(self.bidx.sizes))] if vids else []
        inners = [f"k{prefix}Inner{g}" for g in range(len(sizes))]
        used = set()
        for k, vid in enumerate(self.vids):
            if self.bidx.is_full(k):
                self.fn[vid] = "full"
                continue
            if self.bidx.is_scalar(k):
                self.fn[vid] = None
                continue
            ident = names.new(vals[vid].name + "_offset")
            strides = [f"{ident}_stride{g}" if st not in (0, 1) else None
                       for g, st in enumerate(self.bidx.strides[k])]
            for g, st in enumerate(self.bidx.strides[k]):
                if st:
                    used.add(g)
                    if strides[g]:
                        self.consts.append(f"constexpr index_t {strides[g]} = {st};")
            expr = self.bidx.offset_expr(k, "i", sizes, inners, strides)
            self.helpers.append(f"// {vals[vid].name} {list(vals[vid].shape)} is broadcast over {list(space)}\n"
                                f"__device__ __forceinline__ index_t {ident}(index_t i) {{ return {expr}; }}\n")
            self.fn[vid] = ident
        for g in sorted(used):
            self.consts.insert(0, f"constexpr index_t {sizes[g]} = {self.bidx.sizes[g]}, "
                                  f"{inners[g]} = {self.bidx.inner[g]};")

    def full(self, vid):
        """Read at the iteration index itself (a row can hold it in registers)."""
        return self.fn[vid] == "full"

    def vectors(self, vid):
        """4 consecutive elements come in one load: a tensor, or a computed value with a float4 lambda
        (a pooled window has none: its 4 elements are 4 calls)."""
        return vid not in self.computed or self.computed[vid][1] is not None

    def group_mode(self, vid):
        """For 4 consecutive elements starting at a multiple of 4: "uniform" when they share one
        element of this operand, "vec4" when they read 4 contiguous ones, else None."""
        fn = self.fn[vid]
        if fn in ("full", None) or self.bidx.sizes[-1] % 4:
            return None
        last = self.bidx.strides[self.vids.index(vid)][-1]
        return "uniform" if last == 0 else ("vec4" if last == 1 and self.vectors(vid) else None)

    def _at(self, vid, idx):
        fn = self.fn[vid]
        return idx if fn == "full" else ("0" if fn is None else f"{fn}({idx})")

    def load(self, vid, ptr, idx):
        """One element at iteration index idx."""
        if vid in self.computed:
            return f"{self.computed[vid][0]}({self._at(vid, idx)})"
        return f"{ptr}[{self._at(vid, idx)}]"

    def load4(self, vid, ptr, vtype, idx):
        """The 4 elements from iteration index idx (a multiple of 4; "full" or "vec4" operands)."""
        if vid in self.computed:
            return f"{self.computed[vid][1]}({self._at(vid, idx)})"
        return f"reinterpret_cast<const {vtype}*>({ptr} + {self._at(vid, idx)})[0]"
