"""Layout regions: a permute or transpose, with pointwise prologue (input space) and epilogue
(output space) fused around it.

Size-1 dimensions are dropped and input dimensions that stay neighbours in the output merged, so
most permutations become a batched 2-D transpose. When the innermost dimension stays innermost the
kernel is a gather (each thread one output element, both sides coalesced); when it moves, tiles of
32 x 32 go through shared memory (padded against bank conflicts): loads coalesced along the input's
last dimension, stores along the output's.

Strided slices (x[start:end:step] along one dim, step != 1) are a gather too, with the same prologue
and epilogue: generate_strided_slice.
"""
from __future__ import annotations

import math

from ..ir import Program
from .around import grid_for, render_around, split_around
from .cuda import Names, header, index_type, kernel_name, kernel_source
from .kernel import CodegenError, KernelSource
from .region_io import RegionIO, contiguous_strides

LAYOUT_OPS = ("permute", "transpose")
TILE, ROWS = 32, 8


def permutation(node, rank: int) -> list[int]:
    if node.op == "permute":
        return [d % rank for d in node.attrs["dims"]]
    d0, d1 = node.attrs["dim0"] % rank, node.attrs["dim1"] % rank
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return perm


def simplify(shape, perm) -> tuple[list[int], list[int]]:
    """Drop size-1 dims and merge input dims that stay adjacent and in order in the output."""
    keep = [d for d in range(len(shape)) if shape[d] != 1]
    order = [d for d in perm if shape[d] != 1]            # kept input dims in output order
    groups: list[list[int]] = []                          # in output order
    for d in order:
        if groups and keep.index(d) == keep.index(groups[-1][-1]) + 1:
            groups[-1].append(d)
        else:
            groups.append([d])
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    new_shape = [math.prod(shape[d] for d in groups[g]) for g in by_input]
    new_perm = [by_input.index(g) for g in range(len(groups))]
    return new_shape or [1], new_perm or [0]


def generate_layout(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    vals = program.values
    t, pro, epi = split_around(program, io, LAYOUT_OPS, "layout", "permute or transpose", size_of="input")
    x_vid, y_vid = t.inputs[0], t.outputs[0]
    x, y = vals[x_vid], vals[y_vid]
    numel = math.prod(x.shape)

    rank = len(x.shape)
    shape, perm = simplify(list(x.shape), permutation(t, rank))
    r = len(shape)
    in_strides = contiguous_strides(shape)
    out_shape = [shape[p] for p in perm]
    out_strides_o = contiguous_strides(out_shape)
    out_stride = [0] * r                                   # output stride of each input dim
    for i, d in enumerate(perm):
        out_stride[d] = out_strides_o[i]
    tiled = perm[-1] != r - 1

    names = Names()
    names.taken.update(("tile", "ti", "tb", "ta", "q", "ia", "ib", "in_idx", "out_idx", "point", "store_point"))
    w = render_around(program, io, pro, epi, x_vid, y_vid, names,
                      "one element of the permuted tensor, in input order.",
                      "one element of the permuted tensor, in output order.")
    arg, pro_inputs, epi_inputs = w.arg, w.pro_inputs, w.epi_inputs
    ld_pro, ld_epi, pro_fn, epi_fn = w.ld_pro, w.ld_epi, w.pro_fn, w.epi_fn

    def pro_call(idx):
        return f"point({', '.join(ld_pro.load(v, arg[v], idx) for v in pro_inputs)})"

    def epi_call(val, idx):
        a = [val] + [ld_epi.load(v, arg[v], idx) for v in epi_inputs] + [f"{arg[v]}[{idx}]" for v in io.outputs]
        return f"store_point({', '.join(a)});"

    index_t = index_type(numel)
    consts = [f"typedef {index_t} index_t;", f"constexpr index_t kNumel = {numel};"]
    block = 256
    if not tiled:
        # output coordinate i of the simplified shape reads input dim perm[i]
        consts += [f"constexpr index_t kOutSize{i} = {out_shape[i]}, kOutInner{i} = {out_strides_o[i]}, "
                   f"kInStride{i} = {in_strides[perm[i]]};" for i in range(r)]
        terms = []
        for i in range(r):
            q = "o" if out_strides_o[i] == 1 else f"o / kOutInner{i}"
            coord = f"({q})" if i == 0 else f"({q}) % kOutSize{i}"
            terms.append(f"{coord} * kInStride{i}")
        gather = ("// The input element that output element o reads.\n"
                  f"__device__ __forceinline__ index_t source(index_t o) {{ return {' + '.join(terms)}; }}\n")
        grid = grid_for(numel, block)
        body = ["  const index_t stride = (index_t)gridDim.x * blockDim.x;",
                "  for (index_t o = (index_t)blockIdx.x * blockDim.x + threadIdx.x; o < kNumel; o += stride) {",
                f"    {epi_call(pro_call('source(o)'), 'o')}",
                "  }"]
        helpers = [gather]
        blockdim = (block, 1, 1)
        sched = f"gather (innermost dim stays), {block} threads x {grid} blocks"
    else:
        a, b = r - 1, perm[-1]
        batch = [d for d in range(r) if d not in (a, b)]
        nb = math.prod(shape[d] for d in batch)
        ta, tb = math.ceil(shape[a] / TILE), math.ceil(shape[b] / TILE)
        grid = ta * tb * nb
        consts += [f"constexpr index_t kA = {shape[a]};  // input's last dim (moves)",
                   f"constexpr index_t kB = {shape[b]};  // output's last dim",
                   f"constexpr index_t kInStrideB = {in_strides[b]}, kOutStrideA = {out_stride[a]};",
                   f"constexpr index_t kTilesA = {ta}, kTilesB = {tb};",
                   f"constexpr int kTile = {TILE}, kRows = {ROWS};"]
        in_terms, out_terms, inner = [], [], 1
        for d in reversed(batch):
            consts.append(f"constexpr index_t kBatch{d} = {shape[d]}, kBatchIn{d} = {in_strides[d]}, "
                          f"kBatchOut{d} = {out_stride[d]}" + (f", kBatchInner{d} = {inner}" if inner != 1 else "")
                          + ";" + (f"  // batches per step of batch dim {d}" if inner != 1 else ""))
            coord = "q" if inner == 1 else f"(q / kBatchInner{d})"
            coord = f"({coord} % kBatch{d})" if d != batch[0] else coord
            in_terms.append(f"{coord} * kBatchIn{d}")
            out_terms.append(f"{coord} * kBatchOut{d}")
            inner *= shape[d]
        # states how the tiles and batches cover the tensor (and keeps kNumel, which the tests read)
        consts.append(f"static_assert(kNumel == {' * '.join(['kA', 'kB'] + [f'kBatch{d}' for d in batch])}, "
                      '"tiles x batches cover every element");')
        helpers = [
            "// Offsets of batch q (the dims that neither move in nor out) in the input and the output.\n"
            f"__device__ __forceinline__ index_t batch_in(index_t q) {{ return {' + '.join(in_terms) or '0'}; }}\n"
            f"__device__ __forceinline__ index_t batch_out(index_t q) {{ return {' + '.join(out_terms) or '0'}; }}\n"]
        body = ["  __shared__ float tile[kTile][kTile + 1];  // +1: columns fall in different banks",
                "  const index_t ti = blockIdx.x % (kTilesA * kTilesB);",
                "  const index_t q = blockIdx.x / (kTilesA * kTilesB);",
                "  const index_t ta = ti % kTilesA, tb = ti / kTilesA;",
                "  const index_t in_base = batch_in(q), out_base = batch_out(q);",
                "  // load: threadIdx.x runs along the input's last dim (coalesced)",
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
    consts.append(f"constexpr int kBlock = {block};")
    consts += ld_pro.consts + ld_epi.consts
    kname = kernel_name(name)
    cparams = [f"const float* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"float* __restrict__ {arg[v]}" for v in io.outputs]
    head = header(program, f"Region {name}: {t.op} {list(x.shape)} -> {list(y.shape)} with {len(pro)} "
                           f"prologue and {len(epi)} epilogue op(s)", io.nodes, [
        "Inputs:  " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.inputs),
        "Outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.outputs),
        f"Simplified: {shape} permuted by {perm}; schedule: {sched}.",
    ])
    source = kernel_source(head, consts, [*ld_pro.helpers, *ld_epi.helpers, *helpers, pro_fn, epi_fn], kname,
                           cparams, body)
    return KernelSource(
        name=kname, kind="layout", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=blockdim, schedule=sched,
        params={"tiled": tiled, "shape": shape, "perm": perm, "grid": grid}, align=4,
        bytes_moved=sum(vals[v].nbytes for v in io.inputs + io.outputs),
        flops=sum(program.node_flops(n) for n in io.nodes))


def slice_geometry(size: int, start, end, step: int) -> tuple[int, int]:
    """(first index, length) of x[start:end:step] along a dim of `size`, by python's rules (negative
    indices count from the end, out-of-range bounds clamp)."""
    r = range(size)[slice(start, end, step)]
    return (r.start if len(r) else 0), len(r)


def generate_strided_slice(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    """A region of one slice with step != 1, with pointwise ops before it (evaluated only at the
    elements it keeps) and after it: each thread one output element o (grid-stride loop), reading input
    element start + j * step along the sliced dim, j the output's index along it."""
    vals = program.values
    t, pro, epi = split_around(program, io, ("slice",), "strided-slice", "slice with a step")
    if t.attrs.get("step", 1) == 1:
        raise CodegenError(f"{t.name} has step 1: a contiguous slice is a view or a copy, not this kernel")
    x_vid, y_vid = t.inputs[0], t.outputs[0]
    x, y = vals[x_vid], vals[y_vid]
    numel = math.prod(y.shape)
    rank = len(x.shape)
    d = t.attrs["dim"] % rank
    size, step = x.shape[d], int(t.attrs["step"])
    start, length = slice_geometry(size, t.attrs.get("start"), t.attrs.get("end"), step)
    outer, inner = math.prod(x.shape[:d]), math.prod(x.shape[d + 1:])

    names = Names()
    names.taken.update(("o", "stride", "source", "point", "store_point"))
    w = render_around(program, io, pro, epi, x_vid, y_vid, names,
                      "one element of the input, at an index the slice keeps.",
                      "one element of the sliced tensor.")
    arg, pro_inputs, epi_inputs = w.arg, w.pro_inputs, w.epi_inputs
    ld_pro, ld_epi = w.ld_pro, w.ld_epi
    point = f"point({', '.join(ld_pro.load(v, arg[v], 'source(o)') for v in pro_inputs)})"
    store = ([point] + [ld_epi.load(v, arg[v], "o") for v in epi_inputs] + [f"{arg[v]}[o]" for v in io.outputs])

    index_t = index_type(math.prod(x.shape))
    consts = [f"typedef {index_t} index_t;",
              f"constexpr index_t kNumel = {numel};  // output elements",
              f"constexpr index_t kStart = {start}, kStep = {step}, kLen = {length};  // along dim {d} "
              f"(size {size})"]
    # o = (b * kLen + j) * kInner + i  reads  (b * size + kStart + j * kStep) * kInner + i
    along = "o" if inner == 1 else "(o / kInner)"
    if outer > 1:
        along = f"{along} % kLen"
    terms = [f"(kStart + {along} * kStep)" + ("" if inner == 1 else " * kInner")]
    if inner > 1:
        consts.append(f"constexpr index_t kInner = {inner};  // elements per step of dim {d}")
        terms.append("o % kInner")
    if outer > 1:
        consts.append(f"constexpr index_t kOutBlock = {length * inner}, kInBlock = {size * inner};  "
                      f"// one index of the dims before {d}, out and in")
        terms.insert(0, "o / kOutBlock * kInBlock")
    block = int((params or {}).get("block", 256))
    grid = grid_for(numel, block)
    consts.append(f"constexpr int kBlock = {block};")
    consts += ld_pro.consts + ld_epi.consts
    source_fn = ("// The input element that output element o reads.\n"
                 f"__device__ __forceinline__ index_t source(index_t o) {{ return {' + '.join(terms)}; }}\n")
    kname = kernel_name(name)
    cparams = [f"const float* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"float* __restrict__ {arg[v]}" for v in io.outputs]
    sched = f"gather, one output element per thread, {block} threads x {grid} blocks"
    stop = start + (length - 1) * step + 1
    head = header(program, f"Region {name}: {t.op} {list(x.shape)}[{start}:{stop}:{step}] along dim {d} -> "
                           f"{list(y.shape)} with {len(pro)} prologue and {len(epi)} epilogue op(s)", io.nodes, [
        "Inputs:  " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.inputs),
        "Outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.outputs),
        f"Output element j along dim {d} reads input element {start} + j * {step}; schedule: {sched}.",
    ])
    body = ["  const index_t stride = (index_t)gridDim.x * blockDim.x;",
            "  for (index_t o = (index_t)blockIdx.x * blockDim.x + threadIdx.x; o < kNumel; o += stride) {",
            f"    store_point({', '.join(store)});",
            "  }"]
    source = kernel_source(head, consts, [*ld_pro.helpers, *ld_epi.helpers, source_fn, w.pro_fn, w.epi_fn],
                           kname, cparams, body)
    return KernelSource(
        name=kname, kind="strided_slice", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=(block, 1, 1), schedule=sched,
        params={"dim": d, "start": start, "step": step, "length": length, "grid": grid, "block": block},
        align=4,   # the prologue's operands are read only at the kept elements
        bytes_moved=sum(min(vals[v].nbytes, numel * 4) for v in pro_inputs)
        + sum(vals[v].nbytes for v in epi_inputs + io.outputs),
        flops=sum(program.node_flops(n) for n in io.nodes))
