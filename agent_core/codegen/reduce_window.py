"""Reductions a row kernel computes in its prologue, as windows (issue #14: reductions over different
axes of the same data in the fewest passes).

A sum, mean, max or min whose result another reduction of the region reads whole, as its own
elements, needs no kernel and no tensor of its own: each element the row kernel loads is a lambda
that loops over what that element reduces, as a pooling window's lambda does (layout_graph.py). A
ViT head's mean over the tokens then its LayerNorm over the features, or a convolution's min over
depth then a softmax over the channels, are one kernel that reads the input once.

The window is one contiguous block of dims of the input, [outer, K, inner] with the result
[outer, inner]: element i reads x[(i / inner) * K * inner + r * inner + i % inner] for r < K. Where
inner is large, a warp's neighbouring elements read neighbouring addresses at each step r; the
planner fuses only those, and only where the rows' elements are threads enough for the GPU
(planner/fusion.py: prologue_reductions).
"""
from __future__ import annotations

import math

from ..ir import Program
from ..ops.common import norm_dims
from .cuda import Names, float_literal
from .pointwise import is_elementwise

# op -> (the accumulator's start, the fold of one element xv into acc); NaN propagates through max / min
FOLDS = {"sum": ("0.0f", "acc += xv;"), "mean": ("0.0f", "acc += xv;"),
         "max": ("-INFINITY", "if (xv > acc || xv != xv) acc = xv;  // NaN propagates, as in torch"),
         "min": ("INFINITY", "if (xv < acc || xv != xv) acc = xv;  // NaN propagates, as in torch")}
CONSUMER_CATEGORIES = ("reduction", "normalization")
# window elements a thread loads before folding any (the loop unrolled so many times): each thread walks
# its window alone, so its loads in flight are the kernel's memory parallelism. 4 is what the H100 timed
# at s33 (benchmarks/h100-2026-12-07-s33); the tuner times 8 and 2 besides
WINDOW_UNROLL = 4


def reduced_block(program: Program, node) -> tuple[int, int, int] | None:
    """(outer, K, inner) of a float32 sum / mean / max / min over one contiguous block of dims (its
    window), else None."""
    if node.op not in FOLDS or len([v for v in node.inputs if v]) != 1:
        return None
    x, y = program.values[node.inputs[0]], program.values[node.outputs[0]]
    if x.dtype != "float32" or y.dtype != "float32" or not x.shape:
        return None
    dims = sorted(norm_dims(node.attrs.get("dim") or list(range(len(x.shape))), len(x.shape)))
    if dims != list(range(dims[0], dims[-1] + 1)):
        return None
    shape = list(x.shape)
    return math.prod(shape[:dims[0]]), math.prod(shape[dims[0]:dims[-1] + 1]), math.prod(shape[dims[-1] + 1:])


def window_reductions(program: Program, io) -> set[str]:
    """The reductions of a row region that its prologue computes: each a reduced_block whose result
    reaches, through pointwise ops and views of the region, another reduction or norm that reads it at
    its own size (its elements are that consumer's rows), not as per-row values broadcast along longer
    rows (a mean subtracted before a variance), and not a whole-tensor total of per-row values (a
    loss's mean over its rows, which the row graph folds row by row)."""
    from .layout_graph import is_layout_op     # it renders these windows (reduce_lambda)
    nodes, vals = program.nodes, program.values
    readers: dict[str, list[str]] = {}
    for n in io.nodes:
        for v in nodes[n].inputs:
            if v:
                readers.setdefault(v, []).append(n)
    out = set()
    for n in io.nodes:
        if reduced_block(program, nodes[n]) is None:
            continue
        size = math.prod(vals[nodes[n].outputs[0]].shape)
        todo, seen = list(nodes[n].outputs), set()
        while todo and n not in out:
            for c in readers.get(todo.pop(), []):
                node = nodes[c]
                if is_elementwise(node) or is_layout_op(node):
                    if c not in seen:
                        seen.add(c)
                        todo += node.outputs
                elif node.opdef.category in CONSUMER_CATEGORIES and node.inputs and node.inputs[0] and \
                        math.prod(vals[node.inputs[0]].shape) == size and \
                        math.prod(vals[node.outputs[0]].shape) > 1:
                    out.add(n)
    return out


def reduce_lambda(program: Program, node, fn: dict, names: Names, note: str, suffix: str,
                  unroll: int = WINDOW_UNROLL) -> list[str]:
    """The lambda of a window reduction's result at its flat index i: a loop over its K elements,
    calling its input's lambda (pointwise ops before it are evaluated where it reads them), unrolled
    `unroll` times so that many loads are in flight before the first fold."""
    _, k, inner = reduced_block(program, node)
    x, y = program.values[node.inputs[0]], program.values[node.outputs[0]]
    start, fold = FOLDS[node.op]
    fn[y.id] = names.new(y.name + suffix)
    base = "i * kWindow" if inner == 1 else "(i / kWindowStride) * (kWindow * kWindowStride) + i % kWindowStride"
    step = "r" if inner == 1 else "r * kWindowStride"
    result = f"acc / {float_literal(float(k))}" if node.op == "mean" else "acc"
    return [f"  // {note} -> {y.spec}: each element folds its {k} inputs, {inner} apart",
            f"  auto {fn[y.id]} = [&](index_t i) -> float {{",
            f"    constexpr index_t kWindow = {k}, kWindowStride = {inner};",
            f"    const index_t base = {base};",
            f"    float acc = {start};",
            f"    #pragma unroll {unroll}",
            "    for (index_t r = 0; r < kWindow; ++r) {",
            f"      const float xv = {fn[x.id]}(base + {step});",
            f"      {fold}",
            "    }",
            f"    return {result};",
            "  };"]
