"""Several reductions over the same rows in one kernel (codegen/rowgraph.py + codegen/rowkernel.py):
sibling statistics of one tensor, var and mean with a pointwise of both, softmax and log_softmax of
two inputs feeding a KL expression, layer_norm chained into softmax. On the CPU each generates and
compiles (NVRTC, sm_90, no spills) at a warp-size row, a block-size row, a row whose length is not a
multiple of 4, a streamed long row and a column (strided) reduction; the planner puts the
statistics blocks in fewer kernels than one per reduction. On the GPU (`-m gpu`) each kernel matches
torch at atol = rtol = 1e-4 over several draws, including rows with -inf and large values.
"""
import math
import re

import numpy as np
import pytest
import torch

from agent_core.codegen import CodegenError, can_lower, generate_kernel
from agent_core.ir import Program
from tests import planned
from tests.programs import kl_terms, row_stats



def var_mean(shape, dim=-1):
    """var and mean (keepdim) of one row, the row standardised with both, and their product per row."""
    p = Program("var_mean")
    x = p.add_input("x", shape)
    v = p.add_node("var", [x.id], {"dim": [dim], "keepdim": True})
    m = p.add_node("mean", [x.id], {"dim": [dim], "keepdim": True})
    d = p.add_node("sub", [x.id, m.outputs[0]])
    e = p.add_node("add_scalar", [v.outputs[0]], {"value": 1e-5})
    r = p.add_node("rsqrt", [e.outputs[0]])
    z = p.add_node("mul", [d.outputs[0], r.outputs[0]])
    q = p.add_node("mul", [m.outputs[0], v.outputs[0]])
    p.mark_output(z.outputs[0])
    p.mark_output(q.outputs[0])
    return p, [v.id, m.id, d.id, e.id, r.id, z.id, q.id]


def ln_softmax(shape):
    """layer_norm (weight, bias) of the row, then softmax of its output over the same row."""
    p = Program("ln_softmax")
    x = p.add_input("x", shape)
    w = p.add_parameter("weight", shape=shape[-1:])
    b = p.add_parameter("bias", shape=shape[-1:])
    ln = p.add_node("layer_norm", [x.id, w.id, b.id], {"normalized_shape": [shape[-1]]})
    sm = p.add_node("softmax", [ln.outputs[0]], {"dim": -1})
    p.mark_output(sm.outputs[0])
    return p, [ln.id, sm.id]


BUILDERS = {"stats": row_stats, "var_mean": var_mean, "kl_terms": kl_terms, "ln_softmax": ln_softmax}
# (row length, the schedule it takes): a warp-size row, a block-size row, rows not a multiple of 4, a
# row streamed from memory for every round
LENGTHS = [(32, "warp"), (1000, "warp"), (4096, "block"), (203, "warp"), (1027, "block"), (40000, "stream")]
CASES = [(b, n, s) for b in BUILDERS for n, s in LENGTHS]


def _case(builder, cols, rows=6):
    return BUILDERS[builder]((rows, cols))


@pytest.mark.parametrize("builder,cols,schedule", CASES, ids=[f"{b}-{n}" for b, n, _ in CASES])
def test_generates_one_kernel_and_compiles(builder, cols, schedule):
    from agent_core.compiler import compile_kernel
    p, ids = _case(builder, cols)
    assert can_lower(p, ids) is None
    ks = generate_kernel(p, ids, name=f"{builder}_{cols}")
    assert ks.kind == "row_reduction" and ks.params["schedule"] == schedule, ks.params
    assert ks.params["reductions"] >= 2 and ks.params["vector_width"] == (4 if cols % 4 == 0 else 1)
    assert ks.node_ids == [n for n in p.topo_order() if n in ids]
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0, c.summary()
    assert "warning" not in c.log, c.log


def test_sibling_reductions_share_one_all_reduce():
    """mean, max and min fold in one pass into one struct: one all-reduce round, the row read once."""
    p, ids = row_stats((8, 512))
    ks = generate_kernel(p, ids, name="stats")
    assert ks.params["rounds"] == 1 and ks.params["cached"]
    assert ks.source.count("reduce1(round1)") == 1 and "Round2" not in ks.source
    assert ks.source.count("reinterpret_cast<const float4*>(x") == 1


def test_chained_reductions_take_rounds_in_dependency_order():
    """layer_norm then softmax, from registers: mean, deviations, then the softmax's max and sum."""
    p, ids = ln_softmax((4, 768))
    ks = generate_kernel(p, ids, name="ln_softmax")
    assert ks.params["rounds"] == 4 and ks.params["cached"]
    s = ks.source
    assert s.index("reduce1(") < s.index("reduce2(") < s.index("reduce3(") < s.index("reduce4(")
    # a streamed row keeps online states: Welford, then max-sum-exp, two reads and the output pass
    p, ids = ln_softmax((4, 40000))
    ks = generate_kernel(p, ids, name="ln_softmax_long")
    assert ks.params["rounds"] == 2 and not ks.params["cached"]
    assert "fold_welford" in ks.source and "fold_block_maxsumexp" in ks.source


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulator needs g++")
@pytest.mark.parametrize("builder,cols", [("ln_softmax", 768), ("kl_terms", 512)])
def test_a_held_row_computes_each_exp_once_and_keeps_it_for_the_later_pass(builder, cols):
    """softmax's exp(x - max) is folded into the sum, then scaled into the output (or into the KL
    term): with the row in registers it is computed in the sum's pass and kept there, so the later
    pass reads it instead of calling expf again, and loads nothing it only needed for the exp. The
    kernel, emulated on the CPU, still matches torch on 2 draws."""
    from agent_core.reference import run_reference
    from tests.test_codegen_column_tiles import _emulate_region
    p, ids = BUILDERS[builder]((6, cols))
    ks = generate_kernel(p, ids, name=builder)
    assert ks.params["cached"], ks.params
    s = ks.source
    last = s[s.rindex("reduce"):]        # everything after the last all-reduce: the final pass
    assert "_kept[k * kVec + e];  // kept from an earlier pass" in last
    assert "expf(" not in last, "the final pass computes an exp it could read"
    if builder == "ln_softmax":     # the output is exp * 1 / sum: the norm's operands are not loaded again
        assert "weight" not in last.split("// the per-element outputs")[1]
    from types import SimpleNamespace
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ins = [torch.randn(p.values[v].shape, generator=g) * 3 for v in p.inputs]
        env = run_reference(p, ins, keep=True)
        region = SimpleNamespace(nodes=ids, id="r")
        _, outs = _emulate_region(p, region, env)
        for v, got in outs.items():
            torch.testing.assert_close(got, env[v], atol=1e-5, rtol=1e-5)


def entropy(shape):
    """softmax and log_softmax of one row (their folds are the same), then sum(p * log p) per row."""
    p = Program("entropy")
    x = p.add_input("x", shape)
    sm = p.add_node("softmax", [x.id], {"dim": -1})
    ls = p.add_node("log_softmax", [x.id], {"dim": -1})
    m = p.add_node("mul", [sm.outputs[0], ls.outputs[0]])
    h = p.add_node("sum", [m.outputs[0]], {"dim": [-1], "keepdim": False})
    p.mark_output(h.outputs[0])
    return p, [sm.id, ls.id, m.id, h.id]


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulator needs g++")
@pytest.mark.parametrize("cols,rounds", [(512, 3), (40000, 1)])
def test_two_reductions_of_one_row_in_the_same_state_share_their_folds(cols, rounds):
    """softmax and log_softmax of the same row need the same max and sum of exp: folded once (held:
    the max, then the sum, then the entropy's sum; streamed: one softdot state, whose max and sum of
    exp are the softmax's and whose weighted sum is the entropy's, tests/test_softmax_dot.py), one expf
    per element. Emulated on the CPU, it matches torch on 2 draws."""
    from types import SimpleNamespace

    from agent_core.codegen.cuda import Names
    from agent_core.codegen.region_io import region_io
    from agent_core.codegen.rowgraph import lower
    from agent_core.reference import run_reference
    from tests.test_codegen_column_tiles import _emulate_region
    p, ids = entropy((6, cols))
    ks = generate_kernel(p, ids, name="entropy")
    assert ks.params["rounds"] == rounds, ks.params
    if ks.params["cached"]:      # streamed, the online state's own rescales are expfs too
        assert ks.source.count("expf(") == 1
    for two_stage, states in ((True, ["max", "sum", "sum"]), (False, ["softdot"])):
        assert [st.state for st in lower(p, region_io(p, ids), Names(), two_stage).steps] == states
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ins = [torch.randn(p.values[v].shape, generator=g) * 3 for v in p.inputs]
        env = run_reference(p, ins, keep=True)
        _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env)
        for v, got in outs.items():
            torch.testing.assert_close(got, env[v], atol=1e-5, rtol=1e-5)


COLUMNS = [("stats", (64, 256), 0), ("stats", (33, 7, 50), 1), ("var_mean", (16, 512), 0),
           ("var_mean", (300, 65), 0)]


@pytest.mark.parametrize("builder,shape,dim", COLUMNS, ids=[f"{b}-{'x'.join(map(str, s))}" for b, s, _ in COLUMNS])
def test_column_reductions_generate(builder, shape, dim):
    from agent_core.compiler import compile_kernel
    p, ids = BUILDERS[builder](shape, dim)
    ks = generate_kernel(p, ids, name=f"col_{builder}")
    # 8 thread rows, or up to 32 where that holds a column written per element in registers
    assert ks.params["schedule"] == "column" and ks.block == (32, ks.params["tile_y"], 1)
    assert ks.params["tile_y"] in (8, 16, 32)
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0, c.summary()
    assert "warning" not in c.log, c.log


def test_reductions_over_different_rows_are_refused():
    p = Program("two_axes")
    x = p.add_input("x", (16, 32))
    a = p.add_node("sum", [x.id], {"dim": [0]})
    b = p.add_node("sum", [x.id], {"dim": [1]})
    p.mark_output(a.outputs[0])
    p.mark_output(b.outputs[0])
    with pytest.raises(CodegenError, match="reduce different rows"):
        generate_kernel(p, [a.id, b.id], name="two_axes")
    why = can_lower(p, [a.id, b.id])
    assert why and "different rows" in why


def test_a_per_row_value_broadcast_across_rows_is_refused():
    """mean(x, dim=-1) without keepdim is [B]; x - it broadcasts along the columns (B == L here)."""
    p = Program("wrong_axis")
    x = p.add_input("x", (8, 8))
    m = p.add_node("mean", [x.id], {"dim": [-1]})
    s = p.add_node("amax", [x.id], {"dim": [-1]})
    d = p.add_node("sub", [x.id, m.outputs[0]])
    p.mark_output(d.outputs[0])
    p.mark_output(s.outputs[0])
    why = can_lower(p, [m.id, s.id, d.id])
    assert why and "across the rows" in why


# block -> kernels planned: one per reduction before (3, 3, 3 and 3), now the reductions over the same
# rows share one, and the KL's final sum over every element is finished by that kernel's last block;
# DINO's softmax reduces other rows and stays apart
BLOCK_KERNELS = {"activation_stats_observer_llama7b": 1, "row_stats_mean_max_min_vit": 1,
                 "kl_div_distill_distilbert": 1, "standardize_softmax_dino_teacher": 2}


@pytest.mark.parametrize("block", BLOCK_KERNELS)
def test_blocks_plan_reductions_over_the_same_rows_into_one_kernel(block):
    from agent_core.compiler import compile_kernel
    plan, program = planned.plan(planned.block(block))
    assert plan["kernels"] == BLOCK_KERNELS[block], [r["nodes"] for r in plan["regions"]]
    merged = [r for r in program.regions if len([n for n in r.nodes if n in program.nodes and
                                                 program.nodes[n].opdef.category in ("reduction", "normalization")]) > 1]
    assert merged, "no region holds two reductions"
    for r in program.regions:          # every proposed region generates and compiles
        if r.kind == "single":
            continue
        ks = generate_kernel(program, r.nodes, name=r.id)
        compile_kernel(ks, arch="sm_90")
    for r in merged:
        assert generate_kernel(program, r.nodes, name=r.id).params["reductions"] >= 2


# --- on the GPU ---------------------------------------------------------------------------------

def _draws(p, seed: int, hostile: bool) -> dict:
    """Inputs by value id: normal draws scaled by 4; hostile ones put -inf at random places (every
    row keeps finite values) and values of +-1e4 beside them, where softmax needs its max."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for vid in p.inputs:
        shape = tuple(p.values[vid].shape)
        t = 4.0 * torch.randn(shape, generator=g)
        if hostile:
            t[torch.rand(shape, generator=g) < 0.05] = 1e4
            t[torch.rand(shape, generator=g) < 0.05] = -1e4
            t[torch.rand(shape, generator=g) < 0.1] = -math.inf
            t.view(-1, shape[-1])[:, 0] = 1.0       # a finite value in every row
        out[vid] = t
    return out


def _check_on_gpu(p, ids, name, hostile=False, seeds=(0, 1, 2, 3, 4)):
    from agent_core.reference import parameter_tensors, run_reference
    from agent_core.runtime.launch import load_kernel
    ks = generate_kernel(p, ids, name=name)
    k = load_kernel(ks, p)
    params = parameter_tensors(p, "cpu")
    for seed in seeds:
        ins = _draws(p, seed, hostile)
        want = run_reference(p, {p.values[v].name: t for v, t in ins.items()}, device="cpu", keep=True)
        got = k([{**params, **ins}[v].cuda() for v in ks.inputs])
        for v, g in zip(ks.outputs, got):
            torch.testing.assert_close(g.cpu(), want[v], atol=1e-4, rtol=1e-4, equal_nan=True,
                                       msg=lambda m: f"{p.values[v].name} (seed {seed}, {ks.schedule}): {m}")
    return ks


GPU_LENGTHS = [32, 203, 1000, 1027, 4096, 40000]
GPU_CASES = [(b, n) for b in BUILDERS for n in GPU_LENGTHS]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("builder,cols", GPU_CASES, ids=[f"{b}-{n}" for b, n in GPU_CASES])
def test_gpu_matches_torch(builder, cols):
    p, ids = _case(builder, cols, rows=37)
    _check_on_gpu(p, ids, f"{builder}_{cols}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("builder,cols", [(b, n) for b in ("stats", "kl_terms") for n in (203, 1000, 4096, 40000)])
def test_gpu_softmax_stable_with_inf_and_large_values(builder, cols):
    p, ids = _case(builder, cols, rows=37)
    _check_on_gpu(p, ids, f"{builder}_{cols}_hostile", hostile=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("builder,shape,dim", COLUMNS + [("stats", (4096, 300), 0), ("var_mean", (2, 9, 700), 1)],
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c))
def test_gpu_column_reductions_match_torch(builder, shape, dim):
    p, ids = BUILDERS[builder](shape, dim)
    _check_on_gpu(p, ids, f"col_{builder}")


def test_many_inputs_keep_a_short_row_in_registers():
    """Six inputs of 64-element rows: their sum, the one value both reductions fold, is computed once
    and held (4 lanes per row, 16 floats each), not the six inputs."""
    p = Program("six")
    xs = [p.add_input(f"x{k}", (10, 64)) for k in range(6)]
    ids, cur = [], xs[0].id
    for x in xs[1:]:
        n = p.add_node("add", [cur, x.id])
        ids.append(n.id)
        cur = n.outputs[0]
    for op in ("amax", "sum"):
        n = p.add_node(op, [cur], {"dim": [-1]})
        p.mark_output(n.outputs[0])
        ids.append(n.id)
    ks = generate_kernel(p, ids, name="six")
    assert ks.params["schedule"] == "warp" and ks.params["cached"] and ks.params["threads_per_row"] == 4
    body = ks.source.split("__global__")[1]
    assert body.count("float4*>(x") == 6     # each input loaded once, 4 floats at a time
    sum_key = re.search(r"float (\w+_held)\[kItems \* kVec\];", body).group(1)
    assert body.count(f"{sum_key}[k * kVec + e] = ") == 1 and body.count(f"= {sum_key}[k * kVec + e]") == 1


def channel_stats_bias(shape=(4, 8, 6, 5)):
    """Mean and max over each (sample, channel) plane, the mean plus a per-channel bias [C, 1, 1]: a
    per-row input broadcast over the samples (the rows are [N, C])."""
    p = Program("channel_stats_bias")
    x = p.add_input("x", shape)
    b = p.add_input("bias", (shape[1], 1, 1))
    m = p.add_node("mean", [x.id], {"dim": [2, 3], "keepdim": True})
    mb = p.add_node("add", [m.outputs[0], b.id])
    s = p.add_node("amax", [x.id], {"dim": [2, 3], "keepdim": True})
    o = p.add_node("mul", [mb.outputs[0], s.outputs[0]])
    p.mark_output(o.outputs[0])
    return p, [m.id, mb.id, s.id, o.id]


def pooled_over_count(shape=(6, 9, 16)):
    """Masked mean pooling as sentence encoders write it: sum over the tokens, divided by a clamped
    count [B, 1] that broadcasts over the features (rows [B, D], kept without the reduced dim), beside
    the max over the same tokens."""
    p = Program("pooled_over_count")
    x = p.add_input("x", shape)
    n = p.add_input("count", (shape[0], 1))
    s = p.add_node("sum", [x.id], {"dim": [1], "keepdim": False})
    d = p.add_node("div", [s.outputs[0], n.id])
    mx = p.add_node("amax", [x.id], {"dim": [1], "keepdim": False})
    o = p.add_node("add", [d.outputs[0], mx.outputs[0]])
    p.mark_output(o.outputs[0])
    return p, [s.id, d.id, mx.id, o.id]


def causal_scaled_softmax(shape=(2, 3, 7, 7)):
    """Written-out causal attention scores: a [1, 1, L, L] mask computed in the region from a tril
    buffer (broadcast over batch and heads: per element, not per row), a scale computed from a scalar
    parameter (exp of a clamped log: the same for every row), then softmax and logsumexp of the
    masked scores."""
    p = Program("causal_scaled_softmax")
    x = p.add_input("scores", shape)
    L = shape[-1]
    tril = p.add_parameter("tril", np.tril(np.ones((1, 1, L, L), np.float32)), constant=True)
    t = p.add_parameter("logit_scale", np.array(0.7, np.float32))
    mask = p.add_node("eq", [tril.id, p.add_parameter("zero", np.zeros((), np.float32), constant=True).id])
    lg = p.add_node("log", [t.id])
    ex = p.add_node("exp", [lg.outputs[0]])
    sc = p.add_node("mul", [x.id, ex.outputs[0]])
    w = p.add_node("masked_fill", [sc.outputs[0], mask.outputs[0]], {"value": float("-inf")})
    sm = p.add_node("softmax", [w.outputs[0]], {"dim": -1})
    lse = p.add_node("logsumexp", [w.outputs[0]], {"dim": [-1], "keepdim": True})
    p.mark_output(sm.outputs[0])
    p.mark_output(lse.outputs[0])
    return p, [mask.id, lg.id, ex.id, sc.id, w.id, sm.id, lse.id]


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulator needs g++")
@pytest.mark.parametrize("builder", [channel_stats_bias, pooled_over_count, causal_scaled_softmax])
def test_operands_smaller_than_the_rows_broadcast_into_one_kernel(builder):
    """Values that broadcast to the rows without being one per row or per element: a per-channel
    bias beside per-(sample, channel) rows, a per-sample count beside per-(sample, feature) rows, a
    causal mask over [query, key] beside [batch, head, query, key] rows, a scale computed from a
    scalar. One kernel, emulated on the CPU, equal to torch on 2 draws."""
    from types import SimpleNamespace

    from agent_core.compiler import compile_kernel
    from agent_core.reference import run_reference
    from tests.test_codegen_column_tiles import _emulate_region
    p, ids = builder()
    ks = generate_kernel(p, ids, name=p.name)
    assert ks.params["reductions"] == 2, ks.params
    compile_kernel(ks, arch="sm_90")
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ins = [torch.rand(p.values[v].shape, generator=g) * 3 + 0.5 for v in p.inputs]
        env = run_reference(p, ins, keep=True)
        _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env)
        for v, got in outs.items():
            torch.testing.assert_close(got, env[v], atol=1e-5, rtol=1e-5)


def test_a_value_smaller_than_the_rows_is_not_written_out():
    """A broadcast value computed in the region and returned would be written by every row."""
    p, ids = causal_scaled_softmax()
    mask = p.nodes[ids[0]].outputs[0]
    p.mark_output(mask)
    why = can_lower(p, ids)
    assert why and "neither the rows" in why, why


def group_norm_silu(shape=(2, 8, 5, 6), groups=4, instance=False):
    """A diffusion U-Net's ResNet step: a per-(sample, channel) time embedding [N, C, 1..] added, then
    GroupNorm (or an instance norm: a group per channel) and SiLU."""
    p = Program("group_norm_silu")
    x = p.add_input("x", shape)
    t = p.add_input("temb", (shape[0], shape[1]) + (1,) * (len(shape) - 2))
    xt = p.add_node("add", [x.id, t.id])
    w = p.add_parameter("weight", np.linspace(0.5, 1.5, shape[1], dtype=np.float32))
    b = p.add_parameter("bias", np.linspace(-0.2, 0.3, shape[1], dtype=np.float32))
    if instance:
        n = p.add_node("instance_norm", [xt.outputs[0], None, None, w.id, b.id],
                       {"use_input_stats": True, "momentum": 0.1, "eps": 1e-5})
    else:
        n = p.add_node("group_norm", [xt.outputs[0], w.id, b.id], {"num_groups": groups, "eps": 1e-5})
    s = p.add_node("silu", [n.outputs[0]])
    p.mark_output(s.outputs[0])
    return p, [xt.id, n.id, s.id]


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulator needs g++")
@pytest.mark.parametrize("shape,groups,instance,params", [
    ((2, 8, 5, 6), 4, False, None), ((3, 6, 7), 3, False, None), ((2, 4, 3, 5), None, True, None),
    ((2, 32, 40, 40), 8, False, None), ((4, 16, 48, 48), 2, False, None),
    ((1, 8, 64, 64), 2, False, {"split": 4})])
def test_the_row_graph_normalizes_sample_group_rows(shape, groups, instance, params):
    """group_norm and instance_norm rows are (sample, group): the row graph sees [N, C, *S] as
    [N, G, C / G, *S], where those rows are neighbouring dims and the per-channel weight and bias are
    operands broadcast over that frame. Emulated on the CPU (rows held, streamed, split in chunks; the
    emulator has no clusters: the GPU test runs one), equal to torch on 2 draws."""
    from types import SimpleNamespace

    from agent_core.codegen.region_io import region_io
    from agent_core.codegen.rowkernel import generate_multi_reduction
    from agent_core.compiler import compile_kernel
    from agent_core.reference import run_reference
    from tests.test_codegen_column_tiles import _emulate_region
    p, ids = group_norm_silu(shape, groups, instance)
    ks = generate_multi_reduction(p, region_io(p, ids), "gn", params)
    compile_kernel(ks, arch="sm_90")
    if params:
        assert ks.params["schedule"] == "split_row", ks.params
    assert ks.params["cols"] == math.prod(shape[1:]) // (groups or shape[1]), ks.params
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ins = [torch.randn(p.values[v].shape, generator=g) * 3 + 1 for v in p.inputs]
        env = run_reference(p, ins, keep=True)
        _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env, ks=ks)
        for v, got in outs.items():
            torch.testing.assert_close(got, env[v], atol=1e-5, rtol=1e-5)


def token_count_mean(shape=(6, 40), dtype="bool"):
    """Tokens counted from a mask (torch sums booleans exactly, in int64) beside the masked mean of
    the hidden values over the same rows."""
    p = Program("token_count_mean")
    x = p.add_input("x", shape)
    m = p.add_input("mask", shape, dtype)
    n = p.add_node("sum", [m.id], {"dim": [1], "keepdim": False})
    xm = p.add_node("mul", [x.id, m.id])
    s = p.add_node("mean", [xm.outputs[0]], {"dim": [1], "keepdim": False})
    p.mark_output(n.outputs[0])
    p.mark_output(s.outputs[0])
    return p, [n.id, xm.id, s.id]


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulator needs g++")
@pytest.mark.parametrize("shape,dtype", [((6, 40), "bool"), ((5, 3000), "int32"), ((4, 33), "int64")])
def test_an_integer_sum_counts_exactly_in_int64_beside_float_reductions(shape, dtype):
    """sum of booleans or integers is an int64 state (isum) folded in the same pass as the float
    mean; emulated on the CPU, the count equals torch's exactly."""
    from types import SimpleNamespace

    from agent_core.compiler import compile_kernel
    from agent_core.reference import run_reference
    from tests.test_codegen_column_tiles import _emulate_region
    p, ids = token_count_mean(shape, dtype)
    ks = generate_kernel(p, ids, name="count")
    assert "St_isum" in ks.source and "long long* __restrict__" in ks.source
    compile_kernel(ks, arch="sm_90")
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        mask = torch.randint(0, 2, shape, generator=g).to(getattr(torch, dtype))
        env = run_reference(p, [torch.randn(shape, generator=g), mask], keep=True)
        _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env)
        n, mean = (p.nodes[i].outputs[0] for i in (ids[0], ids[2]))
        assert outs[n].dtype == torch.int64 and torch.equal(outs[n], env[n])
        torch.testing.assert_close(outs[mean], env[mean], atol=1e-5, rtol=1e-5)


def _random_rows_program(seed: int):
    """A random region of two reductions over the same rows of a random 3- or 4-d shape, with
    operands that broadcast over some of the rows or elements, drawn the way torch broadcasts them:
    x * scale_e -> (mean, amax over the reduced dims, keepdim) -> + bias_r -> combined -> + x."""
    import random
    rnd = random.Random(seed)
    rank = rnd.choice([3, 4])
    shape = tuple(rnd.choice([1, 2, 3, 5, 8]) for _ in range(rank - 1)) + (rnd.choice([4, 7, 16, 33]),)
    start = rnd.randrange(1, rank)
    dims = list(range(start, rnd.randrange(start, rank) + 1))
    keep = tuple(1 if d in dims else s for d, s in enumerate(shape))

    def some_of(target):        # a shape that broadcasts to target: some dims kept, some 1, leading dropped
        s = tuple(t if rnd.random() < 0.5 else 1 for t in target)
        return s[rnd.randrange(0, len(s)):] or (1,)
    p = Program(f"rows_{seed}")
    x = p.add_input("x", shape)
    se = p.add_input("scale_e", some_of(shape))
    br = p.add_input("bias_r", some_of(keep))
    xs = p.add_node("mul", [x.id, se.id])
    m = p.add_node("mean", [xs.outputs[0]], {"dim": dims, "keepdim": True})
    a = p.add_node("amax", [xs.outputs[0]], {"dim": dims, "keepdim": True})
    mb = p.add_node("add", [m.outputs[0], br.id])
    c = p.add_node("mul", [mb.outputs[0], a.outputs[0]])
    o = p.add_node("add", [x.id, c.outputs[0]])
    p.mark_output(o.outputs[0])
    p.mark_output(m.outputs[0])
    return p, [xs.id, m.id, a.id, mb.id, c.id, o.id]


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulator needs g++")
@pytest.mark.parametrize("seed", range(12))
def test_random_rows_with_broadcast_operands_match_torch(seed):
    """Random shapes, reduced dims and broadcast operands (per element and per row): one row-graph
    kernel, emulated on the CPU, equal to torch."""
    from types import SimpleNamespace

    from agent_core.reference import run_reference
    from tests.test_codegen_column_tiles import _emulate_region
    p, ids = _random_rows_program(seed)
    generate_kernel(p, ids, name="rows")
    g = torch.Generator().manual_seed(seed)
    ins = [torch.randn(p.values[v].shape, generator=g) for v in p.inputs]
    env = run_reference(p, ins, keep=True)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env)
    for v, got in outs.items():
        torch.testing.assert_close(got, env[v], atol=1e-5, rtol=1e-5, msg=lambda m: f"{p.name}: {m}")


def _random_group_norm_program(seed: int):
    """A random group_norm region: [N, C, *S] with 1 to 3 spatial dims, a random group count, a
    prologue scale broadcast in a random way (per channel, per sample, per position), the norm with
    or without its affine parameters, and a residual add after."""
    import random
    rnd = random.Random(seed)
    groups = rnd.choice([1, 2, 4])
    shape = (rnd.choice([1, 2, 3]), groups * rnd.choice([1, 2, 3])) + \
        tuple(rnd.choice([1, 3, 4, 5]) for _ in range(rnd.randrange(1, 4)))
    scale = [(shape[0], 1) + (1,) * (len(shape) - 2), (shape[1],) + (1,) * (len(shape) - 2),
             shape[2:], shape[1:], (1,)][rnd.randrange(5)]
    p = Program(f"group_norm_{seed}")
    x = p.add_input("x", shape)
    s = p.add_input("scale", scale)
    r = p.add_input("residual", shape)
    xs = p.add_node("mul", [x.id, s.id])
    affine = rnd.random() < 0.7
    w = p.add_parameter("w", np.linspace(0.5, 1.5, shape[1], dtype=np.float32)).id if affine else None
    b = p.add_parameter("b", np.linspace(-0.2, 0.3, shape[1], dtype=np.float32)).id if affine else None
    n = p.add_node("group_norm", [xs.outputs[0], w, b], {"num_groups": groups, "eps": 1e-5})
    o = p.add_node("add", [n.outputs[0], r.id])
    p.mark_output(o.outputs[0])
    return p, [xs.id, n.id, o.id]


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulator needs g++")
@pytest.mark.parametrize("seed", range(10))
def test_random_group_norm_regions_match_torch(seed):
    """Random group rows, prologue operands broadcast per channel, sample or position, with and
    without the affine parameters: the row graph's kernel, emulated on the CPU, equal to torch."""
    from types import SimpleNamespace

    from agent_core.codegen.region_io import region_io
    from agent_core.codegen.rowkernel import generate_multi_reduction
    from agent_core.reference import run_reference
    from tests.test_codegen_column_tiles import _emulate_region
    p, ids = _random_group_norm_program(seed)
    ks = generate_multi_reduction(p, region_io(p, ids), "gn")
    g = torch.Generator().manual_seed(seed)
    ins = [torch.randn(p.values[v].shape, generator=g) * 2 + 1 for v in p.inputs]
    env = run_reference(p, ins, keep=True)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env, ks=ks)
    for v, got in outs.items():
        torch.testing.assert_close(got, env[v], atol=1e-4, rtol=1e-4, msg=lambda m: f"{p.name}: {m}")


def test_a_per_row_input_aligned_two_ways_is_refused():
    """Over [4, 4] rows, b [4, 1] added to a keepdim mean [4, 4, 1] runs along the rows' second dim,
    and multiplied with a mean without keepdim [4, 4] along their first: two alignments of one input,
    refused with the reason (one load per row cannot serve both). One alignment is one kernel."""
    def program(b_shape, keepdims):
        p = Program("two_ways")
        x = p.add_input("x", (4, 4, 6))
        b = p.add_input("b", b_shape)
        m = p.add_node("mean", [x.id], {"dim": [2], "keepdim": keepdims[0]})
        s = p.add_node("amax", [x.id], {"dim": [2], "keepdim": keepdims[1]})
        mb = p.add_node("add", [m.outputs[0], b.id])
        sb = p.add_node("mul", [s.outputs[0], b.id])
        p.mark_output(mb.outputs[0])
        p.mark_output(sb.outputs[0])
        return p, [m.id, s.id, mb.id, sb.id]
    p, ids = program((4, 1), (True, False))
    why = can_lower(p, ids)
    assert why and "aligned with the rows as [4, 1], another op as [1, 4]" in why, why
    p, ids = program((4, 1), (False, False))
    assert can_lower(p, ids) is None
