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
reads input i where o + padding - k * dilation == i * stride, so the outputs o = q * stride + r of one
residue r read the same taps, tap k reading input q + (r + padding - k * dilation) / stride: along the
axes before the last each block takes one residue (a phase, blockIdx.z) and reads only its taps; along
the last a thread takes every residue of its positions (stride x positions consecutive outputs), each
residue's taps written out. Each thread writes its own outputs, in a fixed order: no atomics, the
result is deterministic. The bias is added last, then the epilogue
(`store_point`) runs on each output element.

Weights are torch's layouts: [Cout, Cin/groups, *kernel] for a convolution, [Cin, Cout/groups,
*kernel] for a transposed one.
"""
from __future__ import annotations

import math

import networkx as nx

from ..ir import Program
from ..ops.common import ntuple
from .around import render_around, trailing_views
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
# a transposed convolution's (input channels per group x the taps of one phase): cuDNN's fp32 runs level
# 2's transposed 3-D convolutions at about 5 TFLOPS (49_ConvTranspose3d_Softmax_Sigmoid: about 5.4 ms for
# 29 GFLOP on an H100), a fifth of what the direct form reaches, so deeper reductions are timed too
DIRECT_MAX_REDUCTION_TRANSPOSED = 1024
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


def _phase_taps(k: int, s: int, dl: int) -> tuple[int, int, int]:
    """Along an axis of a transposed convolution other than the last (kernel k, stride s, dilation dl):
    the outputs o = q * s + r of one phase r read the taps k0, k0 + step, ... (at most `taps` of them),
    and tap j's input is q + f - j * in_step (f: the first tap's offset): (taps, step, in_step)."""
    g = math.gcd(dl, s)
    return math.ceil(k / (s // g)), s // g, dl // g


def _row_taps(k: int, s: int, pad: int, dl: int) -> tuple[list[list[tuple[int, int]]], int, int]:
    """Along the last axis of a transposed convolution: for each residue r of the stride, the taps that
    output o = q * s + r reads as (tap, offset), its input being q + offset; and the least and greatest
    offset (a thread's row of inputs spans them)."""
    hits = [[(t, (r + pad - t * dl) // s) for t in range(k) if (r + pad - t * dl) % s == 0] for r in range(s)]
    offs = [off for h in hits for _, off in h]
    return hits, min(offs), max(offs)


def _phase_lines(axes: str, ax_u: list[str]) -> list[str]:
    """The block's phase (blockIdx.z) along the axes before the last and, per axis, its first tap k0, tap
    count n and first input offset f."""
    if not axes:
        return []
    lines = ["  // this block's phase: the residue r of its outputs' positions along each axis (o = q * stride + r)"]
    for j, (ax, u) in enumerate(zip(axes, ax_u)):
        later = " * ".join(f"kS{v}" for v in ax_u[j + 1:])
        z = f"blockIdx.z / ({later})" if later else "blockIdx.z"
        lines += [f"  const int r{ax} = (int)({z}) % kS{u};",
                  f"  int k0{ax} = kK{u};  // its first tap along {ax} (kK{u}: it has none)",
                  f"  for (int k = 0; k < kTapStep{u} && k < kK{u}; ++k)",
                  f"    if ((r{ax} + kP{u} - k * kD{u}) % kS{u} == 0) {{ k0{ax} = k; break; }}",
                  f"  const int n{ax} = k0{ax} < kK{u} ? (kK{u} - k0{ax} + kTapStep{u} - 1) / kTapStep{u} : 0;",
                  f"  const int f{ax} = (r{ax} + kP{u} - k0{ax} * kD{u}) / kS{u};  // tap j reads input q + f - j * kInStep"]
    return lines


def thread_outputs(ppt: int, s_last: int = 1) -> str:
    """What one thread of the direct form writes along the last axis, in words: its positions, and for a
    transposed convolution of stride s_last along it every residue of each."""
    run = ppt * s_last
    per = "output position" if run == 1 else f"{run} consecutive output positions"
    return per + (f" ({ppt} position{'s' if ppt > 1 else ''} x the stride's {s_last} residues)" if s_last > 1 else "")


def row_stride(program: Program, node) -> int:
    """The stride along the last axis of a transposed convolution (its thread takes every residue of it),
    1 for any other convolution or where the geometry does not resolve."""
    if not node.op.startswith("conv_transpose"):
        return 1
    kernel = list(program.values[node.inputs[1]].shape[2:])
    try:
        return conv_geometry(node, len(kernel), kernel)[0][-1]
    except CodegenError:
        return 1


def direct_alternative(program: Program, io: RegionIO) -> list[dict]:
    """[params of this kernel] for a region whose convolution would run through cuDNN and whose
    reduction per output element is short (DIRECT_MAX_REDUCTION; a transposed one's taps of one phase,
    DIRECT_MAX_REDUCTION_TRANSPOSED): the tuner times it against the library form and keeps the faster;
    [] otherwise."""
    convs = [n for n in io.nodes if program.nodes[n].op in CONV_OPS]
    views = trailing_views(program, io)
    if len(convs) != 1 or any(n not in convs and n not in views and not is_elementwise(program.nodes[n])
                              for n in io.nodes):
        return []
    cn = program.nodes[convs[0]]
    w = program.values[cn.inputs[1]].shape
    out_row = program.values[cn.outputs[0]].shape[-1]
    if cn.op.startswith("conv_transpose"):
        d = len(w) - 2
        try:
            stride, _, dil, _ = conv_geometry(cn, d, list(w[2:]))
        except CodegenError:
            return []
        taps = math.prod(_phase_taps(w[2 + j], stride[j], dil[j])[0] for j in range(d))
        if w[0] // int(cn.attrs.get("groups", 1)) * taps > DIRECT_MAX_REDUCTION_TRANSPOSED:
            return []
        # positions q along the row, each of stride outputs: 4 outputs a thread at stride 2
        out_row, ppt = math.ceil(out_row / stride[-1]), max(1, DIRECT_POSITIONS // stride[-1])
    elif w[1] * math.prod(w[2:]) > DIRECT_MAX_REDUCTION:
        return []
    else:
        ppt = DIRECT_POSITIONS
    # 4 outputs a thread where its rows allow: each weight load then feeds 4 x channels FMAs, not 1 x
    blocked = ppt > 1 and out_row >= 2 * ppt
    form = {"form": DIRECT, **({"positions_per_thread": ppt} if blocked else {})}
    # the weights staged in shared memory first: more channels a thread, each input load feeding them all
    return [{**form, "stage_weights": True}, form]


def lone_transposed(program: Program, node_ids) -> bool:
    """Whether the region's one op other than views is a transposed convolution (direct_alternative
    then checks that the views only follow it)."""
    from ..analysis.cost import is_view
    work = [n for n in node_ids if not is_view(program, n)]
    return len(work) == 1 and program.nodes[work[0]].op.startswith("conv_transpose")


def lone_direct(program: Program, node_ids) -> bool:
    """A transposed convolution alone that the direct form takes: its region gets that kernel, timed
    against the cuDNN call (the faster is kept). (A convolution alone is the tile GEMM's, gemm_mma.lone_gemm,
    which lists the direct form among its own.)"""
    if not lone_transposed(program, node_ids):
        return False
    from .region_io import region_io
    return bool(direct_alternative(program, region_io(program, list(node_ids))))


def tune_variants(p: dict) -> list[dict]:
    """The direct form's other launches (agent/tune.py), for a region whose kernel it is: a staged
    thread's channels halved (fewer registers, more threads resident), then blocks of 128."""
    if p.get("form") != DIRECT:
        return []
    keep = {k: p[k] for k in ("form", "positions_per_thread", "stage_weights", "channels_per_thread") if k in p}
    cpt = int(p.get("channels_per_thread") or 1)
    out = [{**keep, "channels_per_thread": cpt // 2}] if p.get("stage_weights") and cpt >= 8 else []
    return out + [{**keep, "block": 128}]


def generate_conv(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    p = {**DEFAULTS, **(params or {})}
    vals, nodes = program.values, program.nodes
    convs = [n for n in io.nodes if nodes[n].op in CONV_OPS]
    if len(convs) != 1:
        what = ", ".join(f"{nodes[n].name} ({nodes[n].op})" for n in convs) or "none"
        raise CodegenError(f"a convolution region holds exactly one conv/conv_transpose followed by pointwise "
                           f"ops; this one has {len(convs)}: {what}")
    cn = nodes[convs[0]]
    views = trailing_views(program, io)     # written at the convolution's flat index (around.py)
    others = [n for n in io.nodes if n != cn.id and n not in views and not is_elementwise(nodes[n])]
    if others:
        what = ", ".join(f"{nodes[n].name} ({nodes[n].op})" for n in others)
        raise CodegenError(f"only pointwise ops and views of the result may follow {cn.name} ({cn.op}) in a "
                           f"generated convolution; split the region before {what}")
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
    if ppt < 1:
        raise CodegenError(f"positions_per_thread={ppt}: a convolution's thread takes 1 or more consecutive "
                           f"positions")
    # A transposed convolution's outputs o = q * stride + r of one residue r per axis read the same taps
    # (_phase_taps): the other axes' residues are phases (blockIdx.z); along the last axis a thread takes
    # positions q..q + ppt - 1 with every residue, stride x ppt consecutive outputs (_row_taps)
    taps = [_phase_taps(kernel[j], stride[j], dil[j]) for j in range(d - 1)] if transposed else []
    row = _row_taps(kernel[-1], stride[-1], pad[-1], dil[-1]) if transposed else None
    phases = math.prod(stride[:-1]) if transposed else 1
    run = ppt * stride[-1] if transposed else ppt       # consecutive outputs a thread writes along the row
    grid_sp = [math.ceil(sout[j] / stride[j]) for j in range(d)] if transposed else sout   # positions q
    inner_groups = math.ceil(grid_sp[-1] / ppt)
    pos_groups = math.prod(grid_sp[:-1]) * inner_groups
    staged = bool(p.get("stage_weights"))
    phase_taps = math.prod(t for t, _, _ in taps) * kernel[-1] if transposed else kvol   # a block's taps
    cpt = _channels_per_thread(p, cout_g, batch * pos_groups * phases, cin_g * phase_taps if staged else 0)
    chunks = cout // cpt
    resident = p["sm_count"] * (MAX_THREADS_PER_SM // block)       # the grid-stride loop's grid cap
    if staged:      # blockIdx.y: the channel chunk whose weights the block stages
        gx = min(math.ceil(batch * pos_groups / block), max(1, resident // (chunks * phases)))
        grid = (max(1, gx), chunks, phases)
    else:
        gx = min(math.ceil(batch * pos_groups * chunks / block), max(1, resident // phases))
        grid = (max(1, gx), 1, phases)
    # a thread's positions share the window's inputs along the last axis: one row of kSpan loads
    sliding = ppt > 1 or transposed

    axes = "dhw"[-d:] if d > 1 else "l"
    ax_u = [a.upper() for a in axes]
    kname = kernel_name(name)
    names = Names()  # kernel arguments must not shadow the kernel's locals or its name
    names.taken.add(kname)
    names.taken.update(("o", "q", "acc", "c", "g", "ci", "co0", "nb", "chunk", "pos", "out_base", "x_base",
                        "w_base", "xc", "wc", "xv", "wv", "xs", "ws", "w4", "oc", "tap", "taps", "point",
                        "store_point", "pg", "outer", "p", "s", "e", "k", "t", "w"))
    names.taken.update(f"{v}{ax}" for v in ("o", "i", "k", "t", "r", "q", "n", "f", "j", "k0") for ax in axes)
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
    last, la = ax_u[-1], axes[-1]
    if transposed:  # weight [Cin, Cout/groups, *kernel]
        consts.append("constexpr index_t kWeightStrideCo = kKernelVolume, "
                      "kWeightStrideCi = kCoutPerGroup * kKernelVolume;  // weight [Cin, Cout/groups, *kernel]")
        if d > 1:
            consts += ["// a phase's taps along each other axis: at most kTaps, kTapStep apart in the kernel; the",
                       "// input of its j-th tap is kInStep * j before its first tap's; kQ: a phase's positions q"]
        for j, u in enumerate(ax_u[:-1]):
            t, step, in_step = taps[j]
            consts.append(f"constexpr int kQ{u} = {grid_sp[j]}, kTaps{u} = {t}, kTapStep{u} = {step}, "
                          f"kInStep{u} = {in_step};")
        consts.append(f"constexpr int kQ{last} = {grid_sp[-1]};  // positions q along {la}, each of kS{last} outputs")
        consts.append(f"constexpr int kPhaseTaps = {' * '.join([f'kTaps{u}' for u in ax_u[:-1]] + [f'kK{last}'])};"
                      f"  // the taps a phase reads")
    else:  # weight [Cout, Cin/groups, *kernel]
        consts.append("constexpr index_t kWeightStrideCo = kCinPerGroup * kKernelVolume, "
                      "kWeightStrideCi = kKernelVolume;  // weight [Cout, Cin/groups, *kernel]")
    rows = " * ".join(f"kQ{u}" for u in ax_u[:-1]) or "1" if transposed else f"kOutSpatial / kOut{last}"
    consts += [f"constexpr int kChannelsPerThread = {cpt}, kChannelChunks = kCout / kChannelsPerThread;",
               f"constexpr int kPositions = {ppt};   // positions along {la} per thread"
               + (f", every residue of each: kRun = {run} consecutive outputs" if transposed else ""),
               f"constexpr int kRun = {'kPositions * kS' + last if transposed else 'kPositions'};"
               f"  // consecutive outputs a thread writes along {la}",
               f"constexpr int kInnerGroups = (k{'Q' if transposed else 'Out'}{last} + kPositions - 1) / kPositions;",
               f"constexpr index_t kPosGroups = (index_t)({rows}) * kInnerGroups;",
               "constexpr index_t kThreads = (index_t)kBatch * kPosGroups"
               + (";  // per channel chunk (blockIdx.y)" if staged else " * kChannelChunks;")
               + ("  // per phase (blockIdx.z)" if phases > 1 else ""),
               f"constexpr int kBlock = {block};"]
    if transposed:
        lo, hi = row[1], row[2]
        consts.append(f"constexpr int kRowFirst = {lo}, kSpan = kPositions + {hi - lo};"
                      f"  // a thread's row of inputs: q + kRowFirst onwards")
    elif sliding:
        consts.append(f"constexpr int kSpan = (kPositions - 1) * kS{last} + (kK{last} - 1) * kD{last} + 1;"
                      f"  // inputs a window row's taps read for a thread's positions")
    if staged:
        consts.append(f"constexpr int kStaged = kCinPerGroup * {'kPhaseTaps' if transposed else 'kKernelVolume'}"
                      f" * kChannelsPerThread;  // the chunk's weights, [ci][tap][c]")
    consts += ld_epi.consts

    xp, wp = arg[x_vid], arg[w_vid]
    w_base = ("(index_t)g * kCinPerGroup * kWeightStrideCi + (index_t)(co0 - g * kCoutPerGroup) * kWeightStrideCo"
              if transposed else "(index_t)co0 * kWeightStrideCo")
    # a transposed convolution's weight tap index, its other axes' taps at phase tap j, the row's tap k{la}
    k_phase = " + ".join([f"(k0{ax} + j{ax} * kTapStep{u})" + "".join(f" * kK{v}" for v in ax_u[j + 1:])
                          for j, (ax, u) in enumerate(zip(axes[:-1], ax_u[:-1]))] + [f"k{la}"])
    body = _phase_lines(axes[:-1], ax_u[:-1]) if transposed else []
    if staged:
        body += ["  __shared__ __align__(16) float ws[kStaged];",
                 "  const int co0 = (int)blockIdx.y * kChannelsPerThread;  // the block's first output channel",
                 "  const int g = co0 / kCoutPerGroup;  // its group (the chunk never straddles two)",
                 "  {",
                 f"    const index_t w_base = {w_base};",
                 "    for (int e = threadIdx.x; e < kStaged; e += blockDim.x) {"]
        if transposed:   # the phase's taps only ([ci][j...][k][c]); a tap past the phase's count is never read
            body += ["      const int c = e % kChannelsPerThread, t = (e / kChannelsPerThread) % kPhaseTaps;",
                     "      const int ci = e / (kChannelsPerThread * kPhaseTaps);",
                     f"      const int k{la} = t % kK{last};"]
            for j, (ax, u) in enumerate(zip(axes[:-1], ax_u[:-1])):
                inner = " * ".join([f"kTaps{v}" for v in ax_u[j + 1:-1]] + [f"kK{last}"])
                body.append(f"      const int j{ax} = t / ({inner}) % kTaps{u};")
            inside = " && ".join(f"j{ax} < n{ax}" for ax in axes[:-1])
            load = (f"{wp}[w_base + (index_t)ci * kWeightStrideCi + (index_t)c * kWeightStrideCo + {k_phase}]")
            body.append(f"      ws[e] = {f'{inside} ? {load} : 0.0f' if inside else load};")
        else:
            body += ["      const int c = e % kChannelsPerThread, tap = (e / kChannelsPerThread) % kKernelVolume;",
                     "      const int ci = e / (kChannelsPerThread * kKernelVolume);",
                     f"      ws[e] = {wp}[w_base + (index_t)ci * kWeightStrideCi + (index_t)c * kWeightStrideCo + tap];"]
        body += ["    }",
                 "  }",
                 "  __syncthreads();",
                 "  const index_t stride = (index_t)gridDim.x * blockDim.x;",
                 "  for (index_t o = (index_t)blockIdx.x * blockDim.x + threadIdx.x; o < kThreads; o += stride) {",
                 "    // o -> (batch nb, positions pos..pos + kRun - 1 along the last axis); neighbouring",
                 "    // threads take neighbouring positions, so input reads and output writes are coalesced",
                 "    const index_t pg = o % kPosGroups;",
                 "    const index_t nb = o / kPosGroups;"]
    else:
        body += ["  const index_t stride = (index_t)gridDim.x * blockDim.x;",
                 "  for (index_t o = (index_t)blockIdx.x * blockDim.x + threadIdx.x; o < kThreads; o += stride) {",
                 "    // o -> (batch nb, channel chunk, positions pos..pos + kRun - 1 along the last axis);",
                 "    // neighbouring threads take neighbouring positions, so input reads and output writes are",
                 "    // coalesced and weights are warp-uniform",
                 "    const index_t pg = o % kPosGroups;",
                 "    const index_t q = o / kPosGroups;",
                 "    const int chunk = (int)(q % kChannelChunks);",
                 "    const index_t nb = q / kChannelChunks;",
                 "    const int co0 = chunk * kChannelsPerThread;  // first output channel of this thread",
                 "    const int g = co0 / kCoutPerGroup;  // its group (the chunk never straddles two)"]
    # the thread's position: o{ax} (its first along the last axis); a transposed one's q{ax} (its phase's)
    pv, pk = ("q", "kQ") if transposed else ("o", "kOut")
    body.append(f"    const int {pv}{la} = (int)(pg % kInnerGroups) * kPositions;  // its first position's {la}")
    if d > 1 or not transposed:
        body.append("    const index_t outer = pg / kInnerGroups;  // the other axes' position")
    for j, (ax, u) in enumerate(zip(axes[:-1], ax_u[:-1])):
        inner = " * ".join(f"{pk}{ax_u[i]}" for i in range(j + 1, d - 1))
        qexpr = "outer" if not inner else f"outer / ({inner})" if "*" in inner else f"outer / {inner}"
        if j > 0:  # the outermost coordinate needs no modulo
            qexpr = f"{qexpr if qexpr == 'outer' else f'({qexpr})'} % {pk}{u}"
        body.append(f"    const int {pv}{ax} = (int)({qexpr});")
    if transposed:
        body += [f"    const int o{ax} = q{ax} * kS{u} + r{ax};" for ax, u in zip(axes[:-1], ax_u[:-1])]
        body.append(f"    const int o{la} = q{la} * kS{last};  // the first of its kRun outputs")
        if d > 1:   # the last phase position of an axis may fall past the output (kQ rounds up)
            body.append(f"    if ({' || '.join(f'o{ax} >= kOut{u}' for ax, u in zip(axes[:-1], ax_u[:-1]))}) continue;")
        pos = " + ".join(f"(index_t)o{ax}" + "".join(f" * kOut{ax_u[i]}" for i in range(j + 1, d))
                         for j, ax in enumerate(axes))
        body.append(f"    const index_t pos = {pos};")
    else:
        body.append(f"    const index_t pos = outer * kOut{last} + o{la};")
    body += ["    const index_t x_base = (nb * kCin + (index_t)g * kCinPerGroup) * kInSpatial;"]
    if not staged:
        body.append(f"    const index_t w_base = {w_base};")
    body += ["    float acc[kChannelsPerThread][kRun];",
             "#pragma unroll",
             "    for (int c = 0; c < kChannelsPerThread; ++c)",
             "#pragma unroll",
             "      for (int e = 0; e < kRun; ++e) acc[c][e] = 0.0f;",
             "    for (int ci = 0; ci < kCinPerGroup; ++ci) {  // runtime loop over the group's input channels",
             f"      const float* xc = {xp} + x_base + (index_t)ci * kInSpatial;"]
    if not staged:
        body.append(f"      const float* wc = {wp} + w_base + (index_t)ci * kWeightStrideCi;")
    in_pos = " + ".join(f"i{ax}" + "".join(f" * kIn{ax_u[i]}" for i in range(j + 1, d)) for j, ax in enumerate(axes))
    indent = "      "
    for j, (ax, u) in enumerate(zip(axes, ax_u)):
        if sliding and j == d - 1:   # the row's inputs, once for every position and tap (zero in the padding)
            first = f"q{la} + kRowFirst" if transposed else f"o{la} * kS{last} - kP{last}"
            body += [f"{indent}float xs[kSpan];",
                     f"{indent}#pragma unroll",
                     f"{indent}for (int s = 0; s < kSpan; ++s) {{",
                     f"{indent}  const int i{la} = {first} + s;",
                     f"{indent}  xs[s] = i{la} >= 0 && i{la} < kIn{last} ? xc[{in_pos}] : 0.0f;",
                     f"{indent}}}"]
        if transposed and j == d - 1:
            break
        if transposed:   # the phase's taps of this axis (n{ax} of them, the same for the whole block)
            body += [f"{indent}#pragma unroll", f"{indent}for (int j{ax} = 0; j{ax} < kTaps{u}; ++j{ax}) {{"]
            indent += "  "
            body += [f"{indent}if (j{ax} >= n{ax}) break;",
                     f"{indent}const int i{ax} = q{ax} + f{ax} - j{ax} * kInStep{u};  // the input this tap reads",
                     f"{indent}if (i{ax} < 0 || i{ax} >= kIn{u}) continue;  // zero padding adds nothing"]
            continue
        body += [f"{indent}#pragma unroll", f"{indent}for (int k{ax} = 0; k{ax} < kK{u}; ++k{ax}) {{"]
        indent += "  "
        if j < d - 1 or ppt == 1:
            body += [f"{indent}const int i{ax} = o{ax} * kS{u} - kP{u} + k{ax} * kD{u};",
                     f"{indent}if (i{ax} < 0 || i{ax} >= kIn{u}) continue;  // zero padding adds nothing"]
    taps_per_ci = "kPhaseTaps" if transposed else "kKernelVolume"

    def fma(tap: str, xv: str, slot: str) -> list[str]:
        """acc[c][slot(p)] += xv(p) * the weight of `tap` for every channel c and position p."""
        if staged and cpt % 4 == 0:   # 4 channels' weights in one broadcast float4 load
            return [f"{indent}const float4* w4 = reinterpret_cast<const float4*>(ws + (ci * {taps_per_ci} + {tap}) "
                    f"* kChannelsPerThread);",
                    f"{indent}#pragma unroll",
                    f"{indent}for (int c4 = 0; c4 < kChannelsPerThread / 4; ++c4) {{",
                    f"{indent}  const float4 w = w4[c4];",
                    f"{indent}#pragma unroll",
                    f"{indent}  for (int p = 0; p < kPositions; ++p) {{",
                    f"{indent}    acc[4 * c4][{slot}] += {xv} * w.x;",
                    f"{indent}    acc[4 * c4 + 1][{slot}] += {xv} * w.y;",
                    f"{indent}    acc[4 * c4 + 2][{slot}] += {xv} * w.z;",
                    f"{indent}    acc[4 * c4 + 3][{slot}] += {xv} * w.w;",
                    f"{indent}  }}",
                    f"{indent}}}"]
        wv = (f"ws[(ci * {taps_per_ci} + {tap}) * kChannelsPerThread + c]" if staged
              else f"wc[c * kWeightStrideCo + {tap}]")
        return [f"{indent}#pragma unroll",
                f"{indent}for (int c = 0; c < kChannelsPerThread; ++c) {{  // a weight feeds every position",
                f"{indent}  const float wv = {wv};",
                f"{indent}#pragma unroll",
                f"{indent}  for (int p = 0; p < kPositions; ++p) acc[c][{slot}] += {xv} * wv;",
                f"{indent}}}"]

    if transposed:   # the row's taps, residue by residue: output p * kS + r reads input q + p + off
        outer = (" + ".join(f"j{ax}" + "".join(f" * kTaps{v}" for v in ax_u[j + 1:-1])
                            for j, ax in enumerate(axes[:-1])) or "0") if staged else \
            (" + ".join(f"(k0{ax} + j{ax} * kTapStep{u})" + "".join(f" * kK{v}" for v in ax_u[j + 1:-1])
                        for j, (ax, u) in enumerate(zip(axes[:-1], ax_u[:-1]))) or "0")
        outer = outer if outer.isidentifier() or outer.isdigit() or " " not in outer else f"({outer})"
        body.append(f"{indent}const int taps = {outer} * kK{last};  // the row's first tap, in the "
                    f"{'staged' if staged else 'weight'} layout")
        for r, hits in enumerate(row[0]):
            for k, off in hits:
                body.append(f"{indent}{{  // residue {r}: tap {la} = {k} reads input q + p + {off}")
                indent += "  "
                body += fma(f"taps + {k}", f"xs[p + {off - row[1]}]", f"p * kS{last} + {r}")
                indent = indent[:-2]
                body.append(f"{indent}}}")
    else:
        if ppt == 1:
            body += [f"{indent}const float xv[1] = {{xc[{in_pos}]}};"]
        else:     # each of the thread's positions takes its input from the row (past the row's end: never stored)
            body += [f"{indent}float xv[kPositions];",
                     f"{indent}#pragma unroll",
                     f"{indent}for (int p = 0; p < kPositions; ++p) xv[p] = xs[p * kS{last} + k{la} * kD{last}];"]
        tap = " + ".join(f"k{ax}" + "".join(f" * kK{ax_u[i]}" for i in range(j + 1, d)) for j, ax in enumerate(axes))
        body.append(f"{indent}const int tap = {tap};")
        body += fma("tap", "xv[p]", "p")
    for _ in range(d - 1 if transposed else d):
        indent = indent[:-2]
        body.append(f"{indent}}}")
    body += ["    }",
             "    const index_t out_base = (nb * kCout + co0) * kOutSpatial + pos;",
             "#pragma unroll",
             "    for (int c = 0; c < kChannelsPerThread; ++c) {",
             "#pragma unroll",
             "      for (int e = 0; e < kRun; ++e) {",
             f"        if (o{la} + e >= kOut{last}) break;  // past the row's end",
             "        const index_t oc = out_base + (index_t)c * kOutSpatial + e;"]
    value = f"acc[c][e] + {arg[b_vid]}[co0 + c]" if b_vid else "acc[c][e]"
    call = [value] + [ld_epi.load(v, arg[v], "oc") for v in epi_inputs] + [f"{arg[v]}[oc]" for v in io.outputs]
    body += [f"        store_point({', '.join(call)});", "      }", "    }", "  }"]

    cparams = [f"const float* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"float* __restrict__ {arg[v]}" for v in io.outputs]
    window = "x".join(map(str, kernel))
    per = thread_outputs(ppt, run // ppt) + \
        (f" of one of {phases} phase(s) (blockIdx.z; {phase_taps} of the {kvol} taps each)" if phases > 1 else "")
    blocks = (f"{grid[0]} x {grid[1]} blocks (positions x channel chunks)" if staged else f"{grid[0]} blocks") + \
        (f" x {phases} phases" if phases > 1 else "")
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
                "outputs_per_thread": run,
                "sm_count": p["sm_count"], "stage_weights": staged,
                **({"form": DIRECT} if p.get("form") == DIRECT else {})},
        align=4, bytes_moved=sum(vals[v].nbytes for v in io.inputs + io.outputs),
        flops=sum(program.node_flops(n) for n in io.nodes))
