"""The planner fuses layout ops with views (slice, chunk pieces, cat, transpose, embedding, ...) with their
pointwise neighbours into one layout-graph kernel (issue #14), asks codegen before it does, and costs
the kernel that runs: the bytes read once (a slice only the part it keeps) plus the bytes written.

CPU: the blocks planned through `python -m agent_core.cli plan --json` in a subprocess reach their
kernel counts, and every region they propose generates and compiles with NVRTC for sm_90; small
programs show what fuses and what does not. GPU (`-m gpu`): the planned regions of the RoPE and
SwiGLU blocks at their real sizes, and of the small programs, match torch at atol = rtol = 1e-4.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from agent_core.analysis.gpu import H200
from agent_core.codegen import can_lower, generate_kernel
from agent_core.ir import Program
from agent_core.planner import plan_program
from tests import planned

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = ROOT / "benchmarks" / "blocks"
# kernels planned at the test sizes (before layout fusion: 10, 16, 3, 7, 3 and 3; before layout ops
# joined row kernels and sibling layout graphs shared one: 2, 2, 1, 1, 2 and 2)
KERNELS = {"rope_qk_llama7b": 1, "rope_partial_gptneox_pythia": 1, "swiglu_gate_llama7b": 1,
           "detect_decode_yolov5": 1, "vit_patch_embed_pos_layernorm": 1, "embedding_position_layernorm_bert": 1}


def _generates_and_compiles(p: Program, regions) -> list:
    from agent_core.compiler import compile_kernel
    kernels = []
    for r in regions:
        if r.schedule["runs"] in ("alias", "library"):
            continue
        assert r.schedule["runs"] in ("kernel", "library+kernel"), (r.id, r.reason)
        ks = generate_kernel(p, r.nodes, name=f"{p.name}_{r.id}", kind=r.kind)
        compile_kernel(ks, arch="sm_90")
        kernels.append(ks)
    return kernels


@pytest.mark.parametrize("block", sorted(KERNELS))
def test_block_plans_layout_ops_into_their_neighbours_kernels(block):
    plan, p = planned.plan(planned.block(block))
    assert plan["kernels"] == KERNELS[block], [(r["kind"], r["reason"]) for r in plan["regions"]]
    active = [r for r in p.regions if r.status != "rejected"]
    kernels = _generates_and_compiles(p, active)
    assert sum(r.schedule["launches"] for r in active) == KERNELS[block]
    # the layout ops run in a layout-graph kernel, or in the prologue of the row kernel they feed
    moving = [r for r in active if any(p.nodes[n].op in ("slice", "cat", "transpose", "embedding") for n in r.nodes)]
    assert moving
    for r in moving:
        ks = next(k for k in kernels if set(k.node_ids) == set(r.nodes))
        assert ks.kind == ("layout" if r.kind == "layout" else "row_reduction"), (r.kind, ks.kind)
        assert r.reason.startswith("stitches "), r.reason
        assert " into one kernel" in r.reason or "one warp per row" in r.reason


def test_rope_q_and_k_are_one_kernel_reading_cos_and_sin_once():
    plan, p = planned.plan(planned.block("rope_qk_llama7b"))
    active = [r for r in p.regions if r.status != "rejected"]
    assert len(active) == 1
    r = active[0]
    ops = sorted(p.nodes[n].op for n in r.nodes)
    assert ops == sorted(["add", "cat", "mul", "mul", "neg", "slice", "slice"] * 2), ops
    assert r.kind == "layout" and r.schedule["runs"] == "kernel" and r.schedule["launches"] == 1
    assert "slice, neg, cat" in r.reason and "and add over 4096 elements into one kernel" in r.reason
    # q and k (16 KB each) read once, cos and sin (2 KB each) once for both, both results written
    assert r.est_after_ms == pytest.approx(_roofline(2 * 16384 + 2048 + 2048 + 2 * 16384), abs=2e-6)
    ks = generate_kernel(p, r.nodes, name="rope_qk", kind=r.kind)
    assert len(ks.outputs) == 2 and ks.params["vector"] == 4


def _roofline(nbytes):
    return H200.launch_ms(True) + nbytes / H200.bytes_per_ms


def _regions(p):
    plan = plan_program(p)
    _generates_and_compiles(p, plan.active)
    return plan, {frozenset(p.nodes[n].op for n in r.nodes): r for r in plan.active}


def slice_broadcast():
    """A slice of half of x broadcast into a larger add: the add loops over 4x the slice's elements."""
    p = Program("slice_broadcast")
    x = p.add_input("x", (64, 256))
    z = p.add_input("z", (4, 64, 128))
    s = p.add_node("slice", [x.id], {"dim": 1, "start": 0, "end": 128})
    a = p.add_node("add", [s.outputs[0], z.id])
    p.mark_output(a.outputs[0])
    return p


def cat_of_pointwise():
    p = Program("cat_of_pointwise")
    x = p.add_input("x", (64, 128))
    y = p.add_input("y", (32, 128))
    a = p.add_node("relu", [x.id])
    b = p.add_node("sigmoid", [y.id])
    c = p.add_node("cat", [a.outputs[0], b.outputs[0]], {"dim": 0})
    p.mark_output(c.outputs[0])
    return p


def chunk_mul():
    p = Program("chunk_mul")
    x = p.add_input("x", (64, 256))
    c = p.add_node("chunk", [x.id], {"chunks": 2, "dim": -1})
    m = p.add_node("mul", [c.outputs[0], c.outputs[1]])
    p.mark_output(m.outputs[0])
    return p


def sibling_slices():
    """Two halves of x, each through its own activation to its own output: siblings reading x."""
    p = Program("sibling_slices")
    x = p.add_input("x", (64, 256))
    for start, op in ((0, "relu"), (128, "sigmoid")):
        s = p.add_node("slice", [x.id], {"dim": 1, "start": start, "end": start + 128})
        p.mark_output(p.add_node(op, [s.outputs[0]]).outputs[0])
    return p


SMALL_PROGRAMS = [slice_broadcast, cat_of_pointwise, chunk_mul, sibling_slices]


def test_a_slice_fuses_into_a_pointwise_op_of_another_size_and_reads_only_its_half():
    p = slice_broadcast()
    plan, regs = _regions(p)
    assert plan.kernels == 1
    r = regs[frozenset({"slice", "add"})]
    assert r.kind == "layout" and r.schedule["numel"] == 4 * 64 * 128
    # the half of x it keeps (32 KB), z and the result (128 KB each), one launch
    assert r.est_after_ms == pytest.approx(_roofline(64 * 128 * 4 + 2 * 4 * 64 * 128 * 4), abs=2e-6)
    assert r.reason.startswith("stitches slice and add over 33K elements into one kernel")


def test_a_cat_of_two_pointwise_results_is_one_kernel():
    plan, regs = _regions(cat_of_pointwise())
    assert plan.kernels == 1 and regs[frozenset({"relu", "sigmoid", "cat"})].kind == "layout"


def test_a_chunk_whose_pieces_feed_one_mul_is_one_kernel():
    plan, regs = _regions(chunk_mul())
    r = regs[frozenset({"chunk", "mul"})]
    assert plan.kernels == 1 and r.kind == "layout"
    assert r.est_after_ms == pytest.approx(_roofline(64 * 256 * 4 + 64 * 128 * 4), abs=2e-6)


def test_sibling_slices_of_one_input_share_a_kernel_that_reads_it_once():
    plan, regs = _regions(sibling_slices())
    r = regs[frozenset({"slice", "relu", "sigmoid"})]
    assert plan.kernels == 1 and len(r.nodes) == 4
    # x (64 KB) read once, both halves written (32 KB each)
    assert r.est_after_ms == pytest.approx(_roofline(64 * 256 * 4 + 2 * 64 * 128 * 4), abs=2e-6)


def test_siblings_writing_outputs_of_different_sizes_stay_apart():
    p = Program("siblings_apart")
    x = p.add_input("x", (64, 256))
    s = p.add_node("slice", [x.id], {"dim": 1, "start": 0, "end": 16})
    p.mark_output(p.add_node("relu", [s.outputs[0]]).outputs[0])
    p.mark_output(p.add_node("sigmoid", [x.id]).outputs[0])
    plan, regs = _regions(p)
    assert plan.kernels == 2 and frozenset({"slice", "relu"}) in regs and frozenset({"sigmoid"}) in regs


def test_a_permute_feeding_a_row_reduction_is_one_kernel():
    p = Program("permute_sum")
    x = p.add_input("x", (8, 16, 32))
    pe = p.add_node("permute", [x.id], {"dims": [0, 2, 1]})
    s = p.add_node("sum", [pe.outputs[0]], {"dim": [-1]})
    p.mark_output(s.outputs[0])
    assert can_lower(p, [pe.id, s.id], "reduction") is None
    plan, regs = _regions(p)
    assert plan.kernels == 1 and regs[frozenset({"permute", "sum"})].kind == "reduction"


def test_a_layout_op_after_a_reduction_is_not_proposed_with_it():
    """The row kernel reads layout ops in its prologue only: softmax -> slice stays two kernels, and
    the planner says why in codegen's words."""
    p = Program("softmax_slice")
    x = p.add_input("x", (8, 16, 32))
    sm = p.add_node("softmax", [x.id], {"dim": -1})
    sl = p.add_node("slice", [sm.outputs[0]], {"dim": 1, "start": 0, "end": 8})
    p.mark_output(sl.outputs[0])
    why = can_lower(p, [sm.id, sl.id], "normalization")
    assert why is not None and "layout op after" in why
    plan, regs = _regions(p)
    assert plan.kernels == 2 and frozenset({"slice"}) in regs


def test_a_layout_op_stays_out_of_a_convolution_epilogue():
    p = Program("conv_slice")
    x = p.add_input("x", (2, 3, 16, 16))
    w = p.add_parameter("w", shape=(8, 3, 3, 3))
    cv = p.add_node("conv2d", [x.id, w.id], {"padding": [1]})
    s = p.add_node("slice", [cv.outputs[0]], {"dim": 1, "start": 0, "end": 4})
    p.mark_output(p.add_node("relu", [s.outputs[0]]).outputs[0])
    plan, regs = _regions(p)
    assert frozenset({"slice", "relu"}) in regs and regs[frozenset({"conv2d"})].schedule["runs"] == "library"
    assert any("epilogue takes pointwise ops only, not slice" in e["message"] for e in plan.log)


def _rope_stack(n_nodes: int) -> Program:
    """RoPE applied again and again to its own result (7 nodes a step)."""
    p = Program("rope_stack")
    shape = (4, 64, 128)
    cos, sin = (p.add_parameter(n, shape=shape[-2:]).id for n in ("cos", "sin"))
    x = p.add_input("x", shape).id
    while len(p.nodes) < n_nodes:
        a = p.add_node("slice", [x], {"dim": -1, "start": 64, "end": None}).outputs[0]
        b = p.add_node("slice", [x], {"dim": -1, "start": 0, "end": 64}).outputs[0]
        a = p.add_node("neg", [a]).outputs[0]
        r = p.add_node("mul", [p.add_node("cat", [a, b], {"dim": -1}).outputs[0], sin]).outputs[0]
        x = p.add_node("add", [p.add_node("mul", [x, cos]).outputs[0], r]).outputs[0]
    p.mark_output(x)
    return p


def test_a_5000_node_program_of_layout_ops_plans_quickly():
    p = _rope_stack(5000)
    plan = plan_program(p)
    # the op budget (40 a kernel) cuts the stack: about 6 RoPE steps a kernel, none alone
    assert plan.kernels <= len(p.nodes) // 25 and all(r.kind == "layout" for r in plan.active)
    assert plan.seconds < 10, plan.seconds      # about 2 s on a loaded 2-core machine


# --- on the GPU ---------------------------------------------------------------------------------------

def _planned_regions_match_torch(p: Program, kernels: int | None = None):
    from tests.programs import fused       # build_region: compile, load, verify 5 draws at 1e-4
    plan = plan_program(p)
    if kernels is not None:
        assert plan.kernels == kernels
    for r in plan.active:
        if r.schedule["runs"] == "kernel":
            fused(p, list(r.nodes), f"{p.name}_{r.id}", kind=r.kind)


@pytest.mark.gpu
@pytest.mark.parametrize("block,kernels", [("rope_qk_llama7b", 1), ("swiglu_gate_llama7b", 1),
                                          ("vit_patch_embed_pos_layernorm", 1),
                                          ("embedding_position_layernorm_bert", 1)])
def test_gpu_planned_block_regions_match_torch_at_real_size(block, kernels, monkeypatch):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from agent_core.importers import import_file
    monkeypatch.delenv("STITCHCUDA_BLOCKS_SMALL", raising=False)
    _planned_regions_match_torch(import_file(BLOCKS / f"{block}.py"), kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("build", SMALL_PROGRAMS, ids=lambda f: f.__name__)
def test_gpu_planned_small_program_regions_match_torch(build):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _planned_regions_match_torch(build(), 1)
