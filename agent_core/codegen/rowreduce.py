"""Reductions stitched with their pointwise prologue and epilogue (softmax, log_softmax, layer_norm,
rms_norm, group_norm, instance_norm, global average pooling, logsumexp, sum / mean / max / min / var /
std) over a run of trailing dimensions (rows). A reduction over dims followed by kept ones (columns)
is the row graph's: its column tiles (rowkernel.py) replaced this module's, measured as fast or faster
on the H200 in all 17 regions of the blocks and KernelBench level 2 that had one.

The anchor op reduces the trailing L elements of each of R rows. The kernel computes the prologue per
element while loading a row, folds the elements into a small statistics state (max and sum of
exponentials, Welford's mean and M2, a sum, ...), all-reduces that state across the threads that own
the row, then evaluates the anchor's output and the epilogue per element (or once per row for ops
that reduce the row away) and stores.

Schedules, chosen by row length:
  warp    L <= 1024: a group of 4..32 lanes per row, shuffles only, the row in registers;
  block   L <= 16384: one block per row, shuffles then shared memory, the row in registers;
  online  longer rows: one block per row, pass 1 folds the row into the state (online max / sum of
          exponentials, Welford), pass 2 re-reads it and writes the output;
  split   long rows reduced away, fewer rows than SMs: several blocks per row, the last to finish
          combines their partial states;
Row-preserving rows that a thread-block cluster holds (long, or fewer than the SMs) go to rowkernel's
cluster schedule instead (the package's dispatch asks rowkernel.wide_schedule).
"""
from __future__ import annotations

import math
import re

import networkx as nx

from ..ir import Program
from ..ops.common import broadcast
from .cuda import VEC4, VEC4_STRUCTS, Names, c_type, float_literal, header, index_type, kernel_name, kernel_source
from .kernel import CodegenError, KernelSource
from .last_block import publish_and_arrive, reset_counter
from .layout_graph import RELABEL_OPS, ViewPrologue, is_layout_op
from .pointwise import is_elementwise, operand_views, render_chain
from .region_io import Operands, RegionIO
from .row_tuning import DEFAULTS, REGISTER_MAX_FLOATS, checked_unroll
from .rowstates import STATES, row_op
from .row_stage import stage_lines, stage_tiles, tile_stride

# names the kernel body uses for itself; parameters never take them
KERNEL_LOCALS = ("workspace", "counters", "last", "part", "outer", "inner", "tile", "point", "store_point", "st", "State", "identity", "fold", "combine", "group_reduce",
                 "row_reduce", "partial", "warp", "group", "lane", "row", "active", "base", "c0", "col",
                 "xe", "y", "WEIGHT", "BIAS", "s_t", "s_row", "s_col", "s_at", "stage_smem")
def generate_row_reduction(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    p = {**DEFAULTS, **(params or {})}
    vals, nodes = program.values, program.nodes
    # layout ops (slice, cat, permute, embedding, ...) are read through their views in the prologue
    anchors = [n for n in io.nodes if not is_elementwise(nodes[n]) and not is_layout_op(nodes[n])]
    if not anchors:
        ops = ", ".join(f"{nodes[n].name} ({nodes[n].op})" for n in io.nodes if not is_elementwise(nodes[n]))
        raise CodegenError(f"the region holds no reduction or normalization for a row kernel, only layout ops "
                           f"({ops}) and pointwise ones")
    if len(anchors) != 1:
        what = ", ".join(f"{nodes[n].name} ({nodes[n].op})" for n in anchors)
        raise CodegenError(f"a row-reduction region holds exactly one reduction or normalization; "
                           f"this one has {len(anchors)}: {what}")
    anchor = nodes[anchors[0]]
    state, preamble, out_expr, preserving, dims, row_len = row_op(program, anchor.id)
    x_vid = anchor.inputs[0]
    x = vals[x_vid]
    # the element type of the statistics: float32, or int64 for a sum of integers or bools (torch sums
    # them exactly in int64: mask.sum() counts tokens)
    acc = "float"
    if vals[x_vid].dtype != "float32" and anchor.op == "sum" and vals[anchor.outputs[0]].dtype == "int64":
        c_type(vals[x_vid].dtype, f"'{vals[x_vid].name}'")
        acc = "long long"
    else:
        for vid in [x_vid, anchor.outputs[0]]:
            if vals[vid].dtype != "float32":
                raise CodegenError(f"{anchor.name} ({anchor.op}) reduces '{vals[vid].name}' of dtype "
                                   f"{vals[vid].dtype}; row reductions accumulate float32, or int64 for a sum "
                                   f"(cast it to float32 first; the region runs unfused)", node_id=anchor.id)
    # the prologue and epilogue read and write any kernel dtype, each with its own C type
    ct = {vid: c_type(vals[vid].dtype, f"'{vals[vid].name}'") for vid in [*io.inputs, *io.outputs]}
    cols = row_len or math.prod(x.shape[d] for d in dims)
    rows = math.prod(x.shape) // max(cols, 1)
    if math.prod(x.shape[dims[-1] + 1:]) > 1:   # dims followed by kept ones
        raise CodegenError(f"{anchor.name} ({anchor.op}) reduces columns (dims followed by kept ones): the "
                           f"row graph's column tiles write it", node_id=anchor.id)
    if cols == 0 or rows == 0:
        raise CodegenError("the region reduces an empty tensor; there is nothing to launch")

    # split the region around the anchor
    g = program.graph().subgraph(io.nodes)
    before = nx.ancestors(g, anchor.id)
    after = nx.descendants(g, anchor.id)
    # a side branch that only feeds the epilogue (`labels == -100` of `where(labels == -100, 0, loss)`)
    # is evaluated with it, per output element, from the region's inputs
    feeds_epi = set().union(*(nx.ancestors(g, n) for n in after)) if after else set()
    after = after | {n for n in io.nodes if n in feeds_epi and n not in before and n != anchor.id}
    stray = [n for n in io.nodes if n not in before and n not in after and n != anchor.id]
    if stray:
        raise CodegenError(f"{nodes[stray[0]].name} ({nodes[stray[0]].op}) neither feeds the reduction nor "
                           f"follows it; split it into its own region", node_id=stray[0])
    pro = [n for n in io.nodes if n in before]
    epi = [n for n in io.nodes if n in after]
    pro_vals = {v for n in pro for v in nodes[n].outputs}
    region = set(io.nodes)

    def trailing_relabel(n) -> bool:
        """A reshape-like op whose value only leaves the region: the same elements in the same flat
        order, stored where its input would be (nothing after it broadcasts against its new shape)."""
        out = nodes[n].outputs[0]
        return nodes[n].op in RELABEL_OPS and nodes[n].op != "expand" and \
            all(c not in region or trailing_relabel(c) for c, _ in program.consumers(out))
    relabels = {n for n in epi if is_layout_op(nodes[n]) and trailing_relabel(n)}
    for n in epi:
        if is_layout_op(nodes[n]) and n not in relabels:
            raise CodegenError(f"{nodes[n].name} ({nodes[n].op}) is a layout op after {anchor.name}; a row kernel "
                               f"reads layout ops in its prologue only: split the region there", node_id=n)
    # a prologue with layout ops is computed through their views (layout_graph.ViewPrologue): point()
    # then receives the reduction's input and the prologue values that leave the region, as lambdas
    through_views = any(is_layout_op(nodes[n]) for n in pro)
    for v in io.outputs:  # prologue values used outside are written while the row is loaded
        if v in pro_vals and math.prod(vals[v].shape) != math.prod(x.shape):
            raise CodegenError(f"'{vals[v].name}' of the prologue is used outside the region but is smaller "
                               f"than the reduction's input; split the region there")
    if any(v in pro_vals and v != x_vid for n in epi for v in nodes[n].inputs):
        # the epilogue reads a prologue value (the residual stream of add -> rms_norm): the row graph keeps
        # the row's inputs in registers and recomputes it per element (rowkernel.py)
        from .rowkernel import generate_multi_reduction
        return generate_multi_reduction(program, io, name, params)
    params_in = anchor.inputs[1:]
    for v in params_in:
        if v is not None and v in io.produced:
            raise CodegenError(f"the weight or bias of {anchor.name} is computed inside the region; "
                               f"only inputs and parameters are supported there", node_id=anchor.id)

    # a keepdim reduction whose epilogue broadcasts it back over the rows (x - mean, x * rsqrt(ms)):
    # evaluate the epilogue per element of the row, the statistic being the same along the row
    if not preserving and epi and len(vals[anchor.outputs[0]].shape) == len(x.shape):
        espace = broadcast(*(vals[v].shape for n in epi if n not in relabels for v in nodes[n].outputs))
        if tuple(espace) == tuple(x.shape):
            preserving = True

    # external inputs by phase
    pro_inputs = [v for v in io.inputs if any(v in nodes[n].inputs for n in pro)]
    if not pro:
        pro_inputs = [x_vid]
    if through_views:
        pro_inputs = [x_vid] + [v for v in io.outputs if v in pro_vals and v != x_vid]
        for v in pro_inputs:
            if tuple(vals[v].shape) != tuple(x.shape):
                raise CodegenError(f"'{vals[v].name}' of the prologue leaves the region with shape "
                                   f"{list(vals[v].shape)}, not the reduction's {list(x.shape)}; split the region there")
    chain = [] if through_views else pro      # the prologue ops point() renders itself
    epi_inputs = [v for v in io.inputs if any(v in nodes[n].inputs for n in epi) and v != x_vid]
    anchor_out = anchor.outputs[0]
    out_space = x.shape if preserving else vals[anchor.outputs[0]].shape

    # schedule
    vec = 4 if (p["vector_width"] == 4 and cols % 4 == 0) else 1
    if cols <= p["warp_max_cols"]:
        schedule = "warp"
        tpr = 1 << max(2, min(5, math.ceil(math.log2(max(1, math.ceil(cols / vec / 4))))))
        block = max(int(p["block"]), tpr)
    elif cols <= p["register_max_cols"]:
        schedule = "block"
        tpr = min(1024, max(128, 1 << math.ceil(math.log2(math.ceil(cols / 16)))))
        block = tpr
    else:
        schedule = "online"
        tpr = block = int(p["online_threads"])
    if p.get("threads_per_row"):  # a tuner's choice overrides the rule above
        tpr = int(p["threads_per_row"])
        if tpr & (tpr - 1) or not 4 <= tpr <= 1024:
            raise CodegenError(f"threads_per_row must be a power of two from 4 to 1024, got {tpr}")
        if schedule != "online":
            schedule = "warp" if tpr <= 32 else "block"
            if math.ceil(cols / (tpr * vec)) * vec > REGISTER_MAX_FLOATS:
                raise CodegenError(f"threads_per_row={tpr} leaves {math.ceil(cols / tpr)} floats per thread "
                                   f"in registers (at most {REGISTER_MAX_FLOATS})")
        block = max(int(p["block"]), tpr) if schedule == "warp" else tpr
    split = 1
    # (the split workspace holds float partials: an int64 sum stays on one block per row)
    if schedule == "online" and not preserving and rows < int(p["sm_count"]) and acc == "float":
        # few long rows reduced away: several blocks per row, the last to finish combines the partials
        split = max(1, min(math.ceil(cols / (tpr * vec * 16)), math.ceil(2 * int(p["sm_count"]) / rows)))
        if p.get("split"):
            split = int(p["split"])
        if split > 1:
            schedule = "split"
    rows_per_block = block // tpr
    unroll = checked_unroll(p)
    items = math.ceil(cols / (tpr * vec))
    grid = math.ceil(rows / rows_per_block) * split
    names = Names()
    names.taken.update(KERNEL_LOCALS)
    arg = {v: names.new(vals[v].name) for v in io.inputs + io.outputs}
    views = ViewPrologue(program, pro, arg, names) if through_views else None
    computed = {}
    if views:
        for v in pro_inputs:
            arg.setdefault(v, names.new(vals[v].name))
            ct.setdefault(v, c_type(vals[v].dtype, f"'{vals[v].name}'"))
            computed[v] = (views.scalar[v], views.vector.get(v))
    # pass 1 reads the staged rows from shared memory, 4 at a time
    tiles = stage_tiles(program, pro, views, computed, schedule, rows_per_block, rows, cols, vec, names, p)
    index_t = index_type(max(rows * cols, views.extent if views else 0))
    # the anchor's weight and bias are referred to by fixed names in the templates
    for port, v in zip(anchor.opdef.port_names[1:], params_in):
        if v is not None:
            out_expr = out_expr.replace(f"{port.upper()}[", f"{arg[v]}[")

    ld_pro = Operands(program, x.shape, pro_inputs, names, "In", operand_views(program, chain, pro_inputs),
                       computed)
    ld_epi = Operands(program, out_space, epi_inputs, names, "Out", operand_views(program, epi, epi_inputs))
    out_vids = list(io.outputs)
    pro_outs = [v for v in out_vids if v in pro_vals]    # written by the prologue in pass 1
    epi_outs = [v for v in out_vids if v not in pro_vals]
    for v in epi_outs:
        if math.prod(vals[v].shape) != math.prod(out_space):
            raise CodegenError(f"output '{vals[v].name}' {vals[v].spec} does not match the reduction's "
                               f"output space {list(out_space)}; split the region there")

    # prologue: external inputs -> anchor input
    pn = Names()
    penv = {v: pn.new(vals[v].name) for v in pro_inputs}
    pro_lines = render_chain(program, chain, penv, pn) if chain else []
    pref = {v: pn.new(vals[v].name + "_out") for v in pro_outs}
    pro_lines += [f"  {pref[v]} = {penv[v]};" for v in pro_outs]
    psig = [f"{ct.get(v, 'float')} {penv[v]}" for v in pro_inputs] + [f"{ct[v]}& {pref[v]}" for v in pro_outs]
    pro_fn = ("// Prologue: one element of the reduction's input" + (" (and the prologue values used "
              "outside the region)" if pro_outs else "") + ".\n"
              f"__device__ __forceinline__ {acc} point({', '.join(psig)}) {{\n"
              + "\n".join(pro_lines) + f"\n  return {penv[x_vid]};\n}}\n")
    # epilogue: anchor output (+ its input, + other inputs) -> region outputs
    en = Names()
    eenv = {anchor_out: en.new(vals[anchor_out].name)}
    epi_x = any(x_vid in nodes[n].inputs for n in epi)
    if epi_x:
        eenv[x_vid] = en.new(vals[x_vid].name)
    for v in epi_inputs:
        eenv[v] = en.new(vals[v].name)
    epi_lines = []
    for n in epi:
        if n in relabels:
            eenv[nodes[n].outputs[0]] = eenv[nodes[n].inputs[0]]
        else:
            epi_lines += render_chain(program, [n], eenv, en)
    oref = {v: en.new(vals[v].name + "_out") for v in epi_outs}
    epi_lines += [f"  {oref[v]} = {eenv[v]};" for v in epi_outs]
    sig = [f"{acc} {eenv[anchor_out]}"] + ([f"{acc} {eenv[x_vid]}"] if epi_x else []) + \
          [f"{ct[v]} {eenv[v]}" for v in epi_inputs] + [f"{ct[v]}& {oref[v]}" for v in epi_outs]
    epi_fn = ("// Epilogue: one element of the reduction's output to the region's outputs.\n"
              f"__device__ __forceinline__ void store_point({', '.join(sig)}) {{\n" + "\n".join(epi_lines) + "\n}\n")

    fields, identity, fold, comb = STATES[state]
    state_code = (
        f"// Row statistics ({state}): identity, fold one element, combine two partial states.\n"
        f"struct State {{ {acc} {', '.join(fields)}; }};\n"
        f"__device__ __forceinline__ State identity() {{ return State{identity}; }}\n"
        f"__device__ __forceinline__ void fold(State& s, {acc} x) {{ {fold} }}\n"
        f"__device__ __forceinline__ State combine(State a, State b) {{\n  {comb}\n}}\n"
        "// All-reduce across the kThreadsPerRow lanes of a row (xor shuffles stay inside the group).\n"
        "__device__ __forceinline__ State group_reduce(State a) {\n"
        "#pragma unroll\n"
        "  for (int offset = kShuffleStart; offset > 0; offset >>= 1) {\n"
        "    State b;\n"
        + "".join(f"    b.{f} = __shfl_xor_sync(0xffffffffu, a.{f}, offset);\n" for f in fields)
        + "    a = combine(a, b);\n  }\n  return a;\n}\n")
    if schedule != "online" and state in ("maxsumexp", "welford"):
        for op, fn, ident in (("max", "max_nan(a, b)", "-INFINITY"), ("sum", "a + b", "0.0f")):
            state_code += (
                f"__device__ __forceinline__ float reduce_{op}(float a) {{\n"
                "#pragma unroll\n"
                "  for (int offset = kShuffleStart; offset > 0; offset >>= 1) {\n"
                f"    const float b = __shfl_xor_sync(0xffffffffu, a, offset);\n    a = {fn};\n  }}\n")
            if schedule == "block":
                state_code += (
                    "  __shared__ float partial[kWarpsPerRow];\n"
                    "  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;\n"
                    "  __syncthreads();  // the partials of an earlier reduction have been read\n"
                    "  if (lane == 0) partial[warp] = a;\n"
                    "  __syncthreads();\n"
                    f"  a = lane < kWarpsPerRow ? partial[lane] : {ident};\n"
                    "#pragma unroll\n"
                    "  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {\n"
                    f"    const float b = __shfl_xor_sync(0xffffffffu, a, offset);\n    a = {fn};\n  }}\n")
            state_code += "  return a;\n}\n"
    if schedule != "warp":
        state_code += (
            "// Block all-reduce: each warp reduces, then every warp combines the per-warp partials.\n"
            "__device__ __forceinline__ State row_reduce(State a) {\n"
            "  __shared__ State partial[kWarpsPerRow];\n"
            "  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;\n"
            "  a = group_reduce(a);\n"
            "  if (lane == 0) partial[warp] = a;\n"
            "  __syncthreads();\n"
            "  a = lane < kWarpsPerRow ? partial[lane] : identity();\n"
            "  return group_reduce(a);\n}\n")
    else:
        state_code += "__device__ __forceinline__ State row_reduce(State a) { return group_reduce(a); }\n"

    kname = kernel_name(name)
    cparams = [f"const {ct[v]}* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"{ct[v]}* __restrict__ {arg[v]}" for v in out_vids]
    vt = {v: VEC4[vals[v].dtype] for v in [*io.inputs, *io.outputs, *computed]}  # 4 lanes of each operand's type

    modes = {v: ld_pro.group_mode(v) for v in pro_inputs} if vec == 4 else {}

    def discard_name(v):
        return "discard" if vals[v].dtype == "float32" else f"discard_{vals[v].dtype}"
    discards = dict.fromkeys(discard_name(v) for v in pro_outs)
    vec_outs = [v for v in pro_outs if vals[v].dtype == "float32"] if vec == 4 else []
    discard_decl = ("  " + " ".join(f"{'float' if d == 'discard' else c_type(d[8:], d)} {d};" for d in discards)
                    + "  // prologue outputs when pass 2 evaluates the prologue again")

    def group_loads(indent, col):
        out = []
        for v in pro_inputs:
            if ld_pro.full(v) or modes.get(v) == "vec4":
                out.append(f"{indent}const {vt[v]} {arg[v]}4 = {ld_pro.load4(v, arg[v], vt[v], f'base + {col}')};")
            elif modes.get(v) == "uniform":
                out.append(f"{indent}const {ct[v]} {arg[v]}_u = {ld_pro.load(v, arg[v], f'base + {col}')};")
        return out

    def pro_args(idx, lane=None, store=True):
        """Arguments of point(): inputs at element idx, then where the prologue's outputs go (their
        tensors in pass 1; a discarded local when a later pass evaluates the prologue again)."""
        out = []
        for v in pro_inputs:
            if lane is not None and modes.get(v) == "uniform":
                out.append(f"{arg[v]}_u")
            elif lane is not None and (ld_pro.full(v) or modes.get(v) == "vec4"):
                out.append(f"{arg[v]}4.{'xyzw'[lane]}")
            else:
                out.append(ld_pro.load(v, arg[v], idx))
        out += [(f"{arg[v]}_o4.{'xyzw'[lane]}" if lane is not None and v in vec_outs else f"{arg[v]}[{idx}]")
                if store else discard_name(v) for v in pro_outs]
        return ", ".join(out)

    # epilogue operands read 4 at a time in the float4 paths: "vec4" / "full" ones as one vector
    # access, "uniform" ones (one element per 4 columns) once (as the prologue's group_loads)
    epi_modes = {v: "vec4" if ld_epi.full(v) else ld_epi.group_mode(v) for v in epi_inputs} if vec == 4 else {}
    # the anchor's weight and bias indexed by column (layer_norm, rms_norm): one vector per 4 columns
    col_params = [v for v in params_in if v is not None and f"{arg[v]}[col]" in out_expr] if vec == 4 else []

    def epi_group_loads(indent, col):
        out = []
        for v in epi_inputs:
            at = "base + " + col if ld_epi.full(v) else f"{ld_epi.fn[v]}(base + {col})"
            if epi_modes.get(v) == "vec4":
                out.append(f"{indent}const {vt[v]} {arg[v]}_e4 = reinterpret_cast<const {vt[v]}*>({arg[v]} + {at})[0];")
            elif epi_modes.get(v) == "uniform":
                out.append(f"{indent}const {ct[v]} {arg[v]}_eu = {ld_epi.load(v, arg[v], f'base + {col}')};")
        for v in col_params:
            out.append(f"{indent}const {vt[v]} {arg[v]}_w4 = reinterpret_cast<const {vt[v]}*>({arg[v]} + {col})[0];")
        return out

    def epi_operand(v, idx, lane):
        if lane is not None and epi_modes.get(v) == "vec4":
            return f"{arg[v]}_e4.{'xyzw'[lane]}"
        if lane is not None and epi_modes.get(v) == "uniform":
            return f"{arg[v]}_eu"
        return ld_epi.load(v, arg[v], idx)

    def epi_call(y, xv, idx, lane=None):
        if lane is not None:
            for v in col_params:
                y = y.replace(f"{arg[v]}[col]", f"{arg[v]}_w4.{'xyzw'[lane]}")
        a = [y] + ([xv] if epi_x else []) + [epi_operand(v, idx, lane) for v in epi_inputs]
        for v in epi_outs:
            a.append(f"{arg[v]}4.{'xyzw'[lane]}" if lane is not None else f"{arg[v]}[{idx}]")
        return f"store_point({', '.join(a)});"

    body = ([discard_decl] if pro_outs else []) + ["  const int group = threadIdx.x / kThreadsPerRow;",
            "  const int lane = threadIdx.x % kThreadsPerRow;",
            "  const index_t row = (index_t)blockIdx.x * kRowsPerBlock + group;",
            "  const bool active = row < kRows;  // inactive lanes still join the shuffles",
            "  const index_t base = row * kCols;",
            "  State st = identity();"]
    cached = schedule not in ("online", "split")
    two_stage = cached and state in ("maxsumexp", "welford")

    def load_group(indent, col, target, fold=True, store=True):
        """Lines that load kVec elements at column `col`, run the prologue and (maybe) fold them;
        store=False discards the prologue's outputs (a later pass evaluating it again). float32
        prologue outputs of a float4 group are gathered in a float4 and stored as one."""
        out = group_loads(indent, col) if vec == 4 else []
        if vec == 4 and store:
            out += [f"{indent}{vt[v]} {arg[v]}_o4;" for v in vec_outs]
        for e in range(vec):
            args = pro_args(f"base + {col} + {e}", e, store) if vec == 4 else pro_args(f"base + {col}", None, store)
            out.append(f"{indent}{target(e)} = point({args});")
            if fold:
                out.append(f"{indent}fold(st, {target(e)});")
        if vec == 4 and store:
            out += [f"{indent}reinterpret_cast<{vt[v]}*>({arg[v]} + base + {col})[0] = {arg[v]}_o4;" for v in vec_outs]
        return out

    def each_cached(lines):
        """Run `lines` (over float `xv`) for every valid element this thread holds."""
        return ["#pragma unroll", "  for (int k = 0; k < kItems; ++k) {",
                "    if (active && (k * kThreadsPerRow + lane) * kVec < kCols) {",
                "#pragma unroll", "      for (int e = 0; e < kVec; ++e) {",
                "        const float xv = v[k * kVec + e];",
                *[f"        {ln}" for ln in lines], "      }", "    }", "  }"]

    def emit_group(indent, col, source):
        """Lines that compute the output of kVec elements at column `col` and store them."""
        out = []
        if preserving:
            f4 = vec == 4
            if f4:
                out += epi_group_loads(indent, col)
                for v in epi_outs:
                    out.append(f"{indent}{vt[v]} {arg[v]}4;")
            for e in range(vec):
                c = f"{col} + {e}" if vec == 4 else col
                xe, call = source(e), epi_call(out_expr, "xe", "base + col", e if f4 else None)
                # `col` only when something indexes with it (an epilogue without broadcast inputs does not)
                col_decl = f"const int col = {c}; " if re.search(r"\bcol\b", xe + call) else ""
                # the element itself only when the epilogue reads it (a register read has no effects;
                # a re-evaluated prologue `point(...)` is always kept)
                xe_decl = f"const {acc} xe = {xe}; " if re.search(r"\bxe\b", call) or "(" in xe else ""
                if col_decl or xe_decl:
                    out.append(f"{indent}{{ {col_decl}{xe_decl}".rstrip())
                    out.append(f"{indent}  {call} }}")
                else:
                    out.append(f"{indent}{call}")
            if f4:
                for v in epi_outs:
                    out.append(f"{indent}reinterpret_cast<{vt[v]}*>({arg[v]} + base + {col})[0] = {arg[v]}4;")
        return out

    if schedule == "split":
        body = ["  const index_t row = blockIdx.x / kSplit;",
                "  const int part = blockIdx.x % kSplit;  // which of the row's kSplit blocks this is",
                "  const int lane = threadIdx.x;",
                "  const index_t base = row * kCols;",
                "  State st = identity();",
                "  // pass 1: this block's interleaved share of the row, folded into running statistics",
                "  for (int c0 = (part * kThreadsPerRow + lane) * kVec; c0 < kCols; "
                "c0 += kSplit * kThreadsPerRow * kVec) {",
                f"    {acc} v[kVec];"]
        body += load_group("    ", "c0", lambda e: f"v[{e}]")
        body += ["  }",
                 "  st = row_reduce(st);",
                 "  // publish this block's partial; the row's last block to arrive combines them all",
                 *publish_and_arrive([f"workspace[blockIdx.x * kFields + {k}] = st.{f};"
                                      for k, f in enumerate(STATES[state][0])], "counters[row]", "kSplit"),
                 "  if (!last || threadIdx.x != 0) return;",
                 "  __threadfence();",
                 "  st = identity();",
                 "  for (int k = 0; k < kSplit; ++k) {",
                 "    const float* w = workspace + (row * kSplit + k) * kFields;",
                 "    st = combine(st, State{" + ", ".join(f"__ldcg(w + {k})" for k in range(len(STATES[state][0]))) + "});",
                 "  }",
                 reset_counter("counters[row]")]
        if preamble:
            body.append(f"  {preamble}")
        body += ["  {", f"    const {acc} y = {out_expr};", f"    {epi_call('y', 'NAN', 'row')}", "  }"]
    elif cached:
        body.insert(0, f"  {acc} v[kItems * kVec];  // this thread's part of the row, kept in registers")
        body += stage_lines(tiles, vec)
        body += ["  // pass 1: load the row (prologue applied)" + ("" if two_stage else ", fold it into the statistics"),
                 "#pragma unroll",
                 "  for (int k = 0; k < kItems; ++k) {",
                 "    const int c0 = (k * kThreadsPerRow + lane) * kVec;",
                 "    if (active && c0 < kCols) {"]
        body += load_group("      ", "c0", lambda e: f"v[k * kVec + {e}]", fold=not two_stage)
        body += ["    }", "  }"]
        if state == "maxsumexp" and two_stage:
            # max first, then exponentials against it: independent exps instead of a serial chain;
            # softmax keeps each exp(x - max) in its register for pass 2 (one expf per element, the
            # same value pass 2 would compute again) unless the epilogue still reads x itself
            keep_exp = anchor.op == "softmax" and not epi_x
            sum_lines = (["const float ex = expf(xv - row_max);", "row_sum += ex;", "v[k * kVec + e] = ex;"]
                         if keep_exp else ["row_sum += expf(xv - row_max);"])
            if keep_exp:
                out_expr = "xe * inv_sum"
            body += ["  // statistics from the registers: the row max, then the sum of exp(x - max)",
                     "  float row_max = -INFINITY;", *each_cached(["row_max = max_nan(row_max, xv);"]),
                     "  row_max = reduce_max(row_max);",
                     "  float row_sum = 0.0f;", *each_cached(sum_lines),
                     "  row_sum = reduce_sum(row_sum);",
                     "  st = State{row_max, row_sum};"]
        elif state == "welford" and two_stage:
            # exact two-pass mean and variance over the registers
            body += ["  // statistics from the registers: the mean, then the sum of squared deviations",
                     "  float row_sum = 0.0f;", *each_cached(["row_sum += xv;"]),
                     "  const float row_mean = reduce_sum(row_sum) / kColsF;",
                     "  float row_m2 = 0.0f;",
                     *each_cached(["const float d = xv - row_mean;", "row_m2 = fmaf(d, d, row_m2);"]),
                     "  st = State{kColsF, row_mean, reduce_sum(row_m2)};"]
    else:
        # kUnroll vectors loaded before any is folded: one load in flight per thread leaves a lone
        # block per row (rows < SMs, or 1024 threads per SM) far below the memory's bandwidth
        body += ["  // pass 1: stream the row once, kUnroll vectors at a time, folding it into running statistics",
                 "  for (int c = lane * kVec; active && c < kCols; c += kUnroll * kThreadsPerRow * kVec) {",
                 f"    {acc} v[kUnroll * kVec];",
                 "#pragma unroll",
                 "    for (int u = 0; u < kUnroll; ++u) {",
                 "      const int c0 = c + u * kThreadsPerRow * kVec;",
                 "      if (c0 < kCols) {"]
        body += load_group("        ", "c0", lambda e: f"v[u * kVec + {e}]", fold=False)
        body += ["      }", "    }",
                 "#pragma unroll",
                 "    for (int u = 0; u < kUnroll; ++u) {",
                 "      if (c + u * kThreadsPerRow * kVec < kCols) {",
                 "#pragma unroll",
                 "        for (int e = 0; e < kVec; ++e) fold(st, v[u * kVec + e]);",
                 "      }", "    }", "  }"]
    if schedule == "split":
        pass
    elif not two_stage:
        body.append("  st = row_reduce(st);")
    if schedule != "split":
        body.append("  if (!active) return;")
        if preamble:
            body.append(f"  {preamble}")
    if schedule == "split":
        pass
    elif preserving:
        if cached:
            body += ["  // pass 2: outputs from the registers",
                     "#pragma unroll",
                     "  for (int k = 0; k < kItems; ++k) {",
                     "    const int c0 = (k * kThreadsPerRow + lane) * kVec;",
                     "    if (c0 < kCols) {"]
            body += emit_group("      ", "c0", lambda e: f"v[k * kVec + {e}]")
            body += ["    }", "  }"]
        else:
            body += ["  // pass 2: re-read the row (prologue again) kUnroll vectors at a time, then write the outputs",
                     "  for (int c = lane * kVec; c < kCols; c += kUnroll * kThreadsPerRow * kVec) {",
                     f"    {acc} v[kUnroll * kVec];",
                     "#pragma unroll",
                     "    for (int u = 0; u < kUnroll; ++u) {",
                     "      const int c0 = c + u * kThreadsPerRow * kVec;",
                     "      if (c0 < kCols) {"]
            body += load_group("        ", "c0", lambda e: f"v[u * kVec + {e}]", fold=False, store=False)
            body += ["      }", "    }",
                     "#pragma unroll",
                     "    for (int u = 0; u < kUnroll; ++u) {",
                     "      const int c0 = c + u * kThreadsPerRow * kVec;",
                     "      if (c0 < kCols) {"]
            body += emit_group("        ", "c0", lambda e: f"v[u * kVec + {e}]")
            body += ["      }", "    }", "  }"]
    else:
        body += ["  if (lane == 0) {",
                 f"    const {acc} y = {out_expr};",
                 f"    {epi_call('y', 'NAN', 'row')}",
                 "  }"]

    consts = [f"typedef {index_t} index_t;",
              f"constexpr index_t kRows = {rows};",
              f"constexpr int kCols = {cols};  // reduced length of each row",
              f"constexpr float kColsF = {float_literal(cols)};",
              f"constexpr int kVec = {vec};  // floats per load",
              f"constexpr int kThreadsPerRow = {tpr};",
              f"constexpr int kRowsPerBlock = {rows_per_block};",
              "constexpr int kBlock = kThreadsPerRow * kRowsPerBlock;",
              f"constexpr int kShuffleStart = {min(tpr, 32) // 2};",
              f"constexpr int kWarpsPerRow = {max(1, tpr // 32)};",
              "constexpr int kWarpSize = 32;"] + _norm_constants(program, anchor)
    if cached:
        consts.append(f"constexpr int kItems = {items};  // vectors per thread")
    if tiles:
        consts.append(f"constexpr int kTileStride = {tile_stride(cols)};  // floats between staged rows "
                      f"(a multiple of 4, 4 banks apart)")
    elif schedule == "online":
        consts.append(f"constexpr int kUnroll = {unroll};  // vectors each thread loads before using them")
    if schedule == "split":
        consts += [f"constexpr int kSplit = {split};  // blocks per row",
                   f"constexpr int kFields = {len(STATES[state][0])};  // floats per partial state"]
        cparams = cparams + ["float* __restrict__ workspace", "unsigned int* __restrict__ counters"]
    consts += ld_pro.consts + ld_epi.consts
    sched_text = {"warp": f"{tpr} lanes per row, {rows_per_block} rows per block, row in registers",
                  "block": f"one block of {tpr} threads per row, row in registers",
                  "online": f"one block of {tpr} threads per row, online two-pass, {unroll} vectors in flight",
                  "split": f"{split} blocks of {tpr} threads per row, last block combines"}[schedule]
    sched_text += f", {'float4' if vec == 4 else 'scalar'} loads, {grid} blocks"
    if tiles:
        sched_text += (f", the rows read through a transposing view staged in shared memory with the row "
                       f"index fastest ({', '.join(vals[v].name for v in tiles)})")
    head = header(program, f"Region {name}: {anchor.op} over rows of {cols}, stitched with "
                           f"{len(pro)} prologue and {len(epi)} epilogue op(s)", io.nodes, [
        "Inputs:  " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.inputs),
        "Outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in out_vids),
        f"{rows} rows x {cols} columns; schedule: {sched_text}.",
    ])
    if sum("discard" in ln for ln in body) == 1:   # pass 2 reads the registers: nothing to discard
        body = [ln for ln in body if "discard" not in ln]
    structs = [VEC4_STRUCTS[t] + "\n" for t in VEC4_STRUCTS if re.search(rf"\b{t}\b", "\n".join(body))]
    if views:
        body = ["  // the prologue's values through the views of its layout ops, by flat index (run start for float4)",
                *views.declarations(body), *body]
    source = kernel_source(head, consts, [*structs, *ld_pro.helpers, *ld_epi.helpers, state_code, pro_fn, epi_fn], kname,
                           cparams, body)
    if block == 1024:
        # one block fills the SM's 2048 threads halfway; told nothing more, ptxas aims for two such
        # blocks (32 registers) and spills; one block per SM lets it use the 64 registers each thread has
        source = source.replace("__launch_bounds__(kBlock)", "__launch_bounds__(kBlock, 1)", 1)
    nbytes = sum(vals[v].nbytes for v in io.inputs + out_vids)
    return KernelSource(
        name=kname, kind="row_reduction", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=out_vids, grid=(grid, 1, 1), block=(block, 1, 1), schedule=sched_text,
        params={"schedule": schedule, "threads_per_row": tpr, "rows_per_block": rows_per_block,
                "vector_width": vec, "block": block, "grid": grid, "split": split, "cols": cols,
                "unroll": unroll, "staged": bool(tiles)},
        align=16 if vec == 4 else 4, bytes_moved=nbytes,
        shared_bytes=len(tiles) * rows_per_block * tile_stride(cols) * 4,
        flops=sum(program.node_flops(n) for n in io.nodes),
        workspace=[("float32", rows * split * len(STATES[state][0])), ("int32", rows)]
        if schedule == "split" else [])


def _norm_constants(program, anchor) -> list[str]:
    """group_norm / instance_norm rows are (sample, group): the channel of element `col` of row `row`
    is (row % kGroups) * kChannelsPerGroup + col / kSpatial, which indexes weight and bias."""
    if anchor.op not in ("group_norm", "instance_norm"):
        return []
    shape = program.values[anchor.inputs[0]].shape
    chans = shape[1]
    groups = anchor.attrs["num_groups"] if anchor.op == "group_norm" else chans
    return [f"constexpr int kGroups = {groups}, kChannelsPerGroup = {chans // groups};  // row % kGroups: the group",
            f"constexpr int kSpatial = {math.prod(shape[2:])};  // elements per channel"]
