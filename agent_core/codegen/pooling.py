"""Pooling regions: max_pool / avg_pool, adaptive_max_pool / adaptive_avg_pool and linear resampling
(upsample_linear1d / bilinear2d / trilinear3d: a window of the 2^d inputs around each output's source
point, each with its weight) (1-D, 2-D, 3-D) with a pointwise prologue on the input side and an
epilogue on the output side, so conv -> relu -> max_pool -> ... reads the pre-activation once.

One thread per output element (grid-stride). Fixed windows have compile-time bounds and are unrolled;
max pooling skips padded positions (torch pads with -inf) and average pooling follows torch's divisor
rules (count_include_pad, divisor_override, ceil_mode's clipped last window). Adaptive windows are
worked out per output index with integer arithmetic, as torch does: along an axis of In inputs and
Out outputs, output i pools [floor(i * In / Out), ceil((i + 1) * In / Out)), and the average divides
by that window's size. Max pooling of either kind propagates NaN like torch. Global average pooling
(adaptive_avg_pool down to one element per channel) is left to the row kernel, where it is a row mean.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Program
from ..ops.common import ntuple
from .around import grid_for, render_around, split_around
from .cuda import Names, header, index_type, kernel_name, kernel_source
from .kernel import KernelSource
from .region_io import RegionIO
from .rowstates import global_pool

WINDOW_POOL_OPS = tuple(f"{kind}_pool{d}d" for kind in ("max", "avg") for d in (1, 2, 3))
ADAPTIVE_POOL_OPS = tuple(f"adaptive_{kind}_pool{d}d" for kind in ("max", "avg") for d in (1, 2, 3))
# linear resampling: each output element a weighted sum of the 2^d inputs around its source point
RESAMPLE_OPS = ("upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d")
POOL_OPS = WINDOW_POOL_OPS + ADAPTIVE_POOL_OPS + RESAMPLE_OPS
INT32_MAX = 2**31 - 1


def pooled_here(program: Program, node) -> bool:
    """Whether generate_pooling is the generator for this node: any max/avg or adaptive pool except
    adaptive_avg_pool down to one element per channel, which the row kernel generates as a row mean."""
    if node.op not in POOL_OPS:
        return False
    return not (node.op.startswith("adaptive_avg_pool") and global_pool(program, node))


@dataclass
class Window:
    """How one output element's window is found and folded, per kind of pooling."""
    consts: list      # constexpr lines beyond the input and output sizes
    setup: list       # per output element, after its coordinates o{ax}: window bounds
    loops: list       # per axis, the lines that open its loop (later lines relative to the `for`)
    result: str       # the pooled value from acc
    describe: str     # header line
    sched: str        # the window part of the schedule
    weight: str | None = None     # each input's weight in acc (linear resampling); None: summed or maxed


def _product(terms: list) -> str:
    """The window size as a float: `(float)(ew - sw)`, `(float)((eh - sh) * (ew - sw))`."""
    return "(float)(" + " * ".join(t if len(terms) == 1 or " " not in t else f"({t})" for t in terms) + ")"


def _fixed_window(a: dict, d: int, axes: str, is_max: bool, sin: list, sout: list) -> Window:
    """max_pool / avg_pool: kernel_size, stride, padding (and max_pool's dilation) fixed per axis.
    Along an axis where no window reaches past the input (no padding, the last window inside: every
    window whole) the loop has no bounds test and avg_pool's divisor is the kernel's size: straight-line
    loads the compiler issues together, not a loop with runtime bounds per element."""
    k = ntuple(a["kernel_size"], d, "kernel_size")
    s = ntuple(a["stride"] or k, d, "stride")
    pad = ntuple(a["padding"], d, "padding")
    dil = ntuple(a["dilation"], d, "dilation") if is_max else [1] * d
    consts, setup, loops, count_pad, div = [], [], [], [], []
    for j, ax in enumerate(axes):
        u = ax.upper()
        whole = pad[j] == 0 and (sout[j] - 1) * s[j] + (k[j] - 1) * dil[j] < sin[j]
        consts.append(f"constexpr int kK{u} = {k[j]}, kS{u} = {s[j]}, kP{u} = {pad[j]}, kD{u} = {dil[j]};")
        setup.append(f"    const int s{ax} = o{ax} * kS{u} - kP{u};  // window start"
                     + ("" if whole else " (may be in the padding)"))
        if whole:       # every window inside the input along this axis
            loops.append(["#pragma unroll", f"for (int k{ax} = 0; k{ax} < kK{u}; ++k{ax}) {{",
                          f"  const int i{ax} = s{ax} + k{ax} * kD{u};"])
            count_pad.append(f"kK{u}")
            div.append(f"kK{u}")
        elif is_max:
            loops.append(["#pragma unroll", f"for (int k{ax} = 0; k{ax} < kK{u}; ++k{ax}) {{",
                          f"  const int i{ax} = s{ax} + k{ax} * kD{u};",
                          f"  if (i{ax} < 0 || i{ax} >= kIn{u}) continue;  // padding: -inf never wins"])
        else:
            setup += [f"    const int e{ax} = min(s{ax} + kK{u}, kIn{u} + kP{u});",
                      f"    const int n{ax} = e{ax} - s{ax};  // window size counted with padding",
                      f"    const int b{ax} = max(s{ax}, 0), f{ax} = min(e{ax}, kIn{u});"]
            loops.append([f"for (int i{ax} = b{ax}; i{ax} < f{ax}; ++i{ax}) {{"])
            count_pad.append(f"n{ax}")
            div.append(f"f{ax} - b{ax}")
    if is_max:
        result = "acc"
    elif a.get("divisor_override"):
        result = f"acc / {float(a['divisor_override'])!r}f"
    else:
        result = f"acc / {_product(count_pad if a['count_include_pad'] else div)}"
    return Window(consts, setup, loops, result,
                   f"kernel {k}, stride {s}, padding {pad}, dilation {dil}",
                   f"unrolled {'x'.join(map(str, k))} window")


def _adaptive_window(sin: list, sout: list, axes: str, is_max: bool) -> Window:
    """adaptive_max_pool / adaptive_avg_pool: output i along an axis pools
    [floor(i * In / Out), ceil((i + 1) * In / Out)), computed per output element."""
    setup, loops, sizes, widest = [], [], [], []
    for j, ax in enumerate(axes):
        u, n_in, n_out = ax.upper(), sin[j], sout[j]
        # (o + 1) * In + Out - 1 is the largest intermediate; it is computed in 64 bits when it overflows an int
        if n_out * n_in + n_out - 1 > INT32_MAX:
            lo = f"(int)((long long)o{ax} * kIn{u} / kOut{u})"
            hi = f"(int)((((long long)o{ax} + 1) * kIn{u} + kOut{u} - 1) / kOut{u})"
        else:
            lo, hi = f"o{ax} * kIn{u} / kOut{u}", f"((o{ax} + 1) * kIn{u} + kOut{u} - 1) / kOut{u}"
        setup += [f"    const int s{ax} = {lo};  // window start: floor(o * In / Out)",
                  f"    const int e{ax} = {hi};  // window end: ceil((o + 1) * In / Out)"]
        loops.append([f"for (int i{ax} = s{ax}; i{ax} < e{ax}; ++i{ax}) {{"])
        sizes.append(f"e{ax} - s{ax}")
        widest.append(max(-(-(o + 1) * n_in // n_out) - o * n_in // n_out for o in range(n_out)))
    return Window([], setup, loops, "acc" if is_max else f"acc / {_product(sizes)}",
                   f"output {sout} from {sin}: output i along an axis of In inputs and Out outputs pools "
                   f"[floor(i * In / Out), ceil((i + 1) * In / Out))",
                   f"adaptive windows of up to {'x'.join(map(str, widest))}")


def _linear_window(a: dict, sin: list, sout: list, axes: str) -> Window:
    """upsample_linear1d / bilinear2d / trilinear3d: along each axis output o reads inputs lo =
    floor(src) and hi = lo + 1 (lo again at the last input) with weights 1 - l and l, l = src - lo; src =
    o * step with align_corners (step = (In - 1) / (Out - 1)), else max((o + 0.5) * step - 0.5, 0) (step =
    1 / the scale factor given, or In / Out): torch's area_pixel_compute_source_index, in float32."""
    import numpy as np
    from .cuda import float_literal
    consts, setup, loops, weights = [], [], [], []
    scales = a.get("scales")
    for j, ax in enumerate(axes):
        u, n_in, n_out = ax.upper(), sin[j], sout[j]
        if a["align_corners"]:
            step = np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.float32(0.0)
            src = f"kR{u} * (float)o{ax}"
        else:
            step = np.float32(1.0 / scales[j]) if scales else np.float32(n_in) / np.float32(n_out)
            src = f"fmaxf(kR{u} * ((float)o{ax} + 0.5f) - 0.5f, 0.0f)"
        consts.append(f"constexpr float kR{u} = {float_literal(float(step))};  // source step per output")
        setup += [f"    const float r{ax} = {src};  // source point",
                  f"    const int lo{ax} = min((int)r{ax}, kIn{u} - 1);",
                  f"    const int hi{ax} = lo{ax} + (lo{ax} < kIn{u} - 1);  // lo itself at the last input",
                  f"    const float l{ax} = r{ax} - (float)lo{ax};  // hi's weight"]
        loops.append(["#pragma unroll", f"for (int t{ax} = 0; t{ax} < 2; ++t{ax}) {{",
                      f"  const int i{ax} = t{ax} ? hi{ax} : lo{ax};"])
        weights.append(f"(t{ax} ? l{ax} : 1.0f - l{ax})")
    return Window(consts, setup, loops, "acc",
                  f"output {sout} from {sin}, align_corners={bool(a['align_corners'])}, "
                  f"{'scales ' + str(scales) if scales else 'step In / Out'}",
                  f"{2 ** len(axes)} weighted inputs", weight=" * ".join(weights))


def window_code(node, in_shape, out_shape, at: str, load) -> tuple[list[str], list[str], Window]:
    """(constexpr lines, statements, the Window) that pool one output element of `node` (a max/avg or
    adaptive pool, not a global average) at flat output index `at` into `const float pooled`. load(idx)
    is the C expression of the input element at flat input index idx (a C name). The pooling kernel
    and a row kernel's prologue lambda (layout_graph) both render a window through this."""
    d = int(node.op[-2])
    is_max = "max_pool" in node.op
    sin, sout = list(in_shape[-d:]), list(out_shape[-d:])
    axes = "dhw"[-d:]
    window = (_adaptive_window(sin, sout, axes, is_max) if node.op in ADAPTIVE_POOL_OPS
              else _linear_window(node.attrs, sin, sout, axes) if node.op in RESAMPLE_OPS
              else _fixed_window(node.attrs, d, axes, is_max, sin, sout))
    consts = [f"constexpr index_t kInSpatial = {math.prod(sin)}, kOutSpatial = {math.prod(sout)};"]
    # strides as products of the named sizes: "kInH * kInW" for the depth axis of a 3-D pool
    in_strides = [" * ".join(f"kIn{axes[i].upper()}" for i in range(j + 1, d)) or "1" for j in range(d)]
    out_strides = [" * ".join(f"kOut{axes[i].upper()}" for i in range(j + 1, d)) or "1" for j in range(d)]
    for j, ax in enumerate(axes):
        consts.append(f"constexpr int kIn{ax.upper()} = {sin[j]}, kOut{ax.upper()} = {sout[j]};")
    consts += window.consts
    lines = [f"const index_t lead = {at} / kOutSpatial;  // batch and channel",
             "const index_t in_base = lead * kInSpatial;"]
    for j, ax in enumerate(axes):
        q = at if out_strides[j] == "1" else f"{at} / ({out_strides[j]})"
        lines.append(f"const int o{ax} = (int)(({q}) % kOut{ax.upper()});")
    lines += [ln[4:] for ln in window.setup]
    lines.append(f"float acc = {'-INFINITY' if is_max else '0.0f'};")
    pos = " + ".join(f"i{ax} * ({in_strides[j]})" if in_strides[j] != "1" else f"i{ax}" for j, ax in enumerate(axes))
    fold = ("if (xv > acc || xv != xv) acc = xv;  // NaN propagates, as in torch" if is_max else
            "acc += xv;" if window.weight is None else f"acc += {window.weight} * xv;")
    indent = ""
    for head in window.loops:
        lines += [indent + line for line in head]
        indent += "  "
    lines += [f"{indent}const index_t idx = in_base + {pos};", f"{indent}const float xv = {load('idx')};",
              indent + fold]
    for _ in axes:
        indent = indent[:-2]
        lines.append(f"{indent}}}")
    lines.append(f"const float pooled = {window.result};")
    return consts, lines, window


def generate_pooling(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    vals = program.values
    pn_, pro, epi = split_around(program, io, POOL_OPS, "pooling", "max/avg or adaptive pool")
    x_vid, y_vid = pn_.inputs[0], pn_.outputs[0]
    x, y = vals[x_vid], vals[y_vid]
    out_numel = math.prod(y.shape)

    names = Names()
    names.taken.update(("o", "q", "acc", "cnt", "lead", "in_base", "point", "store_point", "xv", "pooled"))
    w = render_around(program, io, pro, epi, x_vid, y_vid, names,
                      "one input element of a window.",
                      "one pooled element to the region's outputs.")
    arg, pro_inputs, epi_inputs = w.arg, w.pro_inputs, w.epi_inputs
    ld_pro, ld_epi, pro_fn, epi_fn = w.ld_pro, w.ld_epi, w.pro_fn, w.epi_fn

    pro_at = f"point({', '.join(ld_pro.load(v, arg[v], 'idx') for v in pro_inputs)})"
    wconsts, lines, window = window_code(pn_, x.shape, y.shape, "o", lambda idx: pro_at)
    index_t = index_type(math.prod(x.shape))
    consts = [f"typedef {index_t} index_t;", f"constexpr index_t kOutNumel = {out_numel};", *wconsts,
              *ld_pro.consts, *ld_epi.consts]
    block = 256
    grid = grid_for(out_numel, block)
    consts.append(f"constexpr int kBlock = {block};")
    body = ["  const index_t stride = (index_t)gridDim.x * blockDim.x;",
            "  for (index_t o = (index_t)blockIdx.x * blockDim.x + threadIdx.x; o < kOutNumel; o += stride) {",
            *("    " + ln for ln in lines)]
    call = ["pooled"] + [ld_epi.load(v, arg[v], "o") for v in epi_inputs] + [f"{arg[v]}[o]" for v in io.outputs]
    body += [f"    store_point({', '.join(call)});", "  }"]

    kname = kernel_name(name)
    cparams = [f"const float* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"float* __restrict__ {arg[v]}" for v in io.outputs]
    sched = f"one thread per output element, {window.sched}, {grid} blocks of {block}"
    head = header(program, f"Region {name}: {pn_.op} {list(x.shape)} -> {list(y.shape)} with {len(pro)} "
                           f"prologue and {len(epi)} epilogue op(s)", io.nodes, [
        "Inputs:  " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.inputs),
        "Outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.outputs),
        f"{window.describe}; schedule: {sched}.",
    ])
    source = kernel_source(head, consts, [*ld_pro.helpers, *ld_epi.helpers, pro_fn, epi_fn], kname, cparams, body)
    return KernelSource(
        name=kname, kind="pooling", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=(block, 1, 1), schedule=sched,
        params={"grid": grid, "block": block}, align=4,
        bytes_moved=sum(vals[v].nbytes for v in io.inputs + io.outputs),
        flops=sum(program.node_flops(n) for n in io.nodes))
