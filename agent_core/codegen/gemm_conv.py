"""The tile GEMM's convolution form (codegen/gemm_mma.py runs it): a conv1d / conv2d / conv3d and the
pointwise ops after it as ONE implicit-GEMM kernel on the tensor cores (split TF32).

The GEMM is out[m, n] = sum_k A[m, k] B[k, n] with
- m = (image, output position): M = batch x output positions;
- n = output channel: N = Cout (per group: a grouped convolution is one GEMM per group, along grid z,
  and takes 8 or more output channels per group);
- k = (input channel, kernel tap): K = Cin x taps (per group);
- A the input's patches, never written out: each k slice of an A tile is gathered from the input as
  it is copied into shared memory, zero where a tap falls into the padding;
- B the weight, read as linear's [N, K] (torch's [Cout, Cin, *kernel] is already k-contiguous).
The output is stored in the convolution's own layout [batch, Cout, *out], so the epilogue indexes it,
and its broadcast operands, as the ops after the convolution see it.

Why: cuDNN runs fp32 convolutions over few input channels (3 or 8: K = 27 to 216) on the FMA units,
and the epilogue then makes a second pass over the output. Here the products run on the tensor cores
in split TF32, and the output is written once.

The gather: each thread copies one row of every A tile (kBlock % kBM == 0), so its window's origin is
worked out once and kept in registers. A table of the kernel's taps in shared memory (each tap's input
offset from the window's origin, and its position per spatial dim) is filled once per CTA, so a copied
element k costs one division by the tap count (k = channel x taps + tap; a multiply and a shift,
`divide`), a table read, and only where a window can cross the input's border (padding, or a 'same'
padding after the input) a bounds test: one bit of the thread's mask of its window's taps inside the
input (worked out once, up to MASK_TAPS taps), else a test per spatial dim of the tap's packed
position, with no branch either way. A warp's lanes take consecutive rows, whose output positions read
neighbouring input elements; its four groups of 8 lanes take four neighbouring columns (rotated within the slice), so the
rows' stores into shared memory, 4 words apart in banks, fall into 32 different banks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .conv import conv_geometry
from .kernel import CodegenError

CONV_OPS = ("conv1d", "conv2d", "conv3d")
# names the gather declares in the kernel's scope (the epilogue's value names must not take them)
LOCALS = ("arow", "abase", "acol", "atap", "amask", "adst", "at", "cc", "gc", "ci", "t", "ps", "j", "inside",
          "grp", "wgrp") + tuple(f"ao{j}" for j in range(3))
POSITION_BITS = 10          # a tap's position (dilation x index) per spatial dim, packed in one int of the table
MASK_TAPS = 32              # up to this many taps, a thread keeps which of its window's are inside as bits
OUTSIDE = -(1 << 30)        # a row past M: its window origin, outside every input dim
MIN_GROUP_CHANNELS = 8      # output channels per group: an m16n8 fragment's width
GROUP_LIMIT = 65535         # groups along grid z
FEW_CHANNELS = 8            # input channels per group of a convolution whose own forms are timed (few_channels)


@dataclass(frozen=True)
class ConvGeom:
    """A convolution's geometry, spatial dims in order (depth, height, width)."""
    batch: int
    cin: int
    cout: int
    in_size: tuple
    out_size: tuple
    kernel: tuple
    stride: tuple
    pad: tuple
    dil: tuple
    groups: int = 1       # a grouped convolution is one GEMM per group (grid z)

    @property
    def cin_g(self) -> int:
        return self.cin // self.groups

    @property
    def cout_g(self) -> int:
        return self.cout // self.groups

    @property
    def positions(self) -> int:
        return math.prod(self.out_size)

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    @property
    def bounded(self) -> bool:
        """Whether some window reaches past the input's border (padding before it, or the last window
        past its end), so the gather tests each tap's position."""
        return any(p > 0 or (o - 1) * s + (k - 1) * d >= n for p, o, s, k, d, n in
                   zip(self.pad, self.out_size, self.stride, self.kernel, self.dil, self.in_size))

    def words(self) -> str:
        x = "x".join(map(str, self.kernel))
        extra = "".join(f", {name} {list(v)}" for name, v, plain in
                        (("stride", self.stride, 1), ("padding", self.pad, 0), ("dilation", self.dil, 1))
                        if any(e != plain for e in v))
        per = f" in {self.groups} groups" if self.groups > 1 else ""
        return f"{x} kernel over {self.cin} input channels{per}{extra}"


def conv_geom(program, node) -> ConvGeom:
    """The geometry of a conv node the implicit GEMM takes; CodegenError says why not."""
    vals = program.values
    d = int(node.op[-2])
    x, w, y = vals[node.inputs[0]], vals[node.inputs[1]], vals[node.outputs[0]]
    if len(x.shape) != d + 2:
        raise CodegenError(f"{node.name} ({node.op}): an unbatched input {x.spec}; the implicit-GEMM "
                           f"convolution takes [batch, channels, *spatial]", node_id=node.id)
    groups = int(node.attrs.get("groups", 1))
    if groups < 1 or w.shape[1] * groups != x.shape[1] or w.shape[0] % groups:
        raise CodegenError(f"{node.name} ({node.op}): groups={groups} does not split {x.shape[1]} input and "
                           f"{w.shape[0]} output channels", node_id=node.id)
    if groups > 1 and w.shape[0] // groups < MIN_GROUP_CHANNELS:
        raise CodegenError(f"{node.name} ({node.op}): {w.shape[0] // groups} output channel(s) per group (groups="
                           f"{groups}); the implicit GEMM takes {MIN_GROUP_CHANNELS} or more, one m16n8 tile's "
                           f"width (a depthwise convolution has too few products per byte for tensor cores)",
                           node_id=node.id)
    if groups > GROUP_LIMIT:
        raise CodegenError(f"{node.name} ({node.op}): {groups} groups exceed the grid's {GROUP_LIMIT}", node_id=node.id)
    kernel = tuple(w.shape[2:])
    stride, pad, dil, _ = conv_geometry(node, d, list(kernel))
    return ConvGeom(x.shape[0], x.shape[1], w.shape[0], tuple(x.shape[2:]), tuple(y.shape[2:]), kernel,
                    tuple(stride), tuple(pad), tuple(dil), groups)


def few_channels(program, node) -> bool:
    """A convolution of at most FEW_CHANNELS input channels per group through more than one tap (RGB or
    8-channel 3x3 / 3x3x3): cuDNN runs it in fp32 far from the time of its bytes (level 2's ten such
    problems were 0.75-0.94x of torch.compile), so the agent times its own forms even when it is
    memory-bound."""
    w = program.values[node.inputs[1]].shape
    return w[1] <= FEW_CHANNELS and math.prod(w[2:]) > 1


def _affine(x: str, scale: int, shift: int) -> str:
    """C text of x * scale + shift, without a unit scale or a zero shift."""
    out = x if scale == 1 else f"{x} * {scale}"
    return out if shift == 0 else f"{out} {'+' if shift > 0 else '-'} {abs(shift)}"


def consts(g: ConvGeom) -> list[str]:
    return [f"constexpr int kS = {g.positions};   // output positions per image and channel",
            f"constexpr int kCout = {g.cout};   // output channels ({g.groups} group(s) of kN)",
            f"constexpr int kTaps = {g.taps};   // kernel taps: k = input channel x kTaps + tap",
            f"constexpr index_t kInSpatial = {math.prod(g.in_size)};   // input elements per channel"]


def table_ints(g: ConvGeom) -> int:
    """Ints of the tap table the kernel keeps in shared memory after its pipeline's buffers: each tap's
    offset, and its packed position per dim where the gather tests bounds."""
    return g.taps * (2 if g.bounded else 1)


def weight(g: ConvGeom, w: str) -> tuple[list[str], str]:
    """(C lines at the kernel's start, the name B is read from): a grouped convolution's CTA reads its
    group's [N, K] rows of the weight."""
    if g.groups == 1:
        return [], w
    return ["  const int grp = blockIdx.z;   // this CTA's group",
            f"  const float* wgrp = {w} + (index_t)grp * kN * kK;   // its [N, K] weight rows"], "wgrp"


def channel(g: ConvGeom) -> str:
    """The output channel of GEMM column `col`."""
    return "grp * kN + col" if g.groups > 1 else "col"


def row_registers(g: ConvGeom) -> list[str]:
    """C lines at the kernel's start (bm: the CTA's first row; Bs: the pipeline's B buffers): the one
    row of every A tile this thread copies (kBlock % kBM == 0), as an input offset (and, where windows
    reach past the border, its window's origin per spatial dim), kept in registers for the whole k
    loop; then the CTA's tap table. A row past M reads row 0's window (its products are never stored),
    or, where bounds are tested, gets origins outside every input dim."""
    d = len(g.out_size)
    bounded = g.bounded
    lines = ["  const int arow = tid % kBM;   // this thread's row of each A tile",
             "  // its first column of each A tile, rotated by its lane's group of 8 (conflict-free shared stores)",
             "  const unsigned acol = tid / kBM + ((tid & 31) >> 3);",
             *([f"  int {', '.join(f'ao{j}' for j in range(d))};   // its window's origin per spatial dim"]
               if bounded else []),
             "  index_t abase;                // its window's origin as an offset into the input",
             "  {",
             "    int m = bm + arow;",
             "    const bool inside = m < kM;",
             "    if (!inside) m = 0;"]
    for j in reversed(range(d)):
        origin = _affine(f"m % {g.out_size[j]}", g.stride[j], -g.pad[j])
        lines.append(f"    const int o{j} = {origin}; m /= {g.out_size[j]};")
    # Horner over (image, the group's first channel, origin); origins may be < 0
    offset = f"(index_t)m * {g.cin}" + (f" + grp * {g.cin_g}" if g.groups > 1 else "")
    for j in range(d):
        offset = f"({offset}) * {g.in_size[j]} + o{j}"
    lines += [f"    abase = {offset};",
              *([f"    ao{j} = inside ? o{j} : {OUTSIDE};" for j in range(d)] if bounded else []),
              "  }"]
    lines += _tap_table(g)
    if g.bounded and g.taps <= MASK_TAPS:    # which taps of its window are inside the input, once
        lines += ["  unsigned amask = 0;   // bit t: tap t of this thread's window lies inside the input",
                  "  for (int t = 0; t < kTaps; ++t) {",
                  "    const int ps = atap[kTaps + t];",
                  f"    amask |= (unsigned)({_inside(g, 'ps')}) << t;",
                  "  }"]
    return lines


def _tap_table(g: ConvGeom) -> list[str]:
    """C lines: the CTA fills the tap table (after the pipeline's buffers in shared memory): tap t's
    input offset from a window's origin, and (bounds tested) its position per dim, POSITION_BITS each."""
    d = len(g.out_size)
    if g.bounded and max(dl * (k - 1) for dl, k in zip(g.dil, g.kernel)) >= 1 << POSITION_BITS:
        raise CodegenError(f"implicit-GEMM convolution: a kernel of {list(g.kernel)} taps at dilation {list(g.dil)} "
                           f"spans {1 << POSITION_BITS} or more input elements along one dim")
    lines = ["  int* atap = reinterpret_cast<int*>(Bs + kStages * kBTile);   // the tap table: [kTaps] offsets"
             + (", [kTaps] positions" if g.bounded else ""),
             "  for (int t = tid; t < kTaps; t += kBlock) {",
             "    int r = t;"]
    for j in reversed(range(d)):
        lines.append(f"    const int d{j} = {_affine(f'r % {g.kernel[j]}', g.dil[j], 0)}; r /= {g.kernel[j]};")
    offset = "d0"
    for j in range(1, d):
        offset = f"({offset}) * {g.in_size[j]} + d{j}"
    lines.append(f"    atap[t] = {offset};")
    if g.bounded:
        lines.append(f"    atap[kTaps + t] = {' | '.join(f'd{j} << {POSITION_BITS * j}' if j else 'd0' for j in range(d))};")
    return lines + ["  }", "  __syncthreads();   // every thread's gather reads the table"]


def gather_lines(g: ConvGeom, src: str, indent: str) -> list[str]:
    """C lines inside load_tile(kt, stage): the A tile's k slice gathered from the input `src`. Each
    thread copies its row's columns tid / kBM + j kBlock / kBM, rotated by its lane's group of 8
    (acol): a warp's 8 lanes of a group take 8 consecutive rows of one column, consecutive output positions
    that read neighbouring input elements."""
    test = "(gc < kK)"
    lines = [f"{indent}float* adst = As + stage * kATile + arow * kAS;",
             f"{indent}#pragma unroll",
             f"{indent}for (int j = 0; j < kBK / (kBlock / kBM); ++j) {{   // (check: kBlock / kBM divides kBK)",
             f"{indent}  // unsigned: the % is a mask where kBK is a power of two",
             f"{indent}  const unsigned cc = (acol + j * (kBlock / kBM)) % kBK;",
             # gc < K + kBK, and the tile GEMM takes k slices of at most 64 (gemm_mma._check)
             f"{indent}  const unsigned gc = k0 + cc, ci = {divide('gc', g.taps, g.cin_g * g.taps + 64)}, "
             f"t = gc - ci * kTaps;"]
    if g.bounded and g.taps <= MASK_TAPS:
        test += " & ((amask >> t) & 1u)"
    elif g.bounded:
        lines.append(f"{indent}  const int ps = atap[kTaps + t];")
        # & rather than &&: every test evaluated, no branch per test (lanes at the border would diverge)
        test += " & " + _inside(g, "ps")
    lines += [f"{indent}  const bool ok = {test};",
              f"{indent}  const index_t at = abase + (index_t)ci * kInSpatial + atap[t];   // formed even if not ok",
              f"{indent}  cp_async4(adst + cc, {src} + (ok ? at : 0), ok);",
              f"{indent}}}"]
    return lines


def _inside(g: ConvGeom, ps: str) -> str:
    """C test that the tap of packed positions `ps` lies inside the input for this thread's window."""
    mask = (1 << POSITION_BITS) - 1
    fields = [f"({ps} & {mask})" if j == 0 else f"(({ps} >> {POSITION_BITS * j}) & {mask})"
              for j in range(len(g.in_size))]
    return " & ".join(f"((unsigned)(ao{j} + {fields[j]}) < {g.in_size[j]}u)" for j in range(len(g.in_size)))


def divide(x: str, d: int, limit: int) -> str:
    """C text of x / d for an unsigned x below `limit`: a shift for a power of two, else a multiply by
    m = ceil(2^s / d) and a shift where that is exact over the range (it is when (limit - 1) * (m d - 2^s)
    < 2^s, and the product stays within 32 bits): two instructions, where the compiler's division by a
    constant, exact for every unsigned, takes a multiply-high and a fix-up of three more."""
    if d & (d - 1) == 0:
        return f"({x} >> {d.bit_length() - 1})"
    for s in range(d.bit_length(), 32):
        m = -(-(1 << s) // d)
        if (limit - 1) * m >= 1 << 32:
            break
        if (limit - 1) * (m * d - (1 << s)) < 1 << s:
            return f"(({x} * {m}u) >> {s})"
    return f"({x} / {d}u)"


def store_index(g: ConvGeom) -> str:
    """The flat index of output element (row, col) in the convolution's layout [batch, Cout, *out]."""
    return f"const index_t i = ((index_t)(row / kS) * kCout + {channel(g)}) * kS + row % kS;"


def default_tiles(g: ConvGeom, K: int) -> dict:
    """Tiles for a convolution's thin output (N = Cout per group, often 8 to 64): 128 rows a block; its
    columns cover the channels rounded up to 8 (one warp across) or 16 (two); k slices of 32 or the
    smallest of 8 and 16 that holds a smaller K; two stages when the slices are that few."""
    bn = 8 if g.cout_g <= 8 else min(128, 16 * math.ceil(g.cout_g / 16))
    wm, wn = {8: (4, 1), 128: (2, 4)}.get(bn, (4, 2))
    bk = next(b for b in (8, 16, 32) if b >= K or b == 32)
    stages = 2 if math.ceil(K / bk) <= 2 else 3
    return {"block_m": 128, "block_n": bn, "block_k": bk, "warps_m": wm, "warps_n": wn, "stages": stages}


# most promising first, by level 2's 7 on an H100: 64 rows 3.94 ms, 128 rows 4.13, a warp across all 32
# columns 4.15 (it splits each A element once, not once per warp along N, but holds more registers), 256
# rows 4.68 (at d149cbf, when 128 rows took 4.40)
THIN_VARIANTS = ({"block_m": 64, "warps_m": 2}, {"warps_n": 1}, {"block_m": 256, "warps_m": 8},
                 {"block_k": 16, "stages": 4})


def check(p: dict) -> None:
    block, bm, bk = 32 * int(p["warps_m"]) * int(p["warps_n"]), int(p["block_m"]), int(p["block_k"])
    if block % bm or bm % 32 or bk % (block // bm):
        raise CodegenError(f"implicit-GEMM convolution: {block} threads do not split into the {bm} rows "
                           f"(whole warps of rows) and {bk} columns of a tile")


__all__ = ["CONV_OPS", "ConvGeom", "LOCALS", "THIN_VARIANTS", "channel", "check", "consts", "conv_geom",
           "default_tiles", "few_channels", "gather_lines", "row_registers", "store_index", "table_ints", "weight"]
