"""The reductions' op table, shared by every row kernel (rowgraph.py / rowkernel.py,
gemm_rows.py): the statistics states (C fields, identity, how one element is folded in, how two
states combine: associative up to rounding, so any split of a row combines) and, per reduction or
normalization op, its state, per-row preamble and output expression over the state's fields.
"""
from __future__ import annotations

import math

from ..ir import Program
from ..ops.common import norm_dim, norm_dims
from .cuda import float_literal
from .kernel import CodegenError

FLOAT32_EPS = 1.1920928955078125e-07  # torch.finfo(float32).eps: rms_norm's default eps

# statistics states: C fields, identity, how one element is folded in, how two states combine
STATES = {
    "max": (["m"], "{-INFINITY}", "s.m = max_nan(s.m, x);", "return {max_nan(a.m, b.m)};"),
    "min": (["m"], "{INFINITY}", "s.m = min_nan(s.m, x);", "return {min_nan(a.m, b.m)};"),
    "sum": (["s"], "{0}", "s.s += x;", "return {a.s + b.s};"),  # 0: a float or an int64 sum
    "prod": (["p"], "{1.0f}", "s.p *= x;", "return {a.p * b.p};"),
    "sumsq": (["q"], "{0.0f}", "s.q = fmaf(x, x, s.q);", "return {a.q + b.q};"),
    # online softmax: running max m and sum s of exp(x - m)
    "maxsumexp": (["m", "s"], "{-INFINITY, 0.0f}",
                  "if (x > s.m) { s.s = s.s * expf(s.m - x) + 1.0f; s.m = x; } else { s.s += expf(x - s.m); }",
                  "const float m = max_nan(a.m, b.m);\n"
                  "  if (m == -INFINITY) return a;\n"
                  "  return {m, (a.m == m ? a.s : a.s * expf(a.m - m)) + (b.m == m ? b.s : b.s * expf(b.m - m))};"),
    # a softmax-weighted sum in one pass: running max m of x, s the sum of exp(x - m) and w the sum of
    # exp(x - m) * y (fold takes x and y; rowgraph._softmax_dot); w / s is sum(softmax(x) * y). exp(-inf)
    # adds nothing, as for maxsumexp (rowkernel._state_code)
    "softdot": (["m", "s", "w"], "{-INFINITY, 0.0f, 0.0f}",
                "if (x > s.m) { const float c = expf(s.m - x); s.s = fmaf(s.s, c, 1.0f); s.w = fmaf(s.w, c, y); "
                "s.m = x; } else { const float e = expf(x - s.m); s.s += e; s.w = fmaf(e, y, s.w); }",
                "const float m = max_nan(a.m, b.m);\n"
                "  if (m == -INFINITY) return a;\n"
                "  const float ca = a.m == m ? 1.0f : expf(a.m - m), cb = b.m == m ? 1.0f : expf(b.m - m);\n"
                "  return {m, a.s * ca + b.s * cb, a.w * ca + b.w * cb};"),
    # Welford: count n, mean, sum of squared deviations m2 (Chan et al. to combine)
    "welford": (["n", "mean", "m2"], "{0.0f, 0.0f, 0.0f}",
                "s.n += 1.0f; const float d = x - s.mean; s.mean += d / s.n; s.m2 = fmaf(d, x - s.mean, s.m2);",
                "const float n = a.n + b.n;\n"
                "  if (n == 0.0f) return a;\n"
                "  const float d = b.mean - a.mean, wb = b.n / n;\n"
                "  return {n, fmaf(d, wb, a.mean), a.m2 + b.m2 + d * d * a.n * wb};"),
}


def global_pool(program: Program, node) -> bool:
    """adaptive_avg_pool{1,2,3}d down to one element per channel."""
    spatial = int(node.op[-2])
    return all(d == 1 for d in program.values[node.outputs[0]].shape[-spatial:])


# how (sample, group) rows index a channel parameter through kGroups, kChannelsPerGroup and kSpatial;
# the row graph's frame reads it at the element's column instead ("[col]")
GROUP_CHANNEL = "[(int)(row % kGroups) * kChannelsPerGroup + col / kSpatial]"


def row_op(program: Program, nid: str, channel: str = GROUP_CHANNEL):
    """(state, per-row preamble, per-element or per-row expression, preserves rows, reduced dims,
    row length when rows are not the reduced dims: group_norm's (sample, group) rows, whose channel
    parameters are indexed by `channel`)."""
    node = program.nodes[nid]
    x = program.values[node.inputs[0]]
    rank, a, op = len(x.shape), node.attrs, node.op
    if op in ("softmax", "log_softmax"):
        dims = [norm_dim(a["dim"], rank)]
    elif op in ("layer_norm", "rms_norm"):
        k = len(a["normalized_shape"])
        dims = list(range(rank - k, rank))
    elif op in ("sum", "mean", "max", "min", "logsumexp", "var", "std"):
        dims = norm_dims(a["dim"], rank)
    elif op == "prod":          # one dim, or (null) the flattened tensor
        dims = norm_dims(None if a["dim"] is None else [a["dim"]], rank)
    elif op in ("group_norm", "instance_norm"):
        # rows are (sample, group): C/G * spatial contiguous elements; channel parameters by channel
        if op == "instance_norm" and not a["use_input_stats"]:
            raise CodegenError(f"{node.name} (instance_norm) uses running statistics; not generated yet",
                               node_id=nid)
        chans = x.shape[1]
        groups = a["num_groups"] if op == "group_norm" else chans
        spatial = math.prod(x.shape[2:])
        eps = float_literal(a["eps"])
        w_port, b_port = (1, 2) if op == "group_norm" else (3, 4)
        expr = "(xe - st.mean) * rstd"
        if len(node.inputs) > w_port and node.inputs[w_port]:
            expr += f" * WEIGHT{channel}"
        if len(node.inputs) > b_port and node.inputs[b_port]:
            expr += f" + BIAS{channel}"
        return ("welford", f"const float rstd = rsqrtf(st.m2 / kColsF + {eps});", expr, True,
                list(range(1, rank)), chans // groups * spatial)
    elif op.startswith("adaptive_avg_pool") and global_pool(program, node):
        # global average pooling: the mean over the spatial (trailing) dims
        spatial = int(op[-2])
        return "sum", "", "st.s / kColsF", False, list(range(rank - spatial, rank)), None
    elif node.opdef.category == "pooling":     # before the reductions it is the prologue (layout_graph)
        raise CodegenError(f"{node.name} ({op}) pools what a reduction of the region computed; a row kernel "
                           f"pools only before its reductions: split the region before it", node_id=nid)
    elif node.opdef.category in ("layout", "opaque", "matmul", "convolution"):
        cat = node.opdef.category
        raise CodegenError(f"{node.name} ({op}) is {'an' if cat[0] in 'aeiou' else 'a'} {cat} op with no "
                           f"generated kernel yet; it runs through torch", node_id=nid)
    else:
        raise CodegenError(f"{node.name} ({op}) has no row-reduction template (have: softmax, log_softmax, "
                           f"layer_norm, rms_norm, group_norm, instance_norm, logsumexp, sum, mean, max, min, "
                           f"prod, var, std)", node_id=nid)
    if dims != list(range(dims[0], dims[0] + len(dims))):
        raise CodegenError(f"{node.name} ({op}) reduces dims {dims} of {list(x.shape)}, which are not "
                           f"neighbours; no kernel template reduces scattered dims", node_id=nid)
    # a row holding +inf is NaN throughout in torch (exp(inf - inf) reaches the sum); an online state
    # shifts such a row by 0 instead, so it says so itself
    if op == "softmax":
        return ("maxsumexp", "const float inv_sum = st.m == INFINITY ? NAN : 1.0f / st.s;",
                "expf(xe - st.m) * inv_sum", True, dims, None)
    if op == "log_softmax":
        return ("maxsumexp", "const float log_sum = st.m == INFINITY ? NAN : logf(st.s);", "xe - st.m - log_sum",
                True, dims, None)
    if op == "layer_norm":
        eps = float_literal(a["eps"])
        expr = "(xe - st.mean) * rstd"
        if len(node.inputs) > 1 and node.inputs[1]:
            expr += " * WEIGHT[col]"
        if len(node.inputs) > 2 and node.inputs[2]:
            expr += " + BIAS[col]"
        return "welford", f"const float rstd = rsqrtf(st.m2 / kColsF + {eps});", expr, True, dims, None
    if op == "rms_norm":
        eps = float_literal(a["eps"] if a["eps"] is not None else FLOAT32_EPS)
        expr = "xe * rrms" + (" * WEIGHT[col]" if len(node.inputs) > 1 and node.inputs[1] else "")
        return "sumsq", f"const float rrms = rsqrtf(st.q / kColsF + {eps});", expr, True, dims, None
    if op == "logsumexp":
        return "maxsumexp", "", "st.m + logf(st.s)", False, dims, None
    if op == "sum":
        return "sum", "", "st.s", False, dims, None
    if op == "mean":
        return "sum", "", "st.s / kColsF", False, dims, None
    if op in ("max", "min"):
        return op, "", "st.m", False, dims, None
    if op == "prod":
        return "prod", "", "st.p", False, dims, None
    corr = float_literal(a["correction"])
    var = f"st.m2 / (kColsF - {corr})"
    return "welford", "", var if op == "var" else f"sqrtf({var})", False, dims, None
