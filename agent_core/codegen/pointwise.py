"""Pointwise and broadcast chains: one kernel that evaluates the region's expression tree per element.

Schedule: a grid-stride loop over groups of four contiguous elements with vector loads (float4, int4,
2 x 16 bytes for int64, 4 bytes for the byte types) and
stores for the operands that span the whole iteration space, index arithmetic for broadcast operands,
and a scalar tail for the last numel % 4 elements.
"""
from __future__ import annotations

import math
import re

from ..ir import Program
from ..ops.common import broadcast
from .cuda import (MAX_GRID_X, VEC4, VEC4_STRUCTS, Names, c_type, float_literal, header, index_type, kernel_name,
                   render_pointwise)
from .kernel import CodegenError, KernelSource
from .region_io import BroadcastIndex, RegionIO

# cover: a grid of every group (kUnroll per thread) instead of the SMs' resident blocks looping over them
# (the layout gather's measured default, H100: SwiGLU's gate 192 -> 182 us); a tuning variant here
DEFAULTS = {"block": 256, "vector_width": 4, "sm_count": 132, "threads_per_sm": 2048, "unroll": 4, "cover": False}
LANES = ("x", "y", "z", "w")
BROADCAST_ONLY = ("expand",)  # layout ops that index arithmetic already expresses


def is_elementwise(node) -> bool:
    """Pointwise ops, expand, and batch_norm in eval mode (a per-channel affine map)."""
    return (node.opdef.category == "pointwise" or node.op in BROADCAST_ONLY
            or (node.op == "batch_norm" and not node.attrs.get("training")))


def operand_views(program: Program, order: list[str], inputs: list[str]) -> dict[str, tuple]:
    """The shape each external input is indexed with: its own, except batch_norm's per-channel
    parameters, which line up with dim 1 of the normalized input ([C] -> [C, 1, 1] for NCHW)."""
    views = {v: tuple(program.values[v].shape) for v in inputs}
    channel: dict[str, tuple] = {}
    for nid in order:
        node = program.nodes[nid]
        if node.op != "batch_norm":
            continue
        rank = len(program.values[node.inputs[0]].shape)
        for v in node.inputs[1:]:
            if v is None:
                continue
            if v not in views:
                raise CodegenError(f"{node.name}: its statistics or affine parameters are computed inside "
                                   f"the region; only inputs and parameters are supported there", node_id=nid)
            channel[v] = (program.values[v].shape[0],) + (1,) * (rank - 2)
    for nid in order:  # a channel parameter read elsewhere with its own shape cannot have both views
        node = program.nodes[nid]
        if node.op != "batch_norm" and any(v in channel for v in node.inputs):
            raise CodegenError(f"{node.name} reads a batch_norm parameter directly; split the region",
                               node_id=nid)
    views.update(channel)
    return views


def _batch_norm_expr(node, args: list[str]) -> str:
    x, rm, rv = args[0], args[1], args[2]
    expr = f"({x} - {rm}) * rsqrtf({rv} + {float_literal(node.attrs['eps'])})"
    if len(args) > 3 and node.inputs[3] is not None:
        expr += f" * {args[3]}"
    if len(args) > 4 and node.inputs[4] is not None:
        expr += f" + {args[4]}"
    return expr


def render_chain(program: Program, order: list[str], env: dict[str, str], names: Names,
                 indent: str = "  ") -> list[str]:
    """SSA lines for pointwise nodes in order; env maps value ids to C names (inputs filled in)."""
    lines = []
    for nid in order:
        node = program.nodes[nid]
        if node.op in BROADCAST_ONLY:
            # expand is broadcasting made explicit: per element of the iteration space it is its input
            env[node.outputs[0]] = env[node.inputs[0]]
            continue
        if not is_elementwise(node):
            raise CodegenError(f"{node.name} ({node.op}) is not pointwise and cannot join a "
                               f"pointwise chain", node_id=nid)
        if node.op == "batch_norm":
            for v in node.inputs:
                if v is not None and program.values[v].dtype != "float32":
                    raise CodegenError(f"{node.name} (batch_norm) reads '{program.values[v].name}' of dtype "
                                       f"{program.values[v].dtype}; it is generated for float32", node_id=nid)
            expr = _batch_norm_expr(node, [env[v] if v is not None else "" for v in node.inputs])
        else:
            args = [env[v] for v in node.inputs if v is not None]
            expr = render_pointwise(node, args, program)
        out = program.values[node.outputs[0]]
        ident = names.new(out.name)
        note = node.name if node.name == node.op else f"{node.name}: {node.op}"
        lines.append(f"{indent}const {c_type(out.dtype, out.name)} {ident} = {expr};  // {note}")
        env[out.id] = ident
    return lines


def iteration_space(program: Program, io: RegionIO) -> tuple[int, ...]:
    shapes = [program.values[v].shape for nid in io.nodes for v in program.nodes[nid].outputs]
    return broadcast(*shapes)


def generate_pointwise(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    p = {**DEFAULTS, **(params or {})}
    space = iteration_space(program, io)
    numel = math.prod(space)
    if numel == 0:
        raise CodegenError("the region computes an empty tensor; there is nothing to launch")
    vals = program.values
    for vid in io.outputs:
        v = vals[vid]
        if math.prod(v.shape) != numel:
            raise CodegenError(f"output '{v.name}' {v.spec} is smaller than the region's iteration space "
                               f"{list(space)}; it would be written many times (split the region there)")
    operands = io.inputs + io.outputs
    for vid in operands:
        c_type(vals[vid].dtype, f"'{vals[vid].name}'")
    views = operand_views(program, io.nodes, io.inputs)
    bidx = BroadcastIndex(space, [views.get(v, vals[v].shape) for v in operands])
    index_t = index_type(numel)

    names = Names()
    arg = {vid: names.new(vals[vid].name) for vid in operands}
    full = {vid: bidx.is_full(k) for k, vid in enumerate(operands)}
    # every operand dtype has a 4-lane vector type (VEC4): full-size operands load and store 4 at a time
    vt = {vid: VEC4[vals[vid].dtype] for vid in operands}
    vec = p["vector_width"] == 4 and numel >= 4 and any(full[v] for v in operands)
    width = 4 if vec else 1
    num_vec = numel // width if vec else 0

    # constants of the broadcast index arithmetic
    consts = [f"constexpr index_t kNumel = {numel};"]
    if vec:
        consts += ["constexpr index_t kVecWidth = 4;  // elements per vector access",
                   "constexpr index_t kNumVec = kNumel / kVecWidth;",
                   f"constexpr int kUnroll = {int(p['unroll'])};  // vector groups in flight per thread"]
    size_names = [f"kSize{g}" for g in range(len(bidx.sizes))]
    inner_names = [f"kInner{g}" for g in range(len(bidx.sizes))]
    offsets, helpers = {}, []
    needed = set()
    for k, vid in enumerate(operands[:len(io.inputs)]):
        if full[vid]:
            continue
        if bidx.is_scalar(k):
            offsets[vid] = None
            continue
        stride_names = [f"k{arg[vid].capitalize()}Stride{g}" if st not in (0, 1) else None
                        for g, st in enumerate(bidx.strides[k])]
        for g, st in enumerate(bidx.strides[k]):
            if st:
                needed.add(g)
                if stride_names[g]:
                    consts.append(f"constexpr index_t {stride_names[g]} = {st};")
        fn = f"{arg[vid]}_offset"
        expr = bidx.offset_expr(k, "i", size_names, inner_names, stride_names)
        helpers.append(f"// {vals[vid].name} {list(vals[vid].shape)} is broadcast over {list(space)}\n"
                       f"__device__ __forceinline__ index_t {fn}(index_t i) {{ return {expr}; }}\n")
        offsets[vid] = fn
    for g in sorted(needed):
        consts.insert(1, f"constexpr index_t {size_names[g]} = {bidx.sizes[g]}, "
                         f"{inner_names[g]} = {bidx.inner[g]};")

    # the per-element body
    pn = Names()
    env = {vid: pn.new(vals[vid].name) for vid in io.inputs}
    out_ref = {vid: pn.new(vals[vid].name + "_out") for vid in io.outputs}
    body = render_chain(program, io.nodes, env, pn)
    for vid in io.outputs:
        body.append(f"  {out_ref[vid]} = {env[vid]};")
    sig = [f"{c_type(vals[v].dtype, '')} {env[v]}" for v in io.inputs] + \
          [f"{c_type(vals[v].dtype, '')}& {out_ref[v]}" for v in io.outputs]
    point = ("// One element of the fused chain.\n"
             f"__device__ __forceinline__ void point({', '.join(sig)}) {{\n" + "\n".join(body) + "\n}\n")

    # broadcast operands in the vector body: when the innermost merged dimension has a multiple of 4
    # elements, the 4 lanes of a group share one element (uniform) or read 4 contiguous ones (vec4)
    group_mode = {}
    if vec:
        for k_, vid in enumerate(io.inputs):
            if full[vid] or offsets.get(vid) is None or bidx.sizes[-1] % 4:
                continue
            last = bidx.strides[k_][-1]
            if last == 0:
                group_mode[vid] = "uniform"
            elif last == 1:
                group_mode[vid] = "vec4"

    def load(vid: str, idx: str, lane: int | None) -> str:
        if lane is not None and vid in group_mode:
            return f"{arg[vid]}_u" if group_mode[vid] == "uniform" else f"{arg[vid]}4.{LANES[lane]}"
        if full[vid]:
            if lane is not None:
                return f"{arg[vid]}4[u].{LANES[lane]}"
            return f"{arg[vid]}[{idx}]"
        fn = offsets[vid]
        return f"{arg[vid]}[0]" if fn is None else f"{arg[vid]}[{fn}({idx})]"

    def store(vid: str, idx: str, lane: int | None) -> str:
        if lane is not None:
            return f"{arg[vid]}4.{LANES[lane]}"
        return f"{arg[vid]}[{idx}]"

    params_c = [f"const {c_type(vals[v].dtype, '')}* __restrict__ {arg[v]}" for v in io.inputs] + \
               [f"{c_type(vals[v].dtype, '')}* __restrict__ {arg[v]}" for v in io.outputs]
    kname = kernel_name(name)
    k = [f'extern "C" __global__ void __launch_bounds__(kBlock)\n{kname}({", ".join(params_c)}) {{',
         "  const index_t first = (index_t)blockIdx.x * blockDim.x + threadIdx.x;",
         "  const index_t stride = (index_t)gridDim.x * blockDim.x;"]
    if vec:
        k += ["  // vector body: kUnroll groups of 4 elements per thread and step, all loads issued first",
              "  for (index_t v0 = first; v0 < kNumVec; v0 += stride * kUnroll) {"]
        full_f32 = [v for v in io.inputs if full[v]]
        for vid in full_f32:
            k.append(f"    {vt[vid]} {arg[vid]}4[kUnroll];")
        if full_f32:
            k += ["#pragma unroll", "    for (int u = 0; u < kUnroll; ++u) {",
                  "      const index_t v = v0 + u * stride;",
                  "      if (v < kNumVec) {"]
            k += [f"        {arg[vid]}4[u] = reinterpret_cast<const {vt[vid]}*>({arg[vid]})[v];" for vid in full_f32]
            k += ["      }", "    }"]
        k += ["#pragma unroll", "    for (int u = 0; u < kUnroll; ++u) {",
              "      const index_t v = v0 + u * stride;",
              "      if (v >= kNumVec) break;"]
        body_start = len(k)
        for vid, mode in group_mode.items():
            if mode == "uniform":
                k.append(f"      const {c_type(vals[vid].dtype, '')} {arg[vid]}_u = {arg[vid]}[{offsets[vid]}(i)];"
                         "  // the same for all 4 lanes")
            else:
                k.append(f"      const {vt[vid]} {arg[vid]}4 = reinterpret_cast<const {vt[vid]}*>({arg[vid]} + "
                         f"{offsets[vid]}(i))[0];")
        for vid in io.outputs:
            k.append(f"      {vt[vid]} {arg[vid]}4;")
        for lane in range(4):
            idx = "i" if lane == 0 else f"i + {lane}"
            a = [load(v, idx, lane) for v in io.inputs] + [store(v, idx, lane) for v in io.outputs]
            k.append(f"      point({', '.join(a)});")
        for vid in io.outputs:
            k.append(f"      reinterpret_cast<{vt[vid]}*>({arg[vid]})[v] = {arg[vid]}4;")
        if any(re.search(r"\bi\b", line) for line in k[body_start:]):  # element index, when used
            k.insert(body_start, "      const index_t i = v * kVecWidth;")
        k += ["    }", "  }"]
        if numel % 4:
            k += [f"  // scalar tail: the last {numel % 4} element(s)",
                  "  for (index_t i = kNumVec * kVecWidth + first; i < kNumel; i += stride) {"]
    else:
        k.append("  for (index_t i = first; i < kNumel; i += stride) {")
    if not vec or numel % 4:
        a = [load(v, "i", None) for v in io.inputs] + [store(v, "i", None) for v in io.outputs]
        k += [f"    point({', '.join(a)});", "  }"]
    k.append("}")

    block = int(p["block"])
    work = num_vec if vec else numel
    max_blocks = int(p["sm_count"]) * max(1, int(p["threads_per_sm"]) // block)
    per_thread = int(p["unroll"]) if vec else 1
    grid = max(1, min(math.ceil(work / (block * per_thread)), MAX_GRID_X)) if p["cover"] else \
        max(1, min(math.ceil(work / block), max_blocks))
    vec_kinds = "/".join(dict.fromkeys(vt[v] for v in operands if full[v]))
    schedule = (f"{vec_kinds if vec else 'scalar'} grid-stride loop, {block} threads x {grid} blocks"
                + (f", scalar tail of {numel % 4}" if vec and numel % 4 else ""))
    ins_desc = [f"{vals[v].name} {vals[v].spec}" + ("" if full[v] else " (broadcast)") for v in io.inputs]
    head = header(program, f"Region {name}: pointwise chain of {len(io.nodes)} op(s)", io.nodes, [
        "Inputs:  " + ", ".join(ins_desc),
        "Outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.outputs),
        f"Iteration space {list(space)}; schedule: {schedule}.",
    ])
    source = "\n".join([
        head,
        f"typedef {index_t} index_t;",
        f"constexpr int kBlock = {block};",
        *consts, "",
        *[VEC4_STRUCTS[t] + "\n" for t in dict.fromkeys(vt.values()) if vec and t in VEC4_STRUCTS
          and re.search(rf"\b{t}\b", "\n".join(k))],
        *helpers,
        point,
        "\n".join(k), "",
    ])
    nbytes = sum(vals[v].nbytes for v in operands)
    return KernelSource(
        name=kname, kind="pointwise", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=(block, 1, 1), schedule=schedule,
        params={"block": block, "vector_width": width, "grid": grid, "unroll": int(p["unroll"]) if vec else 1,
                "cover": bool(p["cover"])},
        align=16 if vec else 4,
        bytes_moved=nbytes, flops=sum(program.node_flops(n) for n in io.nodes))
