"""The staged schedule of a scalar layout graph: inputs that every read takes at the output's own
index (YOLOv5's decode: sigmoid(head) split into slices and joined back by a cat, so each arm reads
head[o]) are loaded first, once per output element and unconditionally, for kUnroll elements per
thread, and only then are the values computed and stored.

Why (detect_decode_yolov5 at 146afd9, 0.81x of Inductor, 42% of the memory floor; its PTX): the
one-thread-per-output gather puts each arm's load of head inside that arm's branch of the cat's
`?:` chain and computes on it at once, so a warp straddling a row boundary (most of them, rows of
85) waits for up to three dependent load latencies in turn, and each thread has one 4-byte load in
flight: about 1 MB machine-wide where the H200 needs several to reach its bandwidth. Here the loads
of kUnroll elements leave together before any branch, and the branches hold arithmetic only (and the
small broadcast tables, which stay in cache).

The lambdas are layout_graph's, unchanged, except that a staged input's returns the register loaded
for the element being stored. Parameters: `unroll` (elements per thread and step, 4), `block` (256).
"""
from __future__ import annotations

import math

from . import views as V
from .around import grid_for
from .cuda import Names, index_type, kernel_name
from .kernel import KernelSource
from .layout_tiled import composed_reads, single_view


def _identity(stack, numel: int) -> bool:
    """The read takes element o of its input at output index o (wherever it is valid)."""
    view = single_view([stack])
    return view is not None and view.offset == 0 and view.numel == numel \
        and view.strides == V.contiguous_strides(view.shape)


def staged_inputs(g, numel: int, params: dict | None) -> list:
    """Region inputs of the output's size read by several arms (a cat's, a where's), every one at the
    output's own index: the reads a single load can serve. An input read once keeps its load."""
    if (params or {}).get("staged") is False:
        return []
    vals = g.program.values
    return [v for v, stacks in composed_reads(g).items()
            if v not in g.indices and math.prod(vals[v].shape) == numel and vals[v].dtype == "float32"
            and len(stacks) > 1 and all(s is not None and _identity(s, numel) for s in stacks)]


def generate_staged(g, staged: list, name: str, params: dict | None, kind: str, numel: int) -> KernelSource:
    from .layout_graph import _lambdas, graph_source
    program, io = g.program, g.io
    vals = program.values
    params = params or {}
    block, unroll = int(params.get("block", 256)), max(1, int(params.get("unroll", 4)))
    grid = grid_for(math.ceil(numel / unroll), block)
    names = Names()
    names.taken.update(("o", "o0", "u", "i", "stride", "kNumel", "kBlock", "kUnroll"))
    arg = {v: names.new(vals[v].name) for v in io.inputs + io.outputs}
    reg = {v: names.new(vals[v].name + "_r") for v in staged}
    lines, fn = _lambdas(g, arg, names, False)
    for v in staged:
        prefix = f"  auto {fn[v]} = "
        k = next(i for i, line in enumerate(lines) if line.startswith(prefix))
        lines[k] = (f"{prefix}[&](index_t) -> float {{ return {reg[v]}[u]; }};  "
                    f"// input {vals[v].spec}, loaded before the branches")
    # o0 + (kUnroll - 1) * stride must not overflow index_t
    index_t = index_type(max([numel + grid * block * unroll] + [math.prod(vals[v].shape) for v in io.inputs]))
    consts = [f"typedef {index_t} index_t;", f"constexpr index_t kNumel = {numel};  // output elements",
              f"constexpr int kBlock = {block};", f"constexpr int kUnroll = {unroll};  // elements per thread and step"]
    body = ["  const index_t stride = (index_t)gridDim.x * blockDim.x;",
            "  for (index_t o0 = (index_t)blockIdx.x * blockDim.x + threadIdx.x; o0 < kNumel; o0 += stride * kUnroll) {",
            *(f"    float {reg[v]}[kUnroll];" for v in staged),
            "    // every staged load of the step leaves before any value is computed",
            "#pragma unroll",
            "    for (int u = 0; u < kUnroll; ++u) {",
            "      const index_t o = o0 + u * stride;",
            # clamped, not branched: the loads stay unconditional, so they issue back to back
            *(f"      {reg[v]}[u] = {arg[v]}[o < kNumel ? o : kNumel - 1];" for v in staged),
            "    }",
            "#pragma unroll",
            "    for (int u = 0; u < kUnroll; ++u) {",
            "      const index_t o = o0 + u * stride;",
            "      if (o >= kNumel) break;",
            *("    " + line for line in lines),
            *(f"      {arg[v]}[o] = {fn[v]}(o);" for v in io.outputs),
            "    }",
            "  }"]
    sched = (f"gather over a graph of views, {', '.join(vals[v].name for v in staged)} loaded first, "
             f"{unroll} output elements per thread and step, {block} threads x {grid} blocks")
    source, layout_nodes = graph_source(
        g, name, consts, body, arg, sched,
        ["Staged inputs are read at the output's own index by every read of the graph: loaded once per "
         "element, before the cat's branches."], staged, " (staged)")
    read = sum(min(vals[v].nbytes, numel * 4) for v in io.inputs if v in g.need)
    return KernelSource(
        name=kernel_name(name), kind=kind, source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=(block, 1, 1), schedule=sched,
        params={"tiled": False, "graph": True, "vector": 1, "staged": [vals[v].name for v in staged],
                "unroll": unroll, "block": block, "grid": grid, "chain": [n.op for n in layout_nodes]},
        align=4, bytes_moved=read + sum(vals[v].nbytes for v in io.outputs),
        flops=sum(program.node_flops(n) for n in io.nodes))


def tune_variants(params: dict) -> list[dict]:
    """Elements per thread and block sizes to try besides the default."""
    if not params.get("staged"):
        return []
    cands = ({"unroll": 8}, {"unroll": 2}, {"unroll": 1}, {"block": 512}, {"block": 128, "unroll": 8})
    return [c for c in cands if any(params.get(k) != v for k, v in c.items())]
