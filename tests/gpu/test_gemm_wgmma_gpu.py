"""On the GPU (sm_90): the tile GEMM's wgmma main loop (codegen/gemm_wgmma.py). Each kernel is built,
launched and verified against torch on 5 random draws at atol = rtol = 1e-4 (tests/programs.py `fused`)
for every form tests/test_gemm_wgmma.py compiles, more tiles, and K = 8192, whose worst error against
float64 stays within 4x of torch's own fp32 GEMM's.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gemm_wgmma_gpu.py
"""
import pytest
import torch

from tests.programs import fused
from tests.test_gemm_epilogue import program
from tests.test_gemm_wgmma import CASES, WG

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                                 reason="wgmma is sm_90's")]


@pytest.mark.parametrize("case", list(CASES))
def test_each_form_matches_torch(case):
    make, params = CASES[case]
    p = make()
    r = fused(p, list(p.nodes), "wg_gpu", params={**WG, **params})
    assert "wgmma" in r.kernel.schedule


@pytest.mark.parametrize("params", [{"block_n": 256, "slice_acc": False}, {"block_n": 192, "stages": 2},
                                    {"block_m": 64, "warps_m": 4, "stages": 4}, {"block_m": 64, "warps_m": 4, "stages": 2},
                                    {"block_m": 256, "warps_m": 16, "block_n": 64, "stages": 2},
                                    {"block_n": 8}, {"slice_acc": False}])
def test_tiles_match_torch(params):
    p = program(700, 520, 300, op="linear", bias=True)
    fused(p, list(p.nodes), "wg_tiles", params={**WG, **params})


@pytest.mark.parametrize("params", [{}, {"block_n": 256, "slice_acc": False}], ids=["slice-sums", "256-plain-sums"])
def test_kernelbench_scale_k_stays_inside_the_tolerance_against_float64(params):
    from tests.gpu.test_gemm_epilogue_gpu import k8192_errors
    ours_err, torch_err = k8192_errors({**WG, **params}, "wg_k8192")
    assert ours_err < 1e-4 and ours_err <= 4 * torch_err + 1e-6, (ours_err, torch_err)
