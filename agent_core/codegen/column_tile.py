"""Column tiles of the row graph (codegen/rowkernel.py's `column` and `split_column` schedules): how
tall a tile is, and how a thread streams its share of a column with loads in flight.

A column reduction ([outer, L, inner], reduced over L) gives each block 32 neighbouring inner
positions (kTileX: a warp's load is 128 contiguous bytes, or 512 with float4 over kVecX columns) and
kTileY thread rows that split L; or, where nothing is written per element, the column is read once
and there are columns enough, one thread per column in tiles of 256 (class_loss's schedule for
strided classes: nothing to combine across thread rows). Two things decide its speed beside
coalescing:

  loads in flight  a thread that folds each element as it arrives has one load outstanding: the
                   fold (Welford's division, a max) depends on it and the next load waits for the
                   loop's back edge. 64 warps of 128-byte loads are 8 KB in flight per SM, a quarter
                   of what the H200's 4.2 TB/s needs at its latency (ptxas of DINO's column
                   statistics at 9c9edc0: one ld.global.nc.f32 per loop trip, then div.rn). A
                   streamed column therefore loads kBatch elements (independent addresses) into
                   registers before folding any of them;
  held columns     a region that writes per element (x - mean(x, 0)) reads the column again for
                   its outputs unless each thread holds its share in registers (column_max_items):
                   the tile grows to 16 or 32 thread rows where that brings the share under the
                   limit, and the held loads are all issued before the first fold.

The tuner times the other heights and batch sizes (`tile_y`, `column_batch`).
"""
from __future__ import annotations

import math
from typing import Callable

from .kernel import CodegenError

TILE_X = 32            # inner positions per tile (a warp's coalesced load)
TILE_Y = 8             # thread rows of a tile by default
THREADS_PER_SM = 1024  # columns per SM, at least, for one thread per column (a full load of threads)
MAX_BATCH = 16
LOCALS = ("pb", "u")


def tile_x(ty: int) -> int:
    """Inner positions of a tile of ty thread rows: a tile shorter than TILE_Y rows is wider, so a
    block keeps TILE_X * TILE_Y threads (one thread per column: 256 neighbouring columns)."""
    return TILE_X * max(1, TILE_Y // ty)


def column_rows(cols: int, k: int, p: dict, per_element: bool) -> int:
    """Thread rows of a column tile (kTileY). A tuner's `tile_y` overrides. A column the kernel
    writes per element grows to 16 or 32 rows where that keeps each thread's share of its k
    full-size inputs within column_max_items (held in registers, read once); otherwise 8."""
    if p.get("tile_y") is not None:
        ty = int(p["tile_y"])
        if ty & (ty - 1) or not 1 <= ty <= 1024 // TILE_X:
            raise CodegenError(f"tile_y must be a power of two from 1 to {1024 // TILE_X} thread rows, got {ty}")
        return ty
    if per_element:
        for rows in (TILE_Y, 2 * TILE_Y, 4 * TILE_Y):
            if math.ceil(cols / rows) * k <= int(p["column_max_items"]):
                return rows
    return TILE_Y


def batch_of(p: dict) -> int:
    b = int(p["column_batch"])
    if not 1 <= b <= MAX_BATCH:
        raise CodegenError(f"column_batch must be 1 to {MAX_BATCH} loads in flight per thread, got {b}")
    return b


def batched_pass(start: str, fills: list[Callable[[str], list[str]]], decls: list[str], body: list[str],
                 batch: int, after: list[str] = ()) -> list[str]:
    """A thread's streamed pass over its share of a column: elements p = start, start + kStride, ...
    below kCols, kBatch at a time. `decls` declare the register arrays (indexed by u); `fills[j](p)`
    are the lines that load element p of input j into slot u (each guarded: a slot past the column
    holds a zero nothing folds); `body` is one element's lines at p with its values in slot u;
    `after`, lines once the batch's elements are done (a fold of the whole batch)."""
    if batch == 1:
        return ["  for (int p = " + start + "; active && p < kCols; p += kStride) {",
                "    const int u = 0;", *[f"    {d}" for d in decls],
                *[f"    {ln}" for f in fills for ln in f("p")], *[f"  {ln}" for ln in body],
                *[f"    {ln}" for ln in after], "  }"]
    return ["  for (int pb = " + start + "; active && pb < kCols; pb += kStride * kBatch) {",
            *[f"    {d}" for d in decls],
            f"    // {batch} loads in flight before the first fold",
            "#pragma unroll",
            "    for (int u = 0; u < kBatch; ++u) {",
            "      const int p = pb + u * kStride;",
            *[f"      {ln}" for f in fills for ln in f("p")],
            "    }",
            "#pragma unroll",
            "    for (int u = 0; u < kBatch; ++u) {",
            "      const int p = pb + u * kStride;",
            "      if (p < kCols) {",
            *[f"    {ln}" for ln in body],
            "      }",
            "    }",
            *[f"    {ln}" for ln in after],
            "  }"]


def tune_variants(params: dict) -> list[dict]:
    """A column tile's alternatives: for a held column the other heights that still hold it (and
    the 8-row tile that streams it); for a streamed one twice and half the loads in flight, and a
    taller tile (fewer elements per thread, more warps), or the 8-row tile where it is already 32."""
    ty, cols = int(params.get("tile_y") or TILE_Y), int(params.get("cols") or 0)
    batch = int(params.get("column_batch") or 4)
    out: list[dict] = []
    if params.get("cached"):
        out += [{"tile_y": t} for t in (ty * 2, ty // 2) if TILE_Y <= t <= 32 and t <= max(cols, 1)]
        if ty != TILE_Y:
            out.append({"tile_y": TILE_Y})
    else:
        out += [{"column_batch": b} for b in (batch * 2, batch // 2) if 1 <= b <= MAX_BATCH]
        if ty * 2 <= 32 and ty * 2 <= cols:
            out.append({"tile_y": ty * 2})
        elif ty > TILE_Y:        # the tall tile of few tiles (rowkernel._tall_tiles): also the default's 8
            out.append({"tile_y": TILE_Y})
    return out
