"""Guarded loads: a row input whose every use ends in one arm of a where (or masked_fill) is loaded
only where that where takes the arm.

A causal softmax reads where(tril, scores, -inf): above the diagonal the scores are never used, yet a
plain kernel loads them. Here the condition is computed first, from the other inputs, and the input's
vector load is issued only where one of its lanes is taken (elsewhere zeros, which no output reads):
about half of a causal score matrix is never read. The values are those of the unguarded kernel; only
the traffic differs.

An input is guarded by (condition, arm) when every chain of per-element uses from it reaches a where
through that arm (never its condition, never both arms) before any output, fold or per-row use; all
its chains must reach the same condition and arm. The condition must be computable per element before
the loads (per-element definitions only, no reduction's result) and must not read a guarded input.
"""
from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

from .rowgraph import E, RowGraph


def guarded_inputs(g: RowGraph, need: set[str]) -> dict[str, tuple[str, bool]]:
    """Region input value -> (the condition's key, whether the input is taken where it holds)."""
    sinks = set(g.outputs.values()) | {k for s in g.steps + g.row_totals for k in s.args}
    sinks |= {g.defs[k].scan[1] for k in g.scans} | {k for keys, _ in g.row_cats.values() for k in keys}
    users = defaultdict(list)
    for d in g.defs.values():
        if d.key in need:
            for k in d.deps:
                users[k].append(d)

    @lru_cache(maxsize=None)
    def gate(key: str) -> tuple[str, bool] | None:
        if key in sinks or not users[key]:
            return None
        found = set()
        for u in users[key]:
            if u.space != E:
                return None
            sel = u.select
            if sel is not None and key != sel[0] and (key == sel[1]) != (key == sel[2]):
                found.add((sel[0], key == sel[1]))
                continue
            via = gate(u.key)
            if via is None:
                return None
            found.add(via)
        return found.pop() if len(found) == 1 else None

    guards = {}
    for (vid, space), key in g.inputs.items():
        if space != E or key not in need:
            continue
        via = gate(key)
        if via is None:
            continue
        cond = g.closure([via[0]], E, need)
        reads = {k for d in cond for k in d.deps} | {via[0]}
        if key in {d.key for d in cond} or any(g.defs[k].space != E or g.defs[k].scan is not None for k in reads):
            continue
        guards[vid] = via
    # a condition read from a guarded input would need that input first: such guards are dropped
    by_key = {g.inputs[(v, E)]: v for v in guards}
    for vid, (c, _) in list(guards.items()):
        if any(d.key in by_key for d in g.closure([c], E, need)):
            del guards[vid]
    return guards
