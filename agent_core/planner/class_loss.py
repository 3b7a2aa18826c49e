"""The class-loss chain as one group: log_softmax over the class dim, the nll_loss terms over the same
rows, sums over those classes (label smoothing), pointwise ops on the rows' values and the sums over
every row that reduce the loss. The row kernel (codegen/rowkernel.py) writes such a group as one kernel
that reads each logit once; whether a given group generates stays codegen.can_lower's answer (fusion.backend_refusal).

Without this rule the reductions of the chain look unrelated to the planner (different row keys,
nll_loss(full_like(x), t) not reading the log_softmax), and the log-probabilities, the largest tensor
of the loss, were written and read back between two kernels.
"""
from __future__ import annotations

import math

from .geometry import CLASS_LOSSES


def _class_rows(state, nid):
    """(full shape, class dim) of a log_softmax or nll_loss node, else None."""
    node = state.program.nodes[nid]
    g = state.geo[nid]
    if node.op == "log_softmax" and g.key and len(g.key[1]) == 1:
        return g.full, g.key[1][0]
    if node.op in CLASS_LOSSES and node.op == "nll_loss" and len(g.full) >= 1:
        return g.full, 0 if len(g.full) == 1 else 1
    return None


def class_loss_rows(state, sa, sb):
    """(full shape, class dim) when the reductions of groups sa and sb together are one class loss:
    an nll_loss, at most one log_softmax over its rows, sums over its classes, and sums or means over
    all of its rows; else None."""
    reds = sa.reductions + sb.reductions
    program = state.program
    if not any(program.nodes[r].op == "nll_loss" for r in reds):
        return None
    found = {_class_rows(state, r) for r in reds} - {None}
    if len(found) != 1 or sum(program.nodes[r].op == "log_softmax" for r in reds) > 1:
        return None
    full, cd = found.pop()
    rows = math.prod(full) // max(full[cd], 1)
    for r in reds:
        node, g = program.nodes[r], state.geo[r]
        if _class_rows(state, r) is not None:
            continue
        if node.op == "sum" and g.full == full and g.key[1] == (cd,):
            continue                                    # a sum over the classes
        if node.op in ("sum", "mean") and g.rows == 1 and g.full_numel == rows:
            continue                                    # the loss's sum / mean over every row
        return None
    return full, cd


def class_loss_refusal(state, a, b, sa, sb, rows) -> str | None:
    """Why a class-loss union is refused on loop sizes (logits, rows, or the reduced loss), or the
    decisions the user made about the two groups."""
    full, cd = rows
    n_full = math.prod(full)
    allowed = {n_full, n_full // max(full[cd], 1), 1}
    for s in (sa, sb):
        for nid, ne in s.numels.items():
            if ne not in allowed:
                node = state.program.nodes[nid]
                return (f"{node.name} ({node.op}) loops over {ne} elements, neither the {n_full} logits, the "
                        f"{n_full // max(full[cd], 1)} rows nor the reduced loss of the class loss")
    return state.rejected_conflict(a, b)


def reads_rows_once(state, nodes) -> bool:
    """A class-loss group whose log-probabilities never leave it: its kernel streams each row once
    (online log-sum-exp) and gathers the label's logit, so a long row is not read twice."""
    program = state.program
    members = set(nodes)
    soft = [n for n in nodes if program.nodes[n].op == "log_softmax"]
    if len(soft) != 1 or not any(program.nodes[n].op == "nll_loss" for n in nodes):
        return False
    out = program.nodes[soft[0]].outputs[0]
    return out not in state.outputs and all(c in members for c in state.consumers.get(out, ()))


def recomputes_nothing(state, sa, sb) -> bool:
    """Groups sa and sb make one class loss and the smaller loop is per-row or scalar work (the label's
    `where(mask == 1, labels, -100)`, the mean's division): the class-loss kernel evaluates such ops
    once per row or once in all, never per logit, so the merge recomputes nothing."""
    if not sa.numels or not sb.numels:
        return False
    rows = class_loss_rows(state, sa, sb)
    if rows is None:
        return False
    full, cd = rows
    small = min((sa, sb), key=lambda s: max(s.numels.values()))
    return all(ne in (math.prod(full) // max(full[cd], 1), 1) for ne in small.numels.values())
