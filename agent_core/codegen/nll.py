"""nll_loss: the negative log-likelihood of int64 class targets, -weight[t] * input[n, t, s].

input is [C] (one sample), [N, C] or [N, C, d1, ...]; target holds one class index per (sample,
position): [] / [N] / [N, d1, ...]. Element e of the target (n = e / D, s = e % D, D = d1 * ...)
reads input[(n * C + t) * D + s]. A target equal to ignore_index contributes 0 and no weight.

  reduction "none": one thread per target (grid-stride), output [N, d1, ...] ([] for a [C] input);
  reduction "sum" / "mean": one block of 1024 threads loops over all N * D targets and reduces the
      losses (and for mean the weights of the targets that count) with shuffles and shared memory:
      deterministic, no atomics. N * D is one loss per sample (or pixel) in practice; a very large
      one is serial over 1024 threads. mean divides by the summed weight (the count without a weight),
      so all targets ignored gives 0 / 0 = NaN, as torch does.

A target outside [0, C) that is not ignore_index makes torch raise; the kernel reads nothing out of
bounds and gives NaN for that element (and so a NaN sum or mean) instead.
"""
from __future__ import annotations

import math

from ..ir import Program
from .cuda import Names, header, index_type, kernel_name, kernel_source
from .kernel import CodegenError, KernelSource
from .region_io import RegionIO
from .rowwalk import single_node

DEFAULTS = {"block": 256, "reduce_block": 1024, "sm_count": 132}
WARP = 32
KERNEL_LOCALS = ("nll_term", "warp_sum", "block_sum", "partial", "loss_sum", "weight_sum", "w", "t", "e",
                 "stride", "warp", "lane", "sample", "pos")


def generate_nll_loss(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    p = {**DEFAULTS, **(params or {})}
    vals = program.values
    node = single_node(program, io, ("nll_loss",), "nll_loss")
    x, tg, out = vals[node.inputs[0]], vals[node.inputs[1]], vals[node.outputs[0]]
    wv = vals[node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] else None
    for v, want in ((x, "float32"), (tg, "int64"), (out, "float32")) + (((wv, "float32"),) if wv else ()):
        if v.dtype != want:
            raise CodegenError(f"{node.name} (nll_loss): '{v.name}' has dtype {v.dtype}; the kernel reads "
                               f"{want} (float32 log-probabilities and weights, int64 targets)", node_id=node.id)
    reduction, ignore = node.attrs["reduction"], int(node.attrs["ignore_index"])
    if len(x.shape) == 1:
        samples, classes, spatial = 1, x.shape[0], 1
    else:
        samples, classes, spatial = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    numel = samples * spatial  # targets
    if numel == 0 or classes == 0:
        raise CodegenError(f"{node.name} (nll_loss) has an empty input {list(x.shape)}; there is nothing "
                           f"to launch", node_id=node.id)
    index_t = index_type(math.prod(x.shape))

    names = Names()
    names.taken.update(KERNEL_LOCALS)
    arg = {v: names.new(vals[v].name) for v in io.inputs + io.outputs}  # (a [C] input may be its own weight)
    xa, ta, oa = arg[x.id], arg[tg.id], arg[out.id]
    wa = arg[wv.id] if wv else None
    kname = kernel_name(name)
    cparams = [f"const {'long long' if v == tg.id else 'float'}* __restrict__ {arg[v]}" for v in io.inputs]
    cparams.append(f"float* __restrict__ {oa}")

    consts = [f"typedef {index_t} index_t;",
              f"constexpr index_t kTargets = {numel};  // N * d1 * ...: one loss each",
              f"constexpr long long kClasses = {classes};",
              f"constexpr long long kIgnoreIndex = {ignore};"]
    if spatial > 1:
        consts.insert(3, f"constexpr index_t kSpatial = {spatial};  // d1 * ... : positions per sample")
        at = "(e / kSpatial * kClasses + t) * kSpatial + e % kSpatial"
        where = "input[n, t, s] with n = e / kSpatial, s = e % kSpatial"
    else:
        at = "e * kClasses + t"
        where = "input[e, t]" if len(x.shape) > 1 else "input[t]"
    weight_of = f"{wa}[t]" if wa else "1.0f"
    wparam = f", const float* __restrict__ {wa}" if wa and wa != xa else ""
    helpers = [
        "// The loss of target e and the weight it adds to the mean's divisor:",
        f"// -weight[t] * {where}.",
        "// ignore_index: no loss and no weight. A class outside [0, kClasses) (torch raises): NaN, and",
        "// nothing is read out of bounds.",
        f"__device__ __forceinline__ float nll_term(const float* __restrict__ {xa}, "
        f"const long long* __restrict__ {ta}{wparam}, index_t e, float& w) {{",
        f"  const long long t = {ta}[e];",
        "  if (t == kIgnoreIndex) { w = 0.0f; return 0.0f; }",
        "  if (t < 0 || t >= kClasses) { w = NAN; return NAN; }",
        f"  w = {weight_of};",
        f"  return -w * {xa}[{at}];",
        "}",
    ]
    args = f"{xa}, {ta}{', ' + wa if wa and wa != xa else ''}"
    if reduction == "none":
        block = int(p["block"])
        grid = max(1, min(math.ceil(numel / block), int(p["sm_count"]) * (2048 // block)))
        consts.append(f"constexpr int kBlock = {block};")
        body = ["  const index_t stride = (index_t)gridDim.x * kBlock;",
                "  for (index_t e = (index_t)blockIdx.x * kBlock + threadIdx.x; e < kTargets; e += stride) {",
                "    float w;  // not needed without a reduction",
                f"    {oa}[e] = nll_term({args}, e, w);",
                "  }"]
        sched = f"one thread per target, grid-stride, {grid} blocks of {block}"
    else:
        block, grid = int(p["reduce_block"]), 1
        consts += [f"constexpr int kBlock = {block};  // the one block reduces every target",
                   f"constexpr int kWarpSize = {WARP}, kWarps = kBlock / kWarpSize;"]
        helpers += [
            "__device__ __forceinline__ float warp_sum(float v) {",
            "#pragma unroll",
            "  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);",
            "  return v;",
            "}",
            "// Sum over the block in a fixed order (deterministic): warps, then the per-warp partials.",
            "__device__ __forceinline__ float block_sum(float v) {",
            "  __shared__ float partial[kWarps];",
            "  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;",
            "  v = warp_sum(v);",
            "  __syncthreads();  // an earlier call has read its partials",
            "  if (lane == 0) partial[warp] = v;",
            "  __syncthreads();",
            "  return warp_sum(lane < kWarps ? partial[lane] : 0.0f);",
            "}",
        ]
        body = ["  float loss_sum = 0.0f, weight_sum = 0.0f;",
                "  for (index_t e = threadIdx.x; e < kTargets; e += kBlock) {",
                "    float w;",
                f"    loss_sum += nll_term({args}, e, w);",
                "    weight_sum += w;",
                "  }",
                "  loss_sum = block_sum(loss_sum);"]
        if reduction == "mean":
            body += ["  weight_sum = block_sum(weight_sum);",
                     f"  if (threadIdx.x == 0) {oa}[0] = loss_sum / weight_sum;  // all ignored: 0 / 0 = NaN, as torch"]
        else:
            body.append(f"  if (threadIdx.x == 0) {oa}[0] = loss_sum;")
        sched = f"one block of {block} threads over all {numel} targets, block reduction"

    wdesc = f", {wv.name} {wv.spec} (class weights)" if wv else ""
    head = header(program, f"Region {name}: nll_loss (reduction {reduction}) of {list(x.shape)}", io.nodes, [
        f"Inputs:  {x.name} {x.spec} (log-probabilities), {tg.name} {tg.spec} (class indices){wdesc}",
        f"Outputs: {out.name} {out.spec}",
        f"{numel} targets over {classes} classes, ignore_index {ignore}; schedule: {sched}.",
        "A target outside [0, C) (torch raises) gives NaN instead of reading out of bounds.",
    ])
    source = kernel_source(head, consts, [*helpers, ""], kname, cparams, body)
    # the memory floor: targets, the one input element each reads, the weight, the output
    nbytes = tg.nbytes + numel * 4 + (wv.nbytes if wv else 0) + out.nbytes
    return KernelSource(
        name=kname, kind="nll_loss", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=(block, 1, 1), schedule=sched,
        params={"reduction": reduction, "grid": grid, "block": block}, align=8, bytes_moved=nbytes,
        flops=program.node_flops(node.id))
