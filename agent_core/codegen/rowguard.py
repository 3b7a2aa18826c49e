"""Guarded loads: a row input whose every use ends in one arm of a select (where, masked_fill, an
nll loss where its label counts) is loaded only where a select takes it.

A causal softmax reads where(tril, scores, -inf): above the diagonal the scores are never used, yet a
plain kernel loads them. Here the condition is computed first, from the other inputs, and the input's
vector load is issued only where one of its lanes is taken (elsewhere zeros, which no output reads):
about half of a causal score matrix is never read. The values are those of the unguarded kernel; only
the traffic differs.

An input is guarded when every chain of uses from it reaches a select through one arm (never its
condition, never both arms) before any output or whole-tensor fold; its gates are those (condition,
arm) pairs, and it is loaded where any of them takes it. A chain may pass through a fold of the row
(a reduction's step) only to per-row conditions: a cross entropy's rows whose label is ignored
(rowpick.nll's loss is such a select, and so is label smoothing's term) are not read at all, since
their log-sum-exp reaches nothing else. Each condition must be computable before the loads: per
element from the other inputs, or per row from per-row values no fold precedes, and never from a
guarded input.
"""
from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

from .rowgraph import E, R, RowGraph


def guarded_inputs(g: RowGraph, need: set[str]) -> dict[str, frozenset]:
    """Region input value -> its gates: (the condition's key, whether the input is taken where it
    holds) pairs; the input is needed only where at least one of them takes it."""
    sinks = set(g.outputs.values()) | {k for s in g.row_totals for k in s.args}
    sinks |= {g.defs[k].scan[1] for k in g.scans} | {k for keys, _ in g.row_cats.values() for k in keys}
    sinks |= {k for s in g.steps if s.total is not None for k in s.args}
    users = defaultdict(list)
    for d in g.defs.values():
        if d.key in need:
            for k in d.deps:
                users[k].append(d)
    folds = defaultdict(list)          # E key -> the fields of each row fold of it
    for s in g.steps:
        if s.total is None:
            for k in s.args:
                folds[k].append(s.fields)

    @lru_cache(maxsize=None)
    def gate(key: str) -> frozenset | None:
        if key in sinks or not (users[key] or folds[key]):
            return None
        found: set = set()
        for u in users[key]:
            sel = u.select
            if sel is not None and key != sel[0] and (key == sel[1]) != (key == sel[2]):
                found.add((sel[0], key == sel[1]))
                continue
            via = gate(u.key)
            if via is None:
                return None
            found |= via
        for fields in folds[key]:     # a fold needs the whole row: only per-row conditions pass
            for f in fields:
                via = gate(f)
                if via is None or any(g.defs[c].space != R for c, _ in via):
                    return None
                found |= via
        return frozenset(found) if found else None

    guards = {}
    for (vid, space), key in g.inputs.items():
        if space != E or key not in need:
            continue
        via = gate(key)
        if via is not None and all(_computable_first(g, need, c, key) for c, _ in via):
            guards[vid] = via
    # a condition read from a guarded input would need that input first: such guards are dropped
    by_key = {g.inputs[(v, E)]: v for v in guards}
    for vid, via in list(guards.items()):
        if any(d.key in by_key for c, _ in via for d in g.closure([c], g.defs[c].space, need)):
            del guards[vid]
    return guards


def _computable_first(g: RowGraph, need: set[str], cond: str, key: str) -> bool:
    """Whether `cond` can be computed before the loads, without the input `key`: per element from
    per-element values, or per row from the per-row values the kernel computes before any fold."""
    space = g.defs[cond].space
    if space not in (E, R):
        return False
    defs = g.closure([cond], space, need)
    reads = {k for d in defs for k in d.deps} | {cond}
    return key not in {d.key for d in defs} and all(
        g.defs[k].space == space and g.defs[k].scan is None and (space == E or g.defs[k].round == 0) for k in reads)
