"""argmax / argmin: the int64 index of the largest (smallest) element over one dim, or over the
flattened tensor when dim is None, with or without keepdim.

The input is viewed as [outer, L, inner] around the reduced dim: R = outer * inner rows of L elements,
element l of row (o, i) at (o * L + l) * inner + i. Each thread folds its share of a row in increasing
index order into a candidate (value, index); candidates are then combined with xor shuffles (and
shared memory across warps). Torch's order decides every comparison, so the result does not depend on
how the row was split:

  * NaN beats every number, and among NaNs the smaller index wins (torch: the first NaN, for argmax
    and argmin alike);
  * otherwise the larger (argmax) or smaller (argmin) value wins, and equal values go to the smaller
    index (the first occurrence; -0.0 == 0.0).

Schedules:
  warp    inner == 1 (or a short stride), L <= 1024: one warp per row, 8 rows per 256-thread block;
          float4 loads when inner == 1 and L % 4 == 0;
  block   longer rows: one block (256 threads; 1024 past 16384 elements) per row;
  column  inner >= 16: the reduced dim is strided; a block owns 32 neighbouring inner positions
          (coalesced loads) of one outer index and 8 thread rows split L, then shared memory.
A flattened (dim None) reduction is one row; a very long one runs on one block (few SMs busy).
"""
from __future__ import annotations

import math

from ..ir import Program
from .cuda import Names, header, kernel_name, kernel_source
from .kernel import CodegenError, KernelSource
from .region_io import RegionIO
from .rowwalk import WARP, describe_rows, pick_schedule, row_walk, single_node, threads_per_row, vector_width

ARG_OPS = ("argmax", "argmin")
DEFAULTS = {"warp_max_cols": 1024, "long_cols": 16384, "block": 256, "long_block": 1024,
            "column_min_inner": 16, "vector_width": 4}
COLUMN_TILE = (32, 8)  # inner positions per block (coalesced) x thread rows splitting the reduced dim
KERNEL_LOCALS = ("Candidate", "better", "consider", "none", "warp_reduce", "row_reduce", "best", "base",
                 "row", "lane", "warp", "partial", "part", "tile", "outer", "inner", "active", "c0", "l")


def generate_arg_reduction(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    p = {**DEFAULTS, **(params or {})}
    vals = program.values
    node = single_node(program, io, ARG_OPS, "argmax/argmin")
    x, y = vals[node.inputs[0]], vals[node.outputs[0]]
    if x.dtype != "float32":
        raise CodegenError(f"{node.name} ({node.op}) reads '{x.name}' of dtype {x.dtype}; argmax/argmin "
                           f"kernels are generated for float32 inputs", node_id=node.id)
    if y.dtype != "int64":
        raise CodegenError(f"{node.name} ({node.op}) gives '{y.name}' as {y.dtype}; expected int64",
                           node_id=node.id)
    dim = node.attrs.get("dim")
    walk = row_walk(node, x.shape, dim, "reduces", "torch raises and there is nothing to launch")
    outer, cols, inner, rows = walk.outer, walk.cols, walk.inner, walk.rows
    better_op = ">" if node.op == "argmax" else "<"
    worst = "-INFINITY" if node.op == "argmax" else "INFINITY"

    schedule = pick_schedule(p, cols, inner)
    vec = vector_width(p, schedule, cols, inner)

    names = Names()
    names.taken.update(KERNEL_LOCALS)
    xa, ya = names.new(x.name), names.new(y.name)
    kname = kernel_name(name)
    cparams = [f"const float* __restrict__ {xa}", f"long long* __restrict__ {ya}"]

    rule = ("larger value wins" if node.op == "argmax" else "smaller value wins")
    helpers = [
        "// A row's running candidate: a value and its index along the reduced dim.",
        "struct Candidate { float value; index_t index; };",
        f"// The empty candidate: {worst} at kNoIndex loses to every element (and any tie, by index).",
        f"__device__ __forceinline__ Candidate none() {{ return Candidate{{{worst}, kNoIndex}}; }}",
        f"// torch's {node.op} order: NaN beats every number; otherwise the {rule}; ties (NaN with NaN,",
        "// equal values) go to the smaller index, so the first occurrence wins however the row is split.",
        "__device__ __forceinline__ bool better(float a, index_t ia, float b, index_t ib) {",
        "  if (a != a) return b == b || ia < ib;  // a is NaN",
        "  if (b != b) return false;              // b is NaN and a is not",
        f"  return a {better_op} b || (a == b && ia < ib);",
        "}",
        "__device__ __forceinline__ void consider(Candidate& c, float value, index_t index) {",
        "  if (better(value, index, c.value, c.index)) c = Candidate{value, index};",
        "}",
        "// Combine the candidates of a warp's 32 lanes (xor shuffles: every lane ends with the winner).",
        "__device__ __forceinline__ Candidate warp_reduce(Candidate c) {",
        "#pragma unroll",
        "  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {",
        "    const float value = __shfl_xor_sync(0xffffffffu, c.value, offset);",
        "    const index_t index = __shfl_xor_sync(0xffffffffu, c.index, offset);",
        "    consider(c, value, index);",
        "  }",
        "  return c;",
        "}",
    ]
    if schedule == "block":
        helpers += [
            "// Combine a block's candidates: each warp reduces, then every warp combines the per-warp winners.",
            "__device__ __forceinline__ Candidate row_reduce(Candidate c) {",
            "  __shared__ Candidate partial[kWarpsPerRow];",
            "  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;",
            "  c = warp_reduce(c);",
            "  if (lane == 0) partial[warp] = c;",
            "  __syncthreads();",
            "  c = lane < kWarpsPerRow ? partial[lane] : none();",
            "  return warp_reduce(c);",
            "}",
        ]
    else:
        helpers.append("__device__ __forceinline__ Candidate row_reduce(Candidate c) { return warp_reduce(c); }")

    consts = [f"typedef {walk.index_t} index_t;",
              f"constexpr index_t kCols = {cols};  // length of the reduced dim",
              "constexpr index_t kNoIndex = kCols;  // index of the empty candidate (after every element)",
              f"constexpr int kWarpSize = {WARP};"]
    if schedule == "column":
        tx, ty = COLUMN_TILE
        tiles = math.ceil(inner / tx)
        grid, block = outer * tiles, (tx, ty, 1)
        consts += [f"constexpr index_t kInner = {inner};  // elements between neighbours along the reduced dim",
                   f"constexpr int kTileX = {tx}, kTileY = {ty}, kBlock = kTileX * kTileY;",
                   f"constexpr index_t kTilesPerOuter = {tiles};"]
        helpers = [h for h in helpers if "row_reduce" not in h]
        body = [
            "  const index_t tile = blockIdx.x % kTilesPerOuter;",
            "  const index_t outer = blockIdx.x / kTilesPerOuter;",
            "  const index_t inner = tile * kTileX + threadIdx.x;",
            "  const bool active = inner < kInner;",
            "  const index_t base = outer * kCols * kInner + inner;  // element (outer, 0, inner)",
            "  Candidate best = none();",
            "  // this thread's share of the column, in increasing index order",
            "  for (index_t l = threadIdx.y; active && l < kCols; l += kTileY) {",
            f"    consider(best, {xa}[base + l * kInner], l);",
            "  }",
            "  __shared__ Candidate part[kTileY][kTileX];",
            "  part[threadIdx.y][threadIdx.x] = best;",
            "  __syncthreads();",
            "  if (threadIdx.y != 0 || !active) return;",
            "#pragma unroll",
            "  for (int k = 1; k < kTileY; ++k) consider(best, part[k][threadIdx.x].value, part[k][threadIdx.x].index);",
            f"  {ya}[outer * kInner + inner] = best.index;",
        ]
        sched = f"column tiles of {tx} inner positions x {ty} thread rows, {grid} blocks"
    else:
        tpr, rows_per_block, grid = threads_per_row(p, schedule, walk)
        block = (tpr * rows_per_block, 1, 1)
        consts += [f"constexpr index_t kRows = {rows};",
                   f"constexpr int kVec = {vec};  // floats per load",
                   f"constexpr int kThreadsPerRow = {tpr};",
                   f"constexpr int kRowsPerBlock = {rows_per_block};",
                   "constexpr int kBlock = kThreadsPerRow * kRowsPerBlock;",
                   f"constexpr int kWarpsPerRow = {max(1, tpr // WARP)};"]
        if inner > 1:
            consts.insert(2, f"constexpr index_t kInner = {inner};  // elements between neighbours along the reduced dim")
        row = ("  const index_t row = (index_t)blockIdx.x * kRowsPerBlock + threadIdx.x / kThreadsPerRow;"
               if schedule == "warp" else "  const index_t row = blockIdx.x;")
        body = ["  const int lane = threadIdx.x % kThreadsPerRow;", row]
        if schedule == "warp":
            body.append("  if (row >= kRows) return;  // a whole warp: its shuffles need no idle lanes")
        body.append(walk.base_line())
        body += ["  Candidate best = none();",
                 "  // this thread's share of the row, in increasing index order"]
        if vec == 4:
            body += ["#pragma unroll 4",
                     "  for (index_t c0 = lane * kVec; c0 < kCols; c0 += kThreadsPerRow * kVec) {",
                     f"    const float4 v = reinterpret_cast<const float4*>({xa} + base + c0)[0];",
                     "    consider(best, v.x, c0);",
                     "    consider(best, v.y, c0 + 1);",
                     "    consider(best, v.z, c0 + 2);",
                     "    consider(best, v.w, c0 + 3);",
                     "  }"]
        else:
            at = "base + l * kInner" if inner > 1 else "base + l"
            body += ["#pragma unroll 4",
                     "  for (index_t l = lane; l < kCols; l += kThreadsPerRow) {",
                     f"    consider(best, {xa}[{at}], l);",
                     "  }"]
        body += ["  best = row_reduce(best);",
                 f"  if (lane == 0) {ya}[row] = best.index;"]
        sched = describe_rows(schedule, tpr, rows_per_block, vec, inner, grid)

    what = "the flattened tensor" if dim is None else f"dim {dim}"
    head = header(program, f"Region {name}: {node.op} over {what} of {list(x.shape)} -> {y.spec}", io.nodes, [
        f"Inputs:  {x.name} {x.spec}",
        f"Outputs: {y.name} {y.spec} (int64 indices along the reduced dim"
        + (", into the flattened tensor" if dim is None else "") + ")",
        walk.describe(sched),
        "NaN counts as the extreme value (the first NaN wins); ties go to the first index, as in torch.",
    ])
    source = kernel_source(head, consts, [*helpers, ""], kname, cparams, body)
    return KernelSource(
        name=kname, kind="arg_reduction", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=block, schedule=sched,
        params={"schedule": schedule, "vector_width": vec, "grid": grid, "block": block[0] * block[1]},
        align=16 if vec == 4 else 4, bytes_moved=x.nbytes + y.nbytes,
        flops=program.node_flops(node.id))
