"""The three questions of fusion, kept apart (as Inductor's scheduler does):

- `can_fuse`: may these two groups become one kernel? (loop shapes, anchors, budgets, user decisions;
  the cycle check lives in PlanState because it depends on every other group);
- `score`: is it worth it? the estimated time saved on the roofline, less any recomputation;
- the reasons a user reads are written from the same summaries in explain.py.

Each refusal is one sentence that names the nodes and the numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..analysis.cost import fmt_bytes, group_traffic, roofline_ms
from ..analysis.gpu import GPUProfile
from .geometry import Geometry


@dataclass(frozen=True)
class Budgets:
    max_ops: int = 40            # compute ops in one kernel (code size, compile time)
    max_inputs: int = 16         # distinct tensors one kernel reads (arguments, address registers)
    max_registers: int = 128     # per thread; above this occupancy halves
    base_registers: int = 24     # indices, addresses, loop state
    regs_per_op: int = 2         # live temporaries per fused op, roughly


@dataclass
class Summary:
    nodes: list[str]
    anchor: str | None = None            # the matmul or conv node
    anchor_role: str | None = None
    reductions: list[str] = field(default_factory=list)
    red: Geometry | None = None          # geometry of the first reduction
    numels: dict[str, int] = field(default_factory=dict)   # pointwise node -> loop size
    ops: int = 0                         # compute ops (views excluded)
    blocker: str | None = None           # a node that never fuses (opaque / single / window)


def summarize(state, nodes: list[str]) -> Summary:
    s = Summary(nodes)
    geo = state.geo
    for nid in nodes:
        g = geo[nid]
        r = g.role
        if r == "view":
            continue
        s.ops += 1
        if r == "pointwise":
            s.numels[nid] = g.numel
        elif r in ("matmul", "conv"):
            if s.anchor is None:
                s.anchor, s.anchor_role = nid, r
            else:
                s.blocker = s.blocker or nid
        elif r == "reduction":
            s.reductions.append(nid)
            if s.red is None:
                s.red = g
        else:
            s.blocker = nid
    return s


def _name(state, nid: str) -> str:
    n = state.program.nodes[nid]
    return n.name if n.name == n.op else f"{n.name} ({n.op})"


def _shape(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def schedule_for(red: Geometry, full_inputs: int, gpu: GPUProfile) -> tuple[str, int]:
    """(schedule, values each thread holds) for a stitched reduction whose row reads `full_inputs`
    tensors from memory: a warp per row up to 1024 elements, a block per row while the rows fit the
    on-chip budget, else two passes over memory."""
    k = max(full_inputs, 1)
    if red.row_len <= gpu.warp_row_max and k * math.ceil(red.row_len / gpu.warp_size) <= 64:
        return "warp-per-row", k * math.ceil(red.row_len / gpu.warp_size)
    if red.row_len * 4 * k <= gpu.block_row_bytes:
        return "block-per-row", k * math.ceil(red.row_len / gpu.max_threads_per_block)
    return "two-pass", 0


def full_space_inputs(state, nodes, red: Geometry) -> int:
    """Tensors of the reduction's full size that the group reads from memory."""
    members = set(nodes)
    n_full = red.full_numel
    seen = set()
    for nid in nodes:
        for v in state.program.nodes[nid].inputs:
            if v is None or v in seen:
                continue
            val = state.program.values[v]
            if val.producer in members:
                continue
            seen.add(v)
    return sum(1 for v in seen if state.program.values[v].spec.numel == n_full)


def can_fuse(state, a, b, sa: Summary, sb: Summary, relation: str) -> str | None:
    """Why groups a and b (a before b) may not become one kernel, or None. relation is 'producer'
    (a feeds b) or 'sibling' (they read a common input)."""
    gpu, budgets = state.gpu, state.budgets
    for g in (a, b):
        if g.frozen is not None:
            r = g.frozen
            return f"region {r.id} is {r.status}; the planner keeps it as it is"
    for s in (sa, sb):
        if s.blocker:
            nid = s.blocker
            role = state.geo[nid].role
            what = {"opaque": "is opaque (a call the planner cannot see into)",
                    "window": "is a windowed pooling and runs as its own kernel",
                    }.get(role, "runs as its own kernel (layout change or library call)")
            return f"{_name(state, nid)} {what}"
    ops = sa.ops + sb.ops
    if ops > budgets.max_ops:
        return f"the kernel would hold {ops} ops, over the budget of {budgets.max_ops}"
    anchors = [s for s in (sa, sb) if s.anchor]
    if len(anchors) == 2:
        return (f"{_name(state, sa.anchor)} and {_name(state, sb.anchor)} are both "
                f"{'matrix products' if sa.anchor_role == 'matmul' else 'convolutions'}; each is its own kernel")
    anchor = anchors[0] if anchors else None
    if anchor is not None and relation == "sibling":
        return f"{_name(state, anchor.anchor)} shares its input but not its loop with the other group"
    if anchor is not None and anchor is sb and relation == "producer" and (sa.ops or sa.reductions):
        return (f"feeding {_name(state, sb.anchor)}'s operand from a fused producer would recompute "
                f"that producer for every tile of the product")
    reds = [s.red for s in (sa, sb) if s.red is not None]
    if len(reds) == 2 and reds[0].key != reds[1].key:
        r0, r1 = sa.reductions[0], sb.reductions[0]
        return (f"{_name(state, r0)} and {_name(state, r1)} reduce different rows "
                f"({reds[0].rows} x {reds[0].row_len} over {_shape(reds[0].full)} vs "
                f"{reds[1].rows} x {reds[1].row_len} over {_shape(reds[1].full)})")
    red = reds[0] if reds else None
    if anchor is not None:
        an = anchor.anchor
        out = state.geo[an]
        if red is not None:
            if anchor.anchor_role != "matmul":
                return f"{_name(state, an)}'s epilogue takes pointwise ops only, not a reduction"
            if red.full != out.shape or not red.contiguous or red.rows * red.row_len != out.numel \
                    or red.row_len != out.shape[-1]:
                return (f"the reduction does not run along the rows of {_name(state, an)}'s "
                        f"{_shape(out.shape)} output")
            row_bytes = red.row_len * 4
            smem = gpu.shared_mem_per_block // 2
            if row_bytes * 16 > smem:   # a tile of 16 output rows is kept to finish their reduction
                return (f"a row of {_name(state, an)}'s output ({red.row_len} values) is too long to "
                        f"finish in the matmul's block (16 rows need {fmt_bytes(row_bytes * 16)} of "
                        f"shared memory, budget {fmt_bytes(smem)})")
        allowed = {out.numel} | ({red.rows} if red is not None else set())
        for s in (sa, sb):
            for nid, ne in s.numels.items():
                if ne not in allowed:
                    return (f"{_name(state, nid)} loops over {ne} elements, not the {out.numel} of "
                            f"{_name(state, an)}'s output")
    elif red is not None:
        allowed = {red.full_numel, red.rows}
        for s in (sa, sb):
            for nid, ne in s.numels.items():
                if ne not in allowed:
                    return (f"{_name(state, nid)} loops over {ne} elements, neither the "
                            f"{_shape(red.full)} rows nor the {red.rows} row results of "
                            f"{_name(state, (sa.reductions or sb.reductions)[0])}")
    else:
        na = max(sa.numels.values(), default=0)
        nb = max(sb.numels.values(), default=0)
        if relation == "sibling" and na != nb:
            return f"the two groups loop over different sizes ({na} and {nb} elements)"
    rej = state.rejected_conflict(a, b)
    if rej:
        return rej
    regs = budgets.base_registers + budgets.regs_per_op * ops
    if red is not None:
        sched, held = schedule_for(red, full_space_inputs(state, sa.nodes + sb.nodes, red), gpu)
        regs += held
    if regs > budgets.max_registers:
        return (f"the kernel would need about {regs} registers per thread, over the budget of "
                f"{budgets.max_registers}")
    return None


def group_time(state, nodes: list[str], summary: Summary | None = None) -> tuple[float, object]:
    """Roofline ms of `nodes` as one kernel, and its traffic. A two-pass reduction reads its rows twice."""
    t = group_traffic(state.program, nodes, state.consumers, state.costs)
    if t.views_only:
        return 0.0, t
    extra = 0
    s = summary or summarize(state, nodes)
    if s.red is not None and s.anchor is None and len(nodes) > 1:
        sched, _ = schedule_for(s.red, full_space_inputs(state, nodes, s.red), state.gpu)
        if sched == "two-pass":
            extra = t.bytes_read
    return roofline_ms(t.bytes + extra, t.flops, 1, state.gpu, state.graph), t


def recompute_ms(state, sa: Summary, sb: Summary) -> tuple[float, str | None]:
    """Extra time when a smaller pointwise loop is merged into a larger one and so recomputed per
    element of the larger loop (a broadcast producer), with a description."""
    na = max(sa.numels.values(), default=0)
    nb = max(sb.numels.values(), default=0)
    if not na or not nb or na == nb:
        return 0.0, None
    small, big = (sa, nb) if na < nb else (sb, na)
    extra = 0.0
    worst = None
    for nid, ne in small.numels.items():
        if ne < big:
            f = state.costs[nid].flops * (big / ne - 1)
            extra += f
            if worst is None or f > worst[1]:
                worst = (nid, f, big // max(ne, 1))
    if worst is None:
        return 0.0, None
    return extra / state.gpu.flops_per_ms, (f"{_name(state, worst[0])} would be recomputed about "
                                            f"{worst[2]} times per value")
