"""On the GPU: strided-slice kernels (x[start:end:step] along one dim) match torch's slicing on 5 random
draws, alone and with a pointwise prologue and epilogue, for steps 2 and 3 along the last and a middle
dim, odd sizes, negative and out-of-range bounds.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_layout_slice.py"""
import pytest
import torch

from agent_core.runtime import build_region
from tests.programs import SLICE_BOUNDS_CASES, SLICE_CASES, sliced

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = SLICE_CASES + SLICE_BOUNDS_CASES + [((64, 1025), 1, 1, None, 2), ((3, 4097, 3), 1, 0, None, 3)]


@pytest.mark.parametrize("around", [False, True], ids=["alone", "pro_epi"])
@pytest.mark.parametrize("shape,dim,start,end,step", CASES)
def test_strided_slice_matches_torch(shape, dim, start, end, step, around):
    p, ids = sliced(shape, dim, start, end, step, around)
    r = build_region(p, ids, name=f"slice_step{step}")
    assert r.kernel.kind == "strided_slice"
    assert r.fused, r.fallback_reason
    assert r.verify.ok and r.verify.draws == 5, r.verify
