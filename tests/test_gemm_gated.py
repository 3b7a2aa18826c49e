"""A gated unit after a GEMM (chunk(2, -1) of its output, then value * act(gate): GLU, GEGLU, SwiGLU) as
the tile GEMM with both halves in one kernel (codegen/gemm_mma.py, spec.halves): each CTA reads B's
columns of both halves in alternating 8-column groups so one thread holds a value and its gate, and
stores only the H-wide result. Checked in the CPU emulator against torch on ragged shapes, compiled for
sm_90 without spills; other slices of the output are refused."""
from __future__ import annotations

import numpy as np
import pytest

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from tests.programs import emulated

torch = pytest.importorskip("torch")


def gated(M, H, K, op="linear", act="gelu", bias=True, halves=((0, None), (None, None))):
    """x [M, K] -> linear / matmul to 2H -> value, gate = chunk(2, -1) -> value * act(gate)."""
    p = Program("gated")
    x = p.add_input("x", (M, K))
    rng = np.random.default_rng(0)
    bound = 1 / np.sqrt(K)
    init = lambda shape: rng.uniform(-bound, bound, size=shape).astype(np.float32)
    if op == "linear":
        ins = [x.id, p.add_parameter("w", init((2 * H, K))).id] + ([p.add_parameter("b", init(2 * H)).id] if bias else [])
        y = p.add_node("linear", ins).outputs[0]
    else:
        y = p.add_node("matmul", [x.id, p.add_parameter("w", init((K, 2 * H))).id]).outputs[0]
    (s0, e0), (s1, e1) = halves
    value = p.add_node("slice", [y], {"dim": -1, "start": s0, "end": H if e0 is None else e0}).outputs[0]
    gate = p.add_node("slice", [y], {"dim": 1, "start": H if s1 is None else s1, "end": e1}).outputs[0]
    p.mark_output(p.add_node("mul", [value, p.add_node(act, [gate]).outputs[0]]).outputs[0])
    return p


CASES = [((70, 40, 44), "linear", "gelu", True, {}),                                 # ragged M, H, K
         ((33, 24, 13), "matmul", "silu", False, {}),
         ((130, 72, 40), "linear", "sigmoid", True, {"block_m": 128, "block_n": 64}),
         ((96, 36, 64), "matmul", "gelu", False, {"block_k": 16, "stages": 4})]


@pytest.mark.parametrize("shape,op,act,bias,params", CASES,
                         ids=["linear_gelu", "matmul_silu", "linear_sigmoid_128", "matmul_k16"])
def test_the_gated_unit_runs_in_the_gemm_and_matches_torch_emulated(shape, op, act, bias, params):
    M, H, K = shape
    p = gated(M, H, K, op, act, bias)
    ks = generate_kernel(p, list(p.nodes), name="glu", params={"form": "gemm-3xtf32", "portable": True, **params})
    assert "glu_col" in ks.source and "gated unit" in ks.schedule
    assert ks.grid[0] == -(-H // (int(ks.params["block_n"]) // 2))      # each tile holds half its columns of each
    for draw in range(2):
        torch.manual_seed(draw)
        got, want = emulated(p, ks, [torch.randn(M, K)])
        assert got.shape == (M, H)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("params", [{}, {"block_m": 128, "block_n": 128, "warps_m": 2, "warps_n": 4}],
                         ids=["default", "128x128"])
def test_the_gated_unit_compiles_without_spills(params):
    p = gated(8192, 1280, 320)     # SD 1.5's GEGLU projection
    ks = generate_kernel(p, list(p.nodes), name="glu_c", params={"form": "gemm-3xtf32", **params})
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and [ln for ln in c.log.splitlines() if "warning" in ln] == []


@pytest.mark.parametrize("halves,why", [(((0, 30), (50, None)), "two halves along dim 1"),
                                        (((0, None), (20, 60)), "two halves along dim 1")],
                         ids=["unequal", "overlapping"])
def test_other_slices_of_the_output_are_refused(halves, why):
    p = gated(64, 40, 32, halves=halves)
    with pytest.raises(CodegenError, match=why):
        generate_kernel(p, list(p.nodes), name="glu_x", params={"form": "gemm-3xtf32"})


def test_a_warp_tile_that_splits_a_fragment_pair_is_refused():
    p = gated(64, 40, 32)
    with pytest.raises(CodegenError, match="multiple of 16"):
        generate_kernel(p, list(p.nodes), name="glu_w", params={"form": "gemm-3xtf32", "block_n": 64, "warps_n": 8,
                                                                  "warps_m": 1, "block_m": 16})


def test_the_planner_puts_the_gated_unit_in_the_matmuls_region_with_the_tile_form_beside():
    from agent_core.codegen import region_io
    from agent_core.codegen.gemm_mma import alternatives
    from agent_core.planner import plan_program
    p = gated(4096, 1280, 320)
    regs = [r for r in plan_program(p).regions if r.status != "rejected"]
    assert [r.kind for r in regs] == ["matmul_epilogue"] and set(regs[0].nodes) == set(p.nodes)
    assert "tile-GEMM kernel (gemm-3xtf32)" in regs[0].reason
    assert alternatives(p, region_io(p, regs[0].nodes))[0]["form"] == "gemm-3xtf32"
    # slices that are not the two halves keep the matmul apart: no kernel would take them together
    other = gated(4096, 40, 320, halves=((0, 30), (50, None)))
    assert all(len(r.nodes) == 1 or "linear" not in [other.nodes[n].op for n in r.nodes]
               for r in plan_program(other).regions if r.status != "rejected")


def gated_conv(x_shape, cout2, kernel, padding=0, groups=1):
    """x -> conv{d}d (+ bias) to 2C channels -> value, gate = chunk(2, dim=1) -> value * sigmoid(gate)
    (Conformer's GLU after its pointwise conv, with any kernel)."""
    d = len(kernel)
    rng = np.random.default_rng(0)
    p = Program("gated_conv")
    x = p.add_input("x", x_shape)
    fan = x_shape[1] * int(np.prod(kernel))
    bound = 1 / np.sqrt(fan)
    w = p.add_parameter("w", rng.uniform(-bound, bound, (cout2, x_shape[1] // groups, *kernel)).astype(np.float32))
    b = p.add_parameter("b", rng.uniform(-bound, bound, cout2).astype(np.float32))
    y = p.add_node(f"conv{d}d", [x.id, w.id, b.id], {"padding": [padding] * d, "groups": groups}).outputs[0]
    c = cout2 // 2
    value = p.add_node("slice", [y], {"dim": 1, "start": 0, "end": c}).outputs[0]
    gate = p.add_node("slice", [y], {"dim": 1, "start": c, "end": cout2}).outputs[0]
    p.mark_output(p.add_node("mul", [value, p.add_node("sigmoid", [gate]).outputs[0]]).outputs[0])
    return p


@pytest.mark.parametrize("x_shape,cout2,kernel,padding,params", [
    ((3, 20, 37), 48, (1,), 0, {}),                                    # Conformer's pointwise conv + GLU
    ((2, 5, 9, 11), 40, (3, 3), 1, {})],
    ids=["conv1d_1x1", "conv2d_3x3"])
def test_a_gated_unit_over_a_convolutions_channels_runs_in_the_implicit_gemm(x_shape, cout2, kernel, padding, params):
    p = gated_conv(x_shape, cout2, kernel, padding)
    ks = generate_kernel(p, list(p.nodes), name="glu_conv", params={"form": "gemm-3xtf32", "portable": True, **params})
    assert "gated unit" in ks.schedule and "implicit-GEMM" in ks.schedule
    for draw in range(2):
        torch.manual_seed(draw)
        got, want = emulated(p, ks, [torch.randn(x_shape)])
        assert got.shape[1] == cout2 // 2
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_planner_puts_a_convolutions_gated_unit_in_its_region():
    from agent_core.planner import plan_program
    p = gated_conv((32, 64, 400), 256, (1,))
    regs = [r for r in plan_program(p).regions if r.status != "rejected"]
    assert [r.kind for r in regs] == ["conv_epilogue"] and set(regs[0].nodes) == set(p.nodes)
    assert "implicit-GEMM kernel" in regs[0].reason
    grouped = gated_conv((32, 64, 400), 256, (1,), groups=2)   # its channels are not one GEMM's columns
    assert all(len(r.nodes) == 1 or "conv1d" not in [grouped.nodes[n].op for n in r.nodes]
               for r in plan_program(grouped).regions if r.status != "rejected")
