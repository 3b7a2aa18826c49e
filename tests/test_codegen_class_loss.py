"""Class losses as one kernel (the row graph: rowgraph.py, rowpick.py, rowkernel.py): cross_entropy as its lowering writes it
(log_softmax -> nll_loss, label smoothing's sums over the classes, weights, ignore_index, mean / sum /
none) and log_softmax -> nll_loss over the channel axis generate one kernel that reads the logits once
and reduces the loss in the same launch; binary_cross_entropy_with_logits is a pointwise element; the
planner groups the chain and proposes only regions that generate.

CPU: generation + NVRTC compile for sm_90 without a warning or a spill, and `agent_core.cli plan --json`
run as a subprocess on the blocks. GPU (@pytest.mark.gpu): the kernels against torch at
atol = rtol = 1e-4 on 5 draws, deterministic across launches, ignored and out-of-range labels.
"""
import math
import re
import shutil
import subprocess

import pytest
import torch

from agent_core.codegen import CodegenError, can_lower, generate_kernel
from agent_core.ir import Program
from agent_core.rewrites.engine import rewrite_program
from agent_core.rewrites.lowering import lower_all
from tests import planned
from tests.programs import nll_program, ptx_of



def lowered(p: Program, check=False) -> Program:
    """The lowering applied; check: only where it matches the op's reference on random draws (CPU)."""
    return rewrite_program(p, rules=[lower_all], check=check).program


def ce_program(shape, reduction="mean", weight=False, ignore_index=-100, smoothing=0.0, label_mask=False):
    """cross_entropy of logits `shape` ([N, C] or [N, C, d...]) against int64 labels drawn in [0, C)
    (an ignore_index inside that range is drawn too); label_mask: labels = where(mask == 1, labels, -100)
    first, as the LLaMA blocks do. Lowered: (program, every node id)."""
    classes = shape[1]
    tshape = (shape[0], *shape[2:])
    p = Program("ce")
    x = p.add_input("logits", shape)
    t = p.add_input("labels", tshape, "int64", init={"kind": "randint", "low": 0, "high": classes})
    lab = t.id
    if label_mask:
        m = p.add_input("mask", tshape, "int64", init={"kind": "randint", "low": 0, "high": 2})
        one = p.add_node("full_like", [m.id], {"fill_value": 1}).outputs[0]
        eq = p.add_node("eq", [m.id, one]).outputs[0]
        fill = p.add_node("full_like", [t.id], {"fill_value": -100}).outputs[0]
        lab = p.add_node("where", [eq, t.id, fill]).outputs[0]
    ins = [x.id, lab]
    if weight:
        ins.append(p.add_parameter("class_weight", shape=[classes]).id)
    n = p.add_node("cross_entropy", ins, {"reduction": reduction, "ignore_index": ignore_index,
                                          "label_smoothing": smoothing})
    p.mark_output(n.outputs[0])
    q = lowered(p)
    return q, q.topo_order()


def log_softmax_nll_program(shape, reduction="mean", weight=False):
    """log_softmax over dim 1, then nll_loss: the FCN / DeepLab way (classes on dim 1 of [N, C, H, W])."""
    p = Program("lsnll")
    x = p.add_input("logits", shape)
    t = p.add_input("labels", (shape[0], *shape[2:]), "int64", init={"kind": "randint", "low": 0, "high": shape[1]})
    ls = p.add_node("log_softmax", [x.id], {"dim": 1})
    ins = [ls.outputs[0], t.id] + ([p.add_parameter("class_weight", shape=[shape[1]]).id] if weight else [])
    n = p.add_node("nll_loss", ins, {"reduction": reduction, "ignore_index": -100})
    p.mark_output(n.outputs[0])
    return p, [ls.id, n.id]


def bce_program(shape, pos_weight=False, weight=False, reduction="mean"):
    p = Program("bce")
    x = p.add_input("logits", shape)
    t = p.add_input("targets", shape, init={"kind": "uniform"})
    ins = [x.id, t.id]
    if weight or pos_weight:
        ins.append(p.add_parameter("weight", shape=shape[-1:]).id if weight else None)
    if pos_weight:
        ins.append(p.add_parameter("pos_weight", shape=shape[-1:]).id)
    n = p.add_node("binary_cross_entropy_with_logits", ins, {"reduction": reduction})
    p.mark_output(n.outputs[0])
    q = lowered(p, check=True)       # the pointwise element equals torch's op on the CPU, or it stays
    return q, q.topo_order()


def compiled_clean(ks):
    from agent_core.compiler import compile_kernel
    c = compile_kernel(ks, arch="sm_90")
    warnings = [ln for ln in c.log.splitlines() if "warning" in ln]
    assert warnings == [], "\n".join(warnings)
    assert c.spill_stores == 0, c.summary()
    return c


# (shape, schedule facts): classes innermost with C % 4 == 0 and not, a small and a 128k vocabulary,
# classes on dim 1 with spatial positions
CE_SHAPES = [((32, 320), True), ((16, 19), False), ((8, 1001), False), ((4, 128256), True), ((2, 19, 8, 16), False),
             ((3, 7, 5), False)]
CE_IDS = ["NC_vec", "NC_19", "NC_odd", "vocab128k", "NCHW", "NCd_odd"]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape,vec", CE_SHAPES, ids=CE_IDS)
@pytest.mark.parametrize("weight,ignore,smoothing", [(False, -100, 0.0), (True, 1, 0.0), (False, 2, 0.1),
                                                     (True, -100, 0.2)],
                         ids=["plain", "weight_ignore", "smooth_ignore", "weight_smooth"])
def test_cross_entropy_is_one_kernel_that_compiles(shape, vec, reduction, weight, ignore, smoothing):
    p, ids = ce_program(shape, reduction, weight, ignore, smoothing)
    assert can_lower(p, ids) is None
    ks = generate_kernel(p, ids, name="ce")
    assert ks.kind == "row_reduction"
    src = ks.source
    # the log-probabilities are never written: the only outputs are the loss
    assert ks.outputs == list(p.outputs)
    assert ("reinterpret_cast<const float4*>(logits" in src) == vec
    assert re.search(r">= 0 && \w+ < kCols\) \?", src)               # no read out of bounds
    assert f"!= {ignore}LL)" in src                                 # whether the label counts
    assert ("class_weight[" in src) == weight
    if reduction == "none":
        assert not ks.workspace and "atomicAdd" not in src
    else:
        assert ks.workspace and "atomicAdd(&counters[0], 1u) == gridDim.x - 1" in src
        assert ks.grid[0] * ks.block[0] >= 1
    # each logit is read once: the memory floor counts the logits once and no [rows, C] output
    logits = p.values[p.inputs[0]]
    assert ks.bytes_moved < 2 * logits.nbytes
    compiled_clean(ks)


def test_label_prologue_and_deeplab_layout_fuse_in():
    p, ids = ce_program((2, 19, 4, 8), "mean", label_mask=True)
    ks = generate_kernel(p, ids, name="ce_masked")
    assert ks.kind == "row_reduction" and "mask[" in ks.source and "kInner = 32;" in ks.source
    compiled_clean(ks)
    q, qids = log_softmax_nll_program((2, 19, 8, 16), "mean", weight=True)
    ks = generate_kernel(q, qids, name="lsnll")
    assert ks.kind == "row_reduction" and "* kInner]" in ks.source
    compiled_clean(ks)


def test_refusals_name_the_reason():
    # a log_softmax over another dim than nll_loss's classes
    q = Program("q")
    x = q.add_input("x", (4, 5, 6))
    t = q.add_input("t", (4, 6), "int64")
    ls = q.add_node("log_softmax", [x.id], {"dim": 2})
    n = q.add_node("nll_loss", [ls.outputs[0], t.id], {"reduction": "mean", "ignore_index": -100})
    q.mark_output(n.outputs[0])
    assert "reduce different rows" in can_lower(q, [ls.id, n.id])


# --- a lone nll_loss: the chain without its log_softmax step ------------------------------------
NLL_SHAPES = [(16, 10), (4, 5, 3, 2), (7,), (4096, 1000)]


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weight", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("shape", NLL_SHAPES, ids=["NC", "NCd", "C", "big_NC"])
def test_lone_nll_loss_gathers_one_element_per_row(shape, reduction, weight):
    """log-probabilities computed elsewhere: no row is walked (no log-sum-exp), one thread per row reads
    its label and that label's element, and the loss is reduced in the same launch."""
    p, nid = nll_program(shape, reduction, weight)
    ks = generate_kernel(p, [nid], name=f"nll_{reduction}")
    assert ks.kind == "row_reduction" and ks.params["rounds"] == 0       # no row walked
    assert ks.params["threads_per_row"] == 1 and ks.params["vector_width"] == 1
    src = ks.source
    assert "const long long* __restrict__ target" in src and "!= -100LL)" in src
    assert not re.search(r"\b(fold_maxsumexp|expf|logf)\b", src)              # no log-sum-exp
    assert ("class_weight[" in src) == weight
    assert re.search(r">= 0 && \w+ < kCols\) \?", src)                         # no read out of bounds
    assert ("row % 6]" in src) == (len(shape) > 2)                             # classes on dim 1
    rows = math.prod(shape) // (shape[0] if len(shape) == 1 else shape[1])
    assert ks.grid == (math.ceil(rows / 256), 1, 1) and ks.block == (256, 1, 1)
    if reduction == "none":
        assert not ks.workspace and "atomicAdd" not in src
    else:
        assert ks.workspace and "atomicAdd(&counters[0], 1u) == gridDim.x - 1" in src
        # the mean divides by the summed weights
        assert bool(re.search(r"loss_total_s / \w+_weight_total_s", src)) == (reduction == "mean")
    # the memory floor: each row's label and one log-probability, the weight, the loss
    v = p.values
    t, out = v[p.inputs[1]], v[p.outputs[0]]
    w = v[p.nodes[nid].inputs[2]].nbytes if weight else 0
    assert ks.bytes_moved == t.nbytes + 4 * rows + w + out.nbytes
    compiled_clean(ks)


def test_lone_nll_loss_ignore_index_inputs_order_and_label_dtypes():
    p, nid = nll_program((8, 5), "mean", weight=True, ignore_index=3)
    ks = generate_kernel(p, [nid], name="nll_ig")
    assert "!= 3LL)" in ks.source           # the ignore_index reaches the kernel
    # kernel arguments follow the region's inputs (log-probabilities, targets, the weight), then the loss
    sig = re.search(r"nll_ig\((.*)\) \{", ks.source).group(1)
    assert [a.split()[-1] for a in sig.split(", ")] == ["logp", "target", "class_weight", "nll_loss",
                                                        "workspace", "counters"]
    # int32 labels are read as they are (torch's reference takes them as int64 class indices)
    q = Program("t32")
    lp = q.add_input("logp", (4, 5))
    t = q.add_input("target", (4,), "int32", init={"kind": "randint", "low": 0, "high": 5})
    n = q.add_node("nll_loss", [lp.id, t.id], {"reduction": "sum", "ignore_index": -100})
    q.mark_output(n.outputs[0])
    ks = generate_kernel(q, [n.id], name="t32")
    assert "const int* __restrict__ target" in ks.source
    compiled_clean(ks)
    # float64 log-probabilities would be computed in float32: refused, naming the value
    d = Program("f64")
    lp = d.add_input("logp", (4, 5), "float64")
    t = d.add_input("target", (4,), "int64")
    n = d.add_node("nll_loss", [lp.id, t.id], {"reduction": "sum", "ignore_index": -100})
    d.mark_output(n.outputs[0])
    with pytest.raises(CodegenError, match="float64.* reads float32"):
        generate_kernel(d, [n.id], name="f64")


def test_lone_nll_loss_tuning_variants_change_rows_per_block():
    from agent_core.agent.tune import tune_space
    p, nid = nll_program((4096, 1000), "mean", weight=True)
    ks = generate_kernel(p, [nid], name="nll_tune")
    variants = [v for v in tune_space(ks) if "block" in v]
    assert {v["block"] for v in variants} == {128, 512}
    for v in variants:
        kv = generate_kernel(p, [nid], name="nll_tune", params=v)
        assert kv.params["rows_per_block"] == v["block"] and kv.params["threads_per_row"] == 1
        compiled_clean(kv)


def emulated_nll(shape, reduction, weight, ignore_index, targets=None):
    """The lone nll_loss kernel run on the CPU (agent_core.writer.emulate: g++, one thread per CUDA
    thread, every block), its buffers fenced by canaries: (the loss, torch's, the kernel)."""
    import numpy as np
    import torch.nn.functional as F
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import CANARY, guarded, payload
    guard = 64
    p, nid = nll_program(shape, reduction, weight, ignore_index)
    ks = generate_kernel(p, [nid], name=f"emu_nll_{reduction}")
    classes = shape[0] if len(shape) == 1 else shape[1]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g).log_softmax(0 if len(shape) == 1 else 1)
    t = torch.randint(0, classes, () if len(shape) == 1 else (shape[0], *shape[2:]), generator=g)
    t = t if targets is None else targets
    w = torch.rand(classes, generator=g) + 0.5
    arrays = {p.inputs[0]: x.numpy(), p.inputs[1]: t.numpy(), **({p.nodes[nid].inputs[2]: w.numpy()} if weight else {})}
    out = p.values[ks.outputs[0]]
    bufs = [guarded(arrays[v], guard) for v in ks.inputs] + [guarded(np.full(out.shape, 7.0, np.float32), guard)]
    bufs += [guarded(np.zeros(n, np.float32 if dt == "float32" else np.int32), guard) for dt, n in ks.workspace]
    (res,) = CpuExecutor().run(ks, [bufs], guard=guard)
    assert all((b[:guard] == CANARY).all() and (b[-guard:] == CANARY).all() for b in res), "wrote outside a buffer"
    got = torch.from_numpy(payload(res[len(ks.inputs)], guard, np.float32, out.shape).copy())
    xx, tt = (x[None], t[None]) if len(shape) == 1 else (x, t)
    ref = F.nll_loss(xx, tt.clamp(0, classes - 1), w if weight else None, ignore_index=ignore_index, reduction=reduction)
    return got, (ref[0] if len(shape) == 1 and reduction == "none" else ref), ks


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("shape,reduction,weight,ignore_index", [
    ((4, 5, 3, 2), "mean", True, 1), ((600, 9), "sum", True, -100), ((600, 9), "mean", False, 2),
    ((7,), "none", True, -100)], ids=["NCd_mean", "three_blocks_sum", "three_blocks_mean", "C_none"])
def test_lone_nll_loss_under_cpu_emulation_matches_torch(shape, reduction, weight, ignore_index):
    """Numerics without a GPU: the kernel itself, every block and thread (the last block adding the
    blocks' partials), equals torch's nll_loss and writes nothing outside its buffers."""
    got, ref, ks = emulated_nll(shape, reduction, weight, ignore_index)
    assert ks.grid[0] == (3 if shape == (600, 9) else 1)
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (got, ref)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_lone_nll_loss_under_cpu_emulation_out_of_range_and_all_ignored():
    """torch raises on a class outside [0, C); the kernel gives NaN there and reads nothing out of
    bounds. Every target ignored: mean is 0 / 0 = NaN, as torch."""
    t = torch.tensor([0, 5, 4, -1, 1 << 40, 3])
    got, ref, _ = emulated_nll((6, 5), "none", False, 2, targets=t)
    assert torch.isnan(got[[1, 3, 4]]).all() and torch.allclose(got[[0, 2, 5]], ref[[0, 2, 5]])
    got, ref, _ = emulated_nll((6, 5), "mean", False, 2, targets=torch.full((6,), 2))
    assert torch.isnan(got) and torch.isnan(ref)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_lone_nll_loss_compiles_with_nvcc_without_warnings(tmp_path):
    from tests.test_codegen_indexed import NVCC_FLAGS
    for k, (shape, reduction, weight) in enumerate([((4, 5, 3, 2), "none", True), ((16, 10), "mean", False),
                                                    ((7,), "sum", True)]):
        p, nid = nll_program(shape, reduction, weight)
        cu = tmp_path / f"nll{k}.cu"
        cu.write_text(generate_kernel(p, [nid], name=f"nvcc_nll{k}").source)
        r = subprocess.run(["nvcc", *NVCC_FLAGS, str(cu), "-o", str(cu.with_suffix(".o"))],
                           capture_output=True, text=True)
        log = (r.stdout + r.stderr).strip()
        assert r.returncode == 0 and "warning" not in log, f"{shape} {reduction}:\n{log}"


@pytest.mark.parametrize("pos_weight,weight,reduction", [(False, False, "none"), (True, False, "none"),
                                                         (False, True, "sum"), (True, True, "mean")])
def test_bce_with_logits_is_pointwise(pos_weight, weight, reduction):
    p, ids = bce_program((6, 40), pos_weight, weight, reduction)
    ops = [p.nodes[n].op for n in ids]
    assert ("bce_with_logits_pos" if pos_weight else "bce_with_logits") in ops
    assert "binary_cross_entropy_with_logits" not in ops
    ks = generate_kernel(p, ids, name="bce")
    assert ks.kind == ("pointwise" if reduction == "none" else "row_reduction")
    assert "log1pf(expf(-fabsf(" in ks.source
    compiled_clean(ks)


# --- the planner, as `stitchcuda plan` runs it (tests/planned.py) --------------------------------
# kernels before this work: two kernels for log_softmax and nll_loss (eight with label smoothing), and
# binary_cross_entropy_with_logits through torch
BLOCKS = {"cross_entropy_llama2_32k": 3, "cross_entropy_llama3_128k_smoothing": 8,
          "log_softmax_nll_deeplab_cityscapes": 2, "sigmoid_focal_loss_retinanet": 4}


@pytest.mark.parametrize("block", BLOCKS)
def test_blocks_plan_fewer_kernels_and_every_region_generates(block):
    d, p = planned.plan(planned.block(block))
    assert d["estimate"]["kernels_planned"] < BLOCKS[block]
    ops = {n.op for n in p.nodes.values()}
    assert "binary_cross_entropy_with_logits" not in ops and "cross_entropy" not in ops
    kinds = []
    for r in d["regions"]:
        if r["status"] == "rejected" or all(p.nodes[n].op in ("reshape", "view", "flatten") for n in r["nodes"]):
            continue
        ks = generate_kernel(p, r["nodes"], name=f"{block}_{r['id']}", kind=r["kind"])
        compiled_clean(ks)
        kinds.append(ks.kind)
    if "sigmoid" not in block:
        # log_softmax and nll_loss are in one kernel: the log-probabilities are never written
        soft = [r for r in d["regions"] if any(p.nodes[n].op == "log_softmax" for n in r["nodes"])]
        assert len(soft) == 1 and any(p.nodes[n].op == "nll_loss" for n in soft[0]["nodes"])
        assert "row_reduction" in kinds


# --- at the sizes the blocks run ------------------------------------------------------------------


def row_loop(ptx: str) -> list[str]:
    """The PTX lines of the loop that streams the logits: from the label the first vector load sits
    under to the branch back to it."""
    lines = ptx.splitlines()
    first = next(i for i, ln in enumerate(lines) if "ld.global.nc.v4.f32" in ln)
    head = next(i for i in range(first, -1, -1) if lines[i].startswith("$L__"))
    label = lines[head].rstrip(":")
    back = next(i for i in range(first, len(lines)) if re.search(rf"\bbra(\.uni)?\s+{re.escape(label)};", lines[i]))
    return lines[head:back + 1]


def test_llama2_vocabulary_streams_at_the_memory_floor(tmp_path):
    """LLaMA-2's [4096, 32000] logits with the masked labels: 512 lanes per row (3 blocks share an SM
    instead of one block of 1024 lanes each folding one float4 at a time), each lane issues 4 float4
    loads before it folds any, one exp per logit plus one rescale per step, no local memory, no spill."""
    p, ids = ce_program((4096, 32000), "mean", label_mask=True)
    ks = generate_kernel(p, ids, name="ce_llama2")
    assert ks.kind == "row_reduction" and ks.grid == (4096, 1, 1) and ks.block == (512, 1, 1)
    assert ks.params["threads_per_row"] == 512 and ks.params["vector_width"] == 4 and ks.params["unroll"] == 4
    assert "mask[" in ks.source                         # the label's where runs once per row, in this kernel
    c = compiled_clean(ks)
    assert c.registers <= 40, c.summary()                # 3 blocks of 512 threads fit an SM's registers
    ptx = ptx_of(ks, tmp_path)
    loop = row_loop(ptx)
    loads = [i for i, ln in enumerate(loop) if "ld.global.nc.v4.f32" in ln]
    exps = [i for i, ln in enumerate(loop) if "ex2.approx" in ln]
    assert len(loads) == 4 and len(exps) == 4 * 4 + 1     # kStep exps and one rescale per step
    assert max(loads) < min(exps)                         # every load in flight before the first exp
    assert "ld.local" not in ptx and "st.local" not in ptx


def test_class_loss_tuning_variants_all_build():
    from agent_core.agent.tune import tune_space
    for shape in ((4096, 32000), (2, 19, 8, 16), (16, 1001)):
        p, ids = ce_program(shape, "mean", label_mask=len(shape) == 2)
        ks = generate_kernel(p, ids, name="ce_tune")
        variants = tune_space(ks)
        assert variants
        for v in variants:
            kv = generate_kernel(p, ids, name="ce_tune", params=v)
            assert kv.params != ks.params
            compiled_clean(kv)


def test_a_reshape_between_the_label_op_and_the_loss_does_not_split_them():
    """labels = where(mask == 1, labels, -100), then labels.view(-1) into log_softmax -> nll_loss: the
    views-only group ties with either neighbour, so the label op and the loss share one kernel."""
    from agent_core.planner import plan_program
    p = Program("masked_ce")
    x = p.add_input("logits", (2, 8, 40))
    t = p.add_input("labels", (2, 8), "int64", init={"kind": "randint", "low": 0, "high": 40})
    m = p.add_input("mask", (2, 8), "int64", init={"kind": "randint", "low": 0, "high": 2})
    one = p.add_node("full_like", [m.id], {"fill_value": 1}).outputs[0]
    eq = p.add_node("eq", [m.id, one]).outputs[0]
    fill = p.add_node("full_like", [t.id], {"fill_value": -100}).outputs[0]
    lab = p.add_node("where", [eq, t.id, fill]).outputs[0]
    flat_t = p.add_node("reshape", [lab], {"shape": [16]}).outputs[0]
    flat_x = p.add_node("reshape", [x.id], {"shape": [16, 40]}).outputs[0]
    ls = p.add_node("log_softmax", [flat_x], {"dim": 1}).outputs[0]
    loss = p.add_node("nll_loss", [ls, flat_t], {"reduction": "mean", "ignore_index": -100})
    p.mark_output(loss.outputs[0])
    plan = plan_program(p)
    assert plan.kernels == 1, [(r.kind, [p.nodes[n].op for n in r.nodes], r.reason) for r in plan.active]
    (r,) = [r for r in plan.active if any(p.nodes[n].op == "where" for n in r.nodes)]
    assert {p.nodes[n].op for n in r.nodes} >= {"eq", "where", "reshape", "log_softmax", "nll_loss"}
    ks = generate_kernel(p, r.nodes, name="masked_ce", kind=r.kind)
    assert ks.kind == "row_reduction"
    compiled_clean(ks)


def plan_full_size(block):
    """`plan --json --no-check` at the block's real size (its rewrites kept unchecked: checking runs the
    1 GB reference): the JSON and the rewritten program with its regions."""
    return planned.plan(planned.block(block), small=False, check=False)


@pytest.mark.parametrize("block", ["cross_entropy_llama2_32k", "cross_entropy_llama3_128k_smoothing"])
def test_llama_cross_entropy_blocks_are_one_kernel_at_full_size(block):
    """The label op (`where(mask == 1, labels, -100)`), the views, log_softmax, nll_loss and (label
    smoothing) the sums and the mean: one region, one launch (Inductor: 2), that generates."""
    d, p = plan_full_size(block)
    assert d["estimate"]["kernels_planned"] == 1, [(r["kind"], r["reason"]) for r in d["regions"]]
    (r,) = [r for r in d["regions"] if r["status"] != "rejected" and r["schedule"].get("launches", 1)]
    ops = {p.nodes[n].op for n in r["nodes"]}
    assert {"eq", "where", "log_softmax", "nll_loss"} <= ops
    ks = generate_kernel(p, r["nodes"], name=block, kind=r["kind"])
    assert ks.kind == "row_reduction" and ks.params["threads_per_row"] == 512
    compiled_clean(ks)


def rms_residual_program(shape, eps=1e-5):
    """The LLaMA pre-norm step: residual = hidden + residual; weight * (residual * rsqrt(mean(residual^2) + eps)),
    both returned (the block's ops as the importer records them)."""
    p = Program("rms_residual")
    h, r = p.add_input("hidden", shape), p.add_input("residual", shape)
    w = p.add_parameter("weight", shape=shape[-1:])
    add = p.add_node("add", [h.id, r.id]).outputs[0]
    sq = p.add_node("square", [add]).outputs[0]
    var = p.add_node("mean", [sq], {"dim": [-1], "keepdim": True}).outputs[0]
    inv = p.add_node("rsqrt", [p.add_node("add_scalar", [var], {"value": eps}).outputs[0]]).outputs[0]
    normed = p.add_node("mul", [add, inv]).outputs[0]
    out = p.add_node("mul", [w.id, normed]).outputs[0]
    p.mark_output(out)
    p.mark_output(add)
    return p, p.topo_order()


def test_rmsnorm_residual_block_is_one_kernel_that_reads_each_input_once(tmp_path):
    """The residual add, the norm and the weight: one region (the norm's epilogue reads the add's output,
    which the row graph keeps in registers), hidden and residual each read once with float4s, the
    weight one float4 per 4 outputs, both outputs written with float4s, 4 blocks of 512 threads per SM."""
    d, p = plan_full_size("rmsnorm_residual_llama7b")
    assert d["estimate"]["kernels_planned"] == 1, [(r["kind"], r["reason"]) for r in d["regions"]]
    (r,) = [r for r in d["regions"] if r["status"] != "rejected"]
    assert {p.nodes[n].op for n in r["nodes"]} == {"add", "square", "mean", "add_scalar", "rsqrt", "mul"}
    ks = generate_kernel(p, r["nodes"], name="rms_residual", kind=r["kind"])
    row_bytes = 4096 * 4096 * 4
    assert ks.bytes_moved == 4 * row_bytes + 4096 * 4          # two inputs read once, two outputs, the weight
    assert ks.block == (512, 1, 1) and ks.grid == (4096, 1, 1)
    c = compiled_clean(ks)
    assert c.registers <= 32, c.summary()                        # 4 blocks of 512 threads per SM
    ptx = ptx_of(ks, tmp_path)
    items = 4096 // (512 * 4)
    assert len(re.findall(r"ld\.global\.nc\.v4\.f32", ptx)) == 3 * items    # hidden, residual, weight
    assert "ld.global.nc.f32" not in ptx and "ld.local" not in ptx
    assert len(re.findall(r"st\.global\.v4\.f32", ptx)) == 2 * items
    q, ids = rms_residual_program((2, 2048, 4096))
    assert generate_kernel(q, ids, name="rms_residual_built").source.count("reinterpret_cast<const float4*>") == 3


# --- on the GPU -----------------------------------------------------------------------------------
gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _fused(p, ids, name, **kw):
    from tests.programs import fused
    return fused(p, ids, name, **kw)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(64, 320), (37, 19), (16, 1001), (8, 32000), (4, 128256), (2, 19, 32, 40),
                                   (3, 7, 5)], ids=["NC", "NC19", "odd", "vocab32k", "vocab128k", "NCHW", "NCd"])
@pytest.mark.parametrize("weight,ignore,smoothing", [(False, -100, 0.0), (True, 1, 0.0), (False, 2, 0.1),
                                                     (True, -100, 0.2)],
                         ids=["plain", "weight_ignore", "smooth_ignore", "weight_smooth"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_cross_entropy_matches_torch(shape, reduction, weight, ignore, smoothing):
    p, ids = ce_program(shape, reduction, weight, ignore, smoothing)
    _fused(p, ids, "ce_gpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_masked_labels_deeplab_and_determinism():
    import torch.nn.functional as F
    p, ids = ce_program((4, 1000), "mean", label_mask=True)
    _fused(p, ids, "ce_masked_gpu")
    q, qids = log_softmax_nll_program((2, 19, 64, 128), "mean", weight=True)
    r = _fused(q, qids, "lsnll_gpu")
    x = 3 * torch.randn(2, 19, 64, 128, device="cuda")
    t = torch.randint(0, 19, (2, 64, 128), device="cuda")
    from agent_core.rewrites.engine import param_array
    wid = q.nodes[qids[1]].inputs[2]
    w = (torch.rand(19) if wid in r.inputs else torch.from_numpy(param_array(q, wid)).float()).cuda()
    ins = {q.inputs[0]: x, q.inputs[1]: t, wid: w}
    args = [ins[v] for v in r.inputs]
    first = r(args)[0].clone()
    for _ in range(3):                         # the last block adds the blocks' sums in a fixed order
        assert torch.equal(r(args)[0], first)
    assert torch.allclose(first, F.nll_loss(F.log_softmax(x, 1), t, w), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_ignored_and_out_of_range_labels():
    import torch.nn.functional as F
    p, ids = ce_program((6, 50), "mean")
    r = _fused(p, ids, "ce_ignored_gpu")
    x = torch.randn(6, 50, device="cuda")
    t = torch.full((6,), -100, device="cuda")
    assert torch.isnan(r([x, t])[0]).all()                                 # 0 / 0, as torch
    t = torch.tensor([0, -100, 49, 3, -100, 7], device="cuda")
    assert torch.allclose(r([x, t])[0], F.cross_entropy(x, t), atol=1e-5)
    t[2] = 50                                                              # torch raises; NaN here
    assert torch.isnan(r([x, t])[0]).all()


@pytest.mark.parametrize("pos_weight,weight,reduction", [(False, False, "none"), (True, False, "none"),
                                                         (False, True, "sum"), (True, True, "mean")])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_bce_with_logits_matches_torch(pos_weight, weight, reduction):
    p, ids = bce_program((300, 80), pos_weight, weight, reduction)
    _fused(p, ids, "bce_gpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("params", [None, {"threads_per_row": 1024}, {"threads_per_row": 256}, {"unroll": 2},
                                    {"unroll": 8}], ids=["default", "tpr1024", "tpr256", "unroll2", "unroll8"])
def test_gpu_llama2_masked_cross_entropy_and_its_variants(params):
    """The LLaMA-2 block's kernel at its real size (labels masked to -100 in the same kernel), every
    tuning variant, against torch at 1e-4 on 5 draws."""
    p, ids = ce_program((4096, 32000), "mean", label_mask=True)
    _fused(p, ids, "ce_llama2_gpu", params=params)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_infinite_logits_step_as_torch():
    """-inf logits (a masked vocabulary), a row that is -inf but for one class, a row whose chunks start
    with -inf: the per-step shift never forms inf - inf."""
    import torch.nn.functional as F
    p, ids = ce_program((8, 2000), "none")
    r = _fused(p, ids, "ce_inf_gpu")
    x = 4 * torch.randn(8, 2000, device="cuda")
    x[0, 1000:] = -float("inf")
    x[1, :] = -float("inf")
    x[1, 1999] = 3.0
    x[2, :1024] = -float("inf")
    t = torch.tensor([5, 1999, 1500, 0, 1, 2, 3, 1999], device="cuda")
    got, want = r([x, t])[0], F.cross_entropy(x, t, reduction="none")
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape", [(2, 2048, 4096), (3, 5, 1000), (64, 256), (4, 20000)],
                         ids=["llama7b", "warp_rows", "narrow", "streamed"])
def test_gpu_rmsnorm_residual_matches_torch(shape):
    p, ids = rms_residual_program(shape)
    _fused(p, ids, "rms_residual_gpu")
