"""The tuning space of each kernel kind: the launch parameters codegen exposes, as a short list of
alternatives to the default, most promising first. The loop measures each and keeps the fastest that
verifies.
"""
from __future__ import annotations


def tune_space(ks, *, sm_count: int = 132, limit: int = 6) -> list[dict]:
    """Parameter dicts to try besides the default that produced `ks` (a KernelSource)."""
    p = ks.params or {}
    out: list[dict] = []
    if ks.kind == "pointwise":
        for cand in ({"unroll": 1}, {"unroll": 2}, {"block": 128}, {"block": 512}, {"block": 512, "unroll": 2},
                     {"vector_width": 1}):
            out.append({**cand, "sm_count": sm_count})
    elif ks.kind == "row_reduction" and p.get("schedule") in ("warp", "block"):
        tpr = int(p.get("threads_per_row") or 32)
        for t in (tpr * 2, tpr // 2, tpr * 4, tpr // 4):
            if 4 <= t <= 1024:
                out.append({"threads_per_row": t, "sm_count": sm_count})
        if p.get("schedule") == "warp":
            for b in (128, 512):
                out.append({"block": b, "sm_count": sm_count})
    elif ks.kind == "row_reduction" and p.get("schedule") == "split":
        s = int(p.get("split") or 2)
        for cand in (s * 2, max(2, s // 2)):
            if cand != s:
                out.append({"split": cand, "sm_count": sm_count})
    # layout and column kernels expose no launch parameters yet
    return out[:limit]
