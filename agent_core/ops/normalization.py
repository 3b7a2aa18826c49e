"""Normalizations: softmax / log_softmax along a dim, batch / layer / group / instance / RMS norms,
local response norm and F.normalize.

Softmax is here (category normalization) rather than under reductions because its output has the
input's shape: like a norm, it is a row-wise reduction stitched to a pointwise pass over the same row.
Running statistics, weights and biases are inputs (PARAMETER values), never attributes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from .common import float_of, fmt_shape, norm_dim, opt
from .registry import Attr, OpDef, TensorSpec, register


def _float_same(op):
    def infer(ins, attrs):
        x = ins[0]
        if "dim" in attrs:
            norm_dim(attrs["dim"], x.rank, f"{op}: dim")
        return [TensorSpec(x.shape, float_of(x.dtype))]
    return infer


def _per_elem(k):
    return lambda ins, outs, attrs: k * outs[0].numel


def _softmax_ref(fn):
    def ref(t, a):
        x = t[0] if t[0].is_floating_point() else t[0].float()
        return fn(x, dim=a["dim"])
    return ref


register(OpDef(
    "softmax", "normalization", ("x",), _float_same("softmax"), _softmax_ref(torch.softmax),
    attrs=(Attr("dim", "int", -1),), flops=_per_elem(5),
    doc="exp(x - max) / sum(exp(x - max)) along dim",
    extra={"example": ([(3, 5)], {"dim": 1}), "bad": ([(3, 5)], {"dim": 2}, "out of range")},
))
register(OpDef(
    "log_softmax", "normalization", ("x",), _float_same("log_softmax"), _softmax_ref(torch.log_softmax),
    attrs=(Attr("dim", "int", -1),), flops=_per_elem(5),
    doc="x - max - log(sum(exp(x - max))) along dim",
    extra={"example": ([(3, 5)], {"dim": 0}), "bad": ([(3, 5)], {"dim": -3}, "out of range")},
))


def _same_dtype(op, x, params, names):
    for spec, name in zip(params, names):
        if spec is not None and spec.dtype != x.dtype:
            raise ShapeError(f"{op}: {name} is {spec.dtype} but the input is {x.dtype}; give them one dtype")


def _channel_params(op, x, params, names, c):
    _same_dtype(op, x, params, names)
    for spec, name in zip(params, names):
        if spec is not None and spec.shape != (c,):
            raise ShapeError(f"{op}: {name} must be [{c}] (one per channel of input {fmt_shape(x.shape)}), "
                             f"got {fmt_shape(spec.shape)}")


def _need_float(op, x):
    if x.dtype not in ("float32", "float64", "float16", "bfloat16"):
        raise ShapeError(f"{op}: input must be a floating-point tensor, got {x.dtype}")


def _batch_norm_infer(ins, attrs):
    x = ins[0]
    _need_float("batch_norm", x)
    if x.rank < 2:
        raise ShapeError(f"batch_norm: input must be [N, C, ...], got {fmt_shape(x.shape)}")
    _channel_params("batch_norm", x, [ins[1], ins[2], opt(ins, 3), opt(ins, 4)],
                    ["running_mean", "running_var", "weight", "bias"], x.shape[1])
    return [TensorSpec(x.shape, x.dtype)]


def _batch_norm_ref(t, a):
    # clones: the reference never updates the program's running statistics
    rm, rv = t[1].clone(), t[2].clone()
    return F.batch_norm(t[0], rm, rv, opt(t, 3), opt(t, 4), training=a["training"],
                        momentum=a["momentum"], eps=a["eps"])


register(OpDef(
    "batch_norm", "normalization", ("x", "running_mean", "running_var", "weight?", "bias?"),
    _batch_norm_infer, _batch_norm_ref,
    attrs=(Attr("training", "bool", False, doc="true: normalize with the batch's statistics (a module in "
                                                 "train mode); false: with the running statistics"),
           Attr("momentum", "float", 0.1), Attr("eps", "float", 1e-5)),
    flops=_per_elem(4),
    doc="(x - mean) / sqrt(var + eps) * weight + bias per channel (dim 1)",
    extra={"example": ([(4, 3, 5), ((3,), "float32"), ((3,), "float32", {"kind": "positive"}), (3,), (3,)], {}),
           "bad": ([(4, 3, 5), (4,), (4,)], {}, "running_mean must be [3]")},
))


def _layer_norm_infer(ins, attrs):
    x, w, b = ins[0], opt(ins, 1), opt(ins, 2)
    _need_float("layer_norm", x)
    ns = tuple(attrs["normalized_shape"])
    if not ns or x.shape[len(x.shape) - len(ns):] != ns or len(ns) > x.rank:
        raise ShapeError(f"layer_norm: normalized_shape {fmt_shape(ns)} must equal the last dimensions of "
                         f"input {fmt_shape(x.shape)}")
    _same_dtype("layer_norm", x, [w, b], ["weight", "bias"])
    for spec, name in ((w, "weight"), (b, "bias")):
        if spec is not None and spec.shape != ns:
            raise ShapeError(f"layer_norm: {name} must be {fmt_shape(ns)} (normalized_shape), got "
                             f"{fmt_shape(spec.shape)}")
    return [TensorSpec(x.shape, x.dtype)]


register(OpDef(
    "layer_norm", "normalization", ("x", "weight?", "bias?"), _layer_norm_infer,
    lambda t, a: F.layer_norm(t[0], a["normalized_shape"], opt(t, 1), opt(t, 2), a["eps"]),
    attrs=(Attr("normalized_shape", "ints"), Attr("eps", "float", 1e-5)), flops=_per_elem(8),
    doc="normalize over the trailing normalized_shape dimensions, then scale and shift",
    extra={"example": ([(2, 3, 4, 5), (4, 5), (4, 5)], {"normalized_shape": [4, 5]}),
           "bad": ([(2, 3, 4, 5)], {"normalized_shape": [5, 4]}, "normalized_shape [5, 4]")},
))


def _group_norm_infer(ins, attrs):
    x, w, b = ins[0], opt(ins, 1), opt(ins, 2)
    _need_float("group_norm", x)
    g = attrs["num_groups"]
    if x.rank < 2:
        raise ShapeError(f"group_norm: input must be [N, C, ...], got {fmt_shape(x.shape)}")
    if g < 1 or x.shape[1] % g:
        raise ShapeError(f"group_norm: {x.shape[1]} channels of input {fmt_shape(x.shape)} are not "
                         f"divisible by num_groups={g}")
    _channel_params("group_norm", x, [w, b], ["weight", "bias"], x.shape[1])
    return [TensorSpec(x.shape, x.dtype)]


register(OpDef(
    "group_norm", "normalization", ("x", "weight?", "bias?"), _group_norm_infer,
    lambda t, a: F.group_norm(t[0], a["num_groups"], opt(t, 1), opt(t, 2), a["eps"]),
    attrs=(Attr("num_groups", "int"), Attr("eps", "float", 1e-5)), flops=_per_elem(8),
    doc="normalize each group of channels of each sample, then per-channel scale and shift",
    extra={"example": ([(2, 6, 4, 3), (6,), (6,)], {"num_groups": 3}),
           "bad": ([(2, 6, 4)], {"num_groups": 4}, "not divisible")},
))


def _instance_norm_infer(ins, attrs):
    x = ins[0]
    _need_float("instance_norm", x)
    if x.rank < 3:
        raise ShapeError(f"instance_norm: input must be [N, C, *spatial], got {fmt_shape(x.shape)}")
    _channel_params("instance_norm", x, [opt(ins, i) for i in range(1, 5)],
                    ["running_mean", "running_var", "weight", "bias"], x.shape[1])
    if not attrs["use_input_stats"] and (opt(ins, 1) is None or opt(ins, 2) is None):
        raise ShapeError("instance_norm: use_input_stats=false needs running_mean and running_var")
    return [TensorSpec(x.shape, x.dtype)]


def _instance_norm_ref(t, a):
    rm, rv = (None if opt(t, i) is None else t[i].clone() for i in (1, 2))
    return F.instance_norm(t[0], rm, rv, opt(t, 3), opt(t, 4), use_input_stats=a["use_input_stats"],
                           momentum=a["momentum"], eps=a["eps"])


register(OpDef(
    "instance_norm", "normalization", ("x", "running_mean?", "running_var?", "weight?", "bias?"),
    _instance_norm_infer, _instance_norm_ref,
    attrs=(Attr("use_input_stats", "bool", True), Attr("momentum", "float", 0.1),
           Attr("eps", "float", 1e-5)),
    flops=_per_elem(8),
    doc="normalize each channel of each sample over its spatial dimensions",
    extra={"example": ([(2, 3, 4, 5)], {}), "bad": ([(2, 3)], {}, "must be [N, C, *spatial]")},
))


def _rms_norm_infer(ins, attrs):
    x, w = ins[0], opt(ins, 1)
    _need_float("rms_norm", x)
    ns = tuple(attrs["normalized_shape"])
    if not ns or len(ns) > x.rank or x.shape[x.rank - len(ns):] != ns:
        raise ShapeError(f"rms_norm: normalized_shape {fmt_shape(ns)} must equal the last dimensions of "
                         f"input {fmt_shape(x.shape)}")
    _same_dtype("rms_norm", x, [w], ["weight"])
    if w is not None and w.shape != ns:
        raise ShapeError(f"rms_norm: weight must be {fmt_shape(ns)}, got {fmt_shape(w.shape)}")
    return [TensorSpec(x.shape, x.dtype)]


register(OpDef(
    "rms_norm", "normalization", ("x", "weight?"), _rms_norm_infer,
    lambda t, a: F.rms_norm(t[0], a["normalized_shape"], opt(t, 1), a["eps"]),
    attrs=(Attr("normalized_shape", "ints"),
           Attr("eps", "float", None, optional=True, doc="default: the dtype's machine epsilon")),
    flops=_per_elem(4),
    doc="x / sqrt(mean(x^2 over normalized_shape) + eps) * weight",
    extra={"example": ([(2, 3, 4), (4,)], {"normalized_shape": [4], "eps": 1e-6}),
           "bad": ([(2, 3, 4)], {"normalized_shape": [3]}, "normalized_shape [3]")},
))


def _lrn_infer(ins, attrs):
    x = ins[0]
    _need_float("local_response_norm", x)
    if x.rank < 3:
        raise ShapeError(f"local_response_norm: input must be [N, C, *spatial], got {fmt_shape(x.shape)}")
    if attrs["size"] < 1:
        raise ShapeError(f"local_response_norm: size must be at least 1, got {attrs['size']}")
    return [TensorSpec(x.shape, x.dtype)]


register(OpDef(
    "local_response_norm", "normalization", ("x",), _lrn_infer,
    lambda t, a: F.local_response_norm(t[0], a["size"], a["alpha"], a["beta"], a["k"]),
    attrs=(Attr("size", "int"), Attr("alpha", "float", 1e-4), Attr("beta", "float", 0.75),
           Attr("k", "float", 1.0)),
    flops=lambda i, o, a: (a["size"] + 4) * o[0].numel,
    doc="x / (k + alpha/size * sum of squares over `size` neighbouring channels) ** beta",
    extra={"example": ([(2, 5, 4)], {"size": 3}), "bad": ([(2, 5)], {"size": 3}, "must be [N, C")},
))


def _normalize_infer(ins, attrs):
    x = ins[0]
    _need_float("normalize", x)
    norm_dim(attrs["dim"], x.rank, "normalize: dim")
    return [TensorSpec(x.shape, x.dtype)]


register(OpDef(
    "normalize", "normalization", ("x",), _normalize_infer,
    lambda t, a: F.normalize(t[0], p=a["p"], dim=a["dim"], eps=a["eps"]),
    attrs=(Attr("p", "float", 2.0), Attr("dim", "int", 1), Attr("eps", "float", 1e-12)),
    flops=_per_elem(4),
    doc="x / max(p-norm of x along dim, eps) (F.normalize)",
    extra={"example": ([(3, 5)], {"dim": 1}), "bad": ([(3, 5)], {"dim": 4}, "out of range")},
))
