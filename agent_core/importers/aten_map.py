"""The table from pre-dispatch aten ops (what torch.export records) to library ops.

Each converter gets the node's arguments bound to the aten schema's names (defaults filled in) and
emits one or more library nodes through the Converter (agent_core.importers.graph). It returns the
value id of the result (a list for ops with several outputs, None for an output nobody can read) or
raises Unmapped with a reason, after which the graph converter emits an `opaque` node that runs the
aten op through torch instead. A converter never has to be perfect: the graph converter checks every
result against the shape and dtype torch recorded and falls back to opaque on any disagreement.

In-place variants (aten.add_.Tensor) are looked up under their functional name: the program is in
SSA form, and export already points later readers at the in-place op's result.
"""
from __future__ import annotations

import math
import operator

import numpy as np
from typing import Callable

from ..ops import FLOAT_DTYPES, REGISTRY

ATEN: dict[str, Callable] = {}

_REDUCTION = {0: "none", 1: "mean", 2: "sum"}  # aten's integer reduction enum


class Unmapped(Exception):
    """This node cannot be expressed with library ops; the message says why (for the warning)."""


def aten(*names: str):
    def deco(fn):
        for n in names:
            ATEN[n if n.startswith("aten.") else f"aten.{n}"] = fn
        return fn
    return deco


def lookup(target: str) -> Callable | None:
    """The converter for 'aten.name.overload', trying the functional form of in-place ops."""
    fn = ATEN.get(target)
    if fn is None:
        parts = target.split(".")
        if len(parts) == 3 and parts[1].endswith("_") and not parts[1].startswith("_"):
            fn = ATEN.get(f"aten.{parts[1][:-1]}.{parts[2]}")
    return fn


def _need(*ops: str) -> None:
    missing = [o for o in ops if o not in REGISTRY]
    if missing:
        raise Unmapped(f"the library has no op {', '.join(missing)}")


def _ints(v, n: int | None = None) -> list[int]:
    if v is None:
        return []
    if isinstance(v, int):
        return [v] * (n or 1)
    v = [int(x) for x in v]
    if n and len(v) == 1:
        return v * n
    return v


def _dims(a) -> list[int] | None:
    """A reduction's `dim` argument as the library takes it: None (or []) is every dim."""
    dim = a.get("dim")
    return None if dim is None or dim == [] else _ints(dim)


def _reduced(a) -> dict:
    """A reduction's dim and keepdim attributes."""
    return {"dim": _dims(a), "keepdim": bool(a.get("keepdim", False))}


def _is_tensor(cx, x) -> bool:
    return cx.is_tensor(x)


# --- pointwise unary -------------------------------------------------------------------------
_UNARY = {
    "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "exp2": "exp2", "expm1": "expm1",
    "log": "log", "log2": "log2", "log1p": "log1p", "abs": "abs", "neg": "neg", "negative": "neg",
    "sqrt": "sqrt", "rsqrt": "rsqrt", "reciprocal": "reciprocal", "square": "square", "sin": "sin",
    "cos": "cos", "erf": "erf", "sign": "sign", "floor": "floor", "ceil": "ceil", "round": "round",
    "silu": "silu", "mish": "mish", "selu": "selu", "hardsigmoid": "hardsigmoid",
    "hardswish": "hardswish", "relu6": "relu6", "log_sigmoid": "logsigmoid", "logical_not": "logical_not",
    "tanhshrink": "tanhshrink", "trunc": "trunc", "fix": "trunc", "frac": "frac", "sinh": "sinh", "cosh": "cosh",
    "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "arcsin": "asin", "arccos": "acos",
    "arctan": "atan", "erfc": "erfc", "erfinv": "erfinv", "lgamma": "lgamma", "sgn": "sign", "sinc": "sinc",
}


def _unary(lib):
    def conv(cx, n, a):
        return cx.pointwise(n, lib, [a["self"]])
    return conv


for _aten, _lib in _UNARY.items():
    aten(f"{_aten}.default")(_unary(_lib))


@aten("gelu.default")
def _gelu(cx, n, a):
    return cx.pointwise(n, "gelu", [a["self"]], {"approximate": a["approximate"]})


@aten("leaky_relu.default")
def _leaky(cx, n, a):
    return cx.pointwise(n, "leaky_relu", [a["self"]], {"negative_slope": float(a["negative_slope"])})


@aten("hardtanh.default")
def _hardtanh(cx, n, a):
    return cx.pointwise(n, "hardtanh", [a["self"]], {"min_val": float(a["min_val"]), "max_val": float(a["max_val"])})


@aten("softplus.default")
def _softplus(cx, n, a):
    return cx.pointwise(n, "softplus", [a["self"]], {"beta": float(a["beta"]), "threshold": float(a["threshold"])})


@aten("elu.default")
def _elu(cx, n, a):
    if float(a["scale"]) != 1.0 or float(a["input_scale"]) != 1.0:
        raise Unmapped("elu with scale or input_scale other than 1")
    return cx.pointwise(n, "elu", [a["self"]], {"alpha": float(a["alpha"])})


@aten("celu.default")
def _celu(cx, n, a):
    return cx.pointwise(n, "celu", [a["self"]], {"alpha": float(a["alpha"])})


@aten("hardshrink.default", "softshrink.default")
def _shrink(cx, n, a):
    return cx.pointwise(n, n.target.__name__.split(".")[0], [a["self"]], {"lambd": float(a["lambd"])})


@aten("nan_to_num.default")
def _nan_to_num(cx, n, a):
    import torch
    dt = getattr(torch, cx.meta_dtype(n))
    if not dt.is_floating_point:      # an integer tensor has no NaN or inf: it passes through
        return cx.alias(a["self"])
    info = torch.finfo(dt)
    bound = {"posinf": info.max, "neginf": info.min}
    return cx.pointwise(n, "nan_to_num", [a["self"]], {
        "nan": float(a.get("nan") or 0.0),
        **{k: float(bound[k] if a.get(k) is None else a[k]) for k in bound}})


@aten("clamp.default", "clip.default")
def _clamp(cx, n, a):
    return cx.pointwise(n, "clamp", [a["self"]], {"min": a["min"], "max": a["max"]})


@aten("clamp.Tensor", "clip.Tensor")
def _clamp_t(cx, n, a):
    x = a["self"]
    if a["min"] is not None:
        x = cx.pointwise(n, "maximum", [x, a["min"]])
    if a["max"] is not None:
        x = cx.pointwise(n, "minimum", [x, a["max"]])
    return x


@aten("clamp_min.default")
def _clamp_min(cx, n, a):
    return cx.pointwise(n, "max_scalar", [a["self"]], {"value": a["min"]})


@aten("clamp_max.default")
def _clamp_max(cx, n, a):
    return cx.pointwise(n, "min_scalar", [a["self"]], {"value": a["max"]})


@aten("threshold.default")
def _threshold(cx, n, a):
    # x if x > threshold else value; relu when both are 0
    if a["threshold"] == 0 and a["value"] == 0:
        return cx.pointwise(n, "relu", [a["self"]])
    return cx.pointwise(n, "threshold", [a["self"]], {"threshold": float(a["threshold"]), "value": float(a["value"])})


@aten("dropout.default", "feature_dropout.default", "alpha_dropout.default", "feature_alpha_dropout.default")
def _dropout(cx, n, a):
    if a["train"]:
        raise Unmapped("dropout in training mode")
    return cx.alias(a["input"])


@aten("to.dtype", "to.dtype_layout", "to.device", "_to_copy.default", "type_as.default")
def _to(cx, n, a):
    return cx.cast_to(a.get("self") if "self" in a else a["input"], cx.meta_dtype(n))


@aten("clone.default", "contiguous.default", "detach.default", "alias.default", "lift_fresh_copy.default",
      "lift_fresh.default", "positive.default", "copy.default")
def _identity(cx, n, a):
    x = a.get("self") if a.get("self") is not None else a.get("src")
    if n.target.__name__.startswith("copy"):
        x = a["src"]  # copy(self, src): the result holds src's data in self's shape
        if cx.spec(x).shape != cx.meta_shape(n):
            x = cx.emit("expand", [x], {"size": list(cx.meta_shape(n))})
    return cx.alias(x)


# --- pointwise binary ------------------------------------------------------------------------
def _arith(lib: str, scalar: str, rscalar: str | None = None):
    def conv(cx, n, a):
        x, y = a["self"], a["other"]
        alpha = a.get("alpha", 1)
        if alpha not in (None, 1) and lib in ("add", "sub"):
            y = cx.scaled(n, y, alpha)
        tx, ty = cx.is_tensor(x), cx.is_tensor(y)
        if tx and ty:
            return cx.pointwise(n, lib, [x, y])
        if tx:
            return cx.pointwise(n, scalar, [x], {"value": y})
        if ty and rscalar:
            return cx.pointwise(n, rscalar, [y], {"value": x})
        raise Unmapped("an arithmetic op with no tensor operand")
    return conv


for _ov in ("Tensor", "Scalar"):
    aten(f"add.{_ov}")(_arith("add", "add_scalar", "add_scalar"))
    aten(f"sub.{_ov}", f"subtract.{_ov}")(_arith("sub", "sub_scalar", "rsub_scalar"))
    aten(f"mul.{_ov}", f"multiply.{_ov}")(_arith("mul", "mul_scalar", "mul_scalar"))
    aten(f"div.{_ov}", f"divide.{_ov}", f"true_divide.{_ov}")(_arith("div", "div_scalar", "rdiv_scalar"))


@aten("rsub.Scalar", "rsub.Tensor")
def _rsub(cx, n, a):
    # rsub(self, other, alpha) = other - alpha * self
    x, y, alpha = a["self"], a["other"], a["alpha"]
    if alpha not in (None, 1):
        x = cx.scaled(n, x, alpha)
    if cx.is_tensor(y):
        return cx.pointwise(n, "sub", [y, x])
    return cx.pointwise(n, "rsub_scalar", [x], {"value": y})


@aten("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(cx, n, a):
    mode = a["rounding_mode"]
    if mode not in (None, "floor"):
        raise Unmapped(f"division with rounding_mode={mode!r}")
    if mode == "floor" and cx.meta_dtype(n) not in FLOAT_DTYPES:     # integers: an exact division
        return cx.pointwise(n, "floor_divide", [a["self"], cx.tensor(a["other"], like=a["self"])])
    q = _arith("div", "div_scalar", "rdiv_scalar")(cx, n, a)
    return cx.pointwise(n, "floor", [q]) if mode == "floor" else q


@aten("pow.Tensor_Scalar")
def _pow_ts(cx, n, a):
    e = a["exponent"]
    if e == 2:
        return cx.pointwise(n, "square", [a["self"]])
    if e == 0.5:
        return cx.pointwise(n, "sqrt", [a["self"]])
    return cx.pointwise(n, "pow_scalar", [a["self"]], {"value": e})


@aten("pow.Tensor_Tensor")
def _pow_tt(cx, n, a):
    return cx.pointwise(n, "pow", [a["self"], a["exponent"]])


@aten("pow.Scalar")
def _pow_s(cx, n, a):
    return cx.pointwise(n, "rpow_scalar", [a["exponent"]], {"value": a["self"]})


@aten("maximum.default", "max.other", "fmax.default")
def _maximum(cx, n, a):
    return cx.pointwise(n, "maximum", [a["self"], a["other"]])


@aten("minimum.default", "min.other", "fmin.default")
def _minimum(cx, n, a):
    return cx.pointwise(n, "minimum", [a["self"], a["other"]])


def _compare(lib):
    def conv(cx, n, a):
        return cx.pointwise(n, lib, [a["self"], cx.tensor(a["other"], like=a["self"])], cast=False)
    return conv


for _c in ("gt", "ge", "lt", "le", "eq", "ne"):
    aten(f"{_c}.Tensor", f"{_c}.Scalar")(_compare(_c))


def _binary_op(lib):
    def conv(cx, n, a):
        return cx.pointwise(n, lib, [a["self"], a["other"]])
    return conv


for _c in ("atan2", "hypot", "logaddexp", "fmod", "remainder"):
    aten(f"{_c}.default", f"{_c}.Tensor", f"{_c}.Scalar")(_binary_op(_c))
aten("arctan2.default")(_binary_op("atan2"))


@aten("isnan.default")
def _isnan(cx, n, a):
    return cx.pointwise(n, "ne", [a["self"], a["self"]], cast=False)      # only NaN differs from itself


@aten("isinf.default", "isfinite.default")
def _isinf(cx, n, a):
    """|x| == inf, or |x| < inf (false for NaN too)."""
    if cx.spec(a["self"]).dtype not in FLOAT_DTYPES:
        raise Unmapped("isinf / isfinite of an integer tensor")
    size = cx.emit("abs", [a["self"]])
    op = "eq" if str(n.target).startswith("aten.isinf") else "lt"
    return cx.pointwise(n, op, [size, cx.tensor(float("inf"), like=a["self"])], cast=False)


@aten("logical_and.default", "logical_or.default", "logical_xor.default", "__and__.Tensor", "__or__.Tensor",
      "__xor__.Tensor", "bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor", "bitwise_and.Scalar",
      "bitwise_or.Scalar", "bitwise_xor.Scalar", "__and__.Scalar", "__or__.Scalar", "__xor__.Scalar")
def _logical(cx, n, a):
    """Logical ops of truth values; bitwise ops of bool tensors are the same, of integers bitwise_*."""
    name = str(n.target).split(".")[1].strip("_")
    kind = "and" if "and" in name else "or" if name.endswith("or") and "xor" not in name else "xor"
    x, y = a["self"], cx.tensor(a["other"], like=a["self"])
    if name.startswith("logical") or cx.spec(x).dtype == cx.spec(y).dtype == "bool":
        if kind == "xor":           # true where exactly one is
            return cx.pointwise(n, "ne", [cx.cast_to(x, "bool"), cx.cast_to(y, "bool")], cast=False)
        return cx.pointwise(n, f"logical_{kind}", [x, y], cast=False)
    return cx.pointwise(n, f"bitwise_{kind}", [x, y])


@aten("addcdiv.default")
def _addcdiv(cx, n, a):
    """self + value * tensor1 / tensor2"""
    q = cx.emit("div", [a["tensor1"], a["tensor2"]])
    if float(a.get("value", 1)) != 1:
        q = cx.emit("mul_scalar", [q], {"value": float(a["value"])})
    return cx.pointwise(n, "add", [a["self"], q])


@aten("prelu.default", "_prelu_kernel.default")
def _prelu(cx, n, a):
    """max(x, 0) + weight * min(x, 0), the weight per channel (dim 1) or one for all."""
    x, w = a["self"], a["weight"]
    shape = cx.spec(x).shape
    if cx.spec(w).numel > 1:
        w = cx.emit("reshape", [w], {"shape": [cx.spec(w).numel] + [1] * (len(shape) - 2)})
    neg = cx.emit("mul", [w, cx.emit("min_scalar", [x], {"value": 0.0})])
    return cx.pointwise(n, "add", [cx.emit("relu", [x]), neg])


@aten("floor_divide.default", "floor_divide.Scalar")
def _floor_divide(cx, n, a):
    return _div_mode(cx, n, {**a, "rounding_mode": "floor"})


@aten("xlogy.Tensor", "xlogy.Scalar_Other", "special_xlogy.default")
def _xlogy(cx, n, a):
    """x * log(y), 0 where x is 0 (NaN still where y is NaN), as torch defines it."""
    if cx.meta_dtype(n) not in FLOAT_DTYPES:
        raise Unmapped("xlogy with an integer result")
    x, y = a["self"], cx.tensor(a["other"], like=a["self"])
    zero = cx.tensor(0.0, like=x)
    product = cx.emit("mul", [x, cx.emit("log", [y])])
    at_zero = cx.emit("where", [cx.emit("ne", [y, y]), y, zero])    # NaN stays NaN
    return cx.pointwise(n, "where", [cx.emit("eq", [x, zero]), at_zero, product])


@aten("signbit.default")
def _signbit(cx, n, a):
    if cx.spec(a["self"]).dtype not in FLOAT_DTYPES:
        raise Unmapped("signbit of an integer tensor")
    return cx.pointwise(n, "signbit", [a["self"]], cast=False)


@aten("logit.default")
def _logit(cx, n, a):
    """log(x / (1 - x)), x clamped to [eps, 1 - eps] first when eps is given."""
    x, eps = a["self"], a.get("eps")
    if eps is not None:
        x = cx.emit("clamp", [x], {"min": float(eps), "max": 1.0 - float(eps)})
    odds = cx.emit("div", [x, cx.emit("rsub_scalar", [x], {"value": 1.0})])
    return cx.pointwise(n, "log", [odds])


@aten("nanmean.default")
def _nanmean(cx, n, a):
    """The sum of the numbers over their count (NaN left out of both)."""
    x, attrs = a["self"], _reduced(a)
    nan = cx.emit("ne", [x, x])
    total = cx.emit("sum", [cx.emit("where", [nan, cx.tensor(0.0, like=x), x])], attrs)
    count = cx.emit("sum", [cx.emit("cast", [cx.emit("logical_not", [nan])], {"dtype": cx.spec(x).dtype})], attrs)
    return cx.pointwise(n, "div", [total, count])


@aten("linalg_norm.default")
def _linalg_norm(cx, n, a):
    """A vector norm (ord a number, one dim), or the Frobenius norm (ord None): norm(p) over the dims."""
    ord_, dims = a.get("ord"), _dims(a)
    if isinstance(ord_, str) or (ord_ is not None and (dims is None or len(dims) != 1)):
        raise Unmapped(f"linalg.norm with ord={ord_!r} over {dims} (a matrix norm)")
    return cx.emit("norm", [a["self"]], {"p": 2.0 if ord_ is None else float(ord_), "dim": dims,
                                         "keepdim": bool(a.get("keepdim", False))})


@aten("cdist.default", "_cdist_forward.default")
def _cdist(cx, n, a):
    """Distances between the rows of x1 [.., P, M] and x2 [.., R, M], as torch computes them: for p = 2
    with more than 25 rows on either side (compute_mode's default), through one matmul,
    sqrt(max(|x1|^2 + |x2|^2 - 2 x1 x2^T, 1e-30)); otherwise the p-norm of every difference."""
    x1, x2, p = a["x1"], a["x2"], float(a.get("p", 2.0))
    s1, s2 = cx.spec(x1).shape, cx.spec(x2).shape
    mode = a.get("compute_mode")
    mode = 0 if mode is None else int(mode)   # 0: mm past 25 rows, 1: always mm, 2: never
    rank = len(cx.meta_shape(n))
    if p == 2 and (mode == 1 or (mode == 0 and (s1[-2] > 25 or s2[-2] > 25))):
        sq = [cx.emit("sum", [cx.emit("square", [x])], {"dim": [-1], "keepdim": True}) for x in (x1, x2)]
        dims = list(range(len(s2)))
        dims[-1], dims[-2] = dims[-2], dims[-1]
        cross = cx.emit("matmul", [x1, cx.emit("permute", [x2], {"dims": dims})])
        sq2 = cx.emit("permute", [sq[1]], {"dims": dims})
        d2 = cx.emit("add", [cx.emit("add", [sq[0], sq2]), cx.emit("mul_scalar", [cross], {"value": -2.0})])
        return cx.emit("sqrt", [cx.emit("max_scalar", [d2], {"value": 1e-30})])
    rows1 = cx.emit("reshape", [x1], {"shape": [*s1[:-1], 1, s1[-1]]})
    rows2 = cx.emit("reshape", [x2], {"shape": [*s2[:-2], 1, *s2[-2:]]})
    diff = cx.emit("sub", [rows1, rows2])
    return cx.emit("norm", [diff], {"p": p, "dim": [rank], "keepdim": False})


@aten("outer.default", "ger.default")
def _outer(cx, n, a):
    """a[:, None] * b[None, :]"""
    x, y = a["self"], a["vec2"]
    cols = cx.emit("reshape", [x], {"shape": [cx.spec(x).shape[0], 1]})
    return cx.pointwise(n, "mul", [cols, y])


@aten("cross.default", "linalg_cross.default")
def _cross(cx, n, a):
    """a x b along a dim of size 3: roll(a, -1) * roll(b, -2) - roll(a, -2) * roll(b, -1)."""
    x, y = a["self"], a["other"]
    shape = cx.meta_shape(n)
    dim = a.get("dim", -1 if "linalg" in str(n.target) else None)
    if dim is None:            # torch.cross without dim: the first dim of size 3
        dim = next((d for d, size in enumerate(shape) if size == 3), None)
    if dim is None or shape[int(dim)] != 3:
        raise Unmapped("cross product along a dim that is not of size 3")
    dim = int(dim) % len(shape)
    x, y = (cx.emit("expand", [v], {"size": list(shape)}) if tuple(cx.spec(v).shape) != tuple(shape) else v
            for v in (x, y))

    def rolled(v, k):
        return cx.emit("roll", [v], {"shifts": [k], "dims": [dim]})
    first = cx.emit("mul", [rolled(x, -1), rolled(y, -2)])
    return cx.pointwise(n, "sub", [first, cx.emit("mul", [rolled(x, -2), rolled(y, -1)])])


@aten("kron.default")
def _kron(cx, n, a):
    """Every element of a times all of b: a's dims interleaved with b's, multiplied, merged pairwise."""
    x, y = a["self"], a["other"]
    rank = max(len(cx.spec(x).shape), len(cx.spec(y).shape))
    xs = [1] * (rank - len(cx.spec(x).shape)) + list(cx.spec(x).shape)
    ys = [1] * (rank - len(cx.spec(y).shape)) + list(cx.spec(y).shape)
    spread_x = cx.emit("reshape", [x], {"shape": [d for size in xs for d in (size, 1)]})
    spread_y = cx.emit("reshape", [y], {"shape": [d for size in ys for d in (1, size)]})
    product = cx.pointwise(n, "mul", [spread_x, spread_y])
    return cx.emit("reshape", [product], {"shape": list(cx.meta_shape(n))})


@aten("tensordot.default")
def _tensordot(cx, n, a):
    """The contracted dims moved inner, both sides flattened to a matrix, one matmul, the free dims back."""
    x, y = a["self"], a["other"]
    xs, ys = list(cx.spec(x).shape), list(cx.spec(y).shape)
    dx = [d % len(xs) for d in _ints(a["dims_self"])]
    dy = [d % len(ys) for d in _ints(a["dims_other"])]
    free_x = [d for d in range(len(xs)) if d not in dx]
    free_y = [d for d in range(len(ys)) if d not in dy]
    k = math.prod(xs[d] for d in dx)

    def matrix(v, order, shape):
        if order != list(range(len(order))):
            v = cx.emit("permute", [v], {"dims": order})
        return cx.emit("reshape", [v], {"shape": shape})
    left = matrix(x, free_x + dx, [math.prod(xs[d] for d in free_x), k])
    right = matrix(y, dy + free_y, [k, math.prod(ys[d] for d in free_y)])
    return cx.emit("reshape", [cx.emit("matmul", [left, right])], {"shape": list(cx.meta_shape(n))})


@aten("where.self", "where.ScalarOther", "where.ScalarSelf", "where.Scalar")
def _where(cx, n, a):
    dt = cx.meta_dtype(n)
    x = cx.tensor(a["self"], dtype=dt)
    y = cx.tensor(a["other"], dtype=dt)
    return cx.emit("where", [a["condition"], cx.cast_to(x, dt), cx.cast_to(y, dt)])


@aten("addcmul.default")
def _addcmul(cx, n, a):
    return cx.pointwise(n, "addcmul", [a["self"], a["tensor1"], a["tensor2"]], {"value": a["value"]})


@aten("lerp.Tensor")
def _lerp(cx, n, a):
    return cx.pointwise(n, "lerp", [a["self"], a["end"], a["weight"]])


# --- matmul ----------------------------------------------------------------------------------
@aten("matmul.default", "mm.default", "mv.default", "dot.default")
def _matmul(cx, n, a):
    return cx.emit("matmul", [a["self"], a.get("other", a.get("mat2", a.get("vec", a.get("tensor"))))])


@aten("bmm.default")
def _bmm(cx, n, a):
    return cx.emit("bmm", [a["self"], a["mat2"]])


@aten("linear.default")
def _linear(cx, n, a):
    return cx.emit("linear", [a["input"], a["weight"], a["bias"]])


@aten("addmm.default")
def _addmm(cx, n, a):
    return cx.emit("addmm", [a["self"], a["mat1"], a["mat2"]], {"beta": a["beta"], "alpha": a["alpha"]})


@aten("baddbmm.default")
def _baddbmm(cx, n, a):
    return cx.emit("baddbmm", [a["self"], a["batch1"], a["batch2"]], {"beta": a["beta"], "alpha": a["alpha"]})


@aten("einsum.default")
def _einsum(cx, n, a):
    return cx.emit("einsum", list(a["tensors"]), {"equation": a["equation"]})


@aten("scaled_dot_product_attention.default")
def _sdpa(cx, n, a):
    if a["enable_gqa"]:
        raise Unmapped("scaled_dot_product_attention with enable_gqa")
    return cx.emit("scaled_dot_product_attention", [a["query"], a["key"], a["value"], a["attn_mask"]],
                   {"dropout_p": float(a["dropout_p"]), "is_causal": bool(a["is_causal"]), "scale": a["scale"]})


# --- convolution -----------------------------------------------------------------------------
def _conv(rank: int, transposed: bool):
    def conv(cx, n, a):
        attrs = {"stride": _ints(a["stride"], rank), "dilation": _ints(a["dilation"], rank), "groups": int(a["groups"])}
        pad = a["padding"]
        attrs["padding"] = pad if isinstance(pad, str) else _ints(pad, rank)
        if transposed:
            attrs["output_padding"] = _ints(a["output_padding"], rank)
        op = f"conv_transpose{rank}d" if transposed else f"conv{rank}d"
        return cx.emit(op, [a["input"], a["weight"], a["bias"]], attrs)
    return conv


for _r in (1, 2, 3):
    aten(f"conv{_r}d.default", f"conv{_r}d.padding")(_conv(_r, False))
    aten(f"conv_transpose{_r}d.input", f"conv_transpose{_r}d.default")(_conv(_r, True))


@aten("convolution.default", "_convolution.default")
def _convolution(cx, n, a):
    rank = len(cx.spec(a["input"]).shape) - 2
    b = dict(a)
    if b["transposed"]:
        return _conv(rank, True)(cx, n, b)
    if any(_ints(b["output_padding"], rank)):
        raise Unmapped("a forward convolution with output_padding")
    return _conv(rank, False)(cx, n, b)


# --- pooling ---------------------------------------------------------------------------------
def _max_pool(rank: int):
    def conv(cx, n, a):
        k = _ints(a["kernel_size"], rank)
        attrs = {"kernel_size": k, "stride": _ints(a["stride"], rank) or k, "padding": _ints(a["padding"], rank),
                 "dilation": _ints(a["dilation"], rank), "ceil_mode": bool(a["ceil_mode"])}
        return cx.emit(f"max_pool{rank}d", [a["self"]], attrs)
    return conv


def _avg_pool(rank: int):
    def conv(cx, n, a):
        k = _ints(a["kernel_size"], rank)
        attrs = {"kernel_size": k, "stride": _ints(a["stride"], rank) or k, "padding": _ints(a["padding"], rank),
                 "ceil_mode": bool(a["ceil_mode"]), "count_include_pad": bool(a["count_include_pad"])}
        if a.get("divisor_override") is not None:
            attrs["divisor_override"] = int(a["divisor_override"])
        return cx.emit(f"avg_pool{rank}d", [a["self"]], attrs)
    return conv


def _adaptive(kind: str, rank: int):
    def conv(cx, n, a):
        return cx.emit(f"adaptive_{kind}_pool{rank}d", [a["self"]], {"output_size": _ints(a["output_size"], rank)})
    return conv


def _indices_read(n) -> bool:
    """Whether anything reads output 1 (the indices) of a (values, indices) node: a getitem of it with
    users, or a user that takes the tuple whole."""
    return any(u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in n.users)


def _adaptive_max_idx(rank: int):
    """aten's adaptive_max_pool returns (values, indices); the library op gives the values. The indices
    output is None, as for max_pool2d_with_indices, and a node whose indices are read stays opaque."""
    def conv(cx, n, a):
        if _indices_read(n):
            raise Unmapped(f"its indices are read; the library's adaptive_max_pool{rank}d gives the values only")
        return [_adaptive("max", rank)(cx, n, a), None]
    return conv


for _r in (1, 2, 3):
    aten(f"max_pool{_r}d.default")(_max_pool(_r))
    aten(f"avg_pool{_r}d.default")(_avg_pool(_r))
    aten(f"adaptive_avg_pool{_r}d.default", f"_adaptive_avg_pool{_r}d.default")(_adaptive("avg", _r))
    aten(f"adaptive_max_pool{_r}d.default")(_adaptive_max_idx(_r))


@aten("max_pool2d_with_indices.default", "max_pool3d_with_indices.default")
def _max_pool_idx(cx, n, a):
    rank = 2 if "2d" in str(n.target) else 3
    return [_max_pool(rank)(cx, n, a), None]


# --- reductions ------------------------------------------------------------------------------
def _reduce(lib: str):
    def conv(cx, n, a):
        x = a["self"]
        if a.get("dtype") is not None:
            x = cx.cast_to(x, cx.meta_dtype(n))
        return cx.emit(lib, [x], _reduced(a))
    return conv


aten("sum.dim_IntList", "sum.default")(_reduce("sum"))
aten("mean.dim", "mean.default")(_reduce("mean"))
aten("amax.default")(_reduce("max"))
aten("amin.default")(_reduce("min"))
aten("logsumexp.default")(_reduce("logsumexp"))
aten("any.dim", "any.dims", "any.default")(_reduce("any"))
aten("all.dim", "all.dims", "all.default")(_reduce("all"))


@aten("prod.dim_int", "prod.default")
def _prod(cx, n, a):
    x = a["self"]
    if a.get("dtype") is not None:
        x = cx.cast_to(x, cx.meta_dtype(n))
    dim = a.get("dim")
    return cx.emit("prod", [x], {"dim": None if dim is None else int(dim), "keepdim": bool(a.get("keepdim", False))})


@aten("max.dim", "min.dim")
def _max_dim(cx, n, a):
    lib = "max" if str(n.target).startswith("aten.max") else "min"
    # values through the library reduction; the indices (argmax/argmin) when someone reads them
    vals = cx.emit(lib, [a["self"]], {"dim": [int(a["dim"])], "keepdim": bool(a["keepdim"])})
    users = {u.args[1] for u in n.users if getattr(u.target, "__name__", "") == "getitem" and u.users}
    idx = None
    if 1 in users:
        idx = cx.emit("arg" + lib, [a["self"]], {"dim": int(a["dim"]), "keepdim": bool(a["keepdim"])})
    return [vals, idx]


@aten("max.default", "min.default")
def _max_all(cx, n, a):
    lib = "max" if str(n.target).startswith("aten.max") else "min"
    return cx.emit(lib, [a["self"]], {"dim": None, "keepdim": False})


@aten("argmax.default", "argmin.default")
def _argmax(cx, n, a):
    lib = str(n.target).split(".")[1]
    if a["dim"] is None:
        raise Unmapped(f"{lib} over the flattened tensor")
    return cx.emit(lib, [a["self"]], {"dim": int(a["dim"]), "keepdim": bool(a["keepdim"])})


TOPK_MAX_K = 8          # picks a row kernel makes one after another (each one round over the row)
TOPK_MAX_LEN = 1024     # rows short enough to be held on chip: the rounds re-read registers, not memory


@aten("topk.default")
def _topk(cx, n, a):
    """The k largest along dim as k rounds of max and argmax, each round's pick masked out of the next by
    its index, so equal values stay distinct picks: values then indices, concatenated along dim (the row
    kernel stores them per row). torch's order: NaN above every number, ties to the smaller index. The
    argmax ranks -inf as -FLT_MAX so that a picked -inf (masked to -inf) never wins again; the values come
    from the max, exact. k <= TOPK_MAX_K over rows of at most TOPK_MAX_LEN (a router over its experts, a
    beam's candidates); longer rows, larger k and the k smallest stay opaque."""
    x, k = a["self"], int(a["k"])
    shape = cx.spec(x).shape
    d = int(a.get("dim", -1)) % max(len(shape), 1)
    if not a.get("largest", True):
        raise Unmapped("topk of the k smallest (largest=False)")
    if cx.spec(x).dtype not in FLOAT_DTYPES or not shape:
        raise Unmapped("topk of an integer or 0-d tensor")
    if not 1 <= k <= TOPK_MAX_K or shape[d] > TOPK_MAX_LEN:
        raise Unmapped(f"topk of k = {k} over rows of {shape[d]} (generated for k <= {TOPK_MAX_K} over rows of "
                       f"at most {TOPK_MAX_LEN})")
    positions = cx.constant("topk_positions", np.arange(shape[d]).reshape([shape[d]] + [1] * (len(shape) - 1 - d)),
                            "int64")
    neg_inf = cx.tensor(float("-inf"), like=x)
    key = cx.emit("where", [cx.emit("eq", [x, neg_inf]), cx.tensor(-float(np.finfo(np.float32).max), like=x), x])
    values, indices, picked, rest, rest_key = [], [], None, x, key
    for j in range(k):
        values.append(cx.emit("max", [rest], {"dim": [d], "keepdim": True}))
        indices.append(cx.emit("argmax", [rest_key], {"dim": d, "keepdim": True}))
        if j + 1 < k:
            hit = cx.emit("eq", [positions, indices[-1]])
            picked = hit if picked is None else cx.emit("logical_or", [picked, hit])
            rest, rest_key = (cx.emit("where", [picked, neg_inf, v]) for v in (x, key))
    if k == 1:
        return [values[0], indices[0]]
    return [cx.emit("cat", values, {"dim": d}), cx.emit("cat", indices, {"dim": d})]


def _var_std(lib: str):
    def conv(cx, n, a):
        corr = a.get("correction")
        if corr is None:
            corr = 1 if a.get("unbiased", True) else 0
        return cx.emit(lib, [a["self"]], {**_reduced(a),
                                          "correction": int(corr)})
    return conv


aten("var.correction", "var.dim", "var.default")(_var_std("var"))
aten("std.correction", "std.dim", "std.default")(_var_std("std"))


@aten("var_mean.correction", "var_mean.dim", "var_mean.default", "std_mean.correction", "std_mean.dim",
      "std_mean.default")
def _var_mean(cx, n, a):
    lib = "std" if str(n.target).startswith("aten.std") else "var"
    return [_var_std(lib)(cx, n, a), cx.emit("mean", [a["self"]], _reduced(a))]


@aten("aminmax.default")
def _aminmax(cx, n, a):
    dim = a.get("dim")
    attrs = {"dim": None if dim is None else [int(dim)], "keepdim": bool(a.get("keepdim", False))}
    return [cx.emit("min", [a["self"]], attrs), cx.emit("max", [a["self"]], attrs)]


@aten("count_nonzero.default", "count_nonzero.dim_IntList")
def _count_nonzero(cx, n, a):
    x = a["self"]
    hit = cx.emit("ne", [x, cx.tensor(0, like=x)])
    return cx.emit("sum", [cx.emit("cast", [hit], {"dtype": "int64"})], {"dim": _dims(a), "keepdim": False})


@aten("nansum.default")
def _nansum(cx, n, a):
    x = a["self"]
    clean = cx.emit("where", [cx.emit("ne", [x, x]), cx.tensor(0.0, like=x), x])
    return cx.emit("sum", [clean], _reduced(a))


@aten("diff.default")
def _diff(cx, n, a):
    """x[1:] - x[:-1] along dim (once; prepend / append and n > 1 stay opaque)."""
    x, dim = a["self"], int(a.get("dim", -1))
    if int(a.get("n", 1)) != 1 or a.get("prepend") is not None or a.get("append") is not None:
        raise Unmapped("diff with n > 1, prepend or append")
    size = cx.spec(x).shape[dim]
    hi = cx.emit("slice", [x], {"dim": dim, "start": 1, "end": size, "step": 1})
    lo = cx.emit("slice", [x], {"dim": dim, "start": 0, "end": size - 1, "step": 1})
    return cx.pointwise(n, "sub", [hi, lo])


def _scan(lib: str):
    def conv(cx, n, a):
        x = a["self"]
        if a.get("dtype") is not None:
            x = cx.cast_to(x, cx.meta_dtype(n))
        return cx.emit(lib, [x], {"dim": int(a["dim"])})
    return conv


aten("cumsum.default")(_scan("cumsum"))
aten("cumprod.default")(_scan("cumprod"))
aten("logcumsumexp.default")(_scan("logcumsumexp"))


def _softmax(lib: str):
    def conv(cx, n, a):
        x = a["self"]
        if a.get("dtype") is not None:
            x = cx.cast_to(x, cx.meta_dtype(n))
        return cx.emit(lib, [x], {"dim": int(a["dim"])})
    return conv


aten("softmax.int", "_softmax.default", "special_softmax.default")(_softmax("softmax"))
aten("log_softmax.int", "_log_softmax.default")(_softmax("log_softmax"))


@aten("linalg_vector_norm.default", "norm.ScalarOpt_dim", "norm.Scalar", "frobenius_norm.dim")
def _vector_norm(cx, n, a):
    x = a["self"]
    ord_ = a.get("ord", a.get("p", 2))
    ord_ = 2 if ord_ is None else ord_
    if a.get("dtype") is not None:
        x = cx.cast_to(x, cx.meta_dtype(n))
    return cx.emit("norm", [x], {"p": float(ord_), **_reduced(a)})


# --- normalization ---------------------------------------------------------------------------
@aten("layer_norm.default")
def _layer_norm(cx, n, a):
    return cx.emit("layer_norm", [a["input"], a["weight"], a["bias"]],
                   {"normalized_shape": _ints(a["normalized_shape"]), "eps": float(a["eps"])})


@aten("rms_norm.default")
def _rms_norm(cx, n, a):
    return cx.emit("rms_norm", [a["input"], a["weight"]],
                   {"normalized_shape": _ints(a["normalized_shape"]), "eps": a["eps"]})


@aten("batch_norm.default")
def _batch_norm(cx, n, a):
    if a["running_mean"] is None:
        raise Unmapped("batch_norm without running statistics")
    return cx.emit("batch_norm", [a["input"], a["running_mean"], a["running_var"], a["weight"], a["bias"]],
                   {"training": bool(a["training"]), "momentum": float(a["momentum"] or 0.1),
                    "eps": float(a["eps"])})


@aten("_native_batch_norm_legit_no_training.default")
def _bn_no_training(cx, n, a):
    out = cx.emit("batch_norm", [a["input"], a["running_mean"], a["running_var"], a["weight"], a["bias"]],
                  {"eps": float(a["eps"])})
    return [out, None, None]


@aten("group_norm.default")
def _group_norm(cx, n, a):
    return cx.emit("group_norm", [a["input"], a["weight"], a["bias"]],
                   {"num_groups": int(a["num_groups"]), "eps": float(a["eps"])})


@aten("instance_norm.default")
def _instance_norm(cx, n, a):
    return cx.emit("instance_norm", [a["input"], a["running_mean"], a["running_var"], a["weight"], a["bias"]],
                   {"use_input_stats": bool(a["use_input_stats"]), "momentum": float(a["momentum"] or 0.1),
                    "eps": float(a["eps"])})


# --- layout ----------------------------------------------------------------------------------
@aten("view.default", "reshape.default", "_unsafe_view.default", "flatten.using_ints", "unsqueeze.default",
      "squeeze.dim", "squeeze.dims", "squeeze.default", "view_as.default", "reshape_as.default",
      "unflatten.int", "ravel.default")
def _reshape(cx, n, a):
    x = a["self"]
    if cx.spec(x).shape == cx.meta_shape(n):
        return cx.alias(x)
    return cx.emit("reshape", [x], {"shape": list(cx.meta_shape(n))})


@aten("upsample_nearest1d.vec", "upsample_nearest2d.vec", "upsample_nearest3d.vec", "upsample_nearest1d.default",
      "upsample_nearest2d.default", "upsample_nearest3d.default")
def _upsample_nearest(cx, n, a):
    """Nearest resampling by a whole factor is a view: output i along an axis reads input i // r
    (each element repeated r times: unsqueeze, expand, reshape) or, shrinking, input i * r (a strided
    slice), so it fuses into whatever reads it. Other ratios stay opaque."""
    x = a.get("input", a.get("self"))
    shape, out = list(cx.spec(x).shape), list(cx.meta_shape(n))
    d = len(out) - 2
    names = ("scales",) if d == 1 else ("scales_d", "scales_h", "scales_w")[-d:]      # the .default forms
    scales = a.get("scale_factors") or [a.get(k) for k in names]
    for j in range(d):
        i, o = shape[2 + j], out[2 + j]
        whole = o % i == 0 if o >= i else i % o == 0
        given = scales[j] if j < len(scales) else None
        if not whole or (given is not None and given != (o / i)):
            raise Unmapped(f"nearest resampling from {i} to {o}{f' (scale {given})' if given else ''} is not by a "
                           f"whole factor")
    for j in range(d):
        i, o, ax = shape[2 + j], out[2 + j], 2 + j
        if o < i:        # every (i // o)-th element
            x = cx.emit("slice", [x], {"dim": ax, "start": 0, "end": i, "step": i // o})
        elif o > i:      # each element o // i times
            r = o // i
            cur = list(cx.spec(x).shape)
            x = cx.emit("reshape", [x], {"shape": cur[:ax + 1] + [1] + cur[ax + 1:]})
            x = cx.emit("expand", [x], {"size": cur[:ax + 1] + [r] + cur[ax + 1:]})
            x = cx.emit("reshape", [x], {"shape": cur[:ax] + [o] + cur[ax + 1:]})
    return x


@aten("upsample_linear1d.vec", "upsample_bilinear2d.vec", "upsample_trilinear3d.vec", "upsample_linear1d.default",
      "upsample_bilinear2d.default", "upsample_trilinear3d.default")
def _upsample_linear(cx, n, a):
    op = n.target.__name__.split(".")[0]
    d = int(op[-2])
    names = ("scales",) if d == 1 else ("scales_d", "scales_h", "scales_w")[-d:]      # the .default forms
    scales = a.get("scale_factors") or [a.get(k) for k in names]
    scales = None if all(s is None for s in scales) else [float(s) for s in scales]
    if scales is not None and len(scales) != d:
        raise Unmapped(f"{op} with scales {scales}")
    out = list(cx.meta_shape(n))
    return cx.emit(op, [a.get("input", a.get("self"))], {"output_size": out[-d:],
                                                         "align_corners": bool(a["align_corners"]),
                                                         "scales": scales})


@aten("glu.default")
def _glu(cx, n, a):
    """glu(x, dim) = first half * sigmoid(second half) along dim: two slices (views) and two pointwise ops."""
    x = a["self"]
    shape = list(cx.spec(x).shape)
    dim = int(a.get("dim", -1)) % len(shape)
    half = shape[dim] // 2
    first = cx.emit("slice", [x], {"dim": dim, "start": 0, "end": half, "step": 1})
    second = cx.emit("slice", [x], {"dim": dim, "start": half, "end": 2 * half, "step": 1})
    return cx.emit("mul", [first, cx.emit("sigmoid", [second])])


@aten("diagonal.default")
def _diagonal(cx, n, a):
    return cx.emit("diagonal", [a["self"]], {"offset": int(a.get("offset", 0)), "dim1": int(a.get("dim1", 0)),
                                             "dim2": int(a.get("dim2", 1))})


@aten("permute.default")
def _permute(cx, n, a):
    return cx.emit("permute", [a["self"]], {"dims": _ints(a["dims"])})


@aten("transpose.int", "swapaxes.default", "swapdims.default")
def _transpose(cx, n, a):
    d0 = a.get("dim0", a.get("axis0"))
    d1 = a.get("dim1", a.get("axis1"))
    return cx.emit("transpose", [a["self"]], {"dim0": int(d0), "dim1": int(d1)})


@aten("t.default", "numpy_T.default", "mT.default", "T.default")
def _t(cx, n, a):
    rank = len(cx.spec(a["self"]).shape)
    if rank < 2:
        return cx.alias(a["self"])
    if str(n.target).startswith("aten.mT"):
        dims = list(range(rank - 2)) + [rank - 1, rank - 2]
    else:
        dims = list(reversed(range(rank)))
    return cx.emit("permute", [a["self"]], {"dims": dims})


@aten("expand.default", "expand_as.default", "broadcast_to.default")
def _expand(cx, n, a):
    x = a["self"]
    if cx.spec(x).shape == cx.meta_shape(n):
        return cx.alias(x)
    return cx.emit("expand", [x], {"size": list(cx.meta_shape(n))})


@aten("broadcast_tensors.default")
def _broadcast_tensors(cx, n, a):
    outs = []
    for t, val in zip(a["tensors"], n.meta["val"]):
        shape = tuple(val.shape)
        outs.append(cx.alias(t) if cx.spec(t).shape == shape else cx.emit("expand", [t], {"size": list(shape)}))
    return outs


@aten("cat.default", "concat.default", "concatenate.default")
def _cat(cx, n, a):
    ts = [t for t in a["tensors"] if cx.spec(t).shape != (0,)]
    dt = cx.meta_dtype(n)
    return cx.emit("cat", [cx.cast_to(t, dt) for t in ts], {"dim": int(a["dim"])})


@aten("stack.default")
def _stack(cx, n, a):
    dim = int(a["dim"])
    parts = []
    for t in a["tensors"]:
        shape = list(cx.spec(t).shape)
        d = dim % (len(shape) + 1)
        parts.append(cx.emit("reshape", [t], {"shape": shape[:d] + [1] + shape[d:]}))
    return cx.emit("cat", parts, {"dim": dim})


def _slice(cx, x, dim, start, end, step=1):
    shape = cx.spec(x).shape
    dim = dim % len(shape)
    size = shape[dim]
    start = 0 if start is None else start
    end = size if end is None else end
    start = max(0, min(size, start + size if start < 0 else start))
    end = max(0, min(size, end + size if end < 0 else end))
    if start == 0 and end == size and step == 1:
        return cx.alias(x)
    return cx.emit("slice", [x], {"dim": dim, "start": start, "end": end, "step": int(step)})


@aten("slice.Tensor")
def _slice_t(cx, n, a):
    return _slice(cx, a["self"], int(a["dim"]), a["start"], a["end"], a["step"])


@aten("narrow.default")
def _narrow(cx, n, a):
    return _slice(cx, a["self"], int(a["dim"]), int(a["start"]), int(a["start"]) + int(a["length"]))


@aten("select.int")
def _select(cx, n, a):
    shape = cx.spec(a["self"]).shape
    dim = int(a["dim"]) % len(shape)
    i = int(a["index"]) % shape[dim]
    s = cx.emit("slice", [a["self"]], {"dim": dim, "start": i, "end": i + 1, "step": 1})
    return cx.emit("reshape", [s], {"shape": list(cx.meta_shape(n))})


@aten("split.Tensor", "split_with_sizes.default", "chunk.default", "unbind.int", "tensor_split.sections")
def _split(cx, n, a):
    x = a["self"]
    dim = int(a.get("dim", 0))
    outs, start = [], 0
    for val in n.meta["val"]:
        length = val.shape[dim] if val.dim() == len(cx.spec(x).shape) else 1
        piece = _slice(cx, x, dim, start, start + length)
        if tuple(val.shape) != cx.spec(piece).shape:
            piece = cx.emit("reshape", [piece], {"shape": list(val.shape)})
        outs.append(piece)
        start += length
    return outs


@aten("flip.default")
def _flip(cx, n, a):
    return cx.emit("flip", [a["self"]], {"dims": _ints(a["dims"])})


@aten("repeat.default")
def _repeat(cx, n, a):
    return cx.emit("repeat", [a["self"]], {"repeats": _ints(a["repeats"])})


@aten("triu.default", "tril.default")
def _tri(cx, n, a):
    return cx.emit(str(n.target).split(".")[1], [a["self"]], {"diagonal": int(a["diagonal"])})


# --- losses ----------------------------------------------------------------------------------
def _loss(lib: str, keys=(), inputs=("self", "target")):
    def conv(cx, n, a):
        attrs = {"reduction": _REDUCTION[int(a["reduction"])]}
        for k in keys:
            attrs[k] = a[k]
        return cx.emit(lib, [a[i] for i in inputs], attrs)
    return conv


aten("mse_loss.default")(_loss("mse_loss"))
aten("l1_loss.default")(_loss("l1_loss"))
aten("smooth_l1_loss.default")(_loss("smooth_l1_loss", ("beta",)))
aten("huber_loss.default")(_loss("huber_loss", ("delta",)))
aten("kl_div.default")(_loss("kl_div", ("log_target",)))
aten("hinge_embedding_loss.default")(_loss("hinge_embedding_loss", ("margin",)))
aten("soft_margin_loss.default")(_loss("soft_margin_loss"))
aten("binary_cross_entropy.default")(_loss("binary_cross_entropy", (), ("self", "target", "weight")))
aten("binary_cross_entropy_with_logits.default")(
    _loss("binary_cross_entropy_with_logits", (), ("self", "target", "weight", "pos_weight")))
aten("triplet_margin_loss.default")(
    _loss("triplet_margin_loss", ("margin", "p", "eps", "swap"), ("anchor", "positive", "negative")))
aten("margin_ranking_loss.default")(_loss("margin_ranking_loss", ("margin",), ("input1", "input2", "target")))
aten("cosine_embedding_loss.default")(_loss("cosine_embedding_loss", ("margin",), ("input1", "input2", "target")))


@aten("cross_entropy_loss.default")
def _cross_entropy(cx, n, a):
    return cx.emit("cross_entropy", [a["self"], a["target"], a["weight"]],
                   {"reduction": _REDUCTION[int(a["reduction"])], "ignore_index": int(a["ignore_index"]),
                    "label_smoothing": float(a["label_smoothing"])})


@aten("nll_loss.default", "nll_loss_nd.default")
def _nll(cx, n, a):
    return cx.emit("nll_loss", [a["self"], a["target"], a["weight"]],
                   {"reduction": _REDUCTION[int(a["reduction"])], "ignore_index": int(a["ignore_index"])})


@aten("cosine_similarity.default")
def _cos_sim(cx, n, a):
    return cx.emit("cosine_similarity", [a["x1"], a["x2"]], {"dim": int(a["dim"]), "eps": float(a["eps"])})


@aten("pairwise_distance.default")
def _pdist(cx, n, a):
    return cx.emit("pairwise_distance", [a["x1"], a["x2"]],
                   {"p": float(a["p"]), "eps": float(a["eps"]), "keepdim": bool(a["keepdim"])})


# --- gathers ---------------------------------------------------------------------------------
@aten("embedding.default")
def _embedding(cx, n, a):
    # padding_idx only changes gradients; the forward is a row gather either way
    return cx.emit("embedding", [a["indices"], a["weight"]])


@aten("gather.default")
def _gather(cx, n, a):
    return cx.emit("gather", [a["self"], a["index"]], {"dim": int(a["dim"])})


@aten("index_select.default")
def _index_select(cx, n, a):
    return cx.emit("index_select", [a["self"], a["index"]], {"dim": int(a["dim"])})


def _split_permute_merge(cx, n, x, split: list, dims: list):
    """x viewed as `split`, permuted by `dims`, viewed as torch's recorded output shape."""
    y = cx.emit("permute", [cx.emit("reshape", [x], {"shape": split})], {"dims": dims})
    return cx.emit("reshape", [y], {"shape": list(cx.meta_shape(n))})


@aten("pixel_shuffle.default", "pixel_unshuffle.default")
def _pixel_shuffle(cx, n, a):
    # shuffle:   [N, C*r*r, H, W] -> [N, C, r, r, H, W] -> [N, C, H, r, W, r] -> [N, C, H*r, W*r]
    # unshuffle: [N, C, H*r, W*r] -> [N, C, H, r, W, r] -> [N, C, r, r, H, W] -> [N, C*r*r, H, W]
    shape = cx.spec(a["self"]).shape
    if len(shape) != 4:
        raise Unmapped(f"{n.target} of a tensor that is not 4-D")
    nb, c, h, w = shape
    if "upscale_factor" in a:
        r = int(a["upscale_factor"])
        return _split_permute_merge(cx, n, a["self"], [nb, c // (r * r), r, r, h, w], [0, 1, 4, 2, 5, 3])
    r = int(a["downscale_factor"])
    return _split_permute_merge(cx, n, a["self"], [nb, c, h // r, r, w // r, r], [0, 1, 3, 5, 2, 4])


@aten("channel_shuffle.default", "native_channel_shuffle.default")
def _channel_shuffle(cx, n, a):
    # [N, g*k, ...] -> [N, g, k, ...] -> [N, k, g, ...] -> [N, k*g, ...]
    shape = list(cx.spec(a["self"]).shape)
    g = int(a["groups"])
    return _split_permute_merge(cx, n, a["self"], [shape[0], g, shape[1] // g, *shape[2:]],
                                [0, 2, 1, *range(3, len(shape) + 1)])


@aten("repeat_interleave.self_int")
def _repeat_interleave(cx, n, a):
    """Each element `repeats` times along dim: unsqueeze after it, expand, merge (as a nearest upsample)."""
    x, r, dim = a["self"], int(a["repeats"]), a.get("dim")
    if dim is None:
        raise Unmapped("repeat_interleave without dim (it flattens first)")
    shape = list(cx.spec(x).shape)
    d = int(dim) % len(shape)
    x = cx.emit("reshape", [x], {"shape": shape[:d + 1] + [1] + shape[d + 1:]})
    x = cx.emit("expand", [x], {"size": shape[:d + 1] + [r] + shape[d + 1:]})
    return cx.emit("reshape", [x], {"shape": shape[:d] + [shape[d] * r] + shape[d + 1:]})


@aten("one_hot.default")
def _one_hot(cx, n, a):
    """i[..., None] == arange(classes), as int64."""
    import numpy as np
    classes = cx.meta_shape(n)[-1]
    x = a["self"]
    col = cx.emit("reshape", [x], {"shape": list(cx.spec(x).shape) + [1]})
    hit = cx.emit("eq", [col, cx.constant("classes", np.arange(classes, dtype=np.int64), dtype="int64")])
    return cx.emit("cast", [hit], {"dtype": "int64"})


# --- recurrent nets --------------------------------------------------------------------------
def _recurrent(op: str, nonlinearity: str | None = None):
    """aten.lstm.input / gru.input / rnn_*.input: one library node over the sequence, the initial
    state(s) and the weights in torch.nn's order; (output, h_n[, c_n]) as aten returns them."""
    def conv(cx, n, a):
        if a["train"] and a["dropout"]:
            raise Unmapped(f"{op} with dropout in training mode (it draws random numbers)")
        states = list(a["hx"]) if op == "lstm" else [a["hx"]]
        hidden = cx.spec(states[-1]).shape[-1]
        attrs = {"hidden_size": hidden, "num_layers": int(a["num_layers"]), "bias": bool(a["has_biases"]),
                 "batch_first": bool(a["batch_first"]), "bidirectional": bool(a["bidirectional"])}
        if op == "lstm":
            out = cx.spec(states[0]).shape[-1]
            attrs["proj_size"] = out if out != hidden else 0
        if nonlinearity:
            attrs["nonlinearity"] = nonlinearity
        return cx.emit(op, [a["input"], *states, *a["params"]], attrs)
    return conv


aten("lstm.input")(_recurrent("lstm"))
aten("gru.input")(_recurrent("gru"))
aten("rnn_tanh.input")(_recurrent("rnn", "tanh"))
aten("rnn_relu.input")(_recurrent("rnn", "relu"))


# --- padding, rolls, windows, indexing ------------------------------------------------------
@aten("pad.default")
def _pad(cx, n, a):
    mode = a["mode"]
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise Unmapped(f"pad mode {mode!r}")
    attrs = {"pad": _ints(a["pad"]), "mode": mode}
    if mode == "constant":
        attrs["value"] = float(a["value"] or 0.0)
    return cx.emit("pad", [a["self"]], attrs)


@aten("constant_pad_nd.default")
def _constant_pad(cx, n, a):
    return cx.emit("pad", [a["self"]], {"pad": _ints(a["pad"]), "mode": "constant", "value": float(a["value"])})


@aten("roll.default")
def _roll(cx, n, a):
    dims = _ints(a["dims"])
    return cx.emit("roll", [a["self"]], {"shifts": _ints(a["shifts"]), "dims": dims or None})


@aten("unfold.default")
def _unfold(cx, n, a):
    """x.unfold(d, size, step) with step == size (non-overlapping windows, as patch embeddings take
    them): dimension d split into (D // size, size), the window dimension moved last."""
    x, size, step = a["self"], int(a["size"]), int(a["step"])
    if step != size:
        raise Unmapped("unfold with overlapping or gapped windows (step != size)")
    shape = list(cx.spec(x).shape)
    d = int(a["dimension"]) % max(len(shape), 1)
    count = shape[d] // size
    if count * size != shape[d]:
        x = _slice(cx, x, d, 0, count * size)
    x = cx.emit("reshape", [x], {"shape": shape[:d] + [count, size] + shape[d + 1:]})
    rank = len(shape) + 1
    return cx.emit("permute", [x], {"dims": [i for i in range(rank) if i != d + 1] + [d + 1]})


@aten("index.Tensor", "_unsafe_index.Tensor")
def _index(cx, n, a):
    """x[idx] along one dimension (a relative-position table read through its index buffer):
    index_select with the flattened indices, reshaped to x.shape[:k] + idx.shape + x.shape[k + 1:]."""
    idxs = list(a["indices"])
    while idxs and idxs[-1] is None:
        idxs.pop()
    if not idxs or any(i is None for i in idxs[:-1]):
        raise Unmapped("indexing with several index tensors")
    k, idx = len(idxs) - 1, idxs[-1]
    ispec = cx.spec(idx)
    if ispec.dtype not in ("int64", "int32"):
        raise Unmapped(f"indexing with a {ispec.dtype} index (a mask's result size depends on the data)")
    data = cx.program.data.get(cx.vid(idx))
    if data is not None and (data < 0).any():
        raise Unmapped("negative indices (index_select reads only non-negative ones)")
    flat = idx if ispec.rank == 1 else cx.emit("reshape", [idx], {"shape": [ispec.numel]})
    picked = cx.emit("index_select", [a["self"], flat], {"dim": k})
    shape = list(cx.meta_shape(n))
    return picked if list(cx.spec(picked).shape) == shape else cx.emit("reshape", [picked], {"shape": shape})


@aten("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(cx, n, a):
    """x.masked_fill(mask, value) = where(mask, value, x) (a causal mask's -inf fill)."""
    dt = cx.meta_dtype(n)
    value = a["value"]
    value = cx.cast_to(value, dt) if cx.is_tensor(value) else cx.tensor(value, dtype=dt)
    return cx.emit("where", [a["mask"], value, cx.cast_to(a["self"], dt)])


@aten("bitwise_not.default")
def _bitwise_not(cx, n, a):
    return cx.emit("logical_not" if cx.spec(a["self"]).dtype == "bool" else "bitwise_not", [a["self"]])
