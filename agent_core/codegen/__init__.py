"""CUDA code generation: a region of a Program in, readable specialised CUDA C++ out.

Entry point: generate_kernel(program, node_ids, name=...). The region's kind is worked out from its
nodes unless given: only pointwise ops -> "pointwise"; one row reduction or normalization with a
pointwise prologue and epilogue -> "row_reduction".
"""
from __future__ import annotations

from ..ir import Program
from .kernel import CodegenError, KernelSource
from .pointwise import generate_pointwise
from .region_io import RegionIO, region_io

KINDS = ("pointwise", "row_reduction")


def region_kind(program: Program, io: RegionIO) -> str:
    cats = [program.nodes[n].opdef.category for n in io.nodes]
    if all(c == "pointwise" for c in cats):
        return "pointwise"
    return "row_reduction"


def generate_kernel(program: Program, node_ids, *, name: str, kind: str | None = None,
                    params: dict | None = None) -> KernelSource:
    """Generate the kernel of the region made of node_ids; CodegenError says why if it cannot."""
    io = region_io(program, node_ids)
    kind = kind or region_kind(program, io)
    if kind == "pointwise":
        return generate_pointwise(program, io, name, params)
    if kind in ("row_reduction", "reduction", "normalization"):
        from .rowreduce import generate_row_reduction
        return generate_row_reduction(program, io, name, params)
    raise CodegenError(f"region {name}: no code generator for kind '{kind}' (have: {', '.join(KINDS)})")


__all__ = ["CodegenError", "KernelSource", "RegionIO", "generate_kernel", "region_io", "region_kind"]
