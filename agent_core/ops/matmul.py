"""Matrix products: matmul (torch broadcasting semantics), bmm, linear, addmm, baddbmm, attention, einsum.

FLOPs count a multiply-add as two operations: 2*M*N*K per matrix product.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from .common import broadcast, fmt_shape, opt
from .registry import Attr, OpDef, TensorSpec, register


def _same_dtype(op: str, *specs_names) -> str:
    dtypes = {s.dtype for s, _ in specs_names}
    if len(dtypes) > 1:
        desc = ", ".join(f"{n} is {s.dtype}" for s, n in specs_names)
        raise ShapeError(f"{op}: {desc}; torch needs one dtype for all operands (cast first)")
    return specs_names[0][0].dtype


def _bcast_batch(op: str, a: tuple, b: tuple, what: str = "batch dimensions") -> tuple:
    try:
        return broadcast(a, b)
    except ShapeError:
        raise ShapeError(f"{op}: {what} {fmt_shape(a)} and {fmt_shape(b)} do not broadcast") from None


def matmul_shape(a: tuple, b: tuple, op: str = "matmul") -> tuple[tuple, int, int, int, int]:
    """torch.matmul's result shape, plus (batch, M, N, K) for the FLOP count.

    1-D operands are promoted (a to [1, K], b to [K, 1]) and the added dimension is removed again;
    batch dimensions broadcast.
    """
    if not a or not b:
        raise ShapeError(f"{op}: both operands need at least one dimension, got {fmt_shape(a)} "
                         f"and {fmt_shape(b)}")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"{op}: a {fmt_shape(a)} has {a2[-1]} columns but b {fmt_shape(b)} has "
                         f"{b2[-2]} rows")
    batch = _bcast_batch(op, a2[:-2], b2[:-2])
    m, k, n = a2[-2], a2[-1], b2[-1]
    out = batch + ((m,) if len(a) > 1 else ()) + ((n,) if len(b) > 1 else ())
    return out, math.prod(batch), m, n, k


def _matmul_infer(ins, attrs):
    a, b = ins
    dtype = _same_dtype("matmul", (a, "a"), (b, "b"))
    return [TensorSpec(matmul_shape(a.shape, b.shape)[0], dtype)]


def _matmul_flops(ins, outs, attrs):
    _, batch, m, n, k = matmul_shape(ins[0].shape, ins[1].shape)
    return 2 * batch * m * n * k


register(OpDef(
    "matmul", "matmul", ("a", "b"), _matmul_infer, lambda t, a: torch.matmul(t[0], t[1]),
    flops=_matmul_flops, aliases=("mm", "mv", "dot"),
    doc="torch.matmul: 1-D operands are vectors, leading dimensions broadcast as batch dimensions",
    extra={"example": ([(2, 3, 4), (4, 5)], {}), "bad": ([(3, 4), (5, 6)], {}, "4 columns")},
))


def _bmm_infer(ins, attrs):
    a, b = ins
    for s, n in ((a, "a"), (b, "b")):
        if s.rank != 3:
            raise ShapeError(f"bmm: {n} must be 3-D [batch, rows, cols], got {fmt_shape(s.shape)}")
    if a.shape[0] != b.shape[0]:
        raise ShapeError(f"bmm: a {fmt_shape(a.shape)} and b {fmt_shape(b.shape)} have different batch sizes")
    if a.shape[2] != b.shape[1]:
        raise ShapeError(f"bmm: a {fmt_shape(a.shape)} has {a.shape[2]} columns but b "
                         f"{fmt_shape(b.shape)} has {b.shape[1]} rows")
    dtype = _same_dtype("bmm", (a, "a"), (b, "b"))
    return [TensorSpec((a.shape[0], a.shape[1], b.shape[2]), dtype)]


register(OpDef(
    "bmm", "matmul", ("a", "b"), _bmm_infer, lambda t, a: torch.bmm(t[0], t[1]),
    flops=lambda i, o, a: 2 * i[0].shape[0] * i[0].shape[1] * i[0].shape[2] * i[1].shape[2],
    doc="batched matrix product of two 3-D tensors (no broadcasting)",
    extra={"example": ([(2, 3, 4), (2, 4, 5)], {}), "bad": ([(2, 3, 4), (3, 4, 5)], {}, "batch")},
))


def _linear_infer(ins, attrs):
    x, w, bias = ins[0], ins[1], opt(ins, 2)
    if w.rank != 2:
        raise ShapeError(f"linear: weight must be 2-D [out_features, in_features], got {fmt_shape(w.shape)}")
    if x.rank < 1:
        raise ShapeError("linear: x must have at least one dimension, got a scalar")
    if x.shape[-1] != w.shape[1]:
        raise ShapeError(f"linear: x has {x.shape[-1]} features but weight expects {w.shape[1]} "
                         f"(weight {fmt_shape(w.shape)})")
    out = x.shape[:-1] + (w.shape[0],)
    pairs = [(x, "x"), (w, "weight")] + ([(bias, "bias")] if bias is not None else [])
    dtype = _same_dtype("linear", *pairs)
    if bias is not None:
        try:
            if broadcast(bias.shape, out) != out:
                raise ShapeError("")
        except ShapeError:
            raise ShapeError(f"linear: bias {fmt_shape(bias.shape)} does not match {w.shape[0]} "
                             f"out_features") from None
    return [TensorSpec(out, dtype)]


def _linear_flops(ins, outs, attrs):
    x, w = ins[0], ins[1]
    rows = x.numel // max(x.shape[-1], 1)
    return 2 * rows * w.shape[0] * w.shape[1] + (outs[0].numel if len(ins) > 2 else 0)


register(OpDef(
    "linear", "matmul", ("x", "weight", "bias?"), _linear_infer,
    lambda t, a: F.linear(t[0], t[1], opt(t, 2)), flops=_linear_flops,
    doc="x @ weight.T + bias; weight is [out_features, in_features] (nn.Linear)",
    extra={"example": ([(2, 3, 8), (5, 8), (5,)], {}), "bad": ([(4, 128), (512, 256)], {},
                                                             "x has 128 features but weight expects 256")},
))


def _addmm_infer(ins, attrs):
    inp, a, b = ins
    for s, n in ((a, "mat1"), (b, "mat2")):
        if s.rank != 2:
            raise ShapeError(f"addmm: {n} must be 2-D, got {fmt_shape(s.shape)}")
    out, *_ = matmul_shape(a.shape, b.shape, "addmm")
    try:
        if broadcast(inp.shape, out) != out:
            raise ShapeError("")
    except ShapeError:
        raise ShapeError(f"addmm: input {fmt_shape(inp.shape)} does not broadcast to the product "
                         f"{fmt_shape(out)}") from None
    return [TensorSpec(out, _same_dtype("addmm", (inp, "input"), (a, "mat1"), (b, "mat2")))]


register(OpDef(
    "addmm", "matmul", ("input", "mat1", "mat2"), _addmm_infer,
    lambda t, a: torch.addmm(t[0], t[1], t[2], beta=a["beta"], alpha=a["alpha"]),
    attrs=(Attr("beta", "scalar", 1), Attr("alpha", "scalar", 1)),
    flops=lambda i, o, a: 2 * i[1].shape[0] * i[1].shape[1] * i[2].shape[1] + 2 * o[0].numel,
    doc="beta * input + alpha * (mat1 @ mat2)",
    extra={"example": ([(5,), (3, 4), (4, 5)], {"beta": 0.5}), "bad": ([(3,), (3, 4), (4, 5)], {}, "broadcast")},
))


def _baddbmm_infer(ins, attrs):
    inp, a, b = ins
    (out,) = _bmm_infer([a, b], attrs)
    try:
        if broadcast(inp.shape, out.shape) != out.shape:
            raise ShapeError("")
    except ShapeError:
        raise ShapeError(f"baddbmm: input {fmt_shape(inp.shape)} does not broadcast to the product "
                         f"{fmt_shape(out.shape)}") from None
    return [TensorSpec(out.shape, _same_dtype("baddbmm", (inp, "input"), (a, "batch1"), (b, "batch2")))]


register(OpDef(
    "baddbmm", "matmul", ("input", "batch1", "batch2"), _baddbmm_infer,
    lambda t, a: torch.baddbmm(t[0], t[1], t[2], beta=a["beta"], alpha=a["alpha"]),
    attrs=(Attr("beta", "scalar", 1), Attr("alpha", "scalar", 1)),
    flops=lambda i, o, a: 2 * i[1].shape[0] * i[1].shape[1] * i[1].shape[2] * i[2].shape[2] + 2 * o[0].numel,
    doc="beta * input + alpha * bmm(batch1, batch2)",
    extra={"example": ([(1, 3, 5), (2, 3, 4), (2, 4, 5)], {}),
           "bad": ([(3, 3, 5), (2, 3, 4), (2, 4, 5)], {}, "broadcast")},
))


def _sdpa_infer(ins, attrs):
    q, k, v, mask = ins[0], ins[1], ins[2], opt(ins, 3)
    op = "scaled_dot_product_attention"
    for s, n in ((q, "query"), (k, "key"), (v, "value")):
        if s.rank < 2:
            raise ShapeError(f"{op}: {n} must be [..., length, features], got {fmt_shape(s.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"{op}: query {fmt_shape(q.shape)} and key {fmt_shape(k.shape)} have different "
                         f"feature sizes ({q.shape[-1]} and {k.shape[-1]})")
    if k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"{op}: key {fmt_shape(k.shape)} and value {fmt_shape(v.shape)} have different "
                         f"lengths ({k.shape[-2]} and {v.shape[-2]})")
    batch = _bcast_batch(op, _bcast_batch(op, q.shape[:-2], k.shape[:-2]), v.shape[:-2])
    L, S = q.shape[-2], k.shape[-2]
    if mask is not None:
        try:
            broadcast(mask.shape, batch + (L, S))
        except ShapeError:
            raise ShapeError(f"{op}: attn_mask {fmt_shape(mask.shape)} does not broadcast to the scores "
                             f"{fmt_shape(batch + (L, S))}") from None
    if attrs["is_causal"] and mask is not None:
        raise ShapeError(f"{op}: give either attn_mask or is_causal, not both")
    dtype = _same_dtype(op, (q, "query"), (k, "key"), (v, "value"))
    return [TensorSpec(batch + (L, v.shape[-1]), dtype)]


def _sdpa_flops(ins, outs, attrs):
    q, k, v = ins[0], ins[1], ins[2]
    b = outs[0].numel // max(outs[0].shape[-1] * outs[0].shape[-2], 1)
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    return b * (2 * L * S * E + 2 * L * S * Ev + 5 * L * S)


def _sdpa(t, a):
    if a.get("score", "softmax") == "softmax":
        return F.scaled_dot_product_attention(t[0], t[1], t[2], attn_mask=opt(t, 3), dropout_p=0.0,
                                              is_causal=a["is_causal"], scale=a["scale"])
    return pointwise_attention(t[0], t[1], t[2], opt(t, 3), a["is_causal"], a["scale"], a["score"])


POINTWISE_SCORES = {"relu": torch.relu, "sigmoid": torch.sigmoid}


def pointwise_attention(q, k, v, mask, causal: bool, scale, score: str):
    """score(q @ k^T * scale + mask) @ v for an elementwise score (relu, sigmoid), as ReLU or sigmoid
    attention writes it out (no normalisation): a masked score is -inf, which both map to 0."""
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    elif mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return POINTWISE_SCORES[score](s) @ v


register(OpDef(
    "scaled_dot_product_attention", "matmul", ("query", "key", "value", "attn_mask?"), _sdpa_infer, _sdpa,
    attrs=(Attr("dropout_p", "float", 0.0, doc="ignored: the reference runs in eval mode"),
           Attr("is_causal", "bool", False),
           Attr("scale", "float", None, optional=True, doc="default 1/sqrt(features)"),
           Attr("score", "str", "softmax", choices=("softmax", "relu", "sigmoid"),
                doc="softmax (torch's SDPA), or relu / sigmoid: score(scores) @ value, unnormalised")),
    flops=_sdpa_flops, aliases=("sdpa",),
    doc="softmax(query @ key^T * scale + mask) @ value (score relu or sigmoid: that of the scores, unnormalised); "
        "a bool mask keeps where true",
    extra={"example": ([(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5)], {"is_causal": True}),
           "bad": ([(2, 4, 8), (2, 6, 7), (2, 6, 5)], {}, "feature sizes")},
))


def _einsum_infer(ins, attrs):
    eq = attrs["equation"]
    _same_dtype("einsum", *((s, f"operand {i}") for i, s in enumerate(ins)))
    try:
        out = torch.einsum(eq, *[torch.empty(s.shape, dtype=torch.float32, device="meta") for s in ins])
    except RuntimeError as e:
        shapes = ", ".join(fmt_shape(s.shape) for s in ins)
        raise ShapeError(f"einsum '{eq}' does not fit operands {shapes}: {str(e).splitlines()[0]}") from None
    return [TensorSpec(tuple(out.shape), ins[0].dtype)]


def _einsum_flops(ins, outs, attrs):
    """The FLOPs of torch's own plan for the einsum (einsum_plan.py: its bmm's, products and sums),
    else 2 * the product of every index's size (the naive contraction)."""
    from .einsum_plan import einsum_flops
    return einsum_flops(attrs["equation"], [tuple(s.shape) for s in ins])


register(OpDef(
    "einsum", "matmul", ("operands*",), _einsum_infer,
    lambda t, a: torch.einsum(a["equation"], *t),
    attrs=(Attr("equation", "str", doc="e.g. 'bijl,lk->bijk'"),), flops=_einsum_flops,
    doc="torch.einsum over the operands in port order",
    extra={"example": ([(2, 3, 4, 5), (5, 6)], {"equation": "bijl,lk->bijk"}),
           "bad": ([(2, 3, 4, 5), (4, 6)], {"equation": "bijl,lk->bijk"}, "does not fit")},
))
