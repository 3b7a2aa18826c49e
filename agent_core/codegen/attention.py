"""Fused attention: one kernel for a region holding one scaled_dot_product_attention node (FlashAttention-2
schedule, written afresh).

A block owns a tile of Br query rows of one (batch, head) and walks the key tiles of Bc keys: scores
of the tile, an online softmax (running max and sum in fp32), the accumulator of P @ V in registers,
and one contiguous store of the output. An elementwise score (relu or sigmoid attention: score(scores)
@ V, unnormalised) keeps the schedule without the running max and sum (attention_parts.SCORES).
is_causal skips the key tiles wholly above the diagonal and masks the diagonal tile; a bool mask (-inf
where false) or a float mask (added) is read per tile through its broadcast strides, never materialised;
a row whose every key is masked gives zeros, as torch does. q, k, v and the mask are read through their strides: layout ops of the region feeding
the node (a transpose of [B, T, H, D] into [B, H, T, D], an expand of kv heads for GQA) are views, and
so are the reshapes and permutes after it: the output is stored through them (attention_store.py).

Forms (params["form"]): "fp32", plain FFMA (attention_fp32.py; what the CPU emulator runs) and
"3xtf32", m16n8k8 TF32 tensor-core products with each operand split into hi + lo parts
(attention_mma.py), fp32-accurate. attention_supported() is what the planner and the raising of
written-out attention ask before they propose the kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Program
from ..ops.common import broadcasts_to
from . import views as V
from .attention_mma import Q_REGS_LIMIT, TILE_ACC_LIMIT
from .attention_parts import cost
from .attention_reads import strided_reads
from .attention_store import chain_after, store_layout
from .kernel import CodegenError, KernelSource, pow2_at_least
from .region_io import RegionIO

SDPA = "scaled_dot_product_attention"
FORMS = ("fp32", "3xtf32")
HEAD_DIMS = (16, 256)        # q / k head dims the kernels are written for
VALUE_DIM_LIMIT = 256
MASK_DTYPES = ("bool", "float32")


def attention_supported(program: Program, node_id: str) -> str | None:
    """None when this SDPA node can run as the fused attention kernel, else the one-line reason."""
    n = program.nodes.get(node_id)
    if n is None:
        return f"no node '{node_id}'"
    if n.op != SDPA:
        return f"{n.name} is {n.op}, not {SDPA}"
    if len(n.inputs) < 3 or any(v is None for v in n.inputs[:3]):
        return f"{n.name}: query, key and value must all be connected"
    vals = program.values
    q, k, v = (vals[x] for x in n.inputs[:3])
    mask = vals[n.inputs[3]] if len(n.inputs) > 3 and n.inputs[3] is not None else None
    for t, what in ((q, "query"), (k, "key"), (v, "value")):
        if t.dtype != "float32":
            return f"{n.name}: the {what} is {t.dtype}; the fused attention kernel reads float32"
        if len(t.shape) < 2:
            return f"{n.name}: the {what} has rank {len(t.shape)}"
    if mask is not None and mask.dtype not in MASK_DTYPES:
        return f"{n.name}: the mask is {mask.dtype}; bool or float32 masks are read"
    E, Ev, L, S = q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2]
    if not HEAD_DIMS[0] <= E <= HEAD_DIMS[1]:
        return f"{n.name}: head dim {E} of query/key is outside {HEAD_DIMS[0]}..{HEAD_DIMS[1]}"
    if not 1 <= Ev <= VALUE_DIM_LIMIT:
        return f"{n.name}: value head dim {Ev} is outside 1..{VALUE_DIM_LIMIT}"
    if L < 1 or S < 1:
        return f"{n.name}: empty attention ({L} queries, {S} keys)"
    if bool(n.attrs.get("is_causal")) and mask is not None:
        return f"{n.name}: both is_causal and a mask"
    out = vals[n.outputs[0]]
    batch = tuple(out.shape[:-2])
    for t, what in ((q, "query"), (k, "key"), (v, "value")):
        if not broadcasts_to(tuple(t.shape[:-2]), batch):
            return f"{n.name}: the {what}'s batch dims {list(t.shape[:-2])} do not broadcast to {list(batch)}"
    if mask is not None and not broadcasts_to(tuple(mask.shape), batch + (L, S)):
        return f"{n.name}: the mask {list(mask.shape)} does not broadcast to the scores {list(batch + (L, S))}"
    return None


@dataclass
class Operand:
    """One tensor the kernel reads: the region input it comes from, its element offset, the strides
    of the output's batch dims (0 where broadcast) and of its last two dims (rows, columns)."""
    value: str
    offset: int
    batch_strides: tuple
    row_stride: int
    col_stride: int
    extent: int            # elements of the buffer (for the index type)


@dataclass
class AttentionSpec:
    node: str
    batch: tuple           # batch dims walked: the output's, split finer where a view packs two into one
    L: int
    S: int
    E: int
    Ev: int
    scale: float
    causal: bool
    mask_kind: str | None  # None, "bool" or "float"
    q: Operand
    k: Operand
    v: Operand
    mask: Operand | None
    out: str               # the value the region writes: the node's output or the last view after it
    store: Operand         # where each output element goes in it (strides over out)
    score: str = "softmax"  # or "relu" / "sigmoid": score(scores) @ v, unnormalised (no running max or sum)

    @property
    def nbatch(self) -> int:
        return math.prod(self.batch)


def attention_spec(program: Program, io: RegionIO) -> AttentionSpec:
    """What the kernel reads and writes; CodegenError when the region is not one attention node with
    only views (layout ops) before it."""
    sdpa = [n for n in io.nodes if program.nodes[n].op == SDPA]
    if len(sdpa) != 1:
        raise CodegenError(f"an attention region holds one {SDPA} node, this one holds {len(sdpa)}")
    nid = sdpa[0]
    node = program.nodes[nid]
    why = attention_supported(program, nid)
    if why:
        raise CodegenError(why, node_id=nid)
    layouts = {vid: V.Layout.of(vid, program.values[vid].shape) for vid in io.inputs}
    after = chain_after(program, io.nodes, nid)
    for other in io.nodes:
        if other == nid or other in after:
            continue
        on = program.nodes[other]
        try:
            outs = V.apply_op(on.op, on.attrs, [layouts[v] for v in on.inputs if v])
        except (V.ViewError, KeyError):
            raise CodegenError(f"{on.name} ({on.op}) is not a view the attention kernel can read through; "
                               f"only layout ops before {node.name} join its region", node_id=other) from None
        layouts.update(zip(on.outputs, outs))
    out, stored = store_layout(program, nid, after, list(io.outputs))   # through the views after it
    vals = program.values
    batch = tuple(vals[node.outputs[0]].shape[:-2])
    qv, kv, vv = node.inputs[:3]
    mv = node.inputs[3] if len(node.inputs) > 3 else None
    L, S = vals[qv].shape[-2], vals[kv].shape[-2]
    E, Ev = vals[qv].shape[-1], vals[vv].shape[-1]
    reads = {"query": layouts[qv], "key": layouts[kv], "value": layouts[vv], "output": stored}
    if mv is not None:
        reads["mask"] = V.expand(_lift(layouts[mv], len(batch) + 2), batch + (L, S))
    batch, reads = strided_reads(batch, reads)     # a packed batch dim (B * heads) split finer
    ops = [_operand(program, reads[w], batch, w) for w in ("query", "key", "value")]
    mask = _operand(program, reads["mask"], batch, "mask") if mv is not None else None
    store = _operand(program, reads["output"], batch, "output")
    scale = node.attrs.get("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(E)
    causal = bool(node.attrs.get("is_causal")) and mv is None
    mask_kind = None if mv is None else ("bool" if vals[mv].dtype == "bool" else "float")
    return AttentionSpec(nid, batch, L, S, E, Ev, scale, causal, mask_kind, *ops, mask, out, store,
                         node.attrs.get("score") or "softmax")


def _lift(lay: V.Layout, rank: int) -> V.Layout:
    while len(lay.shape) < rank:
        lay = V.unsqueeze(lay, 0)
    return lay


def _operand(program: Program, lay: V.Layout, batch: tuple, what: str) -> Operand:
    read = lay.single
    view = read.stack.layers[-1] if read is not None and len(read.stack.layers) == 1 else None
    if view is None or not isinstance(view, V.View) or view.mask is not None:
        verb = "stores through" if what == "output" else "reads"
        raise CodegenError(f"the {what} is not a plain strided view of one tensor (a pad, cat or reshape of a "
                           f"permuted view); the attention kernel {verb} strided views only")
    shape, strides = view.shape, view.strides
    nb = len(shape) - 2
    if nb > len(batch):
        raise CodegenError(f"the {what} has more batch dims than the output")
    bs = (0,) * (len(batch) - nb) + tuple(0 if s == 1 else st for s, st in zip(shape[:nb], strides[:nb]))
    return Operand(read.source, view.offset, bs, strides[-2] if shape[-2] > 1 else 0,
                   strides[-1] if shape[-1] > 1 else 0, math.prod(program.values[read.source].shape))


def default_params(spec: AttentionSpec, form: str | None = None) -> dict:
    """Tiles and warps by head dim (never by a benchmark's shapes): the tensor-core form keeps a
    16-row slab of queries per warp; wide heads take narrower key tiles to keep the accumulator and
    the shared tiles within budget; Q's split fragments stay in registers up to head dim 64; the
    blocks per SM (and so the registers ptxas may use) follow from the shared memory (min_blocks None)."""
    form = form or "3xtf32"
    d = max(spec.E, spec.Ev)
    if form == "fp32":    # no wider than the queries and keys there are: ViT's attention over 2 tokens
        # (KernelBench level 3, 28) kept 2 of 32 rows busy in each of its 1576 blocks
        return {"form": "fp32", "block_rows": min(32 if d <= 128 else 16, pow2_at_least(spec.L)),
                "block_cols": min(32, pow2_at_least(spec.S)), "warps": 4}
    q_regs = math.ceil(spec.E / 8) * 8 <= Q_REGS_LIMIT   # QK's loop is unrolled whole either way
    # P V summed per key tile, then added to the running output by FFMA: accumulated by the tensor cores
    # over all S keys it was 1.7e-4 off float64 at S = 16384 (nn.MultiheadAttention over [0, 1) inputs),
    # 2.3e-6 per tile (tools/attention_accuracy_probe.py); its second accumulator spills past Ev 128
    tile_acc = math.ceil(spec.Ev / 8) * 8 <= TILE_ACC_LIMIT
    return {"form": "3xtf32", "block_rows": 64, "block_cols": 64 if d <= 64 else 32, "warps": 4, "stages": None,
            "unroll": 2 if q_regs else 0, "q_regs": q_regs, "min_blocks": None, "tile_acc": tile_acc}


def generate_attention(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    spec = attention_spec(program, io)
    params = dict(params or {})
    form = params.get("form") or "3xtf32"
    if form not in FORMS:
        raise CodegenError(f"attention form '{form}' is not one of {', '.join(FORMS)}")
    p = {**default_params(spec, form), **{k: v for k, v in params.items() if v is not None}}
    if form == "fp32":
        from .attention_fp32 import render_fp32
        return render_fp32(program, io, name, spec, p)
    from .attention_mma import render_mma
    return render_mma(program, io, name, spec, p)


def tune_variants(p: dict) -> list[dict]:
    """Alternatives to the default: the other form, other key tiles and warp counts."""
    form = p.get("form", "3xtf32")
    out = [{"form": "fp32" if form == "3xtf32" else "3xtf32", "block_rows": None, "block_cols": None}]
    if form == "3xtf32":
        # the other key tile unrolled by 2 (64 keys at head dim 128 unrolled whole spill their scores)
        out += [{"block_cols": 32 if p.get("block_cols") == 64 else 64, "unroll": 2}, {"warps": 8, "block_rows": 128},
                {"warps": 2, "block_rows": 32}, {"unroll": 1}, {"unroll": 2 if p.get("unroll") == 0 else 0}]
        out += [{"block_cols": 16}] if p.get("block_cols") == 32 else []
        out += [{"q_regs": not p.get("q_regs")}] if p.get("q_regs") else []
        # narrow heads: 128 rows a block with the inner loops unrolled whole (H200, d 32, 16384 keys:
        # 5.52 ms for 128 rows, 5.63 unrolled whole, 5.76 for the default)
        out += [{"warps": 8, "block_rows": 128, "unroll": 0}] if p.get("q_regs") else []
    else:
        out += [{"block_rows": 64 if p.get("block_rows") != 64 else 32}, {"block_cols": 64}]
    return [{**p, "stages": None, "min_blocks": None, **c} for c in out]


__all__ = ["AttentionSpec", "FORMS", "Operand", "SDPA", "attention_spec", "attention_supported", "cost",
           "default_params", "generate_attention", "tune_variants"]
