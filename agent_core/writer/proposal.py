"""A model's reply -> the KernelSource our runtime launches, or Rejected("format") saying what to fix.

The reply holds prose, ONE fenced code block (```cuda; ```cpp, ```c++, ```c and ```cu are read the
same) with the whole source, and ONE fenced ```json block with the launch:
{"grid": [x, y, z], "block": [x, y, z], "shared_bytes": 0} (1-3 ints each, padded with 1;
shared_bytes may be left out for 0; a trailing // comment is ignored). The source defines
`extern "C" __global__ void NAME(...)` taking one pointer per region input, in order, then one per
output. Nothing else: a "stream" in the launch is a side-stream request, rejected by the stream check.
"""
from __future__ import annotations

import json
import re

from ..codegen.kernel import KernelSource
from .gate import Rejected, blank

CODE_LANGS = ("cuda", "cu", "cpp", "c++", "cxx", "c", "cuh")
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
MAX_SHARED = 227 << 10           # the H100 / H200 per-block opt-in limit
FORMAT_HINT = ("answer with one ```cuda block holding the whole source and one ```json block "
               "{\"grid\": [x, y, z], \"block\": [x, y, z], \"shared_bytes\": 0}")


def fenced_blocks(text: str) -> list[tuple[str, str | None]]:
    """(language, body) of every fenced block; body None when the reply ends inside the block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})\s*([\w+.-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        close = next((j for j in range(i + 1, len(lines))
                      if re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j])), None)
        if close is None:
            blocks.append((lang, None))
            break
        blocks.append((lang, "\n".join(lines[i + 1:close]) + "\n"))
        i = close + 1
    return blocks


def _kind(lang: str, body: str | None) -> str:
    if lang in CODE_LANGS:
        return "code"
    if lang in ("json", "jsonc", "json5"):
        return "json"
    if not lang and body is not None:   # an unlabelled block: say what it looks like
        return "json" if body.lstrip().startswith("{") else "code"
    return "other"


def _launch(body: str) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    text = blank(body, strings=False).strip()      # comments out, the JSON strings kept
    text = re.sub(r",\s*([}\]])", r"\1", text)      # a trailing comma
    try:
        spec = json.loads(text)
    except ValueError as exc:
        raise Rejected("format", f"the ```json launch block is not valid JSON ({exc.msg} at line {exc.lineno}); "
                                 f"{FORMAT_HINT}") from None
    if not isinstance(spec, dict):
        raise Rejected("format", f"the ```json launch block must be one object; {FORMAT_HINT}")
    extra = sorted(set(spec) - {"grid", "block", "shared_bytes"})
    if "stream" in extra:
        raise Rejected("stream", "the launch asks for a stream; a proposal runs on our stream, as we launch "
                                 "it: give only grid, block and shared_bytes")
    if extra:
        raise Rejected("format", f"the launch block has unknown key(s) {', '.join(map(repr, extra))}; only "
                                 f"\"grid\", \"block\" and \"shared_bytes\" are allowed")
    missing = [k for k in ("grid", "block") if k not in spec]
    if missing:
        raise Rejected("format", f"the launch block lacks {' and '.join(map(repr, missing))}; {FORMAT_HINT}")
    grid, block = _dims(spec["grid"], "grid", MAX_GRID), _dims(spec["block"], "block", MAX_BLOCK)
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS:
        raise Rejected("format", f"block {list(block)} is {threads} threads; at most {MAX_THREADS} per block")
    shared = spec.get("shared_bytes", 0)
    if not _is_int(shared) or not 0 <= shared <= MAX_SHARED:
        raise Rejected("format", f"shared_bytes must be an integer from 0 to {MAX_SHARED} (227 KiB), got "
                                 f"{shared!r}; it counts dynamic (extern __shared__) bytes only")
    return grid, block, shared


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _dims(value, what: str, limits) -> tuple[int, int, int]:
    dims = [value] if _is_int(value) else value
    if not isinstance(dims, list) or not 1 <= len(dims) <= 3 or not all(_is_int(d) for d in dims):
        raise Rejected("format", f"\"{what}\" must be a list of 1 to 3 integers, like [32, 1, 1]; got "
                                 f"{json.dumps(value)[:60]}")
    dims = dims + [1] * (3 - len(dims))
    for axis, (d, hi) in enumerate(zip(dims, limits)):
        if not 1 <= d <= hi:
            raise Rejected("format", f"\"{what}\" {'xyz'[axis]} = {d} is outside 1..{hi}")
    return tuple(dims)


def _params(code: str, start: int) -> list[str]:
    """The parameter list of the function whose '(' is at code[start]."""
    depth = 0
    for j in range(start, len(code)):
        depth += {"(": 1, ")": -1}.get(code[j], 0)
        if depth == 0:
            inner = code[start + 1:j].strip()
            return [p.strip() for p in inner.split(",")] if inner and inner != "void" else []
    raise Rejected("format", "the kernel's parameter list is not closed")


_ATTRS = re.compile(r"__(launch_bounds|cluster_dims|maxnreg)__\s*\([^)]*\)")


def _extern_c(code: str, pos: int) -> bool:
    """Whether the function whose name ends at pos is declared extern "C" (itself, or inside an
    extern "C" { ... } block that is still open there)."""
    head = code[max(code.rfind(";", 0, pos), code.rfind("}", 0, pos)) + 1:pos]
    if re.search(r"extern\s+\"C\"\s*(?!\{)", head):
        return True
    for m in re.finditer(r"extern\s+\"C\"\s*\{", code[:pos]):
        depth = 0
        for ch in code[m.end() - 1:pos]:
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                break
        if depth > 0:
            return True
    return False


def _entry(source: str, name: str, n_in: int, n_out: int) -> None:
    code = _ATTRS.sub(lambda m: " " * len(m.group()), blank(source, strings=False))
    kernels = [(m.group(1), m.end() - 1) for m in re.finditer(r"__global__\s+void\s+(\w+)\s*\(", code)]
    ours = [pos for k, pos in kernels if k == name]
    if not ours:
        named = ", ".join(sorted({k for k, _ in kernels})) or "none"
        raise Rejected("format", f"no `extern \"C\" __global__ void {name}(...)` in the source (its __global__ "
                                 f"functions: {named}); the entry point must be named {name}")
    pos = ours[-1]
    if not any(_extern_c(code, p) for p in ours):
        raise Rejected("format", f"{name} must be declared extern \"C\" (we look it up by that name)")
    params = _params(code, pos)
    want = n_in + n_out
    if len(params) != want:
        raise Rejected("format", f"{name} takes {len(params)} parameter(s); it must take exactly {want}: "
                                 f"{n_in} input pointer(s) then {n_out} output pointer(s), in the order given")
    for k, p in enumerate(params):
        if "*" not in p:
            raise Rejected("format", f"parameter {k + 1} of {name} (`{p}`) is not a pointer; every parameter is "
                                     f"a device pointer (inputs const T*, outputs T*)")
        if k >= n_in and re.match(r"(const\b|\w+\s+const\s*\*)", p):
            raise Rejected("format", f"parameter {k + 1} of {name} (`{p}`) is an output: it must not be const")


def parse_reply(text: str, *, name: str, inputs: list[str], outputs: list[str], node_ids: list[str],
                model: str, round: int) -> KernelSource:
    """The reply's kernel in our launch interface (module docstring); Rejected("format") otherwise."""
    blocks = fenced_blocks(text)
    if any(body is None for _, body in blocks):
        raise Rejected("format", "the reply ends inside a fenced block (cut off?): send the whole answer "
                                 "again, shorter if need be; " + FORMAT_HINT)
    kinds = [(_kind(lang, body), lang, body) for lang, body in blocks]
    for kind, lang, body in kinds:
        if kind == "other":
            if re.search(r"\b(torch|aten)\b", body, re.I):
                raise Rejected("torch", f"the reply holds a ```{lang} block using torch; a proposal is one CUDA "
                                        f"kernel and may not call torch")
            raise Rejected("format", f"the reply holds a ```{lang} block; {FORMAT_HINT}, nothing else")
    code = [body for kind, _, body in kinds if kind == "code"]
    launch = [body for kind, _, body in kinds if kind == "json"]
    if len(code) != 1:
        raise Rejected("format", f"the reply holds {len(code)} code blocks, want exactly 1 with the whole "
                                 f"source; {FORMAT_HINT}")
    if len(launch) != 1:
        raise Rejected("format", f"the reply holds {len(launch)} ```json launch blocks, want exactly 1; "
                                 f"{FORMAT_HINT}")
    source = code[0]
    _entry(source, name, len(inputs), len(outputs))
    grid, block, shared = _launch(launch[0])
    return KernelSource(name=name, kind="writer", source=source, node_ids=list(node_ids), inputs=list(inputs),
                        outputs=list(outputs), grid=grid, block=block, shared_bytes=shared,
                        schedule=f"model kernel ({model}, round {round})",
                        params={"model": model, "round": round}, workspace=[])
