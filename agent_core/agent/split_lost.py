"""A region that verified but lost to its unfused ops is tried again as the planner's next split of it.

The planner plans the region's nodes again with the region rejected and every other region kept as
it is; each part then goes through the agent's loop like any region (generated, verified, tuned,
timed against its own unfused ops) and replaces the region in the program. A fused kernel can lose
where its parts win: level 2's 65 fused avg pool -> sigmoid -> sum ran 3.58 ms against 2.10 ms for
torch's ops, so the pool and the sum, each of which had a kernel faster than torch's, ran through
torch too. One level deep: a part that loses in turn runs through torch.

Only regions worth it are split again: those at least tune_budget.MIN_SHARE of the program's
estimated time (a level-3 model records hundreds of lost regions of a few microseconds).
"""
from __future__ import annotations

import dataclasses

from ..regions import replace_regions
from .phases import phase
from .tune_budget import MIN_SHARE, region_share

LOST = "correct but not faster than its unfused ops"


def worth_splitting(agent, r, outcome) -> bool:
    if outcome.status != "fallback" or not outcome.reason.startswith(LOST) or len(r.nodes) < 2:
        return False
    share = region_share(agent, r)
    return share is None or share >= MIN_SHARE


def next_split(program, r) -> list:
    """The planner's regions for r's nodes with r rejected and every other region kept exactly (on
    copies: the program's regions are left as they are). A part that would take a node from outside r
    is left out: its nodes of r run through torch."""
    from ..planner import plan_program
    mine = program.regions
    program.regions = [dataclasses.replace(x, status="rejected" if x.id == r.id or x.status == "rejected" else "locked",
                                           log=list(x.log), schedule=dict(x.schedule)) for x in mine]
    try:
        plan = plan_program(program)
    finally:
        program.regions = mine
    members = set(r.nodes)
    return [x for x in plan.active if set(x.nodes) <= members]


def split_lost(agent, program, lost: list, run) -> dict:
    """Try the next split of each (region, outcome) in `lost`; run(part) runs a part through the
    agent's loop. Installs the parts in place of their region (one edit) and returns
    {region id: its parts}."""
    from ..codegen import region_io
    splits = {}
    for r, outcome in lost:
        with phase("plan"):
            parts = next_split(program, r)
        if not parts:
            continue
        for k, p in enumerate(parts, 1):      # each split is planned alone: its ids name their region
            p.id = f"{r.id}_{k}"
        splits[r.id] = parts
        names = "; ".join(f"{p.id} ({', '.join(program.nodes[n].name for n in p.nodes)})" for p in parts)
        outcome.reason += f"; tried as the planner's next split of it instead: {names}"
        for p in parts:
            p.reason = (f"Split from {r.id}, which verified but was slower than its unfused ops "
                        f"({outcome.fused_ms * 1e3:.1f} us vs {outcome.unfused_ms * 1e3:.1f} us). {p.reason}"
                        if outcome.fused_ms and outcome.unfused_ms else f"Split from {r.id}. {p.reason}")
        agent.ev.log(f"region {r.id} lost to its unfused ops: trying the planner's next split of it, {names}",
                     region=r.id)
    if not splits:
        return {}
    if agent.ref is not None:      # the parts' boundaries were inside their regions: keep their values too
        agent.ref.also_keep({v for parts in splits.values() for p in parts
                             for io in [region_io(program, p.nodes)] for v in io.inputs + io.outputs})
    regions = []
    for x in program.regions:
        regions += splits.get(x.id, [x])
    replace_regions(program, regions, label="Split regions that lost")
    for rid, parts in splits.items():
        for p in parts:
            agent.ev.emit("region-proposed", region=p.id, kind=p.kind, nodes=list(p.nodes), reason=p.reason,
                          est_before_ms=p.est_before_ms, est_after_ms=p.est_after_ms, schedule=p.schedule,
                          split_from=rid)
            run(p)
    return splits
