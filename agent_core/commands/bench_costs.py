"""What a bench problem costs besides its speed: the agent's own time and the peak GPU memory of our
program against eager's (issue #17's "<= 60 s at p95" and "peak memory <= eager's").

Record fields (docs/OPTIMIZE.md, bench): `agent_seconds`, `agent_phases`, `gpu_wait_seconds`,
`peak_mem_eager_bytes`, `peak_mem_ours_bytes`, `peak_mem_ratio`, `peak_mem_ours_parts` (or `peak_mem_error`).
"""
from __future__ import annotations

import math
import os

from ..text import plural


def agent_fields(clock) -> dict:
    """agent_seconds (the optimize pipeline, torch's baselines and waits for other problems' GPU work
    left out), its phases (agent.phases) and those waits (bench --jobs)."""
    return {"agent_seconds": round(clock.agent_seconds, 2), "agent_phases": clock.phases(),
            "gpu_wait_seconds": round(clock.totals.get("gpu_wait", 0.0), 2)}


def _eager_callable(path: str):
    """The eager side: the file's Model for a .py (as its speed baseline), else the program as given,
    op by op through torch."""
    from ..profile.baselines import program_callable, source_callable
    if path.endswith(".py") and os.path.isfile(path):
        return source_callable(path, "cuda")
    from .import_cmd import open_program
    return program_callable(open_program(path), "cuda")


def peak_memory_fields(path: str, result) -> dict:
    """The peak-memory fields of a GPU run (None on a CPU run; an error is recorded, never raised).
    Frees the run's executable first: only the kernels it kept are needed to build ours again."""
    none = {"peak_mem_eager_bytes": None, "peak_mem_ours_bytes": None, "peak_mem_ratio": None}
    exe = result.executable
    if not result.gpu or exe is None:
        return none
    import gc

    import torch

    from ..profile.peak_memory import fused_of, peak_memory_record
    from ..profile.timing import gpu_work
    fused, graph = fused_of(exe), exe.graph is not None
    result.executable = exe = None
    gc.collect()
    torch.cuda.empty_cache()
    try:
        with gpu_work():     # never during another problem's timed section (bench --jobs)
            fn, inputs = _eager_callable(path)
            rec = peak_memory_record(result.program, fused, graph, fn, inputs)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        return {**none, "peak_mem_error": f"{type(exc).__name__}: {first[:300]}"}
    finally:
        fn = inputs = None
        gc.collect()
    return rec


def nearest_rank(xs: list[float], p: float) -> float | None:
    """The p-th percentile by nearest rank (the smallest value with at least p% of them at or below)."""
    xs = sorted(xs)
    if not xs:
        return None
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


def agent_time_summary(records: list[dict]) -> dict:
    """p50, p95 and max of agent_seconds; where problems waited for the GPU lock (bench --jobs), also
    the p95 with those waits counted in (`p95_with_waits`, else None)."""
    timed = [r for r in records if isinstance(r.get("agent_seconds"), (int, float))]
    secs = [r["agent_seconds"] for r in timed]
    waits = [r.get("gpu_wait_seconds") or 0.0 for r in timed]
    return {"measured": len(secs), "p50": nearest_rank(secs, 50), "p95": nearest_rank(secs, 95),
            "max": max(secs) if secs else None,
            "p95_with_waits": nearest_rank([a + w for a, w in zip(secs, waits)], 95) if any(waits) else None}


def agent_time_scope(t: dict) -> str:
    """What the agent-time figures leave out, for a summary line."""
    if t.get("p95_with_waits") is None:
        return "torch's baselines excluded"
    return (f"torch's baselines and waits for other problems' GPU work excluded "
            f"(p95 {t['p95_with_waits']:.1f} s with the waits)")


def memory_summary(records: list[dict]) -> dict:
    """Which problems' peaks are above eager's, by their bytes: the record's ratio is rounded to 4
    places, which reads 16 bytes above a 77 MiB peak (39_GRU: the CUDA graph's RNG seed and offset)
    as 1.0. above_bytes: problem -> bytes above eager's."""
    ratios = {r["problem"]: r["peak_mem_ratio"] for r in records if r.get("peak_mem_ratio") is not None}
    over = {r["problem"]: r["peak_mem_ours_bytes"] - r["peak_mem_eager_bytes"] for r in records
            if r.get("peak_mem_ratio") is not None and r["peak_mem_ours_bytes"] > r["peak_mem_eager_bytes"]}
    above = sorted(over, key=lambda p: (-ratios[p], -over[p]))
    return {"measured": len(ratios), "above_eager": above, "above_bytes": over, "ratios": ratios,
            "max_ratio": max(ratios.values()) if ratios else None}


def above_names(m: dict) -> list[str]:
    """memory_summary's problems above eager's, those whose ratio prints as 1.00 with their bytes."""
    return [p + (f" (+{m['above_bytes'][p]} bytes)" if m["ratios"][p] < 1.005 else "") for p in m["above_eager"]]


def summary_lines(records: list[dict]) -> list[str]:
    """bench's closing lines on the agent's time and peak memory."""
    t = agent_time_summary(records)
    out = []
    if t["measured"]:
        missing = len(records) - t["measured"]
        out.append(f"agent time per problem: p50 {t['p50']:.1f} s, p95 {t['p95']:.1f} s, max {t['max']:.1f} s "
                   f"over {plural(t['measured'], 'problem')}, {agent_time_scope(t)}"
                   + (f" ({missing} without a figure: killed or skipped)" if missing else ""))
    out += degraded_lines(records)
    m = memory_summary(records)
    if m["measured"]:
        names = ", ".join(above_names(m)[:8]) + (", ..." if len(m["above_eager"]) > 8 else "")
        out.append(f"peak GPU memory above eager's: {len(m['above_eager'])} of {plural(m['measured'], 'problem')}"
                   + (f" ({names}; the most {m['max_ratio']:.2f}x)" if m["above_eager"] else
                      f" (the most {m['max_ratio']:.2f}x)"))
    return out


def degraded_lines(records: list[dict]) -> list[str]:
    """The problems that ran below what the agent builds, with why: their CUDA graph failed to capture
    (the steps launched one by one), or their rewrites were skipped (planned as written)."""
    out = []
    for key, what in (("graph_error", "ran without a CUDA graph"), ("rewrites_skipped", "planned without rewrites")):
        hit = [r for r in records if r.get("ok") and r.get(key)]
        if hit:
            out += [f"{what}: {plural(len(hit), 'problem')}"] + [f"  {r['problem']}: {r[key]}" for r in hit]
    return out
