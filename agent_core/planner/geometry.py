"""How each node iterates: the loop space the planner matches when it asks "same loop?".

Roles, from the op's category and attributes (op names only where a category cannot tell):
- pointwise: one output element per loop index (also eval batch_norm, which is a per-channel affine,
  and expand, which is a broadcast);
- view: reshape and friends, no kernel of their own;
- layout: a layout op that moves elements through a view (slice, select, chunk pieces, cat, pad, flip,
  roll, permute, gather, ...: codegen/layout_graph.py's GRAPH_OPS); its loop space is its output, and it
  joins pointwise work of any size, because the layout generator folds its view into the loads;
- reduction: a row reduction described by the full shape it reads, the dimensions it reduces, the
  number of rows and the row length; `out_full` when its output has the input's shape (softmax,
  norms, scans), otherwise it writes one value per row;
- matmul / conv: anchors that take a pointwise epilogue; window (pooling) and single (other layout
  ops, attention, einsum) run alone; opaque is never touched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..analysis.cost import is_view
from ..codegen.layout_graph import GRAPH_OPS, RELABEL_OPS
from ..ir import Program
from ..ops.common import norm_dim, norm_dims

LAYOUT_OPS = frozenset(GRAPH_OPS) - frozenset(RELABEL_OPS)       # layout ops that move elements
GEMM_OPS = frozenset({"linear", "matmul", "bmm", "addmm", "baddbmm"})  # a tiled GEMM with an epilogue
CLASS_LOSSES = frozenset({"cross_entropy", "nll_loss"})                # rows of classes along dim 1


@dataclass(frozen=True)
class Geometry:
    role: str                      # pointwise | view | layout | reduction | matmul | conv | window | single | opaque
    shape: tuple[int, ...]         # the output shape (the loop space of pointwise work)
    full: tuple[int, ...] = ()     # reduction: the shape read
    key: tuple = ()                # reduction: what must match for two reductions to share rows
    rows: int = 0
    row_len: int = 0
    out_full: bool = False         # reduction: writes the full shape (softmax, norms, scans)
    contiguous: bool = True        # reduction: the reduced dims are the innermost ones

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def full_numel(self) -> int:
        return math.prod(self.full)


def _reduction(shape, dims, out_shape, key_extra=()) -> Geometry:
    shape = tuple(shape)
    dims = sorted(set(dims))
    row_len = math.prod(shape[d] for d in dims) if dims else 1
    rows = math.prod(shape) // max(row_len, 1)
    contiguous = dims == list(range(len(shape) - len(dims), len(shape)))
    out_full = math.prod(out_shape) == math.prod(shape) and len(dims) > 0 and row_len > 1
    return Geometry("reduction", tuple(out_shape), shape, (shape, tuple(dims)) + tuple(key_extra),
                    rows, row_len, out_full, contiguous)


def geometry(program: Program, node_id: str) -> Geometry:
    n = program.nodes[node_id]
    op = n.opdef
    outs = [program.values[v].shape for v in n.outputs]
    out = tuple(outs[0]) if outs else ()
    ins = [program.values[v].shape if v else None for v in n.inputs]
    x = tuple(ins[0]) if ins and ins[0] is not None else ()
    cat, a = op.category, n.attrs
    if is_view(program, node_id):
        return Geometry("view", out)
    if cat == "pointwise" or n.op == "expand":
        return Geometry("pointwise", out)
    if cat == "opaque":
        return Geometry("opaque", out)
    if n.op in LAYOUT_OPS:
        return Geometry("layout", out)
    if len(n.outputs) != 1:
        return Geometry("single", out)
    if cat == "normalization":
        if "training" in a and not a["training"]:            # eval batch_norm: x * scale + shift
            return Geometry("pointwise", out)
        if "use_input_stats" in a and not a["use_input_stats"]:
            return Geometry("pointwise", out)
        rank = len(x)
        if "normalized_shape" in a:
            k = len(a["normalized_shape"])
            return _reduction(x, range(rank - k, rank), out)
        if "num_groups" in a:
            g = a["num_groups"]
            rows = x[0] * g
            return Geometry("reduction", out, x, (x, "groups", g), rows, math.prod(x) // max(rows, 1),
                            True, True)
        if "training" in a:                                   # training batch_norm: per channel
            return _reduction(x, [0] + list(range(2, rank)), out)
        if "use_input_stats" in a:                            # instance_norm: per (sample, channel)
            return _reduction(x, range(2, rank), out)
        if "dim" in a and isinstance(a["dim"], int) and "size" not in a:
            return _reduction(x, [norm_dim(a["dim"], rank)], out)
        return Geometry("single", out)
    if cat == "reduction":
        rank = len(x)
        if a.get("reduction") == "none" and math.prod(out) == math.prod(x):
            return Geometry("pointwise", out)                 # an elementwise loss
        if "dim" in a and n.op not in CLASS_LOSSES:
            d = a["dim"]
            dims = norm_dims([d] if isinstance(d, int) else d, rank)
            return _reduction(x, dims, out)
        if n.op in CLASS_LOSSES and rank >= 2:
            return _reduction(x, [1], out, ("loss",))
        return _reduction(x, range(rank), out, ("loss",))     # whole-tensor losses
    if cat == "matmul":
        return Geometry("matmul" if n.op in GEMM_OPS else "single", out)
    if cat == "convolution":
        return Geometry("conv", out)
    if cat == "pooling":
        if n.op.startswith("adaptive") and len(out) >= 3 and all(s == 1 for s in out[2:]):
            return _reduction(x, range(2, len(x)), out)       # global pooling is a reduction
        return Geometry("window", out)
    return Geometry("single", out)
