"""Region shapes the planner produces beyond plain chains: a matmul/conv followed by its generated
epilogue, batch_norm (eval) and expand inside pointwise chains, group/instance norms as row
reductions, and keepdim reductions broadcast back over their rows. Each compiles to sm_90."""
import numpy as np
import pytest

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program


def build(kind):
    """Small programs for each pattern: (program, region node ids)."""
    p = Program(kind)
    if kind == "linear_bias_relu":
        x = p.add_input("x", (8, 32))
        w = p.add_parameter("w", shape=(64, 32))
        lin = p.add_node("linear", [x.id, w.id])
        b = p.add_parameter("b", shape=(64,))
        a = p.add_node("add", [lin.outputs[0], b.id])
        r = p.add_node("relu", [a.outputs[0]])
        p.mark_output(r.outputs[0])
        return p, [lin.id, a.id, r.id]
    if kind == "linear_layer_norm":
        x = p.add_input("x", (8, 32))
        w = p.add_parameter("w", shape=(48, 32))
        lin = p.add_node("linear", [x.id, w.id])
        r = p.add_input("residual", (8, 48))
        a = p.add_node("add", [lin.outputs[0], r.id])
        ln = p.add_node("layer_norm", [a.outputs[0]], {"normalized_shape": [48]})
        p.mark_output(ln.outputs[0])
        return p, [lin.id, a.id, ln.id]
    if kind == "conv_bn_relu":
        x = p.add_input("x", (2, 3, 9, 9))
        w = p.add_parameter("w", shape=(8, 3, 3, 3))
        c = p.add_node("conv2d", [x.id, w.id])
        rm = p.add_parameter("rm", shape=(8,))
        rv = p.add_parameter("rv", np.linspace(0.5, 2.0, 8).astype(np.float32))
        g = p.add_parameter("g", shape=(8,))
        be = p.add_parameter("be", shape=(8,))
        bn = p.add_node("batch_norm", [c.outputs[0], rm.id, rv.id, g.id, be.id])
        r = p.add_node("relu", [bn.outputs[0]])
        p.mark_output(r.outputs[0])
        return p, [c.id, bn.id, r.id]
    if kind == "expand_chain":
        x = p.add_input("x", (4, 1, 6))
        e = p.add_node("expand", [x.id], {"size": [4, 5, 6]})
        y = p.add_input("y", (4, 5, 6))
        m = p.add_node("mul", [e.outputs[0], y.id])
        p.mark_output(m.outputs[0])
        return p, [e.id, m.id]
    if kind == "rms_norm_manual":
        x = p.add_input("x", (6, 4, 64))
        w = p.add_parameter("w", shape=(64,))
        sq = p.add_node("mul", [x.id, x.id])
        m = p.add_node("mean", [sq.outputs[0]], {"dim": [-1], "keepdim": True})
        e = p.add_node("add_scalar", [m.outputs[0]], {"value": 1e-6})
        r = p.add_node("rsqrt", [e.outputs[0]])
        y = p.add_node("mul", [x.id, r.outputs[0]])
        z = p.add_node("mul", [y.outputs[0], w.id])
        p.mark_output(z.outputs[0])
        return p, [sq.id, m.id, e.id, r.id, y.id, z.id]
    if kind in ("group_norm", "instance_norm"):
        x = p.add_input("x", (2, 6, 5, 7))
        w = p.add_parameter("w", shape=(6,))
        b = p.add_parameter("b", shape=(6,))
        if kind == "group_norm":
            n = p.add_node("group_norm", [x.id, w.id, b.id], {"num_groups": 3})
        else:
            n = p.add_node("instance_norm", [x.id, None, None, w.id, b.id])
        s = p.add_node("silu", [n.outputs[0]])
        p.mark_output(s.outputs[0])
        return p, [n.id, s.id]
    if kind == "global_avg_pool":
        x = p.add_input("x", (4, 16, 7, 9))
        r = p.add_node("relu", [x.id])
        a = p.add_node("adaptive_avg_pool2d", [r.outputs[0]], {"output_size": [1]})
        s = p.add_node("sigmoid", [a.outputs[0]])
        p.mark_output(s.outputs[0])
        return p, [r.id, a.id, s.id]
    raise ValueError(kind)


KINDS = ["linear_bias_relu", "linear_layer_norm", "conv_bn_relu", "expand_chain", "rms_norm_manual",
         "group_norm", "instance_norm", "global_avg_pool"]


@pytest.mark.parametrize("kind", KINDS)
def test_pattern_compiles(kind):
    p, ids = build(kind)
    ks = generate_kernel(p, ids, name=kind)
    if kind.startswith(("linear", "conv")):
        assert ks.library_nodes == [ids[0]] and "cuBLAS/cuDNN" in ks.source
        assert p.nodes[ids[0]].outputs[0] in ks.inputs
    else:
        assert ks.library_nodes == []
    if kind == "rms_norm_manual":
        assert ks.kind == "row_reduction" and ks.outputs == [p.nodes[ids[-1]].outputs[0]]
    compile_kernel(ks, arch="sm_90")


def test_lone_library_op_and_two_anchors_are_refused():
    p, ids = build("linear_bias_relu")
    with pytest.raises(CodegenError, match="alone runs through the library"):
        generate_kernel(p, ids[:1], name="lone")
    q = Program("two")
    x = q.add_input("x", (4, 8))
    w = q.add_parameter("w", shape=(8, 8))
    a = q.add_node("linear", [x.id, w.id])
    b = q.add_node("linear", [a.outputs[0], w.id])
    q.mark_output(b.outputs[0])
    with pytest.raises(CodegenError, match="2 matmuls"):
        generate_kernel(q, [a.id, b.id], name="two")
