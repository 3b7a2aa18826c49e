"""Losses written out as the pointwise ops and reductions they are made of, so the planner can fuse
them and codegen can emit them (a loss op itself has no kernel template: it ran through torch).

Each lowering follows torch's definition of the op. The engine still checks the result numerically,
like any rewrite; tests/test_lowering.py holds each one to the op's reference on random inputs.
"""
from __future__ import annotations

import math

from ..ir import Program
from .engine import Rewrite

FLT_MIN = 1.17549435e-38   # smallest normal float: log(max(t, FLT_MIN)) is finite and t * it is 0 at t = 0
LOWERED = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "cosine_similarity")


def _add(p: Program, op: str, ins, **attrs) -> str:
    return p.add_node(op, list(ins), attrs).outputs[0]


def _reduce(p: Program, v: str, reduction: str, batch: int) -> str:
    if reduction == "none":
        return v
    if reduction == "batchmean":
        return _add(p, "div_scalar", [_add(p, "sum", [v], dim=None, keepdim=False)], value=float(batch))
    return _add(p, reduction, [v], dim=None, keepdim=False)      # "mean" or "sum" over every element


def _pointwise_loss(p: Program, op: str, a: str, b: str, attrs: dict) -> str:
    """The per-element loss of op at (a, b)."""
    if op == "kl_div":         # target * (log target - input); a holds log-probabilities
        if attrs.get("log_target"):
            return _add(p, "mul", [_add(p, "exp", [b]), _add(p, "sub", [b, a])])
        logt = _add(p, "log", [_add(p, "max_scalar", [b], value=FLT_MIN)])
        return _add(p, "mul", [b, _add(p, "sub", [logt, a])])
    d = _add(p, "sub", [a, b])
    if op == "mse_loss":
        return _add(p, "square", [d])
    ad = _add(p, "abs", [d])
    if op == "l1_loss":
        return ad
    # with m = min(|d|, k): smooth_l1 = 0.5 m^2 / beta + (|d| - m), huber = 0.5 m^2 + delta (|d| - m)
    k = float(attrs["beta"] if op == "smooth_l1_loss" else attrs["delta"])
    if k <= 0:
        return ad if op == "smooth_l1_loss" else _add(p, "mul_scalar", [ad], value=0.0)
    m = _add(p, "min_scalar", [ad], value=k)
    quad = _add(p, "mul_scalar", [_add(p, "square", [m])], value=0.5 / k if op == "smooth_l1_loss" else 0.5)
    lin = _add(p, "sub", [ad, m])
    if op == "huber_loss":
        lin = _add(p, "mul_scalar", [lin], value=k)
    return _add(p, "add", [quad, lin])


def _cosine(p: Program, x1: str, x2: str, dim: int, eps: float) -> str:
    """x1 . x2 / (max(|x1|, eps) max(|x2|, eps)) along dim, which is removed (torch clamps each norm)."""
    def norm(x):
        return _add(p, "max_scalar", [_add(p, "sqrt", [_add(p, "sum", [_add(p, "square", [x])], dim=[dim],
                                                            keepdim=False)])], value=eps)
    dot = _add(p, "sum", [_add(p, "mul", [x1, x2])], dim=[dim], keepdim=False)
    return _add(p, "div", [dot, _add(p, "mul", [norm(x1), norm(x2)])])


def lower_loss(program: Program, nid: str) -> Rewrite | None:
    n = program.nodes[nid]
    if n.op not in LOWERED or any(v is None for v in n.inputs[:2]) or len(n.inputs) != 2:
        return None
    a, b = n.inputs
    out = n.outputs[0]
    shapes = [tuple(program.values[v].shape) for v in (a, b)]
    if any(program.values[v].dtype != "float32" for v in (a, b)):
        return None
    if n.op == "cosine_similarity":
        rank = max(len(s) for s in shapes)
        dim = n.attrs["dim"] % rank
        if any(len(s) != rank for s in shapes):
            return None

        def build(p):
            return {out: _cosine(p, a, b, dim, float(n.attrs["eps"]))}
        what = f"a dot product and two norms along dim {dim}, then a division"
    else:
        full = shapes[0] if len(shapes[0]) >= len(shapes[1]) else shapes[1]
        reduction = n.attrs.get("reduction", "mean")
        batch = full[0] if full else 1

        def build(p):
            return {out: _reduce(p, _pointwise_loss(p, n.op, a, b, n.attrs), reduction, batch)}
        what = ("its per-element formula" + ("" if reduction == "none" else
                f", then a {'sum divided by the batch size' if reduction == 'batchmean' else reduction} "
                f"over {math.prod(full)} elements"))
    return Rewrite("lower_loss", f"{n.name} ({n.op}) written out as {what}, so it fuses into generated "
                   "kernels instead of running through torch.", build, nid)
