"""The fusion / stitch planner: proposes regions, ranked by the estimated time they save.

Vertical fusion first (producer into consumer), best estimated saving first, the queue updated after
each merge (XLA's priority fusion); then sibling fusion of groups that read a common input with the
same loop. Before each merge the code generator is asked whether it would write the merged group's
kernel (fusion.backend_refusal): a group it refuses is left as two groups, so every proposed region
generates. Regions a user accepted, drew or locked are kept exactly; nodes of a rejected region are
never put together again. Every decision, taken or refused, goes to the plan's log.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from ..analysis.cost import ProgramEstimate, estimate_program, library_reads_as_view, program_costs
from ..analysis.gpu import H200, GPUProfile
from ..errors import ProgramError
from ..gcpause import paused_gc
from ..ir import Program
from ..regions import KEPT_STATUSES, Region, RegionEdit, convexity_violation, replace_regions
from ..text import plural
from .attention import absorb_views
from .class_loss import recomputes_nothing
from .explain import lowering_refusal, make_region
from .fusion import (
    Budgets, Facts, _budgetary as _budgets, group_bytes, group_facts, group_time, launches,
    merge_summaries, node_facts, quick_refusal, recompute_ms, summarize, tile_gemm_refusal, union_facts,
)
from .state import PlanState
from .tails import hand_tails_down

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
        """Launches of the plan: a library call and its epilogue kernel count two, views none."""
        return sum(region_launches(r) for r in self.active)

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


def region_launches(r: Region) -> int:
    """Launches of a region as it runs: schedule["launches"] where the planner wrote it (a kept region
    of an older file may lack it: one unless it is views only)."""
    n = r.schedule.get("launches")
    return int(n) if n is not None else (0 if r.schedule.get("alias") else 1)


def _label(state, nid):
    n = state.program.nodes[nid]
    return n.name if n.name == n.op else f"{n.name} ({n.op})"


def plan_program(program: Program, *, gpu: GPUProfile = H200, budgets: Budgets = Budgets(),
                 graph: bool = True, sibling: bool = True) -> Plan:
    """Plan regions for `program` (not modified; see apply_plan)."""
    # planning allocates many short-lived sets and no reference cycles, and only reads the graph
    with paused_gc(), program.frozen():
        return _plan(program, gpu, budgets, graph, sibling)


def _plan(program, gpu, budgets, graph, sibling) -> Plan:
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

    # 1b. the views feeding an attention node's q, k, v and mask join it: its kernel reads through them
    absorb_views(state, note)

    # 2. vertical fusion by priority
    summaries: dict[tuple[int, int], object] = {}
    times: dict[tuple[int, int], float] = {}

    def summary(g):
        k = (g.gid, g.version)
        s = summaries.get(k)
        if s is None:
            s = summaries[k] = summarize(state, g.nodes)
        return s

    facts_cache: dict[tuple[int, int], Facts] = {}

    def facts(g):
        k = (g.gid, g.version)
        f = facts_cache.get(k)
        if f is None:
            f = facts_cache[k] = group_facts(state, g.nodes)
        return f

    def gtime(g):
        k = (g.gid, g.version)
        t = times.get(k)
        if t is None:
            t = times[k] = group_time(state, g.nodes, summary(g), facts(g))[0]
        return t

    def evaluate(a, b, relation):
        """(saved ms, None) or (None, refusal)."""
        ga, gb = state.groups[a], state.groups[b]
        sa, sb = summary(ga), summary(gb)
        why = quick_refusal(state, ga, gb, sa, sb, relation)
        if why:
            return None, why
        fu = union_facts(state, facts(ga), facts(gb), (a, b), light=True,
                         need_reads=sa.red is not None or sb.red is not None)
        red = merge_summaries(sa, sb, state).red      # the rows the merged kernel follows
        why = _budgets(state, ga, gb, sa, sb, relation, fu, red)
        if why:
            return None, why
        union = ga.nodes + gb.nodes
        tu = group_time(state, union, None, fu, red=red, anchor=sa.anchor or sb.anchor)[0]
        rec, rec_why = (0.0, None) if recomputes_nothing(state, sa, sb) else recompute_ms(state, sa, sb, fu)
        saved = gtime(ga) + gtime(gb) - tu - rec
        # an epilogue costs the same inside or outside its library call's region (cuBLAS / cuDNN writes
        # the output, the epilogue kernel reads it back): a tie keeps it with the call, as the runtime
        # and the export run them (the library call, then that kernel)
        tie_with_library = abs(saved) < 1e-12 and relation == "producer" and bool(sa.anchor) and not sb.anchor
        # a view costs nothing on either side of a boundary, so it ties; taking the tie keeps a reshape
        # from standing between two groups whose merge saves a launch (labels -> view -> class loss)
        # (not a view cuBLAS / cuDNN read as it is: outside any kernel it costs nothing, inside one it
        # is a copy, transposed and uncoalesced for a matmul's x @ y.t())
        tie_with_view = abs(saved) < 1e-12 and any(_views_only(state, g.nodes) and not _library_view(state, g.nodes)
                                                   for g in (ga, gb))
        if saved <= 0 and not (tie_with_library or tie_with_view):
            anchor = sa.anchor or sb.anchor
            lost = anchor and tile_gemm_refusal(state, union, anchor)
            if lost:
                return None, (f"the tile GEMM would not take them together ({lost}), and cuBLAS's fp32 with an "
                              "epilogue kernel is slower than the tile GEMM without them")
            if rec_why and rec > 0:
                return None, f"{rec_why}, which costs more than fusing saves"
            return None, "fusing would not save time on the roofline"
        return saved, None

    backend_notes: dict[str, tuple[str, str]] = {}   # node -> (a node it was not fused with, why)

    def lowerable(a, b) -> tuple[object, str | None]:
        """(the union's summary and facts, None) when codegen would write the merged group's kernel,
        else (None, the refusal); asked last, just before a merge, because it is the costliest check."""
        ga, gb = state.groups[a], state.groups[b]
        su, fu = merge_summaries(summary(ga), summary(gb), state), union_facts(state, facts(ga), facts(gb), (a, b))
        why = lowering_refusal(state, ga.nodes + gb.nodes, su, fu.escaping, ga.sibling or gb.sibling)
        if why is None:
            return (su, fu), None
        left = next((n for n in ga.nodes if state.geo[n].role != "view"), ga.nodes[0])
        right = next((n for n in gb.nodes if state.geo[n].role != "view"), gb.nodes[0])
        for side, other in ((ga.nodes, right), (gb.nodes, left)):
            for n in side:
                backend_notes.setdefault(n, (other, why))
        _refuse(state, refusals, note, a, b, why)
        return None, why

    def merge(a, b, union):
        su, fu = union
        m = state.merge(a, b)
        g = state.groups[m]
        summaries[(m, g.version)] = su
        facts_cache[(m, g.version)] = fu
        return m

    # single-consumer edges first: a group whose only consumer is one other group gains from fusing
    # into it whenever the two may fuse, and cannot make a cycle (every path out of it goes through
    # that consumer). Taking these in one linear pass leaves the queue only the real choices: values
    # with several consumers, sibling reads. Each merge is still checked and scored.
    for g in list(state.order):
        while g is not None and g in state.groups and len(state.succ[g]) == 1:
            (h,) = state.succ[g]
            saved, why = evaluate(g, h, "producer")
            if why:
                _refuse(state, refusals, note, g, h, why)
                break
            if saved < 1e-12 and summary(state.groups[g]).anchor and not _views_only(state, state.groups[h].nodes):
                # a tie with a library call waits for the queue, which ranks it last: the epilogue op
                # may instead join its own consumer and save the epilogue's launch (squeeze-excitation's
                # sigmoid, recomputed per element of the scaled map, or relu -> mean after a conv)
                break
            union, why = lowerable(g, h)
            if why:
                break
            state.cycle_path(g, h)   # trivially clear; sets what merge() needs to reorder
            g = merge(g, h, union)
            note("fused", state.groups[g].nodes, f"only consumer; saves about {saved * 1000:.2f} us")

    heap: list = []
    counter = 0

    launch = gpu.launch_ms(graph)
    bw = gpu.bytes_per_ms

    def push(a, b):
        """Queue a candidate under a cheap first estimate (a launch, plus the bytes passed between
        the two written and read again, plus common inputs read once); the exact figure and the
        legality checks come when it reaches the front (lazy evaluation: most queued candidates go
        stale before that, as their groups merge elsewhere)."""
        nonlocal counter
        if state.pos[a] > state.pos[b]:
            a, b = b, a
        fa, fb = facts(state.groups[a]), facts(state.groups[b])
        vb = state.vbytes.__getitem__
        guess = launch + (2 * sum(map(vb, fa.escaping & fb.reads)) + sum(map(vb, fa.reads & fb.reads))) / bw
        counter += 1
        heapq.heappush(heap, (-guess, counter, a, b, state.groups[a].version, state.groups[b].version, False))

    def vertical(groups=None):
        """Producer-consumer merges from the queue, best estimated saving first: of every group, or
        only of `groups` with their producers and consumers."""
        for g in list(state.order) if groups is None else [g for g in groups if g in state.groups]:
            if g is None:
                continue
            for s in sorted(state.succ[g], key=state.pos.__getitem__):
                push(g, s)
            if groups is not None:
                for s in list(state.pred[g]):
                    push(s, g)
        while heap:
            step()

    def step():
        """Take the queue's best candidate: merge it, or requeue it exactly, or refuse it."""
        nonlocal counter
        neg, _, a, b, va, vb, exact = heapq.heappop(heap)
        ga, gb = state.groups.get(a), state.groups.get(b)
        if ga is None or gb is None or ga.version != va or gb.version != vb:
            return
        if state.pos[a] > state.pos[b]:
            a, b = b, a
        if not exact:
            saved, why = evaluate(a, b, "producer")
            if why:
                _refuse(state, refusals, note, a, b, why)
                return
            if heap and -heap[0][0] > saved:      # another candidate may save more: requeue exactly
                counter += 1
                heapq.heappush(heap, (-saved, counter, a, b, va, vb, True))
                return
            neg = -saved
        via = state.cycle_path(a, b)
        if via:
            x = state.groups[via[0]]
            _refuse(state, refusals, note, a, b,
                    f"fusing would create a cycle: the path runs out through "
                    f"{_label(state, x.nodes[0])} and back in")
            return
        union, why = lowerable(a, b)
        if why:
            return
        m = merge(a, b, union)
        note("fused", state.groups[m].nodes, f"saves about {-neg * 1000:.2f} us")
        for s in list(state.succ[m]) + list(state.pred[m]):
            push(m, s)

    vertical()

    # 2b. pointwise tails of reductions go to the kernel that consumes them, where that saves time
    hand_tails_down(state, note)

    # 3. sibling fusion: groups reading the same input with the same loop
    joined = []
    if sibling:
        for vid, readers in state.consumers.items():
            val = program.values.get(vid)
            # a shared parameter counts too: RoPE's q and k read the same cos / sin tables
            if val is None or len(readers) < 2:
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
                    if why or state.creates_cycle(x, y):
                        rest.append(b)
                        continue
                    union, why = lowerable(x, y)
                    if why:
                        rest.append(b)
                        continue
                    a = merge(x, y, union)
                    joined.append(a)
                    state.groups[a].sibling = True
                    note("fused", state.groups[a].nodes,
                         f"siblings reading {val.name}; saves about {saved * 1000:.2f} us")
                gids = rest
        # a sibling merge can complete what a consumer reads (a cat of the mean and the max of one
        # tensor, a top-k's values): producer-consumer merges again, around the merged siblings
        vertical(joined)

    # 4. regions, in execution order
    alone: dict[str, float] = {}

    def node_time(n):
        """A node as its own kernel, with its own schedule (a long-row norm reads its rows twice)."""
        t = alone.get(n)
        if t is None:
            geo = state.geo[n]
            t = alone[n] = group_time(state, [n], None, node_facts(state, n),
                                      red=geo if geo.role == "reduction" else None,
                                      anchor=n if geo.role in ("matmul", "conv") else None)[0]
        return t

    old_by_nodes = {frozenset(r.nodes): r for r in program.regions if r.status == "proposed"}
    taken_set = {r.id for r in program.regions if r.status in KEPT_STATUSES or r.status == "rejected"}
    # ids of old proposed regions that come back unchanged keep their id; new ones never take those
    reserved = {r.id for r in program.regions if r.status == "proposed"
                and frozenset(r.nodes) in {frozenset(g.nodes) for g in state.groups.values()}}
    next_num = 1
    regions: list[Region] = []
    for g in state.ordered_groups():
        if g.frozen is not None:
            r = g.frozen
            r.est_before_ms = round(sum(node_time(n) for n in r.nodes), 6)
            r.est_after_ms = round(group_time(state, state.sort_nodes(r.nodes))[0], 6)
            r.schedule["launches"] = launches(state, r.nodes, summary(g).anchor)
            regions.append(r)
            continue
        old = old_by_nodes.get(frozenset(g.nodes))
        if old is not None and old.id not in taken_set:
            rid = old.id
        else:
            while f"r{next_num}" in taken_set or f"r{next_num}" in reserved:
                next_num += 1
            rid = f"r{next_num}"
        taken_set.add(rid)
        r = make_region(state, g, rid, refusals, node_time, facts(g), backend_notes)
        if old is not None:
            r.log = list(old.log)
        r.note("planner", "proposed", r.reason)
        regions.append(r)
    regions += [r for r, _ in rejected]
    est = estimate_program(program, None, gpu, graph, costs=costs)
    # the plan's own per-region figures include schedule effects (a two-pass row read twice)
    active = [r for r in regions if r.status != "rejected"]
    est.planned_ms = sum(r.est_after_ms for r in active)
    est.kernels_planned = sum(region_launches(r) for r in active)
    est.bytes_planned = sum(group_bytes(state, g.nodes, summary(g).anchor, facts(g)) for g in state.groups.values())
    est.unfused_ms = sum(node_time(n) for n in program.nodes)
    return Plan(regions, est, log, time.perf_counter() - t0, n_refused)



def _views_only(state, nodes) -> bool:
    return all(state.geo[n].role == "view" for n in nodes)


def _library_view(state, nodes) -> bool:
    """Views whose results only library calls read, through torch's strided views (cost.library_reads_as_view)."""
    return all(library_reads_as_view(state.program, n) for n in nodes)


def _refuse(state, refusals, note, a, b, why):
    ga, gb = state.groups[a], state.groups[b]
    # remember, for a node that may end up alone, the first reason it was not fused
    for g, other in ((ga, gb), (gb, ga)):
        if all(state.geo[n].role == "view" for n in other.nodes):
            continue  # a reshape neighbour explains nothing
        if len(g.nodes) == 1 and state.geo[g.nodes[0]].role not in ("single", "window", "opaque"):
            refusals.setdefault(g.nodes[0], f"not fused with {_label(state, other.nodes[0])}: {why}")
    note("refused", ga.nodes[:3] + gb.nodes[:3], why)


def apply_plan(program: Program, plan: Plan) -> RegionEdit:
    """Install the plan's regions on the program as one undoable edit, and log the plan."""
    edit = replace_regions(program, plan.regions, label="Plan regions")
    program.log.append({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "actor": "planner",
                        "action": "plan", "message": f"{plural(len(plan.active), 'region')}, {plural(plan.kernels, 'kernel')}; "
                        f"estimated {plan.estimate.unfused_ms:.4f} ms unfused, "
                        f"{plan.estimate.planned_ms:.4f} ms planned, floor {plan.estimate.floor_ms:.4f} ms"})
    return edit
