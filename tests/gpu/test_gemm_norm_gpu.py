"""On the GPU: a normalising op after the tile GEMM in the same kernel (codegen/gemm_rows.py NORMS: each
CTA holds whole rows and normalises them in a second pass over its accumulators, or the CTAs of a row
tile share the rows through the workspace and its last one normalises them). Each kernel is built,
launched and verified against torch on 5 random draws at atol = rtol = 1e-4 (tests/programs.py `fused`)
for every op, ragged shapes, the tuner's tilings, and transformer shapes (ViT-B at batch 2: 394 rows,
2048 -> 512; BERT-base: 4096 rows, 768 -> 768, 3072 -> 768). Its precision is split TF32 (three TF32
products, fp32 sums): -rP prints each transformer shape's worst error against float64 beside torch
fp32's, and its time against cuBLAS fp32 and torch's LayerNorm (fp32, TF32 off). The split-K parts
those few-tile shapes take (tests/test_gemm_split_k.py) run here for the first time on a GPU too.

PYTHONPATH=. python3 -m pytest -m gpu -rP tests/gpu/test_gemm_norm_gpu.py
"""
import pytest
import torch

from agent_core.codegen.gemm_mma import FORM
from agent_core.codegen import gemm_tma
from tests.programs import fused
from tests.test_gemm_norm import program

H_SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
TMA_128, TMA_64 = gemm_tma.variants({})      # the tuner's TMA tiles: 128 x 128, 128 x 64
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm", "softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(70, 100, 44), (257, 520, 300)], ids=["ragged-small", "ragged-520"])
def test_each_normalising_op_matches_torch(norm, shape):
    p = program(*shape, norm)
    r = fused(p, list(p.nodes), "gemm_norm_gpu", params={"form": FORM})
    assert r.kernel.params["whole_rows"]


@pytest.mark.parametrize("params", [{"block_m": 32, "warps_m": 2}, {"stages": 2}, {"block_k": 16, "stages": 3}],
                         ids=["32-rows", "2-stages", "k16-3-stages"])
def test_the_tuners_tilings_match_torch(params):
    p = program(300, 768, 256)
    fused(p, list(p.nodes), "gemm_norm_tiles", params={"form": FORM, **params})


def _median_ms(fn, trials=50):
    from agent_core.profile.timing import time_gpu
    return time_gpu(fn, trials=trials).median_ms


@pytest.mark.parametrize("M,N,K", [(394, 512, 2048), (394, 512, 512), (4096, 768, 768), (4096, 768, 3072)],
                         ids=["vit-mlp-out", "vit-attn-out", "bert-attn-out", "bert-mlp-out"])
@pytest.mark.parametrize("form", ["whole-rows", "whole-rows-split-k", "shared-rows-64", "tma-128", "tma-64",
                                  "tma-128-tuner", "tma-64-tuner"])
def test_transformer_sublayer_shapes_match_torch_and_print_their_time(M, N, K, form):
    """Each tiling the tuner tries for it: whole-row tiles of 16 rows with K whole or split (the
    default where the tiles leave SMs idle), 64 x 64 tiles whose CTAs share the rows (the last one
    normalises them), and sm_90's TMA loop in 128 x 128 and 128 x 64 tiles sharing them as a thread-block
    cluster (up to 8 CTAs: 4 or 8 at N = 512, 6 at 768) or through the workspace (12 at 768); and the TMA
    tiles as the tuner takes them (gemm_mma.tma_alternatives), K cut into parts that take turns where the
    tiles leave SMs idle."""
    from agent_core.profile.baselines import strict_fp32
    from agent_core.reference import parameter_tensors
    strict_fp32()
    from agent_core.codegen.gemm_mma import SHARED_ROWS, default_params, gemm_spec
    from agent_core.codegen.region_io import region_io
    p = program(M, N, K, after=False)
    params = {"form": FORM, **{"whole-rows": {"split_k": 1}, "whole-rows-split-k": {}, "shared-rows-64": SHARED_ROWS,
                               "tma-128": TMA_128, "tma-64": TMA_64}.get(form, {})}
    if form == "whole-rows-split-k" and default_params(gemm_spec(p, region_io(p, list(p.nodes))), H_SMS)["split_k"] == 1:
        pytest.skip("enough tiles: no split")
    if form.endswith("-tuner"):
        from agent_core.codegen.gemm_mma import tma_alternatives
        bn = 64 if form == "tma-64-tuner" else 128     # the tuner's first try at this width: K cut, if it cuts
        params = {"form": FORM, **next(a for a in tma_alternatives(gemm_spec(p, region_io(p, list(p.nodes))))
                                       if a["block_n"] == bn)}
    if form.startswith("tma") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the TMA loop is sm_90's")
    r = fused(p, list(p.nodes), "gemm_ln", params=params)
    if form.startswith("tma"):      # up to 8 CTAs a row share it as a cluster, more through the workspace
        assert ("__cluster_dims__(kNTiles, 1, 1)" in r.kernel.source) == (-(-N // r.kernel.params["block_n"]) <= 8)
    tensors = parameter_tensors(p, "cuda")
    by = {p.values[v].name: t for v, t in tensors.items()}
    x, res = torch.randn(M, K, device="cuda"), torch.randn(M, N, device="cuda")
    env = {**tensors, p.inputs[0]: x, p.inputs[1]: res}
    ins = [env[v] for v in r.inputs]
    d = {k: t.double() for k, t in by.items()}
    exact = torch.nn.functional.layer_norm(x.double() @ d["w"].T + d["b"] + res.double(), (N,), d["g"], d["beta"], 1e-5)
    err_ours = (r(ins)[0].double() - exact).abs().max().item()
    ours = _median_ms(r.loaded.bind(ins, [torch.empty(M, N, device="cuda")]))   # as a run launches it

    def torch_form():
        y = torch.nn.functional.linear(x, by["w"], by["b"]) + res
        return torch.nn.functional.layer_norm(y, (N,), by["g"], by["beta"], 1e-5)
    theirs = _median_ms(torch_form)
    err_torch = (torch_form().double() - exact).abs().max().item()
    assert err_ours < 1e-4, err_ours          # split TF32 (3 products, fp32 sums) against float64
    print(f"linear {M} x {K} -> {N} + residual + layer_norm: ours {ours * 1e3:.1f} us "
          f"({r.kernel.params['block_m']} x {r.kernel.params['block_n']} tiles"
          f"{', a cluster per row tile' if '__cluster_dims__' in r.kernel.source else ''}, K in "
          f"{r.kernel.params.get('split_k', 1)} part(s)), cuBLAS fp32 + torch "
          f"{theirs * 1e3:.1f} us: {theirs / ours:.2f}x; worst error against float64 {err_ours:.2e} "
          f"(torch fp32 {err_torch:.2e})")


@pytest.mark.parametrize("shape,parts", [((256, 256, 4096), 8), ((300, 200, 1000), 3), ((394, 512, 2048), 4)],
                         ids=["square-k4096-8-parts", "ragged-3-parts", "vit-4-parts"])
def test_split_k_parts_take_turns_and_match_torch_on_every_replay(shape, parts):
    """Split K (codegen/gemm_mma.py _split_k_turn): the parts of a tile wait for each other in order on
    the GPU (no hang), match torch, and leave the turns ready: verified on 5 draws, then run 20 times
    more with the same inputs giving the same bits (the sum's order never changes)."""
    from tests.test_gemm_epilogue import program as epilogue_program
    p = epilogue_program(*shape)
    params = {"form": FORM, "split_k": parts}
    r = fused(p, list(p.nodes), "gemm_split_gpu", params=params)
    assert r.kernel.params["split_k"] > 1
    from agent_core.reference import parameter_tensors
    tensors = parameter_tensors(p, "cuda")
    ins = [tensors.get(v) if v in tensors else torch.randn(p.values[v].shape, device="cuda") for v in r.inputs]
    first = r(ins)[0].clone()
    for _ in range(20):
        assert torch.equal(r(ins)[0], first)
