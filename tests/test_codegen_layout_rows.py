"""Layout ops inside row kernels, and one layout kernel for sibling outputs (issue #14).

A row reduction whose prologue holds layout ops (transpose, cat, embedding, permute, slice, ...) reads
them through their views while it loads each row (layout_graph.ViewPrologue feeding the row kernel's
loads): nothing between them goes to memory, and a prologue value the program also returns
(ViT's `tokens`) is written once, from the same kernel. Sibling layout graphs (RoPE's q and k) are one
kernel with two outputs reading cos and sin once.

CPU: each case generates, compiles with NVRTC for sm_90 without a warning, takes exactly the region's
inputs and outputs as arguments, and uses float4 only where the views keep aligned runs; can_lower
agrees with the generator; the four benchmark blocks plan (as `stitchcuda plan` does) into one
kernel each, every region generating. GPU (`-m gpu`): the kernels match torch at atol = rtol = 1e-4
on 5 draws (tests/programs.py `fused`), at real and odd sizes.
"""
from __future__ import annotations

import math

import pytest

from agent_core.codegen import can_lower, generate_kernel
from agent_core.ir import Program
from tests import planned

BLOCKS = ["rope_qk_llama7b", "rope_partial_gptneox_pythia", "vit_patch_embed_pos_layernorm",
          "embedding_position_layernorm_bert"]


# --- programs (each returns the program; the region is all its nodes) ------------------------------
def _node(p, op, ins, attrs=None):
    return p.add_node(op, [v if isinstance(v, str) else v.id for v in ins], attrs or {})


def vit_tokens(b, d, g):
    """patches.flatten(2).transpose(1, 2), the class token prepended, + pos -> (tokens, layer_norm)."""
    p = Program("vit_tokens")
    x = p.add_input("patches", (b, d, g, g))
    cls = p.add_parameter("cls_token", shape=(1, 1, d))
    pos = p.add_parameter("pos_embed", shape=(1, g * g + 1, d))
    w, bias = p.add_parameter("weight", shape=(d,)), p.add_parameter("bias", shape=(d,))
    f = _node(p, "flatten", [x], {"start_dim": 2})
    t = _node(p, "transpose", [f.outputs[0]], {"dim0": 1, "dim1": 2})
    e = _node(p, "expand", [cls], {"size": [b, 1, d]})
    c = _node(p, "cat", [e.outputs[0], t.outputs[0]], {"dim": 1})
    tokens = _node(p, "add", [c.outputs[0], pos])
    n = _node(p, "layer_norm", [tokens.outputs[0], w, bias], {"normalized_shape": [d], "eps": 1e-6})
    p.mark_output(tokens.outputs[0])
    p.mark_output(n.outputs[0])
    return p


def bert_embed(b, n, vocab, d):
    """layer_norm(embedding(ids, table) + pos)."""
    p = Program("bert_embed")
    ids = p.add_input("ids", (b, n), dtype="int64", init={"kind": "randint", "low": 0, "high": vocab})
    table, pos = p.add_parameter("table", shape=(vocab, d)), p.add_parameter("pos", shape=(n, d))
    w, bias = p.add_parameter("weight", shape=(d,)), p.add_parameter("bias", shape=(d,))
    e = _node(p, "embedding", [ids, table])
    a = _node(p, "add", [e.outputs[0], pos])
    ln = _node(p, "layer_norm", [a.outputs[0], w, bias], {"normalized_shape": [d], "eps": 1e-12})
    p.mark_output(ln.outputs[0])
    return p


def permute_softmax(shape):
    """tanh(softmax(permute(-x, (0, 2, 1)), -1)): the permuted row is read with a stride."""
    p = Program("permute_softmax")
    x = p.add_input("x", shape)
    s = _node(p, "neg", [x])
    pe = _node(p, "permute", [s.outputs[0]], {"dims": [0, 2, 1]})
    sm = _node(p, "softmax", [pe.outputs[0]], {"dim": -1})
    out = _node(p, "tanh", [sm.outputs[0]])
    p.mark_output(out.outputs[0])
    return p


def slice_rms_norm(shape, start, width):
    """rms_norm(x[..., start:start + width]) with a weight."""
    p = Program("slice_rms_norm")
    x = p.add_input("x", shape)
    w = p.add_parameter("weight", shape=(width,))
    s = _node(p, "slice", [x], {"dim": -1, "start": start, "end": start + width})
    r = _node(p, "rms_norm", [s.outputs[0], w], {"normalized_shape": [width], "eps": 1e-6})
    p.mark_output(r.outputs[0])
    return p


def slice_softmax_max(shape, start, width):
    """softmax(s) * max(s, -1, keepdim) with s = x[..., start:start + width]: two reductions over the
    same rows (codegen/rowkernel.py), reading the slice through its view."""
    p = Program("slice_softmax_max")
    x = p.add_input("x", shape)
    s = _node(p, "slice", [x], {"dim": -1, "start": start, "end": start + width})
    sm = _node(p, "softmax", [s.outputs[0]], {"dim": -1})
    mx = _node(p, "max", [s.outputs[0]], {"dim": [-1], "keepdim": True})
    p.mark_output(_node(p, "mul", [sm.outputs[0], mx.outputs[0]]).outputs[0])
    return p


def embed_residual_rms(b, n, vocab, d):
    """y = embedding(ids, table) + pos; rms_norm(relu(y)) + y: the epilogue reads the prologue's y,
    so the row graph (rowkernel.py) recomputes it per element from the embedding's view."""
    p = Program("embed_residual_rms")
    ids = p.add_input("ids", (b, n), dtype="int64", init={"kind": "randint", "low": 0, "high": vocab})
    table, pos = p.add_parameter("table", shape=(vocab, d)), p.add_parameter("pos", shape=(n, d))
    w = p.add_parameter("weight", shape=(d,))
    y = _node(p, "add", [_node(p, "embedding", [ids, table]).outputs[0], pos])
    r = _node(p, "rms_norm", [_node(p, "relu", [y.outputs[0]]).outputs[0], w], {"normalized_shape": [d], "eps": 1e-6})
    p.mark_output(_node(p, "add", [r.outputs[0], y.outputs[0]]).outputs[0])
    return p


def mask_count(b, n):
    """cast(mask.reshape(b, n), float32).sum(-1): an int64 mask relabelled, cast and counted per row
    (the token counts of a masked mean pool)."""
    p = Program("mask_count")
    m = p.add_input("mask", (b, 1, 1, n), dtype="int64", init={"kind": "randint", "low": 0, "high": 2})
    r = _node(p, "reshape", [m], {"shape": [b, n]})
    c = _node(p, "cast", [r.outputs[0]], {"dtype": "float32"})
    p.mark_output(_node(p, "sum", [c.outputs[0]], {"dim": [-1]}).outputs[0])
    return p


def _rope(p, x, cos, sin):
    d = p.values[x].shape[-1]
    hi = _node(p, "slice", [x], {"dim": -1, "start": d // 2, "end": d})
    lo = _node(p, "slice", [x], {"dim": -1, "start": 0, "end": d // 2})
    c = _node(p, "cat", [_node(p, "neg", [hi.outputs[0]]).outputs[0], lo.outputs[0]], {"dim": -1})
    m = _node(p, "mul", [c.outputs[0], sin])
    out = _node(p, "add", [_node(p, "mul", [x, cos]).outputs[0], m.outputs[0]])
    p.mark_output(out.outputs[0])


def rope_qk(shape):
    """q * cos + rotate_half(q) * sin and the same for k: two outputs, one cos and one sin."""
    p = Program("rope_qk")
    q, k = p.add_input("q", shape).id, p.add_input("k", shape).id
    cos, sin = (p.add_parameter(n, shape=shape[-2:]).id for n in ("cos", "sin"))
    _rope(p, q, cos, sin)
    _rope(p, k, cos, sin)
    return p


def _all(p):
    return list(p.topo_order())


# --- CPU: generate and compile ---------------------------------------------------------------------------
def _compiled(ks):
    from agent_core.compiler import compile_kernel
    c = compile_kernel(ks, arch="sm_90")
    warnings = [ln for ln in c.log.splitlines() if "warning" in ln]
    assert warnings == [], "\n".join(warnings)
    return c


def _generated(p, kind=None, params=None):
    ids = _all(p)
    assert can_lower(p, ids, kind) is None
    ks = generate_kernel(p, ids, name=p.name, kind=kind, params=params)
    _compiled(ks)
    from agent_core.codegen import region_io
    io = region_io(p, ids)
    # the kernel's arguments are the region's inputs and outputs: no intermediate goes to memory
    assert ks.inputs == io.inputs and ks.outputs == io.outputs
    return ks


def test_cat_add_layer_norm_is_one_row_kernel_writing_the_tokens_it_normalizes():
    p = vit_tokens(2, 48, 4)
    ks = _generated(p)
    assert ks.kind == "row_reduction" and len(ks.outputs) == 2
    tokens = ks.outputs[0]
    assert p.values[tokens].shape == (2, 17, 48)
    # the tokens are stored by the prologue while the row is loaded, from the cat's view: composed at
    # the staged row s_at (the row's token is s_at % 17), or a lambda's flat index i
    assert "(s_at % 17 < 1) ?" in ks.source or "(i / 48 % 17 < 1) ?" in ks.source, ks.source


def test_embedding_add_layer_norm_is_one_row_kernel_that_tests_its_index():
    p = bert_embed(2, 16, 50, 48)
    ks = _generated(p)
    assert ks.kind == "row_reduction"
    assert ">= 0 &&" in ks.source and "< 50)" in ks.source      # the loaded id is tested before it reads


def test_a_permute_feeding_a_softmax_over_the_last_dim_reads_the_strided_row():
    p = permute_softmax((4, 24, 40))
    ks = _generated(p)
    assert ks.kind == "row_reduction" and ks.params["cols"] == 24
    # a transposed read keeps no run of 4 together: scalar view lambdas, staged in shared memory with the
    # row index fastest, then read a float4 at a time from there (tests/test_codegen_staged_rows.py)
    assert [ln for ln in ks.source.splitlines() if "_at4 = [&]" in ln] == ["  auto permute_tile_at4 = [&](index_t i) -> float4 {"]
    assert "_at4" not in generate_kernel(p, _all(p), name=p.name, params={"stage": False}).source


@pytest.mark.parametrize("start,vector", [(0, True), (8, True), (1, False)])
def test_a_slice_feeding_rms_norm_loads_float4_only_where_the_view_allows(start, vector):
    p = slice_rms_norm((6, 5, 80), start, 64)
    ks = _generated(p)
    assert ks.kind == "row_reduction" and ks.params["vector_width"] == 4
    assert ("_at4(" in ks.source) == vector


def slice_sum(shape, start, width):
    """x[:, start:start + width].sum(-1): few long rows reduced away (the split schedule)."""
    p = Program("slice_sum")
    x = p.add_input("x", shape)
    sl = _node(p, "slice", [x], {"dim": -1, "start": start, "end": start + width})
    p.mark_output(_node(p, "sum", [sl.outputs[0]], {"dim": [-1]}).outputs[0])
    return p


@pytest.mark.parametrize("build,args,schedule,params", [
    (slice_rms_norm, ((4, 40000), 0, 32768), "stream", {"split": 1}),
    (slice_rms_norm, ((16, 140000), 4, 131072), "cluster", {"split": 1}),
    (slice_rms_norm, ((16, 140000), 3, 131072), "cluster", {"split": 1}),
    (slice_rms_norm, ((16, 140000), 4, 131072), "split_row", None),   # few long rows: the default
    (slice_sum, ((4, 262200), 4, 262144), "split_row", None),
    (slice_sum, ((4, 262200), 3, 262144), "split_row", None),
], ids=["stream", "cluster-vec", "cluster-scalar", "split-row", "split-vec", "split-scalar"])
def test_long_rows_read_through_views_in_the_streaming_schedules(build, args, schedule, params):
    ks = _generated(build(*args), params=params)
    assert ks.params["schedule"] == schedule
    assert ("_at4(" in ks.source) == (args[1] % 4 == 0)


@pytest.mark.parametrize("shape,start,schedule", [((8, 80), 8, "warp"), ((8, 80), 1, "warp"),
                                                  ((4, 40000), 0, "stream")], ids=["vec", "misaligned", "stream"])
def test_several_reductions_over_a_slice_share_one_row_kernel(shape, start, schedule):
    width = 64 if shape[-1] == 80 else 32768
    ks = _generated(slice_softmax_max(shape, start, width))
    assert ks.params["reductions"] == 2 and ks.params["schedule"] == schedule
    assert ("_at4(" in ks.source) == (start % 4 == 0)


def test_an_epilogue_reading_the_layout_prologue_recomputes_it_in_the_row_graph():
    ks = _generated(embed_residual_rms(2, 16, 50, 48))
    assert ks.kind == "row_reduction" and "rounds" in ks.params     # rowkernel's row graph
    assert ">= 0 &&" in ks.source


def test_an_integer_mask_is_read_through_its_view_in_its_own_type():
    ks = _generated(mask_count(4, 16))
    assert ks.kind == "row_reduction"
    # read in its own type through the reshape's view, then cast per element
    assert "-> long long { return mask[i]; }" in ks.source and "-> long long { return mask_at(i); }" in ks.source
    assert "(float)" in ks.source


EMULATED = [("vit", vit_tokens, (2, 12, 3)), ("bert", bert_embed, (2, 5, 11, 8)),
            ("permute", permute_softmax, ((2, 6, 10),)), ("slice", slice_rms_norm, ((3, 4, 20), 3, 12)),
            ("two-reductions", slice_softmax_max, ((5, 20), 2, 12)), ("residual", embed_residual_rms, (2, 5, 11, 8))]


@pytest.mark.parametrize("case,build,args", EMULATED, ids=[c[0] for c in EMULATED])
def test_the_row_kernels_lambdas_give_each_prologue_value_as_torch_does(case, build, args):
    """The scalar row kernel's own lambda text, evaluated on the CPU (tests/test_codegen_views_gen.py's
    C evaluator, every load bounds-checked) on integer-valued inputs, equals torch's value exactly at
    every index: the views the row kernel reads its rows through are right."""
    import re

    from agent_core.reference import run_reference
    from tests.test_codegen_views_gen import _env, _inputs
    p = build(*args)
    # (unstaged: the staged kernel reads its rows from shared memory, run whole by the emulator in
    # tests/test_codegen_staged_rows.py)
    ks = generate_kernel(p, _all(p), name=case, params={"vector_width": 1, "stage": False})
    ins = _inputs(p)
    ref = run_reference(p, {v: ins[v] for v in p.inputs}, params={v: t for v, t in ins.items() if v not in p.inputs},
                        keep=True)
    env = _env(ks, ins)
    checked = set()
    for vid, val in p.values.items():
        fn = re.sub(r"\W", "_", val.name) + "_at"
        if fn not in env or vid not in ref:
            continue
        want = ref[vid].reshape(-1).tolist()      # (parameters are random floats: float32 rounding)
        assert [env[fn][i] for i in range(len(want))] == pytest.approx(want, rel=1e-6, abs=1e-6), (case, val.name)
        checked.add(vid)
    # a layout op's value is among them
    moved = [v for v in checked if p.values[v].producer
             and p.nodes[p.values[v].producer].op in ("cat", "embedding", "permute", "slice")]
    assert moved, case


def test_a_slice_with_an_odd_row_compiles_scalar():
    p = slice_rms_norm((3, 37), 2, 33)
    ks = _generated(p)
    assert ks.params["vector_width"] == 1 and "_at4" not in ks.source


def test_rope_q_and_k_are_one_layout_kernel_reading_cos_and_sin_once():
    shape = (2, 4, 16, 32)
    p = rope_qk(shape)
    ks = _generated(p, "layout")
    assert ks.kind == "layout" and len(ks.outputs) == 2 and ks.params["vector"] == 4
    numel = math.prod(shape)
    # q, k and both results whole; cos and sin once for the two outputs
    assert ks.bytes_moved == 4 * (4 * numel + 2 * shape[-2] * shape[-1])


def test_a_layout_op_after_the_reduction_is_refused_by_both_can_lower_and_the_generator():
    from agent_core.codegen import CodegenError
    p = Program("softmax_slice")
    x = p.add_input("x", (8, 32))
    sm = _node(p, "softmax", [x], {"dim": -1})
    sl = _node(p, "slice", [sm.outputs[0]], {"dim": 1, "start": 0, "end": 8})
    p.mark_output(sl.outputs[0])
    why = can_lower(p, [sm.id, sl.id])
    assert why is not None and "slice" in why and "layout op after" in why
    with pytest.raises(CodegenError, match="layout op after"):
        generate_kernel(p, [sm.id, sl.id], name="softmax_slice")


def test_an_escaping_prologue_value_of_another_shape_is_refused():
    """A prologue value returned by the program must have the row's shape (it is written at (row, col))."""
    p = Program("escape_half")
    x = p.add_input("x", (8, 64))
    sl = _node(p, "slice", [x], {"dim": 1, "start": 0, "end": 32})
    r = _node(p, "relu", [sl.outputs[0]])
    cat = _node(p, "cat", [r.outputs[0], r.outputs[0]], {"dim": 1})
    sm = _node(p, "softmax", [cat.outputs[0]], {"dim": -1})
    p.mark_output(r.outputs[0])
    p.mark_output(sm.outputs[0])
    why = can_lower(p, _all(p))
    assert why is not None and "split the region" in why


# --- CPU: the blocks as `stitchcuda plan` plans them ------------------------------------------------------------
@pytest.mark.parametrize("block", BLOCKS)
def test_block_plans_into_one_kernel_and_every_region_generates(block):
    plan, p = planned.plan(planned.block(block))
    assert plan["kernels"] == 1, [(r["kind"], r["nodes"], r["reason"]) for r in plan["regions"]]
    kernels = [r for r in p.regions if r.status != "rejected" and r.schedule["runs"] == "kernel"]
    assert len(kernels) == 1
    r = kernels[0]
    ks = generate_kernel(p, r.nodes, name=f"{block}_{r.id}", kind=r.kind)
    _compiled(ks)
    # every node but the reshapes (aliases) runs in that one kernel
    assert {n for n in p.nodes if p.nodes[n].op not in ("reshape", "flatten", "view")} <= set(r.nodes) | {
        n for q in p.regions if q.schedule["runs"] == "alias" for n in q.nodes}


# --- GPU ------------------------------------------------------------------------------------------------------
GPU_CASES = [
    ("vit-b16", vit_tokens, (8, 768, 14)),
    ("vit-odd", vit_tokens, (3, 37, 5)),
    ("bert", bert_embed, (8, 512, 30522, 768)),
    ("bert-odd", bert_embed, (3, 7, 101, 13)),
    ("permute-softmax", permute_softmax, ((8, 1024, 197),)),
    ("permute-softmax-odd", permute_softmax, ((3, 21, 35),)),
    ("slice-rms-vec", slice_rms_norm, ((64, 8, 2048), 1024, 1024)),
    ("slice-rms-misaligned", slice_rms_norm, ((64, 8, 2048), 3, 1024)),
    ("slice-rms-long", slice_rms_norm, ((4, 40000), 0, 32768)),
    ("slice-rms-odd", slice_rms_norm, ((5, 37), 2, 33)),
    ("slice-rms-cluster", slice_rms_norm, ((16, 140000), 4, 131072)),
    ("slice-rms-cluster-misaligned", slice_rms_norm, ((16, 140000), 3, 131072)),
    ("slice-sum-split", slice_sum, ((4, 262200), 4, 262144)),
    ("slice-sum-split-misaligned", slice_sum, ((4, 262200), 3, 262144)),
    ("slice-softmax-max", slice_softmax_max, ((512, 4160), 64, 4096)),
    ("slice-softmax-max-misaligned", slice_softmax_max, ((512, 4160), 3, 4096)),
    ("slice-softmax-max-stream", slice_softmax_max, ((16, 40000), 0, 32768)),
    ("slice-softmax-max-odd", slice_softmax_max, ((7, 45), 2, 37)),
    ("embed-residual-rms", embed_residual_rms, (8, 512, 30522, 768)),
    ("embed-residual-rms-odd", embed_residual_rms, (3, 7, 101, 13)),
    ("mask-count", mask_count, (64, 512)),
    ("mask-count-odd", mask_count, (3, 37)),
    ("rope-qk-llama", rope_qk, ((2, 32, 512, 128),)),
    ("rope-qk-odd", rope_qk, ((3, 5, 7, 10),)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case,build,args", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_layout_rows_match_torch(case, build, args):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tests.programs import fused       # build_region: compile, load, verify 5 draws at 1e-4
    p = build(*args)
    r = fused(p, _all(p), f"layout_rows_{case.replace('-', '_')}")
    assert r.kernel.kind in ("row_reduction", "layout")
