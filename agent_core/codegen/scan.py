"""cumsum / cumprod: the inclusive running sum (product) along one dim, float32 in and out.

The tensor is viewed as [outer, L, inner] around the scanned dim: R = outer * inner rows of L
elements, element l of row (o, i) at (o * L + l) * inner + i.

Schedules:
  warp    L <= 2048: one warp per row, 8 rows per 256-thread block. The warp walks its row in chunks
          of 32 * kVec elements: each lane scans its kVec neighbouring elements (one float4 when the
          row is contiguous and L % 4 == 0), the 32 lane totals get a Kogge-Stone shuffle scan, and a
          running carry (the scan of all earlier chunks) is combined in front;
  block   longer rows: one block per row (256 threads; 1024 past 65536 elements), chunks of
          kBlock * kVec; warps scan as above, then warp 0 scans the per-warp totals in shared memory;
  column  inner >= 32 (the dim is strided and the neighbours are independent rows): one thread per
          (outer, inner) position walks its row in order; neighbouring threads read neighbouring
          addresses, so every load and store is coalesced.
Rows that are strided by fewer than 32 elements use the warp/block schedules with scalar strided loads.

Numerics: the scan accumulates in double and rounds each output to float32 once, so every output is
the correctly rounded running sum (product) whatever the association order: the same bits as torch on
the CPU (which accumulates in double and rounds each output) and as the reference interpreter, which
scans float inputs in double on every device (ops/reduction.py). A float32 scan in another order is
wrong in the last bits, and a consumer can amplify those: Mamba2's chunked scan (KernelBench level 3,
48/49) takes exp of differences of running sums of 64 standard normals and sums terms up to 1e15
that cancel to O(10), so a 2-ulp difference in one running sum moved its output by 36x the tolerance
end to end (emulated on the CPU), although the cumsum itself verified at 0.01 of it. Double costs the
warp schedules twice the shuffles; the scan stays memory-bound. Past 2^53 terms of one sign, or a
product that overflows float32's range, the result is what float32 rounding of the double gives.
"""
from __future__ import annotations

import math

from ..ir import Program
from .cuda import Names, header, kernel_name, kernel_source
from .kernel import CodegenError, KernelSource
from .region_io import RegionIO
from .rowwalk import WARP, describe_rows, pick_schedule, row_walk, single_node, threads_per_row, vector_width

SCAN_OPS = ("cumsum", "cumprod")
DEFAULTS = {"warp_max_cols": 2048, "long_cols": 65536, "block": 256, "long_block": 1024,
            "column_min_inner": 32, "vector_width": 4, "schedule": None}
# the scan's binary operator and its identity
COMBINE = {"cumsum": ("a + b", "0.0"), "cumprod": ("a * b", "1.0")}
KERNEL_LOCALS = ("combine", "warp_scan", "carry", "chunk", "totals", "row", "lane", "warp", "base", "c0", "c",
                 "acc", "prefix", "excl", "incl", "l", "col")


def generate_scan(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    p = {**DEFAULTS, **(params or {})}
    vals = program.values
    node = single_node(program, io, SCAN_OPS, "cumsum/cumprod")
    x, y = vals[node.inputs[0]], vals[node.outputs[0]]
    for v in (x, y):
        if v.dtype != "float32":
            raise CodegenError(f"{node.name} ({node.op}): '{v.name}' has dtype {v.dtype}; scans are generated "
                               f"for float32 only (integer scans accumulate in int64 and run through torch)",
                               node_id=node.id)
    walk = row_walk(node, x.shape, node.attrs["dim"], "scans")
    cols, inner, rows = walk.cols, walk.inner, walk.rows
    op_expr, identity = COMBINE[node.op]

    schedule = p["schedule"] or pick_schedule(p, cols, inner)
    if schedule not in ("warp", "block", "column"):
        raise CodegenError(f"scan schedule must be warp, block or column, got {schedule!r}")
    if schedule == "column" and inner == 1:
        raise CodegenError(f"the column schedule scans a strided dim; dim {node.attrs['dim']} of "
                           f"{list(x.shape)} is contiguous (use warp or block)")
    vec = vector_width(p, schedule, cols, inner)

    names = Names()
    names.taken.update(KERNEL_LOCALS)
    xa, ya = names.new(x.name), names.new(y.name)
    kname = kernel_name(name)
    cparams = [f"const float* __restrict__ {xa}", f"float* __restrict__ {ya}"]
    opname = "sum" if node.op == "cumsum" else "product"

    consts = [f"typedef {walk.index_t} index_t;",
              f"constexpr index_t kCols = {cols};  // length of the scanned dim",
              "typedef double acc_t;  // the running value: each output is it rounded once to float",
              f"constexpr acc_t kIdentity = {identity};  // the {opname} of nothing",
              f"constexpr int kWarpSize = {WARP};"]
    if inner > 1:
        consts.insert(2, f"constexpr index_t kInner = {inner};  // elements between neighbours along the scanned dim")
    helpers = [f"__device__ __forceinline__ acc_t combine(acc_t a, acc_t b) {{ return {op_expr}; }}  // a before b"]

    if schedule == "column":
        block = int(p["block"])
        grid = math.ceil(rows / block)
        consts += [f"constexpr index_t kRows = {rows};  // (outer, inner) positions, one thread each",
                   f"constexpr int kBlock = {block};"]
        body = ["  const index_t row = (index_t)blockIdx.x * kBlock + threadIdx.x;",
                "  if (row >= kRows) return;",
                walk.base_line(),
                "  acc_t acc = kIdentity;",
                "  // in order along the row; neighbouring threads touch neighbouring addresses",
                "#pragma unroll 4",
                "  for (index_t l = 0; l < kCols; ++l) {",
                f"    acc = combine(acc, {xa}[base + l * kInner]);",
                f"    {ya}[base + l * kInner] = (float)acc;",
                "  }"]
        sched = f"one thread per row (stride {inner}), in order, {grid} blocks of {block}"
    else:
        helpers += [
            "// Inclusive scan across the 32 lanes of a warp (Kogge-Stone: log2(32) shuffle steps).",
            "__device__ __forceinline__ acc_t warp_scan(acc_t v, int lane) {",
            "#pragma unroll",
            "  for (int offset = 1; offset < kWarpSize; offset <<= 1) {",
            "    const acc_t before = __shfl_up_sync(0xffffffffu, v, offset);",
            "    if (lane >= offset) v = combine(before, v);",
            "  }",
            "  return v;",
            "}"]
        tpr, rows_per_block, grid = threads_per_row(p, schedule, walk)
        block = tpr * rows_per_block
        consts += [f"constexpr index_t kRows = {rows};",
                   f"constexpr int kVec = {vec};  // neighbouring elements per lane and chunk"
                   + (" (one float4)" if vec == 4 else ""),
                   f"constexpr int kThreadsPerRow = {tpr};",
                   f"constexpr int kRowsPerBlock = {rows_per_block};",
                   "constexpr int kBlock = kThreadsPerRow * kRowsPerBlock;",
                   "constexpr int kChunk = kThreadsPerRow * kVec;  // elements of a row per step",
                   f"constexpr int kWarps = {max(1, tpr // WARP)};  // warps per row"]
        at = (lambda c: f"base + ({c}) * kInner") if inner > 1 else (lambda c: f"base + {c}")
        if schedule == "warp":
            body = ["  const int lane = threadIdx.x % kWarpSize;",
                    "  const index_t row = (index_t)blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;",
                    "  if (row >= kRows) return;  // a whole warp: its shuffles need no idle lanes"]
        else:
            body = ["  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;",
                    "  const index_t row = blockIdx.x;",
                    "  __shared__ acc_t totals[kWarps];  // per-warp totals, then their inclusive scan"]
        body.append(walk.base_line())
        body += ["  acc_t carry = kIdentity;  // the scan of every earlier chunk",
                 "  for (index_t c0 = 0; c0 < kCols; c0 += kChunk) {",
                 f"    const index_t c = c0 + {'lane' if schedule == 'warp' else 'threadIdx.x'} * kVec;"
                 "  // this lane's first element"]
        if vec == 4:
            body += ["    acc_t v[kVec] = {kIdentity, kIdentity, kIdentity, kIdentity};",
                     "    if (c < kCols) {  // kCols % 4 == 0: all four or none",
                     f"      const float4 q = reinterpret_cast<const float4*>({xa} + base + c)[0];",
                     "      v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;",
                     "    }"]
        else:
            body += [f"    acc_t v[kVec] = {{c < kCols ? (acc_t){xa}[{at('c')}] : kIdentity}};"]
        if vec > 1:
            body += ["    // scan this lane's own elements, then the lanes' totals across the warp",
                     "#pragma unroll",
                     "    for (int e = 1; e < kVec; ++e) v[e] = combine(v[e - 1], v[e]);"]
        body += ["    const acc_t incl = warp_scan(v[kVec - 1], lane);  // this lane's elements and all before it in the warp",
                 "    acc_t excl = __shfl_up_sync(0xffffffffu, incl, 1);",
                 "    if (lane == 0) excl = kIdentity;"]
        if schedule == "warp":
            body += ["    const acc_t prefix = combine(carry, excl);",
                     "    carry = combine(carry, __shfl_sync(0xffffffffu, incl, kWarpSize - 1));"]
        else:
            body += ["    if (lane == kWarpSize - 1) totals[warp] = incl;",
                     "    __syncthreads();",
                     "    if (warp == 0) {  // scan the per-warp totals in place",
                     "      const acc_t t = warp_scan(lane < kWarps ? totals[lane] : kIdentity, lane);",
                     "      if (lane < kWarps) totals[lane] = t;",
                     "    }",
                     "    __syncthreads();",
                     "    const acc_t prefix = combine(combine(carry, warp == 0 ? kIdentity : totals[warp - 1]), excl);",
                     "    carry = combine(carry, totals[kWarps - 1]);",
                     "    __syncthreads();  // every thread has read totals before the next chunk rewrites them"]
        if vec == 4:
            body += ["    if (c < kCols) {",
                     "      float4 q;",
                     "      q.x = (float)combine(prefix, v[0]); q.y = (float)combine(prefix, v[1]);",
                     "      q.z = (float)combine(prefix, v[2]); q.w = (float)combine(prefix, v[3]);",
                     f"      reinterpret_cast<float4*>({ya} + base + c)[0] = q;",
                     "    }"]
        else:
            body += [f"    if (c < kCols) {ya}[{at('c')}] = (float)combine(prefix, v[0]);"]
        body.append("  }")
        sched = describe_rows(schedule, tpr, rows_per_block, vec, inner, grid, extra=f", chunks of {tpr * vec}")

    head = header(program, f"Region {name}: {node.op} along dim {node.attrs['dim']} of {list(x.shape)}",
                  io.nodes, [
                      f"Inputs:  {x.name} {x.spec}",
                      f"Outputs: {y.name} {y.spec}",
                      walk.describe(sched),
                      "float32 in and out, accumulated in double: each output is the correctly rounded "
                      "running value, as torch's CPU scan.",
                  ])
    source = kernel_source(head, consts, [*helpers, ""], kname, cparams, body)
    return KernelSource(
        name=kname, kind="scan", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=(block, 1, 1), schedule=sched,
        params={"schedule": schedule, "vector_width": vec, "grid": grid, "block": block},
        align=16 if vec == 4 else 4, bytes_moved=x.nbytes + y.nbytes, flops=program.node_flops(node.id))
