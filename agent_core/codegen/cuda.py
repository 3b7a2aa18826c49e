"""The CUDA C++ language layer: types, literals, names, and one op table rendered into SSA lines.

Like tinygrad's renderer, a pointwise op is one C expression (the `cuda` template each op carries in
agent_core/ops); a region's per-element body is those expressions rendered in topological order.
"""
from __future__ import annotations

import keyword
import math
import re

from ..errors import ShapeError
from ..ir import Node, Program
from .kernel import CodegenError

# The dtypes a generated kernel computes in, each loaded and stored with its own C type (bools travel
# as bytes). float64 and the half types are refused rather than computed in float32: that would change
# the program's precision.
C_TYPES = {"float32": "float", "bool": "bool", "int64": "long long", "int32": "int", "uint8": "unsigned char",
           "int8": "signed char"}
INT_DTYPES = ("int64", "int32", "uint8", "int8")
# 4 lanes of each dtype in one access: 16 bytes for float32 / int32, two 16-byte halves for int64, 4
# bytes for the byte types. Lanes are .x .y .z .w of the element's own C type.
VEC4 = {"float32": "float4", "int32": "int4", "int64": "vec4_i64", "uint8": "uchar4", "int8": "char4",
        "bool": "vec4_bool"}
VEC4_STRUCTS = {
    "vec4_i64": "struct __align__(16) vec4_i64 { long long x, y, z, w; };  // 4 int64 lanes, two 16-byte halves",
    "vec4_bool": "struct __align__(4) vec4_bool { bool x, y, z, w; };  // 4 bool lanes, one 4-byte access",
}
_INT_LIMITS = {"int64": (-2**63, 2**63 - 1), "int32": (-2**31, 2**31 - 1), "uint8": (0, 255), "int8": (-128, 127)}

# Words a generated identifier may not take: C++ keywords, CUDA built-ins and the kernel's own locals.
RESERVED = set("""
auto bool break case char const constexpr continue default do double else enum extern false float for
goto if inline int long register restrict return short signed sizeof static struct switch true typedef
union unsigned void volatile while float4 int4 uchar4 char4 vec4_i64 vec4_bool threadIdx blockIdx blockDim gridDim warpSize min max
index_t idx vec stride first row col lane tid k e i j n v s m out in x4 acc smem
""".split())


def c_type(dtype: str, what: str) -> str:
    try:
        return C_TYPES[dtype]
    except KeyError:
        raise CodegenError(f"{what} has dtype {dtype}; generated kernels compute in float32, int64, int32, "
                           f"uint8, int8 and bool, not in {dtype} (the region runs unfused)") from None


def float_literal(value) -> str:
    """A float32 literal: 0.01f, 2.0f, (-0.5f), INFINITY. Negatives are parenthesised so a template's
    `-{lambd}` never becomes `--0.5f`."""
    v = float(value)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    text = repr(v)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text}f)" if v < 0 else f"{text}f"


def int_literal(value: int, dtype: str) -> str:
    """An integer literal of dtype's C type: 7LL, (-100LL), ((unsigned char)3); the most negative
    int64 is written as an expression (its magnitude has no literal)."""
    v = int(value)
    if dtype == "int64":
        text = "(-9223372036854775807LL - 1)" if v == -2**63 else f"{v}LL"
    elif dtype == "int32":
        text = "(-2147483647 - 1)" if v == -2**31 else str(v)
    else:
        return f"(({C_TYPES[dtype]}){v})"
    return f"({text})" if v < 0 and not text.startswith("(") else text


def attr_literal(name: str, value, dtype: str = "float32") -> str:
    """An attribute as a literal of the dtype the op computes in (torch converts a Python number to the
    tensor's dtype: masked_fill(int64, -100) fills -100, never -100.0f)."""
    lower = name in ("min", "min_val", "low")
    if dtype in INT_DTYPES:
        if value is None:  # clamp's open ends: the type's own limits
            return int_literal(_INT_LIMITS[dtype][0 if lower else 1], dtype)
        if isinstance(value, (bool, int, float)) and not (isinstance(value, float) and not math.isfinite(value)):
            return int_literal(int(value), dtype)
        raise CodegenError(f"attribute {name}={value!r} has no {dtype} literal")
    if dtype == "bool" and isinstance(value, (bool, int, float)):
        return "true" if value else "false"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:  # clamp's open ends
        return "(-INFINITY)" if lower else "INFINITY"
    if isinstance(value, (int, float)):
        return float_literal(value)
    raise CodegenError(f"attribute {name}={value!r} has no C literal")


_CALLED = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def _template_functions() -> set[str]:
    """The functions the op library's CUDA expressions call (signbit, hypotf, ...): a value named after
    one would hide it."""
    from ..ops import REGISTRY      # the package: importing it registers every op
    out = set()
    for opdef in REGISTRY.values():
        forms = opdef.cuda.values() if isinstance(opdef.cuda, dict) else [opdef.cuda]
        out.update(name for form in forms if isinstance(form, str) for name in _CALLED.findall(form))
    return out


class Names:
    """Unique C identifiers derived from value and node names (readable, never colliding with a C
    keyword, the kernel's own names or a function an op's expression calls)."""
    _functions: set[str] | None = None

    def __init__(self):
        if Names._functions is None:
            Names._functions = _template_functions()
        self.taken = RESERVED | Names._functions

    def new(self, base: str) -> str:
        ident = re.sub(r"\W", "_", base).strip("_") or "v"
        if ident[0].isdigit():
            ident = "v" + ident
        if keyword.iskeyword(ident):
            ident += "_"
        cand, k = ident, 1
        while cand in self.taken:
            cand, k = f"{ident}_{k}", k + 1
        self.taken.add(cand)
        return cand


# int indexing while every offset stays clear of 2^31 (with a margin for the vector and window
# arithmetic around it); 64-bit otherwise
INT_INDEX_LIMIT = 2**31 - 2**20
MAX_GRID_X = 2**31 - 1     # gridDim.x's limit: a grid that covers all its work stops there


def index_type(extent: int) -> str:
    """The C type of a kernel's index_t for tensors of up to `extent` elements."""
    return "int" if extent < INT_INDEX_LIMIT else "long long"


def kernel_name(name: str) -> str:
    ident = re.sub(r"\W", "_", name).strip("_") or "region"
    return ident if not ident[0].isdigit() else "region_" + ident


_COMPARISONS = {"gt", "ge", "lt", "le", "eq", "ne"}
_UNCONVERTED = {"cast", "logical_and", "logical_or", "logical_not", "signbit"}   # read their inputs as they are
_CONDITIONS = {("where", 0), ("masked_fill", 1)}                      # (op, port): a truth value, as is


def compute_dtype(program: Program, node: Node) -> str:
    """The dtype a pointwise node computes in, as torch does: a comparison in the promoted type of its
    operands (torch.result_type, so a 0-dim operand does not widen a tensor of its own kind: int64 labels
    == -100 compare as int64, never through float), everything else in its output's dtype (an int64 mask
    times a float32 tensor is float32: the mask is converted, then multiplied)."""
    out = program.values[node.outputs[0]].dtype
    if node.op not in _COMPARISONS:
        return out
    from ..ops.common import dtype_name, torch_dtype
    import torch
    dummies = [torch.empty([0] if program.values[v].shape else [], dtype=torch_dtype(program.values[v].dtype))
               for v in node.inputs if v is not None]
    promoted = torch.result_type(*dummies)
    try:
        return dtype_name(promoted)
    except ShapeError:   # uint8 against int8 compares in int16, which no kernel here computes in
        raise CodegenError(f"{node.name or node.id} ({node.op}) compares in {promoted}, which generated "
                           "kernels do not compute in", node.id) from None


def convert(arg: str, dtype: str, to: str) -> str:
    """arg (of dtype) as a value of dtype `to`: unchanged when they match, else a C conversion (C's
    rules are torch's here: int -> float rounds to nearest, float -> int truncates, != 0 -> true)."""
    return arg if dtype == to else f"(({C_TYPES[to]}){arg})"


def div_reciprocal(value):
    """The float32 reciprocal torch's CUDA `tensor / number` multiplies by (BinaryDivTrueKernel.cu turns
    a CPU-scalar divisor into a * inv_b): measured on the H200 with torch 2.11, inv_b is 1 / the number
    in double, rounded once to float32 (for ln 10 that is one ulp from 1 / float32(ln 10)). 1 / 0 is
    inf with the zero's sign, as there."""
    import math

    import numpy as np
    value = float(value)
    if value == 0.0:
        return np.float32(math.copysign(math.inf, value))
    with np.errstate(all="ignore"):
        return np.float32(1.0 / value)


def render_pointwise(node: Node, args: list[str], program: Program | None = None) -> str:
    """The C expression of one pointwise node over the SSA names of its inputs. With the program, each
    input is first converted to the dtype the node computes in (`compute_dtype`), and an integer or
    bool computation takes the op's integer form (ops.pointwise.INT_CUDA); without it (generators that
    take float32 only) the expression is the float one over the arguments as given."""
    from ..ops.pointwise import INT_CUDA, TYPE_GENERIC, UINT_CUDA
    opdef = node.opdef
    template = opdef.cuda
    if template is None:
        raise CodegenError(f"{node.name} ({node.op}) has no CUDA expression", node_id=node.id)
    dtype = "float32"
    if program is not None:
        dtype = compute_dtype(program, node)
        c_type(dtype, f"{node.name} ({node.op})")
        present = [v for v in node.inputs if v is not None]
        if node.op not in _UNCONVERTED:
            args = [a if (node.op, port) in _CONDITIONS else convert(a, program.values[v].dtype, dtype)
                    for port, (a, v) in enumerate(zip(args, present))]
        if dtype != "float32" and node.op not in _UNCONVERTED:
            forms = UINT_CUDA if dtype == "uint8" else INT_CUDA
            if node.op in forms:
                template = forms[node.op]
            elif node.op not in TYPE_GENERIC:
                raise CodegenError(f"{node.name} ({node.op}) on {dtype} has no integer CUDA form; cast its "
                                   f"input to float32 first (the region runs unfused)", node_id=node.id)
    if isinstance(template, dict):  # chosen by a string attribute, e.g. gelu's approximate
        key = next((v for v in node.attrs.values() if isinstance(v, str) and v in template), None)
        if key is None:
            raise CodegenError(f"{node.name} ({node.op}): no CUDA form for attributes {node.attrs}",
                               node_id=node.id)
        template = template[key]
    fields = {}
    for a in opdef.attrs:
        if a.kind == "str":
            fields[a.name] = node.attrs.get(a.name)
        else:
            fields[a.name] = attr_literal(a.name, node.attrs.get(a.name), dtype)
    if node.op == "cast":
        fields["ctype"] = c_type(node.attrs["dtype"], f"{node.name} (cast)")
    if node.op == "div_scalar" and dtype == "float32" and isinstance(node.attrs.get("value"), (int, float)):
        # torch's CUDA kernel multiplies by the float32 reciprocal (div_reciprocal): the same bits,
        # and a multiply instead of an IEEE division (about 10 instructions an element)
        template = "({x} * {inv_value})"
        fields["inv_value"] = float_literal(float(str(div_reciprocal(node.attrs["value"]))))
    for port, arg in zip(opdef.port_names, args):
        fields[port] = arg
    try:
        return template.format(**fields)
    except (KeyError, IndexError) as exc:
        raise CodegenError(f"{node.name} ({node.op}): CUDA template needs {exc}", node_id=node.id) from None


def describe_node(program: Program, nid: str) -> str:
    """One header-comment line: id, name, op(args) and output spec."""
    n = program.nodes[nid]
    args = ", ".join(program.values[v].name if v else "-" for v in n.inputs)
    attrs = ", ".join(f"{k}={v}" for k, v in n.attrs.items())
    outs = ", ".join(str(program.values[v].spec) for v in n.outputs)
    call = f"{n.op}({args}{', ' if args and attrs else ''}{attrs})"
    return f"{n.id:<5} {n.name:<16} {call} -> {outs}"


# NVRTC compiles without the C headers, so the math macros the op templates use are defined here.
PRELUDE = """#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
// max / min that keep a NaN operand, as torch does (fmaxf / fminf return the other operand); one
// template, so integer maximum / clamp compare exactly in their own type
template <typename T> __device__ __forceinline__ T max_nan(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T min_nan(T a, T b) { return (a < b || a != a) ? a : b; }
// torch's remainder of floats: fmod moved to b's sign, exact (a - floor(a / b) * b is not, for a large a / b)
__device__ __forceinline__ float remainder_f(float a, float b) {
  const float m = fmodf(a, b);
  return (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) ? m + b : m;
}
"""


def kernel_source(head: str, consts: list[str], helpers: list[str], kname: str, cparams: list[str],
                  body: list[str]) -> str:
    """A kernel file: the header, the constants, the device helpers, then the extern "C" kernel
    (launch-bounded by kBlock) around body."""
    return "\n".join([head, *consts, "", *helpers,
                      f'extern "C" __global__ void __launch_bounds__(kBlock)\n{kname}({", ".join(cparams)}) {{',
                      *body, "}", ""])


def header(program: Program, title: str, node_ids: list[str], lines: list[str]) -> str:
    out = [f"// {title}", "// Generated by StitchCUDA; specialised for the shapes below.", "// Fused ops:"]
    out += [f"//   {describe_node(program, nid)}" for nid in node_ids]
    out += [f"// {line}" if line else "//" for line in lines]
    return "\n".join(out) + "\n\n" + PRELUDE


_COMMENT = re.compile(r"//[^\n]*")
_CONST_LINE = re.compile(r"^(\s*constexpr\s+[A-Za-z_][\w ]*?\s+)(k\w+\s*=.*?);(\s*//.*)?$")
_HELPER = re.compile(r"^(?:template\s*<[^>]*>\s*)?__device__\s[^;{(]*?\b(\w+)\s*\([^;{]*\)[^;{]*\{", re.M)


def _uses(code: str, name: str) -> int:
    return len(re.findall(rf"\b{re.escape(name)}\b", code))


def _helper_span(source: str, m: re.Match) -> tuple[int, int]:
    """The definition's text from its first character to the end of its line after the closing brace."""
    depth, i = 0, m.end() - 1
    while True:
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            break
        i += 1
    end = source.find("\n", i)
    return m.start(), (len(source) if end < 0 else end + 1)


def prune_unused(source: str) -> str:
    """Drop the named constants (`constexpr ... kName = ...`) and `__device__` helper functions that
    nothing else in the kernel names, until none is left: the generators emit a fixed preamble per
    schedule and not every kernel needs all of it. Only unreferenced declarations go, so the kernel
    computes exactly what it did (nvcc warns #177 on each one otherwise)."""
    while True:
        code = _COMMENT.sub("", source)
        changed = False
        for m in _HELPER.finditer(source):
            a, b = _helper_span(source, m)
            if _uses(code, m.group(1)) == _uses(_COMMENT.sub("", source[a:b]), m.group(1)):
                source = source[:a] + source[b:]
                changed = True
                break
        if changed:
            continue
        lines = source.split("\n")
        for i, line in enumerate(lines):
            cm = _CONST_LINE.match(line)
            if not cm:
                continue
            decls = [d.strip() for d in cm.group(2).split(",")]
            keep = [d for d in decls if _uses(code, d.split("=")[0].strip()) > 1]
            if len(keep) != len(decls):
                lines[i] = (f"{cm.group(1)}{', '.join(keep)};{cm.group(3) or ''}" if keep else None)
                changed = True
        source = "\n".join(line for line in lines if line is not None)
        if not changed:
            return source
