"""On the GPU: reductions a row kernel computes in its prologue (codegen/reduce_window.py) at real sizes,
built, launched and verified on 5 random draws by build_region (tests/programs.fused): a sentence
embedding's masked sum over 256 tokens then its L2 normalisation (MiniLM, 256 x 384), a ViT's mean
over its 196 patch tokens then LayerNorm (768 features), a max over tokens then softmax; and windows
innermost (contiguous), staged through shared memory: ConvNeXt's global average pool over 7 x 7 then
LayerNorm over 768 channels, a max over 9 then softmax over 4096, a sum over 16 then L2 over 32
(warp rows), a mean over 1000 (one window a chunk), each also as per-element loops (`stage: False`).

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_reduce_window.py
"""
import pytest
import torch

from tests.programs import fused
from tests.test_reduce_window import pooled_norm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = {
    "MiniLM masked sum, L2, 256 x 256 x 384": lambda: pooled_norm((256, 256, 384), pool="sum", norm="l2", mask=True),
    "ViT patch tokens' mean, fc_norm, 256 x 197 x 768": lambda: pooled_norm((256, 197, 768), skip_first=True),
    "token max, softmax, 512 x 64 x 1000": lambda: pooled_norm((512, 64, 1000), pool="max", norm="softmax"),
}
STAGED = {
    "ConvNeXt head: channel mean over 7 x 7, LayerNorm, 256 x 768 x 49": lambda: pooled_norm((256, 768, 49), dims=(2,)),
    "max over 9, softmax over 4096, 64 rows": lambda: pooled_norm((64, 4096, 9), dims=(2,), pool="max", norm="softmax"),
    "sum over 16, L2 over 32 (warp rows), 4100 rows": lambda: pooled_norm((4100, 32, 16), dims=(2,), pool="sum", norm="l2"),
    "mean over 1000, LayerNorm over 256, 50 rows": lambda: pooled_norm((50, 256, 1000), dims=(2,)),
}


@pytest.mark.parametrize("case", CASES)
def test_gpu_reduction_windows_verify(case):
    p, ids, _, _ = CASES[case]()
    r = fused(p, ids, "pooled")
    assert "each element folds its" in r.kernel.source, r.kernel.source[:2000]


@pytest.mark.parametrize("stage", [True, False])
@pytest.mark.parametrize("case", STAGED)
def test_gpu_contiguous_windows_verify_staged_and_as_loops(case, stage):
    p, ids, _, _ = STAGED[case]()
    r = fused(p, ids, "pooled", params={"stage": stage})
    assert r.kernel.params["staged_windows"] == (1 if stage else 0), r.kernel.params
    assert ("folded in shared memory (staged)" in r.kernel.source) == stage, r.kernel.source[:2000]
