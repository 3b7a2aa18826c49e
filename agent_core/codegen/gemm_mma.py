"""A matmul / linear and the pointwise ops after it as ONE generated kernel: a tile GEMM in split TF32
("3xtf32") on the tensor cores with the epilogue applied to the accumulators before the only store.

Why: run as a library call, the GEMM writes its output to HBM and a second kernel reads it back for
the epilogue; in the library's split-TF32 form (runtime/split_tf32.py) the weight's hi / lo halves
are cached beside it and the input is split into temporaries (512 MiB + 576 MiB at KernelBench's
1024 x 8192 x 8192). Here each operand is split in registers as its fragments are read from shared
memory (attention_mma.split_tf32: hi = bits + 0x1000, lo = x - hi), a_hi b_hi + a_hi b_lo + a_lo b_hi
is accumulated in fp32 (only lo * lo, about 2^-22 of a product, is dropped), and nothing but the
output is written.

Where the program allows TF32 (runtime/low_precision.py), params "tf32": True is one more form the tuner
times (alternatives): a_hi b_hi alone, plain TF32, a third of the tensor-core work, kept only where it
verifies within the program's tolerance.

Schedule (params, tuned by agent/tune.py through tune_variants):
- a block owns a block_m x block_n tile of the output; warps_m x warps_n warps each own a
  (block_m / warps_m) x (block_n / warps_n) warp tile of m16n8 accumulator fragments (mma.sync
  m16n8k8 TF32, fp32 accumulators);
- where the output's tiles leave most SMs idle and K is long (split_k_for), the CTAs of each tile cut K
  into parts along grid z and take turns in order: each adds the running sum of those before it (one
  buffer of the output's size, a kernel workspace) and the last applies the epilogue, so the sum's
  order is the same every launch (_split_k_turn);
- K is walked in block_k slices, copied with cp.async into `stages` shared-memory buffers (a
  multi-stage pipeline: stages - 1 slices are in flight while one is computed); 16-byte copies where
  the operand's rows are contiguous and 16-byte aligned, 4-byte copies through any strides otherwise;
- A is read as [M, K] through its (row, k) strides, B as [K, N] through its (k, n) strides: linear's
  weight [N, K] is read transposed in place (k contiguous) into an [n][k] tile, a matmul's [K, N]
  into a [k][n] tile, each padded so the fragment reads are free of bank conflicts;
- rows past M, columns past N and k past K read zeros and are not stored (ragged shapes);
- epilogue: bias (linear's), then the region's pointwise ops rendered through the op library's one
  table of CUDA expressions (pointwise.render_chain), broadcast operands indexed through
  region_io.BroadcastIndex, each output element stored once (only those the program reads);
- row reductions of the output's last dim after that epilogue (sum, mean, max, min, prod, logsumexp,
  var, std) and pointwise ops over their results: folded from the accumulators, combined across
  lanes, warps and the CTAs of a row (the last one to arrive finishes it), gemm_rows.py;
- a normalising op after that (layer_norm, rms_norm, softmax, log_softmax) and pointwise ops after it:
  each CTA holds whole rows (whole_row_params) and normalises them in a second pass over its
  accumulators, gemm_rows.py.

params["portable"] swaps the tensor-core helpers for plain C++ ones of the same names (mma_portable.py)
so the CPU emulator runs this exact body; the kernel a GPU runs never sets it.

A gated unit after a linear / matmul or a one-group convolution (its output read only as the two
halves along the last dim, or the convolution's channels: chunk(2, dim), then value * act(gate): GLU,
GEGLU, SwiGLU) runs in the same kernel: a CTA reads B's
columns of both halves in alternating 8-column groups (glu_col), so each thread's fragments 2q and 2q + 1
hold one output column's value and gate, and only the half-wide result is stored (spec.halves).

A stack of GEMMs (bmm, or a matmul of [..., M, K] by [..., K, N], either operand possibly one matrix for
all) runs one GEMM per CTA along grid z. A conv1d / conv2d / conv3d runs as the same kernel, an implicit
GEMM: A's tiles are gathered from the input's patches and the output is stored in the convolution's
layout (codegen/gemm_conv.py).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..ir import Program
from ..runtime.low_precision import TF32, allowed
from ..text import plural
from .attention_mma import HELPERS, SHARED_LIMIT
from . import gemm_conv, gemm_tma
from .cuda import INT_INDEX_LIMIT, Names, c_type, float_literal, header, index_type, kernel_name
from .kernel import CodegenError, KernelSource
from .gemm_rows import CLUSTER_MAX, LOCALS as ROW_LOCALS, RELABELS, RowPart, cluster_exit, combine_lines, fold_lines
from .gemm_rows import operand_loads, shared_floats
from .gemm_rows import split_epilogue, state_code
from .gemm_rows import workspace as row_workspace
from .mma_portable import PORTABLE_HELPERS
from .pointwise import render_chain
from .region_io import RegionIO

FORM = "gemm-3xtf32"
GEMM_OPS = ("linear", "matmul", "bmm")
GRID_LIMIT = 65535          # output tiles along M (grid y)
SPLIT_MIN_K = 256           # the shortest reduction a split-K part keeps
# Split K's parts wait for each other on the GPU (a spin on the tile's turn, which relies on CTAs
# starting in block order, as CUTLASS's serial split K does). On an H100 (tests/gpu/test_gemm_norm_gpu.py,
# benchmarks/h100-2026-12-06-s20) the parts took their turns with bitwise-equal replays, and on ViT's
# linear + residual + LayerNorm (394 rows, 25 whole-row tiles) split K took the fused form from 0.48x and
# 0.95x of cuBLAS fp32 + torch's LayerNorm to 1.10x and 1.21x: the default tiles split where the output
# leaves SMs idle (split_k_for), and the tuner times the unsplit tiles too.
SPLIT_K_DEFAULT = True
# locals of the kernel body that the epilogue's value names must not take
LOCALS = ("acc", "mt", "nt", "j", "row", "col", "i", "mm", "lane_g", "lane_t", "tid", "warp_m", "warp_n",
          "bm", "bn", "row0", "col0", "As", "Bs", "smem", "kt", "kk", "load_tile", "KT", "At", "Bt", "ah", "al",
          "bh", "bl", "sacc", "pa", "pb", "r", "c", "e", "gr", "gc", "ok", "s", "k0", "stage", "bz", "abat",
          "bbat", "mm2", "q", "oc", "part", "turn", "r0", "c0", "kt0", "kPer", "kSlices", "tile_m", "tile_n", "lin",
          "in_group", "first_m", "group_m") + gemm_conv.LOCALS + \
    gemm_tma.LOCALS


@dataclass
class Operand:
    """A GEMM operand read through strides: A as [M, K] (rows = m), B as [K, N] (rows = k)."""
    value: str
    row_stride: int
    col_stride: int


@dataclass
class GemmSpec:
    node: str
    op: str
    M: int
    N: int
    K: int
    a: Operand
    b: Operand
    bias: str | None
    out: str                 # the GEMM's output value
    space: tuple             # its shape: the epilogue's iteration space
    epilogue: list[str]      # the pointwise nodes over its elements, in order
    rows: RowPart | None = None   # row reductions of its last dim and the ops over their results
    full_values: set = field(default_factory=set)   # values computed per output element
    conv: gemm_conv.ConvGeom | None = None   # A is this convolution's input patches (an implicit GEMM)
    batch: int = 1           # batched (bmm, matmul of two stacks): one GEMM per batch along grid z
    a_batch: int = 0         # elements between A's (and B's) batches; 0 where one matrix is broadcast
    b_batch: int = 0
    halves: tuple | None = None   # (out[..., :N/2], out[..., N/2:]): a gated unit's value and gate (GLU)

    @property
    def b_k_contiguous(self) -> bool:
        """B's k is its contiguous dim (linear's [N, K] weight): the shared tile is [n][k]."""
        return self.b.row_stride == 1 and self.b.col_stride != 1


def gemm_spec(program: Program, io: RegionIO) -> GemmSpec:
    """What the kernel computes; CodegenError when the region is not one matmul / linear / bmm or
    convolution followed by pointwise ops over its output and (a 2-D weight's only) row reductions of its
    last dim and pointwise ops over their results (gemm_rows.py)."""
    anchors = [n for n in io.nodes if program.nodes[n].opdef.category in ("matmul", "convolution")]
    if len(anchors) != 1 or program.nodes[anchors[0]].op not in GEMM_OPS + gemm_conv.CONV_OPS:
        ops = ", ".join(program.nodes[n].op for n in anchors) or "none"
        raise CodegenError(f"the tile GEMM takes one {', '.join(GEMM_OPS + gemm_conv.CONV_OPS)} per region "
                           f"(this one: {ops})")
    nid = anchors[0]
    node = program.nodes[nid]
    if io.nodes[0] != nid:
        raise CodegenError(f"{node.name} ({node.op}) reads a value computed earlier in the region; the tile "
                           f"GEMM reads its operands from memory", node_id=nid)
    vals = program.values
    a_id, b_id = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if node.op != "matmul" and len(node.inputs) > 2 else None
    for v in (a_id, b_id, bias):
        if v is not None and vals[v].dtype != "float32":
            raise CodegenError(f"{node.name}: '{vals[v].name}' is {vals[v].dtype}; the tile GEMM reads float32",
                               node_id=nid)
    if node.op in gemm_conv.CONV_OPS:
        return _conv_spec(program, io, node, bias)
    if len(vals[b_id].shape) > 2:
        return _batched_spec(program, io, node)
    ash, bsh, out = tuple(vals[a_id].shape), tuple(vals[b_id].shape), node.outputs[0]
    if len(bsh) != 2 or len(ash) < (1 if node.op == "linear" else 2):
        raise CodegenError(f"{node.name}: {node.op} of {list(ash)} by {list(bsh)}; the tile GEMM takes a "
                           f"2-D weight and an input of rank >= {1 if node.op == 'linear' else 2}", node_id=nid)
    K = ash[-1]
    M = math.prod(ash[:-1])
    if node.op == "linear":
        N = bsh[0]
        b = Operand(b_id, 1, K)          # B[k][n] = W[n][k]: read transposed in place
    else:
        N = bsh[1]
        b = Operand(b_id, N, 1)
    if bias is not None and tuple(vals[bias].shape) not in ((N,), ()):
        raise CodegenError(f"{node.name}: a bias of shape {list(vals[bias].shape)}", node_id=nid)
    if min(M, N, K) < 1:
        raise CodegenError(f"{node.name}: an empty GEMM ({M} x {N} x {K})", node_id=nid)
    if math.ceil(M / 16) > GRID_LIMIT * 8:
        raise CodegenError(f"{node.name}: {M} rows are more tiles than one grid dimension holds", node_id=nid)
    halves, io = _halves(program, io, nid)
    space = tuple(vals[halves[0]].shape) if halves else tuple(vals[out].shape)
    full, rows, full_vals = _epilogue_part(program, io, nid, out, space, halves or ())
    if halves and rows is not None:
        raise CodegenError(f"{node.name}: row reductions after a gated unit's halves are not fused", node_id=nid)
    return GemmSpec(nid, node.op, M, N, K, Operand(a_id, K, 1), b, bias, out, space, full, rows, full_vals,
                    halves=halves)


def columns_dim(program: Program, nid: str) -> int | None:
    """The dim of a GEMM node's output that holds its columns (a gated unit splits it): the last for a
    linear / matmul, the channels for a one-group convolution (1, or 0 unbatched); None otherwise."""
    node = program.nodes[nid]
    rank = len(program.values[node.outputs[0]].shape)
    if node.op in ("linear", "matmul"):
        return rank - 1
    if node.op in gemm_conv.CONV_OPS and node.attrs.get("groups", 1) == 1:
        return rank - int(node.op[-2]) - 1
    return None


def gated_halves(program: Program, out: str, dim: int | None, readers) -> tuple[str, str] | None:
    """(first half, second half): the slice values when `readers` (node ids) are exactly the two slices
    of `out` into its halves along dim (chunk(2, dim) before a gated unit: GLU, GEGLU, SwiGLU); else None.
    What the planner asks before putting the halves in the GEMM's region and codegen before pairing them."""
    nodes, shape = program.nodes, program.values[out].shape
    if dim is None or len(readers) != 2 or shape[dim] % 2:
        return None
    n, spans = shape[dim], {}
    for r in readers:
        a = nodes[r].attrs
        if nodes[r].op == "slice" and a["dim"] % len(shape) == dim:
            spans[slice(a["start"], a["end"], a["step"]).indices(n)] = nodes[r].outputs[0]
    if set(spans) != {(0, n // 2, 1), (n // 2, n, 1)}:
        return None
    return spans[(0, n // 2, 1)], spans[(n // 2, n, 1)]


def _halves(program: Program, io: RegionIO, nid: str) -> tuple[tuple | None, RegionIO]:
    """((first half, second half), io without the two slices) where the region reads the GEMM's output
    only as its halves (gated_halves), each CTA then computing a column of each side by side; (None, io)
    where it reads no slice of it; CodegenError for other slices."""
    nodes, vals = program.nodes, program.values
    out = nodes[nid].outputs[0]
    readers = [n for n in io.nodes if out in nodes[n].inputs]
    if not any(nodes[n].op == "slice" for n in readers):
        return None, io
    dim = columns_dim(program, nid)
    halves = gated_halves(program, out, dim, readers) if out not in io.outputs else None
    if halves is None:
        what = "no slice of a grouped convolution's output" if dim is None else \
            f"its two halves along dim {dim} (a gated unit), nothing else"
        raise CodegenError(f"the region slices the GEMM's output '{vals[out].name}' {vals[out].spec}; the tile "
                           f"GEMM takes {what}")
    rest = [x for x in io.nodes if x not in readers or nodes[x].op != "slice"]
    return halves, RegionIO(rest, io.inputs, io.outputs, io.produced)


def _conv_spec(program: Program, io: RegionIO, node, bias: str | None) -> GemmSpec:
    """A convolution as the implicit GEMM: M = batch x output positions, N = Cout, K = Cin x taps; B is
    the weight read as linear's [N, K]; pointwise ops after it only."""
    g = gemm_conv.conv_geom(program, node)
    M, N, K = g.batch * g.positions, g.cout_g, g.cin_g * g.taps
    if min(M, N, K) < 1:
        raise CodegenError(f"{node.name}: an empty convolution ({M} x {N} x {K})", node_id=node.id)
    if M >= INT_INDEX_LIMIT:
        raise CodegenError(f"{node.name}: {M} output rows are more than the implicit GEMM's int rows hold",
                           node_id=node.id)
    if bias is not None and tuple(program.values[bias].shape) != (g.cout,):
        raise CodegenError(f"{node.name}: a bias of shape {list(program.values[bias].shape)}", node_id=node.id)
    out = node.outputs[0]
    halves, io = _halves(program, io, node.id)
    space = tuple(program.values[halves[0] if halves else out].shape)
    full, rows, full_vals = _epilogue_part(program, io, node.id, out, space, halves or ())
    if rows is not None:
        raise CodegenError(f"{node.name} ({node.op}): the implicit-GEMM convolution fuses pointwise ops only (its "
                           f"output's last dim is a spatial one, not the channels a GEMM row holds)", node_id=node.id)
    return GemmSpec(node.id, node.op, M, N, K, Operand(node.inputs[0], K, 1), Operand(node.inputs[1], 1, K), bias,
                    out, space, full, None, full_vals, conv=g, halves=halves)


def _batched_spec(program: Program, io: RegionIO, node) -> GemmSpec:
    """A stack of GEMMs (bmm, or matmul of [..., M, K] by [..., K, N]): one per batch along grid z, each
    operand either holding every batch of the output or one matrix broadcast to all; pointwise ops
    after it only."""
    vals = program.values
    a_id, b_id, out = node.inputs[0], node.inputs[1], node.outputs[0]
    ash, bsh, space = tuple(vals[a_id].shape), tuple(vals[b_id].shape), tuple(vals[out].shape)
    if len(ash) < 2:
        raise CodegenError(f"{node.name}: {node.op} of a vector {list(ash)}", node_id=node.id)
    M, K, N = ash[-2], ash[-1], bsh[-1]
    batch = math.prod(space[:-2])

    def batch_stride(shape) -> int | None:
        """Elements between an operand's matrices: all the output's batches, one broadcast, or neither."""
        dims = (1,) * (len(space) - len(shape)) + tuple(shape[:-2])
        return shape[-2] * shape[-1] if dims == space[:-2] else 0 if math.prod(dims) == 1 else None
    a_batch, b_batch = batch_stride(ash), batch_stride(bsh)
    if a_batch is None or b_batch is None:
        raise CodegenError(f"{node.name}: {node.op} of {list(ash)} by {list(bsh)}: the batched tile GEMM takes "
                           f"operands that hold every batch of the output or one matrix", node_id=node.id)
    if min(M, N, K, batch) < 1:
        raise CodegenError(f"{node.name}: an empty GEMM ({batch} x {M} x {N} x {K})", node_id=node.id)
    if batch > GRID_LIMIT or batch * M * N >= INT_INDEX_LIMIT:
        raise CodegenError(f"{node.name}: {batch} GEMMs of {M} x {N}: more than one grid or an int index holds",
                           node_id=node.id)
    full, rows, full_vals = _epilogue_part(program, io, node.id, out, space)
    if rows is not None:
        raise CodegenError(f"{node.name} ({node.op}): the batched tile GEMM fuses pointwise ops only", node_id=node.id)
    return GemmSpec(node.id, node.op, M, N, K, Operand(a_id, K, 1), Operand(b_id, N, 1), None, out, space, full,
                    None, full_vals, batch=batch, a_batch=a_batch, b_batch=b_batch)


def _epilogue_part(program: Program, io: RegionIO, nid: str, out: str, space: tuple, halves: tuple = ()):
    """(pointwise nodes over the output's elements (its halves' where given), the row part or None, the
    values computed per element); CodegenError for an output that is neither."""
    vals = program.values
    full, rows = split_epilogue(program, io, nid, out, space, halves)
    full_vals = {out, *halves} | {v for n in full for v in program.nodes[n].outputs}
    for vid in io.outputs:
        if vid not in full_vals and (rows is None or vid not in rows.values | rows.after_values):
            raise CodegenError(f"output '{vals[vid].name}' {vals[vid].spec} is neither the GEMM's {list(space)} "
                               f"elements nor one value per row")
    return full, rows, full_vals


def gemm_supported(program: Program, node_ids) -> str | None:
    """None when the region can run as the tile GEMM with its epilogue fused, else the reason."""
    from .region_io import region_io
    try:
        gemm_spec(program, region_io(program, node_ids))
    except CodegenError as exc:
        return str(exc)
    return None


def lone_gemm(program: Program, node_ids) -> bool:
    """A matmul or convolution alone (no op after it) that the tile GEMM takes and that is compute-bound
    in fp32, where cuBLAS's or cuDNN's fp32 runs on the FMA units and the tensor cores can gain (and
    cuBLAS's split TF32 needs its parts split into HBM first), or a convolution that reads few input
    channels through a spatial kernel (gemm_conv.few_channels), where cuDNN's fp32 is far from even the
    bytes' time: its region gets the tile form as its kernel, timed against the library call (the faster
    is kept). Otherwise, below the ridge point, the time is the bytes, which a kernel of our own does not cut.
    Views around it (a reshape of its output) are the kernel's too, where the tile GEMM takes them."""
    from ..analysis.cost import is_view, node_cost
    ids = list(node_ids)
    work = [n for n in ids if not is_view(program, n)]
    if len(work) != 1 or program.nodes[work[0]].op not in gemm_conv.CONV_OPS + GEMM_OPS or \
            gemm_supported(program, ids) is not None:
        return False
    node = program.nodes[work[0]]
    return node_cost(program, node.id).bound() == "compute" or \
        (node.op in gemm_conv.CONV_OPS and gemm_conv.few_channels(program, node))


def tma_alternatives(spec: GemmSpec, p: dict | None = None) -> list[dict]:
    """The sm_90 TMA loop's tiles for this GEMM where that loop takes it and p (the kernel's params) is not
    one already, K cut into parts first where the tiles leave SMs idle; the tuner drops them on other GPUs
    (gemm_tma.tried_on)."""
    if gemm_tma.applies(spec) is not None or (p or {}).get("mma") == gemm_tma.MMA:
        return []
    split, whole = [], []     # K cut where the tiles leave SMs idle, first; the same tiles with K whole too
    for v in gemm_tma.variants({"form": FORM}):
        bm, bn = int(v["block_m"]), int(v["block_n"])
        parts = min(gemm_tma.MAX_PARTS, split_k_for(spec, bm, bn, gemm_tma.BK, cluster_rows=row_cluster(spec, v)))
        split += [{**v, "split_k": parts}] if parts > 1 else []
        whole.append({**v, "split_k": 1})
    return split + whole


def alternatives(program: Program, io: RegionIO) -> list[dict]:
    """The tile GEMM as tuning params for a region now run as a library call + epilogue kernel: its
    default tiles (picked for the tuner's SM count) and the next most promising; none when the
    region is not one it takes."""
    try:
        spec = gemm_spec(program, io)
    except CodegenError:
        return []
    first = default_params(spec)
    rows = {"whole_rows": True} if first.get("whole_rows") else {}      # a normalising op after it
    out = [{"form": FORM, "block_n": first["block_n"], **rows}, *tma_alternatives(spec), tune_variants(first)[0]]
    if TF32 in allowed(program):      # one TF32 product instead of three, where the program allows it
        out.append({"form": FORM, "block_n": first["block_n"], TF32: True})
    return out


def default_params(spec: GemmSpec, sm_count: int = 132) -> dict:
    """128 x 128 tiles of 8 warps (64 x 32 each), 32-wide k slices in 3 stages; narrower tiles when
    those would leave SMs idle (a small or thin output), by the output's size alone. A convolution's
    thin output has tiles of its own (gemm_conv.default_tiles)."""
    if spec.rows is not None and spec.rows.norms:
        return whole_row_params(spec, sm_count)
    if spec.conv is not None:
        tiles_ = gemm_conv.default_tiles(spec.conv, spec.K)
        if spec.halves:     # every warp's columns hold whole fragment pairs (glu_col)
            bn = 16 * math.ceil(int(tiles_["block_n"]) / 16)
            wn = next(w for w in (int(tiles_["warps_n"]), 2, 1) if bn % (16 * w) == 0)
            tiles_ = {**tiles_, "block_n": bn, "warps_n": wn}
        return {"form": FORM, **tiles_, "min_blocks": 2, "slice_acc": True}     # as generate_gemm's _resident allows
    bm, bn, wm, wn = 128, 128, 2, 4
    if spec.batch * math.ceil(spec.M / 128) * math.ceil(spec.N / 128) < sm_count:
        bm, bn, wm, wn = 128, 64, 2, 2
        if spec.batch * math.ceil(spec.M / 128) * math.ceil(spec.N / 64) < sm_count:
            bm, bn = 64, 64
    return {"form": FORM, "block_m": bm, "block_n": bn, "block_k": 32, "warps_m": wm, "warps_n": wn,
            "stages": 3, "min_blocks": 1, "slice_acc": True, "split_k": split_k_for(spec, bm, bn, 32, sm_count)}


def split_parts(p: dict) -> int:
    return int(p.get("split_k") or 1)


def split_k_for(spec: GemmSpec, bm: int, bn: int, bk: int, sm_count: int = 132, cluster_rows: bool = False) -> int:
    """How many parts to cut K into for tiles of bm x bn: the most powers of two that keep the CTAs
    within one wave of the SMs and each part at least SPLIT_MIN_K long; 1 for a batch, a convolution, a
    gated unit, or rows shared between CTAs through the workspace (their own), and while SPLIT_K_DEFAULT
    is off. cluster_rows: CTAs sharing rows do so as a cluster (row_cluster), which the parts leave alone."""
    tiles_ = math.ceil(spec.M / bm) * math.ceil(spec.N / bn)
    if not SPLIT_K_DEFAULT or spec.batch > 1 or spec.conv is not None or spec.halves or \
            (spec.rows is not None and bn < spec.N and not cluster_rows):
        return 1
    s = 1
    while tiles_ * 2 * s <= sm_count and spec.K // (2 * s) >= max(SPLIT_MIN_K, bk):
        s *= 2
    return s


def whole_row_params(spec: GemmSpec, sm_count: int = 132) -> dict:
    """Tiles for a normalising op after the GEMM: each CTA holds whole rows (block_n covers N) of 16
    rows, its warps side by side along N (the fewest of 1, 2, 4, 8 that leave a warp at most 8 m16n8
    fragments, else 8: 16 for rows of 1024), with the deepest pipeline of 32- or 16-wide k slices that
    fits in shared memory."""
    wn = next(w for w in (1, 2, 4, 8) if math.ceil(spec.N / (8 * w)) <= 8 or w == 8)
    bn = 8 * wn * math.ceil(spec.N / (8 * wn))
    p = {"form": FORM, "block_m": 16, "block_n": bn, "warps_m": 1, "warps_n": wn, "min_blocks": 1,
         "slice_acc": True, "whole_rows": True}
    for bk, stages in ((32, 3), (16, 3), (16, 2)):
        q = {**p, "block_k": bk, "stages": stages}
        if shared_bytes(spec, q) <= SHARED_LIMIT:
            break
    return {**q, "split_k": split_k_for(spec, 16, bn, int(q["block_k"]), sm_count)}


def tune_variants(p: dict) -> list[dict]:
    """Other tiles than p's, most promising first (sm_90's TMA tiles are the region's alternatives,
    tma_alternatives): the other 128-row tile, square 64 tiles with a deeper pipeline, and thinner k slices in four
    stages; for a thin output (a convolution's few channels), twice and half the rows a block holds, and
    thinner k slices."""
    if p.get("whole_rows"):     # a normalising op after it: whole rows, then 64 x 64 tiles sharing the rows
        out = []
        for c in ({"block_m": 32, "warps_m": 2, "stages": 2}, {"split_k": 1}, SHARED_ROWS, {"stages": 2},
                  {"block_k": 16, "stages": 4}, {"block_k": 16, "stages": 3}):
            v = {**p, **c}
            if v != p and v not in out and _pipeline_fits(v):
                out.append(v)
        return out
    cands = gemm_conv.THIN_VARIANTS if int(p["block_n"]) < 64 else (
        *([{"split_k": 1}] if split_parts(p) > 1 else []),     # the same tiles without cutting K
        {"block_m": 128, "block_n": 64, "warps_m": 2, "warps_n": 2},
        {"block_m": 128, "block_n": 128, "warps_m": 2, "warps_n": 4},
        {"block_m": 64, "block_n": 64, "warps_m": 2, "warps_n": 2, "stages": 4},
        {"block_k": 16, "stages": 4})
    out = []
    for v in [{**p, **c} for c in cands]:
        if v != p and v not in out:
            out.append(v)
    return out


def _resident(p: dict) -> dict:
    """A convolution's tiles ask for two CTAs a multiprocessor (min_blocks 2) where that leaves a thread
    the registers of its accumulators: at most 256 threads and 64 columns. The gather's latency needs
    the warps (level 2's 43 and 90 on an H100: 144 -> 128 registers, 9.31 -> 6.75 ms and 7.46 -> 5.77 ms,
    no spills); wider or bigger tiles spill under that bound, so they get one (whatever was asked)."""
    threads = 32 * int(p["warps_m"]) * int(p["warps_n"])
    if int(p.get("min_blocks") or 1) == 2 and (int(p["block_n"]) > 64 or threads > 256):
        return {**p, "min_blocks": 1}
    return p


# a normalising op's rows shared by the CTAs of a row tile (their inputs through the workspace, the last
# CTA normalising them): many more CTAs than whole-row tiles of 16 rows give a wide output
SHARED_ROWS = {"whole_rows": False, "block_m": 64, "block_n": 64, "warps_m": 2, "warps_n": 2, "block_k": 32,
               "stages": 3, "split_k": 1}


def _pipeline_fits(p: dict) -> bool:
    """Whether the mma.sync pipeline's buffers of tiles p fit in shared memory, whichever way B is
    laid out (the spec decides; shared_bytes has the exact figure)."""
    bm, bn, bk, stages = (int(p[k]) for k in ("block_m", "block_n", "block_k", "stages"))
    return 4 * stages * (bm * (bk + 4) + max(bn * (bk + 4), bk * (bn + 8))) <= SHARED_LIMIT


def _vector_ok(op: Operand, contiguous_extent: int) -> bool:
    """16-byte copies along the contiguous dim: it has a multiple of 4 elements and rows start aligned."""
    return op.col_stride == 1 and contiguous_extent % 4 == 0 and op.row_stride % 4 == 0


def _check(spec: GemmSpec, p: dict) -> tuple[int, ...]:
    bm, bn, bk = int(p["block_m"]), int(p["block_n"]), int(p["block_k"])
    wm, wn, stages = int(p["warps_m"]), int(p["warps_n"]), int(p["stages"])
    if bk % 8 or not 8 <= bk <= 64:
        raise CodegenError(f"tile GEMM: block_k {bk} must be a multiple of 8 up to 64")
    if not 1 <= wm * wn <= 16:
        raise CodegenError(f"tile GEMM: {wm} x {wn} warps is more than a block's 16")
    if p.get("mma") == gemm_tma.MMA:
        gemm_tma.check(spec, p)
    elif p.get("mma") not in (None, "mma.sync"):
        raise CodegenError(f"tile GEMM: no main loop '{p.get('mma')}' (mma.sync, or {gemm_tma.MMA} on sm_90)")
    elif bm % (16 * wm) or bn % (8 * wn):
        raise CodegenError(f"tile GEMM: a {bm} x {bn} tile does not split into {wm} x {wn} warps of m16n8 fragments")
    if not 2 <= stages <= 6:
        raise CodegenError(f"tile GEMM: {stages} stages (2 to 6)")
    parts = split_parts(p)
    if parts > 1:
        if spec.batch > 1 or spec.conv is not None or spec.halves:
            raise CodegenError("tile GEMM: split K runs on one 2-D GEMM, without a gated unit")
        if spec.rows is not None and bn < spec.N and not row_cluster(spec, p):
            raise CodegenError("tile GEMM: split K with rows shared between CTAs through the workspace (their "
                               "states have a workspace of their own)")
        if parts > math.ceil(spec.K / bk):
            raise CodegenError(f"tile GEMM: {parts} split-K parts of a reduction of {math.ceil(spec.K / bk)} slices")
    if spec.halves and (bn // wn) % 16:
        raise CodegenError(f"tile GEMM: a gated unit pairs 8-column fragments, so a warp's {bn // wn} columns "
                           f"must be a multiple of 16")
    if spec.conv is not None:     # row tiles along grid x, column tiles along y
        gemm_conv.check(p)
        if math.ceil(spec.N / bn) > GRID_LIMIT:
            raise CodegenError(f"tile GEMM: {math.ceil(spec.N / bn)} column tiles exceed the grid's {GRID_LIMIT}")
    elif math.ceil(spec.M / bm) > GRID_LIMIT:
        raise CodegenError(f"tile GEMM: {math.ceil(spec.M / bm)} row tiles exceed the grid's {GRID_LIMIT}")
    return bm, bn, bk, wm, wn, stages


def _b_rows(spec: GemmSpec) -> Operand:
    """B's rows as copied: n (k contiguous) for linear's weight, k for a [K, N] matrix."""
    return Operand(spec.b.value, spec.b.col_stride, spec.b.row_stride) if spec.b_k_contiguous else spec.b


def shared_bytes(spec: GemmSpec, p: dict) -> int:
    bm, bn, bk, _, _, stages = _check(spec, p)
    b_tile = bn * (bk + 4) if spec.b_k_contiguous else bk * (bn + 8)
    if p.get("mma") == gemm_tma.MMA:
        pipeline = gemm_tma.shared_bytes(bm, bn, stages)
    else:
        pipeline = 4 * stages * (bm * (bk + 4) + b_tile)
        if spec.conv is not None:      # the gather's tap table, after the buffers
            pipeline += 4 * gemm_conv.table_ints(spec.conv)
    # the row reductions combine the warps' states in the same buffers once the pipeline is done
    rows = 4 * shared_floats(spec.rows, bm, int(p["warps_n"]), row_cluster(spec, p)) if spec.rows else 0
    return max(pipeline, rows)


def tiles(spec: GemmSpec, p: dict) -> tuple[int, int]:
    """(tiles along N, tiles along M): the grid."""
    return math.ceil(spec.N / int(p["block_n"])), math.ceil(spec.M / int(p["block_m"]))


def split_cluster(spec: GemmSpec, p: dict) -> bool:
    """Whether K's parts add up as one cluster, each finishing its share of the tile (_split_k_cluster):
    the TMA loop's split K with no rows reduced after it. Otherwise (the mma.sync loop, or rows, which
    need a CTA's whole tile) they take turns through the workspace (_split_k_turn)."""
    return p.get("mma") == gemm_tma.MMA and split_parts(p) > 1 and spec.rows is None


def row_cluster(spec: GemmSpec, p: dict) -> bool:
    """Whether the CTAs that share rows are one thread-block cluster (gemm_rows.combine_lines): in sm_90's
    TMA loop, 2 to CLUSTER_MAX of them. A normalising op then runs over each CTA's accumulators, where the
    workspace made the row tile's last CTA read back and normalise every element of the rows alone: 394 x
    2048 -> 512 + residual + LayerNorm in 128 x 128 tiles 167 -> 92 us, 4096 x 3072 -> 768 465 -> 249 us
    (H100, bound launchers, benchmarks/h100-2026-12-06-s21 and -s22). The mma.sync loop keeps the
    workspace: it also runs before sm_90 and in the CPU emulator, which runs one CTA at a time."""
    return spec.rows is not None and p.get("mma") == gemm_tma.MMA and 1 < tiles(spec, p)[0] <= CLUSTER_MAX


def cost(program: Program, io: RegionIO, spec: GemmSpec, p: dict) -> tuple[int, int]:
    """(bytes, flops) of the kernel as generated with params p: every input read once and every output
    written once, plus the row states that CTAs sharing a row write and the last one reads back; the
    GEMM's 2 M N K and the epilogue's own count. What the planner's estimate of this form uses too
    (estimate)."""
    vals = program.values
    nbytes = sum(vals[v].nbytes for v in io.inputs + io.outputs)
    n_tiles, m_tiles = tiles(spec, p)
    if spec.rows is not None:
        nbytes += sum(2 * 4 * n for dt, n in row_workspace(spec.rows, spec.M, spec.N, n_tiles, m_tiles,
                                                           row_cluster(spec, p)) if dt == "float32")
    if not split_cluster(spec, p):     # the parts' running sum, written and read per part
        nbytes += 2 * 4 * spec.M * spec.N * (split_parts(p) - 1)
    return nbytes, 2 * spec.batch * spec.M * spec.N * spec.K + sum(program.node_flops(n) for n in io.nodes
                                                                   if n != spec.node)


def estimate(program: Program, node_ids, sm_count: int = 132) -> tuple[int, int]:
    """(bytes, flops) of the kernel generate_gemm writes for the region with its default params (the
    form the tuner tries first); CodegenError when it takes no such region."""
    from .region_io import region_io
    io = region_io(program, node_ids)
    spec = gemm_spec(program, io)
    return cost(program, io, spec, default_params(spec, sm_count))


def _copy(dst: str, src: str, op: Operand, rows: int, cols: int, row_at: str, col_at: str, lim_r: str,
          lim_c: str, stride: int, vector: bool, indent: str) -> list[str]:
    """C lines: rows x cols of the operand (tile row r is the operand's row row_at.format(r), column c its
    column col_at.format(c); zero past lim_r / lim_c) into dst (row stride `stride`) with cp.async."""
    if vector:
        per = cols // 4
        return [f"{indent}for (int e = tid; e < {rows * per}; e += kBlock) {{",
                f"{indent}  const int r = e / {per}, c = (e % {per}) * 4, gr = {row_at.format('r')}, "
                f"gc = {col_at.format('c')};",
                f"{indent}  const bool ok = gr < {lim_r} && gc < {lim_c};",
                f"{indent}  cp_async16({dst} + r * {stride} + c, ok ? {src} + ((long long)gr * {op.row_stride} + gc) : {src}, ok);",
                f"{indent}}}"]
    return [f"{indent}for (int e = tid; e < {rows * cols}; e += kBlock) {{",
            f"{indent}  const int r = e / {cols}, c = e % {cols}, gr = {row_at.format('r')}, gc = {col_at.format('c')};",
            f"{indent}  const bool ok = gr < {lim_r} && gc < {lim_c};",
            f"{indent}  cp_async4({dst} + r * {stride} + c, ok ? {src} + ((long long)gr * {op.row_stride} + "
            f"(long long)gc * {op.col_stride}) : {src}, ok);",
            f"{indent}}}"]


def _slice_head(slice_acc: bool) -> list[str]:
    """C lines: a zeroed accumulator for this k slice's products (slice_acc)."""
    if not slice_acc:
        return []
    return ["    float sacc[kMT][kNT][4];",
            "    #pragma unroll",
            "    for (int mt = 0; mt < kMT; ++mt)",
            "      #pragma unroll",
            "      for (int nt = 0; nt < kNT; ++nt) sacc[mt][nt][0] = sacc[mt][nt][1] = sacc[mt][nt][2] = sacc[mt][nt][3] = 0.0f;"]


def _slice_tail(slice_acc: bool) -> list[str]:
    """C lines: the slice's products added to the running sums by FADD, rounded to nearest. The tensor
    cores truncate each sum they accumulate; over K = 8192 that bias would build up along the whole
    reduction, here only within one k slice (a small partial), and the slices' sums round without bias."""
    if not slice_acc:
        return []
    return ["    #pragma unroll",
            "    for (int mt = 0; mt < kMT; ++mt)",
            "      #pragma unroll",
            "      for (int nt = 0; nt < kNT; ++nt)",
            "        #pragma unroll",
            "        for (int j = 0; j < 4; ++j) acc[mt][nt][j] += sacc[mt][nt][j];"]


def _epilogue(program: Program, io: RegionIO, spec: GemmSpec, arg: dict[str, str],
              shared_norm: bool = False) -> list[str]:
    """C lines of one output element's epilogue, inside the store loop: `mm` is the GEMM's value at
    (row, col), `i` its flat index. Broadcast operands are indexed from i. The input of a normalising
    op stays in the accumulator for the pass over the CTA's whole rows, or (shared_norm: CTAs share the
    rows) goes to the workspace for the row tile's last CTA."""
    names = Names()
    names.taken.update(LOCALS + ROW_LOCALS)
    names.taken.update(arg.values())
    env = {spec.halves[0]: "mm", spec.halves[1]: "mm2"} if spec.halves else {spec.out: "mm"}
    lines = operand_loads(program, io, spec.epilogue, spec.space, "i", arg, names, env, relabelled=True,
                          coords=_coords(spec))
    lines += _render(program, spec.epilogue, env, names)
    lines += [f"{arg[vid]}[i] = {env[vid]};" for vid in io.outputs if vid in spec.full_values]
    if spec.rows is not None:
        lines += fold_lines(spec.rows, env)
        if spec.rows.norms:       # the normalising pass reads it back from the accumulator or the workspace
            xe = env[spec.rows.norms[0].input]
            lines.append(f"workspace[kPreAt + i] = {xe};" if shared_norm else f"acc[mt][nt][j] = {xe};")
    return lines


def _coords(spec: GemmSpec) -> dict[int, str]:
    """The output dims whose coordinates the store loop has at hand (row, col): a convolution's image
    and channel, a 2-D GEMM's row and column; a gated unit's halves and a stack have none here."""
    if spec.halves:
        return {}
    if spec.conv is not None:
        return {0: "row / kS", 1: gemm_conv.channel(spec.conv)}
    return {0: "row", 1: "col"} if len(spec.space) == 2 and spec.batch == 1 else {}


def generate_gemm(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    spec = gemm_spec(program, io)
    p = {**default_params(spec, int((params or {}).get("sm_count") or 132)),
         **{k: v for k, v in (params or {}).items() if v is not None and k != "sm_count"}}
    p["form"] = FORM
    if spec.conv is not None:     # the tiles as merged: two CTAs a multiprocessor only where they fit
        p = _resident(p)
    bm, bn, bk, wm, wn, stages = _check(spec, p)
    slice_acc = p.get("slice_acc") is not False
    shared = shared_bytes(spec, p)
    if shared > SHARED_LIMIT:
        raise CodegenError(f"tile GEMM: {shared} bytes of shared memory for {bm} x {bn} x {bk} tiles in "
                           f"{stages} stages (at most {SHARED_LIMIT})")
    vals = program.values
    arg = {vid: f"in{j}" for j, vid in enumerate(io.inputs)}
    arg.update({vid: f"out{j}" for j, vid in enumerate(io.outputs)})
    cparams = [f"const {c_type(vals[v].dtype, vals[v].name)}* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"{c_type(vals[v].dtype, vals[v].name)}* __restrict__ {arg[v]}" for v in io.outputs]
    block = 32 * wm * wn
    kb = spec.b_k_contiguous
    conv = spec.conv
    ops = _operands(spec, p, arg)
    b_stride = bk + 4 if kb else bn + 8
    b_tile = bn * b_stride if kb else bk * b_stride
    numel = max([math.prod(spec.space)] + [math.prod(vals[v].shape) for v in io.inputs])
    consts = [f"typedef {index_type(numel)} index_t;",
              f"constexpr int kBlock = {block};",
              f"constexpr int kM = {spec.M}, kN = {spec.N}, kK = {spec.K};",
              f"constexpr int kBM = {bm}, kBN = {bn}, kBK = {bk};   // block tile",
              f"constexpr int kWarpsN = {wn};",
              f"constexpr int kTM = {bm // wm}, kTN = {bn // wn};   // warp tile",
              "constexpr int kMT = kTM / 16, kNT = kTN / 8;   // m16n8 fragments per warp",
              f"constexpr int kStages = {stages};",
              f"constexpr int kAS = kBK + 4, kBS = {b_stride};   // shared row strides (bank-conflict-free fragment reads)",
              f"constexpr int kATile = kBM * kAS, kBTile = {b_tile};"] + (gemm_conv.consts(conv) if conv else []) + \
             ([f"constexpr int kH = {spec.N // 2};   // the gated unit's width: B's columns kH.. are the gates",
               *GLU_COL] if spec.halves else [])
    n_tiles, m_tiles = tiles(spec, p)
    rows = spec.rows
    parts = split_parts(p)
    tma = p.get("mma") == gemm_tma.MMA
    cluster, parts_cluster = row_cluster(spec, p), split_cluster(spec, p)
    workspace = row_workspace(rows, spec.M, spec.N, n_tiles, m_tiles, cluster) if rows else []
    shared_norm = bool(rows and rows.norms and n_tiles > 1 and not cluster)    # its rows' inputs: the workspace
    if parts > 1 and not parts_cluster:        # the running sum of the parts so far, and each output tile's turn
        workspace = [("float32", spec.M * spec.N), ("int32", n_tiles * m_tiles)]
    if workspace:
        cparams += ["float* __restrict__ workspace", "unsigned int* __restrict__ counters"]
    if rows:
        consts += [f"constexpr int kF = {len(rows.fields)};   // floats of one row's statistics",
                   f"constexpr float kColsF = {float_literal(float(spec.N))};   // the reduced length (N)",
                   f"constexpr int kNTiles = {n_tiles};   // CTAs along N that share each row"]
        if shared_norm:
            consts.append("constexpr index_t kPreAt = (index_t)kNTiles * kM * kF;   // the workspace's [M, N] "
                          "normalising inputs, past the row states")
    row_tail = combine_lines(program, io, rows, arg, set(LOCALS) | set(ROW_LOCALS) | set(arg.values()),
                             n_tiles, cluster) if rows else []
    if rows and rows.norms and (spec.batch > 1 or conv is not None):
        raise CodegenError("tile GEMM: a normalising op after it runs on the mma.sync loop of one 2-D GEMM only")
    if tma:      # warp-specialised: producers copy (TMA) and split each slice, consumers issue its products
        consts += gemm_tma.consts(p)
        cparams = gemm_tma.PARAMS + cparams
        body = [*gemm_tma.kernel_lines(CLUSTER_TILE if cluster else GROUPED_TILE, bool(rows), p),
                *(_split_k_cluster(parts) if parts_cluster else _split_k_turn(parts, "cta_sync();") if parts > 1
                  else []),
                *_store_loop(program, io, spec, arg, shared_norm, OWNED if parts_cluster else ""), *row_tail,
                *(_normalise_loop(program, io, spec, arg, shared_norm) if rows and rows.norms else []),
                *(cluster_exit() if cluster or parts_cluster else [])]
    else:
        body = [
            "  extern __shared__ __align__(16) float smem[];",
            "  float* As = smem;                           // [kStages][kBM][kAS]",
            "  float* Bs = smem + kStages * kATile;        // [kStages][kBN][kBS] or [kStages][kBK][kBS]",
            "  const int tid = threadIdx.x, lane_g = (tid & 31) >> 2, lane_t = tid & 3;",
            "  const int warp_m = (tid >> 5) / kWarpsN, warp_n = (tid >> 5) % kWarpsN;",
            *(["  const int tile_m = blockIdx.x, tile_n = blockIdx.y;",
               "  const int bm = tile_m * kBM, bn = tile_n * kBN;", *ops.group, *gemm_conv.row_registers(conv)]
              if conv else [*GROUPED_TILE, "  const int bm = tile_m * kBM, bn = tile_n * kBN;", *ops.group]),
            *(["  // split K: this CTA's part of the reduction, k slices [kt0, kt0 + KT)",
               f"  const int kSlices = (kK + kBK - 1) / kBK, kPer = (kSlices + {parts} - 1) / {parts};",
               "  const int kt0 = blockIdx.z * kPer;"] if parts > 1 else []),
            "  auto load_tile = [&](int kt, int stage) {",
            "    const int k0 = " + ("(kt0 + kt) * kBK;" if parts > 1 else "kt * kBK;"),
            *ops.a_copy, *ops.b_copy,
            "  };",
            *(SPLIT_PIPELINE_START if parts > 1 else PIPELINE_START),
            *_mma_sync_loop(ops.b_frag, slice_acc, bool(p.get(TF32))),
            *(_split_k_turn(parts) if parts > 1 else []),
            *_store_loop(program, io, spec, arg, shared_norm),
            *row_tail,
            *(_normalise_loop(program, io, spec, arg, shared_norm) if rows and rows.norms else []),
        ]
    helpers = (PORTABLE_HELPERS if p.get("portable") else HELPERS).strip("\n").splitlines()
    if tma:
        helpers += gemm_tma.helpers(bn)
    if rows:
        helpers += state_code(rows)
    if rows or (tma and parts > 1):     # the barrier of the threads holding accumulators: the block's, or
        helpers += [                     # the TMA loop's consumers' (its producers have left)
            '__device__ __forceinline__ void cta_sync() { asm volatile("bar.sync 1, %0;" :: "n"(kBlock) : "memory"); }'
            if tma else "__device__ __forceinline__ void cta_sync() { __syncthreads(); }"]
    head, schedule = _describe(program, io, spec, p, name, shared, ops)
    min_blocks = int(p.get("min_blocks") or 1)
    kname = kernel_name(name)
    block += gemm_tma.PRODUCERS if tma else 0
    # a cluster's dims at compile time: an ordinary launch (CuPy, <<<>>>) starts the clusters
    dims = (" __cluster_dims__(kNTiles, 1, 1)" if cluster else
            f" __cluster_dims__(1, 1, {parts})" if parts_cluster else "")
    source = "\n".join([head, *consts, "", *helpers,
                        f'extern "C" __global__ void __launch_bounds__({block}, {min_blocks}){dims}\n'
                        f'{kname}({", ".join(cparams)}) {{', *body, "}", ""])
    nbytes, flops = cost(program, io, spec, p)
    return KernelSource(name=kname, kind="gemm", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
                        outputs=list(io.outputs),
                        grid=(m_tiles, n_tiles, conv.groups) if conv else (n_tiles, m_tiles, spec.batch * parts),
                        block=(block, 1, 1), shared_bytes=shared, schedule=schedule, params=p,
                        align=16 if (ops.a_vec or ops.b_vec or tma) else 4, bytes_moved=nbytes, flops=flops,
                        workspace=workspace, tensor_maps=gemm_tma.tensor_maps(spec, io.inputs, bm, bn) if tma else [],
                        alternatives=tma_alternatives(spec, p))


@dataclass
class _OperandLines:
    """How the kernel reaches its operands: the lines that pick this CTA's matrices (a group's weights,
    a batch's A and B), the cp.async copies of a k slice of A and of B into shared memory, the
    mma.sync loop's B fragment reads, and
    whether each operand is copied 16 bytes at a time."""
    group: list[str]
    a_copy: list[str]
    b_copy: list[str]
    b_frag: list[str]
    a_vec: bool
    b_vec: bool


def _operands(spec: GemmSpec, p: dict, arg: dict[str, str]) -> _OperandLines:
    bm, bn, bk = int(p["block_m"]), int(p["block_n"]), int(p["block_k"])
    kb, conv, b_rows = spec.b_k_contiguous, spec.conv, _b_rows(spec)
    a_vec = conv is None and _vector_ok(spec.a, spec.K)
    b_vec = _vector_ok(b_rows, spec.K if kb else spec.N // 2 if spec.halves else spec.N)
    n_at = "glu_col(bn, {})" if spec.halves else "bn + {}"     # tile column -> B's column
    b_stride = bk + 4 if kb else bn + 8
    a_src, b_src = arg[spec.a.value], arg[spec.b.value]
    group, b_src = gemm_conv.weight(conv, b_src) if conv else ([], b_src)
    if spec.batch > 1:       # this CTA's GEMM of the stack: its A and B matrices
        group = ["  const int bz = blockIdx.z;   // this CTA's GEMM of the stack"]
        for var, src, step in (("abat", a_src, spec.a_batch), ("bbat", b_src, spec.b_batch)):
            if step:
                group.append(f"  const float* {var} = {src} + (index_t)bz * {step};")
        a_src, b_src = ("abat" if spec.a_batch else a_src), ("bbat" if spec.b_batch else b_src)
    if kb:   # B tile [n][k]: the weight's rows are n, k contiguous
        b_copy = _copy("(Bs + stage * kBTile)", b_src, b_rows, bn, bk, n_at, "k0 + {}", "kN", "kK", b_stride, b_vec,
                       "    ")
        b_frag = ["        const float* pb = Bt + (warp_n * kTN + nt * 8 + lane_g) * kBS + kk + lane_t;",
                  "        split_tf32(pb[0], bh[nt][0], bl[nt][0]); split_tf32(pb[4], bh[nt][1], bl[nt][1]);"]
    else:    # B tile [k][n]
        b_copy = _copy("(Bs + stage * kBTile)", b_src, b_rows, bk, bn, "k0 + {}", n_at, "kK", "kN", b_stride, b_vec,
                       "    ")
        b_frag = ["        const float* pb = Bt + (kk + lane_t) * kBS + warp_n * kTN + nt * 8 + lane_g;",
                  "        split_tf32(pb[0], bh[nt][0], bl[nt][0]); split_tf32(pb[4 * kBS], bh[nt][1], bl[nt][1]);"]
    a_copy = (gemm_conv.gather_lines(conv, a_src, "    ") if conv else
              _copy("(As + stage * kATile)", a_src, spec.a, bm, bk, "bm + {}", "k0 + {}", "kM", "kK", bk + 4, a_vec,
                    "    "))
    return _OperandLines(group, a_copy, b_copy, b_frag, a_vec, b_vec)


def _store_loop(program: Program, io: RegionIO, spec: GemmSpec, arg: dict[str, str],
                shared_norm: bool = False, guard: str = "") -> list[str]:
    """C lines: the epilogue over the accumulators, one store per output element (the row statistics
    folded in where the region reduces rows). A gated unit's thread reads fragment 2q for the value (mm)
    and 2q + 1 for the gate (mm2) of one output column oc (glu_col)."""
    conv, vals = spec.conv, program.values
    epi = _epilogue(program, io, spec, arg, shared_norm)
    vector_bias = bool(spec.bias and vals[spec.bias].shape)
    if spec.halves:
        frag, count, col, col0, limit = "q", "kNT / 2", "oc", "bn / 2 + warp_n * (kTN / 2) + 2 * lane_t", "kH"
        index = ("const index_t i = ((index_t)(row / kS) * kH + oc) * kS + row % kS;" if conv else
                 "const index_t i = (index_t)row * kH + oc;")
        values = [("mm", "acc[mt][2 * q][j]", "oc"), ("mm2", "acc[mt][2 * q + 1][j]", "oc + kH")]
    else:
        frag, count, col, col0, limit = "nt", "kNT", "col", "bn + warp_n * kTN + 2 * lane_t", "kN"
        index = gemm_conv.store_index(conv) if conv else _store_index(spec)
        values = [("mm", "acc[mt][nt][j]", gemm_conv.channel(conv) if conv else "col")]
    bias = (lambda at: f" + {arg[spec.bias]}[{at if vector_bias else 0}]") if spec.bias else (lambda at: "")
    row_init = ["  RowSt rs[kMT][2];   // the states of this thread's fragment rows (g and g + 8 of each m16 tile)",
                "  #pragma unroll",
                "  for (int mt = 0; mt < kMT; ++mt) rs[mt][0] = rs[mt][1] = row_identity();"] if spec.rows else []
    return [
        "  // epilogue on the accumulators, one store per output element",
        f"  const int row0 = bm + warp_m * kTM + lane_g, {col}0 = {col0};",
        *row_init,
        *_each_element([*([index] if any(re.search(r"\bi\b", ln) for ln in epi) else []),
                        "const float " + ", ".join(f"{name} = {acc}{bias(at)}" for name, acc, at in values) + ";",
                        *epi], frag=frag, count=count, col=col, col0=f"{col}0", limit=limit, guard=guard),
    ]


def _each_element(body: list[str], row0: str = "row0", col0: str = "col0", frag: str = "nt", count: str = "kNT",
                  col: str = "col", limit: str = "kN", guard: str = "") -> list[str]:
    """C lines running `body` for every accumulator element this thread holds inside the output:
    fragment rows mt, columns `frag` (of `count`), elements j; `row` and `col` (named `col`) its place,
    from the thread's first row and column row0 and col0."""
    return [
        "  #pragma unroll",
        "  for (int mt = 0; mt < kMT; ++mt) {",
        "    #pragma unroll",
        f"    for (int {frag} = 0; {frag} < {count}; ++{frag}) {{",
        "      #pragma unroll",
        "      for (int j = 0; j < 4; ++j) {",
        f"        const int row = {row0} + mt * 16 + (j >> 1) * 8, {col} = {col0} + {frag} * 8 + (j & 1);",
        f"        if (row < kM && {col} < {limit}{' && ' + guard if guard else ''}) {{",
        *[f"          {ln}" for ln in body],
        "        }",
        "      }",
        "    }",
        "  }",
    ]


def _render(program: Program, order: list[str], env: dict[str, str], names: Names) -> list[str]:
    """The epilogue's SSA lines (pointwise.render_chain), a relabel (gemm_rows.RELABELS: the same
    elements in a new shape) naming its input's C value instead of a line of its own."""
    lines, run = [], []
    for nid in [*order, None]:
        if nid is not None and program.nodes[nid].op not in RELABELS:
            run.append(nid)
            continue
        lines += [ln.strip() for ln in render_chain(program, run, env, names, indent="")]
        run = []
        if nid is not None:
            node = program.nodes[nid]
            env[node.outputs[0]] = env[node.inputs[0]]
    return lines


def _normalise_loop(program: Program, io: RegionIO, spec: GemmSpec, arg: dict[str, str],
                    shared_norm: bool = False) -> list[str]:
    """C lines of the second pass of a normalising op (layer_norm, rms_norm, softmax, log_softmax) and
    the pointwise ops after it, each row's combined statistics in shared memory (combine_lines). Where the
    CTA holds whole rows, each accumulator holds the element the ops normalise (_epilogue), so the output
    is computed from registers and stored once, with no pass over memory in between. Where CTAs share
    the rows (shared_norm), the row tile's last CTA, once it has combined the rows' statistics, reads
    every element of its rows back from the workspace (written there by the tile's CTAs, hot in L2) and
    stores the output: one more read and write of the rows, against a second kernel's."""
    vals, part = program.values, spec.rows
    names = Names()
    names.taken.update(LOCALS + ROW_LOCALS + ("xe", "srow", "comb"))
    names.taken.update(arg.values())
    env = {part.norms[0].input: "xe"}
    lines = []
    k0 = len(part.reductions)         # the norms' states follow the reductions' in RowSt
    for k, n in enumerate(part.norms, start=k0):
        ident = names.new(vals[n.output].name)
        expr = n.expr.replace("WEIGHT[col]", f"{arg[n.weight]}[col]" if n.weight else "1.0f")
        expr = expr.replace("BIAS[col]", f"{arg[n.bias]}[col]" if n.bias else "0.0f")
        lines += [f"float {ident};   // {program.nodes[n.node].name}: {program.nodes[n.node].op}",
                  f"{{ const St_{n.state}& st = srow.s{k}; {n.pre} {ident} = {expr}; }}"]
        env[n.output] = ident
    lines += operand_loads(program, io, part.after, spec.space, "i", arg, names, env, relabelled=True)
    lines += _render(program, part.after, env, names)
    lines += [f"{arg[v]}[i] = {env[v]};" for v in io.outputs if v in part.after_values]
    def element(xe: str) -> list[str]:    # one element's pass, its input read from xe
        return [_store_index(spec), "const RowSt srow = row_get(comb + (row - bm) * kF);", f"const float xe = {xe};",
                *lines]
    if shared_norm:
        return [
            "  if (last) {   // the row tile's last CTA: every column of its rows, their inputs in the workspace",
            "    cta_sync();   // every row's combined statistics are in shared memory",
            "    const float* comb = red + kWarpsN * kBM * kF;",
            "    for (index_t e = tid; e < (index_t)kBM * kN; e += kBlock) {",
            "      const int row = bm + (int)(e / kN), col = (int)(e % kN);",
            "      if (row < kM) {",
            *[f"        {ln}" for ln in element("__ldcg(workspace + kPreAt + i)")],
            "      }",
            "    }",
            "  }",
        ]
    return [
        "  cta_sync();   // every row's combined statistics are in shared memory",
        "  // the second pass: the normalising ops over the accumulators, which hold their input",
        "  const float* comb = red + kWarpsN * kBM * kF;",
        *_each_element(element("acc[mt][nt][j]")),
    ]


# a gated unit's B columns: a tile's 8-column groups alternate between the halves, so the two fragments
# nt = 2q and 2q + 1 of every thread hold the same output column of the value and of the gate
GLU_COL = [
    "// tile column c of the CTA whose tile starts at bn -> B's column (kN past the halves' end)",
    "__device__ __forceinline__ int glu_col(int bn, int c) {",
    "  const int oc = bn / 2 + ((c >> 4) << 3) + (c & 7);",
    "  return oc < kH ? oc + ((c >> 3) & 1) * kH : kN;",
    "}",
]


def _describe(program: Program, io: RegionIO, spec: GemmSpec, p: dict, name: str, shared: int,
              ops: _OperandLines) -> tuple[str, str]:
    """(the kernel's header comment, its schedule in words)."""
    vals, conv = program.values, spec.conv
    bm, bn, bk, wm, wn, stages = (int(p[k]) for k in ("block_m", "block_n", "block_k", "warps_m", "warps_n",
                                                       "stages"))
    tma = p.get("mma") == gemm_tma.MMA
    node = program.nodes[spec.node]
    b_words = "transposed in place ([N, K], k contiguous)" if spec.b_k_contiguous else "[K, N]"
    stack = f"{spec.batch} x " if spec.batch > 1 else ""
    a_words = f"A [{stack}{spec.M}, {spec.K}] row-major" + (" (one matrix for every GEMM)" if spec.batch > 1 and
                                                             not spec.a_batch else "")
    title = f"{node.op} {stack}{spec.M} x {spec.N} x {spec.K}"
    if conv:
        a_words = (f"A [{spec.M}, {spec.K}] = the input's patches ({conv.words()}), gathered into shared "
                   f"memory slice by slice, never written out")
        title = f"{node.op} as an implicit GEMM {spec.M} x {spec.N} x {spec.K}"
    n_tiles, _ = tiles(spec, p)
    if tma:
        loop_words = (f"tile GEMM, 3xTF32 wgmma m64n{bn}k8, warp-specialised: 2 producer warpgroups copy each "
                      f"{bk}-wide k slice (TMA) and split B's in shared memory, {plural(bm // 64, 'consumer warpgroup')} "
                      f"(64 x {bn} each) issue its products: {bm} x {bn} block tiles, a {stages}-stage mbarrier ring, ")
    else:
        loop_words = (f"tile GEMM, {'TF32' if p.get(TF32) else '3xTF32'} mma.sync m16n8k8: {bm} x {bn} block tiles "
                      f"of {wm} x {wn} warps ({bm // wm} x {bn // wn} each), {bk}-wide k slices in a {stages}-stage "
                      f"cp.async pipeline, ")
    schedule = (("implicit-GEMM convolution, " if conv else f"{spec.batch} GEMMs along grid z, " if spec.batch > 1
                 else "") + loop_words + f"B {b_words}, "
                + (f"its two halves' columns side by side in each thread (a gated unit of {spec.N // 2}), "
                   if spec.halves else "")
                + ((f"K cut into {split_parts(p)} parts, one cluster, each adding up its share of the tile, "
                    if split_cluster(spec, p) else
                    f"K cut into {split_parts(p)} parts that add up in turn through the workspace, ")
                   if split_parts(p) > 1 else "")
                + f"{len(spec.epilogue)} epilogue op(s) fused" + (" and the bias" if spec.bias else "")
                + (_row_words(program, spec, n_tiles, row_cluster(spec, p)) if spec.rows else ""))
    precision = ("TF32, as the program allows: x rounded to TF32 in registers, a_hi b_hi accumulated in fp32 "
                 "(about 1e-3 relative; not fp32-accurate)." if p.get(TF32) else
                 "3xTF32: A's hi = x rounded to TF32, lo = x - hi, split in the consumers' registers; B's hi = x read "
                 "as TF32 (its top 19 bits), lo = the rest rounded, split in shared memory by the producers; a_lo b_hi + a_hi b_lo + a_hi b_hi summed on the tensor cores over "
                 f"{gemm_tma.slices_per_sum(p) * bk} k, then added to the running sums in fp32." if tma else
                 "3xTF32: hi = x rounded to TF32, lo = x - hi, both split in registers; a_hi b_hi + a_hi b_lo + "
                 "a_lo b_hi accumulated in fp32.")
    head = header(program, f"Region {name}: {title} with its epilogue, "
                           f"{'TF32' if p.get(TF32) else 'split-TF32'} tensor cores", io.nodes, [
        f"{a_words}, B {b_words}{', bias [N]' if spec.bias else ''}; "
        f"outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.outputs),
        f"Schedule: {schedule}.",
        f"{shared} bytes of shared memory; " + ("TMA copies of A and B." if tma else
                                                f"{'16' if ops.a_vec else '4'}-byte copies of A, "
                                                f"{'16' if ops.b_vec else '4'}-byte copies of B."),
        precision])
    return head, schedule


# Which output tile a CTA computes: the grid's tiles in groups of kGroupM M tiles, walked down each N tile
# of the group before the next (Triton's grouped order). CTAs running at once then share a few row
# panels of A and column panels of B in L2 instead of sweeping all of B for each row of tiles. In the
# warp-specialised TMA loop this order took 4096^3 from 0.80x to 0.92x of cuBLAS (tools/tma_gemm_probe.py);
# the mma.sync loop (and the register-A wgmma loop this replaced) timed the same either way (bench_tile_gemm, both H100,
# benchmarks/h100-2026-12-06-s20): their own issue rate bounds them, not L2.
GROUP_M = 8
GROUPED_TILE = [
    "  // this CTA's output tile, in groups of kGroupM M tiles walked down each N tile (L2 reuse)",
    f"  constexpr int kGroupM = {GROUP_M};",
    "  const int lin = blockIdx.y * gridDim.x + blockIdx.x, in_group = kGroupM * gridDim.x;",
    "  const int first_m = lin / in_group * kGroupM, group_m = min((int)gridDim.y - first_m, kGroupM);",
    "  const int tile_m = first_m + lin % in_group % group_m, tile_n = lin % in_group / group_m;",
]
# a cluster per row tile (row_cluster): its CTAs are the N tiles, in rank order
CLUSTER_TILE = ["  const int tile_m = blockIdx.y, tile_n = blockIdx.x;   // tile_n: this CTA's rank in its cluster"]

# both main loops start here: the k slices, the first kStages - 1 of them copied before the loop
PIPELINE_START = [
    "  const int KT = (kK + kBK - 1) / kBK;",
    "  #pragma unroll",
    "  for (int s = 0; s < kStages - 1; ++s) {   // the pipeline's first slices in flight",
    "    if (s < KT) load_tile(s, s);",
    "    cp_async_commit();",
    "  }"
]


SPLIT_PIPELINE_START = ["  const int KT = min(kPer, kSlices - kt0);   // this part's slices"] + PIPELINE_START[1:]


# a split-K part's CTA of the TMA loop finishes the output elements of its own share of the fragments
OWNED = "nt / (kNT / kParts) == (int)blockIdx.z"


def _split_k_cluster(parts: int) -> list[str]:
    """C lines after the TMA loop's main loop where K is cut into `parts` (one thread-block cluster of
    the output tile's parts along grid z): each part's CTA puts its sums in its shared memory (the ring,
    free by then), and after a cluster barrier adds, for its own share of the fragments (OWNED: kNT /
    kParts columns of 8), the sums of every part in part order: the same bits every launch, in parallel,
    no workspace. Only the owned elements go through the epilogue; the cluster leaves together
    (gemm_rows.cluster_exit), none while another may still read its sums."""
    return [
        f"  // split K: the {parts} parts of this output tile, one cluster, each finishing its share of it",
        f"  constexpr int kParts = {parts};",
        "  {",
        "    float* const part_sums = smem;   // [kNT][4][kBlock]: this part's sums, read by the cluster",
        "    cta_sync();   // every consumer is done with the ring",
        "    #pragma unroll",
        "    for (int nt = 0; nt < kNT; ++nt)",
        "      #pragma unroll",
        "      for (int j = 0; j < 4; ++j) part_sums[(nt * 4 + j) * kBlock + tid] = acc[0][nt][j];",
        "    __cluster_barrier_arrive();   // release: this part's sums, to the cluster",
        "    __cluster_barrier_wait();",
        "    #pragma unroll",
        "    for (int nt = 0; nt < kNT; ++nt) {",
        f"      if (!({OWNED})) continue;",
        "      #pragma unroll",
        "      for (int j = 0; j < 4; ++j) {",
        "        float s = 0.0f;",
        "        for (int q = 0; q < kParts; ++q)   // part order: the same bits whichever CTA adds them",
        "          s += static_cast<const float*>(__cluster_map_shared_rank(part_sums, q))[(nt * 4 + j) * kBlock + tid];",
        "        acc[0][nt][j] = s;",
        "      }",
        "    }",
        "    __cluster_barrier_arrive();   // done reading the cluster's sums",
        "  }",
    ]


def _split_k_turn(parts: int, sync: str = "__syncthreads();") -> list[str]:
    """C lines after the main loop of a split-K part: the parts of an output tile take turns in order
    (blockIdx.z; CTAs start in block order, so a part only waits for parts already running or done):
    each adds the running sum of those before it to its accumulators and, but for the last, stores it
    for the next and returns. The last goes on to the epilogue with the whole sum, added in the same
    order every launch, and resets the tile's turn for the next launch (and graph replay). sync: the
    barrier of the threads holding accumulators (the TMA loop's consumers: cta_sync). A cluster of the
    row tile's CTAs (row_cluster) is the same part of each tile: its CTAs return, or finish, together."""
    return [
        f"  // split K: {parts} parts of this output tile take turns, in order",
        "  {",
        "    const int part = blockIdx.z, turn = blockIdx.y * gridDim.x + blockIdx.x;",
        "    const int r0 = bm + warp_m * kTM + lane_g, c0 = bn + warp_n * kTN + 2 * lane_t;",
        "    if (part > 0) {",
        "      if (tid == 0) while (*(volatile unsigned int*)&counters[turn] != (unsigned)part) {}",
        f"      {sync}",
        "      __threadfence();",
        *_each_element(["acc[mt][nt][j] = __ldcg(workspace + (index_t)row * kN + col) + acc[mt][nt][j];"],
                       "r0", "c0"),
        "    }",
        f"    if (part < {parts} - 1) {{",
        *_each_element(["workspace[(index_t)row * kN + col] = acc[mt][nt][j];"], "r0", "c0"),
        "      __threadfence();",
        f"      {sync}",
        "      if (tid == 0) atomicExch(&counters[turn], (unsigned)(part + 1));",
        "      return;",
        "    }",
        "    if (tid == 0) counters[turn] = 0u;   // every part before has passed: ready for the next launch",
        "  }",
    ]


def _mma_sync_loop(b_frag: list[str], slice_acc: bool, single: bool = False) -> list[str]:
    """C lines after the pipeline's first copies (PIPELINE_START) to the accumulators' final values:
    mma.sync m16n8k8, three TF32 products per fragment pair, or one (a_hi b_hi: plain TF32) where single
    (the lo parts are then never used, and the compiler drops their splits)."""
    acc = "sacc" if slice_acc else "acc"
    product = (f"mma_tf32({acc}[mt][nt], ah[mt], bh[nt])" if single
               else f"mma_3xtf32({acc}[mt][nt], ah[mt], al[mt], bh[nt], bl[nt])")
    return [
        "  float acc[kMT][kNT][4];",
        "  #pragma unroll",
        "  for (int mt = 0; mt < kMT; ++mt)",
        "    #pragma unroll",
        "    for (int nt = 0; nt < kNT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;",
        "  for (int kt = 0; kt < KT; ++kt) {",
        "    cp_async_wait<kStages - 2>();   // slice kt has landed",
        "    __syncthreads();                // ... for every thread, and every warp is done with slice kt - 1",
        "    if (kt + kStages - 1 < KT) load_tile(kt + kStages - 1, (kt + kStages - 1) % kStages);",
        "    cp_async_commit();              // (an empty group at the tail keeps the count)",
        "    const float* At = As + (kt % kStages) * kATile;",
        "    const float* Bt = Bs + (kt % kStages) * kBTile;",
        *_slice_head(slice_acc),
        "    #pragma unroll",
        "    for (int kk = 0; kk < kBK; kk += 8) {",
        "      unsigned ah[kMT][4], al[kMT][4], bh[kNT][2], bl[kNT][2];",
        "      #pragma unroll",
        "      for (int mt = 0; mt < kMT; ++mt) {",
        "        const float* pa = At + (warp_m * kTM + mt * 16 + lane_g) * kAS + kk + lane_t;",
        "        split_tf32(pa[0], ah[mt][0], al[mt][0]); split_tf32(pa[8 * kAS], ah[mt][1], al[mt][1]);",
        "        split_tf32(pa[4], ah[mt][2], al[mt][2]); split_tf32(pa[8 * kAS + 4], ah[mt][3], al[mt][3]);",
        "      }",
        "      #pragma unroll",
        "      for (int nt = 0; nt < kNT; ++nt) {",
        *b_frag,
        "      }",
        "      #pragma unroll",
        "      for (int mt = 0; mt < kMT; ++mt)",
        "        #pragma unroll",
        f"        for (int nt = 0; nt < kNT; ++nt) {product};",
        "    }",
        *_slice_tail(slice_acc),
        "  }",
    ]


def _store_index(spec: GemmSpec) -> str:
    """The flat index of output element (row, col) of this CTA's GEMM."""
    row = "((index_t)bz * kM + row)" if spec.batch > 1 else "(index_t)row"
    return f"const index_t i = {row} * kN + col;"


def _row_words(program: Program, spec: GemmSpec, n_tiles: int, cluster: bool) -> str:
    """The schedule's words for the row reductions and normalising ops."""
    part = spec.rows
    ops = ", ".join(dict.fromkeys(program.nodes[r.node].op for r in part.reductions + part.norms))
    how = ("each CTA holds whole rows" if n_tiles == 1 else
           f"{n_tiles} CTAs per row, one thread-block cluster, each combining all their tile states in tile order"
           if cluster else
           f"{n_tiles} CTAs per row publish their tile's states, the row tile's last CTA combines them in tile order")
    if part.norms:
        how += (", normalised in a second pass over the accumulators"
                + (f" and {len(part.after)} op(s) after" if part.after else ""))
    return (f"; rows reduced in the kernel ({ops}"
            + (f", then {len(part.post)} op(s) per row" if part.post else "") + f"): {how}")


__all__ = ["FORM", "GemmSpec", "alternatives", "cost", "default_params", "estimate", "gemm_spec", "gemm_supported",
           "generate_gemm", "lone_gemm", "shared_bytes", "tiles", "tune_variants"]
