"""Pieces both attention kernels share: the kernel's parameters, the per-(batch, head) base offsets of
q, k, v, the mask and the output, the score rule (scale, mask, causal, bounds) and the KernelSource.

`spec` is codegen/attention.py's AttentionSpec (duck-typed here, so this module imports none of it).
"""
from __future__ import annotations

import math

from ..ir import Program
from .cuda import float_literal, header, kernel_name
from .kernel import KernelSource
from .region_io import RegionIO

GRID_Y = 65535        # batch (batch x heads) blocks per grid row; the rest go to grid z
OPERANDS = ("q", "k", "v", "mask")


def parameters(program: Program, io: RegionIO) -> tuple[list[str], dict[str, str]]:
    """(C parameters in the region's input then output order, value id -> parameter name)."""
    names, cparams = {}, []
    for j, vid in enumerate(io.inputs):
        ctype = "bool" if program.values[vid].dtype == "bool" else "float"
        names[vid] = f"in{j}"
        cparams.append(f"const {ctype}* __restrict__ in{j}")
    names[io.outputs[0]] = "out"
    cparams.append("float* __restrict__ out")
    return cparams, names


def constants(spec, block: int, br: int, bc: int) -> list[str]:
    return [f"constexpr int kBlock = {block};", f"constexpr int kBr = {br};", f"constexpr int kBc = {bc};",
            f"constexpr int kL = {spec.L};", f"constexpr int kS = {spec.S};", f"constexpr int kE = {spec.E};",
            f"constexpr int kEv = {spec.Ev};", f"constexpr int kBatch = {spec.nbatch};",
            f"constexpr float kScale = {float_literal(spec.scale)};",
            f"constexpr int kQTiles = {math.ceil(spec.L / br)};"]


def operands(spec) -> dict:
    return {"q": spec.q, "k": spec.k, "v": spec.v, "mask": spec.mask}


def base_offsets(spec, names: dict[str, str], br: int) -> list[str]:
    """C lines: which (batch, query tile) this block owns and each operand's base pointer for it
    (64-bit offsets; broadcast batch dims have stride 0, GQA's shared kv heads among them)."""
    rev = " kQTiles - 1 - (int)blockIdx.x" if spec.causal else " (int)blockIdx.x"
    lines = ["  const long long bidx = (long long)blockIdx.z * %d + blockIdx.y;" % GRID_Y,
             "  if (bidx >= kBatch) return;",
             f"  const int q0 = ({rev.strip()}) * kBr;   // causal: the longest rows start first",
             "  long long rest = bidx;"]
    coords = []
    for d in reversed(range(len(spec.batch))):
        size = spec.batch[d]
        lines.append(f"  const long long c{d} = rest % {size}; rest /= {size};")
        coords.append(d)
    for key, op in operands(spec).items():
        if op is None:
            continue
        terms = [str(op.offset)] + [f"c{d} * {st}LL" for d, st in enumerate(op.batch_strides) if st]
        ctype = "bool" if key == "mask" and spec.mask_kind == "bool" else "float"
        lines.append(f"  const {ctype}* __restrict__ g{key} = {names[op.value]} + ({' + '.join(terms)});")
    st = spec.store
    terms = [str(st.offset)] + [f"c{d} * {s}LL" for d, s in enumerate(st.batch_strides) if s]
    lines.append(f"  float* __restrict__ gout = out + ({' + '.join(terms)});")
    return lines


def out_at(spec, row: str, col: str) -> str:
    """C expression: the output element of query `row`, value column `col` (through the store's strides:
    the reshapes and permutes after the node)."""
    st = spec.store
    return f"gout[(long long)({row}) * {st.row_stride} + (long long)({col}) * {st.col_stride}]"


def grid(spec, br: int) -> tuple[int, int, int]:
    nb = spec.nbatch
    return (math.ceil(spec.L / br), min(nb, GRID_Y), math.ceil(nb / GRID_Y))


# elementwise scores (no softmax): their C expressions of a logit x; a masked -inf maps to 0 and a NaN
# stays NaN, as torch's relu and sigmoid give
SCORES = {"relu": "(x > 0.0f || x != x) ? x : 0.0f", "sigmoid": "1.0f / (1.0f + expf(-x))"}


def score_words(score: str) -> str:
    """How a score turns into the weights of V, for schedules and reasons."""
    return "online softmax" if score == "softmax" else f"{score} scores, unnormalised"


def score_rule(spec, s: str, row: str, key: str, log2e: bool = False) -> list[str]:
    """C lines turning the raw dot product `s` of query `row` and key `key` into its logit: scaled,
    masked (bool: -inf where false; float: added), causal, -inf for keys past S. log2e: in base 2
    (the tensor-core form's exp2)."""
    scale = "kScale * 1.4426950408889634f" if log2e else "kScale"
    lines = [f"{s} *= {scale};"]
    if spec.mask is not None:
        m = spec.mask
        at = f"gmask[(long long){row} * {m.row_stride} + (long long){key} * {m.col_stride}]"
        guard = f"{row} < kL && {key} < kS"
        if spec.mask_kind == "bool":
            lines.append(f"if ({guard} && !{at}) {s} = -INFINITY;")
        else:
            add = f"{at} * 1.4426950408889634f" if log2e else at
            lines.append(f"if ({guard}) {s} += {add};")
    if spec.causal:
        lines.append(f"if ({key} > {row}) {s} = -INFINITY;")
    lines.append(f"if ({key} >= kS) {s} = -INFINITY;")
    return lines


def key_tiles(spec) -> str:
    """C expression: the number of key tiles this block walks (causal: none wholly above the diagonal)."""
    if spec.causal:
        return "min((kS + kBc - 1) / kBc, (min(q0 + kBr, kL) - 1) / kBc + 1)"
    return "(kS + kBc - 1) / kBc"


def kernel_source_text(program: Program, io: RegionIO, spec, title: str, notes: list[str], consts: list[str],
                       helpers: list[str], kname: str, cparams: list[str], body: list[str], block: int,
                       min_blocks: int | None = None) -> str:
    """min_blocks: __launch_bounds__'s blocks per SM (ptxas then caps the registers to fit them)."""
    head = header(program, title, io.nodes, notes)
    bounds = f"{block}, {min_blocks}" if min_blocks else f"{block}"
    return "\n".join([head, *consts, "", *helpers,
                      f'extern "C" __global__ void __launch_bounds__({bounds})\n{kname}({", ".join(cparams)}) {{',
                      *body, "}", ""])


def cost(spec, program: Program) -> tuple[int, int]:
    """(bytes moved: q, k, v and the mask read once, the output written once; flops 4 B L S D with
    D the mean of the two head dims, half when causal)."""
    vals = program.values
    nbytes = sum(vals[o.value].nbytes for o in operands(spec).values() if o is not None)
    nbytes += vals[spec.out].nbytes
    flops = 2 * spec.nbatch * spec.L * spec.S * (spec.E + spec.Ev)
    return nbytes, flops // 2 if spec.causal else flops


def build(program: Program, io: RegionIO, name: str, spec, source: str, *, br: int, block: int, shared: int,
          schedule: str, params: dict, align: int = 4) -> KernelSource:
    nbytes, flops = cost(spec, program)
    return KernelSource(name=kernel_name(name), kind="attention", source=source, node_ids=list(io.nodes),
                        inputs=list(io.inputs), outputs=list(io.outputs), grid=grid(spec, br), block=(block, 1, 1),
                        shared_bytes=shared, schedule=schedule, params=dict(params), align=align,
                        bytes_moved=nbytes, flops=flops)


def mask_words(spec) -> str:
    return {None: "no mask", "bool": "bool mask (-inf where false)", "float": "float mask added"}[spec.mask_kind]


def notes_for(spec, br: int, bc: int, block: int, form: str) -> list[str]:
    """The header comment's lines on what the kernel was specialised for."""
    return [f"batch {list(spec.batch)}, {spec.L} queries x {spec.S} keys, head dims {spec.E} (q, k) and {spec.Ev} (v),",
            f"scale {spec.scale:.6g}, {'causal, ' if spec.causal else ''}{mask_words(spec)}; form {form};",
            f"blocks of {block} threads own {br} query rows and walk key tiles of {bc};",
            f"output stored at batch strides {list(spec.store.batch_strides)}, row stride {spec.store.row_stride}, "
            f"column stride {spec.store.col_stride}."]
