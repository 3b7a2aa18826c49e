"""The real-world blocks where we had launched more kernels than Inductor (issue #14), planned as
`stitchcuda plan` plans them (tests/planned.py): each now plans into the kernels below, every region
generates and compiles for sm_90, and the schedules that made that possible are checked on their own:

- a broadcast op before a reduction (BERT's extended attention mask on [B, 1, 1, S]) joins the
  softmax's row kernel, its int64 mask read 4 lanes at a time;
- a pointwise op between a library call and a larger loop (squeeze-excitation's sigmoid) joins the
  larger loop instead of becoming the call's epilogue kernel: one launch fewer;
- a reduction over every element after a row chain (KL's batchmean sum after its softmaxes) is
  folded per row and finished by the row kernel's last block, in the same launch;
- a permute / transpose / reshape after a row kernel's reductions (Qwen3's QK-norm, heads moved in
  front of the sequence) is written through its view by the row kernel (codegen/layout_store.py).

The GPU side (tests/gpu/test_gpu_block_kernels.py) checks the same kernels against torch.
"""

import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.codegen.layout_store import split_output_views
from agent_core.codegen.region_io import region_io
from agent_core.ir import Program
from tests import planned
from tests.programs import add_chain


# block -> (kernels planned before this change at a93e164 / 23a4f6e^, kernels now): CPU `plan` output
BLOCK_KERNELS = {"qk_rmsnorm_qwen3": (4, 2), "masked_softmax_bert_base": (3, 1),
                 "squeeze_excitation_efficientnet_b0": (6, 5), "kl_div_distill_distilbert": (2, 1),
                 # the 8 dot products in one row kernel, then the softmax, top-2 and its renormalisation
                 # (rewrites/thin_cat.py) in another, its cats stored piece by piece
                 "router_top2_mixtral": (6, 2),
                 # norm in the row graph: normalize is one row kernel after the two pooling sums
                 "masked_mean_pool_normalize_minilm": (4, 3)}


@pytest.mark.parametrize("block", BLOCK_KERNELS)
def test_block_plans_into_fewer_kernels_and_each_region_compiles(block):
    from agent_core.compiler import compile_kernel
    plan, program = planned.plan(planned.block(block))
    assert plan["kernels"] == BLOCK_KERNELS[block][1], [(r["kind"], r["nodes"]) for r in plan["regions"]]
    for r in program.regions:
        if r.schedule.get("runs") in ("library", "torch", "alias"):
            assert r.schedule["runs"] == "library", (r.id, r.reason)     # nothing falls back to torch
            continue
        compile_kernel(generate_kernel(program, r.nodes, name=r.id), arch="sm_90")


def test_qk_norm_writes_its_transpose_from_the_row_kernel():
    plan, program = planned.plan(planned.block("qk_rmsnorm_qwen3"))
    for r in program.regions:
        ops = [program.nodes[n].op for n in r.nodes]
        assert "transpose" in ops and "mean" in ops, ops
        ks = generate_kernel(program, r.nodes, name=r.id)
        assert ks.kind == "row_reduction" and "rounds" in ks.params       # rowkernel's row graph
        # head_dim 32: runs of 4 stay together after the transpose, so the stores stay float4
        assert "reinterpret_cast<float4*>(" in ks.source


def test_the_masked_softmax_computes_its_masked_scores_once():
    """The int64 mask's (1 - mask) * -10000 added to the scores: computed once into the registers the
    row's passes read (the row graph's held prologue value), not again in each pass."""
    plan, program = planned.plan(planned.block("masked_softmax_bert_base"))
    (r,) = program.regions
    ks = generate_kernel(program, r.nodes, name=r.id)
    assert "float add_held[kItems * kVec];" in ks.source
    # computed in one pass (the mask read there); the softmax's passes read the held value
    assert ks.source.count("const float add = (") == 1
    assert ks.source.count("const float add = add_held[") >= 2


def test_squeeze_excitation_sigmoid_joins_the_scale_not_the_convolution():
    plan, program = planned.plan(planned.block("squeeze_excitation_efficientnet_b0"))
    by_op = {program.nodes[n].op: r for r in program.regions for n in r.nodes}
    assert by_op["sigmoid"] is by_op["mul"] and by_op["sigmoid"] is not by_op["conv2d"]
    assert [r.schedule["launches"] for r in program.regions if "conv2d" in
            [program.nodes[n].op for n in r.nodes]] == [2, 1]          # conv + silu epilogue; conv alone


# --- output views: the offsets the row kernel stores at -----------------------------------------

def _chain(shape, ops):
    """A row program: x -> softmax over the last dim -> `ops` (layout ops) -> output."""
    p = Program("chain")
    x = p.add_input("x", shape)
    n = p.add_node("softmax", [x.id], {"dim": -1})
    after, _ = add_chain(p, n.outputs[0], ops)
    return p, [n.id, *after]


CHAINS = [((2, 6, 4, 8), [("transpose", {"dim0": 1, "dim1": 2})]),
          ((2, 6, 4, 8), [("permute", {"dims": [2, 0, 1, 3]})]),
          ((3, 5, 7), [("permute", {"dims": [2, 1, 0]})]),
          ((2, 6, 4, 8), [("transpose", {"dim0": 1, "dim1": 2}), ("reshape", {"shape": [2, 4, 48]})]),
          ((4, 6, 10), [("reshape", {"shape": [4, 60]}), ("unsqueeze", {"dim": 0})]),
          ((4, 3, 8), [("transpose", {"dim0": -1, "dim1": 0})])]


@pytest.mark.parametrize("shape,ops", CHAINS, ids=lambda c: "x".join(map(str, c)) if isinstance(c[0], int) else
                         "-".join(o for o, _ in c))
def test_output_view_offsets_put_every_element_where_torch_does(shape, ops):
    """Evaluated as Python, the store offset of X's element i is where the layout ops put it in Y."""
    p, ids = _chain(shape, ops)
    rest, stores = split_output_views(p, region_io(p, ids))
    assert rest.nodes == ids[:1] and len(stores) == 1
    (ov,) = stores.values()
    x = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    y = x
    for op, a in ops:
        y = {"transpose": lambda t: t.transpose(a["dim0"], a["dim1"]), "permute": lambda t: t.permute(*a["dims"]),
             "reshape": lambda t: t.reshape(a["shape"]), "unsqueeze": lambda t: t.unsqueeze(a["dim"])}[op](y)
    flat_y = y.contiguous().flatten()
    text = ov.offset("i", lang="python")
    for i in range(x.numel()):
        assert flat_y[eval(text, {"i": i})] == i, (i, text)
    ks = generate_kernel(p, ids, name="chain")
    assert ks.kind == "row_reduction" and ks.outputs == [p.outputs[0]]


def test_a_layout_op_that_is_no_bijection_after_a_reduction_is_still_refused():
    p, ids = _chain((4, 8), [("slice", {"dim": 1, "start": 0, "end": 4})])
    from agent_core.codegen import can_lower
    assert "layout op after" in (can_lower(p, ids) or "")


def test_the_kl_sum_over_every_element_is_finished_by_the_row_kernels_last_block():
    plan, program = planned.plan(planned.block("kl_div_distill_distilbert"))
    (r,) = program.regions
    ks = generate_kernel(program, r.nodes, name=r.id)
    # the student's log_softmax, the teacher's softmax and log_softmax (log of the softmax, rewritten:
    # its folds shared with the softmax's), the sum
    assert ks.params["reductions"] == 4 and [w[0] for w in ks.workspace] == ["float32", "int32"]
    # two expf per element; the two logf are per row (the logs of the two sums of exp), none per element
    assert ks.source.count("expf(") == 2 and ks.source.count("logf(") == 2
    assert "atomicAdd(&counters[0], 1u) == gridDim.x - 1" in ks.source and "counters[0] = 0u" in ks.source
    assert "struct Totals { St_sum t0; };" in ks.source


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulator needs g++")
def test_the_kl_block_emulated_matches_torch():
    """The KL block at its small size (32 x 305), planned as `stitchcuda plan` plans it (the clamped log of the
    teacher's softmax rewritten to its log_softmax, whose folds the softmax's share), its one kernel on
    the CPU emulator, against the block's own torch forward over 3 draws at 1e-4; logits spread wide
    enough that some of the teacher's probabilities underflow the clamp."""
    import torch.nn.functional as F

    from tests.test_codegen_column_tiles import _draws, _emulate_plan
    _, p = planned.plan(planned.block("kl_div_distill_distilbert"))
    ops = [p.nodes[n].op for n in p.topo_order()]
    assert "log" not in ops and ops.count("log_softmax") == 2, ops
    for k, ins in enumerate(_draws(p, 3)):
        ins = [t * (60 if k == 2 else 1) for t in ins]
        kernels, (got,) = _emulate_plan(p, ins)
        student, teacher = ins
        want = F.kl_div(F.log_softmax(student / 2.0, -1), F.softmax(teacher / 2.0, -1), reduction="batchmean") * 4.0
        torch.testing.assert_close(got.reshape(()), want, atol=1e-4, rtol=1e-4)
    assert len(kernels) == 1


@pytest.mark.parametrize("schedule,shape", [("warp", (37, 203)), ("block", (9, 4096)), ("stream", (3, 40000)),
                                            ("column", (6, 50, 40))])
def test_a_total_beside_rows_compiles_in_every_row_schedule(schedule, shape):
    """softmax over the rows (dim 1 for the column case), then the mean of its product with x over
    every element: one kernel, the mean's kNumelF divisor, no spills."""
    from agent_core.compiler import compile_kernel
    p = Program("total")
    x = p.add_input("x", shape)
    sm = p.add_node("softmax", [x.id], {"dim": 1})
    m = p.add_node("mul", [sm.outputs[0], x.id])
    t = p.add_node("mean", [m.outputs[0]], {"dim": None, "keepdim": False})
    s = p.add_node("mul_scalar", [t.outputs[0]], {"value": 0.5})
    p.mark_output(s.outputs[0])
    ks = generate_kernel(p, [sm.id, m.id, t.id, s.id], name="total")
    assert ks.params["schedule"] == schedule and "kNumelF" in ks.source
    ck = compile_kernel(ks, arch="sm_90")
    assert ck.spill_stores == 0 and ck.spill_loads == 0


def test_a_total_read_per_row_is_refused():
    p = Program("total_back")
    x = p.add_input("x", (8, 64))
    sm = p.add_node("softmax", [x.id], {"dim": -1})
    t = p.add_node("sum", [sm.outputs[0]], {"dim": None, "keepdim": False})
    d = p.add_node("div", [sm.outputs[0], t.outputs[0]])
    p.mark_output(d.outputs[0])
    from agent_core.codegen import can_lower
    assert "needs every row first" in (can_lower(p, [sm.id, t.id, d.id]) or "")
