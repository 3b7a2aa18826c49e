"""Losses and similarities. They are reductions (category "reduction"): with reduction "mean" or "sum"
the output is a scalar; with "none" it keeps the per-element (or per-sample) shape.

hinge_loss is KernelBench's form, mean(clamp(1 - predictions * targets, min=0)); torch's own
F.hinge_embedding_loss is a different formula and is here as hinge_embedding_loss.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from .common import broadcast, fmt_shape, norm_dim, opt
from .registry import FLOAT_DTYPES, Attr, OpDef, TensorSpec, register

_INTS = ("int64", "int32", "int8", "uint8")
_RED = Attr("reduction", "str", "mean", choices=("none", "mean", "sum"))


def _bshape(op, specs_names):
    try:
        return broadcast(*(s.shape for s, _ in specs_names))
    except ShapeError:
        desc = " and ".join(f"{n} {fmt_shape(s.shape)}" for s, n in specs_names)
        raise ShapeError(f"{op}: {desc} do not broadcast") from None


def _floats(op, specs_names):
    """The one floating-point dtype of a loss's inputs. Mixed float dtypes are refused: torch's losses
    disagree on how (or whether) they promote them, so a program states the cast."""
    for s, n in specs_names:
        if s.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: {n} must be a floating-point tensor, got {s.dtype}")
    if len({s.dtype for s, _ in specs_names}) > 1:
        raise ShapeError(f"{op}: " + ", ".join(f"{n} is {s.dtype}" for s, n in specs_names)
                         + "; give them one dtype (cast first)")
    return specs_names[0][0].dtype


def _loss(name, ref, extra_attrs=(), ports=("input", "target"), doc="", reductions=None, flops_per=3,
          example=None, bad=None, aliases=(), same_rank=False):
    red = _RED if reductions is None else Attr("reduction", "str", "mean", choices=reductions)

    def infer(ins, attrs):
        pairs = list(zip(ins, ports))
        dtype = _floats(name, pairs)
        if same_rank and len({s.rank for s in ins}) > 1:
            raise ShapeError(f"{name}: " + ", ".join(f"{n} {fmt_shape(s.shape)}" for s, n in pairs)
                             + " must have the same number of dimensions")
        shape = _bshape(name, pairs)
        return [TensorSpec(shape if attrs["reduction"] == "none" else (), dtype)]

    register(OpDef(
        name, "reduction", ports, infer, ref, attrs=(red,) + tuple(extra_attrs), aliases=aliases, doc=doc,
        flops=lambda i, o, a: flops_per * max(s.numel for s in i),
        extra={"example": example or ([(4, 5), (4, 5)], {}),
               "bad": bad or ([(4, 5), (3, 5)], {}, "do not broadcast")},
    ))


_loss("mse_loss", lambda t, a: F.mse_loss(t[0], t[1], reduction=a["reduction"]),
      doc="mean((input - target)^2)", example=([(4, 5), (4, 5)], {"reduction": "none"}))
_loss("l1_loss", lambda t, a: F.l1_loss(t[0], t[1], reduction=a["reduction"]), doc="mean(|input - target|)")
_loss("smooth_l1_loss", lambda t, a: F.smooth_l1_loss(t[0], t[1], reduction=a["reduction"], beta=a["beta"]),
      extra_attrs=(Attr("beta", "float", 1.0),), doc="0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta")
_loss("huber_loss", lambda t, a: F.huber_loss(t[0], t[1], reduction=a["reduction"], delta=a["delta"]),
      extra_attrs=(Attr("delta", "float", 1.0),), doc="0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta)")
_loss("kl_div", lambda t, a: F.kl_div(t[0], t[1], reduction=a["reduction"], log_target=a["log_target"]),
      extra_attrs=(Attr("log_target", "bool", False),),
      reductions=("none", "mean", "sum", "batchmean"),
      doc="target * (log(target) - input); input holds log-probabilities. batchmean divides the sum by "
          "the batch size (the mathematically right KL divergence)",
      example=([(4, 5), ((4, 5), "float32", {"kind": "softmax"})], {"reduction": "batchmean"}))


def _hinge_ref(t, a):
    loss = torch.clamp(1 - t[0] * t[1], min=0)
    return {"mean": loss.mean, "sum": loss.sum}.get(a["reduction"], lambda: loss)()


_loss("hinge_loss", _hinge_ref, ports=("predictions", "targets"), flops_per=3,
      doc="KernelBench's hinge loss: mean(clamp(1 - predictions * targets, min=0)); targets are +1 / -1",
      example=([(8, 1), (8,)], {}))
_loss("hinge_embedding_loss",
      lambda t, a: F.hinge_embedding_loss(t[0], t[1], margin=a["margin"], reduction=a["reduction"]),
      extra_attrs=(Attr("margin", "float", 1.0),),
      doc="torch's F.hinge_embedding_loss: input where target is 1, max(0, margin - input) where it is -1")
_loss("margin_ranking_loss",
      lambda t, a: F.margin_ranking_loss(t[0], t[1], t[2], margin=a["margin"], reduction=a["reduction"]),
      ports=("input1", "input2", "target"), extra_attrs=(Attr("margin", "float", 0.0),),
      doc="max(0, -target * (input1 - input2) + margin)", example=([(6,), (6,), (6,)], {}), same_rank=True,
      bad=([(6,), (5,), (6,)], {}, "do not broadcast"))


def _bce_infer(op):
    def infer(ins, attrs):
        x, y = ins[0], ins[1]
        if x.shape != y.shape:
            raise ShapeError(f"{op}: target {fmt_shape(y.shape)} must have the shape of input {fmt_shape(x.shape)}")
        pairs = [(x, "input"), (y, "target")] + [(s, n) for s, n in ((opt(ins, 2), "weight"),
                                                                     (opt(ins, 3), "pos_weight")) if s]
        dtype = _floats(op, pairs)
        _bshape(op, pairs)
        return [TensorSpec(x.shape if attrs["reduction"] == "none" else (), dtype)]
    return infer


register(OpDef(
    "binary_cross_entropy", "reduction", ("input", "target", "weight?"), _bce_infer("binary_cross_entropy"),
    lambda t, a: F.binary_cross_entropy(t[0], t[1], opt(t, 2), reduction=a["reduction"]), attrs=(_RED,),
    flops=lambda i, o, a: 4 * i[0].numel, doc="-(target log(input) + (1 - target) log(1 - input)); input in (0, 1)",
    extra={"example": ([((4, 3), "float32", {"kind": "uniform", "low": 0.05, "high": 0.95}),
                        ((4, 3), "float32", {"kind": "uniform"})], {}),
           "bad": ([(4, 3), (4, 1)], {}, "must have the shape")},
))
register(OpDef(
    "binary_cross_entropy_with_logits", "reduction", ("input", "target", "weight?", "pos_weight?"),
    _bce_infer("binary_cross_entropy_with_logits"),
    lambda t, a: F.binary_cross_entropy_with_logits(t[0], t[1], opt(t, 2), reduction=a["reduction"],
                                                    pos_weight=opt(t, 3)),
    attrs=(_RED,), flops=lambda i, o, a: 6 * i[0].numel, doc="binary cross entropy of sigmoid(input), computed stably",
    extra={"example": ([(4, 3), ((4, 3), "float32", {"kind": "uniform"}), (3,), (3,)], {"reduction": "sum"}),
           "bad": ([(4, 3), (3, 4)], {}, "must have the shape")},
))


def _class_loss_infer(op):
    def infer(ins, attrs):
        x, y, w = ins[0], ins[1], opt(ins, 2)
        if x.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: input (logits) must be a floating-point tensor, got {x.dtype}")
        if x.rank == 0:
            raise ShapeError(f"{op}: input must be [C], [N, C] or [N, C, d1, ...], got a scalar")
        c = x.shape[0] if x.rank == 1 else x.shape[1]
        per_sample = x.shape[1:] if x.rank == 1 else (x.shape[:1] + x.shape[2:])
        per_sample = () if x.rank == 1 else per_sample
        if y.dtype in _INTS:
            if y.shape != per_sample:
                raise ShapeError(f"{op}: class-index target must be {fmt_shape(per_sample)} for input "
                                 f"{fmt_shape(x.shape)} ({c} classes), got {fmt_shape(y.shape)}")
        elif op == "cross_entropy" and y.dtype in FLOAT_DTYPES:
            if y.shape != x.shape:
                raise ShapeError(f"{op}: a probability target must have the input's shape {fmt_shape(x.shape)}, "
                                 f"got {fmt_shape(y.shape)}")
        else:
            raise ShapeError(f"{op}: target must hold int64 class indices, got {y.dtype}")
        if w is not None and w.shape != (c,):
            raise ShapeError(f"{op}: weight must be [{c}] (one per class), got {fmt_shape(w.shape)}")
        if w is not None and w.dtype != x.dtype:
            raise ShapeError(f"{op}: weight is {w.dtype} but input is {x.dtype}; give them one dtype")
        if y.dtype in FLOAT_DTYPES and y.dtype != x.dtype:
            raise ShapeError(f"{op}: target is {y.dtype} but input is {x.dtype}; give them one dtype")
        return [TensorSpec(per_sample if attrs["reduction"] == "none" else (), x.dtype)]
    return infer


def _ce_ref(t, a):
    y = t[1] if t[1].is_floating_point() else t[1].long()
    return F.cross_entropy(t[0], y, opt(t, 2), ignore_index=a["ignore_index"], reduction=a["reduction"],
                           label_smoothing=a["label_smoothing"])


_CE_EX = ([(4, 5), ((4,), "int64", {"kind": "randint", "low": 0, "high": 5}), (5,)], {})
register(OpDef(
    "cross_entropy", "reduction", ("input", "target", "weight?"), _class_loss_infer("cross_entropy"), _ce_ref,
    attrs=(_RED, Attr("ignore_index", "int", -100), Attr("label_smoothing", "float", 0.0)),
    flops=lambda i, o, a: 4 * i[0].numel,
    doc="log_softmax over the class dim (1, or 0 for an unbatched [C] input), then the negative log-"
        "likelihood of int64 class-index targets (or of probability targets of the input's shape)",
    extra={"example": _CE_EX, "bad": ([(4, 5), ((4, 5), "int64")], {}, "class-index target must be [4]")},
))
register(OpDef(
    "nll_loss", "reduction", ("input", "target", "weight?"), _class_loss_infer("nll_loss"),
    lambda t, a: F.nll_loss(t[0], t[1].long(), opt(t, 2), ignore_index=a["ignore_index"],
                            reduction=a["reduction"]),
    attrs=(_RED, Attr("ignore_index", "int", -100)), flops=lambda i, o, a: 2 * i[1].numel,
    doc="-input[n, target[n]] (input holds log-probabilities), weighted and reduced",
    extra={"example": ([(4, 5, 3), ((4, 3), "int64", {"kind": "randint", "low": 0, "high": 5})],
                       {"reduction": "none"}),
           "bad": ([(4, 5), ((4,), "float32")], {}, "int64 class indices")},
))


def _cos_infer(ins, attrs):
    x1, x2 = ins
    dtype = _floats("cosine_similarity", [(x1, "x1"), (x2, "x2")])
    shape = _bshape("cosine_similarity", [(x1, "x1"), (x2, "x2")])
    d = norm_dim(attrs["dim"], len(shape), "cosine_similarity: dim")
    return [TensorSpec(shape[:d] + shape[d + 1:], dtype)]


register(OpDef(
    "cosine_similarity", "reduction", ("x1", "x2"), _cos_infer,
    lambda t, a: F.cosine_similarity(t[0], t[1], dim=a["dim"], eps=a["eps"]),
    attrs=(Attr("dim", "int", 1), Attr("eps", "float", 1e-8)), flops=lambda i, o, a: 6 * max(s.numel for s in i),
    doc="x1 . x2 / max(|x1| |x2|, eps) along dim (which is removed)",
    extra={"example": ([(4, 6), (1, 6)], {"dim": 1}), "bad": ([(4, 6), (4, 5)], {}, "do not broadcast")},
))


def _pdist_infer(ins, attrs):
    x1, x2 = ins
    dtype = _floats("pairwise_distance", [(x1, "x1"), (x2, "x2")])
    shape = _bshape("pairwise_distance", [(x1, "x1"), (x2, "x2")])
    if not shape:
        raise ShapeError("pairwise_distance: inputs must have at least one dimension")
    return [TensorSpec(shape[:-1] + ((1,) if attrs["keepdim"] else ()), dtype)]


register(OpDef(
    "pairwise_distance", "reduction", ("x1", "x2"), _pdist_infer,
    lambda t, a: F.pairwise_distance(t[0], t[1], p=a["p"], eps=a["eps"], keepdim=a["keepdim"]),
    attrs=(Attr("p", "float", 2.0), Attr("eps", "float", 1e-6), Attr("keepdim", "bool", False)),
    flops=lambda i, o, a: 3 * max(s.numel for s in i),
    doc="p-norm of x1 - x2 + eps along the last dimension",
    extra={"example": ([(4, 6), (4, 6)], {}), "bad": ([(4, 6), (4, 5)], {}, "do not broadcast")},
))


def _triplet_infer(ins, attrs):
    names = ("anchor", "positive", "negative")
    dtype = _floats("triplet_margin_loss", list(zip(ins, names)))
    a = ins[0]
    if a.rank not in (1, 2) or any(s.shape != a.shape for s in ins):
        raise ShapeError("triplet_margin_loss: anchor, positive and negative must share one shape [N, D] or "
                         "[D], got " + ", ".join(fmt_shape(s.shape) for s in ins))
    per = a.shape[:1] if a.rank == 2 else ()
    return [TensorSpec(per if attrs["reduction"] == "none" else (), dtype)]


register(OpDef(
    "triplet_margin_loss", "reduction", ("anchor", "positive", "negative"), _triplet_infer,
    lambda t, a: F.triplet_margin_loss(t[0], t[1], t[2], margin=a["margin"], p=a["p"], eps=a["eps"],
                                       swap=a["swap"], reduction=a["reduction"]),
    attrs=(_RED, Attr("margin", "float", 1.0), Attr("p", "float", 2.0), Attr("eps", "float", 1e-6),
           Attr("swap", "bool", False)),
    flops=lambda i, o, a: 8 * i[0].numel,
    doc="max(d(anchor, positive) - d(anchor, negative) + margin, 0), d the pairwise p-distance",
    extra={"example": ([(4, 6), (4, 6), (4, 6)], {"margin": 0.5}),
           "bad": ([(4, 6), (4, 6), (4, 5)], {}, "share one shape")},
))


def _cos_emb_infer(ins, attrs):
    x1, x2, y = ins
    dtype = _floats("cosine_embedding_loss", [(x1, "x1"), (x2, "x2")])
    if x1.shape != x2.shape or x1.rank not in (1, 2):
        raise ShapeError(f"cosine_embedding_loss: x1 {fmt_shape(x1.shape)} and x2 {fmt_shape(x2.shape)} must "
                         f"share one shape [N, D] or [D]")
    per = x1.shape[:1] if x1.rank == 2 else ()
    if y.shape != per:
        raise ShapeError(f"cosine_embedding_loss: target must be {fmt_shape(per)} (one +1/-1 per pair), got "
                         f"{fmt_shape(y.shape)}")
    return [TensorSpec(per if attrs["reduction"] == "none" else (), dtype)]


register(OpDef(
    "cosine_embedding_loss", "reduction", ("x1", "x2", "target"), _cos_emb_infer,
    lambda t, a: F.cosine_embedding_loss(t[0], t[1], t[2], margin=a["margin"], reduction=a["reduction"]),
    attrs=(_RED, Attr("margin", "float", 0.0)), flops=lambda i, o, a: 6 * i[0].numel,
    doc="1 - cos(x1, x2) where target is 1, max(0, cos(x1, x2) - margin) where it is -1",
    extra={"example": ([(4, 6), (4, 6), (4,)], {}), "bad": ([(4, 6), (4, 6), (3,)], {}, "target must be [4]")},
))



# --- the element of binary_cross_entropy_with_logits, pointwise (the lowering reduces it) ---------
def _bce_elem_infer(op):
    def infer(ins, attrs):
        names = ("input", "target", "pos_weight")
        pairs = list(zip(ins, names))
        return [TensorSpec(_bshape(op, pairs), _floats(op, pairs))]
    return infer


# max(x, 0) - x t + log1p(exp(-|x|)): torch's stable form, never exp of a large positive number
register(OpDef(
    "bce_with_logits", "pointwise", ("input", "target"), _bce_elem_infer("bce_with_logits"),
    lambda t, a: torch.clamp_min(t[0], 0) - t[0] * t[1] + torch.log1p(torch.exp(-t[0].abs())),
    cuda="(max_nan({input}, 0.0f) - {input} * {target} + log1pf(expf(-fabsf({input}))))",
    flops=lambda i, o, a: 6 * o[0].numel, doc="the element of binary_cross_entropy_with_logits: "
    "max(x, 0) - x * t + log1p(exp(-|x|))",
    extra={"example": ([(4, 3), ((4, 3), "float32", {"kind": "uniform"})], {}),
           "bad": ([(4, 3), (3, 4)], {}, "do not broadcast")},
))
# with pos_weight p (torch): (1 - t) x + (1 + (p - 1) t) (log1p(exp(-|x|)) + max(-x, 0))
register(OpDef(
    "bce_with_logits_pos", "pointwise", ("input", "target", "pos_weight"), _bce_elem_infer("bce_with_logits_pos"),
    lambda t, a: (1 - t[1]) * t[0] + (1 + (t[2] - 1) * t[1]) * (torch.log1p(torch.exp(-t[0].abs()))
                                                                 + torch.clamp_min(-t[0], 0)),
    cuda="((1.0f - {target}) * {input} + (1.0f + ({pos_weight} - 1.0f) * {target}) * "
         "(log1pf(expf(-fabsf({input}))) + max_nan(-{input}, 0.0f)))",
    flops=lambda i, o, a: 9 * o[0].numel, doc="the element of binary_cross_entropy_with_logits with a "
    "pos_weight p: (1 - t) x + (1 + (p - 1) t) (log1p(exp(-|x|)) + max(-x, 0))",
    extra={"example": ([(4, 3), ((4, 3), "float32", {"kind": "uniform"}), (3,)], {}),
           "bad": ([(4, 3), (4, 3), (2,)], {}, "do not broadcast")},
))
