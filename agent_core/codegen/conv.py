"""Convolution regions, generated (the export has no cuDNN): one conv{1,2,3}d or conv_transpose{1,2,3}d
followed by pointwise ops, fused into one direct-convolution kernel.

Schedule: one thread per output position (or params["positions_per_thread"] consecutive ones along the
last axis, so each weight load feeds that many FMAs per channel) and a few output channels of one group
(grid-stride loop); for each input channel of the group (a runtime loop) the kernel window is walked
with compile-time bounds and unrolled, each input element loaded once and multiplied into every
channel's accumulator. A thread's consecutive positions share their inputs along the last axis: a row
of the window is loaded once (positions + taps - 1 values at stride 1), not once per position and tap.
params["stage_weights"]: each block takes one chunk of output channels (blockIdx.y) and first copies
their weights into shared memory as [input channel][tap][channel], so the inner loop reads them as
warp-wide broadcasts (float4s for 4 channels) instead of from global memory; with few input channels
(RGB: 3 x 27 taps) this lets a thread hold 8 or 16 channels' accumulators, each input load then
feeding that many FMAs.
Padding is skipped (zeros contribute nothing). A transposed convolution is a gather: output position o
reads input i where o + padding - k * dilation == i * stride. Each thread writes its own outputs, in a
fixed order: no atomics, the result is deterministic. The bias is added last, then the epilogue
(`store_point`) runs on each output element.

Weights are torch's layouts: [Cout, Cin/groups, *kernel] for a convolution, [Cin, Cout/groups,
*kernel] for a transposed one.
"""
from __future__ import annotations

import math

import networkx as nx

from ..ir import Program
from ..ops.common import ntuple
from .around import render_around
from .cuda import Names, header, index_type, kernel_name, kernel_source
from .kernel import CodegenError, KernelSource
from .pointwise import is_elementwise
from .region_io import RegionIO

CONV_OPS = tuple(f"conv{d}d" for d in (1, 2, 3)) + tuple(f"conv_transpose{d}d" for d in (1, 2, 3))
DEFAULTS = {"block": 256, "channels_per_thread": None, "sm_count": 132, "stage_weights": False}
# params["form"] that asks for this kernel where a region would run its convolution through cuDNN
DIRECT = "conv-direct"
# the agent also times this kernel against cuDNN (+ epilogue) for a convolution of at most this many
# products per output element (input channels per group x taps: RGB 3x3x3 = 27, 8 x 3x3x3 = 216), where
# cuDNN's fp32 has little to gain from its tiling; a deeper reduction is left to cuDNN and the implicit GEMM
DIRECT_MAX_REDUCTION = 256
DIRECT_POSITIONS = 4       # consecutive output positions a thread of that form computes (rows of 8 or more)
# channel counts a thread may accumulate at once, most first (acc[] stays in registers)
CHANNEL_CHOICES = (4, 2, 1)
# with its weights staged in shared memory a thread holds more channels (each input load feeds them all)
STAGED_CHANNEL_CHOICES = (16, 8, 4, 2, 1)
STAGE_BYTES = 48 << 10     # static shared memory a block may stage
# blocks resident per SM at most (2048 threads per SM on sm_90): the grid-stride loop's grid cap
MAX_THREADS_PER_SM = 2048


def _ints(value, d: int, what: str, node) -> list[int]:
    try:
        out = ntuple(value, d, what)
    except Exception as exc:  # ShapeError from ntuple, TypeError from a non-list
        raise CodegenError(f"{node.name} ({node.op}): {what} {value!r} is not {d} integer(s) ({exc})",
                           node_id=node.id) from None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in out):
        raise CodegenError(f"{node.name} ({node.op}): {what} {value!r} is not {d} integer(s)", node_id=node.id)
    return out


def conv_geometry(node, d: int, kernel: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """(stride, padding before each dim, dilation, output_padding) of a conv node, as ints.

    padding='valid' is 0; padding='same' (stride 1) is resolved the way torch does it: the total
    dilation * (k - 1) is split with the smaller half before the input and the rest after it, which
    the kernel gets for free because it only needs the padding before (taps past the end are skipped).
    """
    a = node.attrs
    mode = a.get("padding_mode", "zeros")
    if mode != "zeros":
        raise CodegenError(f"{node.name} ({node.op}): padding_mode '{mode}' is not generated (only zeros)",
                           node_id=node.id)
    stride = _ints(a.get("stride", 1), d, "stride", node)
    dil = _ints(a.get("dilation", 1), d, "dilation", node)
    pad = a.get("padding", 0)
    if pad == "valid":
        pad = [0] * d
    elif pad == "same" and not node.op.startswith("conv_transpose"):
        if any(s != 1 for s in stride):
            raise CodegenError(f"{node.name} ({node.op}): padding='same' needs stride 1, got {stride}",
                               node_id=node.id)
        pad = [dl * (k - 1) // 2 for dl, k in zip(dil, kernel)]
    elif isinstance(pad, str):
        raise CodegenError(f"{node.name} ({node.op}): padding '{pad}' is not resolved to integers",
                           node_id=node.id)
    pad = _ints(pad, d, "padding", node)
    outpad = _ints(a.get("output_padding", 0), d, "output_padding", node)
    if min(stride) < 1 or min(dil) < 1 or min(pad) < 0 or min(outpad) < 0:
        raise CodegenError(f"{node.name} ({node.op}): stride {stride} and dilation {dil} must be positive, "
                           f"padding {pad} and output_padding {outpad} non-negative", node_id=node.id)
    return stride, pad, dil, outpad


def _channels_per_thread(p: dict, cout_g: int, positions: int, staged_floats_per_channel: int = 0) -> int:
    """Output channels per thread: the most of CHANNEL_CHOICES (STAGED_CHANNEL_CHOICES when the weights
    are staged, as many as fit STAGE_BYTES) that divides Cout/groups while still leaving enough threads
    (half a full GPU's worth) to hide latency."""
    want = p.get("channels_per_thread")
    if want is not None:
        want = int(want)
        if want < 1 or cout_g % want:
            raise CodegenError(f"channels_per_thread={want} must divide the {cout_g} output channels per group")
        if want * staged_floats_per_channel * 4 > STAGE_BYTES:
            raise CodegenError(f"channels_per_thread={want}: their staged weights would take more than "
                               f"{STAGE_BYTES >> 10} KB of shared memory")
        return want
    min_threads = p["sm_count"] * MAX_THREADS_PER_SM // 2
    for c in STAGED_CHANNEL_CHOICES if staged_floats_per_channel else CHANNEL_CHOICES:
        if cout_g % c == 0 and positions * (cout_g // c) >= min_threads and \
                c * staged_floats_per_channel * 4 <= STAGE_BYTES:
            return c
    if staged_floats_per_channel * 4 > STAGE_BYTES:
        raise CodegenError(f"one output channel's weights ({staged_floats_per_channel} floats) would take more "
                           f"than {STAGE_BYTES >> 10} KB of shared memory: not staged")
    return 1


def direct_alternative(program: Program, io: RegionIO) -> list[dict]:
    """[params of this kernel] for a region whose convolution would run through cuDNN and whose
    reduction per output element is short (DIRECT_MAX_REDUCTION): the tuner times it against the
    library form and keeps the faster; [] otherwise."""
    convs = [n for n in io.nodes if program.nodes[n].op in CONV_OPS]
    if len(convs) != 1 or any(n not in convs and not is_elementwise(program.nodes[n]) for n in io.nodes):
        return []
    cn = program.nodes[convs[0]]
    w = program.values[cn.inputs[1]].shape
    transposed = cn.op.startswith("conv_transpose")
    per_group_in = w[0] // int(cn.attrs.get("groups", 1)) if transposed else w[1]
    if per_group_in * math.prod(w[2:]) > DIRECT_MAX_REDUCTION:
        return []
    # 4 positions a thread where its rows allow: each weight load then feeds 4 x channels FMAs, not 1 x
    blocked = not transposed and program.values[cn.outputs[0]].shape[-1] >= 2 * DIRECT_POSITIONS
    form = {"form": DIRECT, **({"positions_per_thread": DIRECT_POSITIONS} if blocked else {})}
    # the weights staged in shared memory first: more channels a thread, each input load feeding them all
    return [{**form, "stage_weights": True}, form]


def generate_conv(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    p = {**DEFAULTS, **(params or {})}
    vals, nodes = program.values, program.nodes
    convs = [n for n in io.nodes if nodes[n].op in CONV_OPS]
    if len(convs) != 1:
        what = ", ".join(f"{nodes[n].name} ({nodes[n].op})" for n in convs) or "none"
        raise CodegenError(f"a convolution region holds exactly one conv/conv_transpose followed by pointwise "
                           f"ops; this one has {len(convs)}: {what}")
    cn = nodes[convs[0]]
    others = [n for n in io.nodes if n != cn.id and not is_elementwise(nodes[n])]
    if others:
        what = ", ".join(f"{nodes[n].name} ({nodes[n].op})" for n in others)
        raise CodegenError(f"only pointwise ops may follow {cn.name} ({cn.op}) in a generated convolution; "
                           f"split the region before {what}")
    transposed = cn.op.startswith("conv_transpose")
    d = int(cn.op[-2])
    x_vid, w_vid = cn.inputs[0], cn.inputs[1]
    b_vid = cn.inputs[2] if len(cn.inputs) > 2 else None
    y_vid = cn.outputs[0]
    x, w, y = vals[x_vid], vals[w_vid], vals[y_vid]
    for port, vid in (("input", x_vid), ("weight", w_vid), ("bias", b_vid)):
        if vid is not None and vid not in io.inputs:
            raise CodegenError(f"{cn.name} ({cn.op}): its {port} '{vals[vid].name}' is computed inside the "
                               f"region; only pointwise ops after the convolution are fused", node_id=cn.id)
    for vid in dict.fromkeys([x_vid, w_vid, y_vid, *([b_vid] if b_vid else []), *io.inputs, *io.outputs]):
        if vals[vid].dtype != "float32":
            raise CodegenError(f"'{vals[vid].name}' has dtype {vals[vid].dtype}; convolution kernels are "
                               f"generated for float32 only")
    for what, v in (("input", x), ("weight", w), ("output", y)):
        if math.prod(v.shape) == 0:
            raise CodegenError(f"{cn.name} ({cn.op}): its {what} '{v.name}' {v.spec} is empty; there is "
                               f"nothing to launch", node_id=cn.id)
    g = program.graph().subgraph(io.nodes)
    epi = [n for n in io.nodes if n in nx.descendants(g, cn.id)]
    if len(epi) + 1 != len(io.nodes):
        stray = [nodes[n].name for n in io.nodes if n != cn.id and n not in epi]
        raise CodegenError(f"every other op of a convolution region must follow {cn.name}; "
                           f"{', '.join(stray)} do(es) not: split the region")
    out_numel = math.prod(y.shape)
    for v in io.outputs:
        if math.prod(vals[v].shape) != out_numel:
            raise CodegenError(f"output '{vals[v].name}' {vals[v].spec} is not the size of the convolution's "
                               f"output {y.spec}; split the region there")

    # shapes: x [N, Cin, *in], y [N, Cout, *out] (unbatched tensors are a batch of one)
    kernel = list(w.shape[2:])
    stride, pad, dil, outpad = conv_geometry(cn, d, kernel)
    groups = int(cn.attrs.get("groups", 1))
    batch = x.shape[0] if len(x.shape) == d + 2 else 1
    cin, sin, sout = x.shape[-d - 1], list(x.shape[-d:]), list(y.shape[-d:])
    cout = y.shape[-d - 1]
    cin_g, cout_g = (cin // groups, cout // groups) if groups >= 1 else (0, 0)
    if groups < 1 or cin_g * groups != cin or cout_g * groups != cout:
        raise CodegenError(f"{cn.name} ({cn.op}): groups={groups} does not divide {cin} input and {cout} "
                           f"output channels", node_id=cn.id)
    kvol, in_sp, out_sp = math.prod(kernel), math.prod(sin), math.prod(sout)

    block = int(p["block"])
    ppt = int(p.get("positions_per_thread") or 1)
    if ppt < 1 or (ppt > 1 and transposed):
        raise CodegenError(f"positions_per_thread={ppt}: a convolution's thread takes 1 or more consecutive "
                           f"positions, a transposed one's exactly 1 (its taps hit the positions unevenly)")
    inner_groups = math.ceil(sout[-1] / ppt)
    pos_groups = out_sp // sout[-1] * inner_groups
    staged = bool(p.get("stage_weights"))
    cpt = _channels_per_thread(p, cout_g, batch * pos_groups, cin_g * kvol if staged else 0)
    chunks = cout // cpt
    resident = p["sm_count"] * (MAX_THREADS_PER_SM // block)       # the grid-stride loop's grid cap
    if staged:      # blockIdx.y: the channel chunk whose weights the block stages
        grid = (max(1, min(math.ceil(batch * pos_groups / block), max(1, resident // chunks))), chunks, 1)
    else:
        grid = (max(1, min(math.ceil(batch * pos_groups * chunks / block), resident)), 1, 1)
    # a thread's positions share the window's inputs along the last axis: one row of kSpan loads
    sliding = ppt > 1 and not transposed

    axes = "dhw"[-d:] if d > 1 else "l"
    ax_u = [a.upper() for a in axes]
    kname = kernel_name(name)
    names = Names()  # kernel arguments must not shadow the kernel's locals or its name
    names.taken.add(kname)
    names.taken.update(("o", "q", "acc", "c", "g", "ci", "co0", "nb", "chunk", "pos", "out_base", "x_base",
                        "w_base", "xc", "wc", "xv", "wv", "oc", "tap", "point", "store_point", "pg", "outer", "p"))
    names.taken.update(f"{v}{ax}" for v in "oikt" for ax in axes)
    wr = render_around(program, io, [], epi, x_vid, y_vid, names, "unused (a convolution has no prologue).",
                       "one convolution output element (bias added) to the region's outputs.")
    arg, epi_inputs, ld_epi, epi_fn = wr.arg, wr.epi_inputs, wr.ld_epi, wr.epi_fn

    big = max(math.prod(x.shape), math.prod(w.shape), out_numel)
    index_t = index_type(big)
    consts = [f"typedef {index_t} index_t;",
              f"constexpr int kBatch = {batch}, kCin = {cin}, kCout = {cout}, kGroups = {groups};",
              f"constexpr int kCinPerGroup = {cin_g}, kCoutPerGroup = {cout_g};",
              f"constexpr int kInSpatial = {in_sp}, kOutSpatial = {out_sp}, kKernelVolume = {kvol};"]
    for j, u in enumerate(ax_u):
        consts.append(f"constexpr int kIn{u} = {sin[j]}, kOut{u} = {sout[j]}, kK{u} = {kernel[j]}, "
                      f"kS{u} = {stride[j]}, kP{u} = {pad[j]}, kD{u} = {dil[j]};")
    if transposed:  # weight [Cin, Cout/groups, *kernel]
        consts.append("constexpr index_t kWeightStrideCo = kKernelVolume, "
                      "kWeightStrideCi = kCoutPerGroup * kKernelVolume;  // weight [Cin, Cout/groups, *kernel]")
    else:  # weight [Cout, Cin/groups, *kernel]
        consts.append("constexpr index_t kWeightStrideCo = kCinPerGroup * kKernelVolume, "
                      "kWeightStrideCi = kKernelVolume;  // weight [Cout, Cin/groups, *kernel]")
    last = ax_u[-1]
    consts += [f"constexpr int kChannelsPerThread = {cpt}, kChannelChunks = kCout / kChannelsPerThread;",
               f"constexpr int kPositions = {ppt};   // consecutive output positions along {axes[-1]} per thread",
               f"constexpr int kInnerGroups = (kOut{last} + kPositions - 1) / kPositions;",
               f"constexpr index_t kPosGroups = (index_t)(kOutSpatial / kOut{last}) * kInnerGroups;",
               "constexpr index_t kThreads = (index_t)kBatch * kPosGroups"
               + (";  // per channel chunk (blockIdx.y)" if staged else " * kChannelChunks;"),
               f"constexpr int kBlock = {block};"]
    if sliding:
        consts.append(f"constexpr int kSpan = (kPositions - 1) * kS{last} + (kK{last} - 1) * kD{last} + 1;"
                      f"  // inputs a window row's taps read for a thread's positions")
    if staged:
        consts.append("constexpr int kStaged = kCinPerGroup * kKernelVolume * kChannelsPerThread;"
                      "  // the chunk's weights, [ci][tap][c]")
    consts += ld_epi.consts

    xp, wp = arg[x_vid], arg[w_vid]
    w_base = ("(index_t)g * kCinPerGroup * kWeightStrideCi + (index_t)(co0 - g * kCoutPerGroup) * kWeightStrideCo"
              if transposed else "(index_t)co0 * kWeightStrideCo")
    if staged:
        body = ["  __shared__ __align__(16) float ws[kStaged];",
                "  const int co0 = (int)blockIdx.y * kChannelsPerThread;  // the block's first output channel",
                "  const int g = co0 / kCoutPerGroup;  // its group (the chunk never straddles two)",
                "  {",
                f"    const index_t w_base = {w_base};",
                "    for (int e = threadIdx.x; e < kStaged; e += blockDim.x) {",
                "      const int c = e % kChannelsPerThread, tap = (e / kChannelsPerThread) % kKernelVolume;",
                "      const int ci = e / (kChannelsPerThread * kKernelVolume);",
                f"      ws[e] = {wp}[w_base + (index_t)ci * kWeightStrideCi + (index_t)c * kWeightStrideCo + tap];",
                "    }",
                "  }",
                "  __syncthreads();",
                "  const index_t stride = (index_t)gridDim.x * blockDim.x;",
                "  for (index_t o = (index_t)blockIdx.x * blockDim.x + threadIdx.x; o < kThreads; o += stride) {",
                "    // o -> (batch nb, positions pos..pos + kPositions - 1 along the last axis); neighbouring",
                "    // threads take neighbouring positions, so input reads and output writes are coalesced",
                "    const index_t pg = o % kPosGroups;",
                "    const index_t nb = o / kPosGroups;"]
    else:
        body = ["  const index_t stride = (index_t)gridDim.x * blockDim.x;",
                "  for (index_t o = (index_t)blockIdx.x * blockDim.x + threadIdx.x; o < kThreads; o += stride) {",
                "    // o -> (batch nb, channel chunk, positions pos..pos + kPositions - 1 along the last axis);",
                "    // neighbouring threads take neighbouring positions, so input reads and output writes are",
                "    // coalesced and weights are warp-uniform",
                "    const index_t pg = o % kPosGroups;",
                "    const index_t q = o / kPosGroups;",
                "    const int chunk = (int)(q % kChannelChunks);",
                "    const index_t nb = q / kChannelChunks;",
                "    const int co0 = chunk * kChannelsPerThread;  // first output channel of this thread",
                "    const int g = co0 / kCoutPerGroup;  // its group (the chunk never straddles two)"]
    body += [f"    const int o{axes[-1]} = (int)(pg % kInnerGroups) * kPositions;  // its first position's {axes[-1]}",
            "    const index_t outer = pg / kInnerGroups;  // the other axes' position",
            f"    const index_t pos = outer * kOut{last} + o{axes[-1]};"]
    for j, (ax, u) in enumerate(zip(axes[:-1], ax_u[:-1])):
        inner = " * ".join(f"kOut{ax_u[i]}" for i in range(j + 1, d - 1))
        qexpr = "outer" if not inner else f"outer / ({inner})" if "*" in inner else f"outer / {inner}"
        if j > 0:  # the outermost coordinate needs no modulo
            qexpr = f"{qexpr if qexpr == 'outer' else f'({qexpr})'} % kOut{u}"
        body.append(f"    const int o{ax} = (int)({qexpr});")
    body += ["    const index_t x_base = (nb * kCin + (index_t)g * kCinPerGroup) * kInSpatial;"]
    if not staged:
        body.append(f"    const index_t w_base = {w_base};")
    body += ["    float acc[kChannelsPerThread][kPositions];",
             "#pragma unroll",
             "    for (int c = 0; c < kChannelsPerThread; ++c)",
             "#pragma unroll",
             "      for (int p = 0; p < kPositions; ++p) acc[c][p] = 0.0f;",
             "    for (int ci = 0; ci < kCinPerGroup; ++ci) {  // runtime loop over the group's input channels",
             f"      const float* xc = {xp} + x_base + (index_t)ci * kInSpatial;"]
    if not staged:
        body.append(f"      const float* wc = {wp} + w_base + (index_t)ci * kWeightStrideCi;")
    in_pos = " + ".join(f"i{ax}" + "".join(f" * kIn{ax_u[i]}" for i in range(j + 1, d)) for j, ax in enumerate(axes))
    la, lu = axes[-1], ax_u[-1]
    indent = "      "
    for j, (ax, u) in enumerate(zip(axes, ax_u)):
        if sliding and j == d - 1:   # the row's inputs, once for every position and tap (zero in the padding)
            body += [f"{indent}float xs[kSpan];",
                     f"{indent}#pragma unroll",
                     f"{indent}for (int s = 0; s < kSpan; ++s) {{",
                     f"{indent}  const int i{la} = o{la} * kS{lu} - kP{lu} + s;",
                     f"{indent}  xs[s] = i{la} >= 0 && i{la} < kIn{lu} ? xc[{in_pos}] : 0.0f;",
                     f"{indent}}}"]
        body += [f"{indent}#pragma unroll", f"{indent}for (int k{ax} = 0; k{ax} < kK{u}; ++k{ax}) {{"]
        indent += "  "
        if transposed:
            if stride[j] == 1:
                body += [f"{indent}const int i{ax} = o{ax} + kP{u} - k{ax} * kD{u};  // the input this tap reads",
                         f"{indent}if (i{ax} < 0 || i{ax} >= kIn{u}) continue;"]
            else:
                body += [f"{indent}const int t{ax} = o{ax} + kP{u} - k{ax} * kD{u};  // == i * stride on a hit",
                         f"{indent}if (t{ax} < 0 || t{ax} % kS{u} != 0) continue;",
                         f"{indent}const int i{ax} = t{ax} / kS{u};",
                         f"{indent}if (i{ax} >= kIn{u}) continue;"]
        elif j < d - 1 or ppt == 1:
            body += [f"{indent}const int i{ax} = o{ax} * kS{u} - kP{u} + k{ax} * kD{u};",
                     f"{indent}if (i{ax} < 0 || i{ax} >= kIn{u}) continue;  // zero padding adds nothing"]
    k_pos = " + ".join(f"k{ax}" + "".join(f" * kK{ax_u[i]}" for i in range(j + 1, d)) for j, ax in enumerate(axes))
    if ppt == 1:
        body += [f"{indent}const float xv[1] = {{xc[{in_pos}]}};"]
    else:     # each of the thread's positions takes its input from the row (past the row's end: never stored)
        body += [f"{indent}float xv[kPositions];",
                 f"{indent}#pragma unroll",
                 f"{indent}for (int p = 0; p < kPositions; ++p) xv[p] = xs[p * kS{lu} + k{la} * kD{lu}];"]
    body.append(f"{indent}const int tap = {k_pos};")
    if staged and cpt % 4 == 0:   # 4 channels' weights in one broadcast float4 load
        body += [f"{indent}const float4* w4 = reinterpret_cast<const float4*>(ws + (ci * kKernelVolume + tap) "
                 f"* kChannelsPerThread);",
                 f"{indent}#pragma unroll",
                 f"{indent}for (int c4 = 0; c4 < kChannelsPerThread / 4; ++c4) {{",
                 f"{indent}  const float4 w = w4[c4];",
                 f"{indent}#pragma unroll",
                 f"{indent}  for (int p = 0; p < kPositions; ++p) {{",
                 f"{indent}    acc[4 * c4][p] += xv[p] * w.x;",
                 f"{indent}    acc[4 * c4 + 1][p] += xv[p] * w.y;",
                 f"{indent}    acc[4 * c4 + 2][p] += xv[p] * w.z;",
                 f"{indent}    acc[4 * c4 + 3][p] += xv[p] * w.w;",
                 f"{indent}  }}",
                 f"{indent}}}"]
    else:
        wv = "ws[(ci * kKernelVolume + tap) * kChannelsPerThread + c]" if staged else "wc[c * kWeightStrideCo + tap]"
        body += [f"{indent}#pragma unroll",
                 f"{indent}for (int c = 0; c < kChannelsPerThread; ++c) {{  // a weight feeds every position",
                 f"{indent}  const float wv = {wv};",
                 f"{indent}#pragma unroll",
                 f"{indent}  for (int p = 0; p < kPositions; ++p) acc[c][p] += xv[p] * wv;",
                 f"{indent}}}"]
    for _ in axes:
        indent = indent[:-2]
        body.append(f"{indent}}}")
    body += ["    }",
             "    const index_t out_base = (nb * kCout + co0) * kOutSpatial + pos;",
             "#pragma unroll",
             "    for (int c = 0; c < kChannelsPerThread; ++c) {",
             "#pragma unroll",
             "      for (int p = 0; p < kPositions; ++p) {",
             f"        if (o{axes[-1]} + p >= kOut{last}) break;  // past the row's end",
             "        const index_t oc = out_base + (index_t)c * kOutSpatial + p;"]
    value = f"acc[c][p] + {arg[b_vid]}[co0 + c]" if b_vid else "acc[c][p]"
    call = [value] + [ld_epi.load(v, arg[v], "oc") for v in epi_inputs] + [f"{arg[v]}[oc]" for v in io.outputs]
    body += [f"        store_point({', '.join(call)});", "      }", "    }", "  }"]

    cparams = [f"const float* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"float* __restrict__ {arg[v]}" for v in io.outputs]
    window = "x".join(map(str, kernel))
    per = "output position" if ppt == 1 else f"{ppt} consecutive output positions"
    blocks = f"{grid[0]} x {grid[1]} blocks (positions x channel chunks)" if staged else f"{grid[0]} blocks"
    sched = (f"one thread per {per} and {cpt} output channel(s), runtime loop over {cin_g} input "
             f"channel(s) per group, unrolled {window} window{' gather' if transposed else ''}"
             f"{', its weights staged in shared memory' if staged else ''}, {blocks} of {block}")
    geometry = f"stride {stride}, padding {pad}, dilation {dil}, groups {groups}"
    if transposed:
        geometry += f", output_padding {outpad}"
    head = header(program, f"Region {name}: {cn.op} {list(x.shape)} * {list(w.shape)} -> {list(y.shape)}"
                           f"{' + bias' if b_vid else ''} with {len(epi)} epilogue op(s)", io.nodes, [
        "Inputs:  " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.inputs),
        "Outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.outputs),
        f"weight layout {'[Cin, Cout/groups, *kernel]' if transposed else '[Cout, Cin/groups, *kernel]'}; "
        f"kernel {kernel}, {geometry}.",
        f"schedule: {sched}.",
    ])
    source = kernel_source(head, consts, [*ld_epi.helpers, epi_fn], kname, cparams, body)
    return KernelSource(
        name=kname, kind="convolution", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=grid, block=(block, 1, 1), schedule=sched,
        params={"grid": grid[0], "block": block, "channels_per_thread": cpt, "positions_per_thread": ppt,
                "sm_count": p["sm_count"], "stage_weights": staged,
                **({"form": DIRECT} if p.get("form") == DIRECT else {})},
        align=4, bytes_moved=sum(vals[v].nbytes for v in io.inputs + io.outputs),
        flops=sum(program.node_flops(n) for n in io.nodes))
