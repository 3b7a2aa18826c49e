"""cumsum / cumprod / logcumsumexp in the row graph: a running sum (product, log-sum-exp) along the
rows, per element.

A scan's rows are its dim (the graph's reduced dims); its output is an E value. It is computed in the
kernel's last pass, the one that writes the per-element outputs, so the pointwise ops before it (a
mask, a scale, a flip read through its view) and after it (a layout op written through its view, an
activation) fuse around it, and any reductions of the region fold before it (a running sum of a
softmax). The pass walks the row chunk by chunk in order, every lane of the row in step: each lane
scans its kVec neighbouring elements, the lanes' totals are scanned across the row (shuffles; with
more than a warp per row, the warps' totals through shared memory; along a middle dim, the column
tile's thread rows through shared memory), and a carry holds the scan of every earlier chunk. Nothing reads a running value in an earlier pass: a reduction of a scan is
refused (split the region after the scan).

Numerics: accumulated in double, each output rounded to float32 once, so it is
the correctly rounded running value whatever the order, as torch's CPU scan.
"""
from __future__ import annotations

from .kernel import CodegenError

# op -> (how two running values combine, in double; its identity). The combine is associative, so the
# lanes' and warps' scans may group it as they do.
SCAN_OPS = {"cumsum": ("({a} + {b})", "0.0"), "cumprod": ("({a} * {b})", "1.0"),
            "logcumsumexp": ("scan_lse({a}, {b})", "-INFINITY")}
# the device functions the combines call (a kernel with scans holds them; unused ones are pruned)
SCAN_HELPERS = """// log(exp(a) + exp(b)) from the larger (logcumsumexp's combine): NaN where either is; equal a and b
// (both infinite included, where a - b is NaN) give a + log 2
__device__ __forceinline__ double scan_lse(double a, double b) {
  if (a != a || b != b) return a + b;
  if (a == b) return a + 0.69314718055994531;
  return fmax(a, b) + log1p(exp(-fabs(a - b)));
}
"""


def combine(kind: str, a: str, b: str) -> str:
    """The scan's combine of running values a and b, as C."""
    return SCAN_OPS[kind][0].format(a=a, b=b)


def scan_op(program, nid: str):
    """The row graph's view of a scan: (state, preamble, expression, preserves rows, dims, fold,
    C type); its rows are its dim."""
    node = program.nodes[nid]
    rank = len(program.values[node.inputs[0]].shape)
    return None, "", "", True, [node.attrs["dim"] % max(1, rank)], None, "float"


def lower_scan(g, program, node, read, names, env) -> None:
    """The scan `node` as an E definition computed in the output pass (Def.scan)."""
    from .rowgraph import E, Def
    vals = program.values
    name = node.name if node.name == node.op else f"{node.name} ({node.op})"
    src, out = node.inputs[0], node.outputs[0]
    if vals[src].dtype != "float32" or vals[out].dtype != "float32":
        raise CodegenError(f"{name} scans {vals[src].spec}; running sums are generated for float32 only",
                           node_id=node.id)
    x = read(src, E, node)
    if g.defs[x].space != E:
        raise CodegenError(f"{name} scans a per-row value", node_id=node.id)
    base = names.new(vals[out].name)
    run, prefix, carry = (names.new(f"{base}_{w}") for w in ("run", "prefix", "carry"))
    # the lane's values, prefix applied, are worked out before the output branch (the kernel's
    # scan_pass): double runs held across that branch are spilled by ptxas
    g.defs[base] = Def(base, E, "float", f"{run}_out[e]", [], g.defs[x].round, out,
                       f"{node.op}: the running value", scan=(node.op, x, run, prefix, carry))
    env[out] = base


def reads_a_scan(g, key: str) -> str | None:
    """The scan a definition's value depends on, if any (it exists only in the output pass)."""
    seen, todo = set(), [key]
    while todo:
        k = todo.pop()
        if k in seen:
            continue
        seen.add(k)
        d = g.defs[k]
        if d.scan is not None:
            return k
        todo += d.deps
    return None


def lane_scan(scans, tpr: int, column: bool = False) -> list[str]:
    """Lines that scan each scan's lane total `run[kVec - 1]` across the row's threads and give its
    `prefix` (the carry, then every earlier lane of this chunk) and the carry for the next chunk.
    Every thread of the row runs them (the shuffles and barriers need all of them). A column tile's
    rows are its thread rows (threadIdx.y, one element each per chunk): through shared memory."""
    if column:
        return _thread_rows_scan(scans)
    lines = []
    for kind, _, run, prefix, carry in scans:
        ident = SCAN_OPS[kind][1]
        incl, excl = f"{run}_incl", f"{run}_excl"
        width = min(tpr, 32)
        lines += [f"double {incl} = {run}[kVec - 1];  // this lane's elements and every earlier lane's",
                  "#pragma unroll",
                  f"for (int offset = 1; offset < {width}; offset <<= 1) {{",
                  f"  const double before = __shfl_up_sync(0xffffffffu, {incl}, offset);",
                  f"  if ((lane & {width - 1}) >= offset) {incl} = {combine(kind, 'before', incl)};",
                  "}",
                  f"double {excl} = __shfl_up_sync(0xffffffffu, {incl}, 1);",
                  f"if ((lane & {width - 1}) == 0) {excl} = {ident};"]
        if tpr <= 32:
            lines += [f"const double {prefix} = {combine(kind, carry, excl)};",
                      f"{carry} = {combine(kind, carry, f'__shfl_sync(0xffffffffu, {incl}, (threadIdx.x & 31) | (kThreadsPerRow - 1))')};"]
            continue
        tot = f"{run}_warps"
        lines += [f"__shared__ double {tot}[kWarpsPerRow];  // each warp's total, then their running values",
                  f"if ((lane & 31) == 31) {tot}[lane >> 5] = {incl};",
                  "__syncthreads();",
                  "if (lane < 32) {",
                  f"  double t = lane < kWarpsPerRow ? {tot}[lane] : {ident};",
                  "#pragma unroll",
                  "  for (int offset = 1; offset < 32; offset <<= 1) {",
                  "    const double before = __shfl_up_sync(0xffffffffu, t, offset);",
                  f"    if (lane >= offset) t = {combine(kind, 'before', 't')};",
                  "  }",
                  f"  if (lane < kWarpsPerRow) {tot}[lane] = t;",
                  "}",
                  "__syncthreads();",
                  f"const double {prefix} = "
                  f"{combine(kind, combine(kind, carry, f'((lane >> 5) ? {tot}[(lane >> 5) - 1] : {ident})'), excl)};",
                  f"{carry} = {combine(kind, carry, f'{tot}[kWarpsPerRow - 1]')};",
                  "__syncthreads();  // every thread has read the totals before the next chunk writes them"]
    return lines


def _thread_rows_scan(scans) -> list[str]:
    """The column tile's form: each thread row holds one element of the chunk for each of the tile's
    kTileX positions; a thread adds up the thread rows above it in shared memory."""
    lines = []
    for kind, _, run, prefix, carry in scans:
        ident = SCAN_OPS[kind][1]
        tot, excl, total = f"{run}_rows", f"{run}_excl", f"{run}_chunk"
        lines += [f"__shared__ double {tot}[kTileY][kTileX];  // each thread row's element of the chunk",
                  f"{tot}[threadIdx.y][threadIdx.x] = {run}[kVec - 1];",
                  "__syncthreads();",
                  f"double {excl} = {ident}, {total} = {ident};",
                  "for (int j = 0; j < kTileY; ++j) {  // in order: the same bits in every thread",
                  f"  if (j < (int)threadIdx.y) {excl} = {combine(kind, excl, f'{tot}[j][threadIdx.x]')};",
                  f"  {total} = {combine(kind, total, f'{tot}[j][threadIdx.x]')};",
                  "}",
                  f"const double {prefix} = {combine(kind, carry, excl)};",
                  f"{carry} = {combine(kind, carry, total)};",
                  "__syncthreads();  // every thread has read the chunk before the next one is written"]
    return lines
