"""Which regions are worth tuning: those whose share of the program's estimated time is at least
MIN_SHARE, counting every region that runs the same kernel on the same shapes (agent.shared_regions
tunes such a group once, for all of them).

Tuning only changes a kernel's launch parameters, and a region can at best gain its own time, so a
region under 1% of the program cannot change the total by more than 1%: it keeps its verified
default parameters, and its tuning record says why. Regions without an estimate are tuned.
"""
from __future__ import annotations

MIN_SHARE = 0.01


def region_share(agent, r) -> float | None:
    """The estimated share of the program's time of region r and the regions of its signature."""
    total = getattr(agent, "planned_ms", None)
    est = r.est_after_ms if r.est_after_ms is not None else r.est_before_ms
    if not total or est is None:
        return None
    shared = getattr(agent, "shared", None)
    n = shared.group_size(r) if shared is not None else 1
    return est * n / total


def worth_tuning(agent, r, out) -> bool:
    """True to tune region r; otherwise its outcome's trials record the skip with the share."""
    share = region_share(agent, r)
    if share is None or share >= MIN_SHARE:
        return True
    why = (f"default parameters kept without tuning: the region is about {share * 100:.2f}% of the "
           f"program's estimated time (regions under {MIN_SHARE * 100:.0f}% are not tuned)")
    out.trials.append({"trial": "skipped", "ok": False, "reason": why})
    agent.ev.log(f"region {r.id}: {why}", region=r.id)
    return False
