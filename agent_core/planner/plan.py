"""The fusion / stitch planner: proposes regions, ranked by the estimated time they save.

Vertical fusion first (producer into consumer), best estimated saving first, the queue updated after
each merge (XLA's priority fusion); then sibling fusion of groups that read a common input with the
same loop. Regions a user accepted, drew or locked are kept exactly; nodes of a rejected region are
never put together again. Every decision, taken or refused, goes to the plan's log.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from ..analysis.cost import ProgramEstimate, estimate_program, program_costs
from ..analysis.gpu import H200, GPUProfile
from ..errors import ProgramError
from ..ir import Program, Role
from ..regions import KEPT_STATUSES, Region, RegionEdit, convexity_violation, new_region_id, replace_regions
from .explain import make_region
from .fusion import Budgets, can_fuse, group_time, recompute_ms, summarize
from .state import PlanState

_MAX_LOG = 400  # refusals beyond this are counted, not listed


@dataclass
class Plan:
    regions: list[Region]
    estimate: ProgramEstimate
    log: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    refused: int = 0

    @property
    def active(self) -> list[Region]:
        return [r for r in self.regions if r.status != "rejected"]

    @property
    def kernels(self) -> int:
        return sum(1 for r in self.active if not r.schedule.get("alias"))

    def to_dict(self) -> dict:
        return {"regions": [r.to_dict() for r in self.regions], "estimate": self.estimate.to_dict(),
                "kernels": self.kernels, "seconds": self.seconds, "log": self.log}


class _State(PlanState):
    def __init__(self, program, costs, gpu, budgets, graph, rejected):
        super().__init__(program, costs)
        self.gpu, self.budgets, self.graph = gpu, budgets, graph
        self.rejected = rejected                      # list of (Region, set of nodes)
        self.rejected_by_node: dict[str, list] = {}
        for r, members in rejected:
            for n in members:
                self.rejected_by_node.setdefault(n, []).append((r, members))

    def rejected_conflict(self, a, b) -> str | None:
        if not self.rejected_by_node:
            return None
        small, big = (a, b) if len(a.nodes) <= len(b.nodes) else (b, a)
        union = None
        for n in small.nodes:
            for r, members in self.rejected_by_node.get(n, ()):
                if union is None:
                    union = set(a.nodes) | set(b.nodes)
                if members <= union and not members <= set(a.nodes) and not members <= set(b.nodes):
                    return f"you rejected region {r.id}, so its nodes are not fused together again"
        return None


def _label(state, nid):
    n = state.program.nodes[nid]
    return n.name if n.name == n.op else f"{n.name} ({n.op})"


def plan_program(program: Program, *, gpu: GPUProfile = H200, budgets: Budgets = Budgets(),
                 graph: bool = True, sibling: bool = True) -> Plan:
    """Plan regions for `program` (not modified; see apply_plan)."""
    t0 = time.perf_counter()
    costs = program_costs(program)
    kept = [r for r in program.regions if r.status in KEPT_STATUSES]
    rejected = [(r, set(r.nodes)) for r in program.regions if r.status == "rejected"
                and all(n in program.nodes for n in r.nodes)]
    state = _State(program, costs, gpu, budgets, graph, rejected)
    log: list[dict] = []
    refusals: dict[str, str] = {}
    n_refused = 0

    def note(action, nodes, message):
        nonlocal n_refused
        if action == "refused":
            n_refused += 1
            if n_refused > _MAX_LOG:
                return
        log.append({"action": action, "nodes": list(nodes), "message": message})

    # 1. regions the user kept become frozen groups, exactly as they are
    g_nx = None
    for r in kept:
        missing = [n for n in r.nodes if n not in program.nodes]
        if missing:
            note("dropped", r.nodes, f"region {r.id} names {', '.join(missing)}, which no longer exist; "
                 "it is not kept")
            continue
        if g_nx is None:
            g_nx = program.graph()
        bad = convexity_violation(program, g_nx, set(r.nodes))
        if bad:
            raise ProgramError(f"{r.status} region {r.id} is no longer legal: {bad}")
        nodes = state.sort_nodes(r.nodes)
        gid = state.group_of[nodes[0]]
        for n in nodes[1:]:
            other = state.group_of[n]
            if other == gid:
                continue
            a, b = sorted((gid, other), key=state.pos.__getitem__)
            if state.cycle_path(a, b):
                raise ProgramError(f"{r.status} region {r.id} forms a cycle with the other kept regions")
            gid = state.merge(a, b)
        state.groups[gid].frozen = r

    # 2. vertical fusion by priority
    summaries: dict[tuple[int, int], object] = {}
    times: dict[tuple[int, int], float] = {}

    def summary(g):
        k = (g.gid, g.version)
        s = summaries.get(k)
        if s is None:
            s = summaries[k] = summarize(state, g.nodes)
        return s

    def gtime(g):
        k = (g.gid, g.version)
        t = times.get(k)
        if t is None:
            t = times[k] = group_time(state, g.nodes, summary(g))[0]
        return t

    def evaluate(a, b, relation):
        """(saved ms, None) or (None, refusal)."""
        ga, gb = state.groups[a], state.groups[b]
        sa, sb = summary(ga), summary(gb)
        why = can_fuse(state, ga, gb, sa, sb, relation)
        if why:
            return None, why
        union = ga.nodes + gb.nodes
        su = summarize(state, union)
        tu = group_time(state, union, su)[0]
        rec, rec_why = recompute_ms(state, sa, sb)
        saved = gtime(ga) + gtime(gb) - tu - rec
        if saved <= 0:
            if rec_why:
                return None, f"{rec_why}, which costs more than fusing saves"
            return None, "fusing would not save time on the roofline"
        return saved, None

    heap: list = []
    counter = 0

    def push(a, b):
        nonlocal counter
        if state.pos[a] > state.pos[b]:
            a, b = b, a
        saved, why = evaluate(a, b, "producer")
        if why:
            _refuse(state, refusals, note, a, b, why)
            return
        counter += 1
        heapq.heappush(heap, (-saved, counter, a, b, state.groups[a].version, state.groups[b].version))

    for g in list(state.order):
        if g is None:
            continue
        for s in sorted(state.succ[g], key=state.pos.__getitem__):
            push(g, s)
    while heap:
        neg, _, a, b, va, vb = heapq.heappop(heap)
        ga, gb = state.groups.get(a), state.groups.get(b)
        if ga is None or gb is None or ga.version != va or gb.version != vb:
            continue
        if state.pos[a] > state.pos[b]:
            a, b = b, a
        via = state.cycle_path(a, b)
        if via:
            x = state.groups[via[0]]
            _refuse(state, refusals, note, a, b,
                    f"fusing would create a cycle: the path runs out through "
                    f"{_label(state, x.nodes[0])} and back in")
            continue
        m = state.merge(a, b)
        note("fused", state.groups[m].nodes, f"saves about {-neg * 1000:.2f} us")
        for s in list(state.succ[m]) + list(state.pred[m]):
            push(m, s)

    # 3. sibling fusion: groups reading the same input with the same loop
    if sibling:
        for vid, readers in state.consumers.items():
            val = program.values.get(vid)
            if val is None or val.role in (Role.PARAMETER, Role.CONSTANT) or len(readers) < 2:
                continue
            gids = sorted({state.group_of[c] for c in readers}, key=state.pos.__getitem__)
            while len(gids) > 1:
                a = gids[0]
                rest = []
                for b in gids[1:]:
                    if a not in state.groups or b not in state.groups:
                        continue
                    x, y = sorted((a, b), key=state.pos.__getitem__)
                    saved, why = evaluate(x, y, "sibling")
                    if why or state.cycle_path(x, y):
                        rest.append(b)
                        continue
                    a = state.merge(x, y)
                    state.groups[a].sibling = True
                    note("fused", state.groups[a].nodes,
                         f"siblings reading {val.name}; saves about {saved * 1000:.2f} us")
                gids = rest

    # 4. regions, in execution order
    old_by_nodes = {frozenset(r.nodes): r for r in program.regions if r.status == "proposed"}
    taken = [r.id for r in program.regions if r.status in KEPT_STATUSES or r.status == "rejected"]
    regions: list[Region] = []
    for g in state.ordered_groups():
        if g.frozen is not None:
            r = g.frozen
            regions.append(r)
            continue
        old = old_by_nodes.get(frozenset(g.nodes))
        rid = old.id if old is not None and old.id not in taken else _next_id(taken)
        taken.append(rid)
        r = make_region(state, g, rid, refusals)
        if old is not None:
            r.log = list(old.log)
        r.note("planner", "proposed", r.reason)
        regions.append(r)
    regions += [r for r, _ in rejected]
    est = estimate_program(program, [r for r in regions if r.status != "rejected"], gpu, graph)
    return Plan(regions, est, log, time.perf_counter() - t0, n_refused)


def _next_id(taken: list[str]) -> str:
    k = 1 + max((int(i[1:]) for i in taken if i[:1] == "r" and i[1:].isdigit()), default=0)
    return f"r{k}"


def _refuse(state, refusals, note, a, b, why):
    ga, gb = state.groups[a], state.groups[b]
    # remember, for a node that may end up alone, the first reason it was not fused
    for g, other in ((ga, gb), (gb, ga)):
        if len(g.nodes) == 1:
            refusals.setdefault(g.nodes[0], f"not fused with {_label(state, other.nodes[0])}: {why}")
    note("refused", ga.nodes[:3] + gb.nodes[:3], why)


def apply_plan(program: Program, plan: Plan) -> RegionEdit:
    """Install the plan's regions on the program as one undoable edit, and log the plan."""
    edit = replace_regions(program, plan.regions, label="Plan regions")
    program.log.append({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "actor": "planner",
                        "action": "plan", "message": f"{len(plan.active)} regions, {plan.kernels} kernels; "
                        f"estimated {plan.estimate.unfused_ms:.4f} ms unfused, "
                        f"{plan.estimate.planned_ms:.4f} ms planned, floor {plan.estimate.floor_ms:.4f} ms"})
    return edit
