"""The pointwise prologue and epilogue around one anchor op (a permute, a pooling window).

Layout and pooling kernels both read their anchor's input through `point(...)` (the pointwise ops that
feed it, fused) and write its result through `store_point(...)` (the pointwise ops after it); this module
renders both helpers and the broadcast-aware operand loads they need.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Program
from .cuda import Names
from .pointwise import operand_views, render_chain
from .region_io import RegionIO
from .rowreduce import _Operands


@dataclass
class Around:
    arg: dict          # kernel parameter name of each region input and output
    pro_inputs: list   # region inputs the prologue reads (the anchor's input alone when none)
    epi_inputs: list   # region inputs the epilogue reads
    ld_pro: _Operands  # loads of pro_inputs, indexed in the anchor's input space
    ld_epi: _Operands  # loads of epi_inputs, indexed in the anchor's output space
    pro_fn: str        # `float point(...)` source
    epi_fn: str        # `void store_point(anchor value, epilogue inputs..., outputs&...)` source


def render_around(program: Program, io: RegionIO, pro: list, epi: list, x_vid: str, y_vid: str,
                  names: Names, pro_doc: str, epi_doc: str) -> Around:
    """Render the prologue (nodes `pro`, ending in x_vid) and the epilogue (nodes `epi`, from y_vid)."""
    vals, nodes = program.values, program.nodes
    arg = {v: names.new(vals[v].name) for v in io.inputs + io.outputs}
    pro_inputs = [v for v in io.inputs if any(v in nodes[n].inputs for n in pro)] if pro else [x_vid]
    epi_inputs = [v for v in io.inputs if any(v in nodes[n].inputs for n in epi)]
    ld_pro = _Operands(program, vals[x_vid].shape, pro_inputs, names, "In",
                       operand_views(program, pro, pro_inputs))
    ld_epi = _Operands(program, vals[y_vid].shape, epi_inputs, names, "Out",
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
    epi_lines = render_chain(program, epi, eenv, en) if epi else []
    oref = {v: en.new(vals[v].name + "_out") for v in io.outputs}
    epi_lines += [f"  {oref[v]} = {eenv[v]};" for v in io.outputs]
    sig = [f"float {eenv[y_vid]}"] + [f"float {eenv[v]}" for v in epi_inputs] + [f"float& {oref[v]}" for v in io.outputs]
    epi_fn = (f"// Epilogue: {epi_doc}\n"
              f"__device__ __forceinline__ void store_point({', '.join(sig)}) {{\n" + "\n".join(epi_lines) + "\n}\n")
    return Around(arg, pro_inputs, epi_inputs, ld_pro, ld_epi, pro_fn, epi_fn)
