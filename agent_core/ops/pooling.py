"""Pooling: max / avg pooling with a window (1-D, 2-D, 3-D) and adaptive avg / max pooling.

Inputs are [N, C, *spatial] or unbatched [C, *spatial]. Output sizes follow torch exactly, including
ceil_mode's rule that the last window must start inside the input or its left padding.
"""
from __future__ import annotations

import math

import torch.nn.functional as F

from ..errors import ShapeError
from .common import fmt_shape, ntuple
from .registry import FLOAT_DTYPES, Attr, OpDef, TensorSpec, register

_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_AMAX = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}
_AAVG = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}


def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape."""
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1  # the last window would start in the right padding
    return out


def _need_rank(op, d, x):
    # torch pools floating-point tensors only (max pooling of ints exists on some backends, not all)
    if x.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{op}: input must be a floating-point tensor, got {x.dtype} (cast it first)")
    if x.rank not in (d + 1, d + 2):
        raise ShapeError(f"{op}: input must be [N, C, *spatial] with {d} spatial dimension"
                         f"{'s' if d > 1 else ''} (rank {d + 2}) or unbatched (rank {d + 1}), "
                         f"got {fmt_shape(x.shape)}")


def _window_infer(op, d, with_dilation):
    def infer(ins, attrs):
        x = ins[0]
        _need_rank(op, d, x)
        k = ntuple(attrs["kernel_size"], d, f"{op}.kernel_size")
        s = ntuple(attrs["stride"] or k, d, f"{op}.stride")
        p = ntuple(attrs["padding"], d, f"{op}.padding")
        dil = ntuple(attrs["dilation"], d, f"{op}.dilation") if with_dilation else [1] * d
        if min(k) < 1 or min(s) < 1 or min(dil) < 1 or min(p) < 0:
            raise ShapeError(f"{op}: kernel_size, stride and dilation must be positive and padding "
                             f"non-negative (kernel_size {k}, stride {s}, padding {p})")
        for i in range(d):
            if p[i] > k[i] // 2:
                raise ShapeError(f"{op}: padding {p} must be at most half of kernel_size {k}")
        spatial = x.shape[-d:]
        if op == "avg_pool3d" and any(spatial[i] < k[i] for i in range(d)):
            raise ShapeError(f"{op}: input {fmt_shape(spatial)} is smaller than kernel_size {k} "
                             f"(torch's avg_pool3d refuses that even with padding)")
        out = [pool_out_size(spatial[i], k[i], s[i], p[i], dil[i], attrs["ceil_mode"]) for i in range(d)]
        if min(out) < 1:
            raise ShapeError(f"{op}: kernel_size {k} (dilation {dil}, padding {p}) is larger than the "
                             f"input {fmt_shape(spatial)}; the output would be {fmt_shape(out)}")
        return [TensorSpec(x.shape[:-d] + tuple(out), x.dtype)]
    return infer


def _pool_flops(d):
    def flops(ins, outs, attrs):
        return outs[0].numel * math.prod(ntuple(attrs["kernel_size"], d, "kernel_size"))
    return flops


def _window(a, d):
    """kernel_size, stride, padding expanded to d entries (torch accepts one value for all dims)."""
    k = ntuple(a["kernel_size"], d, "kernel_size")
    return k, ntuple(a["stride"] or k, d, "stride"), ntuple(a["padding"], d, "padding")


def _max_ref(d):
    fn = _MAX[d]

    def ref(t, a):
        k, s, p = _window(a, d)
        return fn(t[0], k, s, p, ntuple(a["dilation"], d, "dilation"), ceil_mode=a["ceil_mode"])
    return ref


def _avg_ref(d):
    fn = _AVG[d]

    def ref(t, a):
        k, s, p = _window(a, d)
        if d == 1:  # avg_pool1d has no divisor_override
            return fn(t[0], k, s, p, a["ceil_mode"], a["count_include_pad"])
        return fn(t[0], k, s, p, a["ceil_mode"], a["count_include_pad"], a["divisor_override"])
    return ref


_EX = {1: (2, 3, 9), 2: (2, 3, 7, 8), 3: (1, 2, 5, 6, 7)}
_WINDOW = (Attr("kernel_size", "ints"),
           Attr("stride", "ints", None, optional=True, doc="null or []: the kernel size"),
           Attr("padding", "ints", [0]))

for _d in (1, 2, 3):
    register(OpDef(
        f"max_pool{_d}d", "pooling", ("x",), _window_infer(f"max_pool{_d}d", _d, True), _max_ref(_d),
        attrs=_WINDOW + (Attr("dilation", "ints", [1]), Attr("ceil_mode", "bool", False)),
        flops=_pool_flops(_d),
        doc=f"largest value of each {_d}-D window (nn.MaxPool{_d}d)",
        extra={"example": ([_EX[_d]], {"kernel_size": [3], "stride": [2], "padding": [1], "ceil_mode": True}),
               "bad": ([_EX[_d]], {"kernel_size": [2], "padding": [2]}, "at most half")},
    ))
    avg_attrs = _WINDOW + (Attr("ceil_mode", "bool", False), Attr("count_include_pad", "bool", True))
    if _d > 1:
        avg_attrs += (Attr("divisor_override", "int", None, optional=True),)
    register(OpDef(
        f"avg_pool{_d}d", "pooling", ("x",), _window_infer(f"avg_pool{_d}d", _d, False), _avg_ref(_d),
        attrs=avg_attrs, flops=_pool_flops(_d),
        doc=f"mean of each {_d}-D window (nn.AvgPool{_d}d)",
        extra={"example": ([_EX[_d]], {"kernel_size": [2], "padding": [1], "ceil_mode": True,
                                       "count_include_pad": False}),
               "bad": ([_EX[_d][1:-1]], {"kernel_size": [2]}, "input must be")},
    ))


def _adaptive_infer(op, d):
    def infer(ins, attrs):
        x = ins[0]
        _need_rank(op, d, x)
        out = ntuple(attrs["output_size"], d, f"{op}.output_size")
        if min(out) < 1:
            raise ShapeError(f"{op}: output_size {out} must be positive")
        return [TensorSpec(x.shape[:-d] + tuple(out), x.dtype)]
    return infer


def _adaptive_flops(ins, outs, attrs):
    return ins[0].numel  # every input element is read into (about) one window


for _d in (1, 2, 3):
    register(OpDef(
        f"adaptive_avg_pool{_d}d", "pooling", ("x",), _adaptive_infer(f"adaptive_avg_pool{_d}d", _d),
        lambda t, a, _f=_AAVG[_d], _n=_d: _f(t[0], ntuple(a["output_size"], _n, "output_size")),
        attrs=(Attr("output_size", "ints"),), flops=_adaptive_flops,
        doc=f"mean over {_d}-D windows chosen to give output_size (output_size 1: global average pooling)",
        extra={"example": ([_EX[_d]], {"output_size": [2]}),
               "bad": ([_EX[_d]], {"output_size": [2] * (_d + 1)}, "output_size needs")},
    ))
    register(OpDef(
        f"adaptive_max_pool{_d}d", "pooling", ("x",), _adaptive_infer(f"adaptive_max_pool{_d}d", _d),
        lambda t, a, _f=_AMAX[_d], _n=_d: _f(t[0], ntuple(a["output_size"], _n, "output_size")),
        attrs=(Attr("output_size", "ints"),), flops=_adaptive_flops,
        doc=f"largest value over {_d}-D windows chosen to give output_size (values only)",
        extra={"example": ([_EX[_d]], {"output_size": [3]}),
               "bad": ([(4,)], {"output_size": [1]}, "input must be")},
    ))


# --- linear resampling: each output element a weighted sum of its 2^d nearest inputs -----------------
_LINEAR = {1: ("upsample_linear1d", "linear"), 2: ("upsample_bilinear2d", "bilinear"),
           3: ("upsample_trilinear3d", "trilinear")}


def _linear_infer(op, d):
    def infer(ins, attrs):
        x = ins[0]
        _need_rank(op, d, x)
        if x.rank != d + 2:
            raise ShapeError(f"{op}: input must be [N, C, *spatial] (rank {d + 2}), got {fmt_shape(x.shape)}")
        out = ntuple(attrs["output_size"], d, f"{op}.output_size")
        scales = attrs["scales"]
        if min(out) < 1:
            raise ShapeError(f"{op}: output_size {out} must be positive")
        if scales is not None and (len(scales) != d or min(scales) <= 0):
            raise ShapeError(f"{op}: scales {scales} must be {d} positive numbers, or null")
        return [TensorSpec(x.shape[:-d] + tuple(out), x.dtype)]
    return infer


def _linear_ref(d):
    import torch

    def ref(t, a):
        fn = getattr(torch.ops.aten, _LINEAR[d][0]).default
        scales = list(a["scales"]) if a["scales"] is not None else [None] * d
        return fn(t[0], list(ntuple(a["output_size"], d, "output_size")), a["align_corners"], *scales)
    return ref


for _d in (1, 2, 3):
    register(OpDef(
        _LINEAR[_d][0], "pooling", ("x",), _linear_infer(_LINEAR[_d][0], _d), _linear_ref(_d),
        attrs=(Attr("output_size", "ints"), Attr("align_corners", "bool", False),
               Attr("scales", "floats", None, optional=True,
                    doc="the scale factors given to interpolate (the source index then steps by 1 / scale); "
                        "null: input size / output size")),
        flops=lambda ins, outs, attrs, _n=_d: (2 ** _n) * 2 * outs[0].numel,
        doc=f"{_LINEAR[_d][1]} interpolation to output_size (F.interpolate(mode='{_LINEAR[_d][1]}')): each output "
            f"element a weighted sum of its {2 ** _d} nearest inputs",
        extra={"example": ([(2, 3) + _EX[_d][2:]], {"output_size": [5] * _d, "align_corners": False}),
               "bad": ([_EX[_d][1:]], {"output_size": [5] * _d}, "input must be")},
    ))
