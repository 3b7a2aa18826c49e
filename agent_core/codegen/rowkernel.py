"""One kernel for any number of chained and sibling reductions over the same rows: the renderer of
codegen/rowgraph.py's row graph (issue #14).

The kernel loads each full-size input of a row once, then runs the graph's rounds in order: a pass
over the row's elements folds every step of the round into one struct of states, one all-reduce
combines them across the threads of the row, and the per-row values of that round follow. A last pass
evaluates and stores the per-element outputs; per-row outputs are stored once per row. Only what the
outputs need is emitted.

Schedules (the row limits of row_tuning.DEFAULTS, counting every full-size input the row holds):
  warp    rows up to 1024 that fit 64 floats per lane: 4..32 lanes per row, several rows per block,
          the row in registers, xor shuffles;
  block   rows whose inputs fit 16384 floats: one block per row, the row in registers, shuffles then
          shared memory;
  stream  longer rows: one block of 1024 threads per row; each round re-reads the row from memory
          (softmax and Welford states stay online, so a round is one read);
  column  [outer, L, inner] with inner > 1: 32 inner positions x 8 thread rows per block, combined
          through shared memory; the column in registers when each thread holds at most 16 values;
  split_column  column tiles too few to fill the SMs, one round, nothing per element: kSplit blocks
          per tile each fold an interleaved share of the reduced length (4 neighbouring columns per
          thread, float4 loads, where the columns are a multiple of 4) and publish per-column partial
          states; the tile's last block combines them in split order (codegen/last_block.py);
  cluster rows too long for one block's registers, or fewer rows than SMs: a thread-block cluster
          of kCluster CTAs per row (sm_90), each holding its share of the row in registers; each
          round's state is exchanged through distributed shared memory, combined in rank order.
"""
from __future__ import annotations

import math
import re

from ..ir import Program
from ..ops.registry import DTYPE_BYTES
from .cuda import VEC4, VEC4_STRUCTS, Names, c_type, float_literal, header, index_type, kernel_name, kernel_source
from .kernel import CodegenError, KernelSource, pow2_at_least
from .last_block import publish_and_arrive, reset_counter
from .layout_graph import ViewPrologue, view_prologue_nodes
from .layout_store import split_output_views
from .pointwise import operand_views
from .reduce_window import (WINDOW_UNROLL, reduced_block, stage_buffer_floats, stage_window_lines, stageable,
                            staged_window, window_threads_per_row)
from .region_io import Operands, RegionIO
from .row_cat import check as check_row_cat, split_row_cats
from .row_stage import stage_lines, stage_tiles, tile_stride
from .row_tuning import DEFAULTS as ROW_DEFAULTS, checked_unroll
from .rowguard import guarded_inputs
from .rowgraph import E, R, T, RowGraph, lower
from .rowops import INDEXED, NOT_FLOAT, STATES, fold_params, state_helpers, struct_fields
from .rowpick import gathered
from .rowscan import SCAN_HELPERS, SCAN_OPS, combine, lane_scan
from . import column_tile, rowsplit

DEFAULTS = {**ROW_DEFAULTS, "lane_max_floats": 64, "column_max_items": 16, "tile_y": None, "column_batch": 4,
            "cluster": None,
            "cluster_max": 8, "cluster_thread_floats": 32, "spread_min_bytes": 1 << 22,
            "hoist_monotone": True,   # a max / min of a monotone chain folds its input (codegen/monotone.py)
            "held_online": None}      # a held split row's online states: None lets _held_online decide
# 8 CTAs is the portable cluster size; 16 needs the non-portable attribute set before each launch,
# which the CuPy launch path cannot set, so clusters stop at 8
CLUSTER_PORTABLE = 8
CLUSTER_FULL_THREADS = 256   # threads of a cluster CTA when the rows fill the SMs
ROW_THREAD_FLOATS = DEFAULTS["cluster_thread_floats"]
SPLIT_MIN_ITEMS = 8         # reduced elements each thread of a split column folds, at least
BLOCKS_PER_SM = 8           # 256-thread blocks an SM holds at once: the split column's target
SCAN_THREADS = 256          # threads per row of a scan longer than a warp's share
WINDOW_STAGE_MAX_BYTES = 48 * 1024   # staged windows' shared memory: two 1024-thread blocks still fit an SM
# the kernel's own locals; generated names never take them
LOCALS = ("group", "active", "base", "p", "t", "tile", "outer", "inner", "partial", "part", "warp", "offset",
          "identity", "combine", "shuffle", "reduce", "tile_id", "last", "workspace", "counters",
          "rank", "slot", "cluster_part", "totals", "totals_part", "tid", "q", "w", "s_t", "s_row", "s_col", "s_at",
          "stage_smem", "block_rows", *rowsplit.LOCALS, *column_tile.LOCALS)


def generate_multi_reduction(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    p = {**DEFAULTS, **(params or {})}
    names, arg, views, g, stores, sched = _scheduled(program, io, p)
    return _render(program, io, g, names, arg, sched, name, views, stores)


def _scheduled(program: Program, io: RegionIO, p: dict, stage_windows: bool = True):
    """The lowered region (_lowered's tuple) and its schedule. A row held on chip takes the two-stage
    graph (exact two-pass statistics from the registers), except a held split row whose online graph
    has fewer rounds (each round is a wait for the row: _held_online); a streamed row the online
    graph, whose rounds are its reads of the row. Contiguous windows are staged (reduce_window.py)
    where the block holds its rows (warp or block rows in registers) and their tiles fit; otherwise
    lowered again as per-element loops."""
    hoist, unroll = bool(p["hoist_monotone"]), _window_unroll(p)
    staged = stage_windows and bool(p["stage"])
    lowered = _lowered(program, io, two_stage=True, hoist=hoist, window_unroll=unroll, stage_windows=staged)
    if lowered[2] is not None and lowered[2].folded:
        p = _window_threads(p, lowered[3])
    online = []

    def streamed_reads() -> int:
        if not online:
            online.append(_lowered(program, io, two_stage=False, hoist=hoist, window_unroll=unroll,
                                   stage_windows=staged))
        og = online[0][3]
        return og.rounds + any(og.defs[k].space == E for k in og.outputs.values())
    g = lowered[3]
    full = _full_inputs(program, g, io)
    front = _prologue_held(g, full)
    sched = _schedule(g, p, len(front) or len(full), streamed_reads)
    if sched["schedule"] == "split_row" and sched["cached"] and streamed_reads() and online[0][3].rounds < g.rounds:
        # a held split row waits for its row's other chunks once per round: online states (Welford's
        # mean and variance) take fewer rounds than the two-stage graph; the tuner times the other one
        sched["other_rounds"] = True
        if _held_online(p, online[0][3]):
            og = online[0]
            ofull = _full_inputs(program, og[3], io)
            ofront = _prologue_held(og[3], ofull)
            osched = _schedule(og[3], p, len(ofront) or len(ofull), streamed_reads)
            if osched["schedule"] == "split_row" and osched["cached"]:
                lowered, g, full, front = og, og[3], ofull, ofront
                sched = {**osched, "online": True, "other_rounds": True}
    if not sched["cached"]:      # streamed rows: online states, one read of the row per round
        streamed_reads()
        lowered = online[0]
        g = lowered[3]
        full = _full_inputs(program, g, io)
        if sched["schedule"] == "split_row":     # its phases follow the online graph's rounds
            sched = _schedule(g, p, len(full), streamed_reads)
    views = lowered[2]
    if views is not None and views.staged and not _holds_windows(g, sched, views):
        return _scheduled(program, io, p, stage_windows=False)
    sched["front"] = front if sched["cached"] and sched["split"] == 1 else []
    # a streamed row's loads in flight per thread: 8 scalars or 4 float4s unless the tuner says
    # otherwise (see _cluster_size), at most 8 vectors over all its inputs
    unroll = checked_unroll(p) if p["unroll"] is not None else 8 if sched["vec"] == 1 else 4
    sched["unroll"] = min(unroll, 1 << int(math.log2(max(1, 8 // max(1, len(full))))))
    # a scan's prologue is gathered, not staged (a staged tile beside the double runs spills under ptxas)
    sched["stage"] = bool(p["stage"]) and not g.scans
    sched["guard_loads"] = bool(p["guard_loads"])
    return (*lowered, sched)


def _window_unroll(p: dict) -> int:
    """p's window_unroll (None: reduce_window.WINDOW_UNROLL), a power of two from 1 to 32."""
    u = int(p.get("window_unroll") or WINDOW_UNROLL)
    if u & (u - 1) or not 1 <= u <= 32:
        raise CodegenError(f"window_unroll must be a power of two from 1 to 32, got {u}")
    return u


def _window_threads(p: dict, g: RowGraph) -> dict:
    """The launch of a row whose elements each fold a window of their own (reduce_window.py: a mean over
    tokens before a norm over the features): a thread per element up to 1024, loading one element at a
    time, so a warp's neighbouring elements read neighbouring addresses at each step of their windows
    and every thread keeps its window's loads in flight (the rows alone are few: a batch)."""
    if p.get("threads_per_row") or g.inner > 1:
        return {**p, "vector_width": 1}
    return {**p, "vector_width": 1, "threads_per_row": window_threads_per_row(g.cols)}


def _held_online(p: dict, online: RowGraph) -> bool:
    """Whether a held split row folds the online graph's states: the tuner's `held_online`, else where
    none costs an exp and a rescale per element (H100, region kernels: GroupNorm + SiLU over 64 rows of
    163840, Welford in one round 0.058 ms against mean then variance in two 0.068; a softmax over 256
    rows of 65536, online max and sum of exp 0.098 against max then sum of exp 0.087)."""
    if p["held_online"] is not None:
        return bool(p["held_online"])
    return not any(s.state in BLOCK_FOLDS for s in online.steps)


def _holds_windows(g: RowGraph, sched: dict, views: ViewPrologue) -> bool:
    """Whether the schedule can stage the prologue's contiguous windows: each block holds whole rows of
    the row graph's last dim (warp or block rows, in registers, unsplit), a chunk's loads fit each
    thread's registers (reduce_window.stageable), and the windows' tiles and chunk buffer fit the
    shared memory beside any staged rows."""
    if sched["schedule"] not in ("warp", "block") or not sched["cached"] or sched["split"] != 1 or g.inner != 1 \
            or sched.get("cluster", 1) != 1:
        return False
    program = views.program
    return all(stageable(reduced_block(program, program.nodes[n])[1], sched["block"], views.window_unroll)
               for n in views.staged) and _window_stage_floats(views, sched, g.cols) * 4 <= WINDOW_STAGE_MAX_BYTES


def _window_stage_floats(views: ViewPrologue, sched: dict, cols: int) -> int:
    """Shared floats of the staged windows: a tile of the block's rows each, then one chunk buffer."""
    nodes = [views.program.nodes[n] for n in views.staged]
    buffer = max(stage_buffer_floats(reduced_block(views.program, n)[1], sched["block"], views.window_unroll)
                 for n in nodes)
    return len(nodes) * sched["rows_per_block"] * cols + buffer


def _window_stage(views: ViewPrologue | None, sched: dict, cols: int, offset: int, names: Names):
    """(declarations before the prologue's lambdas, the staging lines, shared bytes) of the staged
    windows (reduce_window.stage_window_lines); their tiles start `offset` floats into the dynamic
    shared memory."""
    if views is None or not views.staged:
        return [], [], 0
    program, buf = views.program, names.new("window_chunk")
    first = next(iter(views.staged.values()))[2]
    decls = [f"  const index_t {first} = (index_t)blockIdx.x * kRowsPerBlock * kCols;  // the block's first window"]
    lines = []
    at = offset
    for n, (x_fn, tile, _) in views.staged.items():
        decls.append(f"  float* const {tile} = reinterpret_cast<float*>(stage_smem) + {at};")
        at += sched["rows_per_block"] * cols
        lines += stage_window_lines(program, program.nodes[n], x_fn, tile, first, buf, sched["block"],
                                    views.window_unroll)
    decls.append(f"  float* const {buf} = reinterpret_cast<float*>(stage_smem) + {at};")
    return decls, lines, _window_stage_floats(views, sched, cols) * 4


def _lowered(program: Program, io: RegionIO, two_stage: bool, hoist: bool = True, window_unroll: int = WINDOW_UNROLL,
             stage_windows: bool = False):
    """(names, pointer arguments, the view prologue or None, the row graph, the output views). Layout
    ops and what feeds them are read through their views (layout_graph.ViewPrologue): the row graph
    starts from the values they make, which the kernel loads at (row, col) by calling their lambdas.
    Invertible layout ops after the reductions are written through their views (layout_store.py):
    the row graph computes their source, stored at the layout's offsets."""
    names, arg = _names(program, io)
    io, cats = split_row_cats(program, io)         # a cat of per-row values: stored piece by piece
    io, stores = split_output_views(program, io)
    front = view_prologue_nodes(program, io)
    if not front:
        return names, arg, None, _with_cats(program, _store_through(lower(program, io, names, two_stage, hoist), stores, io),
                                            cats), stores
    staged = frozenset(n for n in front if stage_windows and staged_window(program, io, program.nodes[n]))
    views = ViewPrologue(program, front, arg, names, window_unroll, staged)
    vals = program.values
    for v in views.io.outputs:
        if v in io.outputs:
            raise CodegenError(f"'{vals[v].name}' of the layout prologue leaves the region; a kernel of several "
                               f"reductions does not write it: split the region there")
        arg[v] = names.new(vals[v].name)
    rest = [n for n in io.nodes if n not in set(front)]
    read = [v for v in io.inputs if any(v in program.nodes[n].inputs for n in rest)]
    inner = RegionIO(rest, [*views.io.outputs, *read], list(io.outputs),
                     {v for n in rest for v in program.nodes[n].outputs})
    g = _with_cats(program, _store_through(lower(program, inner, names, two_stage, hoist,
                                                 frozenset(views.io.outputs)), stores, io), cats)
    for (v, sp) in g.inputs:     # one per row is read at the row's index (labels reshaped to [N * L])
        if sp == R and v in views.scalar and (v in g.row_views or math.prod(vals[v].shape) not in (1, g.rows)):
            raise CodegenError(f"'{vals[v].name}' of the layout prologue is read per row but broadcast over "
                               f"the rows; split the region there")
    return names, arg, views, g, stores


def _with_cats(program: Program, g: RowGraph, cats: dict) -> RowGraph:
    """The row graph with each cat of per-row values as an output (row_cat.py); a piece that does
    not leave the region on its own is not stored."""
    for y, cat in cats.items():
        check_row_cat(program, cat, g.full, g.dims, lambda v: g.defs[g.outputs[v]].space)
        g.row_cats[y] = [g.outputs[v] for v in cat.pieces], cat
        g.outputs[y] = g.outputs[cat.pieces[0]]
        for v in cat.pieces:
            if v not in cat.escapes:
                g.outputs.pop(v, None)
    return g


def _row_stores(g: RowGraph, arg: dict, out_r, indent: str) -> list[str]:
    """The per-row outputs at `row`; a cat of per-row values stores each piece at its place."""
    lines = []
    for v in out_r:
        if v in g.row_cats:
            keys, cat = g.row_cats[v]
            lines += [f"{indent}{arg[v]}[{cat.offset(j, g.inner)}] = {k};  // piece {j} of the cat"
                      for j, k in enumerate(keys)]
        else:     # a per-row value written through a layout op after it lands at that op's offset
            at = g.row_out_views[v].offset("row") if v in g.row_out_views else "row"
            lines.append(f"{indent}{arg[v]}[{at}] = {g.outputs[v]};")
    return lines


def _store_through(g: RowGraph, stores: dict, io: RegionIO) -> RowGraph:
    """The row graph with each output view's value computed as its source's key (the source itself is
    no output unless it leaves the region on its own); a per-row source is stored per row at the
    view's offset of the row (its flat index in the source)."""
    for y, ov in stores.items():
        if g.defs[g.outputs[ov.source]].space == R:
            g.row_out_views[y] = ov
        g.outputs[y] = g.outputs[ov.source]
    for ov in stores.values():
        if not ov.source_escapes:
            g.outputs.pop(ov.source, None)
    return g


def _names(program, io) -> tuple[Names, dict[str, str]]:
    """The kernel's namespace, its pointer arguments named first (after their values)."""
    names = Names()
    names.taken.update(LOCALS)
    return names, {v: names.new(program.values[v].name) for v in [*io.inputs, *io.outputs]}


def _full_inputs(program, g: RowGraph, io) -> list[str]:
    """Region inputs read per element over the whole row space (held in registers, or streamed)."""
    numel = math.prod(g.full)
    return [v for (v, sp) in g.inputs if sp == E and math.prod(program.values[v].shape) == numel]


def _prologue_held(g: RowGraph, full: list[str]) -> list[str]:
    """The per-element values a row held in registers keeps when they are computed from its inputs
    (RowGraph.prologue_values): no more arrays than the `full` full-size inputs they replace (one at
    least). [] where the row keeps its full-size inputs as they are."""
    # a smaller input broadcast along the rows (a norm's weight) is read where it is needed
    front = [k for k in g.prologue_values(g.needed()) if g.defs[k].expr is not None or g.defs[k].vid in full]
    if any(g.defs[k].expr is not None for k in front) and len(front) <= max(1, len(full)):
        return front
    return []


def _schedule(g: RowGraph, p: dict, held: int, streamed_reads=lambda: 2) -> dict:
    """The launch shape of the row graph's kernel, given the per-element arrays each row holds and
    the reads of the row a streamed schedule would make (a callable: it lowers the online graph)."""
    k = max(1, held)
    cols = g.cols
    rounds = max((s.round for s in g.steps), default=0)
    per_element = any(g.defs[key].space == E for key in g.outputs.values())
    sms = int(p["sm_count"])
    if g.scans:      # a scan walks each row in one block, in order: no cluster, no split row
        p = {**p, "cluster": 1, "split": 1}
    if not g.steps and not per_element:
        # nothing walks the rows (a lone nll_loss reads one element of each): a thread per row
        block = int(p["block"])
        return {"schedule": "warp", "vec": 1, "tpr": 1, "rows_per_block": block, "block": block, "items": 1,
                "cached": False, "grid": math.ceil(g.rows / block), "split": 1, "hold_limit": 0}
    if g.inner > 1:
        # one thread per column where nothing is written per element, the column is read once and the
        # columns give every SM a full load of threads: no combine across thread rows at all
        alone = p.get("tile_y") is None and not per_element and g.rows >= sms * column_tile.THREADS_PER_SM \
            and streamed_reads() <= 1
        ty = 1 if alone else column_tile.column_rows(cols, k, p, per_element)
        tx = column_tile.tile_x(ty)
        items = math.ceil(cols / ty)
        tiles = g.outer * math.ceil(g.inner / tx)
        batch = column_tile.batch_of(p)
        column = {"schedule": "column", "vec": 1, "tpr": ty, "rows_per_block": 1, "block": tx * ty,
                  "items": items, "cached": items * k <= int(p["column_max_items"]), "grid": tiles, "split": 1,
                  "tile_x": tx, "tile_y": ty, "batch": batch, "hold_limit": int(p["column_max_items"])}
        # a split needs the whole column's state before anything is written: one round, outputs per
        # column, and no per-column operands (a thread folds kVecX neighbouring columns at once)
        if alone or rounds != 1 or per_element or g.totals or any(sp == R for (_, sp) in g.inputs) or gathered(g) or \
                any(s.state in NOT_FLOAT for s in g.steps):      # the workspace holds floats
            return column if alone or per_element else _tall_tiles(column, g, p, k, sms)
        if not p.get("split") and g.rows * cols * k * 4 < int(p["spread_min_bytes"]):
            return column          # launch-bound: a workspace round trip would only add latency
        vecx = 4 if g.inner % 4 == 0 and int(p["vector_width"]) == 4 else 1
        tiles = g.outer * math.ceil(g.inner / (tx * vecx))
        split = int(p["split"]) if p.get("split") else \
            min(math.ceil(BLOCKS_PER_SM * sms / tiles), math.ceil(cols / (ty * SPLIT_MIN_ITEMS)))
        split = max(1, min(split, math.ceil(cols / ty)))      # every block folds at least one element
        if split > 1:
            column.update(schedule="split_column", split=split, cached=False, grid=tiles * split, vecx=vecx,
                          items=math.ceil(cols / (ty * split)))
        return column
    vec = 4 if cols % 4 == 0 and int(p["vector_width"]) == 4 else 1
    if cols <= int(p["warp_max_cols"]) and k * math.ceil(cols / 32) <= int(p["lane_max_floats"]):
        schedule, tpr = "warp", 1 << max(2, min(5, math.ceil(math.log2(max(1, math.ceil(cols / vec / 4))))))
        while tpr < 32 and math.ceil(cols / (tpr * vec)) * vec * k > int(p["lane_max_floats"]):
            tpr *= 2              # several inputs held: more lanes, so the row stays in registers
    elif cols * k <= int(p["register_max_cols"]):
        schedule, tpr = "block", min(1024, max(128, pow2_at_least(math.ceil(cols * k / 16))))
    else:
        # rows enough for two blocks per SM: 512 threads, so several rows share an SM and one row's
        # all-reduce does not idle it (the tuner chose 512 over 1024 in every such region timed on
        # the H100: pooled means of 64k, cross entropy over 32k and 128k classes)
        schedule, tpr = "stream", int(p["online_threads"]) // (2 if g.rows >= 2 * sms and (vec == 4 or k > 1) else 1)
    if g.scans and schedule != "warp":
        # each chunk of the row is scanned across its threads (shuffles, then shared memory): 256 threads
        # keep that short and several blocks per SM (H200: 1024 threads ran 0.59x of 256)
        tpr = min(tpr, SCAN_THREADS)
    # a streamed row that a full cluster holds in registers (read once either way)
    cluster_holds = not g.scans and _cluster_holds(cols, k, int(p["cluster_max"]), int(p["cluster_thread_floats"]))
    parts = rowsplit.row_split(g.rows, cols, k, p, any(s.state in NOT_FLOAT for s in g.steps),
                               schedule == "stream" and not (cluster_holds and g.rows < int(p["sm_count"]))) \
        if schedule != "warp" or p.get("split") else 1
    if parts > 1:     # few long rows: kSplit chunks per row over the whole GPU, in phases (rowsplit.py)
        tpr = int(p.get("threads_per_row") or rowsplit.SPLIT_ROW_THREADS)
        if tpr & (tpr - 1) or not 32 <= tpr <= 1024:
            raise CodegenError(f"threads_per_row of a split row must be a power of two from 32 to 1024, got {tpr}")
        held = not g.scans and rowsplit.held_split(cols, k, parts, tpr, p)
        chunk = math.ceil(math.ceil(cols / (held or parts)) / vec) * vec
        items = math.ceil(chunk / (tpr * vec))
        held = held and items * vec * k <= rowsplit.HOLD_THREAD_FLOATS
        if not held:
            chunk = math.ceil(math.ceil(cols / parts) / vec) * vec
            items = math.ceil(chunk / (tpr * vec))
        parts = math.ceil(cols / chunk)            # no empty chunk
        phases = 1 if held else rounds + per_element    # held: each round's wait is inside the one phase
        return {"schedule": "split_row", "vec": vec, "tpr": tpr, "rows_per_block": 1, "block": tpr,
                "items": items, "cached": bool(held), "grid": g.rows * parts * phases,
                "split": 1, "row_split": parts, "chunk": chunk, "phases": phases,
                "hold_limit": rowsplit.HOLD_THREAD_FLOATS}
    cluster = _cluster_size(g, p, k, schedule, streamed_reads, vec)
    if cluster > 1:
        # rows that fill the SMs: CTAs of 256 threads, several per SM, so one CTA's loads overlap another's
        # all-reduces and cluster barriers; past cluster_thread_floats a thread re-reads its share (from L2)
        # each round (H100, 4 CTAs per row: KL divergence over 2048 rows of 2 x 30522, 1024 threads 734 us,
        # 256 threads 366; log_softmax over 1024 rows of 50257, 391 -> 260 us). Fewer rows run in one wave:
        # CTAs of up to 1024 threads holding ~16 floats each.
        tpr = CLUSTER_FULL_THREADS if g.rows >= sms else min(1024, max(128, pow2_at_least(cols * k / (cluster * 16))))
        if p.get("threads_per_row"):
            # a tuner's choice (twice or half the rule's): fewer threads hold more floats each, more CTAs
            # share an SM (1024 threads of 40 registers leave room for one: its loads wait while it reduces)
            tpr = int(p["threads_per_row"])
            if tpr & (tpr - 1) or not 128 <= tpr <= 1024:
                raise CodegenError(f"threads_per_row of a cluster row must be a power of two from 128 to 1024, got {tpr}")
        items = math.ceil(cols / (cluster * tpr * vec))
        return {"schedule": "cluster", "vec": vec, "tpr": tpr, "rows_per_block": 1, "block": tpr, "items": items,
                "cached": items * vec * k <= int(p["cluster_thread_floats"]), "grid": g.rows * cluster,
                "cluster": cluster, "split": 1, "hold_limit": int(p["cluster_thread_floats"])}
    if p.get("threads_per_row"):      # a tuner's choice overrides the rule above
        tpr = int(p["threads_per_row"])
        if tpr & (tpr - 1) or not 4 <= tpr <= 1024:
            raise CodegenError(f"threads_per_row must be a power of two from 4 to 1024, got {tpr}")
        if schedule != "stream":
            schedule = "warp" if tpr <= 32 else "block"
    items = math.ceil(cols / (tpr * vec))
    cached = schedule != "stream" and items * vec * k <= int(p["lane_max_floats"])
    block = max(int(p["block"]), tpr) if schedule == "warp" else tpr
    rows_per_block = block // tpr
    return {"schedule": schedule, "vec": vec, "tpr": tpr, "rows_per_block": rows_per_block, "block": block,
            "items": items, "cached": cached, "grid": math.ceil(g.rows / rows_per_block), "split": 1,
            "hold_limit": int(p["lane_max_floats"])}


def _tall_tiles(column: dict, g: RowGraph, p: dict, k: int, sms: int) -> dict:
    """A streamed column schedule whose tiles are fewer than the SMs (one block per SM) takes tiles of
    32 thread rows: at 8 rows an SM has 8 warps of kBatch 128-byte loads, 4 KB in flight, an eighth of
    what the bandwidth needs at its latency (CLIP's loss down 4096 columns of 4096: 128 tiles). Not where
    the tuner chose the height, nor below spread_min_bytes (the launch dominates)."""
    ty = min(1024 // column_tile.TILE_X, 1 << int(math.log2(max(1, g.cols))))
    if p.get("tile_y") is not None or column["grid"] >= sms or ty <= column["tile_y"] or \
            g.rows * g.cols * k * 4 < int(p["spread_min_bytes"]):
        return column
    items = math.ceil(g.cols / ty)
    return {**column, "tpr": ty, "block": column["tile_x"] * ty, "items": items, "tile_y": ty,
            "cached": items * k <= int(p["column_max_items"])}


def _cluster_size(g: RowGraph, p: dict, k: int, schedule: str, streamed_reads, vec: int = 4) -> int:
    """CTAs of the cluster that holds each row (1: no cluster). A streamed row takes as many as give
    each the block schedule's on-chip share (register_max_cols), up to cluster_max if each thread then
    still holds at most cluster_thread_floats; fewer rows than half the SMs also spread a row that
    one block could hold, so the grid covers the SMs (from half on, one wave of whole rows is as
    fast, as for rowsplit.row_split); a tuner's `cluster` overrides. Below
    spread_min_bytes of rows the launch dominates and the cluster's barriers would only add latency.
    Rows enough to fill the SMs that a streamed block reads once (a log-sum-exp, a mean: no output
    per element) stream: the cluster would read them once too, through its barriers, with one CTA of
    register-bound threads per SM (H200: a pooled mean of 64k columns 0.68x, cross entropy over 32k
    and 128k classes 0.57x / 0.51x of one block streaming). Rows of scalar loads of one input (a length
    that is no multiple of 4) that fill the SMs stream too, with 1024 threads and 8 loads in flight each (H100,
    GPT-2's log_softmax over 1024 rows of 50257, written per element: 0.209 ms streamed twice against
    0.256 for the 4-CTA cluster that re-reads its share and 0.230 for one that holds it)."""
    if p.get("cluster") is not None:
        n = int(p["cluster"])
        if not 1 <= n <= CLUSTER_PORTABLE:
            raise CodegenError(f"cluster must be 1 to {CLUSTER_PORTABLE} CTAs (the portable size), got {n}")
        return n
    few = g.rows < int(p["sm_count"])
    small = g.rows * g.cols * k * 4 < int(p["spread_min_bytes"])
    if small or schedule == "warp" or (schedule == "block" and g.rows * 2 > int(p["sm_count"])) or \
            (not few and (streamed_reads() <= 1 or (schedule == "stream" and scalar_rows_stream(g.rows, vec, k, p)))):
        return 1
    n = pow2_at_least(g.cols * k / int(p["register_max_cols"]))
    if few:
        n = max(n, pow2_at_least(int(p["sm_count"]) / g.rows))
    n = min(n, int(p["cluster_max"]), pow2_at_least(g.cols / (128 * 4)))   # each CTA keeps a float4 per thread
    return n if n > 1 and _cluster_holds(g.cols, k, n, int(p["cluster_thread_floats"])) else 1


def scalar_rows_stream(rows: int, vec: int, k: int, p: dict) -> bool:
    """Rows too long for a block, of scalar loads (vec 1) of one full-size input, that fill the SMs:
    streamed through one block of 1024 threads rather than a cluster (see _cluster_size; the planner's
    schedule_for asks the same)."""
    return vec == 1 and k == 1 and rows >= int(p["sm_count"])


def _cluster_holds(cols: int, k: int, n: int, thread_floats: int) -> bool:
    """Whether n CTAs of 1024 threads hold a row of `cols` x k full-size inputs, at most
    `thread_floats` a thread."""
    return math.ceil(cols / (n * 1024)) * k <= thread_floats


def _state_code(kind: str) -> str:
    """One statistics state of rowops.STATES as a struct with its identity, fold and combine (an
    indexed state's fold also takes the element's index c along the row)."""
    fields, identity, fold, comb = STATES[kind]
    if kind in ("maxsumexp", "softdot"):
        # exp(-inf) adds nothing: skipping it keeps a row that starts with -inf (a masked position)
        # from folding exp(-inf - -inf) = NaN into the running sum
        fold = "if (x == -INFINITY) return; " + fold
    return (state_helpers(kind) + f"struct St_{kind} {{ {struct_fields(kind)} }};\n"
            f"__device__ __forceinline__ St_{kind} identity_{kind}() {{ return St_{kind}{identity}; }}\n"
            f"__device__ __forceinline__ void fold_{kind}(St_{kind}& s, {fold_params(kind)}) {{ {fold} }}\n"
            f"__device__ __forceinline__ St_{kind} combine_{kind}(St_{kind} a, St_{kind} b) {{\n  {comb}\n}}\n"
            + BLOCK_FOLDS.get(kind, ""))


# A streamed pass folds its kUnroll x kVec elements of an online softmax at once: one max over them,
# one rescale of the sum, one exp per element and no branch (the element-wise fold branches on every
# new maximum and chains each exp behind the last compare; 32k-class cross entropy: 0.89x of the
# deleted class-loss template, which folded this way, on the H100; 0.98x after, on the H200). A NaN
# element reaches the sum through its exp; an infinite max shifts by 0 (no inf - inf); -inf elements
# (masked, or past the row) add exp(-inf) = 0.
MAXSUMEXP_BLOCK = """template <int N>
__device__ __forceinline__ void fold_block_maxsumexp(St_maxsumexp& s, const float (&x)[N]) {
  float m = s.m;
#pragma unroll
  for (int k = 0; k < N; ++k) m = fmaxf(m, x[k]);
  const float shift = fabsf(m) == INFINITY ? 0.0f : m;
  float sum = s.s * expf(s.m - shift);
#pragma unroll
  for (int k = 0; k < N; ++k) sum += expf(x[k] - shift);
  s.m = m;
  s.s = sum;
}
"""

# The softmax-weighted sum's block fold (rowgraph._softmax_dot), the same shape: the sums rescaled once,
# then exp(x - shift) and exp(x - shift) * y per element; an element of x = -inf (masked, or past the
# row) adds nothing even where its y is not finite (KL's t - s at a masked teacher logit).
SOFTDOT_BLOCK = """template <int N>
__device__ __forceinline__ void fold_block_softdot(St_softdot& s, const float (&x)[N], const float (&y)[N]) {
  float m = s.m;
#pragma unroll
  for (int k = 0; k < N; ++k) m = fmaxf(m, x[k]);
  const float shift = fabsf(m) == INFINITY ? 0.0f : m;
  const float c = expf(s.m - shift);
  float sum = s.s * c, w = s.w * c;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const float e = expf(x[k] - shift);
    sum += e;
    w = x[k] == -INFINITY ? w : fmaf(e, y[k], w);  // a masked element adds nothing, as the scalar fold
  }
  s.m = m;
  s.s = sum;
  s.w = w;
}
"""
BLOCK_FOLDS = {"maxsumexp": MAXSUMEXP_BLOCK, "softdot": SOFTDOT_BLOCK}   # states a streamed pass folds in blocks


def _round_code(r: int, steps, schedule: str, label) -> str:
    """The struct of round r's states, its identity, combine, and all-reduce across the row's threads."""
    t = f"Round{r}"
    kinds = [s.state for s in steps]
    members = " ".join(f"St_{k} s{j};" for j, k in enumerate(kinds))
    shuffles = "".join(f"  a.s{j}.{f} = __shfl_xor_sync(0xffffffffu, a.s{j}.{f}, offset);\n"
                       for j, k in enumerate(kinds) for f in STATES[k][0])
    code = (f"// Round {r}: {', '.join(f'{s.state} ({label(s.node)})' for s in steps)}, all-reduced together.\n"
            f"struct {t} {{ {members} }};\n"
            f"__device__ __forceinline__ {t} identity{r}() {{ return {t}{{{', '.join(f'identity_{k}()' for k in kinds)}}}; }}\n"
            f"__device__ __forceinline__ {t} combine{r}({t} a, {t} b) {{\n"
            + "".join(f"  a.s{j} = combine_{k}(a.s{j}, b.s{j});\n" for j, k in enumerate(kinds))
            + "  return a;\n}\n")
    if schedule in ("column", "split_column"):
        again = "  __syncthreads();  // a previous call's partials have been read\n" if schedule == "split_column" else ""
        return code + (f"__device__ __forceinline__ {t} reduce{r}({t} a) {{\n"
                       "  if (kTileY == 1) return a;  // one thread per column: nothing to combine\n"
                       f"  __shared__ {t} part[kTileY][kTileX];\n" + again +
                       "  part[threadIdx.y][threadIdx.x] = a;\n"
                       "  __syncthreads();\n"
                       "  a = part[0][threadIdx.x];\n"
                       "#pragma unroll\n"
                       f"  for (int y = 1; y < kTileY; ++y) a = combine{r}(a, part[y][threadIdx.x]);\n"
                       "  return a;\n}\n")
    code += (f"__device__ __forceinline__ {t} shuffle{r}({t} a, int offset) {{\n{shuffles}  return a;\n}}\n"
             f"__device__ __forceinline__ {t} reduce{r}({t} a) {{\n"
             "#pragma unroll\n"
             f"  for (int offset = kShuffleStart; offset > 0; offset >>= 1) a = combine{r}(a, shuffle{r}(a, offset));\n")
    if schedule != "warp":
        code += (f"  __shared__ {t} partial[kWarpsPerRow];\n"
                 "  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;\n"
                 "  if (lane == 0) partial[warp] = a;\n"
                 "  __syncthreads();\n"
                 f"  a = lane < kWarpsPerRow ? partial[lane] : identity{r}();\n"
                 "#pragma unroll\n"
                 f"  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) a = combine{r}(a, shuffle{r}(a, offset));\n")
    if schedule == "cluster":
        # every CTA of the cluster combines all the CTAs' states in rank order: the same bits everywhere
        code += (f"  __shared__ {t} cluster_part;  // this CTA's state, read by the whole cluster\n"
                 "  if (threadIdx.x == 0) cluster_part = a;\n"
                 "  __cluster_barrier_arrive();  // release: this CTA's state is visible to the cluster\n"
                 "  __cluster_barrier_wait();\n"
                 f"  a = *static_cast<const {t}*>(__cluster_map_shared_rank(&cluster_part, 0));\n"
                 "#pragma unroll\n"
                 "  for (int rank = 1; rank < kCluster; ++rank)\n"
                 f"    a = combine{r}(a, *static_cast<const {t}*>(__cluster_map_shared_rank(&cluster_part, rank)));\n")
    return code + "  return a;\n}\n"


# per-element work worth a register to avoid computing again (libdevice calls of tens of instructions)
_COSTLY = re.compile(r"\b(?:expf|exp2f|expm1f|logf|log2f|log10f|log1pf|powf|tanhf|erff|erfcf|sinf|cosf|tanf|"
                     r"sinhf|coshf|asinf|acosf|atanf|atan2f)\(")


def _kept_values(g: RowGraph, need: set[str], passes: list[list[str]], room: int,
                 known: frozenset[str] = frozenset()) -> list[str]:
    """Per-element values a row held in registers keeps between its passes: those computed with a
    costly call (exp, log, tanh, ...) in one pass and read again in a later one (softmax's exp(x - max)
    is folded into the sum, then scaled into the output), first come first kept, at most `room`."""
    seen: dict[str, int] = {}
    for keys in passes:
        for d in g.closure(keys, E, need, known):
            if d.expr is not None and d.key not in known and _COSTLY.search(d.expr):
                seen[d.key] = seen.get(d.key, 0) + 1
    return [k for k, n in seen.items() if n > 1][:max(0, room)]


def _render(program: Program, io: RegionIO, g: RowGraph, names: Names, arg: dict, sched: dict,
            name: str, views: ViewPrologue | None = None, stores: dict | None = None) -> KernelSource:
    vals = program.values
    stores = stores or {}
    schedule, vec, cached = sched["schedule"], sched["vec"], sched["cached"]
    column, split, cluster = schedule in ("column", "split_column"), sched["split"], sched.get("cluster", 1)
    vecx = sched.get("vecx", 1)
    srow = schedule == "split_row"     # few long rows in chunks over the GPU, in phases (rowsplit.py)
    # where this thread's elements of the row start and end: a split row's thread walks its chunk
    first, limit = ("lo + lane * kVec", "hi") if srow else ("lane * kVec", "kCols")
    need, steps = g.needed(), g.steps
    numel = math.prod(g.full)
    index_t = index_type(max(numel, views.extent if views else 0))
    e_in = [v for (v, sp), k in g.inputs.items() if sp == E and k in need]
    computed = {v: (views.scalar[v], views.vector.get(v)) for v in e_in if v in views.scalar} if views else {}
    # full-size prologue values read through a transposing view: the block's rows staged in shared
    # memory with the row index fastest, then read per row from there (row_stage.py)
    tiles = stage_tiles(program, views.nodes, views, computed, schedule, sched["rows_per_block"], g.rows, g.cols,
                        vec, names, {"stage": sched["stage"]}) if views and cached and g.inner == 1 else {}
    ld = Operands(program, g.full, e_in, names, "In", {**operand_views(program, io.nodes, e_in), **g.framed},
                   computed)
    # full-size inputs: registers, or streamed; a value computed through views is called again where
    # read, unless it walks a pooling window (level 2's 11, a group norm of tanh -> 2x2 max pool,
    # computed each pooled element in each of its 3 passes: 12 tanh and 12 loads an element, 0.375 ms
    # on an H100; held, 0.158)
    held = [v for v in e_in if ld.full(v) and (ld.vectors(v) or v in views.windowed)]
    # inputs a where's arm alone reads: loaded after the inputs of its condition, where it is taken
    guards = guarded_inputs(g, need) if sched["guard_loads"] and split == 1 else {}
    if column:    # a column (one row a thread) takes per-row conditions only
        guards = {v: gs for v, gs in guards.items() if _per_row(g, gs)}
    held.sort(key=lambda v: v in guards)
    guarded: set[str] = set()     # the inputs whose loads the passes below did guard (ks.params)
    key_of = {v: g.inputs[(v, E)] for v in e_in}
    ct = {v: g.defs[key_of[v]].ctype for v in e_in}
    out_e = [v for v in io.outputs if g.defs[g.outputs[v]].space == E]
    out_r = [v for v in io.outputs if g.defs[g.outputs[v]].space == R]
    out_t = [v for v in io.outputs if g.defs[g.outputs[v]].space == T]
    octype = {v: g.defs[g.outputs[v]].ctype for v in io.outputs}
    regs = {v: names.new(f"v_{arg[v]}") for v in held}
    outs_local = {v: names.new(f"o_{arg[v]}") for v in out_e}
    rounds_n = max((s.round for s in steps), default=0)
    kept: dict[str, str] = {}        # def key -> the register array that keeps it between passes
    kept_done: set[str] = set()      # kept values computed in a pass already rendered
    # values computed from the row's inputs that the passes read: computed once, kept instead of the inputs
    front = sched.get("front") or []
    if cached and split == 1:
        kept = {k: names.new(f"{k}_held") for k in front}
        passes = [[k for s in steps if s.round == r for k in s.args] for r in range(1, rounds_n + 1)]
        passes += [[g.outputs[v] for v in out_e]] if out_e else []
        per_array = sched["items"] * vec
        room = (int(sched["hold_limit"]) - (len(front) or len(held)) * per_array) // per_array
        kept.update({k: names.new(f"{k}_kept") for k in _kept_values(g, need, passes, room, frozenset(front))})

    def flat(col: str) -> str:
        if split > 1:      # column e of the thread's kVecX
            return f"base + (index_t)({col}) * kInner + e"
        return f"base + {col}" if not column else f"base + (index_t)({col}) * kInner"

    vec_bcast: dict = {}     # broadcast inputs a pass loads 4 at a time (a norm's weight)

    def load4(v, reg: str, at0: str, idx: str, guard: str | None = None) -> list[str]:
        """One 4-lane load of v at flat index idx, unpacked into reg[at0 + 0..3] (zeros where `guard`
        does not hold); 4 calls of a computed value with no float4 lambda (a pooled window)."""
        if not ld.vectors(v):
            calls = [ld.load(v, arg[v], f"{idx} + {j}") for j in range(4)]
            return [f"{reg}[{at0}{j}] = {f'{guard} ? {c} : ({ct[v]})0' if guard else c};" for j, c in enumerate(calls)]
        vt = VEC4[vals[v].dtype]
        src = ld.load4(v, arg[v], vt, idx)
        return [f"{{ const {vt} t = {f'{guard} ? {src} : {vt}{{}}' if guard else src};",
                "  " + " ".join(f"{reg}[{at0}{j}] = t.{'xyzw'[j]};" for j in range(4)) + " }"]

    def fill(v, slot: str, guard: str | None = None, loaded=None) -> list[str]:
        """The kVec elements of v at column p loaded into regs[v] from slot * kVec on (zeros where
        `guard` does not hold). With `loaded` (the inputs already in their registers there), an input
        only a where's arm reads is loaded only where one of its elements is taken (rowguard.py)."""
        lines = []
        if loaded is not None and v in guards:
            taken = taken_lines(v, slot, loaded)
            if taken:
                lines, flag = taken
                guard = f"({guard}) && {flag}" if guard else flag
                guarded.add(v)
        if vec == 4:
            return lines + load4(v, regs[v], "" if slot == "0" else f"{slot} * kVec + ", flat("p"), guard)
        src = ld.load(v, arg[v], flat("p"))
        return lines + [f"{regs[v]}[{slot}] = {f'{guard} ? {src} : ({ct[v]})0' if guard else src};"]

    def taken_lines(v, slot: str, loaded) -> tuple[list[str], str] | None:
        """Lines setting a flag: whether a where that reads v takes it at any of the kVec elements at
        column p (or in this row, for a per-row condition), each condition computed from inputs
        `loaded` already (their registers at `slot`), loaded here, or per row before the loads
        (row_defs(0)); None where a condition reads an input not loaded yet."""
        def term(cond, arm):
            return f"{'' if arm else '!'}({cond})"
        per_row = [term(c, a) for c, a in sorted(guards[v]) if g.defs[c].space == R]
        per_elem = [(c, a) for c, a in sorted(guards[v]) if g.defs[c].space == E]
        if not per_elem:
            return [], per_row[0] if len(per_row) == 1 else "(" + " || ".join(per_row) + ")"
        defs = g.closure([c for c, _ in per_elem], E, need)
        if any(d.vid in regs and d.vid not in loaded for d in defs if d.expr is None):
            return None
        at = ("e" if slot == "0" else f"{slot} * kVec + e") if vec == 4 else slot
        flag = names.new(f"take_{arg[v]}")
        ready = {v for v in vec_bcast if v in loaded}      # broadcast inputs already loaded 4 at a time
        lines = [f"const {d.ctype} {d.key} = {d.expr if d.expr is not None else input_src(d.vid, at, ready)};"
                 for d in defs]
        lines.append(f"{flag} |= {' || '.join(term(c, a) for c, a in per_elem)};")
        body = [*index_head(lines), *lines]
        if vec == 4:
            body = ["#pragma unroll", "for (int e = 0; e < kVec; ++e) {", *(f"  {ln}" for ln in body), "}"]
        else:
            body = ["{", *(f"  {ln}" for ln in body), "}"]
        first = " || ".join(per_row) or "false"
        return [f"bool {flag} = {first};  // does a where reading {vals[v].name} take it at any of these elements",
                *body], flag

    def fill_all(vs, slot: str, bcast: bool = False) -> list[str]:
        """fill of each input of vs in turn, each guarded where it can be by the ones before it (and,
        with `bcast`, by the broadcast inputs bcast4 loaded already)."""
        lines = []
        for j, v in enumerate(vs):
            lines += fill(v, slot, None, {*vs[:j], *(vec_bcast if bcast else ())})
        return lines

    def bcast4(closure) -> list[str]:
        """A float4 load per 4 elements of each broadcast input `closure` reads (a norm's weight), not
        4 scalar loads; element_body then reads them."""
        if vec != 4 or column or split != 1:
            return []
        keys, lines = {d.key for d in closure}, []
        for v in e_in:
            if v not in regs and key_of[v] in keys and ld.group_mode(v) == "vec4":
                vec_bcast[v] = names.new(f"b_{arg[v]}")
                lines += [f"{ct[v]} {vec_bcast[v]}[kVec];", *load4(v, vec_bcast[v], "", flat("p"))]
        return lines

    def element_body(defs, indent: str, tail: list[str], reg_at: str, in_at: str | None = None) -> list[str]:
        """Lines for one element at column c: its inputs (from their registers at `in_at`, by default
        `reg_at`), then `defs`, then `tail`."""
        lines = []
        for d in defs:
            if d.key in kept_done:
                lines.append(f"const {d.ctype} {d.key} = {kept[d.key]}[{reg_at}];  // kept from an earlier pass")
                continue
            if d.expr is None:      # a region input
                lines.append(f"const {d.ctype} {d.key} = {input_src(d.vid, in_at or reg_at, vec_bcast)};")
            else:
                lines.append(f"const {d.ctype} {d.key} = {d.expr};" + (f"  // {d.note}" if d.note else ""))
            if d.key in kept:
                lines.append(f"{kept[d.key]}[{reg_at}] = {d.key};  // kept for a later pass")
        lines += tail
        return [indent + ln for ln in index_head(lines) + lines]

    def input_src(v, at: str, bcast) -> str:
        """Element c of input v: from its registers at `at`, from its 4-lane broadcast load (bcast4)
        where v is in `bcast`, else loaded at the element's flat index i."""
        return f"{regs[v]}[{at}]" if v in regs else f"{vec_bcast[v]}[e]" if v in bcast else ld.load(v, arg[v], "i")

    def index_head(lines: list[str]) -> list[str]:
        """The element's column c and flat index i, declared where `lines` read them."""
        text = "\n".join(lines)
        head = [f"const index_t i = {flat('c')};"] if re.search(r"\bi\b", text) else []
        if re.search(r"\bc\b", "\n".join(head) + text):
            head.insert(0, "const int c = p + e;" if vec == 4 else "const int c = p;")
        return head

    def each_element(body_fn, loads: list[str], pre_e=(), post_e=(), fresh: bool = False, blocks=()) -> list[str]:
        """A pass over this thread's elements of the row: from its registers (cached) or loaded again;
        `fresh`: a row held in registers whose `loads` are read here, kVec at a time; `blocks`: see
        streamed (only a streamed row or column gets them)."""
        ind = "        " if vec == 4 else "      "
        if column and not cached and split == 1:     # streamed column: kBatch loads in flight (column_tile.py)
            def in_rows(v) -> str:      # a column's guard: its row's per-row conditions (rowguard.py)
                if v not in guards:
                    return ""
                guarded.add(v)
                return f" && {taken_lines(v, 'u', set())[1]}"
            fills = [lambda q, v=v: [f"{regs[v]}[u] = {q} < kCols{in_rows(v)} ? {ld.load(v, arg[v], flat(q))} : ({ct[v]})0;"]
                     for v in loads]
            decls = [f"{ct[v]} {regs[v]}[kBatch];" for v in loads] + block_buffers(blocks, "kBatch")
            return column_tile.batched_pass("lane", fills, decls,
                                            [*[f"      {ln}" for ln in pre_e], *body_fn(ind, "u"),
                                             *[f"      {ln}" for ln in post_e]], sched["batch"],
                                            [fold for _, fold in blocks])
        if not cached:
            return streamed(body_fn, loads, pre_e, post_e, blocks)
        out = ["#pragma unroll", "  for (int k = 0; k < kItems; ++k) {",
               f"    const int p = {first} + k * kStride;",
               f"    if (active && p < {limit}) {{"]
        at = "k * kVec + e" if vec == 4 else "k"
        out += [f"      {ln}" for ln in pre_e]
        if fresh:     # after pre_e: a where's condition reads the broadcast inputs it loaded 4 at a time
            out += [f"      {ct[v]} {regs[v]}[kVec];" for v in loads]
            out += [f"      {ln}" for ln in fill_all(loads, "0", bcast=True)]
        if vec == 4:
            out += ["#pragma unroll", "      for (int e = 0; e < kVec; ++e) {"]
        out += body_fn(ind, at)
        if vec == 4:
            out.append("      }")
        out += [f"      {ln}" for ln in post_e]
        out += ["    }", "  }"]
        return out

    def block_buffers(blocks, size: str, ind: str = "") -> list[str]:
        """The buffers of each state a pass folds a step at a time, each at its value where no element lands."""
        return [ln for bufs, _ in blocks for buf, init in bufs
                for ln in (f"{ind}float {buf}[{size}];", "#pragma unroll",
                           f"{ind}for (int k = 0; k < {size}; ++k) {buf}[k] = {init};")]

    def streamed(body_fn, loads, pre_e, post_e, blocks=()) -> list[str]:
        """A pass over a row streamed from memory: kUnroll loads of each input issued before any is
        used (one load in flight per thread leaves a block per row far below the memory's bandwidth).
        `blocks`: (buffer, fold) of each state folded a step at a time (fold_block_maxsumexp): the
        body writes its elements to the buffer, -inf past the row (a column: kBatch of them)."""
        lo, hi = first, limit
        out = [f"  for (int p0 = {lo}; active && p0 < {hi}; p0 += kUnroll * kStride) {{"]
        out += block_buffers(blocks, "kUnroll * kVec", "    ")
        for j, v in enumerate(loads):
            out += [f"    {ct[v]} {regs[v]}[kUnroll * kVec];", "#pragma unroll", "    for (int u = 0; u < kUnroll; ++u) {",
                    "      const int p = p0 + u * kStride;"]
            out += [*(f"      {ln}" for ln in fill(v, "u", f"p < {hi}", set(loads[:j]))), "    }"]
        out += ["#pragma unroll", "    for (int u = 0; u < kUnroll; ++u) {", "      const int p = p0 + u * kStride;",
                f"      if (p < {hi}) {{", *[f"        {ln}" for ln in pre_e]]
        if vec == 4:
            out += ["#pragma unroll", "        for (int e = 0; e < kVec; ++e) {"]
        out += body_fn("          " if vec == 4 else "        ", "u * kVec + e" if vec == 4 else "u")
        if vec == 4:
            out.append("        }")
        out += [f"        {ln}" for ln in post_e]
        out += ["      }", "    }", *(f"    {fold}" for _, fold in blocks), "  }"]
        return out

    def scan_pass(out_closure, tail, pre, post) -> list[str]:
        """The output pass of a region with scans (rowscan.py): every lane of the row walks the chunks
        in step; per chunk each lane runs over its kVec elements, the lanes' runs are scanned across
        the row, then the outputs are evaluated and stored."""
        scans = [g.defs[k].scan for k in g.scans]
        arg_closure = g.closure([s[1] for s in scans], E, need, frozenset(kept_done))
        both = {d.key for d in arg_closure} | {d.key for d in out_closure}
        loads = [v for v in held if key_of[v] in both]
        lines = [f"  double {s[4]} = {SCAN_OPS[s[0]][1]};  // the {s[0]} of the row's earlier chunks" for s in scans]
        if cached:
            lines += ["#pragma unroll", "  for (int k = 0; k < kItems; ++k) {  // the row's chunks in order, every lane in step",
                      "    const int p = lane * kVec + k * kStride;"]
            at = "k * kVec + e" if vec == 4 else "k"
        else:
            lines += ["  for (int p0 = 0; p0 < kCols; p0 += kStride) {  // the row's chunks in order, every lane in step",
                      "    const int p = p0 + lane * kVec;"]
            at = "e" if vec == 4 else "0"
        lines.append("    const bool in_row = active && p < kCols;")
        for v in ([] if cached else loads):
            lines += [f"    {ct[v]} {regs[v]}[kVec];", *(f"    {ln}" for ln in fill(v, "0", "in_row"))]
        lines += [f"    double {s[2]}[kVec];  // {s[0]} over this lane's elements" for s in scans]
        # an element past the row steps by the identity; the run itself is updated outside the branch
        # (a run array written in both arms of it is spilled to local memory by ptxas)
        steps = [f"{s[2]}_step = (double){s[1]};" for s in scans]
        lines += ["#pragma unroll", "    for (int e = 0; e < kVec; ++e) {",
                  *(f"      double {s[2]}_step = {SCAN_OPS[s[0]][1]};" for s in scans), "      if (in_row) {",
                  *element_body(arg_closure, "        ", steps, at), "      }",
                  *(f"      {s[2]}[e] = {combine(s[0], f'(e ? {s[2]}[e - 1] : {SCAN_OPS[s[0]][1]})', f'{s[2]}_step')};"
                    for s in scans), "    }"]
        lines += ["    " + ln for ln in lane_scan(scans, sched["tpr"], column)]
        lines += [*(f"    float {s[2]}_out[kVec];  // {s[0]}: this lane's running values" for s in scans),
                  "#pragma unroll", "    for (int e = 0; e < kVec; ++e) {",
                  *(f"      {s[2]}_out[e] = (float){combine(s[0], s[3], f'{s[2]}[e]')};" for s in scans), "    }"]
        lines += ["    if (in_row) {", *[f"      {ln}" for ln in pre], "#pragma unroll",
                  "      for (int e = 0; e < kVec; ++e) {", *element_body(out_closure, "        ", tail, at), "      }",
                  *[f"      {ln}" for ln in post], "    }", "  }"]
        return lines

    body = rowsplit.prelude() if srow else [
            "  const int rank = blockIdx.x % kCluster;  // this CTA's place in the row's cluster",
            "  const int lane = rank * kThreadsPerRow + threadIdx.x;  // the row's threads, over the cluster",
            "  const index_t row = blockIdx.x / kCluster;",
            "  const bool active = true;  // the grid is exactly kRows clusters",
            "  const index_t base = row * kCols;"] if cluster > 1 else [
            "  const int tile_id = blockIdx.x / kSplit;  // (outer, tile): the columns this block folds",
            "  const int part = blockIdx.x % kSplit;  // which interleaved share of the reduced length",
            "  const index_t tile = tile_id % kTilesPerOuter;",
            "  const index_t outer = tile_id / kTilesPerOuter;",
            "  const index_t inner = (tile * kTileX + threadIdx.x) * kVecX;  // the first of this thread's columns",
            "  const bool active = inner < kInner;  // inactive threads still join the all-reduces",
            "  const index_t base = outer * kCols * kInner + inner;  // element (outer, 0, inner)",
            "  const int lane = part * kTileY + threadIdx.y;"] if split > 1 else [
            "  const int group = threadIdx.x / kThreadsPerRow;",
            "  const int lane = threadIdx.x % kThreadsPerRow;",
            "  const index_t row = (index_t)blockIdx.x * kRowsPerBlock + group;",
            "  const bool active = row < kRows;  // inactive lanes still join the all-reduces",
            *(["  const index_t base = row * kCols;"] if steps or out_e or e_in else [])] if not column else [
            "  const index_t tile = blockIdx.x % kTilesPerOuter;",
            "  const index_t outer = blockIdx.x / kTilesPerOuter;",
            "  const index_t inner = tile * kTileX + threadIdx.x;",
            "  const bool active = inner < kInner;  // inactive threads still join the all-reduces",
            "  const index_t row = outer * kInner + inner;",
            "  const index_t base = outer * kCols * kInner + inner;  // element (outer, 0, inner)",
            "  const int lane = threadIdx.y;"]
    body += stage_lines(tiles, vec)
    # contiguous windows: the block's windows folded through shared memory before its rows are read
    win_decls, win_lines, win_bytes = _window_stage(views, sched, g.cols, len(tiles) * sched["rows_per_block"] *
                                                    tile_stride(g.cols), names)
    body += win_lines
    # per-row inputs broadcast over some of the rows: read at the row's offset in their own shape
    kept_shape = tuple(s for d, s in enumerate(g.full) if d not in g.dims)
    row_ld = Operands(program, kept_shape, list(g.row_views), names, "Row", g.row_views) if g.row_views else None

    # inputs read at each row's label (rowpick.py): the element at (row, label), or a class weight's
    picked = list(dict.fromkeys(d.vid for d in gathered(g) if d.gather[1] == "row"))
    pick_ld = Operands(program, g.full, picked, names, "Pick", operand_views(program, io.nodes, picked),
                       {v: (views.scalar[v], views.vector.get(v)) for v in picked if views and v in views.scalar}) \
        if picked else None

    def gather(d) -> str:
        label, kind = d.gather
        if kind == "class":
            src = f"{arg[d.vid]}[{label}]"
        else:
            flat = f"(index_t)row * kCols + {label}" if g.inner == 1 else \
                f"((index_t)(row / {g.inner}) * kCols + {label}) * {g.inner} + row % {g.inner}"
            src = pick_ld.load(d.vid, arg[d.vid], flat)
        return f"(active && {label} >= 0 && {label} < kCols) ? {src} : NAN"

    def row_defs(r: int) -> list[str]:
        lines = []
        for d in g.defs.values():
            if d.space == R and d.round == r and d.key in need:
                src = d.expr
                if d.gather is not None:
                    src = gather(d)
                elif d.expr is None:
                    n = math.prod(vals[d.vid].shape)
                    at = "active ? row : 0" if n > 1 else "0"
                    src = row_ld.load(d.vid, arg[d.vid], f"({at})") if d.vid in g.row_views else \
                        f"{views.scalar[d.vid]}({at})" if views and d.vid in views.scalar else f"{arg[d.vid]}[{at}]"
                lines.append(f"  const {d.ctype} {d.key} = {src};" + (f"  // {d.note}" if d.note else ""))
        return lines

    # the per-row values no fold needs first (a label, a row's mask), before the loads they may guard
    body += row_defs(0)
    if cached and held and not front:
        body.append("  // the row's full-size inputs, loaded once and kept in registers")
        for v in held:
            body.append(f"  {ct[v]} {regs[v]}[kItems * kVec];")
        body += ["#pragma unroll", "  for (int k = 0; k < kItems; ++k) {",
                 f"    const int p = {first} + k * kStride;",
                 f"    if (active && p < {limit}) {{"]
        body += [f"      {ln}" for ln in fill_all(held, "k")]
        # zeros past the row, which no pass reads: left unset, ptxas may spill the array (16 B, a
        # 1001-class cross entropy held by a warp)
        at = "k * kVec + e" if vec == 4 else "k"
        body += ["    } else {", "#pragma unroll", "      for (int e = 0; e < kVec; ++e) {",
                 *(f"        {regs[v]}[{at}] = ({ct[v]})0;" for v in held), "      }", "    }", "  }"]
    if kept:
        body.append("  // per-element values a later pass reads again, kept in registers")
        body += [f"  {g.defs[k].ctype} {a}[kItems * kVec];" for k, a in kept.items()]

    if front:
        closure = g.closure(front, E, need)
        loads = [v for v in held if key_of[v] in {d.key for d in closure}]
        body += ["  // the values the passes read, computed once from the row's inputs",
                 *each_element(lambda ind, at: element_body(closure, ind, [], at, "e" if vec == 4 else "0"),
                               loads, bcast4(closure), fresh=True)]
        kept_done.update(front)
        vec_bcast.clear()

    def split_fold(var, r, rs, args, loads) -> list[str]:
        """Fold this block's share of the reduced length into one state per column the thread holds."""
        folds = [f"fold_{s.state}({var}_v[e].s{j}, {', '.join(s.args)});" for j, s in enumerate(rs)]
        out = [f"  Round{r} {var}_v[kVecX];", "#pragma unroll",
               f"  for (int e = 0; e < kVecX; ++e) {var}_v[e] = identity{r}();"]

        def fill(v):
            def lines(q):
                at = f"base + (index_t)({q}) * kInner"
                if vecx != 4:
                    return [f"{regs[v]}[u] = {q} < kCols ? {ld.load(v, arg[v], at)} : ({ct[v]})0;"]
                return load4(v, regs[v], "u * kVecX + ", at, f"{q} < kCols")
            return lines
        each = ["#pragma unroll", "for (int e = 0; e < kVecX; ++e) {",
                *element_body(g.closure(args, E, need), "  ", folds, "u * kVecX + e"), "}"]
        out += column_tile.batched_pass("lane", [fill(v) for v in loads],
                                        [f"{ct[v]} {regs[v]}[kBatch * kVecX];" for v in loads],
                                        [f"      {ln}" for ln in each], sched["batch"])
        out += ["#pragma unroll", f"  for (int e = 0; e < kVecX; ++e) {var}_v[e] = reduce{r}({var}_v[e]);"]
        return out
    helpers = [_state_code(k) for k in dict.fromkeys(s.state for s in steps + g.row_totals)]
    if g.scans:
        helpers.append(SCAN_HELPERS)
    phase_fold, round_defs = {}, {}       # a split row's fold and per-row values of each round
    for r in range(1, max((s.round for s in steps), default=0) + 1):
        rs = sorted((s for s in steps if s.round == r), key=lambda s: s.slot)
        helpers.append(_round_code(r, rs, schedule, lambda n: program.nodes[n].name))
        var = g.round_vars[r]
        args = [k for s in rs for k in s.args]
        # a streamed row folds an online softmax a step of kUnroll x kVec elements at a time: each
        # argument into a buffer (x: -inf past the row, adding exp(-inf) = 0; y: 0), then one block fold
        blocks = {}
        for j, s in enumerate(rs):
            if s.state in BLOCK_FOLDS and not cached and split == 1:
                bufs = [(names.new(f"{var}_{c}{j}"), init) for c, init, _ in zip("xy", ("-INFINITY", "0.0f"), s.args)]
                blocks[j] = (bufs, f"fold_block_{s.state}({var}.s{j}, {', '.join(b for b, _ in bufs)});")

        def folds(at, rs=rs, var=var, blocks=blocks):
            return [" ".join(f"{buf}[{at}] = {a};" for (buf, _), a in zip(blocks[j][0], s.args)) if j in blocks else
                    f"fold_{s.state}({var}.s{j}, {', '.join(s.args)}{', c' if s.state in INDEXED else ''});"
                    for j, s in enumerate(rs)]
        loads = [v for v in held if key_of[v] in {d.key for d in g.closure(args, E, need, frozenset(kept_done))}]
        body.append(f"  // round {r}: fold {', '.join(vals[program.nodes[s.node].outputs[0]].name + ' (' + s.state + ')' for s in rs)}")
        if split > 1:     # one round: fold, publish, and the last block's per-column outputs
            body += split_fold(var, r, rs, args, loads)
            body += _combine_split(var, r, rs)
            body += ["#pragma unroll", "  for (int e = 0; e < kVecX; ++e) {",
                     f"    const Round{r} {var} = {var}_v[e];",
                     "    const index_t row = outer * kInner + inner + e;",
                     *["  " + ln for ln in row_defs(r)],
                     "    if (active && threadIdx.y == 0) {  // the per-column outputs, once per column",
                     *_row_stores(g, arg, out_r, "      "), "    }", "  }"]
            continue
        closure = g.closure(args, E, need, frozenset(kept_done))
        fold = [f"  {var} = identity{r}();" if srow else f"  Round{r} {var} = identity{r}();",
                *each_element(lambda ind, at, c=closure, f=folds: element_body(c, ind, f(at), at), loads,
                              bcast4(closure), blocks=list(blocks.values())),
                f"  {var} = reduce{r}({var});"]
        vec_bcast.clear()
        kept_done.update(k for k in kept if k in {d.key for d in g.closure(args, E, need)})
        if srow:
            body.append(f"  Round{r} {var};  // this chunk's state, then the row's")
            phase_fold[r], round_defs[r] = fold, row_defs(r)
            continue
        body += fold + row_defs(r)
    if out_e:
        keys = [g.outputs[v] for v in out_e]
        out_closure = g.closure(keys, E, need, frozenset(kept_done))
        loads = [v for v in held if key_of[v] in {d.key for d in out_closure}]
        if vec == 4:
            tail = [f"{outs_local[v]}[e] = {g.outputs[v]};" for v in out_e]
            pre = [f"{octype[v]} {outs_local[v]}[kVec];" for v in out_e]
            post = []
            for v in out_e:
                ov = stores.get(v)
                if ov is not None and not ov.vector:     # the run lands apart: one lane at a time
                    run = flat("p")
                    post += [f"{arg[v]}[{ov.offset(f'{run} + {j}')}] = {outs_local[v]}[{j}];" for j in range(4)]
                    continue
                at = flat("p") if ov is None else ov.offset(flat("p"))
                post.append(f"reinterpret_cast<{VEC4[vals[v].dtype]}*>({arg[v]} + {at})[0] = "
                            f"{VEC4[vals[v].dtype]}{{{', '.join(f'{outs_local[v]}[{j}]' for j in range(4))}}};")
            pre += bcast4(out_closure)
        else:
            tail = [f"{arg[v]}[{stores[v].offset('i') if v in stores else 'i'}] = {g.outputs[v]};" for v in out_e]
            pre = post = []
        output = ["  // the per-element outputs",
                  *each_element(lambda ind, at: element_body(out_closure, ind, tail, at), loads, pre, post)] \
            if not g.scans else ["  // the per-element outputs and the running values along the row, chunk by chunk",
                                 *scan_pass(out_closure, tail, pre, post)]
        if not srow:
            body += output
    row_out = ["  if (active && lane == 0) {  // the per-row outputs, once per row",
               *_row_stores(g, arg, out_r, "    "), "  }"] if out_r else []
    if split == 1 and not srow:
        body += row_out

    if cluster > 1:
        body.append("  __cluster_barrier_arrive();  // no CTA leaves while the cluster may read its state")
        body.append("  __cluster_barrier_wait();")
    totals = sorted([s for s in steps if s.total is not None] + g.row_totals, key=lambda s: s.total)
    total_lines = []
    if totals:
        helpers.append(_totals_code(totals))
        # which thread holds each row's share, and its place among the block's rows
        block_rows = ("threadIdx.y == 0", "active", "threadIdx.x", "kTileX") if column else \
            ("threadIdx.x == 0", "active && lane == 0", "0", "1") if cluster > 1 else \
            ("lane == 0", "active", "group", "kRowsPerBlock")
        total_lines = _combine_totals(g, totals, need, [f"  {arg[v]}[0] = {g.outputs[v]};" for v in out_t],
                                      lambda d: f"{arg[d.vid]}[0]", block_rows, split_row=srow)
    space = None
    if srow:
        fields = {r: [(j, f) for j, s in enumerate(sorted((s for s in steps if s.round == r), key=lambda s: s.slot))
                      for f in STATES[s.state][0]] for r in range(1, rounds_n + 1)}
        space = rowsplit.SplitRowSpace(g.rows, sched["row_split"], {r: len(f) for r, f in fields.items()},
                                       _total_fields(totals) if totals else 0)
        if cached:       # held: one phase, every block combines its row's partials itself
            final = [*row_out, *total_lines]
            folds = {r: rowsplit.combine_in_every_block(r, g.round_vars[r], fields[r], phase_fold[r],
                                                        r == rounds_n and bool(final)) for r in fields}
            body += rowsplit.in_turn(rounds_n, folds, round_defs, final, output if out_e else [])
        else:
            folds = {r: rowsplit.fold_and_combine(r, g.round_vars[r], fields[r], phase_fold[r],
                                                  [*round_defs[r], *row_out, *total_lines]
                                                  if r == rounds_n and (row_out or total_lines) else [],
                                                  r < rounds_n or bool(out_e)) for r in fields}
            loaded = {r: [*rowsplit.wait_and_load(r, g.round_vars[r], fields[r]), *round_defs[r]] for r in fields}
            body += rowsplit.nest(rounds_n, folds, loaded, output if out_e else [])
        body += rowsplit.count_out()
    else:
        body += total_lines
    tx, ty = sched.get("tile_x", column_tile.TILE_X), sched.get("tile_y", column_tile.TILE_Y)
    tpr, items = sched["tpr"], sched["items"]
    consts = [f"typedef {index_t} index_t;",
              f"constexpr index_t kRows = {g.rows};",
              f"constexpr int kCols = {g.cols};  // reduced length of each row",
              f"constexpr float kColsF = {float_literal(g.cols)};",
              f"constexpr int kVec = {vec};  // elements per load"]
    if column:
        consts += [f"constexpr index_t kInner = {g.inner};  // kept elements after the reduced dims (the stride)",
                   f"constexpr int kTileX = {tx}, kTileY = {ty}, kBlock = kTileX * kTileY;",
                   f"constexpr int kVecX = {vecx};  // neighbouring columns each thread folds"
                   + (" (float4 loads)" if vecx == 4 else ""),
                   f"constexpr index_t kTilesPerOuter = {math.ceil(g.inner / (tx * vecx))};",
                   f"constexpr int kSplit = {split};  // blocks that share each column tile",
                   "constexpr int kStride = kTileY * kSplit;  // columns between a thread's elements"]
        if not cached:
            consts.append(f"constexpr int kBatch = {sched['batch']};  // loads in flight per thread (column_tile.py)")
        if split > 1:
            consts.append(f"constexpr int kFields = {_fields_of_round1(steps)};  // floats per partial state")
    else:
        consts += [f"constexpr int kThreadsPerRow = {tpr};",
                   f"constexpr int kRowsPerBlock = {sched['rows_per_block']};",
                   "constexpr int kBlock = kThreadsPerRow * kRowsPerBlock;",
                   f"constexpr int kShuffleStart = {min(tpr, 32) // 2};",
                   f"constexpr int kWarpsPerRow = {max(1, tpr // 32)};",
                   "constexpr int kWarpSize = 32;",
                   f"constexpr int kCluster = {cluster};  // CTAs per row (one thread-block cluster)",
                   "constexpr int kStride = kCluster * kThreadsPerRow * kVec;  // columns between a thread's loads"]
    if cached:
        consts.append(f"constexpr int kItems = {items};  // loads per thread and input")
    elif not column:
        consts.append(f"constexpr int kUnroll = {sched['unroll']};  // loads of each input in flight per thread")
    if tiles:
        consts.append(f"constexpr int kTileStride = {tile_stride(g.cols)};  // floats between staged rows "
                      f"(4 banks from a multiple of 32)")
    if srow:
        consts += [f"constexpr int kSplit = {sched['row_split']};  // chunks per row",
                   f"constexpr int kChunk = {sched['chunk']};  // columns per chunk (a multiple of kVec)",
                   f"constexpr int kPhases = {sched['phases']};  // fold rounds, then the per-element outputs",
                   *space.consts()]
    if totals:
        consts += [f"constexpr float kNumelF = {float_literal(numel)};  // elements of a whole-tensor reduction",
                   f"constexpr int kTotalFields = {_total_fields(totals)};  // floats of each row's share of the totals"]
    consts += ld.consts + (row_ld.consts if row_ld else []) + (pick_ld.consts if pick_ld else [])
    rounds = max((s.round for s in steps), default=0)
    sched_text = {"warp": f"{tpr} lanes per row, {sched['rows_per_block']} rows per block",
                  "block": f"one block of {tpr} threads per row",
                  "stream": f"one block of {tpr} threads per row",
                  "column": f"column tiles of {tx} positions x {ty} thread rows" if ty > 1 else
                            f"one thread per column, {tx} columns per block",
                  "split_column": f"column tiles of {tx * vecx} positions ({vecx} per thread) x {ty} thread rows, "
                                  f"{split} blocks per tile, last block combines",
                  "cluster": f"a cluster of {cluster} CTAs of {tpr} threads per row, states exchanged through "
                             f"distributed shared memory",
                  "split_row": f"{sched.get('row_split')} chunks of {sched.get('chunk')} per row, a block of {tpr} "
                               f"threads each, " + ("one phase, each block combining its row's partials "
                                                    "after each round" if cached else
                                                    f"{sched.get('phases')} phases (last block per row combines "
                                                    f"in parallel)")}[schedule]
    sched_text += (", row in registers" if cached else f", the row read {rounds + bool(out_e)} times"
                   + (f" ({sched['batch'] if column else sched['unroll']} loads in flight per thread)")) + \
        f", {rounds} all-reduce round(s), {'float4' if 4 in (vec, vecx) else 'scalar'} loads, {sched['grid']} blocks" + \
        (f", the rows read through a transposing view staged in shared memory with the row index fastest "
         f"({', '.join(vals[v].name for v in tiles)})" if tiles else "") + \
        (f", the block's contiguous windows of {', '.join(program.nodes[n].name for n in views.staged)} folded "
         f"in shared memory first" if views is not None and views.staged else "")
    red_names = ", ".join(program.nodes[n].op for n in g.reductions)
    head = header(program, f"Region {name}: {len(g.reductions)} reductions ({red_names}) over the same "
                           f"rows of {g.cols}, one kernel", io.nodes, [
        "Inputs:  " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.inputs),
        "Outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.outputs),
        f"[{g.outer}, {g.cols}, {g.inner}]: {g.rows} rows of {g.cols}; schedule: {sched_text}.",
        *[f"Monotone chain: {h}, applied once per row (exact; codegen/monotone.py)." for h in g.hoisted],
    ])
    def in_ctype(v):     # an input only the layout prologue reads keeps its own type
        k = g.inputs.get((v, E)) or g.inputs.get((v, R))
        return g.defs[k].ctype if k else c_type(vals[v].dtype, f"'{vals[v].name}'")
    cparams = [f"const {in_ctype(v)}* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"{octype[v]}* __restrict__ {arg[v]}" for v in io.outputs]
    if split > 1 or totals or srow:
        cparams += ["float* __restrict__ workspace", "unsigned int* __restrict__ counters"]
    if views:
        body = [*win_decls, "  // the layout prologue's values through their views, by flat index (run start for float4)",
                *views.declarations(body, structs=False), *body]
    if tiles or win_lines:
        body = ["  extern __shared__ float4 stage_smem[];  // staged rows' tiles, then staged windows' tiles and chunk",
                *body]
    row_decl = "  const index_t row = outer * kInner + inner;"
    if row_decl in body and not any(re.search(r"\brow\b", ln.split("//")[0]) for ln in body if ln != row_decl):
        body.remove(row_decl)      # a column tile with no per-column output or operand has no use for it
    text = "\n".join(body)
    structs = [VEC4_STRUCTS[t] + "\n" for t in VEC4_STRUCTS if re.search(rf"\b{t}\b", text)]
    kname = kernel_name(name)
    source = kernel_source(head, consts, [*structs, *ld.helpers, *(row_ld.helpers if row_ld else []),
                                          *(pick_ld.helpers if pick_ld else []), *helpers],
                           kname, cparams, body)
    if sched["block"] == 1024 and not column:
        # one 1024-thread block per SM: let ptxas use the 64 registers each thread then has
        source = source.replace("__launch_bounds__(kBlock)", "__launch_bounds__(kBlock, 1)", 1)
    if cluster > 1:   # compile-time cluster dims: an ordinary launch (CuPy, <<<>>>) starts clusters
        source = re.sub(r"(__launch_bounds__\([^)]*\))", r"\1 __cluster_dims__(kCluster, 1, 1)", source, count=1)
    block = (tx, ty, 1) if column else (sched["block"], 1, 1)
    columns = g.outer * math.ceil(g.inner / (tx * vecx)) * tx * vecx
    return KernelSource(
        name=kname, kind="row_reduction", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(sched["grid"], 1, 1), block=block, schedule=sched_text,
        shared_bytes=len(tiles) * sched["rows_per_block"] * tile_stride(g.cols) * 4 + win_bytes,
        params={"schedule": schedule, "threads_per_row": tpr, "rows_per_block": sched["rows_per_block"],
                "vector_width": vec, "block": block[0] * block[1], "grid": sched["grid"], "cached": cached,
                "rounds": rounds, "reductions": len(g.reductions), "cluster": cluster,
                "row_reads": 1 if cached else rounds + bool(out_e),
                "split": sched["row_split"] if srow else split, "phases": sched.get("phases", 1),
                "cols": g.cols, "vecx": vecx, "staged": bool(tiles), "unroll": sched["unroll"],
                "staged_windows": len(views.staged) if views is not None else 0,
                "window_unroll": views.window_unroll if views is not None and views.folded else None,
                "online": bool(sched.get("online")), "other_rounds": bool(sched.get("other_rounds")),
                **({"tile_y": ty, "column_batch": sched["batch"]} if column else {}), "hoisted": list(g.hoisted),
                # inputs loaded only where a select takes them: per element, or only per row
                "guarded": [vals[v].name for v in held if v in guarded and not _per_row(g, guards[v])],
                "guarded_rows": [vals[v].name for v in held if v in guarded and _per_row(g, guards[v])],
                # the cluster sizes that still hold the row in registers (the tuner's choices)
                "cluster_fits": [n for n in range(2, CLUSTER_PORTABLE + 1) if cluster > 1 and
                                 _cluster_holds(g.cols, max(1, len(front) or len(held)), n, ROW_THREAD_FLOATS)]},
        align=16 if 4 in (vec, vecx) else 4,
        # an input read only at each row's label (a lone nll_loss's log-probabilities) moves one element a row
        bytes_moved=sum(g.rows * DTYPE_BYTES[vals[v].dtype] if v in picked and v not in e_in else vals[v].nbytes
                        for v in io.inputs + io.outputs),
        flops=sum(program.node_flops(n) for n in io.nodes),
        workspace=space.workspace() if srow else
        [("float32", columns * split * _fields_of_round1(steps)), ("int32", sched["grid"] // split)]
        if split > 1 else [("float32", sched["grid"] * _total_fields(totals)), ("int32", 1)] if totals else [])


def _per_row(g: RowGraph, gates) -> bool:
    """Whether every condition guarding an input (rowguard.guarded_inputs) is one per row."""
    return all(g.defs[c].space == R for c, _ in gates)


def _total_fields(totals) -> int:
    return sum(len(STATES[s.state][0]) for s in totals)


def _totals_code(totals) -> str:
    """The struct of the whole-tensor reductions' states, its identity, combine and warp shuffle."""
    members = " ".join(f"St_{s.state} t{s.total};" for s in totals)
    return ("// The whole-tensor reductions: every row's share, combined by the kernel's last block.\n"
            f"struct Totals {{ {members} }};\n"
            "__device__ __forceinline__ Totals identityT() { return Totals{"
            + ", ".join(f"identity_{s.state}()" for s in totals) + "}; }\n"
            "__device__ __forceinline__ Totals combineT(Totals a, Totals b) {\n"
            + "".join(f"  a.t{s.total} = combine_{s.state}(a.t{s.total}, b.t{s.total});\n" for s in totals)
            + "  return a;\n}\n"
            "__device__ __forceinline__ Totals shuffleT(Totals a, int offset) {\n"
            + "".join(f"  a.t{s.total}.{f} = __shfl_xor_sync(0xffffffffu, a.t{s.total}.{f}, offset);\n"
                      for s in totals for f in STATES[s.state][0])
            + "  return a;\n}\n")


def _combine_totals(g: RowGraph, totals, need, stores: list[str], load_input, block=None,
                    split_row: bool = False) -> list[str]:
    """The totals' shares, combined by the block that arrives last (thread t folds shares t, t + kBlock,
    ...; then a fixed shuffle tree and the warps in order: the same bits whichever block came last),
    which evaluates the totals' pointwise ops and stores them once. `block` = (writer, has a row,
    slot, slots): each block first combines its rows' shares in row order (shared memory) and
    publishes one share (a million per-pixel losses are 4096 block shares, not a million the last
    block reads one after another). A split row's combining block publishes its row's share instead."""
    fields = [(s, f) for s in totals for f in STATES[s.state][0]]
    fold = []          # the row's share folded into `q`
    for s in totals:
        if s.per_row:     # the row's share is its one value
            fold.append(f"fold_{s.state}(q.t{s.total}, {', '.join(s.args)});")
        else:
            fold.append(f"q.t{s.total} = {g.round_vars[s.round]}.s{s.slot};")
    first = "threadIdx.x == 0 && threadIdx.y == 0"
    if split_row:      # kRows shares, one per row, at kTotalsAt
        count, at, head = "kRows", "kTotalsAt + ", []
        publish = ["Totals q = identityT();", *fold,
                   *[f"workspace[kTotalsAt + row * kTotalFields + {n}] = q.t{s.total}.{f};"
                     for n, (s, f) in enumerate(fields)]]
        arrival = publish_and_arrive(publish, "counters[2]", "kRows", publisher="threadIdx.x == 0", arriver=first)
        counter = "counters[2]"
    else:
        writer, has, slot, slots = block
        count, at, counter = "gridDim.x", "", "counters[0]"
        head = [f"  __shared__ Totals block_rows[{slots}];  // this block's rows' shares",
                f"  if ({writer}) {{",
                "    Totals q = identityT();",
                f"    if ({has}) {{", *[f"      {ln}" for ln in fold], "    }",
                f"    block_rows[{slot}] = q;", "  }", "  __syncthreads();",
                # lane l folds rows l, l + 32, ... in order, then a fixed shuffle tree: the same bits every launch
                "  if (threadIdx.x < 32 && threadIdx.y == 0) {  // the first warp combines the block's rows",
                "    Totals q = identityT();",
                f"    for (int w = threadIdx.x; w < {slots}; w += 32) q = combineT(q, block_rows[w]);",
                "#pragma unroll",
                "    for (int offset = 16; offset > 0; offset >>= 1) q = combineT(q, shuffleT(q, offset));",
                "    if (threadIdx.x == 0) block_rows[0] = q;", "  }"]
        publish = [*[f"workspace[blockIdx.x * kTotalFields + {n}] = block_rows[0].t{s.total}.{f};"
                     for n, (s, f) in enumerate(fields)]]
        arrival = publish_and_arrive(publish, counter, "gridDim.x", publisher=first, arriver=first)
    tdefs = [d for d in g.defs.values() if d.space == T and d.key in need]
    lines = [f"      const {d.ctype} {d.key} = {d.expr if d.expr is not None else load_input(d)};"
             + (f"  // {d.note}" if d.note else "") for d in tdefs]
    return ["  // the whole-tensor reductions: each block (a split row: each row) publishes its share, the last "
            "block combines them", *head, *arrival,
            "  if (last) {",
            "    __threadfence();",
            "    const int tid = threadIdx.y * blockDim.x + threadIdx.x;",
            "    Totals totals = identityT();",
            f"    for (index_t r = tid; r < {count}; r += kBlock) {{  // in order",
            "      Totals q;",
            *[f"      q.t{s.total}.{f} = __ldcg(workspace + {at}r * kTotalFields + {n});" for n, (s, f) in enumerate(fields)],
            "      totals = combineT(totals, q);",
            "    }",
            "#pragma unroll",
            "    for (int offset = 16; offset > 0; offset >>= 1) totals = combineT(totals, shuffleT(totals, offset));",
            "    __shared__ Totals totals_part[kBlock / 32];",
            "    if (tid % 32 == 0) totals_part[tid / 32] = totals;",
            "    __syncthreads();",
            "    if (tid == 0) {",
            "      totals = totals_part[0];",
            "      for (int w = 1; w < kBlock / 32; ++w) totals = combineT(totals, totals_part[w]);",
            *lines,
            *[f"    {ln}" for ln in stores],
            "      " + reset_counter(counter, "").strip(),
            "    }",
            "  }"]


def _fields_of_round1(steps) -> int:
    return sum(len(STATES[s.state][0]) for s in steps if s.round == 1)


def _combine_split(var: str, r: int, steps) -> list[str]:
    """A split column's publish-and-combine: the first thread row stores the block's state of each of
    its kVecX columns into the workspace, split by split (a warp's stores and loads of one split are
    neighbours); in the tile's last block every thread row folds splits y, y + kTileY, ... and the
    thread rows are combined in order through shared memory (the same bits whichever block came
    last). One thread per column walking all kSplit states alone left the last tile's block reading
    kVecX x kSplit scattered states one after another (H100: a 64 MB column reduction at 341 GB/s)."""
    fields = [(j, f) for j, s in enumerate(steps) for f in STATES[s.state][0]]
    at = "(((index_t)tile_id * kSplit + {}) * kTileX * kVecX + threadIdx.x * kVecX + e) * kFields"
    publish = ["#pragma unroll", "for (int e = 0; e < kVecX; ++e) {",
               "  const index_t slot = " + at.format("part") + ";",
               *[f"  workspace[slot + {n}] = {var}_v[e].s{j}.{f};" for n, (j, f) in enumerate(fields)], "}"]
    return ["  // publish this block's per-column states; the tile's last block combines all kSplit of them",
            *publish_and_arrive(publish, "counters[tile_id]", "kSplit", publisher="threadIdx.y == 0",
                                arriver="threadIdx.x == 0 && threadIdx.y == 0"),
            "  if (!last) return;",
            "  __threadfence();",
            "#pragma unroll",
            "  for (int e = 0; e < kVecX; ++e) {",
            f"    {var}_v[e] = identity{r}();",
            "#pragma unroll 4",
            "    for (int k = threadIdx.y; k < kSplit; k += kTileY) {  // this thread row's splits, in order",
            f"      const float* w = workspace + {at.format('k')};",
            f"      Round{r} q;",
            *[f"      q.s{j}.{f} = __ldcg(w + {n});" for n, (j, f) in enumerate(fields)],
            f"      {var}_v[e] = combine{r}({var}_v[e], q);",
            "    }",
            f"    {var}_v[e] = reduce{r}({var}_v[e]);  // the thread rows in order",
            "  }",
            "  if (threadIdx.x == 0 && threadIdx.y == 0) " + reset_counter("counters[tile_id]", "").strip()]
