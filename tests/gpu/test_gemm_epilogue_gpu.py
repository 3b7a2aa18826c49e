"""On the GPU: the tile GEMM with its epilogue fused (codegen/gemm_mma.py, 3xTF32 on mma.sync with the
split in registers). Each kernel is built, launched and verified against torch on 5 random draws at
atol = rtol = 1e-4 (tests/programs.py `fused`), on ragged shapes, with and without bias, linear's
[N, K] weight and matmul's [K, N], several tile variants, and KernelBench level 2's K = 8192; its worst
error against a float64 reference is bounded well inside the tolerance.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gemm_epilogue_gpu.py
"""
import pytest
import torch

from tests.programs import fused
from tests.test_gemm_epilogue import program

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

VARIANTS = [{}, {"block_k": 16, "stages": 4}, {"block_m": 128, "block_n": 128, "warps_m": 2, "warps_n": 4}]
SHAPES = [((256, 192, 128), "linear", True), ((100, 70, 37), "matmul", False), ((33, 20, 13), "linear", False),
          ((1000, 520, 300), "linear", True), ((130, 72, 40), "matmul", False)]


@pytest.mark.parametrize("params", VARIANTS, ids=["default", "k16-4stages", "128x128"])
@pytest.mark.parametrize("shape,op,bias", SHAPES, ids=[f"{op}-{'x'.join(map(str, s))}-{'bias' if b else 'nobias'}"
                                                       for s, op, b in SHAPES])
def test_tile_gemm_with_epilogue_matches_torch(shape, op, bias, params):
    p = program(*shape, op=op, bias=bias)
    r = fused(p, list(p.nodes), "gemm_epi_gpu", params={"form": "gemm-3xtf32", **params})
    assert r.kernel.kind == "gemm"


@pytest.mark.parametrize("ash,bsh,op", [((3, 137, 70), (3, 70, 145), "bmm"), ((2, 3, 133, 64), (2, 3, 64, 96), "matmul"),
                                         ((133, 64), (6, 64, 96), "matmul"),
                                         ((16, 12, 256, 64), (16, 12, 64, 256), "matmul")])
def test_a_stack_of_gemms_matches_torch(ash, bsh, op):
    from tests.test_gemm_epilogue import batched_program
    p = batched_program(ash, bsh, op)
    r = fused(p, list(p.nodes), "bmm_epi_gpu", params={"form": "gemm-3xtf32"})
    assert r.kernel.kind == "gemm" and r.kernel.grid[2] > 1


def k8192_errors(params: dict, name: str) -> tuple[float, float]:
    """linear 512 x 1024 x 8192 + bias -> relu -> * s -> tanh as our tile GEMM with `params`, verified:
    (our worst error against float64, torch fp32's)."""
    from agent_core.reference import parameter_tensors, run_reference
    p = program(512, 1024, 8192, op="linear", bias=True)
    r = fused(p, list(p.nodes), name, params={"form": "gemm-3xtf32", **params})
    torch.manual_seed(1)
    x = torch.randn(512, 8192, device="cuda")
    tensors = parameter_tensors(p, "cuda")
    env = {**tensors, p.inputs[0]: x}
    got = r([env[v] for v in r.inputs])[0]
    ref32 = run_reference(p, [x], keep=True)[p.outputs[0]]
    by_name = {p.values[v].name: t.double() for v, t in tensors.items()}
    ref64 = torch.tanh(torch.relu(x.double() @ by_name["w"].T + by_name["b"]) * by_name["s"])
    ours, theirs = ((got.double() - ref64).abs().max().item(), (ref32.double() - ref64).abs().max().item())
    print(f"K=8192 {params}: ours {ours:.2e}, torch fp32 {theirs:.2e} against float64")
    return ours, theirs


def test_kernelbench_scale_k_stays_inside_the_tolerance_against_float64():
    """K = 8192 (level 2's GEMMs): the per-slice accumulators keep the 3xTF32 form's error far below
    1e-4 against float64, and within 4x of torch's own fp32 GEMM's."""
    ours_err, torch_err = k8192_errors({}, "gemm_k8192")
    assert ours_err < 1e-4 and ours_err <= 4 * torch_err + 1e-6, (ours_err, torch_err)
