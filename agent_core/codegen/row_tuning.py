"""The row kernels' launch defaults and tuning variants (rowkernel.py): the row limits the schedules
are chosen by, and the variants the agent times besides the default (agent/tune.py's tune_space).
"""
from __future__ import annotations

import math

from .kernel import CodegenError

DEFAULTS = {"warp_max_cols": 1024, "register_max_cols": 16384, "block": 256, "vector_width": 4,
            "online_threads": 1024, "threads_per_row": None, "sm_count": 132, "split": None,
            "unroll": None, "stage": True,   # unroll None: 8 loads in flight for scalar rows, 4 for float4
            "guard_loads": True,             # False: load a where's arm everywhere (rowguard.py; a diagnostic)
            "window_unroll": None}           # a reduction window's loads in flight (None: reduce_window's)
REGISTER_MAX_FLOATS = 64  # row elements a thread of the warp / block schedules may hold in registers


def checked_unroll(p: dict) -> int:
    """p["unroll"] (set): the vectors a streaming thread loads before using any, a power of two to 16."""
    unroll = int(p["unroll"])
    if unroll & (unroll - 1) or not 1 <= unroll <= 16:
        raise CodegenError(f"unroll must be a power of two from 1 to 16, got {unroll}")
    return unroll


def tune_variants(params: dict, *, sm_count: int = 132) -> list[dict]:
    """The launch parameters worth timing besides the default that produced `params` (a row
    kernel's KernelSource.params), most promising first; each one generates (no refusals to spend
    a trial on). Warp / block: half and twice the threads per row while the row still fits in
    registers (fewer threads per row keep more loads in flight each; more free registers), with 16
    and 4 rows per block for the warp schedule in between, then a quarter and four times the threads.
    Stream: more or fewer vectors in flight, half the threads. Cluster: twice or half the CTAs per row
    while the row stays in registers, twice or half the threads a CTA, and no cluster (one block
    streaming the row; for scalar loads also 1024 threads with 8 in flight). Split column: twice or
    half the blocks per column tile, and one block per tile. The row kernel's column tiles: other
    heights and loads in flight (column_tile.tune_variants). A row of reduction windows: first, twice
    and half the window loads in flight (staged windows: twice the loads, half the threads, then each
    element walking its own window, then half the loads)."""
    schedule, cols, vec = params.get("schedule"), params.get("cols"), int(params.get("vector_width") or 1)
    out: list[dict] = []
    if params.get("staged_windows"):
        # the block stages its windows in chunks (reduce_window.py): its loads in flight are a chunk's,
        # so more of them, or half the threads a row (twice the blocks an SM: one's loads overlap the
        # other's folds), then each element walking its own window, then fewer loads in flight
        u, tpr = int(params["window_unroll"]), int(params["threads_per_row"])
        out += [{"window_unroll": w} for w in (u * 2,) if w <= 32]
        out += [{"threads_per_row": tpr // 2}] if tpr >= 64 else []
        out += [{"stage": False}] + [{"window_unroll": w} for w in (u // 2,) if w >= 2]
    elif params.get("window_unroll"):
        # each element walks a reduction's window (reduce_window.py) with a thread of its own: its loads
        # in flight are the kernel's memory parallelism, so these come first, before the trials run out
        u = int(params["window_unroll"])
        out += [{"window_unroll": w} for w in (u * 2, u // 2) if 2 <= w <= 32]
    if params.get("staged"):
        # the transposing read straight from global memory; or 32 rows per block, so a run of the
        # transposed input is 128 bytes, not 32 (a misaligned run of 8 spans 2 sectors, of 32 spans 5)
        out.append({"stage": False})
        if int(params["threads_per_row"]) * 32 <= 1024 and params["rows_per_block"] < 32:
            out.append({"block": int(params["threads_per_row"]) * 32})
    if schedule in ("warp", "block") and cols:
        tpr = int(params["threads_per_row"])

        def fits(t):
            return 4 <= t <= 1024 and math.ceil(cols / (t * vec)) * vec <= REGISTER_MAX_FLOATS \
                and (t // 2) * vec < cols     # half the lanes would otherwise hold nothing
        rows_per_block = [{"block": 512}, {"block": 128}] if schedule == "warp" else [{}, {}]
        for cand in ({"threads_per_row": tpr // 2}, rows_per_block[0], {"threads_per_row": tpr * 2},
                     rows_per_block[1], {"threads_per_row": tpr // 4}, {"threads_per_row": tpr * 4}):
            if cand and ("threads_per_row" not in cand or fits(cand["threads_per_row"])):
                out.append(cand)
    elif schedule == "stream":
        # 8 vectors in flight spill in 64 registers unless they are scalars
        out += [{"unroll": 2}, {"threads_per_row": int(params.get("threads_per_row") or 1024) // 2}]
        if vec == 1:      # scalars stream 8 in flight by default: 4 as the alternative, and a cluster
            out += [{"unroll": 4 if int(params.get("unroll") or 8) == 8 else 8}, {"cluster": 4}]
    elif schedule == "cluster":
        # twice / half the CTAs, then twice / half the threads a CTA (H100, log_softmax over 1024 rows of
        # 50257: 4 x 256 threads 260 us, 8 x 256 234, 4 x 512 232; KL divergence over 2 x 30522: 4 x 256
        # 366, 8 x 256 482, 4 x 512 546), then no cluster (one block streaming the row); a row of scalar
        # loads streams best with 1024 threads and 8 loads in flight each (the log_softmax above: 211 us,
        # 291 with the stream's default 512 threads and 4)
        n, tpr = int(params["cluster"]), int(params["threads_per_row"])
        for c, t in ((n * 2, tpr), (n, tpr * 2), (n // 2, tpr), (n, tpr // 2)):
            if (c == n or c in params.get("cluster_fits", ())) and 128 <= t <= 1024:
                out.append({"cluster": c, "threads_per_row": t})
        out.append({"cluster": 1})
        if vec == 1:
            out.append({"cluster": 1, "threads_per_row": 1024, "unroll": 8})
    elif schedule == "split_column":
        s = int(params["split"])
        out += [{"split": c} for c in (s * 2, s // 2) if c >= 2] + [{"split": 1}]
    if schedule in ("column", "split_column") and "tile_y" in params:     # the row kernel's column tiles
        from .column_tile import tune_variants as column_variants
        out += column_variants(params)
    unique = [o for i, o in enumerate(out) if o not in out[:i]]
    return [{**o, "sm_count": sm_count} for o in unique]
