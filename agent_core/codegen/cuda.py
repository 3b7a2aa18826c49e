"""The CUDA C++ language layer: types, literals, names, and one op table rendered into SSA lines.

Like tinygrad's renderer, a pointwise op is one C expression (the `cuda` template each op carries in
agent_core/ops); a region's per-element body is those expressions rendered in topological order.
"""
from __future__ import annotations

import keyword
import math
import re

from ..ir import Node, Program
from .kernel import CodegenError

C_TYPES = {"float32": "float", "bool": "bool"}

# Words a generated identifier may not take: C++ keywords, CUDA built-ins and the kernel's own locals.
RESERVED = set("""
auto bool break case char const constexpr continue default do double else enum extern false float for
goto if inline int long register restrict return short signed sizeof static struct switch true typedef
union unsigned void volatile while float4 int4 threadIdx blockIdx blockDim gridDim warpSize min max
index_t idx vec stride first row col lane tid k e i j n v s m out in x4 acc smem
""".split())


def c_type(dtype: str, what: str) -> str:
    try:
        return C_TYPES[dtype]
    except KeyError:
        raise CodegenError(f"{what} has dtype {dtype}; code generation handles float32 and bool so far "
                           f"(the region runs unfused)") from None


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


def attr_literal(name: str, value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:  # clamp's open ends
        return "(-INFINITY)" if name in ("min", "min_val", "low") else "INFINITY"
    if isinstance(value, (int, float)):
        return float_literal(value)
    raise CodegenError(f"attribute {name}={value!r} has no C literal")


class Names:
    """Unique C identifiers derived from value and node names (readable, never colliding)."""

    def __init__(self):
        self.taken = set(RESERVED)

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


def index_type(extent: int) -> str:
    """The C type of a kernel's index_t for tensors of up to `extent` elements."""
    return "int" if extent < INT_INDEX_LIMIT else "long long"


def kernel_name(name: str) -> str:
    ident = re.sub(r"\W", "_", name).strip("_") or "region"
    return ident if not ident[0].isdigit() else "region_" + ident


def render_pointwise(node: Node, args: list[str]) -> str:
    """The C expression of one pointwise node over the SSA names of its inputs."""
    opdef = node.opdef
    template = opdef.cuda
    if template is None:
        raise CodegenError(f"{node.name} ({node.op}) has no CUDA expression", node_id=node.id)
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
            fields[a.name] = attr_literal(a.name, node.attrs.get(a.name))
    if node.op == "cast":
        fields["ctype"] = c_type(node.attrs["dtype"], f"{node.name} (cast)")
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
// max / min that keep a NaN operand, as torch does (fmaxf / fminf return the other operand)
__device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float min_nan(float a, float b) { return (a < b || a != a) ? a : b; }
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
