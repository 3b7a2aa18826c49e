"""Which regions the loop runs without a generated kernel: one rule for the loop and its prefetch."""
from __future__ import annotations

from ..analysis.cost import is_view, library_reads_as_view
from ..codegen import LIBRARY_CATEGORIES
from ..codegen.conv import lone_direct
from ..codegen.gemm_mma import lone_gemm
from .attention_form import own_attention


def without_kernel(program, node_ids) -> tuple[str, object | None] | None:
    """("view", None) for a region of views only; ("library", node) or ("recurrent", node) for one
    matmul, convolution or recurrent node with only views of its operands or result around it (they
    relabel memory; torch runs the call); ("strided_view", node) for a slice or transpose only library
    calls read (analysis.cost.library_reads_as_view); None when the region gets a generated kernel. An
    attention node the agent writes its own kernel for is generated, and so is a compute-bound matmul
    or convolution alone, a few-channel convolution (gemm_mma.lone_gemm) or a transposed convolution
    alone that the direct form takes (conv.lone_direct): our forms, kept only where they beat the
    library call."""
    nodes = [program.nodes[n] for n in node_ids]
    work = [n for n in nodes if not is_view(program, n.id)]
    if not work:
        return "view", None
    if len(work) > 1:
        return None
    node = work[0]
    if library_reads_as_view(program, node.id):
        return "strided_view", node
    if node.opdef.category == "recurrent":
        return "recurrent", node
    if node.opdef.category in LIBRARY_CATEGORIES and not own_attention(program, node) and \
            not lone_gemm(program, node_ids) and not lone_direct(program, node_ids):   # timed as our own forms
        return "library", node
    return None
