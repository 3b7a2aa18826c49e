"""Convolutions: conv1d/2d/3d and their transposed forms, with stride, padding, dilation and groups.

Inputs are [N, C, *spatial] (or unbatched [C, *spatial]); weights are [Cout, Cin/groups, *kernel] for
convolutions and [Cin, Cout/groups, *kernel] for transposed ones (torch's layouts).
FLOPs: 2 * N * Cout * spatial_out * Cin/groups * kernel_volume (+ the bias add).
"""
from __future__ import annotations

import math

import torch.nn.functional as F

from ..errors import ShapeError
from .common import fmt_shape, ntuple, opt
from .registry import Attr, OpDef, TensorSpec, register

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _check_common(op, d, x, w, bias, groups):
    if x.rank not in (d + 1, d + 2):
        raise ShapeError(f"{op}: input must be [N, C, {', '.join('LHW'[-d:] if d < 3 else 'DHW')}] "
                         f"(rank {d + 2}) or unbatched (rank {d + 1}), got {fmt_shape(x.shape)}")
    if w.rank != d + 2:
        raise ShapeError(f"{op}: weight must have rank {d + 2}, got {fmt_shape(w.shape)}")
    if groups < 1:
        raise ShapeError(f"{op}: groups must be at least 1, got {groups}")
    dtypes = {x.dtype, w.dtype} | ({bias.dtype} if bias is not None else set())
    if len(dtypes) > 1:
        raise ShapeError(f"{op}: input is {x.dtype} and weight is {w.dtype}"
                         + (f" and bias is {bias.dtype}" if bias is not None else "")
                         + "; torch needs one dtype (cast first)")
    batched = x.rank == d + 2
    return (x.shape[0],) if batched else (), x.shape[-d - 1], x.shape[-d:]


def _check_bias(op, bias, cout):
    if bias is not None and bias.shape != (cout,):
        raise ShapeError(f"{op}: bias must be [{cout}] (one per output channel), got {fmt_shape(bias.shape)}")


def conv_out_size(size, k, s, p, d) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_infer(d):
    op = f"conv{d}d"

    def infer(ins, attrs):
        x, w, bias = ins[0], ins[1], opt(ins, 2)
        groups = attrs["groups"]
        batch, cin, spatial = _check_common(op, d, x, w, bias, groups)
        cout, cin_g, kernel = w.shape[0], w.shape[1], w.shape[2:]
        if cin_g * groups != cin:
            raise ShapeError(f"{op}: input has {cin} channels but weight {fmt_shape(w.shape)} with "
                             f"groups={groups} expects {cin_g * groups}")
        if cout % groups:
            raise ShapeError(f"{op}: {cout} output channels are not divisible by groups={groups}")
        _check_bias(op, bias, cout)
        stride = ntuple(attrs["stride"], d, f"{op}.stride")
        dilation = ntuple(attrs["dilation"], d, f"{op}.dilation")
        padding = attrs["padding"]
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ShapeError(f"{op}: padding='same' needs stride 1, got stride {stride}")
            return [TensorSpec(batch + (cout,) + tuple(spatial), x.dtype)]
        padding = [0] * d if padding == "valid" else ntuple(padding, d, f"{op}.padding")
        if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
            raise ShapeError(f"{op}: stride and dilation must be positive and padding non-negative "
                             f"(stride {stride}, dilation {dilation}, padding {padding})")
        out = []
        for i in range(d):
            n = conv_out_size(spatial[i], kernel[i], stride[i], padding[i], dilation[i])
            if n < 1:
                raise ShapeError(f"{op}: kernel {fmt_shape(kernel)} (dilation {dilation}) is larger than "
                                 f"the padded input {fmt_shape(spatial)} (padding {padding})")
            out.append(n)
        return [TensorSpec(batch + (cout,) + tuple(out), x.dtype)]
    return infer


def _conv_flops(ins, outs, attrs):
    w, out = ins[1], outs[0]
    cout, cin_g, kvol = w.shape[0], w.shape[1], math.prod(w.shape[2:])
    macs = out.numel * cin_g * kvol  # out.numel = N * Cout * spatial_out
    return 2 * macs + (out.numel if len(ins) > 2 else 0)


def _conv_ref(d):
    fn = _CONV[d]
    def ref(t, a):
        pad = a["padding"] if isinstance(a["padding"], str) else ntuple(a["padding"], d, "padding")
        return fn(t[0], t[1], opt(t, 2), stride=ntuple(a["stride"], d, "stride"), padding=pad,
                  dilation=ntuple(a["dilation"], d, "dilation"), groups=a["groups"])
    return ref


def _convt_infer(d):
    op = f"conv_transpose{d}d"

    def infer(ins, attrs):
        x, w, bias = ins[0], ins[1], opt(ins, 2)
        groups = attrs["groups"]
        batch, cin, spatial = _check_common(op, d, x, w, bias, groups)
        if w.shape[0] != cin:
            raise ShapeError(f"{op}: input has {cin} channels but weight {fmt_shape(w.shape)} expects "
                             f"{w.shape[0]} (weight is [Cin, Cout/groups, *kernel])")
        if cin % groups:
            raise ShapeError(f"{op}: {cin} input channels are not divisible by groups={groups}")
        cout, kernel = w.shape[1] * groups, w.shape[2:]
        _check_bias(op, bias, cout)
        stride = ntuple(attrs["stride"], d, f"{op}.stride")
        padding = ntuple(attrs["padding"], d, f"{op}.padding")
        outpad = ntuple(attrs["output_padding"], d, f"{op}.output_padding")
        dilation = ntuple(attrs["dilation"], d, f"{op}.dilation")
        if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or min(outpad) < 0:
            raise ShapeError(f"{op}: stride and dilation must be positive, padding and output_padding "
                             f"non-negative")
        for i in range(d):
            if outpad[i] >= max(stride[i], dilation[i]):
                raise ShapeError(f"{op}: output_padding {outpad} must be smaller than stride {stride} "
                                 f"or dilation {dilation}")
        out = []
        for i in range(d):
            n = ((spatial[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1)
                 + outpad[i] + 1)
            if n < 1:
                raise ShapeError(f"{op}: padding {padding} removes the whole output of input "
                                 f"{fmt_shape(spatial)} (kernel {fmt_shape(kernel)}, stride {stride})")
            out.append(n)
        return [TensorSpec(batch + (cout,) + tuple(out), x.dtype)]
    return infer


def _convt_flops(ins, outs, attrs):
    # every input element scatters into Cout/groups * kernel_volume outputs
    x, w = ins[0], ins[1]
    macs = x.numel * w.shape[1] * math.prod(w.shape[2:])
    return 2 * macs + (outs[0].numel if len(ins) > 2 else 0)


def _convt_ref(d):
    fn = _CONVT[d]
    def ref(t, a):
        return fn(t[0], t[1], opt(t, 2), stride=ntuple(a["stride"], d, "stride"),
                  padding=ntuple(a["padding"], d, "padding"),
                  output_padding=ntuple(a["output_padding"], d, "output_padding"), groups=a["groups"],
                  dilation=ntuple(a["dilation"], d, "dilation"))
    return ref


_EX = {1: (2, 4, 9), 2: (2, 4, 7, 6), 3: (1, 4, 5, 6, 4)}

for _d in (1, 2, 3):
    _k = (3,) * _d
    register(OpDef(
        f"conv{_d}d", "convolution", ("input", "weight", "bias?"), _conv_infer(_d), _conv_ref(_d),
        attrs=(Attr("stride", "ints", [1]),
               Attr("padding", "ints_or_str", [0], choices=("same", "valid"),
                    doc="per-dimension zero padding, or 'same' / 'valid'"),
               Attr("dilation", "ints", [1]), Attr("groups", "int", 1)),
        flops=_conv_flops, host_scratch=2,
        doc=f"{_d}-D convolution (nn.Conv{_d}d); weight [Cout, Cin/groups, *kernel]",
        extra={"example": ([_EX[_d], (6, 2) + _k, (6,)], {"stride": 2, "padding": 1, "groups": 2}),
               "bad": ([_EX[_d], (6, 3) + _k], {}, "input has 4 channels")},
    ))
    register(OpDef(
        f"conv_transpose{_d}d", "convolution", ("input", "weight", "bias?"), _convt_infer(_d), _convt_ref(_d),
        attrs=(Attr("stride", "ints", [1]), Attr("padding", "ints", [0]),
               Attr("output_padding", "ints", [0]), Attr("groups", "int", 1), Attr("dilation", "ints", [1])),
        flops=_convt_flops, host_scratch=2,
        doc=f"{_d}-D transposed convolution (nn.ConvTranspose{_d}d); weight [Cin, Cout/groups, *kernel]",
        extra={"example": ([_EX[_d], (4, 3) + _k, (6,)],
                           {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}),
               "bad": ([_EX[_d], (5, 3) + _k], {}, "input has 4 channels")},
    ))
