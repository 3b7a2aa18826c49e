"""Small builders of attention programs (one scaled_dot_product_attention node, optionally reading a
transposed view of its query, a GQA key/value with fewer heads, a bool or float mask): what the
attention tests and tools/bench_attention.py generate, run and compare with torch."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Program

MASKS = (None, "causal", "bool", "float", "padding")


@dataclass(frozen=True)
class Case:
    B: int
    H: int
    L: int
    S: int
    E: int
    Ev: int | None = None
    mask: str | None = None      # one of MASKS
    kv_heads: int | None = None  # GQA / MQA: fewer key/value heads, expanded to H
    q_view: bool = False         # q given as [B, L, H, E] and transposed inside the region
    score: str = "softmax"       # or "relu" / "sigmoid": score(scores) @ v, unnormalised

    @property
    def ev(self) -> int:
        return self.Ev or self.E

    def label(self) -> str:
        extra = [self.mask or "nomask"] + ([f"gqa{self.kv_heads}"] if self.kv_heads else []) + \
            (["qview"] if self.q_view else []) + ([self.score] if self.score != "softmax" else [])
        return f"B{self.B}xH{self.H}xL{self.L}xS{self.S}xE{self.E}xEv{self.ev}-" + "-".join(extra)


def attention_program(c: Case) -> tuple[Program, list[str]]:
    """(program, the node ids of the attention region)."""
    p = Program("attention_" + c.label().replace("-", "_"))
    hk = c.kv_heads or c.H
    group = c.H // hk
    # GQA / MQA: heads as [kv heads, group]; k and v have one head per group, expanded (stride 0)
    qshape = (c.B, hk, group) if c.kv_heads else (c.B, c.H)
    q = p.add_input("q", qshape[:1] + (c.L,) + qshape[1:] + (c.E,) if c.q_view else qshape + (c.L, c.E))
    kvshape = (c.B, hk, 1) if c.kv_heads else (c.B, c.H)
    k = p.add_input("k", kvshape + (c.S, c.E))
    v = p.add_input("v", kvshape + (c.S, c.ev))
    nodes, ins = [], [q.id, k.id, v.id]
    if c.q_view:     # [B, L, heads..., E] -> [B, heads..., L, E]
        t = p.add_node("permute", [q.id], {"dims": [0] + list(range(2, len(qshape) + 1)) + [1, len(qshape) + 1]})
        nodes.append(t.id)
        ins[0] = t.outputs[0]
    if c.kv_heads:
        for j in (1, 2):
            d = p.values[ins[j]].shape[-1]
            e = p.add_node("expand", [ins[j]], {"size": [c.B, hk, group, c.S, d]})
            nodes.append(e.id)
            ins[j] = e.outputs[0]
    if c.mask == "bool":
        ins.append(p.add_input("mask", (c.L, c.S), dtype="bool").id)
    elif c.mask == "float":
        ins.append(p.add_input("mask", (c.B,) + (1,) * (len(qshape) - 1) + (c.L, c.S)).id)
    elif c.mask == "padding":
        ins.append(p.add_input("mask", (c.B,) + (1,) * len(qshape) + (c.S,), dtype="bool").id)
    n = p.add_node("scaled_dot_product_attention", ins, {"is_causal": c.mask == "causal", "score": c.score})
    p.mark_output(n.outputs[0])
    nodes.append(n.id)
    return p, nodes


def reference_inputs(c: Case, program: Program, inputs: list[str], seed: int = 0, device="cpu"):
    """Random tensors for the region's inputs (by value id order): normal q/k/v; masks with a fully
    masked row (bool: row 1 all false; float: row 2 all -inf) where L allows; padding: the last
    quarter of keys of each batch element off."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for vid in inputs:
        val = program.values[vid]
        if val.dtype == "bool" and c.mask == "padding":
            t = torch.ones(val.shape, dtype=torch.bool)
            t[..., c.S - max(c.S // 4, 0):] = False if c.S > 1 else True
        elif val.dtype == "bool":
            t = torch.rand(val.shape, generator=g) > 0.3
            if c.L > 1:
                t[..., 1, :] = False
        else:
            t = torch.randn(val.shape, generator=g)
            if val.name == "mask" and c.L > 2:
                t[..., 2, :] = float("-inf")
        out.append(t.to(device))
    return out


def reference(c: Case, tensors: dict, dtype=None):
    """torch's SDPA (or the op's relu / sigmoid attention) on the case's tensors (name -> tensor), in `dtype`
    (float64 for the reference)."""
    import torch.nn.functional as F

    from ..ops.matmul import pointwise_attention
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    if c.q_view:
        q = q.movedim(1, -2)
    if c.kv_heads:
        k, v = k.expand(*q.shape[:-2], *k.shape[-2:]), v.expand(*q.shape[:-2], *v.shape[-2:])
    mask = tensors.get("mask")
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        if mask is not None and mask.is_floating_point():
            mask = mask.to(dtype)
    if c.score != "softmax":
        return pointwise_attention(q, k, v, mask, c.mask == "causal", None, c.score)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=c.mask == "causal")
