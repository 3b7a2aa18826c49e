"""Pointwise ops: unary activations and math, binary ops with broadcasting, ops with a scalar.

Each op carries `cuda`, a C expression over its inputs ({x}, {a}, {b}, {c}) and attributes, which code
generation renders (tinygrad's one-table-per-op approach), next to its torch reference.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from .common import broadcast, dtype_name, float_of, promote
from .registry import FLOAT_DTYPES, Attr, OpDef, TensorSpec, register

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _same(ins, attrs):
    return [TensorSpec(ins[0].shape, float_of(ins[0].dtype))]


def _same_dtype(ins, attrs):
    return [TensorSpec(ins[0].shape, ins[0].dtype)]


def _bcast(ins, attrs):
    present = [s for s in ins if s is not None]
    return [TensorSpec(broadcast(*(s.shape for s in present)), promote(*(s.dtype for s in present)))]


def _bcast_bool(ins, attrs):
    return [TensorSpec(broadcast(*(s.shape for s in ins)), "bool")]


# torch implements these activations for floating-point tensors only
_FLOAT_ONLY = {"gelu", "elu", "selu", "celu", "silu", "mish", "softplus", "hardsigmoid", "hardswish",
               "leaky_relu", "logsigmoid", "hardshrink", "softshrink", "frac"}
# and refuses bool tensors for these (arithmetic on bool is not defined)
_NO_BOOL = {"abs", "neg", "floor", "ceil", "round", "trunc", "relu", "relu6", "hardtanh", "softsign",
            "tanhshrink", "threshold", "sub_scalar", "rsub_scalar", "sign"}
# these keep an integer input's dtype (relu of int64 is int64)
_KEEP_INT = {"relu", "relu6", "hardtanh"}


def _checked(name, rule):
    def infer(ins, attrs):
        dt = ins[0].dtype
        if name in _FLOAT_ONLY and dt not in FLOAT_DTYPES:
            raise ShapeError(f"{name}: x must be a floating-point tensor, got {dt} (cast it first)")
        if name in _NO_BOOL and dt == "bool":
            raise ShapeError(f"{name}: x is a bool tensor, which torch does not accept here (cast it first)")
        return rule(ins, attrs)
    return infer


def _unary(name, ref, cuda, attrs=(), aliases=(), doc="", keep_dtype=False, flops=None):
    rule = _same_dtype if keep_dtype or name in _KEEP_INT else _same
    register(OpDef(name, "pointwise", ("x",), _checked(name, rule),
                   lambda t, a, _r=ref: _r(t[0], a), attrs=attrs, aliases=aliases, doc=doc,
                   cuda=cuda, flops=flops))


def _per_elem(k):
    return lambda ins, outs, attrs: k * sum(s.numel for s in outs)


# --- activations -----------------------------------------------------------------------------
_unary("relu", lambda x, a: torch.relu(x), "max_nan({x}, 0.0f)", doc="max(x, 0)")
_unary("leaky_relu", lambda x, a: F.leaky_relu(x, a["negative_slope"]),
       "({x} > 0.0f ? {x} : {x} * {negative_slope})", attrs=(Attr("negative_slope", "float", 0.01),))
_unary("gelu", lambda x, a: F.gelu(x, approximate=a["approximate"]),
       {"none": f"0.5f * {{x}} * (1.0f + erff({{x}} * {_INV_SQRT2!r}f))",
        "tanh": f"0.5f * {{x}} * (1.0f + tanhf({_SQRT_2_OVER_PI!r}f * ({{x}} + 0.044715f * {{x}} * {{x}} * {{x}})))"},
       attrs=(Attr("approximate", "str", "none", choices=("none", "tanh"),
                   doc="'none' is the exact erf form, 'tanh' the approximation"),),
       flops=_per_elem(8), doc="Gaussian error linear unit")
_unary("sigmoid", lambda x, a: torch.sigmoid(x), "1.0f / (1.0f + expf(-{x}))", flops=_per_elem(4))
_unary("tanh", lambda x, a: torch.tanh(x), "tanhf({x})", flops=_per_elem(4))
_unary("silu", lambda x, a: F.silu(x), "{x} / (1.0f + expf(-{x}))", aliases=("swish",), flops=_per_elem(4))
_unary("mish", lambda x, a: F.mish(x),
       "{x} * tanhf(({x} > 20.0f) ? {x} : log1pf(expf({x})))", flops=_per_elem(8))
_unary("softplus", lambda x, a: F.softplus(x, a["beta"], a["threshold"]),
       "(({x}) * {beta} > {threshold} ? ({x}) : log1pf(expf(({x}) * {beta})) / {beta})",
       attrs=(Attr("beta", "float", 1.0), Attr("threshold", "float", 20.0)), flops=_per_elem(4))
_unary("softsign", lambda x, a: F.softsign(x), "{x} / (1.0f + fabsf({x}))", flops=_per_elem(3))
_unary("elu", lambda x, a: F.elu(x, a["alpha"]), "({x} > 0.0f ? {x} : {alpha} * expm1f({x}))",
       attrs=(Attr("alpha", "float", 1.0),), flops=_per_elem(3))
_unary("selu", lambda x, a: F.selu(x),
       "1.0507009873554805f * ({x} > 0.0f ? {x} : 1.6732632423543772f * expm1f({x}))", flops=_per_elem(4))
_unary("celu", lambda x, a: F.celu(x, a["alpha"]),
       "max_nan({x}, 0.0f) + min_nan(0.0f, {alpha} * expm1f({x} / {alpha}))",
       attrs=(Attr("alpha", "float", 1.0),), flops=_per_elem(4))
_unary("hardtanh", lambda x, a: F.hardtanh(x, a["min_val"], a["max_val"]),
       "min_nan(max_nan({x}, {min_val}), {max_val})",
       attrs=(Attr("min_val", "float", -1.0), Attr("max_val", "float", 1.0)))
_unary("hardsigmoid", lambda x, a: F.hardsigmoid(x), "min_nan(max_nan({x} / 6.0f + 0.5f, 0.0f), 1.0f)",
       flops=_per_elem(3))
_unary("hardswish", lambda x, a: F.hardswish(x), "{x} * min_nan(max_nan({x} + 3.0f, 0.0f), 6.0f) / 6.0f",
       flops=_per_elem(4))
_unary("relu6", lambda x, a: F.relu6(x), "min_nan(max_nan({x}, 0.0f), 6.0f)")
_unary("logsigmoid", lambda x, a: F.logsigmoid(x), "min_nan({x}, 0.0f) - log1pf(expf(-fabsf({x})))",
       flops=_per_elem(4))
_unary("hardshrink", lambda x, a: F.hardshrink(x, a["lambd"]),
       "(fabsf({x}) > {lambd} ? {x} : 0.0f)", attrs=(Attr("lambd", "float", 0.5),))
_unary("softshrink", lambda x, a: F.softshrink(x, a["lambd"]),
       "({x} > {lambd} ? {x} - {lambd} : ({x} < -{lambd} ? {x} + {lambd} : 0.0f))",
       attrs=(Attr("lambd", "float", 0.5),))
_unary("tanhshrink", lambda x, a: F.tanhshrink(x), "{x} - tanhf({x})", flops=_per_elem(4))

# --- math ------------------------------------------------------------------------------------
_unary("exp", lambda x, a: torch.exp(x), "expf({x})")
_unary("exp2", lambda x, a: torch.exp2(x), "exp2f({x})")
_unary("expm1", lambda x, a: torch.expm1(x), "expm1f({x})")
_unary("log", lambda x, a: torch.log(x), "logf({x})")
_unary("log2", lambda x, a: torch.log2(x), "log2f({x})")
_unary("log1p", lambda x, a: torch.log1p(x), "log1pf({x})")
_unary("abs", lambda x, a: torch.abs(x), "fabsf({x})", keep_dtype=True)
_unary("neg", lambda x, a: torch.neg(x), "(-{x})", keep_dtype=True)
_unary("sqrt", lambda x, a: torch.sqrt(x), "sqrtf({x})")
_unary("rsqrt", lambda x, a: torch.rsqrt(x), "rsqrtf({x})")
_unary("reciprocal", lambda x, a: torch.reciprocal(x), "(1.0f / {x})")
register(OpDef("square", "pointwise", ("x",),
               lambda ins, a: [TensorSpec(ins[0].shape, "int64" if ins[0].dtype == "bool" else ins[0].dtype)],
               lambda t, a: torch.square(t[0]), cuda="({x} * {x})", doc="x * x (bool squares to int64, as in torch)"))
_unary("sin", lambda x, a: torch.sin(x), "sinf({x})")
_unary("cos", lambda x, a: torch.cos(x), "cosf({x})")
_unary("erf", lambda x, a: torch.erf(x), "erff({x})")
_unary("sign", lambda x, a: torch.sign(x), "(float)(({x} > 0.0f) - ({x} < 0.0f))", keep_dtype=True)
_unary("floor", lambda x, a: torch.floor(x), "floorf({x})", keep_dtype=True)
_unary("ceil", lambda x, a: torch.ceil(x), "ceilf({x})", keep_dtype=True)
_unary("round", lambda x, a: torch.round(x), "rintf({x})", keep_dtype=True)
_unary("frac", lambda x, a: torch.frac(x), "({x} - truncf({x}))", keep_dtype=True, doc="x - trunc(x)")
_unary("sinh", lambda x, a: torch.sinh(x), "sinhf({x})")
_unary("cosh", lambda x, a: torch.cosh(x), "coshf({x})")
_unary("asin", lambda x, a: torch.asin(x), "asinf({x})")
_unary("acos", lambda x, a: torch.acos(x), "acosf({x})")
_unary("erfc", lambda x, a: torch.erfc(x), "erfcf({x})")
_unary("erfinv", lambda x, a: torch.erfinv(x), "erfinvf({x})")
_unary("lgamma", lambda x, a: torch.lgamma(x), "lgammaf({x})")
_unary("sinc", lambda x, a: torch.sinc(x),
       "({x} == 0.0f ? 1.0f : sinf(3.14159265358979323846f * {x}) / (3.14159265358979323846f * {x}))",
       doc="sin(pi x) / (pi x), 1 at 0")


def _clamp_infer(ins, attrs):
    if attrs["min"] is None and attrs["max"] is None:
        raise ShapeError("clamp: give min, max or both (torch refuses a clamp with neither)")
    x = torch.empty((), dtype=_torch_dtype(ins[0].dtype))
    bounds = [b for b in (attrs["min"], attrs["max"]) if b is not None]
    dt = x.dtype
    for b in bounds:  # clamp(int64 tensor, min=0.5) is float32, like a tensor-number op
        dt = torch.promote_types(dt, torch.result_type(x, b))
    return [TensorSpec(ins[0].shape, dtype_name(dt))]


register(OpDef("clamp", "pointwise", ("x",), _clamp_infer, lambda t, a: torch.clamp(t[0], a["min"], a["max"]),
               attrs=(Attr("min", "scalar", None, optional=True), Attr("max", "scalar", None, optional=True)),
               aliases=("clip",), cuda="min_nan(max_nan({x}, {min}), {max})",
               doc="min(max(x, min), max); a missing bound is not applied",
               extra={"example": ([(3, 5)], {"min": -0.5}), "bad": ([(3, 5)], {}, "give min, max or both")}))
_unary("nan_to_num", lambda x, a: torch.nan_to_num(x, a["nan"], a["posinf"], a["neginf"]),
       "(({x} != {x}) ? {nan} : ({x} == INFINITY) ? {posinf} : ({x} == -INFINITY) ? {neginf} : {x})",
       keep_dtype=True, attrs=(Attr("nan", "float", 0.0), Attr("posinf", "float", 3.4028234663852886e38),
                               Attr("neginf", "float", -3.4028234663852886e38)),
       doc="NaN, +inf and -inf replaced by the given numbers (the importer writes torch's defaults for the "
           "input's dtype: 0 and its largest and lowest finite values)")
_unary("identity", lambda x, a: x, "{x}", keep_dtype=True, flops=_per_elem(0), doc="passes x through")
_unary("dropout", lambda x, a: x, "{x}", keep_dtype=True, flops=_per_elem(0),
       attrs=(Attr("p", "float", 0.5),), doc="dropout in eval mode: the identity")
register(OpDef("cast", "pointwise", ("x",),
               lambda ins, a: [TensorSpec(ins[0].shape, a["dtype"])],
               lambda t, a: t[0].to(_torch_dtype(a["dtype"])),
               attrs=(Attr("dtype", "str", "float32",
                           choices=("float32", "float64", "float16", "bfloat16", "int64", "int32", "bool")),),
               cuda="(({ctype}){x})", flops=_per_elem(0), aliases=("to",)))
register(OpDef("logical_not", "pointwise", ("x",), lambda ins, a: [TensorSpec(ins[0].shape, "bool")],
               lambda t, a: torch.logical_not(t[0]), cuda="(!{x})"))


def _signbit_infer(ins, attrs):
    if ins[0].dtype not in FLOAT_DTYPES:
        raise ShapeError(f"signbit: x must be a floating-point tensor, got {ins[0].dtype} (compare with 0 instead)")
    return [TensorSpec(ins[0].shape, "bool")]


register(OpDef("signbit", "pointwise", ("x",), _signbit_infer, lambda t, a: torch.signbit(t[0]),
               cuda="signbit({x})", doc="whether x's sign bit is set: true for -0.0 and for negative NaNs too"))


def _torch_dtype(name):
    from .common import torch_dtype
    return torch_dtype(name)


# --- with a scalar -----------------------------------------------------------------------------
def _scalar_infer(name):
    true_div = name in ("div_scalar", "rdiv_scalar")

    def infer(ins, attrs):
        dt = ins[0].dtype
        if name in _NO_BOOL and dt == "bool":
            raise ShapeError(f"{name}: x is a bool tensor, which torch does not accept here (cast it first)")
        # torch's promotion of a tensor with a Python number: int64 * 0.5 is float32, bool * 2 is int64
        out = dtype_name(torch.result_type(torch.empty((), dtype=_torch_dtype(dt)), attrs["value"]))
        return [TensorSpec(ins[0].shape, float_of(out) if true_div else out)]
    return infer


def _scalar(name, ref, cuda, aliases=(), doc=""):
    register(OpDef(name, "pointwise", ("x",), _scalar_infer(name), lambda t, a, _r=ref: _r(t[0], a["value"]),
                   attrs=(Attr("value", "scalar"),), aliases=aliases, doc=doc, cuda=cuda))


_scalar("add_scalar", lambda x, c: x + c, "({x} + {value})", doc="x + value")
_scalar("sub_scalar", lambda x, c: x - c, "({x} - {value})", doc="x - value")
_scalar("rsub_scalar", lambda x, c: c - x, "({value} - {x})", doc="value - x")
_scalar("mul_scalar", lambda x, c: x * c, "({x} * {value})", doc="x * value")
_scalar("div_scalar", lambda x, c: x / c, "({x} / {value})", doc="x / value")
_scalar("rdiv_scalar", lambda x, c: c / x, "({value} / {x})", doc="value / x")
_scalar("pow_scalar", lambda x, c: torch.pow(x, c), "powf({x}, {value})", doc="x ** value")
_scalar("rpow_scalar", lambda x, c: torch.pow(c, x), "powf({value}, {x})", doc="value ** x")
_scalar("max_scalar", lambda x, c: torch.clamp_min(x, c), "max_nan({x}, {value})", doc="max(x, value)")
_scalar("min_scalar", lambda x, c: torch.clamp_max(x, c), "min_nan({x}, {value})", doc="min(x, value)")


# --- binary with broadcasting --------------------------------------------------------------------
def _binary(name, ref, cuda, aliases=(), infer=_bcast, doc=""):
    register(OpDef(name, "pointwise", ("a", "b"), infer, lambda t, a, _r=ref: _r(t[0], t[1]),
                   aliases=aliases, doc=doc, cuda=cuda))


_binary("add", torch.add, "({a} + {b})")
def _sub_infer(ins, attrs):
    if any(x is not None and x.dtype == "bool" for x in ins):
        raise ShapeError("sub: torch does not subtract bool tensors (use logical_xor, or cast first)")
    return _bcast(ins, attrs)


_binary("sub", torch.sub, "({a} - {b})", aliases=("subtract",), infer=_sub_infer)
_binary("mul", torch.mul, "({a} * {b})", aliases=("multiply",))
def _true_div_infer(ins, attrs):  # true division: int64 / int64 is float32 in torch
    out = _bcast(ins, attrs)[0]
    return [TensorSpec(out.shape, float_of(out.dtype))]


_binary("div", torch.div, "({a} / {b})", aliases=("divide", "true_divide"), infer=_true_div_infer)
_binary("pow", torch.pow, "powf({a}, {b})")
_binary("maximum", torch.maximum, "max_nan({a}, {b})", aliases=("max_elementwise",))
_binary("minimum", torch.minimum, "min_nan({a}, {b})", aliases=("min_elementwise",))
_binary("gt", torch.gt, "({a} > {b})", infer=_bcast_bool)
_binary("ge", torch.ge, "({a} >= {b})", infer=_bcast_bool)
_binary("lt", torch.lt, "({a} < {b})", infer=_bcast_bool)
_binary("le", torch.le, "({a} <= {b})", infer=_bcast_bool)
_binary("eq", torch.eq, "({a} == {b})", infer=_bcast_bool)


def _where_infer(ins, attrs):
    cond, a, b = ins
    return [TensorSpec(broadcast(cond.shape, a.shape, b.shape), promote(a.dtype, b.dtype))]


register(OpDef("where", "pointwise", ("cond", "a", "b"), _where_infer,
               lambda t, a: torch.where(t[0].bool(), t[1], t[2]), cuda="({cond} ? {a} : {b})",
               doc="a where cond is true, else b"))
register(OpDef("addcmul", "pointwise", ("x", "a", "b"), _bcast,
               lambda t, a: torch.addcmul(t[0], t[1], t[2], value=a["value"]),
               attrs=(Attr("value", "scalar", 1.0),), cuda="({x} + {value} * {a} * {b})"))
def _lerp_infer(ins, attrs):
    if len({x.dtype for x in ins}) > 1 or ins[0].dtype not in FLOAT_DTYPES:
        raise ShapeError("lerp: x, end and weight must share one floating-point dtype, got "
                         + ", ".join(x.dtype for x in ins))
    return _bcast(ins, attrs)


register(OpDef("lerp", "pointwise", ("x", "end", "weight"), _lerp_infer,
               lambda t, a: torch.lerp(t[0], t[1], t[2]), cuda="({x} + {weight} * ({end} - {x}))"))


# --- comparisons and logic, masks, fills ---------------------------------------------------------
_binary("ne", torch.ne, "({a} != {b})", infer=_bcast_bool)
_binary("logical_and", torch.logical_and, "({a} && {b})", infer=_bcast_bool)
_binary("logical_or", torch.logical_or, "({a} || {b})", infer=_bcast_bool)
def _bitwise_infer(ins, attrs):
    if any(x.dtype in FLOAT_DTYPES for x in ins):
        raise ShapeError("bitwise ops take integer or bool tensors, got " + ", ".join(x.dtype for x in ins))
    return _bcast(ins, attrs)


# integer and bool tensors only: the expressions are their INT_CUDA forms too
_BITWISE = {"bitwise_and": ("({a} & {b})", torch.bitwise_and), "bitwise_or": ("({a} | {b})", torch.bitwise_or),
            "bitwise_xor": ("({a} ^ {b})", torch.bitwise_xor)}
_INTS = ((3, 5), "int64")
for _name, (_expr, _ref) in _BITWISE.items():
    register(OpDef(_name, "pointwise", ("a", "b"), _bitwise_infer, lambda t, a, _r=_ref: _r(t[0], t[1]),
                   cuda=_expr, doc=f"{_expr[1:-1].format(a='a', b='b')} of integer or bool tensors",
                   extra={"example": ([_INTS, ((5,), "int64")], {}),
                          "bad": ([(3, 5), (3, 5)], {}, "integer or bool")}))
# torch's floor division of integers (//): C's / rounds toward zero, so a quotient with a remainder
# of the other sign steps down once; floats keep div then floor (the importer's spelling)
_FLOOR_DIV = "({a} / {b} - ({a} % {b} != 0 && (({a} % {b} < 0) != ({b} < 0))))"
register(OpDef("floor_divide", "pointwise", ("a", "b"), _bitwise_infer,
               lambda t, a: torch.div(t[0], t[1], rounding_mode="floor"), cuda=_FLOOR_DIV,
               doc="a // b of integer tensors, rounded toward -inf as torch and Python do",
               extra={"example": ([_INTS, (((5,), "int64", {"kind": "randint", "low": 1, "high": 9}))], {}),
                      "bad": ([(3, 5), (3, 5)], {}, "integer or bool")}))


def _bitwise_not_infer(ins, attrs):
    if ins[0].dtype == "bool":      # ~ of a C bool is -2 or -1: both true
        raise ShapeError("bitwise_not: x is a bool tensor; use logical_not")
    return _bitwise_infer(ins, attrs)


register(OpDef("bitwise_not", "pointwise", ("x",), _bitwise_not_infer, lambda t, a: torch.bitwise_not(t[0]),
               cuda="(~{x})", doc="~x of an integer tensor (logical_not is a bool's)",
               extra={"example": ([_INTS], {}), "bad": ([(3, 5)], {}, "integer or bool")}))
_binary("remainder", torch.remainder, "remainder_f({a}, {b})",
        doc="Python's % (the sign of b): fmod(a, b), plus b where that has a's sign instead, as torch computes it")
_binary("fmod", torch.fmod, "fmodf({a}, {b})", doc="C's fmod: the sign of a")
_binary("hypot", torch.hypot, "hypotf({a}, {b})")
_binary("logaddexp", torch.logaddexp,
        "(({a} != {a} || {b} != {b}) ? NAN : fmaxf({a}, {b}) == -INFINITY ? -INFINITY : "
        "fmaxf({a}, {b}) + log1pf(expf(-fabsf({a} - {b}))))",
        doc="log(exp(a) + exp(b)), from the larger: max + log1p(exp(-|a - b|)); -inf where both are")
_binary("atan2", torch.atan2, "atan2f({a}, {b})")
_unary("tan", lambda x, a: torch.tan(x), "tanf({x})")
_unary("atan", lambda x, a: torch.atan(x), "atanf({x})")
_unary("log10", lambda x, a: torch.log10(x), "log10f({x})")
_unary("trunc", lambda x, a: torch.trunc(x), "truncf({x})", keep_dtype=True)
_unary("threshold", lambda x, a: F.threshold(x, a["threshold"], a["value"]),
       "({x} <= {threshold} ? {value} : {x})", keep_dtype=True,
       attrs=(Attr("threshold", "float"), Attr("value", "float")),
       doc="value where x <= threshold, else x (NaN stays NaN, as in torch)")


def _masked_fill_infer(ins, attrs):
    x, mask = ins
    if broadcast(x.shape, mask.shape) != x.shape:
        raise ShapeError(f"masked_fill: mask {list(mask.shape)} must broadcast to x {list(x.shape)}")
    return [TensorSpec(x.shape, x.dtype)]


register(OpDef("masked_fill", "pointwise", ("x", "mask"), _masked_fill_infer,
               lambda t, a: t[0].masked_fill(t[1].bool(), a["value"]), attrs=(Attr("value", "scalar"),),
               cuda="({mask} ? {value} : {x})", doc="value where mask is true, else x",
               extra={"example": ([(3, 5), ((5,), "bool")], {"value": -1.5}),
                      "bad": ([(5,), ((3, 5), "bool")], {"value": 0}, "must broadcast to x")}))


def _fill_infer(ins, attrs):
    return [TensorSpec(ins[0].shape, attrs["dtype"] or ins[0].dtype)]


_FILL_DTYPE = Attr("dtype", "str", None, optional=True,
                   choices=("float32", "float64", "float16", "bfloat16", "int64", "int32", "bool"),
                   doc="null: x's dtype")
for _name, _fill in (("zeros_like", 0), ("ones_like", 1)):
    register(OpDef(_name, "pointwise", ("x",), _fill_infer,
                   lambda t, a, _v=_fill: torch.full_like(t[0], _v, dtype=_dtype_or_none(a["dtype"])),
                   attrs=(_FILL_DTYPE,), cuda=f"{_fill}", flops=_per_elem(0),
                   doc=f"a tensor of {_fill}s with x's shape (x's values are not read)"))
register(OpDef("full_like", "pointwise", ("x",), _fill_infer,
               lambda t, a: torch.full_like(t[0], a["fill_value"], dtype=_dtype_or_none(a["dtype"])),
               attrs=(Attr("fill_value", "scalar"), _FILL_DTYPE), cuda="{fill_value}", flops=_per_elem(0),
               doc="a tensor of fill_value with x's shape (x's values are not read)"))


def _dtype_or_none(name):
    return None if name is None else _torch_dtype(name)


# --- integer and bool forms ------------------------------------------------------------------------
# Code generation computes an op in int64 / int32 / uint8 / int8 / bool when torch does (its output, or
# for a comparison its promoted operands, has that dtype). These ops' `cuda` expressions hold for any C
# arithmetic type once the operands are converted to it (literals are rendered in that type):
TYPE_GENERIC = frozenset({
    "add", "sub", "mul", "maximum", "minimum", "gt", "ge", "lt", "le", "eq", "ne", "where", "masked_fill",
    "neg", "identity", "dropout", "square", "clamp", "addcmul", "zeros_like", "ones_like", "full_like",
    "add_scalar", "sub_scalar", "rsub_scalar", "mul_scalar", "max_scalar", "min_scalar",
})
# these need their own integer expression (the float one calls float functions or holds float literals);
# an op in neither set is refused on integer inputs rather than computed through float
INT_CUDA = {
    "abs": "({x} < 0 ? -{x} : {x})",
    "sign": "(({x} > 0) - ({x} < 0))",
    "relu": "({x} > 0 ? {x} : 0)",
    "relu6": "({x} < 0 ? 0 : ({x} > 6 ? 6 : {x}))",
    "floor": "{x}", "ceil": "{x}", "round": "{x}", "trunc": "{x}",   # an integer is already whole
    "fmod": "({a} % {b})",                                            # C's %: the sign of a, as fmod
    # Python's %: the sign of b
    "remainder": "({a} % {b} != 0 && (({a} % {b} < 0) != ({b} < 0)) ? {a} % {b} + {b} : {a} % {b})",
    **{name: expr for name, (expr, _) in _BITWISE.items()}, "bitwise_not": "(~{x})",
    "floor_divide": _FLOOR_DIV,
}
# and for unsigned integers (uint8), where a test against zero is always false (nvcc warns #186)
UINT_CUDA = {
    **INT_CUDA,
    "abs": "{x}",
    "sign": "({x} > 0)",
    "relu": "{x}",
    "relu6": "({x} > 6 ? 6 : {x})",
    "remainder": "({a} % {b})",
    "floor_divide": "({a} / {b})",
}
