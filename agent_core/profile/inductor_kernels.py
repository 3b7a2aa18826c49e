"""How many kernels Inductor runs for a compiled function, read from the output code it wrote.

Inductor writes one Python wrapper module per compiled graph. It defines each kernel it generated once,
`triton_poi_fused_add_0 = async_compile.triton('triton_poi_fused_add_0', '''...''')` (on the CPU C++:
`cpp_fused_add_0 = async_compile.cpp_pybinding([...], r'''...''')`), and launches it from `call()`:
`triton_poi_fused_add_0.run(...)`, or `cpp_fused_add_0(...)`. Library calls it did not generate are
`extern_kernels.mm(...)` and fallbacks `torch.ops.aten.<op>.<overload>(...)`. Both are counted per run
of the forward (launches, not definitions: Inductor reuses one definition for identical loops), the
same way our own `launches` count every kernel a run starts.
"""
from __future__ import annotations

import re

_DEFINITION = re.compile(r"^(\w+) = async_compile\.\w+\(", re.M)
_STRING_BLOCK = re.compile(r"[rR]?'''.*?'''|[rR]?\"\"\".*?\"\"\"", re.S)   # kernel sources, docstrings
_COMMENT = re.compile(r"#[^\n]*")                 # "# Original ATen: [aten.mm]" names ops it did not call
# torch.ops.inductor.* allocate and reinterpret buffers; they launch nothing
_EXTERN = re.compile(r"\bextern_kernels\.\w+\(|\btorch\.ops\.(?!inductor\.)\w+\.\w+(?:\.\w+)?\(")


def count_kernels(codes: list[str]) -> dict:
    """{"generated": n, "extern": m} summed over the wrapper modules of one compile (a graph break
    gives several). Raises ValueError on text that is not Inductor's Python wrapper (cpp_wrapper
    mode writes C++), so a caller records why instead of a count of zero."""
    if not codes:
        raise ValueError("Inductor wrote no output code for this compile")
    generated = extern = 0
    for code in codes:
        if "async_compile" not in code and "def call(" not in code:
            raise ValueError("Inductor's output code is not its Python wrapper (cpp_wrapper?): kernels not counted")
        names = set(_DEFINITION.findall(code))
        body = _COMMENT.sub("", _STRING_BLOCK.sub("", code))
        for name in names:
            generated += len(re.findall(rf"\b{name}(?:\.run)?\(", body))
        extern += len(_EXTERN.findall(body))
    return {"generated": generated, "extern": extern}


def first_call_counting_kernels(compiled, inputs) -> tuple[object, dict]:
    """Call `compiled` once, the call that compiles it, and count the kernels in the code Inductor
    wrote meanwhile: (result, {"generated", "extern"} or {"error": why}). No second compilation:
    torch._inductor.utils.run_and_get_code only listens to the wrapper code being saved (on an FX
    graph cache hit too); it resets dynamo first, which the timing would do anyway."""
    try:
        from torch._inductor.utils import run_and_get_code
    except ImportError as exc:
        import torch
        torch._dynamo.reset()
        return compiled(*inputs), {"error": f"this torch has no torch._inductor.utils.run_and_get_code ({exc})"}
    result, codes = run_and_get_code(compiled, *inputs)
    try:
        return result, count_kernels(codes)
    except ValueError as exc:
        return result, {"error": str(exc)}
