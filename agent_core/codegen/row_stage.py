"""Staged rows: a row kernel whose prologue reads its rows through a transposing view (ViT's
patches.flatten(2).transpose(1, 2) before its layer_norm) computes the block's rows with the row index
fastest into shared memory, then each warp reads its own row from there (the warp-per-row
schedule). Row by row such a read takes a 32-byte sector per element, each sector again for each of
the 8 rows beside it; staged, neighbouring rows share each sector (tests/test_codegen_staged_rows.py
counts them against the bytes-read-once floor).
"""
from __future__ import annotations

import math

from ..ir import Program
from . import views as V
from .layout_graph import _Graph, index_inputs
from .region_io import region_io

STAGE_MIN_ROWS = 8  # rows a staged tile spans at least: 8 rows of 4 bytes fill a 32-byte sector
STAGE_MAX_BYTES = 112 * 1024  # dynamic shared memory of a staged block: two such blocks fit an SM


def transposed_read(program: Program, pro) -> bool:
    """Some read of the prologue `pro` (layout and pointwise nodes) walks its last dim with a stride
    and the dim before it contiguously: neighbouring columns of a row lie far apart in memory,
    neighbouring rows do not."""
    io = region_io(program, pro)
    g = _Graph(program, io, "row-kernel prologue", index_inputs(program, io, "row-kernel prologue"))
    for _, r in g.reads():
        for layer in r.stack.layers:
            if isinstance(layer, V.View):
                m = layer.merged()
                if len(m.shape) >= 2 and m.strides[-1] not in (0, 1) and m.strides[-2] == 1 and m.shape[-2] > 1:
                    return True
    return False


def tile_stride(cols: int) -> int:
    """Floats between two staged rows: at least a row, a multiple of 4 (float4 reads of a row stay
    aligned), 4 banks from a multiple of 32, so the 8 rows x 4 columns a warp writes per step (row
    index fastest) fall in 32 distinct banks."""
    return cols + (4 - cols % 32) % 32


def staged_values(program: Program, pro, views, computed: dict, schedule: str, rows_per_block: int,
                  cols: int, p: dict) -> list[str]:
    """The prologue values a warp-per-row kernel stages in shared memory: those computed through
    views (`computed`, no float4 form) where some read of the prologue `pro` is transposed
    (transposed_read). Read row by row, each lane's 4 columns lie a whole stride apart (ViT's
    patches, 196 floats): every load takes a sector of its own and the rows beside it take the same
    sectors again. Staged, the block reads its kRowsPerBlock rows with the row index fastest, so
    neighbouring rows share each sector. Only where the block spans STAGE_MIN_ROWS rows and the
    tiles fit in STAGE_MAX_BYTES; `stage=False` (a tuner variant) turns it off."""
    if not views or not p.get("stage", True) or schedule != "warp" or rows_per_block < STAGE_MIN_ROWS \
            or not transposed_read(program, pro):
        return []
    vals = program.values
    out = [v for v, (_, vec_fn) in computed.items() if vec_fn is None and vals[v].dtype == "float32"]
    if len(out) * rows_per_block * tile_stride(cols) * 4 > STAGE_MAX_BYTES:
        return []
    return out


def stage_tiles(program: Program, pro, views, computed: dict, schedule: str, rows_per_block: int, rows: int,
                cols: int, vec: int, names, p: dict) -> dict:
    """Stage what staged_values picks among the full-size values of `computed`: value -> (its tile's
    name, its C text at row s_at, column s_col: composed down to its loads where that fits, else its
    lambda at the flat index). `computed` then reads them from their tiles (float4 when vec is 4)."""
    full = {v: f for v, f in computed.items() if math.prod(program.values[v].shape) == rows * cols}
    tiles = {}
    for v in staged_values(program, pro, views, full, schedule, rows_per_block, cols, p):
        tile = names.new(program.values[v].name + "_tile")
        at = views.at(v, V.add(V.mul(V.Var("s_at", 0, rows - 1), cols), V.Var("s_col", 0, cols - 1)))
        tiles[v] = (tile, at or f"{computed[v][0]}(s_at * kCols + s_col)")
        computed[v] = (f"{tile}_at", f"{tile}_at4" if vec == 4 else None)
    return tiles


def stage_lines(tiles: dict, vec: int) -> list[str]:
    """The staging loop (tiles: value -> (tile, its C text at row s_at, column s_col)): each thread
    computes prologue values at (row s_row, column s_col) of the block's rows, the row index fastest,
    into the tile; pass 1 then reads its row from the tile (a float4 at a time when kVec is 4: the
    tile's rows start 16-byte aligned)."""
    if not tiles:
        return []
    out = []      # stage_smem: the kernel's dynamic shared memory (rowkernel declares it)
    for k, (tile, _) in enumerate(tiles.values()):
        out.append(f"  float* const {tile} = reinterpret_cast<float*>(stage_smem) + {k} * kRowsPerBlock * kTileStride;")
    out += ["  // stage: the block's rows computed through their views with the row index fastest (the",
            "  // transposed read is contiguous across rows, so 8 rows share each sector), then read per row",
            "  for (int s_t = threadIdx.x; s_t < kRowsPerBlock * kCols; s_t += kBlock) {",
            "    const int s_row = s_t % kRowsPerBlock, s_col = s_t / kRowsPerBlock;",
            "    const index_t s_at = (index_t)blockIdx.x * kRowsPerBlock + s_row;",
            "    if (s_at < kRows) {"]
    out += [f"      {tile}[s_row * kTileStride + s_col] = {value};" for tile, value in tiles.values()]
    out += ["    }", "  }", "  __syncthreads();"]
    for tile, _ in tiles.values():
        if vec == 4:
            out += [f"  auto {tile}_at4 = [&](index_t i) -> float4 {{",
                    f"    return reinterpret_cast<const float4*>({tile} + group * kTileStride + (int)(i - base))[0]; }};"]
        else:
            out.append(f"  auto {tile}_at = [&](index_t i) -> float {{ return {tile}[group * kTileStride + (int)(i - base)]; }};")
    return out
