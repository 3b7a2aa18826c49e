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
worked out once and kept in registers; a copied element costs its tap's division chain (by constants),
an add and a bounds test per spatial dim. A warp's lanes take consecutive rows, whose output positions
read neighbouring input elements: its copies of one column are coalesced.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .conv import conv_geometry
from .kernel import CodegenError

CONV_OPS = ("conv1d", "conv2d", "conv3d")
# names the gather declares in the kernel's scope (the epilogue's value names must not take them)
LOCALS = ("arow", "abase", "adst", "gc", "tap", "inside", "grp", "wgrp") + tuple(f"ao{j}" for j in range(3))
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
            f"constexpr int kCout = {g.cout};   // output channels ({g.groups} group(s) of kN)"]


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
    """C lines at the kernel's start (bm: the CTA's first row): the one row of every A tile this thread
    copies (kBlock % kBM == 0), as its window's origin per spatial dim and as an input offset, kept in
    registers for the whole k loop; a row past M gets origins outside every input dim."""
    d = len(g.out_size)
    lines = ["  const int arow = tid % kBM;   // this thread's row of each A tile",
             f"  int {', '.join(f'ao{j}' for j in range(d))};   // its window's origin per spatial dim",
             "  index_t abase;                // ... as an offset into the input",
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
              *[f"    ao{j} = inside ? o{j} : {OUTSIDE};" for j in range(d)],
              "  }"]
    return lines


def gather_lines(g: ConvGeom, src: str, indent: str) -> list[str]:
    """C lines inside load_tile(kt, stage): the A tile's k slice gathered from the input `src`. Each
    thread copies its row's columns c = tid / kBM + j kBlock / kBM: a warp's 32 lanes take 32
    consecutive rows of one column, consecutive output positions that read neighbouring input elements
    (one or a few 128-byte lines per copy instruction)."""
    d = len(g.out_size)
    lines = [f"{indent}float* adst = As + stage * kATile + arow * kAS;",
             f"{indent}for (int c = tid / kBM; c < kBK; c += kBlock / kBM) {{",
             f"{indent}  const int gc = k0 + c;",
             f"{indent}  int tap = gc;"]
    for j in reversed(range(d)):
        lines.append(f"{indent}  const int t{j} = {_affine(f'tap % {g.kernel[j]}', g.dil[j], 0)}; tap /= {g.kernel[j]};")
    coff = "(index_t)tap"
    for j in range(d):
        coff = f"({coff} * {g.in_size[j]} + t{j})"
    inside = " && ".join(f"(unsigned)(ao{j} + t{j}) < {g.in_size[j]}u" for j in range(d))
    lines += [f"{indent}  const bool ok = gc < kK && {inside};",
              f"{indent}  cp_async4(adst + c, {src} + (ok ? abase + {coff} : 0), ok);",
              f"{indent}}}"]
    return lines


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


THIN_VARIANTS = ({"block_m": 256, "warps_m": 8}, {"block_m": 64, "warps_m": 2}, {"block_k": 16, "stages": 4})


def check(p: dict) -> None:
    block = 32 * int(p["warps_m"]) * int(p["warps_n"])
    if block % int(p["block_m"]):
        raise CodegenError(f"implicit-GEMM convolution: {block} threads do not split into the {p['block_m']} "
                           f"rows of a tile")


__all__ = ["CONV_OPS", "ConvGeom", "LOCALS", "THIN_VARIANTS", "channel", "check", "consts", "conv_geom",
           "default_tiles", "few_channels", "gather_lines", "row_registers", "store_index", "weight"]
