"""Split K inside the tile GEMM (codegen/gemm_mma.py, params split_k): where the output's tiles leave
most SMs idle and K is long (ViT-B at batch 2: 394 rows of 512 columns, K = 2048), the CTAs of each
output tile cut K into parts along grid z and take turns in order, each adding the running sum of
those before it, the last applying the epilogue. No partial product per part is kept: one running sum
of the output's size and a turn per tile, both left ready for the next launch. The kernel body runs in
the CPU emulator and matches torch on ragged K and every epilogue kind (pointwise, row reductions of
whole rows, a norm); it compiles for sm_90 without spills; the default picks it by the tiles alone and
the tuner also times the same tiles without it."""
from __future__ import annotations

import pytest

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.codegen.gemm_mma import FORM, default_params, gemm_spec, tune_variants
from agent_core.codegen.region_io import region_io
from tests.test_gemm_epilogue import program as epilogue_program
from tests.test_gemm_norm import program as norm_program
from tests.test_gemm_row_reduction import emulate, program as rows_program

torch = pytest.importorskip("torch")


def _spec(p):
    return gemm_spec(p, region_io(p, list(p.nodes)))


@pytest.mark.parametrize("make,params", [
    (lambda: epilogue_program(70, 64, 1024), {"split_k": 4}),
    (lambda: epilogue_program(33, 20, 300), {"split_k": 3, "block_k": 16, "stages": 4}),   # uneven parts
    (lambda: epilogue_program(40, 48, 200, op="matmul", bias=False), {"split_k": 2}),
    (lambda: norm_program(40, 96, 1000), {"split_k": 3}),                                  # + layer_norm
    (lambda: rows_program(30, 40, 700, ["logsumexp", "mean"]), {"split_k": 2, "block_n": 64, "warps_n": 2}),
], ids=["pointwise-4", "ragged-3", "matmul-2", "norm-3", "rows-2"])
def test_split_parts_match_torch_and_leave_the_turns_ready(make, params):
    p = make()
    ks, pairs, turns = emulate(p, params, draws=2)
    parts = params["split_k"]
    assert ks.grid[2] == parts and ks.workspace[-1][0] == "int32"
    assert ks.workspace[0] == ("float32", _spec(p).M * _spec(p).N)     # one running sum, not one per part
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert turns and all(not t.any() for t in turns)            # a replay needs no memset


def test_the_default_splits_k_only_where_the_tiles_leave_sms_idle(monkeypatch):
    from agent_core.codegen import gemm_mma
    assert gemm_mma.SPLIT_K_DEFAULT         # its parts' turns ran on an H100 and paid on ViT's shapes
    vit = default_params(_spec(norm_program(394, 512, 2048)))   # 25 whole-row tiles: 4 parts of 512
    assert vit["split_k"] == 4 and vit["block_n"] == 512
    assert default_params(_spec(epilogue_program(4096, 1024, 1024)))["split_k"] == 1    # 512 tiles
    assert default_params(_spec(epilogue_program(256, 256, 256)))["split_k"] == 1       # K too short
    first = default_params(_spec(epilogue_program(256, 256, 4096)))
    assert first["split_k"] > 1 and {**first, "split_k": 1} in tune_variants(first)   # timed without it too
    monkeypatch.setattr(gemm_mma, "SPLIT_K_DEFAULT", False)
    assert default_params(_spec(norm_program(394, 512, 2048)))["split_k"] == 1


def test_what_cannot_be_split_is_refused():
    p = rows_program(30, 150, 700, ["sum"])       # rows shared by 3 CTAs: their states' own workspace
    with pytest.raises(CodegenError, match="rows shared"):
        generate_kernel(p, list(p.nodes), name="x", params={"form": FORM, "split_k": 2, "block_n": 64, "warps_n": 2})
    q = epilogue_program(64, 64, 64)
    with pytest.raises(CodegenError, match="split-K parts"):
        generate_kernel(q, list(q.nodes), name="y", params={"form": FORM, "split_k": 4})


@pytest.mark.parametrize("make,parts", [(lambda: norm_program(394, 512, 2048), 4),
                                        (lambda: epilogue_program(256, 256, 4096), 8)],
                         ids=["vit-mlp-out-layer-norm", "square-k4096"])
def test_split_variants_compile_for_sm90_without_spills(make, parts):
    from agent_core.compiler import compile_kernel
    p = make()
    ks = generate_kernel(p, list(p.nodes), name="gemm_split", params={"form": FORM, "split_k": parts})
    assert ks.params["split_k"] > 1 and "atomicExch(&counters[turn]" in ks.source
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0, c.log
    assert [ln for ln in c.log.splitlines() if "warning" in ln] == []
