"""Composite ops written out as the ops they are made of, so the planner can fuse them and codegen (or
cuBLAS) can run them: a composite op itself has no kernel template and ran through torch.

* mse, l1, smooth_l1, huber, kl_div, cosine_similarity: pointwise ops and reductions.
* binary_cross_entropy_with_logits: its pointwise element (ops/loss.py), the weight, the reduction.
* binary_cross_entropy, the hinge and margin losses, pairwise_distance, triplet_margin_loss,
  cosine_embedding_loss: torch's formulas (loss_formulas.py).
* cross_entropy: log_softmax over the class dim, then nll_loss (the same weight, ignore_index and
  reduction); with label smoothing, plus the smoothing term; with probability targets, the
  log-probabilities times the targets summed over the classes.
* scaled_dot_product_attention: q @ k^T (a transpose and a matmul), the scale, the mask (for is_causal
  a constant additive [L, S] bias, or index arithmetic on key and query positions when that would be
  large), a softmax over the keys and a matmul with v.

Each lowering follows torch's definition of the op. The engine still checks the result numerically,
like any rewrite; tests/test_lowering.py holds each one to the op's reference on random inputs.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ProgramError
from ..ir import Program
from ..ops.common import broadcast
from .edits import Rewrite, param_array, transposed_matrix
from .loss_formulas import FORMULA_LOSSES, LOSSES, add_op, cosine, lower_formula_loss, pointwise_loss, reduce_loss

SDPA = "scaled_dot_product_attention"
BCE_LOGITS = "binary_cross_entropy_with_logits"
LOWERED = LOSSES + FORMULA_LOSSES + ("cross_entropy", BCE_LOGITS, SDPA)   # every op lower_loss writes out


# optimize writes attention out only while its L x S scores stay this small: above it torch's fused
# (memory-efficient) attention, which never stores the scores, is the better path in process
SCORES_LIMIT_BYTES = 64 * 2**20


def lower_loss(program: Program, nid: str) -> Rewrite | None:
    """The lowering rule of DEFAULT_RULES (optimize): every op of LOWERED, attention only while its
    scores are small (SCORES_LIMIT_BYTES); fires as lower_attention for attention, lower_loss else."""
    n = program.nodes[nid]
    if n.op == SDPA and _scores_bytes(program, n) > SCORES_LIMIT_BYTES:
        return None
    if n.op == SDPA:   # our fused attention kernel takes it whole (codegen/attention.py)
        from ..codegen.attention import attention_supported
        if attention_supported(program, nid) is None:
            return None
    return lower_all(program, nid)


def _scores_bytes(program: Program, node) -> int:
    q, k = (program.values[v].shape for v in node.inputs[:2])
    return 4 * math.prod(broadcast(_batch(q), _batch(k))) * q[-2] * k[-2]


def lower_all(program: Program, nid: str) -> Rewrite | None:
    """The export's lowering rule: every op of LOWERED, whatever its size (the export has no other
    path for attention, cross entropy or these losses)."""
    n = program.nodes[nid]
    if n.op == SDPA:
        return lower_attention(program, nid)
    if n.op == "cross_entropy":
        return lower_cross_entropy(program, nid)
    if n.op == BCE_LOGITS:
        return lower_bce_with_logits(program, nid)
    if n.op in FORMULA_LOSSES:
        return lower_formula_loss(program, nid)
    if n.op not in LOSSES or any(v is None for v in n.inputs[:2]) or len(n.inputs) != 2:
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
            return {out: cosine(p, a, b, dim, float(n.attrs["eps"]))}
        what = f"a dot product and two norms along dim {dim}, then a division"
    else:
        full = shapes[0] if len(shapes[0]) >= len(shapes[1]) else shapes[1]
        reduction = n.attrs.get("reduction", "mean")
        batch = full[0] if full else 1

        def build(p):
            return {out: reduce_loss(p, pointwise_loss(p, n.op, a, b, n.attrs), reduction, batch)}
        what = ("its per-element formula" + ("" if reduction == "none" else
                f", then a {'sum divided by the batch size' if reduction == 'batchmean' else reduction} "
                f"over {math.prod(full)} elements"))
    return Rewrite("lower_loss", f"{n.name} ({n.op}) written out as {what}, so it fuses into generated "
                   "kernels instead of running through torch.", build, nid)


# --- cross_entropy ------------------------------------------------------------------------------------
def lower_cross_entropy(program: Program, nid: str) -> Rewrite | None:
    """cross_entropy as log_softmax over the class dim and nll_loss with the same weight, ignore_index
    and reduction. Label smoothing eps follows torch (aten cross_entropy_loss_label_smoothing):
    (1 - eps) * nll + eps / C * smooth, smooth = -sum_c w_c logp_c per sample, 0 where the target is
    ignored, reduced like nll (mean: divided by the summed weights of the samples not ignored). With
    probability targets y: -sum_c w_c logp_c ((1 - eps) y_c + eps / C) per sample, mean over samples."""
    n = program.nodes[nid]
    if n.op != "cross_entropy" or len(n.inputs) < 2 or any(v is None for v in n.inputs[:2]):
        return None
    x, t = n.inputs[:2]
    w = n.inputs[2] if len(n.inputs) > 2 else None
    vals = program.values
    if vals[x].dtype != "float32" or (w is not None and vals[w].dtype != "float32"):
        return None
    probs = vals[t].dtype == "float32"
    if not probs and vals[t].dtype not in ("int64", "int32", "int8", "uint8"):
        return None
    shape = tuple(vals[x].shape)
    rank = len(shape)
    cd = 0 if rank == 1 else 1
    classes = shape[cd]
    reduction, ii = n.attrs["reduction"], int(n.attrs["ignore_index"])
    eps = float(n.attrs["label_smoothing"])
    out = n.outputs[0]

    def weighted(p, v):      # v * weight, the weight lined up with the class dim
        if w is None:
            return v
        wv = w if rank <= 2 else add_op(p, "reshape", [w], shape=[classes] + [1] * (rank - 2))
        return add_op(p, "mul", [v, wv])

    cols = _transposed_logits(program, x) if rank == 2 and not probs and eps == 0 else None
    if cols is not None:
        # logits y.t() of y [C, N]: the classes of sample j are y's column j. Read as y [1, C, N] with
        # targets [1, N] it is the K-dimensional form: a softmax down each column, contiguous across
        # the columns (a row of y.t() reads one float every C: a 32-byte sector per element)
        def build(p):
            y3 = add_op(p, "reshape", [cols], shape=[1, classes, shape[0]])
            t2 = add_op(p, "reshape", [t], shape=[1, shape[0]])
            loss = add_op(p, "nll_loss", [add_op(p, "log_softmax", [y3], dim=1), t2] + ([w] if w is not None else []),
                        reduction=reduction, ignore_index=ii)
            return {out: add_op(p, "reshape", [loss], shape=[shape[0]]) if reduction == "none" else loss}
        return Rewrite("lower_loss", f"{n.name} (cross_entropy) of transposed logits written out as a "
                       f"log_softmax down the {shape[0]} columns of {vals[cols].name} ({classes} classes) and "
                       "nll_loss, so the softmax reads the logits contiguously in a generated kernel.", build, nid)

    def build(p):
        logp = add_op(p, "log_softmax", [x], dim=cd)
        ws = [w] if w is not None else []
        if probs:
            y = t if eps == 0 else add_op(p, "add_scalar", [add_op(p, "mul_scalar", [t], value=1.0 - eps)],
                                        value=eps / classes)
            per = add_op(p, "neg", [add_op(p, "sum", [weighted(p, add_op(p, "mul", [logp, y]))], dim=[cd],
                                       keepdim=False)])
            if reduction == "none" or not p.values[per].shape:
                return {out: per}
            return {out: add_op(p, reduction, [per], dim=None, keepdim=False)}
        if eps == 0:
            return {out: add_op(p, "nll_loss", [logp, t] + ws, reduction=reduction, ignore_index=ii)}
        nll = add_op(p, "nll_loss", [logp, t] + ws, reduction="none", ignore_index=ii)
        wsum = add_op(p, "sum", [weighted(p, logp)], dim=[cd], keepdim=False)            # -smooth
        # the smoothing term set to 0 where the target is ignored, as torch's masked_fill does (a NaN
        # there stays out of the loss; and a row kernel then skips those rows: codegen/rowguard.py)
        ignored = add_op(p, "eq", [t, add_op(p, "full_like", [t], fill_value=ii)])
        smooth = add_op(p, "masked_fill", [add_op(p, "mul_scalar", [wsum], value=-eps / classes), ignored], value=0.0)
        total = add_op(p, "add", [add_op(p, "mul_scalar", [nll], value=1.0 - eps), smooth])
        if reduction == "none":
            return {out: total}
        total = add_op(p, "sum", [total], dim=None, keepdim=False)
        if reduction == "mean":   # nll's denominator: the summed weights (or count) of the samples not ignored
            minus1 = add_op(p, "full_like", [x], fill_value=-1.0)
            denom = add_op(p, "nll_loss", [minus1, t] + ws, reduction="sum", ignore_index=ii)
            total = add_op(p, "div", [total, denom])
        return {out: total}
    if probs:
        what = (f"log_softmax over dim {cd} times the {'smoothed ' if eps else ''}probability targets"
                f"{' and the class weights' if w is not None else ''}, summed over the {classes} classes"
                + ("" if reduction == "none" else f", then a {reduction}"))
    else:
        what = f"log_softmax over dim {cd} ({classes} classes) and nll_loss"
        if eps:
            what += f", plus the label-smoothing term (eps {eps:g}) over the classes"
    return Rewrite("lower_loss", f"{n.name} (cross_entropy) written out as {what}, so the softmax fuses "
                   "into a generated kernel instead of running through torch.", build, nid)


def _transposed_logits(program: Program, x: str) -> str | None:
    """y where the 2-D logits x are y with its two dims swapped (permute [1, 0], transpose; .t() imports
    as the permute)."""
    y = transposed_matrix(program, x)
    return y if y is not None and program.values[y].dtype == "float32" else None


def lower_bce_with_logits(program: Program, nid: str) -> Rewrite | None:
    """binary_cross_entropy_with_logits as its pointwise element (ops/loss.py: bce_with_logits, or
    bce_with_logits_pos with a pos_weight), times the weight, then the reduction over every element."""
    n = program.nodes[nid]
    x, t = n.inputs[:2]
    w = n.inputs[2] if len(n.inputs) > 2 else None
    pw = n.inputs[3] if len(n.inputs) > 3 else None
    if x is None or t is None or any(program.values[v].dtype != "float32" for v in (x, t, w, pw) if v):
        return None
    reduction, out = n.attrs["reduction"], n.outputs[0]

    def build(p):
        elem = add_op(p, "bce_with_logits_pos", [x, t, pw]) if pw else add_op(p, "bce_with_logits", [x, t])
        if w:
            elem = add_op(p, "mul", [elem, w])
        return {out: reduce_loss(p, elem, reduction, 1)}
    what = ("its element max(x, 0) - x t + log1p(exp(-|x|))" + (" with the pos_weight" if pw else "")
            + (" times the weight" if w else "") + ("" if reduction == "none" else f", then a {reduction}"))
    return Rewrite("lower_loss", f"{n.name} ({BCE_LOGITS}) written out as {what}, so it fuses as a pointwise "
                   "op instead of running through torch.", build, nid)


# --- scaled_dot_product_attention ---------------------------------------------------------------------
def _batch(shape) -> tuple:
    return tuple(shape[:-2])


def _gemm_ready(p: Program, a: str, b: str) -> tuple[str, str]:
    """Operands of a matmul whose batch dims are equal or one single matrix (one cuBLAS call): an
    operand whose batch only partly broadcasts is expanded to the common batch."""
    ba, bb = _batch(p.values[a].shape), _batch(p.values[b].shape)
    target = broadcast(ba, bb)

    def fit(v, bv):
        if bv == target or math.prod(bv) == 1:
            return v
        return add_op(p, "expand", [v], size=list(target) + list(p.values[v].shape[-2:]))
    return fit(a, ba), fit(b, bb)


def _may_mask_a_row(program: Program, mask: str) -> bool:
    """Whether some row of the mask could hide every key (torch then returns zeros for that row, where
    a plain softmax over -inf gives NaN): always for a computed mask or an input."""
    arr = param_array(program, mask)
    if arr is None:
        return True
    if arr.size == 0:
        return False
    keep = arr.astype(bool) if arr.dtype == np.bool_ else ~np.isneginf(arr)
    return bool((~keep.reshape(-1, keep.shape[-1] if keep.ndim else 1).any(axis=-1)).any())


# is_causal becomes an additive [L, S] float32 constant (0 or -inf) up to this size: the add fuses
# into the softmax after the matmul. Beyond it (L = S = 4096 and up) the mask is index arithmetic on
# L + S positions instead. 64 MiB, as fold_constants' limit, which folds that arithmetic back into
# the same constant in `optimize` when it fits.
CAUSAL_BIAS_LIMIT = 64 * 2**20


def causal_bias(length: int, keys: int) -> np.ndarray:
    """torch's is_causal mask (top-left alignment, like torch.ones(L, S).tril(): query i sees key j <= i)
    as an additive [L, S] float32 bias: 0 where j <= i, -inf above the diagonal."""
    return np.triu(np.full((length, keys), -np.inf, dtype=np.float32), k=1)


def causal_positions(length: int, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """The same mask as index arithmetic: float32 key positions [S] and query positions [L, 1], so
    `key > query` broadcasts to the [L, S] positions to hide while only L + S numbers are stored."""
    return (np.arange(keys, dtype=np.float32), np.arange(length, dtype=np.float32).reshape(length, 1))


def lower_attention(program: Program, nid: str) -> Rewrite | None:
    """scaled_dot_product_attention as torch's math definition: softmax(q @ k^T * scale + bias) @ v, the
    bias -inf where a bool mask is false (masked_fill), a float mask added, or for is_causal -inf where
    key j > query i (a constant [L, S] bias added, or index arithmetic when that would be large); rows
    that the mask hides entirely are zeros (torch's safe softmax; a causal mask hides none). Dropout is
    ignored (eval). The matmuls map onto cuBLAS: operands whose batch dims partly broadcast are
    expanded."""
    n = program.nodes[nid]
    if n.op != SDPA or len(n.inputs) < 3 or any(v is None for v in n.inputs[:3]):
        return None
    q, k, v = n.inputs[:3]
    mask = n.inputs[3] if len(n.inputs) > 3 else None
    vals = program.values
    if any(vals[x].dtype != "float32" for x in (q, k, v)):
        return None
    if mask is not None and vals[mask].dtype not in ("bool", "float32"):
        return None
    Q, K = vals[q].shape, vals[k].shape
    L, S, E = Q[-2], K[-2], Q[-1]
    out = n.outputs[0]
    out_shape = tuple(vals[out].shape)
    causal = bool(n.attrs.get("is_causal")) and mask is None
    # a mask whose batch dims reach beyond the query/key/value batch would make a bigger result than
    # the op's: not lowered
    scores = broadcast(broadcast(_batch(Q), _batch(K)) + (L, S), tuple(vals[mask].shape) if mask else ())
    if broadcast(_batch(scores), _batch(vals[v].shape)) != out_shape[:-2]:
        return None
    scale = float(n.attrs["scale"]) if n.attrs.get("scale") is not None else 1.0 / math.sqrt(E)
    score = n.attrs.get("score") or "softmax"   # relu / sigmoid: score(scores) @ v; a masked row is zeros anyway
    fix_rows = score == "softmax" and mask is not None and _may_mask_a_row(program, mask)
    dense = L * S * 4 <= CAUSAL_BIAS_LIMIT     # is_causal as one [L, S] constant

    def build(p):
        kt = add_op(p, "transpose", [k], dim0=-2, dim1=-1)
        s = add_op(p, "matmul", list(_gemm_ready(p, q, kt)))
        if scale != 1.0:
            s = add_op(p, "mul_scalar", [s], value=scale)
        if causal and dense:
            bias = p.add_parameter(p.unique_name(f"{n.name}_causal_bias"), causal_bias(L, S), constant=True).id
            s = add_op(p, "add", [s, bias])
        elif causal:
            kpos, qpos = (p.add_parameter(p.unique_name(f"{n.name}_{role}_pos"), arr, constant=True).id
                          for role, arr in zip(("key", "query"), causal_positions(L, S)))
            s = add_op(p, "masked_fill", [s, add_op(p, "gt", [kpos, qpos])], value=float("-inf"))
        elif mask is not None and vals[mask].dtype == "bool":
            s = add_op(p, "masked_fill", [s, add_op(p, "logical_not", [mask])], value=float("-inf"))
        elif mask is not None:
            s = add_op(p, "add", [s, mask])
        probs = add_op(p, "softmax", [s], dim=-1) if score == "softmax" else add_op(p, score, [s])
        o = add_op(p, "matmul", list(_gemm_ready(p, probs, v)))
        if fix_rows:   # a row with every key masked: zeros, as torch's softmax gives for it
            if p.values[mask].dtype == "bool":   # no key kept: the row's max of the mask as 0/1 is 0
                kept = add_op(p, "max", [add_op(p, "cast", [mask], dtype="float32")], dim=[-1], keepdim=True)
                dead = add_op(p, "logical_not", [add_op(p, "cast", [kept], dtype="bool")])
            else:
                ninf = p.add_parameter(p.unique_name(f"{n.name}_neg_inf"), np.array(-np.inf, dtype=np.float32),
                                       constant=True).id
                dead = add_op(p, "eq", [add_op(p, "max", [mask], dim=[-1], keepdim=True), ninf])
            o = add_op(p, "masked_fill", [o, dead], value=0.0)
        if tuple(p.values[o].shape) != out_shape:
            raise ProgramError(f"the written-out attention makes {list(p.values[o].shape)}, not {list(out_shape)}")
        return {out: o}
    how = (f"-inf where the key comes after the query (is_causal: "
           f"{'an [L, S] constant added' if dense else 'from key and query positions'})" if causal else
           "no mask" if mask is None else
           "the bool mask applied as -inf where it is false" if vals[mask].dtype == "bool" else "the float mask added")
    return Rewrite("lower_attention", f"{n.name} ({SDPA}) written out as q @ k^T (a transpose and a cuBLAS "
                   f"matmul, {L}x{S} scores per head) scaled by {scale:.6g}, {how}, "
                   f"{f'a softmax over the {S} keys' if score == 'softmax' else f'a {score}'} "
                   f"and a matmul with v{'; rows the mask hides entirely give zeros' if fix_rows else ''}, so it "
                   "runs as cuBLAS calls and generated kernels instead of through torch.", build, nid)
