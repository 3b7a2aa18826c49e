"""A normalising op after the tile GEMM (codegen/gemm_rows.py NORMS: layer_norm, rms_norm, softmax,
log_softmax), with pointwise ops before and after it, as one kernel: each CTA holds whole rows, folds
their statistics as it applies the epilogue, combines them across its warps, and normalises in a second
pass over its accumulators, so GEMM -> residual add -> LayerNorm (a transformer's every sublayer) writes
only the normalised result. The kernel body, with plain-C++ tensor-core helpers, runs in the CPU
emulator and matches torch at 1e-4 on ragged shapes and under every tiling the tuner tries; the GPU
form compiles for sm_90 without spills up to rows of 1024; what it cannot do is refused with the
reason; the planner offers it beside cuBLAS + the epilogue kernel."""
from __future__ import annotations

import numpy as np
import pytest

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.codegen.gemm_mma import FORM, default_params, gemm_spec, gemm_supported, tune_variants
from agent_core.codegen.region_io import region_io
from agent_core.ir import Program
from tests.test_gemm_row_reduction import emulate

torch = pytest.importorskip("torch")


def program(M, N, K, norm="layer_norm", *, residual=True, after=True, bias=True, affine=True, seed=0):
    """x [M, K] -> linear (bias) -> + r (residual) -> norm over the last dim (its weight and bias
    where it has them) -> gelu (after)."""
    p = Program("gemm_norm")
    x = p.add_input("x", (M, K))
    rng = np.random.default_rng(seed)
    ins = [x.id, p.add_parameter("w", (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)).id]
    if bias:
        ins.append(p.add_parameter("b", rng.standard_normal(N).astype(np.float32)).id)
    y = p.add_node("linear", ins).outputs[0]
    if residual:
        y = p.add_node("add", [y, p.add_input("r", (M, N)).id]).outputs[0]

    def param(name):
        return p.add_parameter(name, rng.standard_normal(N).astype(np.float32)).id if affine else None
    if norm == "layer_norm":
        z = p.add_node("layer_norm", [y, param("g"), param("beta")], {"normalized_shape": [N], "eps": 1e-5})
    elif norm == "rms_norm":
        z = p.add_node("rms_norm", [y, param("g")], {"normalized_shape": [N], "eps": 1e-6})
    else:
        z = p.add_node(norm, [y], {"dim": -1})
    z = z.outputs[0]
    if after:
        z = p.add_node("gelu", [z]).outputs[0]
    p.mark_output(z)
    return p


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm", "softmax", "log_softmax"])
def test_each_normalising_op_matches_torch_on_ragged_shapes(norm):
    p = program(70, 100, 44, norm)
    ks, pairs, _ = emulate(p, {}, draws=2)
    assert ks.params["whole_rows"] and ks.params["block_n"] >= 100 and ks.grid == (1, 5, 1)
    assert not ks.workspace                      # no CTA shares a row: nothing published, no tickets
    assert "normalised in a second pass" in ks.schedule
    assert len(ks.outputs) == 1 and p.values[ks.outputs[0]].shape == (70, 100)
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kwargs", [dict(residual=False, after=False, bias=False), dict(affine=False),
                                    dict(after=False)], ids=["bare", "no-affine", "no-op-after"])
def test_without_a_bias_a_residual_an_affine_map_or_an_op_after(kwargs):
    p = program(37, 64, 29, **kwargs)
    _, pairs, _ = emulate(p, {}, draws=2)
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_every_tiling_the_tuner_tries_matches_torch():
    """Whole-row tilings, and 64 x 64 tiles whose CTAs share the rows (SHARED_ROWS)."""
    from agent_core.codegen.gemm_mma import SHARED_ROWS
    p = program(50, 136, 40)
    first = default_params(gemm_spec(p, region_io(p, list(p.nodes))))
    variants = tune_variants(first)
    whole = [v for v in variants if v["whole_rows"]]
    assert whole and all(v["block_n"] == first["block_n"] for v in whole)
    assert [v for v in variants if not v["whole_rows"]] == [{**first, **SHARED_ROWS}]
    for params in [first] + variants:
        _, pairs, _ = emulate(p, params, draws=1)
        for got, want in pairs:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_residual_sum_is_stored_too_where_the_program_reads_it():
    """A pre-norm block's residual stream: the sum before the norm is an output as well."""
    p = program(40, 96, 32, after=False)
    add = next(n for n in p.nodes.values() if n.op == "add")
    p.mark_output(add.outputs[0])
    ks, pairs, _ = emulate(p, {}, draws=2)
    assert len(ks.outputs) == 2
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm", "softmax", "log_softmax"])
def test_ctas_sharing_the_rows_hand_them_to_the_row_tiles_last_which_normalises_them(norm):
    """64 x 64 tiles over rows of 150 (3 CTAs a row, the last ragged) and 70 rows (2 row tiles, the last
    ragged): each CTA stores its tile's normalising inputs and row states in the workspace; the row
    tile's last CTA combines the states and normalises every column of its rows."""
    from agent_core.codegen.gemm_mma import SHARED_ROWS
    p = program(70, 150, 44, norm)
    ks, pairs, _ = emulate(p, SHARED_ROWS, draws=2)
    assert ks.grid[:2] == (3, 2) and "kPreAt" in ks.source and "__ldcg(workspace + kPreAt + i)" in ks.source
    states = 3 * 70 * int(ks.source.split("constexpr int kF = ")[1].split(";")[0])
    assert ks.workspace == [("float32", states + 70 * 150), ("int32", 2)]
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("N,K", [(512, 2048), (768, 768), (1024, 1024)])
def test_compiles_for_sm90_without_spills_up_to_rows_of_1024(N, K):
    from agent_core.compiler import compile_kernel
    p = program(394, N, K)
    ks = generate_kernel(p, list(p.nodes), name="gemm_norm", params={"form": FORM})
    assert "mma.sync.aligned.m16n8k8" in ks.source and "fold_welford" in ks.source
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0, c.log
    assert [ln for ln in c.log.splitlines() if "warning" in ln] == []


def test_what_the_second_pass_cannot_do_is_refused_with_the_reason():
    wide = program(64, 1100, 32)
    assert "at most 1024" in gemm_supported(wide, list(wide.nodes))
    # two norms over different values: the second pass holds one
    q = Program("two_norms")
    x = q.add_input("x", (32, 16))
    y = q.add_node("linear", [x.id, q.add_parameter("w", shape=(48, 16)).id]).outputs[0]
    e = q.add_node("exp", [y]).outputs[0]
    for v in (y, e):
        q.mark_output(q.add_node("softmax", [v], {"dim": -1}).outputs[0])
    assert "two different values" in gemm_supported(q, list(q.nodes))


def test_the_planner_offers_it_beside_the_library_call_and_its_epilogue_kernel():
    from agent_core.planner import plan_program
    p = program(4096, 768, 768, after=False)
    plan = plan_program(p)
    (r,) = [r for r in plan.active if any(p.nodes[n].op == "linear" for n in r.nodes)]
    assert r.kind == "matmul_epilogue" and r.schedule["forms"] == {"library+kernel": None, FORM: None}
    assert "rows normalised (layer_norm) in the kernel (each CTA holds whole rows" in r.reason
    lib = generate_kernel(p, r.nodes, name="lib", kind=r.kind)
    alts = [a for a in lib.alternatives if a.get("form") == FORM]
    whole = [a for a in alts if a.get("whole_rows")]
    assert whole and all(generate_kernel(p, r.nodes, name="t", params=a).params["block_n"] == 768 for a in whole)
    # sm_90's TMA tiles: 128 x 128 and 128 x 64, the rows shared by a cluster of 6 CTAs, or by 12 through the
    # workspace
    shared = [a for a in alts if not a.get("whole_rows")]
    assert [(a.get("mma"), a["block_n"]) for a in shared] == [("tma", 128), ("tma", 64)]
    by_cluster, by_workspace = (generate_kernel(p, r.nodes, name="t2", params=a).source for a in shared)
    assert "__cluster_dims__(kNTiles, 1, 1)" in by_cluster and "kPreAt" not in by_cluster
    assert "kPreAt" in by_workspace and "__cluster_dims__" not in by_workspace
    from agent_core.agent.tune import tune_space
    space = [q for q in tune_space(lib, arch="sm_90") if q.get("form") == FORM]
    assert [q.get("mma") for q in space][:3] == [None, "tma", "tma"]


def _out_projection(L=37, B=2, E=48, K=40, residual_shape=None, reduce=False):
    """nn.MultiheadAttention's out-projection as it imports: linear over [L * B, K], viewed as [L, B, E],
    plus the residual [L, B, E] (or `residual_shape`), then layer_norm (or a sum over E: reduce)."""
    p = Program("out_proj")
    x = p.add_input("x", (L * B, K))
    rng = np.random.default_rng(1)
    y = p.add_node("linear", [x.id, p.add_parameter("w", (rng.standard_normal((E, K)) / np.sqrt(K)).astype(np.float32)).id,
                              p.add_parameter("b", rng.standard_normal(E).astype(np.float32)).id]).outputs[0]
    v = p.add_node("reshape", [y], {"shape": [L, B, E]}).outputs[0]
    s = p.add_node("add", [v, p.add_input("res", residual_shape or (L, B, E)).id]).outputs[0]
    if reduce:
        p.mark_output(p.add_node("sum", [s], {"dim": [-1], "keepdim": False}).outputs[0])
    else:
        p.mark_output(p.add_node("layer_norm", [s], {"normalized_shape": [E], "eps": 1e-5}).outputs[0])
    return p


@pytest.mark.parametrize("reduce", [False, True], ids=["layer_norm", "row-sum"])
def test_a_relabel_between_the_gemm_and_its_epilogue_costs_nothing(reduce):
    """The out-projection's [L * B, E] -> [L, B, E] view: the same elements in the same order, so the
    residual [L, B, E] is read at the GEMM's flat index and the norm (or a reduction) runs over its rows."""
    p = _out_projection(reduce=reduce)
    ks, pairs, _ = emulate(p, {}, draws=2)
    assert ks.kind == "gemm" and len(ks.outputs) == 1 and "// reshape" not in ks.source   # no line of its own
    assert p.values[ks.outputs[0]].shape == ((37, 2) if reduce else (37, 2, 48))
    for got, want in pairs:
        torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)


def test_an_operand_that_does_not_line_up_after_a_relabel_is_refused():
    p = _out_projection(residual_shape=(1, 2, 48))      # broadcast over L in [L, B, E]: not a row pattern
    why = gemm_supported(p, list(p.nodes))
    assert why and "does not line up" in why


@pytest.mark.parametrize("N", [512, 768, 1024])
def test_every_tiling_the_tuner_tries_fits_in_shared_memory(N):
    """A tiling that does not build is a tuning trial wasted (and a warning in the log): every variant
    fits, however wide the row; the whole-row ones keep it."""
    p = program(300, N, 256)
    first = default_params(gemm_spec(p, region_io(p, list(p.nodes))))
    for params in [first] + tune_variants(first):
        ks = generate_kernel(p, list(p.nodes), name="fits", params=params)
        assert ks.params["block_n"] >= N or not params["whole_rows"]
