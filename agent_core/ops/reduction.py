"""Reductions along dimensions (sum, mean, max, min, prod, argmax, argmin, logsumexp, std, var, norm,
any, all) and scans (cumsum, cumprod).

`dim` is a list of dimensions, or null for all of them (torch.sum(x) with no dim); `max` and `min`
reduce values only (torch.amax / amin); argmax / argmin give the int64 indices.
Dtypes follow torch: sum / prod / cumsum / cumprod accumulate integers and bools in int64; mean,
std, var and norm refuse integer inputs (torch does too); logsumexp of integers gives float32.
"""
from __future__ import annotations

import torch

from ..errors import ShapeError
from .common import float_of, int_result, need_float, norm_dim, norm_dims, reduce_shape
from .registry import FLOAT_DTYPES, Attr, OpDef, TensorSpec, register

_DIMS = Attr("dim", "ints", None, optional=True, doc="dimensions to reduce; null: all")
_KEEP = Attr("keepdim", "bool", False)


def _dims(a, rank):
    """The dims argument torch wants: None (all) stays all dims, given as an explicit list."""
    return list(range(rank)) if not a["dim"] else a["dim"]


def _check_dims(op, x, dims):
    if dims is None:
        return
    try:
        norm_dims(dims, x.rank)
    except ShapeError as e:
        raise ShapeError(f"{op}: {e}") from None
    if len({d % max(x.rank, 1) for d in dims}) != len(dims):
        raise ShapeError(f"{op}: dim {dims} names a dimension twice")


def _reducer(name, dtype_rule, ref, flops_per=1, aliases=(), doc="", extra_attrs=(), float_only=False,
             example=None):
    def infer(ins, attrs):
        x = ins[0]
        if float_only:
            need_float(x, name)
        _check_dims(name, x, attrs["dim"])
        return [TensorSpec(reduce_shape(x.shape, attrs["dim"], attrs["keepdim"]), dtype_rule(x.dtype))]

    register(OpDef(
        name, "reduction", ("x",), infer, ref, attrs=(_DIMS, _KEEP) + tuple(extra_attrs),
        flops=lambda i, o, a: flops_per * i[0].numel, aliases=aliases, doc=doc,
        extra={"example": example or ([(3, 4, 5)], {"dim": [1], "keepdim": True}),
               "bad": ([(3, 4)], {"dim": [2]}, "out of range")},
    ))


def _same(dtype):
    return dtype


_reducer("sum", int_result, lambda t, a: torch.sum(t[0], dim=_dims(a, t[0].ndim), keepdim=a["keepdim"]),
         doc="sum over dim", example=([(3, 4, 5)], {"dim": [0, 2]}))
_reducer("mean", _same, lambda t, a: torch.mean(t[0], dim=_dims(a, t[0].ndim), keepdim=a["keepdim"]),
         float_only=True, doc="mean over dim")
_reducer("max", _same, lambda t, a: torch.amax(t[0], dim=_dims(a, t[0].ndim), keepdim=a["keepdim"]),
         aliases=("amax",), doc="largest value over dim (torch.amax; torch.max(x, dim)[0])")
_reducer("min", _same, lambda t, a: torch.amin(t[0], dim=_dims(a, t[0].ndim), keepdim=a["keepdim"]),
         aliases=("amin",), doc="smallest value over dim (torch.amin; torch.min(x, dim)[0])")
_reducer("logsumexp", float_of,
         lambda t, a: torch.logsumexp(t[0], dim=_dims(a, t[0].ndim), keepdim=a["keepdim"]),
         flops_per=3, doc="log(sum(exp(x))) over dim, computed stably")
_reducer("std", _same, lambda t, a: torch.std(t[0], dim=a["dim"], correction=a["correction"],
                                              keepdim=a["keepdim"]),
         flops_per=3, float_only=True, extra_attrs=(Attr("correction", "scalar", 1,
                                                         doc="1: unbiased (Bessel), 0: population"),),
         doc="standard deviation over dim")
_reducer("var", _same, lambda t, a: torch.var(t[0], dim=a["dim"], correction=a["correction"],
                                              keepdim=a["keepdim"]),
         flops_per=3, float_only=True, extra_attrs=(Attr("correction", "scalar", 1,
                                                         doc="1: unbiased (Bessel), 0: population"),),
         doc="variance over dim")
_reducer("norm", _same, lambda t, a: torch.linalg.vector_norm(t[0], ord=a["p"], dim=a["dim"],
                                                               keepdim=a["keepdim"]),
         flops_per=2, float_only=True, aliases=("linalg_vector_norm",),
         extra_attrs=(Attr("p", "float", 2.0, doc="2: Euclidean (and Frobenius), 1: sum of |x|, inf: max"),),
         doc="vector p-norm over dim (torch.norm, torch.linalg.vector_norm)")
_reducer("any", lambda d: "bool", lambda t, a: torch.any(t[0], dim=_dims(a, t[0].ndim), keepdim=a["keepdim"]),
         doc="true where any element over dim is non-zero")
_reducer("all", lambda d: "bool", lambda t, a: torch.all(t[0], dim=_dims(a, t[0].ndim), keepdim=a["keepdim"]),
         doc="true where every element over dim is non-zero")


def _single_dim_infer(name, dtype_rule):
    def infer(ins, attrs):
        x, dim = ins[0], attrs["dim"]
        if name != "prod" and x.dtype == "bool":
            raise ShapeError(f"{name}: torch does not accept a bool tensor (cast it first)")
        if dim is None:
            return [TensorSpec((1,) * x.rank if attrs["keepdim"] else (), dtype_rule(x.dtype))]
        d = norm_dim(dim, x.rank, f"{name}: dim")
        return [TensorSpec(reduce_shape(x.shape, [d], attrs["keepdim"]), dtype_rule(x.dtype))]
    return infer


_DIM1 = Attr("dim", "int", None, optional=True, doc="the dimension to reduce; null: the flattened tensor")


def _prod_ref(t, a):
    if a["dim"] is None:
        out = torch.prod(t[0])
        return out.reshape((1,) * t[0].ndim) if a["keepdim"] else out
    return torch.prod(t[0], dim=a["dim"], keepdim=a["keepdim"])


register(OpDef(
    "prod", "reduction", ("x",), _single_dim_infer("prod", int_result), _prod_ref, attrs=(_DIM1, _KEEP),
    doc="product over one dim (or all elements)",
    extra={"example": ([(3, 4)], {"dim": 1}), "bad": ([(3, 4)], {"dim": 3}, "out of range")},
))
for _name, _fn in (("argmax", torch.argmax), ("argmin", torch.argmin)):
    register(OpDef(
        _name, "reduction", ("x",), _single_dim_infer(_name, lambda d: "int64"),
        lambda t, a, _f=_fn: _f(t[0], dim=a["dim"], keepdim=a["keepdim"]), attrs=(_DIM1, _KEEP),
        doc=f"int64 index of the {'largest' if _name == 'argmax' else 'smallest'} value over dim "
            f"(of the flattened tensor when dim is null)",
        extra={"example": ([(3, 4, 5)], {"dim": -1}), "bad": ([(3, 4)], {"dim": -3}, "out of range")},
    ))


def _scan_ref(fn):
    """torch's scan, with float inputs accumulated in double and each output rounded once: what torch
    does on the CPU, so the reference is the correctly rounded scan on every device (torch on the GPU
    scans float32 in float32, in an order of its own). A consumer that amplifies the last bits of a
    running sum (exp of differences of cumsums, as Mamba2's chunked scan) then has one answer to
    match; codegen/rowscan.py accumulates in double too."""
    def ref(t, a):
        x = t[0]
        if x.is_floating_point() and x.dtype != torch.float64:
            return fn(x.double(), dim=a["dim"]).to(x.dtype)
        return fn(x, dim=a["dim"])
    return ref


def _scan(name, fn, what, floats_only=False):
    def infer(ins, attrs):
        x = ins[0]
        norm_dim(attrs["dim"], x.rank, f"{name}: dim")
        if floats_only and x.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{name}: x must be a floating-point tensor, got {x.dtype}")
        return [TensorSpec(x.shape, x.dtype if floats_only else int_result(x.dtype))]

    register(OpDef(
        name, "reduction", ("x",), infer, _scan_ref(fn),
        attrs=(Attr("dim", "int"),), flops=lambda i, o, a: i[0].numel,
        doc=f"inclusive running {what} along dim (a scan: same shape)",
        extra={"example": ([(3, 4)], {"dim": 1}), "bad": ([(3, 4)], {"dim": 2}, "out of range")},
    ))


_scan("cumsum", torch.cumsum, "sum")
_scan("cumprod", torch.cumprod, "product")
_scan("logcumsumexp", torch.logcumsumexp, "log of the sum of exponentials", floats_only=True)

