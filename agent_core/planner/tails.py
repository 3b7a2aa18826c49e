"""Pointwise tails handed from a reduction's kernel to the kernel that consumes them.

Greedy vertical fusion puts a pointwise op with the group that produces its input. After a reduction
that is often the wrong side: DINO's standardisation (column mean and std over axis 0, then
`(x - mean) / std`) feeding a softmax over axis 1 became one kernel writing the standardised
[256, 65536] tensor out for the softmax's kernel to read back. Handed to the softmax's kernel instead,
those ops are computed there from x and the two [1, 65536] statistics (as Inductor computes a
pointwise node inside each consumer): the reduction's kernel writes only the statistics, and the full
tensor is never written.

A tail is the pointwise and view nodes of a reduction group whose every consumer is in the tail or in
one consuming group, none of them a program output. It moves only when both kernels still generate
and the roofline time of the two together falls.
"""
from __future__ import annotations

from .explain import lowering_refusal
from .fusion import group_facts, group_time, summarize

_MOVABLE = ("pointwise", "view")


def tail_for(state, a: int, b: int) -> list[str]:
    """The nodes of group a that may move into its consumer group b (in a's order), or []."""
    ga = state.groups[a]
    members, gb = set(ga.nodes), set(state.groups[b].nodes)
    tail: set[str] = set()
    for nid in reversed(state.sort_nodes(ga.nodes)):
        if state.geo[nid].role not in _MOVABLE or nid in getattr(state, "rejected_by_node", {}):
            continue
        outs = state.nout[nid]
        if any(v in state.outputs for v in outs):
            continue
        users = [c for v in outs for c in state.consumers.get(v, ())]
        if users and all(c in tail or c in gb for c in users):
            tail.add(nid)
    if not tail or all(state.geo[n].role in _MOVABLE for n in members - tail):
        return []   # nothing moves, or nothing but pointwise ops would be left (fusion already chose)
    return [n for n in state.sort_nodes(ga.nodes) if n in tail]


def _lowers(state, nodes) -> bool:
    s, f = summarize(state, nodes), group_facts(state, nodes)
    b = state.budgets
    if s.ops > b.max_ops or len(f.reads) > b.max_inputs:
        return False
    return lowering_refusal(state, nodes, s, f.escaping) is None


def _ms(state, nodes) -> float:
    return group_time(state, nodes)[0]


def hand_tails_down(state, note) -> None:
    """Move each reduction group's pointwise tail into the group that consumes it, where that saves
    time (see the module docstring). `note(action, nodes, message)` logs each move."""
    for ga in list(state.ordered_groups()):
        a = ga.gid
        if a not in state.groups or ga.frozen is not None:
            continue
        sa = summarize(state, ga.nodes)
        if not sa.reductions or sa.anchor or sa.window or sa.blocker:
            continue
        ta = _ms(state, ga.nodes)
        for b in sorted(state.succ[a], key=state.pos.__getitem__):
            gb = state.groups[b]
            sb = summarize(state, gb.nodes)
            if gb.frozen is not None or sb.anchor or sb.window or sb.blocker:
                continue
            tail = tail_for(state, a, b)
            if not tail:
                continue
            moved = set(tail)
            a2 = [n for n in ga.nodes if n not in moved]
            b2 = tail + gb.nodes
            saved = ta + _ms(state, gb.nodes) - _ms(state, a2) - _ms(state, b2)
            if saved <= 1e-9 or not _lowers(state, a2) or not _lowers(state, b2):
                continue
            state.move(tail, a, b)
            names = ", ".join(state.program.nodes[n].name for n in tail)
            note("moved", tail, f"{names} computed in the consumer's kernel from what they read instead of "
                 f"written out by the reduction's; saves about {saved * 1000:.2f} us")
            break
