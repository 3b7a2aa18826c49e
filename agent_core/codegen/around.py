"""The pointwise prologue and epilogue around one anchor op (a permute, a pooling window).

Layout and pooling kernels both read their anchor's input through `point(...)` (the pointwise ops that
feed it, fused) and write its result through `store_point(...)` (the pointwise ops after it); this module
renders both helpers and the broadcast-aware operand loads they need.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from ..ir import Program
from .cuda import Names
from .kernel import CodegenError
from .pointwise import is_elementwise, operand_views, render_chain
from .region_io import Operands, RegionIO


@dataclass
class Around:
    arg: dict          # kernel parameter name of each region input and output
    pro_inputs: list   # region inputs the prologue reads (the anchor's input alone when none)
    epi_inputs: list   # region inputs the epilogue reads
    ld_pro: Operands  # loads of pro_inputs, indexed in the anchor's input space
    ld_epi: Operands  # loads of epi_inputs, indexed in the anchor's output space
    pro_fn: str        # `float point(...)` source
    epi_fn: str        # `void store_point(anchor value, epilogue inputs..., outputs&...)` source


# grid-stride kernels launch at most this many blocks: 8 per SM of the H200's 132, enough to fill it
MAX_GRID_BLOCKS = 132 * 8


def grid_for(numel: int, block: int) -> int:
    """Blocks of a grid-stride loop over numel elements."""
    return max(1, min(math.ceil(numel / block), MAX_GRID_BLOCKS))


def split_around(program: Program, io: RegionIO, anchor_ops, kind: str, what: str, size_of: str = "output"):
    """(anchor node, prologue nodes, epilogue nodes) of a region made of one anchor op (of anchor_ops)
    and pointwise ops around it: every other op feeds the anchor or follows it, prologue values stay
    inside, all values are float32, and every output has the size of the anchor's `size_of` ("input"
    or "output"), which is not empty. CodegenError says which rule the region breaks."""
    vals, nodes = program.values, program.nodes
    anchors = [n for n in io.nodes if nodes[n].op in anchor_ops]
    views = trailing_views(program, io)
    if len(anchors) != 1 or any(n not in anchors and n not in views and not is_elementwise(nodes[n])
                                for n in io.nodes):
        raise CodegenError(f"a {kind} region holds one {what}, pointwise ops around it and views of its "
                           f"outputs")
    t = nodes[anchors[0]]
    for vid in [t.inputs[0], t.outputs[0], *io.inputs, *io.outputs]:
        if vals[vid].dtype != "float32":
            raise CodegenError(f"'{vals[vid].name}' has dtype {vals[vid].dtype}; {kind} kernels are generated "
                               f"for float32 so far")
    numel = math.prod(vals[t.inputs[0] if size_of == "input" else t.outputs[0]].shape)
    if numel == 0:
        raise CodegenError(f"{t.name} ({t.op}) has an empty {size_of}; there is nothing to launch")
    pro, epi = prologue_epilogue(program, io, t, t, 1, kind, numel, size_of)
    return t, pro, epi


def trailing_views(program: Program, io: RegionIO) -> set:
    """The region's views (reshape, squeeze, ...: the same elements in the same order) whose outputs no
    other kind of op in the region reads: the kernel writes their outputs as it would their inputs, at
    the same flat index. (A view before the anchor is read by it, so it is not one.)"""
    from ..analysis.cost import is_view
    views = {n for n in io.nodes if is_view(program, n)}
    while True:
        read = {n for n in views if any(v in program.nodes[m].inputs for v in program.nodes[n].outputs
                                        for m in io.nodes if m not in views)}
        if not read:
            return views
        views -= read


def prologue_epilogue(program: Program, io: RegionIO, first, last, n_middle: int, kind: str, numel: int,
                      size_of: str) -> tuple[list, list]:
    """(prologue nodes, epilogue nodes) around the `n_middle` nodes from `first` to `last`: every other
    op feeds `first` or follows `last`, prologue values stay inside the region and are not read by the
    epilogue, and every output has `numel` elements (the size of `last`'s `size_of`)."""
    vals, nodes = program.values, program.nodes
    g = program.graph().subgraph(io.nodes)
    before, after = nx.ancestors(g, first.id), nx.descendants(g, last.id)
    pro = [n for n in io.nodes if n in before]
    epi = [n for n in io.nodes if n in after]
    if len(pro) + len(epi) + n_middle != len(io.nodes):
        follow = "it" if first is last else last.name
        raise CodegenError(f"every op of a {kind} region must feed {first.name} or follow {follow}; "
                           "split the region")
    pro_vals = {v for n in pro for v in nodes[n].outputs}
    if any(v in pro_vals for v in io.outputs):
        raise CodegenError("a prologue value is also used outside the region; split the region")
    if any(v in pro_vals for n in epi for v in nodes[n].inputs):
        raise CodegenError("the epilogue reads a prologue value; split the region")
    for v in io.outputs:
        if math.prod(vals[v].shape) != numel:
            raise CodegenError(f"output '{vals[v].name}' {vals[v].spec} is not the size of {last.name}'s "
                               f"{size_of}; split the region there")
    return pro, epi


def render_around(program: Program, io: RegionIO, pro: list, epi: list, x_vid: str, y_vid: str,
                  names: Names, pro_doc: str, epi_doc: str) -> Around:
    """Render the prologue (nodes `pro`, ending in x_vid) and the epilogue (nodes `epi`, from y_vid)."""
    vals, nodes = program.values, program.nodes
    arg = {v: names.new(vals[v].name) for v in io.inputs + io.outputs}
    pro_inputs = [v for v in io.inputs if any(v in nodes[n].inputs for n in pro)] if pro else [x_vid]
    epi_inputs = [v for v in io.inputs if any(v in nodes[n].inputs for n in epi)]
    ld_pro = Operands(program, vals[x_vid].shape, pro_inputs, names, "In",
                       operand_views(program, pro, pro_inputs))
    ld_epi = Operands(program, vals[y_vid].shape, epi_inputs, names, "Out",
                       operand_views(program, epi, epi_inputs))

    pn = Names()
    penv = {v: pn.new(vals[v].name) for v in pro_inputs}
    pro_lines = render_chain(program, pro, penv, pn) if pro else []
    pro_fn = (f"// Prologue: {pro_doc}\n"
              f"__device__ __forceinline__ float point({', '.join(f'float {penv[v]}' for v in pro_inputs)}) {{\n"
              + "\n".join(pro_lines) + f"\n  return {penv[x_vid]};\n}}\n")

    en = Names()
    eenv = {y_vid: en.new(vals[y_vid].name)}
    for v in epi_inputs:
        eenv[v] = en.new(vals[v].name)
    views = trailing_views(program, io)
    chain = [n for n in epi if n not in views]
    epi_lines = render_chain(program, chain, eenv, en) if chain else []
    for n in (n for n in epi if n in views):     # the same elements in the same order: the same value
        eenv[nodes[n].outputs[0]] = eenv[nodes[n].inputs[0]]
    oref = {v: en.new(vals[v].name + "_out") for v in io.outputs}
    epi_lines += [f"  {oref[v]} = {eenv[v]};" for v in io.outputs]
    sig = [f"float {eenv[y_vid]}"] + [f"float {eenv[v]}" for v in epi_inputs] + [f"float& {oref[v]}" for v in io.outputs]
    epi_fn = (f"// Epilogue: {epi_doc}\n"
              f"__device__ __forceinline__ void store_point({', '.join(sig)}) {{\n" + "\n".join(epi_lines) + "\n}\n")
    return Around(arg, pro_inputs, epi_inputs, ld_pro, ld_epi, pro_fn, epi_fn)
