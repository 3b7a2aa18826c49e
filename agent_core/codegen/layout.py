"""Layout regions: a chain of layout ops (a permute or transpose, a strided slice, and any view op
around them: slice, select, flip, pad, roll, reshape, squeeze, ...) with a pointwise prologue (in the
chain's input space) and epilogue (in its output space) fused around it.

The chain becomes one Layout (codegen/views.py): each output element reads its input element through
the views' index expression (`source(o)`), under a validity condition where the chain pads or joins.
Size-1 dims drop out and dims that stay neighbours merge, so most permutations become a batched 2-D
transpose. When the element an output reads next is not the next input element (the view's innermost
stride is not 1) but some output dim walks the input contiguously, tiles of 32 x 32 go through shared
memory (padded against bank conflicts): loads coalesced along that dim, stores along the output's last
dim. Otherwise the kernel is a gather: each thread one output element, grid-stride.
"""
from __future__ import annotations

import math


from ..ir import Program
from . import views as V
from .around import grid_for, prologue_epilogue, render_around
from .cuda import Names, header, index_type, kernel_name, kernel_source
from .kernel import CodegenError, KernelSource
from .pointwise import is_elementwise
from .region_io import RegionIO, contiguous_strides

LAYOUT_OPS = ("permute", "transpose")
# single-input layout ops a chain may hold (expand is elementwise: the pointwise code broadcasts it)
CHAIN_OPS = ("reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose", "repeat",
             "slice", "select", "pad", "contiguous", "flip", "roll", "diag", "diagonal")
TILE, ROWS = 32, 8


def split_chain(program: Program, io: RegionIO, kind: str):
    """(chain nodes in order, prologue nodes, epilogue nodes) of a region made of one path of layout
    ops with pointwise ops before and after it; CodegenError names the rule the region breaks."""
    vals, nodes = program.values, program.nodes
    chain = [n for n in io.nodes if nodes[n].op in CHAIN_OPS and not is_elementwise(nodes[n])]
    other = [n for n in io.nodes if n not in chain and not is_elementwise(nodes[n])]
    if not chain or other:
        what = ", ".join(f"{nodes[n].name} ({nodes[n].op})" for n in other) or "no layout op"
        raise CodegenError(f"a {kind} region holds one chain of layout ops and pointwise ops around it "
                           f"({what}); split the region")
    for a, b in zip(chain, chain[1:]):
        out = nodes[a].outputs[0]
        readers = {n for n, _ in program.consumers(out)}
        if nodes[b].inputs[0] != out or readers != {b} or out in io.outputs:
            raise CodegenError(f"the layout ops of a {kind} region must form one path: {nodes[a].name} "
                               f"({nodes[a].op}) feeds more than {nodes[b].name} ({nodes[b].op}); split the region")
    first, last = nodes[chain[0]], nodes[chain[-1]]
    x_vid, y_vid = first.inputs[0], last.outputs[0]
    for vid in [x_vid, y_vid, *io.inputs, *io.outputs]:
        if vals[vid].dtype != "float32":
            # the chain's tiles and float4 paths hold floats: other dtypes go to the layout graph
            raise CodegenError(f"'{vals[vid].name}' has dtype {vals[vid].dtype}; the {kind} chain kernels move "
                               f"float32 (a layout graph moves the other dtypes)")
    numel = math.prod(vals[y_vid].shape)
    if numel == 0:
        raise CodegenError(f"{last.name} ({last.op}) has an empty output; there is nothing to launch")
    pro, epi = prologue_epilogue(program, io, first, last, len(chain), kind, numel, "output")
    return [nodes[n] for n in chain], pro, epi


def chain_layout(program: Program, chain) -> V.Layout:
    """The Layout of the chain's output over its input, named "x"."""
    lay = V.Layout.of("x", program.values[chain[0].inputs[0]].shape)
    for node in chain:
        try:
            lay = V.apply_op(node.op, node.attrs, [lay])[0]
        except V.ViewError as exc:
            raise CodegenError(f"{node.name}: {exc}", node_id=node.id) from None
    return lay


def tile_plan(lay: V.Layout):
    """(view, a, b) for the tiled transpose: the merged single view, the output dim `a` that walks the
    input contiguously and the output's last dim `b`; None when a gather is the schedule."""
    r = lay.single
    if r is None or len(r.stack.layers) != 1 or r.stack.layers[0].mask is not None:
        return None
    view = r.stack.layers[0].merged()
    if len(view.shape) < 2 or view.strides[-1] == 1 or 1 not in view.strides:
        return None
    return view, view.strides.index(1), len(view.shape) - 1


def _describe(node) -> str:
    return f"{node.op}({', '.join(f'{k}={v}' for k, v in node.attrs.items())})"


def generate_layout(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    """A region around a permute or transpose (kind "layout")."""
    return generate_view_region(program, io, name, params, "layout")


def generate_strided_slice(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    """A region around a slice with step != 1 (kind "strided_slice")."""
    return generate_view_region(program, io, name, params, "strided_slice")


def generate_view_region(program: Program, io: RegionIO, name: str, params: dict | None, kind: str) -> KernelSource:
    """One path of single-input layout ops with a prologue and an epilogue: a gather or 32x32 tiles
    (below). Any other graph of layout and pointwise ops (a cat of several values, pointwise ops
    between layout ops, the pieces of a chunk): codegen/layout_graph.py."""
    from .layout_graph import generate_layout_graph, is_layout_graph
    try:
        chain, pro, epi = split_chain(program, io, kind.replace("_", "-"))
    except CodegenError:
        if not is_layout_graph(program, io):
            raise
        return generate_layout_graph(program, io, name, params, kind)
    from .layout_tiled import tiles_region
    lay = chain_layout(program, chain)
    untiled = (params or {}).get("tiled") is False      # the tuner's gather variant of a tiled graph
    if lay.single is not None and len(lay.single.stack.layers) > 1 and \
            (untiled or tiles_region(program, io, kind, params)):
        # stacked views (pixel_shuffle's reshape of a permute) have no 32 x 32 transpose below; their
        # gather is the graph's too (runs of 4 outputs per thread, the index algebra composed)
        return generate_layout_graph(program, io, name, params, kind)
    return _generate_chain(program, io, name, params, kind, chain, pro, epi)


def _generate_chain(program: Program, io: RegionIO, name: str, params: dict | None, kind: str,
                    chain, pro, epi) -> KernelSource:
    vals = program.values
    x_vid, y_vid = chain[0].inputs[0], chain[-1].outputs[0]
    x, y = vals[x_vid], vals[y_vid]
    numel = math.prod(y.shape)
    lay = chain_layout(program, chain)
    plan = tile_plan(lay)

    names = Names()
    names.taken.update(("tile", "ti", "tb", "ta", "q", "ia", "ib", "in_idx", "out_idx", "in_base", "out_base",
                        "o", "source", "batch_in", "batch_out", "point", "store_point"))
    w = render_around(program, io, pro, epi, x_vid, y_vid, names,
                      "one element of the chain's input, at an element it reads.",
                      "one element of the chain's output.")
    arg, pro_inputs, epi_inputs = w.arg, w.pro_inputs, w.epi_inputs
    ld_pro, ld_epi = w.ld_pro, w.ld_epi

    def pro_call(idx):
        return f"point({', '.join(ld_pro.load(v, arg[v], idx) for v in pro_inputs)})"

    def epi_call(val, idx):
        a = [val] + [ld_epi.load(v, arg[v], idx) for v in epi_inputs] + [f"{arg[v]}[{idx}]" for v in io.outputs]
        return f"store_point({', '.join(a)});"

    index_t = index_type(max(math.prod(x.shape), numel))
    consts = [f"typedef {index_t} index_t;", f"constexpr index_t kNumel = {numel};  // output elements"]
    helpers = []
    if plan is None:
        block = int((params or {}).get("block", 256))
        grid = grid_for(numel, block)
        if lay.single is not None and lay.single.stack.always_valid:
            off, _ = V.render_read(lay.single.stack, "o")
            helpers.append("// The input element that output element o reads.\n"
                           f"__device__ __forceinline__ index_t source(index_t o) {{ return {off}; }}\n")
            value = pro_call("source(o)")
        else:
            # several reads (a pad, a roll, ...): each under its condition, the first valid one wins
            value = V.render_layout(lay, "o", load=lambda src, i: pro_call(i))
            helpers.append("// The element output element o reads: the chain's input under a condition, "
                           "or a fill value.\n"
                           f"__device__ __forceinline__ float source_value(index_t o{''.join(', const float* __restrict__ ' + arg[v] for v in pro_inputs)}) "
                           f"{{ return {value}; }}\n")
            value = f"source_value(o{''.join(', ' + arg[v] for v in pro_inputs)})"
        body = ["  const index_t stride = (index_t)gridDim.x * blockDim.x;",
                "  for (index_t o = (index_t)blockIdx.x * blockDim.x + threadIdx.x; o < kNumel; o += stride) {",
                f"    {epi_call(value, 'o')}",
                "  }"]
        blockdim = (block, 1, 1)
        sched = f"gather, one output element per thread, {block} threads x {grid} blocks"
        view_params = {"tiled": False, "reads": len(lay.reads)}
    else:
        view, a, b = plan
        shape = view.shape
        batch = [d for d in range(len(shape)) if d not in (a, b)]
        out_strides = contiguous_strides(shape)
        nb = math.prod(shape[d] for d in batch)
        ta, tb = math.ceil(shape[a] / TILE), math.ceil(shape[b] / TILE)
        grid = ta * tb * nb
        consts += [f"constexpr index_t kA = {shape[a]};  // walks the input contiguously",
                   f"constexpr index_t kB = {shape[b]};  // the output's last dim",
                   f"constexpr index_t kInStrideB = {view.strides[b]}, kOutStrideA = {out_strides[a]};",
                   f"constexpr index_t kTilesA = {ta}, kTilesB = {tb};",
                   f"constexpr int kTile = {TILE}, kRows = {ROWS};",
                   f'static_assert(kNumel == kA * kB * {nb}, "tiles x batches cover every element");']
        # batch q: the dims that neither walk the input nor the output, as views of their own
        bshape = [shape[d] for d in batch] or [1]
        bin_ = V.ViewStack((V.View.create(bshape, [view.strides[d] for d in batch] or [0], view.offset),))
        bout = V.ViewStack((V.View.create(bshape, [out_strides[d] for d in batch] or [0]),))
        helpers.append(
            "// Offsets of batch q (the dims that neither move in nor out) in the input and the output.\n"
            f"__device__ __forceinline__ index_t batch_in(index_t q) {{ return {V.render_read(bin_, 'q')[0]}; }}\n"
            f"__device__ __forceinline__ index_t batch_out(index_t q) {{ return {V.render_read(bout, 'q')[0]}; }}\n")
        body = ["  __shared__ float tile[kTile][kTile + 1];  // +1: columns fall in different banks",
                "  const index_t ti = blockIdx.x % (kTilesA * kTilesB);",
                "  const index_t q = blockIdx.x / (kTilesA * kTilesB);",
                "  const index_t ta = ti % kTilesA, tb = ti / kTilesA;",
                "  const index_t in_base = batch_in(q), out_base = batch_out(q);",
                "  // load: threadIdx.x runs along dim a, contiguous in the input (coalesced)",
                "#pragma unroll",
                "  for (int j = 0; j < kTile; j += kRows) {",
                "    const index_t ib = tb * kTile + threadIdx.y + j, ia = ta * kTile + threadIdx.x;",
                "    if (ib < kB && ia < kA) {",
                "      const index_t in_idx = in_base + ib * kInStrideB + ia;",
                f"      tile[threadIdx.y + j][threadIdx.x] = {pro_call('in_idx')};",
                "    }",
                "  }",
                "  __syncthreads();",
                "  // store: threadIdx.x runs along the output's last dim (coalesced)",
                "#pragma unroll",
                "  for (int j = 0; j < kTile; j += kRows) {",
                "    const index_t ia = ta * kTile + threadIdx.y + j, ib = tb * kTile + threadIdx.x;",
                "    if (ib < kB && ia < kA) {",
                "      const index_t out_idx = out_base + ia * kOutStrideA + ib;",
                f"      {epi_call('tile[threadIdx.x][threadIdx.y + j]', 'out_idx')}",
                "    }",
                "  }"]
        blockdim = (TILE, ROWS, 1)
        block = TILE * ROWS
        sched = f"32x32 tiles through shared memory, {nb} batch(es), {grid} blocks of {TILE}x{ROWS}"
        view_params = {"tiled": True, "reads": 1}
    consts.append(f"constexpr int kBlock = {block};")
    consts += ld_pro.consts + ld_epi.consts
    kname = kernel_name(name)
    cparams = [f"const float* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"float* __restrict__ {arg[v]}" for v in io.outputs]
    merged = lay.single.stack.layers[-1].merged() if lay.single is not None and len(lay.single.stack.layers) == 1 \
        else None
    view_line = (f"As one view: shape {list(merged.shape)}, strides {list(merged.strides)}, offset {merged.offset}"
                 + (f", mask {list(merged.mask)}" if merged.mask else "") if merged is not None else
                 f"As {len(lay.reads)} read(s) through stacked views")
    head = header(program, f"Region {name}: {' -> '.join(n.op for n in chain)} {list(x.shape)} -> {list(y.shape)} "
                           f"with {len(pro)} prologue and {len(epi)} epilogue op(s)", io.nodes, [
        "Inputs:  " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.inputs),
        "Outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.outputs),
        "Layout chain: " + " -> ".join(_describe(n) for n in chain),
        f"{view_line}; schedule: {sched}.",
    ])
    source = kernel_source(head, consts, [*ld_pro.helpers, *ld_epi.helpers, w.pro_fn, *helpers, w.epi_fn],
                           kname, cparams, body)
    # the prologue's operands are read only at the elements the chain reads (at most once each)
    read = min(math.prod(x.shape), numel)
    return KernelSource(
        name=kname, kind=kind, source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=blockdim, schedule=sched,
        params={**view_params, "grid": grid, "block": block,
                "chain": [n.op for n in chain]}, align=4,
        bytes_moved=sum(min(vals[v].nbytes, read * 4) for v in pro_inputs)
        + sum(vals[v].nbytes for v in epi_inputs + io.outputs),
        flops=sum(program.node_flops(n) for n in io.nodes))
