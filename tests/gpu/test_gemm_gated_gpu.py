"""On the GPU: the tile GEMM with a gated unit inside (codegen/gemm_mma.py spec.halves): each kernel is
built, launched and verified against torch on 5 random draws at atol = rtol = 1e-4 (tests/programs.py
`fused`): GEGLU at Stable Diffusion 1.5's size, SwiGLU ragged, Conformer's pointwise conv + GLU.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gemm_gated_gpu.py
"""
import pytest
import torch

from tests.programs import fused
from tests.test_gemm_gated import gated

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("shape,op,act,params", [
    ((8192, 1280, 320), "linear", "gelu", {}),
    ((8192, 1280, 320), "linear", "gelu", {"block_m": 128, "block_n": 128, "warps_m": 2, "warps_n": 4}),
    ((1000, 344, 520), "matmul", "silu", {})],
    ids=["geglu_sd15", "geglu_128x128", "swiglu_ragged"])
def test_the_gated_gemm_matches_torch(shape, op, act, params):
    p = gated(*shape, op=op, act=act)
    r = fused(p, list(p.nodes), "gated_gpu", params={"form": "gemm-3xtf32", **params})
    assert "gated unit" in r.kernel.schedule


def test_conformers_pointwise_conv_and_glu_match_torch():
    from tests.test_gemm_gated import gated_conv
    p = gated_conv((32, 512, 400), 1024, (1,))
    r = fused(p, list(p.nodes), "gated_conv_gpu", params={"form": "gemm-3xtf32"})
    assert "gated unit" in r.kernel.schedule
