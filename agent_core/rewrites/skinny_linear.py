"""A linear layer (or a matmul by a weight) with a handful of output features as that many dot
products of each row.

x @ W^T with W of N <= SKINNY_MAX_N rows reads x once and does 2N flops per element of it: it is
bound by reading x, as a reduction over x's rows is. cuBLAS runs it as a GEMM tiled for a wide output,
most of each tile empty (H100, a Mixtral router, 8192 tokens x 4096 -> 8 experts: about 0.08 ms, the
read of x alone 0.045). Written as N sums of x times a weight row, the row kernel reads each row of x
once, folds the N dot products as sibling reductions of that one pass, and stores them side by side
(a cat of per-row values); what follows them (the router's softmax) reads them from there. The sums
stay fp32, as the product was (TF32 off).
"""
from __future__ import annotations

import math

import numpy as np

from ..analysis.cost import fmt_bytes
from ..ir import Program
from .edits import Rewrite, add_param, node_label, param_array

SKINNY_MAX_N = 8          # output features: each element of x meets this many weight loads (from L1)
SKINNY_MIN_K = 64         # shorter rows: the product is a few flops, whatever runs it


def _weight(program: Program, node) -> tuple[np.ndarray, str] | None:
    """The [features, K] weight of a linear, or of a matmul by a [K, features] parameter, and the value
    it came from (x @ W.T is a linear by then: rules.matmul_of_transpose)."""
    w = param_array(program, node.inputs[1])
    if w is None or w.ndim != 2:
        return None
    return (w, node.inputs[1]) if node.op == "linear" else (w.T, node.inputs[1])


def skinny_linear(program: Program, nid: str) -> Rewrite | None:
    """linear(x, W, b) or x @ W with 2..SKINNY_MAX_N output features, W (and b) parameters,
    fp32: the N dot products of each row of x (mul by W's row, sum over the last dim, plus b's entry),
    side by side."""
    n = program.nodes[nid]
    if n.op not in ("linear", "matmul") or n.inputs[0] is None or n.inputs[1] is None:
        return None
    x, out = n.inputs[0], n.outputs[0]
    found = _weight(program, n)
    bias = n.inputs[2] if n.op == "linear" and len(n.inputs) > 2 else None
    b = param_array(program, bias) if bias is not None else None
    xs = program.values[x].shape
    if found is None or not 2 <= found[0].shape[0] <= SKINNY_MAX_N or found[0].shape[1] < SKINNY_MIN_K or \
            program.values[x].dtype != "float32" or program.values[out].dtype != "float32" or \
            (bias is not None and b is None) or len(xs) < 2:
        return None
    w, source = found
    features = w.shape[0]

    def build(p: Program) -> dict:
        pieces = []
        for j in range(features):
            row = add_param(p, p.unique_name(f"{p.values[source].name}_row{j}"), w[j], like=source)
            dot = p.add_node("sum", [p.add_node("mul", [x, row]).outputs[0]], {"dim": [-1], "keepdim": True})
            v = dot.outputs[0]
            if b is not None:
                v = p.add_node("add_scalar", [v], {"value": float(b[j])}).outputs[0]
            pieces.append(v)
        return {out: p.add_node("cat", pieces, {"dim": -1}).outputs[0]}
    rows = math.prod(xs[:-1])
    return Rewrite("skinny_linear", f"{node_label(program, nid)} has {features} output features: written as "
                   f"{features} dot products of each of its {rows} rows, so one kernel reads the "
                   f"{fmt_bytes(program.values[x].nbytes)} input once and folds them all, where a GEMM tiled "
                   f"for a wide output leaves most of each tile empty.", build, nid)
