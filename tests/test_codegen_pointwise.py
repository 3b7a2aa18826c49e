"""Pointwise code generation: every op of the library renders and compiles to sm_90 through NVRTC,
broadcast index arithmetic matches numpy, unsupported regions are refused with a reason, and the
covering grid (a tuning variant) computes what torch does."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agent_core.agent.tune import tune_space
from agent_core.codegen import CodegenError, generate_kernel
from agent_core.codegen.cuda import float_literal
from agent_core.codegen.region_io import BroadcastIndex, region_io
from agent_core.compiler import compile_kernel
from agent_core.errors import ShapeError
from agent_core.ir import Program
from agent_core.ops import REQUIRED, all_ops
from agent_core.reference import run_reference
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx


def sample_attrs(op):
    """Values for an op's required attributes (and a clamp with both ends)."""
    if op.name == "clamp":
        return {"min": -0.5, "max": 0.5}
    return {a.name: 1.5 if a.name == "value" else 0.25 for a in op.attrs if a.default is REQUIRED}


def _single_op_program(op, dtype="float32"):
    """The op over float32 inputs, or int64 ones for an op of integers only (the bitwise ops)."""
    p = Program(f"one_{op.name}")
    shape = (3, 5, 7)
    ins = []
    for k, port in enumerate(op.port_names):
        # the second operand broadcasts, so every binary op also exercises index arithmetic
        ins.append(p.add_input(port, shape if k == 0 else (5, 1), dtype=dtype).id)
    try:
        n = p.add_node(op.name, ins, sample_attrs(op))
    except ShapeError:
        if dtype != "float32":
            raise
        return _single_op_program(op, "int64")
    p.mark_output(n.outputs[0])
    return p, n


POINTWISE = [op for op in all_ops() if op.category == "pointwise"]


@pytest.mark.parametrize("op", POINTWISE, ids=lambda o: o.name)
def test_every_pointwise_op_compiles_to_sm90(op):
    p, n = _single_op_program(op)
    ks = generate_kernel(p, [n.id], name=f"region_{op.name}")
    assert f"{n.name}" in ks.source and 'extern "C" __global__' in ks.source
    compiled = compile_kernel(ks, arch="sm_90")
    assert compiled.path.read_bytes()[:4] == b"\x7fELF"


def test_chain_header_names_ops_shapes_and_uses_float4():
    p = Program("chain")
    x = p.add_input("x", (8, 16, 33, 33))
    b = p.add_input("bias", (16, 1, 1))
    a = p.add_node("add", [x.id, b.id])
    r = p.add_node("leaky_relu", [a.outputs[0]], {"negative_slope": 0.2})
    g = p.add_node("gelu", [r.outputs[0]], {"approximate": "tanh"})
    p.mark_output(g.outputs[0])
    ks = generate_kernel(p, [g.id, a.id, r.id], name="conv_epilogue")
    src = ks.source
    assert ks.kind == "pointwise" and ks.name == "conv_epilogue"
    assert ks.inputs == [x.id, b.id] and ks.outputs == [g.outputs[0]]
    for text in ("leaky_relu(add, negative_slope=0.2)", "float32[8, 16, 33, 33]", "0.2f",
                 "reinterpret_cast<const float4*>(x)", "__restrict__", "(i / kInner1) % kSize1",
                 "kInner1 = 1089"):
        assert text in src, text
    assert ks.align == 16 and ks.params["vector_width"] == 4
    assert "scalar tail" not in src  # 8*16*33*33 is a multiple of 4
    compile_kernel(ks, arch="sm_90")


def test_odd_sizes_get_a_scalar_tail_or_scalar_loop():
    p = Program("odd")
    x = p.add_input("x", (7, 5))
    n = p.add_node("sigmoid", [x.id])
    p.mark_output(n.outputs[0])
    ks = generate_kernel(p, [n.id], name="odd")
    assert "scalar tail: the last 3 element(s)" in ks.source
    compile_kernel(ks, arch="sm_90")
    one = Program("one")
    y = one.add_input("y", (1,))
    m = one.add_node("exp", [y.id])
    one.mark_output(m.outputs[0])
    ks1 = generate_kernel(one, [m.id], name="single")
    assert "float4" not in ks1.source and ks1.grid == (1, 1, 1)
    compile_kernel(ks1, arch="sm_90")


def test_region_boundary_intermediates_and_multiple_outputs():
    p = Program("multi")
    x = p.add_input("x", (4, 6))
    a = p.add_node("relu", [x.id])
    b = p.add_node("exp", [a.outputs[0]])
    c = p.add_node("neg", [a.outputs[0]])    # outside the region, reads relu's output
    p.mark_output(b.outputs[0])
    p.mark_output(c.outputs[0])
    io = region_io(p, [a.id, b.id])
    assert io.inputs == [x.id] and io.outputs == [a.outputs[0], b.outputs[0]]
    ks = generate_kernel(p, [a.id, b.id], name="two_outputs")
    assert ks.outputs == [a.outputs[0], b.outputs[0]]
    compile_kernel(ks, arch="sm_90")


def test_refusals_name_the_reason():
    p = Program("bad")
    x = p.add_input("x", (4, 4), dtype="float64")
    n = p.add_node("relu", [x.id])
    p.mark_output(n.outputs[0])
    with pytest.raises(CodegenError, match="float64"):
        generate_kernel(p, [n.id], name="f64")
    q = Program("small_out")
    a = q.add_input("a", (4, 4))
    s = q.add_input("s", (4, 1))
    e = q.add_node("exp", [s.id])             # [4, 1], also a region output
    m = q.add_node("mul", [a.id, e.outputs[0]])
    q.mark_output(e.outputs[0])
    q.mark_output(m.outputs[0])
    with pytest.raises(CodegenError, match="smaller than the region"):
        generate_kernel(q, [e.id, m.id], name="small")
    with pytest.raises(CodegenError, match="does not have"):
        generate_kernel(q, ["n999"], name="missing")


def test_literals():
    assert float_literal(0.01) == "0.01f"
    assert float_literal(2) == "2.0f"
    assert float_literal(-0.5) == "(-0.5f)"
    assert float_literal(1e-5) == "1e-05f"
    assert float_literal(float("inf")) == "INFINITY"


@pytest.mark.parametrize("space,shapes", [
    ((2, 3, 4, 5), [(3, 1, 1), (4, 5), (2, 1, 4, 1), (), (1, 3, 4, 5), (2, 3, 4, 5)]),
    ((6, 1, 7), [(6, 1, 1), (1, 7), (7,)]),
])
def test_broadcast_index_matches_numpy(space, shapes):
    bidx = BroadcastIndex(space, shapes)
    n = int(np.prod(space))
    sizes = [f"kSize{g}" for g in range(len(bidx.sizes))]
    inners = [f"kInner{g}" for g in range(len(bidx.sizes))]
    env = {**dict(zip(sizes, bidx.sizes)), **dict(zip(inners, bidx.inner))}
    for k, shape in enumerate(shapes):
        strides = [f"kS{g}" if st not in (0, 1) else None for g, st in enumerate(bidx.strides[k])]
        env.update({f"kS{g}": st for g, st in enumerate(bidx.strides[k])})
        expr = bidx.offset_expr(k, "i", sizes, inners, strides).replace("/", "//")
        want = np.broadcast_to(np.arange(int(np.prod(shape))).reshape(shape), space).reshape(-1)
        got = [eval(expr, {}, {**env, "i": i}) for i in range(n)]  # noqa: S307 (our own expression)
        assert got == list(want), (shape, expr)


@pytest.mark.parametrize("value", [3.0, 2.302585092994046, 7.1, -0.3, 1e-30])
def test_division_by_a_number_multiplies_by_torchs_float32_reciprocal(value):
    """torch's CUDA kernel divides a float32 tensor by a number as x * float32(1 / number), the
    reciprocal taken in double and rounded once (tests/gpu/test_gpu_kernels.py checks those bits on
    the device; for ln 10 that differs from 1 / float32(ln 10) by one ulp): the
    generated kernel multiplies by that same literal, one multiply an element instead of an IEEE
    division, within 1.5 ulp of the correctly rounded quotient the CPU reference computes."""
    import torch
    from agent_core.codegen.cuda import div_reciprocal
    p = Program("div")
    x = p.add_input("x", (4, 64))
    n = p.add_node("div_scalar", [x.id], {"value": value})
    p.mark_output(n.outputs[0])
    ks = generate_kernel(p, [n.id], name="div")
    inv = div_reciprocal(value)
    assert inv == np.float32(1.0 / value)
    assert f"* {float_literal(float(str(inv)))})" in ks.source and " / " not in ks.source.split("__global__")[1]
    xs = torch.randn(1 << 16, generator=torch.Generator().manual_seed(0)) * 1e3
    want, got = (xs.double() / value), xs * torch.tensor(inv)
    ulp = (torch.nextafter(want.float().abs(), torch.tensor(float("inf"))) - want.float().abs()).double()
    assert ((got.double() - want).abs() <= 1.5 * ulp).all()


# --- the covering grid (pointwise.py `cover`, a tuning variant): a block per block x kUnroll groups of 4
# instead of the SMs' resident blocks looping over them (the layout gather's default since it measured
# 192 -> 182 us on the H100); emulated on the CPU against torch, the scalar tail included

def _sigmoid_gate(shape):
    """x * sigmoid(y) + b, b broadcast along the rows: a full-size pair and a broadcast operand."""
    p = Program("chain")
    x, y, b = p.add_input("x", shape), p.add_input("y", shape), p.add_input("b", shape[-1:])
    s = p.add_node("sigmoid", [y.id])
    m = p.add_node("mul", [x.id, s.outputs[0]])
    a = p.add_node("add", [m.outputs[0], b.id])
    p.mark_output(a.outputs[0])
    return p, [s.id, m.id, a.id]


@needs_gxx
@pytest.mark.parametrize("unroll", [1, 4])
def test_the_covering_grid_computes_every_element_once(unroll):
    p, ids = _sigmoid_gate((37, 53))                  # 1961 elements: 490 groups of 4 and a tail of 1
    ks = generate_kernel(p, ids, name="cover", params={"cover": True, "unroll": unroll, "block": 32})
    assert ks.kind == "pointwise" and ks.params["cover"] and ks.params["vector_width"] == 4
    assert ks.grid == (-(-490 // (32 * unroll)), 1, 1)
    resident = generate_kernel(p, ids, name="cover", params={"unroll": unroll, "block": 32, "sm_count": 1,
                                                              "threads_per_sm": 64})
    assert resident.grid == (2, 1, 1)              # the grid-stride default: the SMs' blocks loop
    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(s, generator=g) for s in ((37, 53), (37, 53), (53,))]
    env = run_reference(p, ins, keep=True)
    for k in (ks, resident):
        _, outs = _emulate_region(p, SimpleNamespace(id="cover", nodes=ids), env, ks=k)
        (v, got), = outs.items()
        torch.testing.assert_close(got, env[v], atol=1e-6, rtol=1e-6)


def test_the_tuner_tries_the_covering_grid_first():
    p, ids = _sigmoid_gate((4096, 4096))
    ks = generate_kernel(p, ids, name="cover")
    assert not ks.params["cover"] and ks.grid == (132 * 8, 1, 1)
    assert {k: v for k, v in tune_space(ks)[0].items() if k != "sm_count"} == {"cover": True}
    assert generate_kernel(p, ids, name="cover", params={"cover": True}).grid == (4096 * 4096 // 4 // (256 * 4), 1, 1)
