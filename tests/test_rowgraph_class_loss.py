"""Class losses in the row graph (rowpick.py, rowgraph.row_total): nll_loss picks the label's element of
each row as a per-row value, and its sum / mean are totals over every row, so cross entropy as its
lowering writes it (log_softmax -> nll_loss, label smoothing's sums over the classes, class weights,
ignore_index, masked labels) is one row-graph kernel. The class_loss.py template was deleted
(issue #14's "migrate, then delete").

CPU: generated, compiled with NVRTC for sm_90, and run on the CPU emulator (every thread of every
block, buffers fenced by canaries) against torch at 1e-5.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.codegen.region_io import region_io
from agent_core.codegen.rowkernel import generate_multi_reduction
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from agent_core.reference import run_reference
from tests import planned
from tests.programs import nll_program
from tests.test_codegen_class_loss import ce_program, log_softmax_nll_program
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx


def _inputs(p: Program, classes: int, seed: int = 0, labels=None):
    """Logits ~ 3 N(0, 1), labels in [0, classes) (or `labels`), a 0/1 mask for the other integers."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for v in p.inputs:
        val = p.values[v]
        if val.dtype == "float32":
            out.append(torch.randn(val.shape, generator=g) * 3)
        elif labels is not None and val.name in ("labels", "target"):
            out.append(labels)
        else:
            hi = 2 if val.name == "mask" else classes
            out.append(torch.randint(0, hi, val.shape, generator=g).to(getattr(torch, val.dtype)))
    return out


def _emulated(p, ids, ins, params=None):
    """(the row graph's kernel, its emulated outputs, torch's values) for the region `ids`."""
    ks = generate_multi_reduction(p, region_io(p, ids), "loss", params)
    compile_kernel(ks, arch="sm_90")
    env = run_reference(p, ins, keep=True)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env, ks=ks)
    return ks, outs, env


def _assert_equal(outs, env):
    for v, got in outs.items():
        torch.testing.assert_close(got, env[v].float(), atol=1e-5, rtol=1e-5, equal_nan=True)


@needs_gxx
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape,weight,ignore,smoothing,mask", [
    ((64, 320), False, -100, 0.0, False),      # warp rows, float4 loads
    ((16, 1001), True, 1, 0.1, False),         # odd vocabulary, weights, an ignore_index inside [0, C), smoothing
    ((8, 3000), False, -100, 0.1, True),       # block rows, labels where(mask == 1, labels, -100)
    ((2, 19, 4, 8), True, -100, 0.0, True),    # classes on dim 1 of [N, C, H, W]: column rows
], ids=["warp", "weighted_smoothed", "block_masked", "NCHW_masked"])
def test_cross_entropy_is_one_row_graph_kernel_equal_to_torch(shape, weight, ignore, smoothing, mask, reduction):
    p, ids = ce_program(shape, reduction, weight=weight, ignore_index=ignore, smoothing=smoothing, label_mask=mask)
    ks, outs, env = _emulated(p, ids, _inputs(p, shape[1]))
    _assert_equal(outs, env)
    # the label's logit is one load per row, never the log-probabilities per element
    assert "at the label" in ks.source and ("NAN" in ks.source)
    assert ("totals" in ks.source) == (reduction != "none")


@needs_gxx
@pytest.mark.parametrize("params", [None, {"split": 3}], ids=["streamed", "split_row"])
def test_a_long_vocabulary_streams_or_splits_each_row_with_the_same_loss(params):
    """20000 classes: one block of 1024 threads streams each row (online log-sum-exp), or each row
    in 3 chunks over several blocks whose last combines them; with smoothing and weights."""
    p, ids = ce_program((3, 20000), "mean", weight=True, ignore_index=7, smoothing=0.1)
    ks, outs, env = _emulated(p, ids, _inputs(p, 20000), params)
    assert ks.params["schedule"] == ("split_row" if params else "stream")
    _assert_equal(outs, env)


def test_a_long_vocabulary_over_a_cluster_compiles():
    """The cluster schedule (sm_90; the emulator runs no clusters): each CTA of the row computes the
    label's loss, only rank 0's lane 0 publishes it."""
    p, ids = ce_program((4, 128256), "mean", smoothing=0.1)
    ks = generate_multi_reduction(p, region_io(p, ids), "loss", {"cluster": 4, "split": 1})
    assert ks.params["cluster"] == 4 and "lane == 0" in ks.source
    compile_kernel(ks, arch="sm_90")


@needs_gxx
@pytest.mark.parametrize("shape,reduction,ignore", [((37, 19), "mean", 2), ((600, 9), "sum", -100),
                                                    ((7,), "none", -100), ((4, 5, 3, 2), "mean", 1)],
                         ids=["NC_mean", "three_blocks_sum", "C_none", "NCd_mean"])
def test_a_lone_nll_loss_reads_one_element_per_row(shape, reduction, ignore):
    """log-probabilities from elsewhere: a thread per row loads its label's element and weight;
    nothing walks the rows."""
    p, nid = nll_program(shape, reduction, weight=True, ignore_index=ignore)
    classes = shape[0] if len(shape) == 1 else shape[1]
    ks, outs, env = _emulated(p, [nid], _inputs(p, classes))
    assert ks.params["threads_per_row"] == 1 and ks.params["rounds"] == 0
    _assert_equal(outs, env)
    # the memory floor: each row's label and one log-probability, the weight, the loss
    v = p.values
    rows = len(env[p.inputs[1]].flatten())
    weight = v[p.nodes[nid].inputs[2]].nbytes
    assert ks.bytes_moved == v[p.inputs[1]].nbytes + 4 * rows + weight + v[p.outputs[0]].nbytes


def test_the_row_graphs_class_losses_compile_with_nvcc_without_a_warning_or_a_spill(tmp_path):
    """A lone nll_loss (no row walked: no row base either) and a 1001-class cross entropy a warp holds
    in registers (its lanes' slots past the row zeroed, or ptxas spills 16 B)."""
    import subprocess

    from agent_core.codegen.cuda import prune_unused
    from tests.test_codegen_indexed import NVCC_FLAGS
    p, nid = nll_program((4, 5, 3, 2), "none", weight=True)
    q, qids = ce_program((8, 1001), "none", True, 2, 0.1)
    for k, (prog, ids) in enumerate([(p, [nid]), (q, qids)]):
        ks = generate_multi_reduction(prog, region_io(prog, ids), f"nvcc_{k}")
        cu = tmp_path / f"k{k}.cu"
        cu.write_text(prune_unused(ks.source))       # as generate_kernel hands it on
        r = subprocess.run(["nvcc", *NVCC_FLAGS, "-Xptxas", "-v", str(cu), "-o", str(cu.with_suffix(".o"))],
                           capture_output=True, text=True)
        log = (r.stdout + r.stderr).strip()
        assert r.returncode == 0 and "warning" not in log, log
        assert " 0 bytes spill stores" in log, log


@needs_gxx
def test_labels_outside_the_classes_give_nan_and_read_nothing_out_of_bounds():
    """torch raises on a class outside [0, C); the kernel gives NaN there (its loads are guarded; the
    canaries around every buffer stay intact). Every label ignored: mean is 0 / 0 = NaN, as torch."""
    def run(reduction, labels):
        p, nid = nll_program((6, 5), reduction, ignore_index=2)
        ks = generate_multi_reduction(p, region_io(p, [nid]), "loss")
        env = dict(zip(p.inputs, _inputs(p, 5, labels=labels)))     # torch would raise: no reference run
        _, outs = _emulate_region(p, SimpleNamespace(nodes=[nid], id="r"), env, ks=ks)
        return outs[p.nodes[nid].outputs[0]], env[p.inputs[0]]
    got, x = run("none", torch.tensor([0, 5, 4, -1, 1 << 40, 2]))
    assert torch.isnan(got[[1, 3, 4]]).all() and got[5] == 0
    assert torch.allclose(got[[0, 2]], -x[[0, 2], [0, 4]])
    got, _ = run("mean", torch.full((6,), 2))
    assert torch.isnan(got)


@needs_gxx
def test_log_probabilities_used_outside_are_written_beside_the_loss():
    """The log-probabilities returned beside the loss: the row graph writes them per element and the
    loss in the same kernel."""
    p, ids = log_softmax_nll_program((8, 10), "none")
    logp = p.nodes[ids[0]].outputs[0]
    p.mark_output(logp)
    ks = generate_kernel(p, ids, name="logp_and_loss")
    assert ks.kind == "row_reduction" and set(ks.outputs) == {logp, p.nodes[ids[1]].outputs[0]}
    env = run_reference(p, _inputs(p, 10), keep=True)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env, ks=ks)
    _assert_equal(outs, env)


@needs_gxx
def test_log_probabilities_and_each_next_tokens_gathered_are_one_planned_kernel(tmp_path):
    """GPT-2's per-token log-probabilities: log_softmax over the vocabulary, then gather of each next
    token's (an RLHF log-prob pass). The gather along the rows with one index per row is a pick, so the
    planner (asking the backend) groups them: one kernel writes the log-probabilities and the gathered
    values, equal to torch."""
    from agent_core.reference import draw
    _, p = planned.plan(planned.block("log_softmax_tokens_gpt2"), small=True)
    kernels = [r for r in p.regions if r.schedule.get("runs") == "kernel"]
    assert len(kernels) == 1 and {p.nodes[n].op for n in kernels[0].nodes} >= {"log_softmax", "gather"}, p.regions
    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(p.values[v].shape, generator=g) * 4 if p.values[v].dtype == "float32" else
           draw(p.values[v].shape, p.values[v].dtype, p.values[v].init, g) for v in p.inputs]
    env = run_reference(p, ins, keep=True)
    ks, outs = _emulate_region(p, kernels[0], env)
    assert ks.kind == "row_reduction" and len(outs) == 2
    _assert_equal(outs, env)


def _after_rows(op, attrs, shape=(2, 3, 4, 6)):
    """x -> max over the last dim -> `op` (a layout op of the per-row values) -> output."""
    p = Program("after")
    x = p.add_input("x", shape)
    m = p.add_node("max", [x.id], {"dim": [-1], "keepdim": False})
    lay = p.add_node(op, [m.outputs[0]], attrs)
    p.mark_output(lay.outputs[0])
    return p, [m.id, lay.id]


@needs_gxx
@pytest.mark.parametrize("op,attrs", [("permute", {"dims": [2, 0, 1]}), ("reshape", {"shape": [6, 4]}),
                                      ("transpose", {"dim0": 0, "dim1": 2})])
def test_per_row_values_leave_through_a_layout_op_at_its_offsets(op, attrs):
    """A per-row result permuted, transposed or reshaped on its way out: each row stores its value
    where the layout op puts it (layout_store's inverse view at the row's index), no second kernel."""
    p, ids = _after_rows(op, attrs)
    ks, outs, env = _emulated(p, ids, _inputs(p, 1))
    _assert_equal(outs, env)


def test_a_gather_across_the_rows_is_refused_with_the_reason():
    """gather along a dim that is not the reduced one reads other rows' elements: not a pick."""
    p = Program("across")
    x = p.add_input("x", (4, 8))
    t = p.add_input("t", (1, 8), "int64")
    ls = p.add_node("log_softmax", [x.id], {"dim": -1})
    gt = p.add_node("gather", [ls.outputs[0], t.id], {"dim": 0})
    p.mark_output(gt.outputs[0])
    with pytest.raises(CodegenError, match="layout op after .*gathers one element of each row"):
        generate_multi_reduction(p, region_io(p, [ls.id, gt.id]), "across")


@needs_gxx
def test_clips_cross_entropy_over_columns_reads_down_them_in_its_own_kernel(tmp_path):
    """CLIP's symmetric loss: cross entropy over the logits' rows and over their columns (logits.t()),
    averaged. The column loss is lowered onto the logits themselves, a softmax down each column
    (rewrites/lowering.py): read row by row through the transpose, each element took a 32-byte sector
    (H100: both losses in one row kernel 233 us for 67 MB). So each loss is a kernel of its own, the
    column one a column schedule after the matmul; the whole plan, emulated kernel by kernel, equals
    torch."""
    from tests.test_codegen_column_tiles import _emulate_plan, _emulate_region
    _, p = planned.plan(planned.block("clip_contrastive_loss"), small=True)
    loss = [r for r in p.regions if any(p.nodes[n].op == "nll_loss" for n in r.nodes)]
    assert len(loss) == 2 and not any(p.nodes[n].op == "permute" for r in loss for n in r.nodes)
    soft = [p.nodes[n] for r in loss for n in r.nodes if p.nodes[n].op == "log_softmax"]
    assert sorted(len(p.values[s.inputs[0]].shape) for s in soft) == [2, 3]    # rows; [1, C, N] down the columns
    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(p.values[v].shape, generator=g) for v in p.inputs]
    env = run_reference(p, ins, keep=True)
    for r in loss:          # each loss kernel (the column one the matmul's epilogue) on the reference's inputs
        ks, outs = _emulate_region(p, r, env)
        assert ks.params["schedule"] in ("column", "block", "warp"), ks.params
        for v, got in outs.items():
            torch.testing.assert_close(got, env[v], atol=1e-5, rtol=1e-5)
    kernels, outs = _emulate_plan(p, ins)       # the plan's kernels chained (the epilogue's from torch)
    assert len(kernels) == 3
    torch.testing.assert_close(outs[0], run_reference(p, ins)[p.values[p.outputs[0]].name], atol=1e-5, rtol=1e-5)


@needs_gxx
def test_a_masked_mean_of_per_token_log_probabilities_is_one_planned_kernel():
    """An RLHF / DPO log-prob pass: log_softmax over the vocabulary, each label's log-probability
    (gather), times the attention mask, summed over every token and divided by the mask's sum. The
    planner merges the totals of per-row values with the rows (planner/fusion.py), and the row graph
    writes it as one kernel: picks, then two totals combined by the last block, equal to torch."""
    from agent_core.planner import plan_program
    B, L, V = 2, 8, 50
    p = Program("token_logprob_mean")
    x = p.add_input("logits", (B, L, V))
    t = p.add_input("labels", (B, L), "int64")
    m = p.add_input("mask", (B, L))
    ls = p.add_node("log_softmax", [x.id], {"dim": -1})
    u = p.add_node("unsqueeze", [t.id], {"dim": -1})
    g = p.add_node("gather", [ls.outputs[0], u.outputs[0]], {"dim": -1})
    sq = p.add_node("squeeze", [g.outputs[0]], {"dim": -1})
    mul = p.add_node("mul", [sq.outputs[0], m.id])
    s1 = p.add_node("sum", [mul.outputs[0]], {"dim": None, "keepdim": False})
    s2 = p.add_node("sum", [m.id], {"dim": None, "keepdim": False})
    d = p.add_node("div", [s1.outputs[0], s2.outputs[0]])
    p.mark_output(d.outputs[0])
    (region,) = [r for r in plan_program(p).active if r.schedule.get("runs") == "kernel"]
    assert len(region.nodes) == len(p.nodes)
    gen = torch.Generator().manual_seed(0)
    ins = [torch.randn(B, L, V, generator=gen) * 3, torch.randint(0, V, (B, L), generator=gen),
           (torch.rand(B, L, generator=gen) < 0.7).float()]
    env = run_reference(p, ins, keep=True)
    ks, outs = _emulate_region(p, region, env)
    assert "totals" in ks.source
    _assert_equal(outs, env)


@needs_gxx
@pytest.mark.parametrize("block", ["logsumexp_zloss_olmo", "sigmoid_focal_loss_retinanet"])
def test_losses_averaged_over_per_row_values_plan_as_one_kernel(block, tmp_path):
    """OLMo's z-loss (the mean over tokens of logsumexp(logits)^2) and RetinaNet's focal loss (summed
    per anchor, then over every anchor): the totals of per-row values join the rows' kernel, so the
    whole plan is one kernel, emulated equal to torch."""
    from tests.test_codegen_column_tiles import _emulate_plan
    _, p = planned.plan(planned.block(block), small=True)
    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(p.values[v].shape, generator=g) for v in p.inputs]
    kernels, outs = _emulate_plan(p, ins)
    assert len(kernels) == 1 and "totals" in kernels[0].source
    ref = run_reference(p, ins)
    for got, v in zip(outs, p.outputs):
        torch.testing.assert_close(got, ref[p.values[v].name], atol=1e-5, rtol=1e-5)
