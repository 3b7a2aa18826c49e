"""CUDA code generation: a region of a Program in, readable specialised CUDA C++ out.

Entry point: generate_kernel(program, node_ids, name=...). The region's kind is worked out from its
nodes unless given (the planner's kinds are accepted): elementwise ops only -> "pointwise"; one
permute/transpose, or any graph of layout ops with views (slice, select, chunk, cat, pad, flip, roll, ...)
-> "layout"; one max/avg or adaptive pool -> "pooling"; one reduction or normalization ->
"row_reduction" (rows, columns, split rows); each with pointwise ops fused before and after it. A
region that starts with a matmul or convolution gets a kernel for its epilogue, and the runtime runs
the library call first. docs/CODEGEN.md describes what is generated for each kind.

can_lower(program, node_ids, kind) answers, without compiling, whether generate_kernel would write a
kernel for a group: the planner asks it before it proposes one (codegen/lower_check.py).
"""
from __future__ import annotations

from ..ir import Program
from .cuda import prune_unused
from .kernel import CodegenError, KernelSource
from .layout_graph import is_layout_graph, is_layout_op
from .lower_check import can_lower
from .pointwise import generate_pointwise, is_elementwise
from .region_io import RegionIO, region_io

KINDS = ("pointwise", "row_reduction", "layout", "pooling", "convolution", "scan",
         "class_loss", "strided_slice", "attention", "gemm")
# ops that decide the generator of any region holding them: op -> kind (the scans are single-node
# kernels; nll_loss brings its log_softmax, label ops and reduction, or comes alone). argmax / argmin
# are row-graph reductions (rowops.py), a scalar or rows of one element included
OP_KINDS = {"cumsum": "scan", "cumprod": "scan", "nll_loss": "class_loss",
            "scaled_dot_product_attention": "attention"}


def _pools(program: Program, io: RegionIO, anchors) -> int:
    """The max/avg or adaptive pools of a region whose anchors are all such pools (global average
    pooling stays a row mean), else 0: a pool before a reduction is the row kernel's prologue."""
    from .pooling import pooled_here
    pools = [n for n in anchors if pooled_here(program, program.nodes[n])]
    return len(pools) if len(pools) == len(anchors) else 0


def region_kind(program: Program, io: RegionIO) -> str:
    if all(is_elementwise(program.nodes[n]) for n in io.nodes):
        return "pointwise"
    return "row_reduction"


# ops that run through the vendor library (via torch) with the rest of their region fused after them
LIBRARY_CATEGORIES = ("matmul", "convolution")
# region kinds of the planner that map onto the generators here
_PLANNER_KINDS = {"reduction": "row_reduction", "normalization": "row_reduction", "single": None,
                  "sibling": None, "matmul_epilogue": None, "conv_epilogue": None, "opaque": None}


def _is_strided_slice(program: Program, io: RegionIO) -> bool:
    return any(program.nodes[n].op == "slice" and program.nodes[n].attrs.get("step", 1) != 1 for n in io.nodes)


def split_library(program: Program, io: RegionIO) -> tuple[list[str], list[str]]:
    """(library nodes, generated nodes): a matmul or convolution that starts the region runs through
    cuBLAS / cuDNN (torch); the nodes after it become one epilogue kernel."""
    lib = [n for n in io.nodes if program.nodes[n].opdef.category in LIBRARY_CATEGORIES]
    if not lib:
        return [], list(io.nodes)
    if len(lib) > 1:
        names = ", ".join(f"{program.nodes[n].name} ({program.nodes[n].op})" for n in lib)
        raise CodegenError(f"the region holds {len(lib)} matmuls/convolutions ({names}); one kernel "
                           f"follows at most one library call")
    anchor = program.nodes[lib[0]]
    produced = {v for n in io.nodes for v in program.nodes[n].outputs}
    if any(v in produced for v in anchor.inputs if v):
        raise CodegenError(f"{anchor.name} ({anchor.op}) reads a value computed earlier in the region; "
                           f"only an epilogue after the library call is generated", node_id=anchor.id)
    rest = [n for n in io.nodes if n != anchor.id]
    if not rest:
        raise CodegenError(f"{anchor.name} ({anchor.op}) alone runs through the library "
                           f"(cuBLAS/cuDNN via torch); there is no epilogue to generate", node_id=anchor.id)
    return [anchor.id], rest


def generate_kernel(program: Program, node_ids, *, name: str, kind: str | None = None,
                    params: dict | None = None) -> KernelSource:
    """Generate the kernel of the region made of node_ids; CodegenError says why if it cannot.

    A region that starts with a matmul or convolution gets a kernel for the epilogue only:
    KernelSource.library_nodes names the node the runtime runs first through torch."""
    ks = _generate(program, node_ids, name=name, kind=kind, params=params)
    ks.source = prune_unused(ks.source)
    return ks


def _generate(program: Program, node_ids, *, name: str, kind: str | None, params: dict | None) -> KernelSource:
    io = region_io(program, node_ids)
    if kind == "attention" or any(OP_KINDS.get(program.nodes[n].op) == "attention" for n in io.nodes):
        from .attention import generate_attention   # our fused kernel, not a library call
        from ..runtime.low_precision import TF32, allowed
        ks = generate_attention(program, io, name, params)
        if TF32 in allowed(program):    # one TF32 product instead of three, timed where the program allows it
            ks.alternatives = [{"form": "3xtf32", TF32: True}]
        return ks
    from .conv import DIRECT, direct_alternative, generate_conv, lone_transposed
    from .gemm_mma import generate_gemm, lone_gemm
    if (params or {}).get("form") == DIRECT:       # a form the tuner times against cuDNN (conv.py)
        return generate_conv(program, io, name, params)
    forms = direct_alternative(program, io) if kind != "convolution" and lone_transposed(program, io.nodes) else []
    if forms:    # a transposed convolution alone (conv.lone_direct): its direct forms
        first, *others = forms
        ks = generate_conv(program, io, name, {**first, **(params or {})})
        ks.alternatives = others
        return ks
    # the matmul / convolution and its epilogue as one tile GEMM; a compute-bound matmul or convolution
    # alone as the tile GEMM the agent times against the library call (gemm_mma.lone_gemm), and a thin
    # convolution as the direct one too
    if (params or {}).get("form") == "gemm-3xtf32" or (kind != "convolution" and lone_gemm(program, io.nodes)):
        ks = generate_gemm(program, io, name, params)
        ks.alternatives = ks.alternatives + direct_alternative(program, io)    # the sm_90 TMA loop's tiles first
        return ks
    lib, rest = ([], None) if kind == "convolution" else split_library(program, io)
    if lib:
        ks = _generate(program, rest, name=name, kind=None, params=params)
        ks.library_nodes = lib
        anchor = program.nodes[lib[0]]
        note = (f"// Runs after {anchor.name} ({anchor.op} -> {program.values[anchor.outputs[0]].spec}) "
                f"through cuBLAS/cuDNN (torch); this kernel is its fused epilogue.\n")
        ks.source = note + ks.source
        from .gemm_mma import alternatives
        tile = alternatives(program, io)      # the tile GEMM's default, then its next tile
        ks.alternatives = tile[:1] + direct_alternative(program, io) + tile[1:]
        return ks
    if kind == "convolution":  # asked for explicitly (the export): a generated conv instead of cuDNN
        return generate_conv(program, io, name, params)
    kind = _PLANNER_KINDS.get(kind, kind) if kind else None
    own = {OP_KINDS[program.nodes[n].op] for n in io.nodes if program.nodes[n].op in OP_KINDS}
    # reductions and norms, with any layout ops before them read through views (rowkernel.py)
    anchors = [n for n in io.nodes if not is_elementwise(program.nodes[n]) and not is_layout_op(program.nodes[n])]
    if _is_strided_slice(program, io) and not anchors:
        own.add("strided_slice")
    kind = (own.pop() if len(own) == 1 else None) or kind or region_kind(program, io)
    if kind == "strided_slice":
        from .layout import generate_strided_slice
        return generate_strided_slice(program, io, name, params)
    if kind == "pointwise":
        return generate_pointwise(program, io, name, params)
    pools = _pools(program, io, anchors)
    if pools > 1:       # a pool of a pool: each window a lambda of a layout graph (layout_graph.py)
        from .layout_graph import generate_layout_graph
        return generate_layout_graph(program, io, name, params, "pooling")
    if kind == "pooling" or (kind == "row_reduction" and pools):
        from .pooling import generate_pooling
        try:        # views of the pooled map after it: the pooling kernel writes them at the same index
            return generate_pooling(program, io, name, params)
        except CodegenError:
            if not any(is_layout_op(program.nodes[n]) for n in io.nodes):
                raise
        # views before the pool (a nearest upsample): a layout graph of window lambdas
        from .layout_graph import generate_layout_graph
        return generate_layout_graph(program, io, name, params, "pooling")
    if kind == "layout" or (kind == "row_reduction" and not anchors and is_layout_graph(program, io)):
        from .layout import generate_layout
        return generate_layout(program, io, name, params)
    if kind in ("row_reduction", "reduction", "normalization", "scan", "class_loss"):    # the row IR's
        from .rowkernel import generate_multi_reduction
        return generate_multi_reduction(program, io, name, params)
    raise CodegenError(f"region {name}: no code generator for kind '{kind}' (have: {', '.join(KINDS)})")


__all__ = ["CodegenError", "KernelSource", "RegionIO", "can_lower", "generate_kernel", "region_io", "region_kind",
           "split_library"]
