"""On the GPU (sm_90): the tile GEMM's warp-specialised TMA loop (codegen/gemm_tma.py, params mma "tma"):
producers copy each k slice with TMA and split it in shared memory, consumers issue wgmma on both operands
there. Each kernel is built, launched and verified against torch on 5 random draws at atol = rtol = 1e-4
(tests/programs.py `fused`) on ragged shapes (rows, columns and k past a tile's edge), both tile widths,
and replayed in a CUDA graph (the tensor maps travel by value with the launch). -rP prints each shape's
time against cuBLAS fp32 plus torch's epilogue (TF32 off) and its worst error against float64 beside
torch fp32's.

PYTHONPATH=. python3 -m pytest -m gpu -rP tests/gpu/test_gemm_tma_gpu.py
"""
import pytest
import torch

from agent_core.codegen import gemm_tma
from agent_core.codegen.gemm_mma import FORM
from tests.programs import fused
from tests.test_gemm_epilogue import program

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU")]


def _params(bn):
    """The tuner's TMA tile of this width (gemm_tma.variants), as a run would build it."""
    return next(v for v in gemm_tma.variants({"form": FORM}) if v["block_n"] == bn)


def _inputs(p, r):
    from agent_core.reference import parameter_tensors
    tensors = parameter_tensors(p, "cuda")
    return [tensors[v] if v in tensors else torch.randn(p.values[v].shape, device="cuda") for v in r.inputs], tensors


@pytest.mark.parametrize("shape", [(300, 260, 64), (70, 50, 44), (1000, 520, 1000), (394, 2048, 512),
                                   (257, 130, 8192)],
                         ids=["ragged", "one-tile", "k-past-slice", "vit-mlp-in", "k8192"])
@pytest.mark.parametrize("bn", [128, 64])
def test_matches_torch_and_prints_its_time(shape, bn):
    from agent_core.profile.baselines import strict_fp32
    from agent_core.profile.timing import time_gpu
    strict_fp32()
    M, N, K = shape
    p = program(M, N, K)
    r = fused(p, list(p.nodes), "gemm_tma", params=_params(bn))
    assert r.kernel.params["mma"] == "tma" and len(r.kernel.tensor_maps) == 2
    ins, tensors = _inputs(p, r)
    by = {p.values[v].name: t for v, t in tensors.items()}
    x = ins[0]
    d = {k: t.double() for k, t in by.items()}
    exact = torch.tanh(torch.relu(x.double() @ d["w"].T + d["b"]) * d["s"])

    def torch_form():
        return torch.tanh(torch.relu(torch.nn.functional.linear(x, by["w"], by["b"])) * by["s"])
    err_ours = (r(ins)[0].double() - exact).abs().max().item()
    err_torch = (torch_form().double() - exact).abs().max().item()
    launch = r.loaded.bind(ins, [torch.empty(M, N, device="cuda")])   # as a run launches it: no per-call checks
    ours, theirs = time_gpu(launch, trials=30).median_ms, time_gpu(torch_form, trials=30).median_ms
    assert err_ours < 1e-5, (err_ours, err_torch)     # fp32-class: split TF32 with per-slice fp32 sums
    print(f"linear {M} x {K} -> {N} + relu, scale, tanh, 128 x {bn} tiles: ours {ours * 1e3:.1f} us, cuBLAS fp32 + "
          f"torch {theirs * 1e3:.1f} us: {theirs / ours:.2f}x; worst error against float64 {err_ours:.2e} "
          f"(torch fp32 {err_torch:.2e})")


def test_a_cuda_graph_replays_it_with_its_tensor_maps():
    """Launched as a run's CUDA graph launches it (program_runtime raw_launch: raw pointers, the maps
    encoded from them), captured once and replayed on new inputs copied into the same tensors: the maps
    (addresses baked in) still read them, and the output matches a fresh launch."""
    from agent_core.program_runtime.executable import raw_launch
    p = program(300, 260, 96)
    r = fused(p, list(p.nodes), "gemm_tma_graph", params=_params(128))
    ins, _ = _inputs(p, r)
    out = torch.empty(300, 260, device="cuda")
    raw_launch(r.loaded, ins, [out])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        raw_launch(r.loaded, ins, [out])
    ins[0].copy_(torch.randn_like(ins[0]))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, r(ins)[0], rtol=0, atol=0)


@pytest.mark.parametrize("M,N,K,reds,post", [(300, 100, 64, ["sum", "max"], True), (1000, 1000, 520, ["logsumexp"], False),
                                             (4096, 1024, 1024, ["logsumexp", "max"], False),
                                             (600, 1100, 256, ["logsumexp"], True)],
                         ids=["whole-rows-post", "ragged-cluster-of-8", "lse-4096-cluster-of-8", "ragged-9-ctas-workspace"])
def test_row_reductions_after_it_match_torch(M, N, K, reds, post):
    """Row reductions of the epilogue's output (gelu, then each of reds over the last dim), combined by the
    consumers alone (named barrier) and across the CTAs sharing a row: a thread-block cluster of up to 8,
    or more through the workspace and tickets."""
    from tests.test_gemm_row_reduction import program as rows_program
    p = rows_program(M, N, K, reds, post=post)
    r = fused(p, list(p.nodes), "gemm_tma_rows", params=_params(128))
    assert r.kernel.params["mma"] == "tma" and "rows reduced in the kernel" in r.kernel.schedule
    tiles = -(-N // 128)
    assert ("__cluster_dims__(kNTiles, 1, 1)" in r.kernel.source) == (1 < tiles <= 8)   # the path its id names


@pytest.mark.parametrize("shape", [(257, 130, 8192), (394, 512, 2048)], ids=["k8192-6-tiles", "vit-mlp-out"])
@pytest.mark.parametrize("bn", [128, 64])
def test_split_k_parts_add_up_as_a_cluster_match_torch_and_replay_the_same_bits(shape, bn):
    """Few output tiles and a long K: the tuner's TMA tiles cut K into parts (gemm_mma.tma_alternatives),
    one thread-block cluster per output tile adding its parts' sums on chip; verified on 5 draws, then
    20 more runs give the same bits (the parts always add in the same order). -rP prints the time
    against the same tiles without the split."""
    from agent_core.codegen.gemm_mma import gemm_spec, tma_alternatives
    from agent_core.codegen.region_io import region_io
    from agent_core.profile.timing import time_gpu
    M, N, K = shape
    p = program(M, N, K)
    params = next(a for a in tma_alternatives(gemm_spec(p, region_io(p, list(p.nodes)))) if a["block_n"] == bn)
    assert params["split_k"] > 1
    r = fused(p, list(p.nodes), "gemm_tma_split", params=params)
    whole = fused(p, list(p.nodes), "gemm_tma_whole", params={**params, "split_k": 1})
    ins, _ = _inputs(p, r)
    first = r(ins)[0].clone()
    for _ in range(20):
        assert torch.equal(r(ins)[0], first)
    split_ms = time_gpu(r.loaded.bind(ins, [torch.empty(M, N, device="cuda")]), trials=30).median_ms
    whole_ms = time_gpu(whole.loaded.bind(ins, [torch.empty(M, N, device="cuda")]), trials=30).median_ms
    print(f"linear {M} x {K} -> {N}, 128 x {bn} tiles: K in {params['split_k']} parts {split_ms * 1e3:.1f} us, "
          f"whole {whole_ms * 1e3:.1f} us: {whole_ms / split_ms:.2f}x")
