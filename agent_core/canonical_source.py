"""A kernel's source up to the names in it, so structurally equal kernels compile once.

A model repeats its blocks: ResNet's bottlenecks, a Transformer's layers, an RNN cell unrolled over
time steps. Their regions generate the same CUDA except for the names, which come from the program
(the kernel is named after its region, its arguments and locals after values and nodes) and from
the comments. `canonical_form` strips comments and renames every identifier the source declares
itself to `_cN` (N in order of first appearance), so two such sources give the same text, and the
compiler (agent_core.compiler) compiles and caches that text once, loading the kernel by its
canonical symbol.

Why this cannot change what a kernel computes: a consistent renaming of identifiers that a
translation unit declares itself, to fresh names it does not use, is a no-op for the compiler
(only the entry symbol changes, which the caller is told). What this module cannot prove is that a
renamed identifier really is declared in the source (it finds declarations by the token before and
after a name); a wrongly renamed external name (a CUDA builtin, a member) is then undeclared and the
canonical compile fails, so the compiler compiles the source as written instead. Preprocessor lines
are left as they are, and every identifier they mention is kept everywhere.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# C++ and CUDA words that end a type in a declaration (`const float x`, `unsigned int n`,
# `__restrict__ p`): a name after one of these, or after another name, `*`, `&` or `>`, is declared
_TYPE_END_KEYWORDS = {"void", "bool", "char", "short", "int", "long", "float", "double", "unsigned",
                      "signed", "auto", "__restrict__", "typename", "class", "struct", "const",
                      "constexpr", "volatile"}
# words after which a name is used, not declared (`return x;`, `case k:`)
_NOT_TYPES = {"return", "case", "goto", "else", "do", "sizeof", "new", "delete", "throw", "using",
              "namespace", "operator", "template", "typedef", "if", "while", "for", "switch", "static_cast",
              "reinterpret_cast", "const_cast", "dynamic_cast", "decltype", "alignof", "co_return",
              "extern", "static", "inline", "__device__", "__global__", "__host__", "__forceinline__",
              "__noinline__", "__shared__", "__constant__", "__launch_bounds__", "__align__"}
_KEYWORDS = _TYPE_END_KEYWORDS | _NOT_TYPES | {"true", "false", "nullptr", "this", "break", "continue",
                                               "default", "public", "private", "protected", "virtual",
                                               "enum", "union", "register", "mutable", "noexcept"}
# comments, literals, numbers (preprocessing numbers: 1e-05f, 0x7f800000u), names and punctuation
_TOKEN = re.compile(r"""(?P<comment>//[^\n]*|/\*.*?\*/)
                      |(?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
                      |(?P<number>\.?\d(?:[eEpP][+-]|[\w.])*)
                      |(?P<name>[A-Za-z_]\w*)
                      |(?P<punct>[^\s\w])""", re.S | re.X)
_COMMENT = re.compile(r"""//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'""", re.S)
_CANONICAL = re.compile(r"_c\d+\Z")
_VECTOR_TYPE = re.compile(r"(u?char|u?short|u?int|u?long|u?longlong|float|double|half|bfloat16)[1-4]?\Z|\w+_t\Z")
_DECL_END = frozenset(("", "=", ";", ",", ")", "(", "[", "{", ":"))
_PTR_DECL_END = frozenset(("", "=", ";", ",", ")", "["))


@dataclass(frozen=True)
class CanonicalSource:
    text: str                # the source without comments, declared names renamed
    symbol: str              # the kernel's entry point's name in `text`
    renamed: int             # how many names were renamed


def _lines(source: str) -> list[tuple[str, list[tuple[str, str]], list[bool]]]:
    """(directive line or "", tokens, whether space precedes each token) per non-blank line,
    comments dropped."""
    text = _COMMENT.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0), source)
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        toks, end, gaps = [], None, []
        for m in _TOKEN.finditer(line):
            toks.append((m.lastgroup, m.group(0)))
            gaps.append(end is not None and m.start() > end)
            end = m.end()
        out.append((stripped if stripped.startswith("#") else "", toks, gaps))
    return out


def declared_names(lines, keep: set[str]) -> set[str]:
    """Names the source declares: variables, parameters, functions, typedefs, template parameters.

    A name is declared where it follows a type: another name (two names in a row only happen in a
    declaration, keywords such as `return` aside), or `*` / `&` after a known type (`float* p`;
    `a * b` is a product). Known types are the keywords, CUDA's vector types, `*_t` names, and what
    the source itself declares with typedef, typename, struct or class."""
    types = set(_TYPE_END_KEYWORDS)
    for _, toks, _ in lines:
        for i in range(1, len(toks)):
            if toks[i][0] == "name" and toks[i - 1][1] in ("typename", "class", "struct"):
                types.add(toks[i][1])
        if len(toks) > 2 and toks[0][1] == "typedef" and toks[-1][1] == ";" and toks[-2][0] == "name":
            types.add(toks[-2][1])
    out: set[str] = set()
    for _, toks, _ in lines:
        n = len(toks)
        for i in range(1, n):
            kind, text = toks[i]
            if kind != "name" or text in _KEYWORDS or text in keep or text in out:
                continue
            pk, prev = toks[i - 1]
            after = toks[i + 1][1] if i + 1 < n else ""
            if pk == "name":
                typed = prev not in _NOT_TYPES and after in _DECL_END
            elif prev in ("*", "&") and i >= 2:
                before = toks[i - 2][1]
                typed = after in _PTR_DECL_END and (before in types or before in ("*", "&") or
                                                    bool(_VECTOR_TYPE.match(before)))
            else:
                typed = False
            if typed:
                out.add(text)
    return out


@functools.lru_cache(maxsize=4096)   # the compiler and the shared-region signatures ask for each source
def canonical_form(source: str, entry: str) -> CanonicalSource | None:
    """The canonical text of `source` whose __global__ entry point is `entry`, or None when the
    source already uses a name of the canonical form (nothing could be renamed safely)."""
    lines = _lines(source)
    keep: set[str] = set()
    names: set[str] = set()
    for directive, toks, _ in lines:
        if directive:
            keep.update(t for k, t in toks if k == "name")
            continue
        for i, (kind, text) in enumerate(toks):
            if kind != "name":
                continue
            names.add(text)
            # a member's name (`threadIdx.x`, `p->next`) belongs to its class: never renamed
            if i and (toks[i - 1][1] == "." or (toks[i - 1][1] == ">" and i > 1 and toks[i - 2][1] == "-")):
                keep.add(text)
    if any(_CANONICAL.match(n) for n in names | keep):
        return None
    code = [ln for ln in lines if not ln[0]]
    declared = declared_names(code, keep)
    if entry in names and entry not in keep:
        declared.add(entry)    # it is defined here: the caller loads it by this name
    mapping: dict[str, str] = {}
    out = []
    for directive, toks, gaps in lines:
        if directive:
            out.append(directive)
            continue
        words = []
        for kind, text in toks:
            if kind == "name" and text in declared:
                text = mapping.get(text) or mapping.setdefault(text, f"_c{len(mapping)}")
            words.append(text)
        # each run of spaces becomes one, tokens that touched still touch (`a >> b` is not `a > > b`)
        out.append("".join(" " + w if gap else w for w, gap in zip(words, gaps)))
    return CanonicalSource("\n".join(out) + "\n", mapping.get(entry, entry), len(mapping))

