"""A convolution's bias moved into the generated kernel that reads its output.

torch runs a cuDNN convolution with a bias as two kernels: the convolution, then `output.add_(bias)`,
one more read and write of the whole output (aten/src/ATen/native/Convolution.cpp, the Cudnn backend;
Inductor peels the bias off for the same reason: "cudnn is slower with it"). When every reader of the
output is an elementwise op or a cat, the planner puts those readers into a generated kernel (a
convolution's epilogue, or the kernel that writes the cat), so the same add costs nothing there:
conv(x, w, b) -> conv(x, w) + b[C, 1, ...], with the bias as a [C, 1, ...] parameter that broadcasts
over the channel dim. The sum is the same fp32 addition cuDNN's path does after the convolution.

It runs after the other rules have settled (rewrites.engine.LATE_RULES): fold_batch_norm and
fold_affine_into_producer fold per-channel shifts into the bias first, and this rule then moves the
folded bias out, once (those rules would fold it straight back).
"""
from __future__ import annotations

from ..codegen.pointwise import is_elementwise
from ..ir import Program
from .edits import Rewrite, add_param, param_array
from .edits import node_label as _n

# readers whose kernel the planner generates with the add inside it
_FUSING_READERS = ("cat",)


def _reader_fuses(program: Program, nid: str) -> bool:
    node = program.nodes[nid]
    return is_elementwise(node) or node.op in _FUSING_READERS


def peel_conv_bias(program: Program, nid: str) -> Rewrite | None:
    n = program.nodes[nid]
    if n.opdef.category != "convolution" or len(n.inputs) < 3 or not n.inputs[2] or len(n.outputs) != 1:
        return None
    spatial = int(n.op[-2]) if n.op[-2].isdigit() else None
    x, out = n.inputs[0], n.outputs[0]
    if spatial is None or len(program.values[x].shape) != spatial + 2:   # batched only: channels at dim 1
        return None
    if out in program.outputs:
        return None
    readers = {c for c, _ in program.consumers(out)}
    if not readers or not all(_reader_fuses(program, r) for r in readers):
        return None
    bias = param_array(program, n.inputs[2])
    channels = program.values[out].shape[1]
    if bias is None or bias.size != channels:
        return None
    others = ", ".join(sorted(_n(program, r) for r in readers))

    def build(p):
        b = add_param(p, p.unique_name(p.values[n.inputs[2]].name + "_peeled"),
                      bias.reshape(channels, *([1] * spatial)), like=n.inputs[2])
        rest = list(n.inputs[3:])
        conv = p.add_node(n.op, [n.inputs[0], n.inputs[1]] + ([None] + rest if rest else []), dict(n.attrs)).outputs[0]
        return {out: p.add_node("add", [conv, b]).outputs[0]}
    return Rewrite("peel_conv_bias", f"{_n(program, nid)}'s bias ({channels} channels) is added in the kernel "
                   f"of {others} instead of by cuDNN's separate pass over the output.", build, nid)
