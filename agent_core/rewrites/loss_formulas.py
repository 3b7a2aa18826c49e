"""Losses written out as torch's formulas for them: pointwise ops, then a reduction (ops/loss.py holds
the ops; lowering.py's lower_all dispatches here). Each formula is torch's own (aten's Loss.cpp and
Distance.cpp), so the engine's numeric check and tests/test_loss_formulas.py hold it to the op's
reference (tests/test_lowering.py the older losses').
"""
from __future__ import annotations

from ..ir import Program
from .edits import Rewrite

FLT_MIN = 1.17549435e-38   # smallest normal float: log(max(t, FLT_MIN)) is finite and t * it is 0 at t = 0
LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "cosine_similarity")
FORMULA_LOSSES = ("hinge_loss", "hinge_embedding_loss", "margin_ranking_loss", "binary_cross_entropy",
                  "pairwise_distance", "triplet_margin_loss", "cosine_embedding_loss")


def add_op(p: Program, op: str, ins, **attrs) -> str:
    return p.add_node(op, list(ins), attrs).outputs[0]


def reduce_loss(p: Program, v: str, reduction: str, batch: int) -> str:
    if reduction == "none":
        return v
    if reduction == "batchmean":
        return add_op(p, "div_scalar", [add_op(p, "sum", [v], dim=None, keepdim=False)], value=float(batch))
    return add_op(p, reduction, [v], dim=None, keepdim=False)      # "mean" or "sum" over every element


def pointwise_loss(p: Program, op: str, a: str, b: str, attrs: dict) -> str:
    """The per-element loss of op at (a, b)."""
    if op == "kl_div":         # target * (log target - input); a holds log-probabilities
        if attrs.get("log_target"):
            return add_op(p, "mul", [add_op(p, "exp", [b]), add_op(p, "sub", [b, a])])
        logt = add_op(p, "log", [add_op(p, "max_scalar", [b], value=FLT_MIN)])
        return add_op(p, "mul", [b, add_op(p, "sub", [logt, a])])
    d = add_op(p, "sub", [a, b])
    if op == "mse_loss":
        return add_op(p, "square", [d])
    ad = add_op(p, "abs", [d])
    if op == "l1_loss":
        return ad
    # with m = min(|d|, k): smooth_l1 = 0.5 m^2 / beta + (|d| - m), huber = 0.5 m^2 + delta (|d| - m)
    k = float(attrs["beta"] if op == "smooth_l1_loss" else attrs["delta"])
    if k <= 0:
        return ad if op == "smooth_l1_loss" else add_op(p, "mul_scalar", [ad], value=0.0)
    m = add_op(p, "min_scalar", [ad], value=k)
    quad = add_op(p, "mul_scalar", [add_op(p, "square", [m])], value=0.5 / k if op == "smooth_l1_loss" else 0.5)
    lin = add_op(p, "sub", [ad, m])
    if op == "huber_loss":
        lin = add_op(p, "mul_scalar", [lin], value=k)
    return add_op(p, "add", [quad, lin])


def cosine(p: Program, x1: str, x2: str, dim: int, eps: float) -> str:
    """x1 . x2 / (max(|x1|, eps) max(|x2|, eps)) along dim, which is removed (torch clamps each norm)."""
    def norm(x):
        return add_op(p, "max_scalar", [add_op(p, "sqrt", [add_op(p, "sum", [add_op(p, "square", [x])], dim=[dim],
                                                            keepdim=False)])], value=eps)
    dot = add_op(p, "sum", [add_op(p, "mul", [x1, x2])], dim=[dim], keepdim=False)
    return add_op(p, "div", [dot, add_op(p, "mul", [norm(x1), norm(x2)])])


def where_target(p: Program, target: str, value: float, then: str, like: str) -> str:
    """then where target == value, else 0 (torch's where(target == value, then, zeros))."""
    hit = add_op(p, "eq", [target, add_op(p, "full_like", [target], fill_value=value)])
    return add_op(p, "where", [hit, then, add_op(p, "full_like", [like], fill_value=0.0)])


def pairwise(p: Program, x1: str, x2: str, norm_p: float, eps: float, keepdim: bool = False) -> str:
    """torch.pairwise_distance: the p-norm of x1 - x2 + eps along the last dim."""
    rank = max(len(p.values[x1].shape), len(p.values[x2].shape))
    d = add_op(p, "add_scalar", [add_op(p, "sub", [x1, x2])], value=eps)
    return p.add_node("norm", [d], {"p": norm_p, "dim": [rank - 1], "keepdim": keepdim}).outputs[0]


def lower_formula_loss(program: Program, nid: str) -> Rewrite | None:
    """One op of FORMULA_LOSSES as torch computes it:
    - hinge_loss (KernelBench's): max(1 - x y, 0);
    - hinge_embedding_loss: x where y != -1, plus max(margin - x, 0) where y != 1;
    - margin_ranking_loss: max(-y (x1 - x2) + margin, 0);
    - binary_cross_entropy: (t - 1) max(log1p(-x), -100) - t max(log x, -100), times the weight;
    - pairwise_distance: |x1 - x2 + eps|_p along the last dim;
    - triplet_margin_loss: max(margin + d(a, p) - d(a, n), 0), d(a, n) the smaller of it and d(p, n)
      with swap;
    - cosine_embedding_loss: 1 - cos where y == 1, max(cos - margin, 0) where y == -1, with torch's
      cos = x1.x2 / sqrt((|x1|^2 + 1e-12)(|x2|^2 + 1e-12)) along the last dim;
    then the reduction (mean or sum over every element, or none)."""
    n = program.nodes[nid]
    if n.op not in FORMULA_LOSSES or any(v is None for v in n.inputs[:2]):
        return None
    vals = program.values
    if any(vals[v].dtype != "float32" for v in n.inputs if v is not None):
        return None
    a = n.attrs
    ins, out = n.inputs, n.outputs[0]
    reduction = a.get("reduction", "none")

    def element(p):
        if n.op == "hinge_loss":
            return add_op(p, "max_scalar", [add_op(p, "rsub_scalar", [add_op(p, "mul", ins[:2])], value=1.0)], value=0.0)
        if n.op == "hinge_embedding_loss":
            x, y = ins[:2]
            margin = add_op(p, "max_scalar", [add_op(p, "rsub_scalar", [x], value=float(a["margin"]))], value=0.0)
            zeros = add_op(p, "full_like", [x], fill_value=0.0)
            ones, minus = (add_op(p, "full_like", [y], fill_value=v) for v in (1.0, -1.0))
            return add_op(p, "add", [add_op(p, "where", [add_op(p, "ne", [y, ones]), margin, zeros]),
                                     add_op(p, "where", [add_op(p, "ne", [y, minus]), x, zeros])])
        if n.op == "margin_ranking_loss":
            x1, x2, y = ins[:3]
            ranked = add_op(p, "neg", [add_op(p, "mul", [y, add_op(p, "sub", [x1, x2])])])
            return add_op(p, "max_scalar", [add_op(p, "add_scalar", [ranked], value=float(a["margin"]))], value=0.0)
        if n.op == "binary_cross_entropy":
            x, t = ins[:2]
            log_x = add_op(p, "max_scalar", [add_op(p, "log", [x])], value=-100.0)
            log_1mx = add_op(p, "max_scalar", [add_op(p, "log1p", [add_op(p, "neg", [x])])], value=-100.0)
            elem = add_op(p, "sub", [add_op(p, "mul", [add_op(p, "sub_scalar", [t], value=1.0), log_1mx]),
                                     add_op(p, "mul", [t, log_x])])
            return add_op(p, "mul", [elem, ins[2]]) if len(ins) > 2 and ins[2] is not None else elem
        if n.op == "pairwise_distance":
            return pairwise(p, ins[0], ins[1], float(a["p"]), float(a["eps"]), bool(a["keepdim"]))
        if n.op == "triplet_margin_loss":
            anchor, pos, neg = ins[:3]
            d_pos = pairwise(p, anchor, pos, float(a["p"]), float(a["eps"]))
            d_neg = pairwise(p, anchor, neg, float(a["p"]), float(a["eps"]))
            if a["swap"]:
                d_neg = add_op(p, "minimum", [d_neg, pairwise(p, pos, neg, float(a["p"]), float(a["eps"]))])
            return add_op(p, "max_scalar", [add_op(p, "add_scalar", [add_op(p, "sub", [d_pos, d_neg])],
                                                   value=float(a["margin"]))], value=0.0)
        # cosine_embedding_loss
        x1, x2, y = ins[:3]
        dim = len(vals[x1].shape) - 1

        def total(u, w):
            return add_op(p, "sum", [add_op(p, "mul", [u, w])], dim=[dim], keepdim=False)
        mags = [add_op(p, "add_scalar", [total(u, u)], value=1e-12) for u in (x1, x2)]
        cos = add_op(p, "div", [total(x1, x2), add_op(p, "sqrt", [add_op(p, "mul", mags)])])
        pos = add_op(p, "rsub_scalar", [cos], value=1.0)
        neg = add_op(p, "max_scalar", [add_op(p, "sub_scalar", [cos], value=float(a["margin"]))], value=0.0)
        return add_op(p, "add", [where_target(p, y, 1.0, pos, cos), where_target(p, y, -1.0, neg, cos)])

    def build(p):
        elem = element(p)
        return {out: elem if n.op == "pairwise_distance" else reduce_loss(p, elem, reduction, 1)}
    what = "torch's formula" + ("" if reduction == "none" or n.op == "pairwise_distance" else
                                f", then a {reduction} over every element")
    return Rewrite("lower_loss", f"{n.name} ({n.op}) written out as {what}, so it fuses into generated kernels "
                   "instead of running through torch.", build, nid)
