"""Regions: groups of nodes that become one kernel, as part of the program model.

A region has a kind, member nodes, a status, the reason it exists (one or two plain sentences a user
reads on the canvas), estimated and measured times, the generated source, and a decision log.
The planner proposes regions; a user accepts, rejects, locks, splits, merges or draws them by hand.

Every edit here is a model operation on the Program: it checks legality (raising CycleError or
ProgramError with a precise one-line message), changes `program.regions`, emits a "regions_changed"
event, and returns a RegionEdit that `undo_edit` / `redo_edit` replay exactly (the editor wraps those in
QUndoCommands; this module never imports Qt).
"""
from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

import networkx as nx

from .errors import CycleError, ProgramError

KINDS = ("pointwise", "reduction", "matmul_epilogue", "conv_epilogue", "sibling", "layout", "pooling", "single",
         "opaque", "attention")
# the studio's hue per kind, one table for the canvas's region hulls and the profiles' kernel bars
# (graph_editor and profiler_view do not import each other); other kinds are drawn in single's grey
KIND_HUES = {"pointwise": "#4f9dde", "reduction": "#d9822b", "matmul_epilogue": "#9b6ad6",
             "conv_epilogue": "#c75d9b", "sibling": "#3fb28f", "pooling": "#2aa7b8", "single": "#8a8f98",
             "opaque": "#6b6f76"}
STATUSES = ("proposed", "accepted", "rejected", "user-made", "locked")
SCHEDULES = ("column-tiles", "warp-per-row", "block-per-row", "streamed-row", "cluster-per-row", "split-row",
             "two-pass")
# statuses the planner must keep as they are when it re-plans
KEPT_STATUSES = ("accepted", "user-made", "locked")


@dataclass
class Region:
    """One planned kernel. `schedule` holds kind-specific details, e.g. for a stitched reduction
    {"rows": 4096, "row_len": 1024, "schedule": "warp-per-row"}, and for a matmul epilogue
    {"anchor": "n3", "epilogue": ["n4", "n5"]}."""
    id: str
    kind: str
    nodes: list[str]
    status: str = "proposed"
    reason: str = ""
    est_before_ms: float | None = None
    est_after_ms: float | None = None
    measured_ms: float | None = None
    source: str | None = None
    log: list[dict] = field(default_factory=list)
    schedule: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ProgramError(f"region {self.id}: unknown kind '{self.kind}' (known: {', '.join(KINDS)})")
        if self.status not in STATUSES:
            raise ProgramError(f"region {self.id}: unknown status '{self.status}' "
                               f"(known: {', '.join(STATUSES)})")
        self.nodes = list(self.nodes)

    @property
    def saved_ms(self) -> float | None:
        if self.est_before_ms is None or self.est_after_ms is None:
            return None
        return self.est_before_ms - self.est_after_ms

    def note(self, actor: str, action: str, message: str) -> dict:
        """Append a decision-log entry (who, what, why) and return it."""
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "actor": actor,
                 "action": action, "message": message}
        self.log.append(entry)
        return entry

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "nodes": list(self.nodes), "status": self.status,
                "reason": self.reason, "est_before_ms": self.est_before_ms,
                "est_after_ms": self.est_after_ms, "measured_ms": self.measured_ms,
                "source": self.source, "log": copy.deepcopy(self.log),
                "schedule": copy.deepcopy(self.schedule)}

    @classmethod
    def from_dict(cls, d: dict) -> "Region":
        if not isinstance(d, dict):
            raise ProgramError(f"a region must be an object, got {type(d).__name__}")
        missing = [k for k in ("id", "kind", "nodes") if k not in d]
        if missing:
            raise ProgramError(f"region {d.get('id', '?')} is missing {', '.join(missing)}")
        nodes = d["nodes"]
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise ProgramError(f"region {d['id']}: nodes must be a list of node ids")
        for k in ("est_before_ms", "est_after_ms", "measured_ms"):
            v = d.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ProgramError(f"region {d['id']}: {k} must be a number or null, got {v!r}")
        log = d.get("log") or []
        if not isinstance(log, list) or not all(isinstance(e, dict) for e in log):
            raise ProgramError(f"region {d['id']}: log must be a list of objects")
        sched = d.get("schedule") or {}
        if not isinstance(sched, dict):
            raise ProgramError(f"region {d['id']}: schedule must be an object")
        src = d.get("source")
        if src is not None and not isinstance(src, str):
            raise ProgramError(f"region {d['id']}: source must be text or null")
        return cls(id=str(d["id"]), kind=str(d["kind"]), nodes=list(nodes),
                   status=str(d.get("status", "proposed")), reason=str(d.get("reason", "")),
                   est_before_ms=_num(d.get("est_before_ms")), est_after_ms=_num(d.get("est_after_ms")),
                   measured_ms=_num(d.get("measured_ms")), source=src, log=copy.deepcopy(log),
                   schedule=copy.deepcopy(sched))


def _num(v):
    return None if v is None else float(v)


# --- lookups ---------------------------------------------------------------------------------
def active_regions(program) -> list[Region]:
    """Regions that become kernels: everything but rejected ones (which stay in the list as the
    record of a user's decision, so the planner never proposes them again)."""
    return [r for r in program.regions if r.status != "rejected"]


def region_of(program, node_id: str) -> Region | None:
    """The active region holding node_id, if any."""
    for r in active_regions(program):
        if node_id in r.nodes:
            return r
    return None


def get_region(program, region_id: str) -> Region:
    for r in program.regions:
        if r.id == region_id:
            return r
    known = ", ".join(r.id for r in program.regions) or "none"
    raise ProgramError(f"no region '{region_id}' (regions: {known})")


def new_region_id(program, taken: Iterable[str] = ()) -> str:
    used = {r.id for r in program.regions} | set(taken)
    k = 1 + max((int(i[1:]) for i in used if i[:1] == "r" and i[1:].isdigit()), default=0)
    return f"r{k}"


def node_label(program, node_id: str) -> str:
    """How a node is named in messages: its id, and its name when that says more."""
    n = program.nodes.get(node_id)
    if n is None or not n.name or n.name == node_id:
        return node_id
    return f"{node_id} ({n.name})"


# --- legality --------------------------------------------------------------------------------
def check_region_nodes(program, nodes: Iterable[str], *, ignore: Iterable[str] = (),
                       graph: nx.DiGraph | None = None) -> str | None:
    """Why `nodes` cannot form one region alongside the program's other regions (except the region
    ids in `ignore`), or None if they can. Checks: known nodes, not empty, no node in two regions,
    no path that leaves the region and comes back in, no cycle between regions."""
    nodes = list(dict.fromkeys(nodes))
    if not nodes:
        return "a region needs at least one node"
    unknown = [n for n in nodes if n not in program.nodes]
    if unknown:
        return f"no node {', '.join(unknown)} in the program"
    ignore = set(ignore) | {r.id for r in program.regions if r.status == "rejected"}
    members = set(nodes)
    for r in program.regions:
        if r.id in ignore:
            continue
        both = [n for n in r.nodes if n in members]
        if both:
            return (f"{', '.join(node_label(program, n) for n in both)} already belong"
                    f"{'s' if len(both) == 1 else ''} to region {r.id}")
    g = graph if graph is not None else program.graph()
    msg = convexity_violation(program, g, members)
    if msg:
        return msg
    others = [set(r.nodes) for r in program.regions if r.id not in ignore]
    return region_cycle(program, g, others + [members], names=[r.id for r in program.regions
                                                                 if r.id not in ignore] + ["the new region"])


def convexity_violation(program, g: nx.DiGraph, members: set) -> str | None:
    """A path that leaves the node set and comes back in (which would make the region wait on its own
    output), described with its exit edge and re-entry node, or None."""
    # BFS from the region's outside successors; parent links recover the exit edge.
    parent: dict[str, str] = {}
    queue = deque()
    for m in members:
        for s in g.successors(m):
            if s not in members and s not in parent:
                parent[s] = m
                queue.append(s)
    while queue:
        x = queue.popleft()
        for s in g.successors(x):
            if s in members:
                exit_node = x
                while parent[exit_node] not in members:
                    exit_node = parent[exit_node]
                src = parent[exit_node]
                return (f"region would create a cycle: {src} -> {exit_node} leaves the region and "
                        f"{s} comes back in (through {x})" if x != exit_node else
                        f"region would create a cycle: {src} -> {exit_node} leaves the region and "
                        f"{s} comes back in")
            if s not in parent:
                parent[s] = x
                queue.append(s)
    return None


def region_cycle(program, g: nx.DiGraph, groups: list[set], names: list[str] | None = None) -> str | None:
    """A cycle between groups of nodes once each group is one kernel, described, or None."""
    owner = {}
    for i, grp in enumerate(groups):
        for n in grp:
            owner[n] = i
    q = nx.DiGraph()
    unit = lambda n: ("g", owner[n]) if n in owner else ("n", n)  # noqa: E731
    q.add_nodes_from(unit(n) for n in g.nodes)
    for a, b in g.edges:
        ua, ub = unit(a), unit(b)
        if ua != ub:
            q.add_edge(ua, ub, edge=(a, b))
    try:
        cyc = nx.find_cycle(q)
    except nx.NetworkXNoCycle:
        return None
    names = names or [f"group {i + 1}" for i in range(len(groups))]
    parts = []
    for ua, ub in cyc:
        a, b = q.edges[ua, ub]["edge"]
        who = names[ua[1]] if ua[0] == "g" else a
        parts.append(f"{who} feeds {names[ub[1]] if ub[0] == 'g' else b} ({a} -> {b})")
    return "regions would form a cycle: " + ", ".join(parts)


def check_program_regions(program) -> list[str]:
    """Every problem with the program's regions (for loading a file and for tests). Rejected regions
    only need known nodes and a unique id; they do not own their nodes."""
    problems = []
    seen: dict[str, str] = {}
    ids = set()
    for r in program.regions:
        if r.id in ids:
            problems.append(f"region id {r.id} is used twice")
        ids.add(r.id)
        for n in r.nodes:
            if r.status == "rejected":
                if n not in program.nodes:
                    problems.append(f"region {r.id} names node {n}, which is not in the program")
                continue
            if n not in program.nodes:
                problems.append(f"region {r.id} names node {n}, which is not in the program")
            elif n in seen:
                problems.append(f"{node_label(program, n)} is in both region {seen[n]} and region {r.id}")
            else:
                seen[n] = r.id
    if problems:
        return problems
    g = program.graph()
    active = active_regions(program)
    for r in active:
        msg = convexity_violation(program, g, set(r.nodes))
        if msg:
            problems.append(f"{r.id}: {msg}")
    if not problems:
        msg = region_cycle(program, g, [set(r.nodes) for r in active], [r.id for r in active])
        if msg:
            problems.append(msg)
    return problems


# --- edits (undoable model operations) ---------------------------------------------------------
@dataclass
class RegionEdit:
    """What one region edit changed: the whole region list before and after (regions are small)."""
    label: str
    before: list[dict]
    after: list[dict]
    region_ids: list[str]


def _snapshot(program) -> list[dict]:
    return [r.to_dict() for r in program.regions]


def _apply(program, snapshot: list[dict], region_ids: list[str], action: str) -> None:
    program.regions = [Region.from_dict(d) for d in snapshot]
    program._emit("regions_changed", region_ids=list(region_ids), action=action)


def _commit(program, label: str, before: list[dict], region_ids: list[str], action: str) -> RegionEdit:
    edit = RegionEdit(label, before, _snapshot(program), list(region_ids))
    program._emit("regions_changed", region_ids=list(region_ids), action=action)
    return edit


def undo_edit(program, edit: RegionEdit) -> None:
    _apply(program, edit.before, edit.region_ids, "undo")


def redo_edit(program, edit: RegionEdit) -> None:
    _apply(program, edit.after, edit.region_ids, "redo")


def set_status(program, region_id: str, status: str, *, actor: str = "user",
               message: str = "") -> RegionEdit:
    """Accept, reject, lock or unlock (back to accepted) a region."""
    if status not in STATUSES:
        raise ProgramError(f"unknown region status '{status}' (known: {', '.join(STATUSES)})")
    r = get_region(program, region_id)
    if r.status == "locked" and status != "locked" and actor != "user":
        raise ProgramError(f"region {region_id} is locked; only a user can unlock it")
    if status != "user-made" and r.status == status:
        raise ProgramError(f"region {region_id} is already {status}")
    before = _snapshot(program)
    old = r.status
    r.status = status
    r.note(actor, status, message or f"{old} -> {status}")
    return _commit(program, f"{_VERB.get(status, status)} region {region_id}", before, [region_id], status)


_VERB = {"accepted": "Accept", "rejected": "Reject", "locked": "Lock", "proposed": "Reopen"}


def accept(program, region_id: str) -> RegionEdit:
    return set_status(program, region_id, "accepted")


def reject(program, region_id: str) -> RegionEdit:
    return set_status(program, region_id, "rejected")


def lock(program, region_id: str) -> RegionEdit:
    return set_status(program, region_id, "locked")


def unlock(program, region_id: str) -> RegionEdit:
    r = get_region(program, region_id)
    if r.status != "locked":
        raise ProgramError(f"region {region_id} is not locked (it is {r.status})")
    return set_status(program, region_id, "accepted", message="unlocked")


def draw_region(program, nodes: Iterable[str], *, kind: str | None = None, reason: str = "",
                status: str = "user-made") -> tuple[Region, RegionEdit]:
    """A region drawn by hand around `nodes`; refused with a precise message if illegal."""
    nodes = list(dict.fromkeys(nodes))
    msg = check_region_nodes(program, nodes)
    if msg:
        raise (CycleError if "cycle" in msg else ProgramError)(msg)
    before = _snapshot(program)
    kind = kind or guess_kind(program, nodes)
    r = Region(new_region_id(program), kind, order_nodes(program, nodes), status=status,
               reason=reason or f"drawn by hand around {len(nodes)} node{'s' if len(nodes) != 1 else ''}")
    r.note("user", "drawn", f"drawn by hand: {', '.join(r.nodes)}")
    program.regions.append(r)
    return r, _commit(program, f"Draw region {r.id}", before, [r.id], "drawn")


def remove_region(program, region_id: str) -> RegionEdit:
    r = get_region(program, region_id)
    before = _snapshot(program)
    program.regions.remove(r)
    return _commit(program, f"Remove region {region_id}", before, [region_id], "removed")


def split_region(program, region_id: str, parts: list[Iterable[str]]) -> tuple[list[Region], RegionEdit]:
    """Split a region into the given parts (which must cover its nodes exactly once); each part is
    checked for legality against the others. Nodes a part leaves out are an error, not dropped."""
    r = get_region(program, region_id)
    if r.status == "locked":
        raise ProgramError(f"region {region_id} is locked; unlock it before splitting it")
    parts = [list(dict.fromkeys(p)) for p in parts]
    parts = [p for p in parts if p]
    if len(parts) < 2:
        raise ProgramError(f"splitting region {region_id} needs at least two non-empty parts")
    flat = [n for p in parts for n in p]
    dup = sorted({n for n in flat if flat.count(n) > 1})
    if dup:
        raise ProgramError(f"{', '.join(dup)} appear{'s' if len(dup) == 1 else ''} in more than one part")
    extra = [n for n in flat if n not in r.nodes]
    if extra:
        raise ProgramError(f"{', '.join(extra)} {'is' if len(extra) == 1 else 'are'} not in region {region_id}")
    left = [n for n in r.nodes if n not in set(flat)]
    if left:
        raise ProgramError(f"the parts leave out {', '.join(left)} of region {region_id}")
    g = program.graph()
    for p in parts:
        msg = convexity_violation(program, g, set(p))
        if msg:
            raise CycleError(msg)
    others = [x for x in active_regions(program) if x.id != region_id]
    msg = region_cycle(program, g, [set(x.nodes) for x in others] + [set(p) for p in parts],
                       [x.id for x in others] + [f"part {i + 1}" for i in range(len(parts))])
    if msg:
        raise CycleError(msg)
    before = _snapshot(program)
    idx = program.regions.index(r)
    new, taken = [], []
    for i, p in enumerate(parts):
        rid = r.id if i == 0 else new_region_id(program, taken)
        taken.append(rid)
        nr = Region(rid, guess_kind(program, p), order_nodes(program, p), status="user-made",
                    reason=f"split by hand from region {region_id}", log=copy.deepcopy(r.log))
        nr.note("user", "split", f"split from {region_id} ({len(r.nodes)} nodes) into "
                f"{len(parts)} parts; this part has {', '.join(nr.nodes)}")
        new.append(nr)
    program.regions[idx:idx + 1] = new
    return new, _commit(program, f"Split region {region_id}", before, taken, "split")


def merge_regions(program, region_ids: list[str]) -> tuple[Region, RegionEdit]:
    """Merge regions into one (kept under the first id); refused if the result would be illegal."""
    region_ids = list(dict.fromkeys(region_ids))
    if len(region_ids) < 2:
        raise ProgramError("merging needs at least two regions")
    regs = [get_region(program, rid) for rid in region_ids]
    locked = [r.id for r in regs if r.status == "locked"]
    if locked:
        raise ProgramError(f"region {', '.join(locked)} {'is' if len(locked) == 1 else 'are'} locked; "
                           "unlock before merging")
    nodes = [n for r in regs for n in r.nodes]
    msg = check_region_nodes(program, nodes, ignore=region_ids)
    if msg:
        raise (CycleError if "cycle" in msg else ProgramError)(msg)
    before = _snapshot(program)
    first = regs[0]
    merged = Region(first.id, guess_kind(program, nodes), order_nodes(program, nodes), status="user-made",
                    reason=f"merged by hand from regions {', '.join(region_ids)}",
                    log=[e for r in regs for e in copy.deepcopy(r.log)])
    merged.note("user", "merged", f"merged {', '.join(region_ids)} ({len(nodes)} nodes)")
    idx = program.regions.index(first)
    program.regions[idx] = merged
    for r in regs[1:]:
        program.regions.remove(r)
    return merged, _commit(program, f"Merge regions {', '.join(region_ids)}", before, region_ids, "merged")


def replace_regions(program, regions: list[Region], *, label: str = "Plan") -> RegionEdit:
    """Install a whole new region list (what the planner does), as one undoable edit."""
    before = _snapshot(program)
    program.regions = list(regions)
    return _commit(program, label, before, [r.id for r in regions], "planned")


# --- helpers ---------------------------------------------------------------------------------
def order_nodes(program, nodes: Iterable[str]) -> list[str]:
    """Nodes in the program's topological order (a region lists its members in execution order)."""
    members = set(nodes)
    try:
        order = program.topo_order()
    except ProgramError:
        return sorted(members)
    return [n for n in order if n in members]


def guess_kind(program, nodes: Iterable[str]) -> str:
    """The region kind a set of nodes most plausibly is, from the ops' categories."""
    nodes = list(nodes)
    cats = []
    for n in nodes:
        try:
            cats.append(program.nodes[n].opdef.category)
        except (KeyError, ProgramError):
            cats.append("opaque")
    if len(nodes) == 1:
        return "opaque" if cats[0] == "opaque" else "single"
    if "opaque" in cats:
        return "opaque"
    if "convolution" in cats:
        return "conv_epilogue"
    if "matmul" in cats:
        return "matmul_epilogue"
    if "reduction" in cats or "normalization" in cats:
        return "reduction"
    g = program.graph().subgraph(nodes)
    if g.number_of_edges() == 0:
        return "sibling"
    return "pointwise"
