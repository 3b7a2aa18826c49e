"""On the GPU: strided-slice kernels (x[start:end:step] along one dim) match torch's slicing on 5 random
draws, alone and with a pointwise prologue and epilogue, for steps 2 and 3 along the last and a middle
dim, odd sizes, negative and out-of-range bounds; chains of layout ops (permute -> slice -> add, pads,
rolls, flips; gathered and tiled) read through views match torch too.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_layout_slice.py"""
import pytest
import torch

from agent_core.runtime import build_region
from tests.programs import SLICE_BOUNDS_CASES, SLICE_CASES, sliced
from tests.test_codegen_layout import CHAINS, _chain

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


# chains of layout ops through views (tests/test_codegen_layout.py checks their index arithmetic on
# the CPU): the small cases there, and larger ones that tile or gather over many blocks
CHAIN_CASES = [(shape, steps) for shape, steps, _ in CHAINS] + [
    ((16, 256, 512), [("permute", {"dims": [0, 2, 1]}), ("slice", {"dim": 1, "start": 7, "end": -9, "step": 1})]),
    ((8, 300, 130), [("transpose", {"dim0": 1, "dim1": 2}), ("slice", {"dim": 2, "start": 1, "end": None, "step": 2})]),
    ((4, 96, 1000), [("permute", {"dims": [2, 0, 1]}), ("flip", {"dims": [0]}),
                     ("pad", {"pad": [3, 1, 0, 2], "mode": "constant", "value": 0.25})]),
    ((64, 513), [("roll", {"shifts": [5], "dims": [1]}), ("transpose", {"dim0": 0, "dim1": 1})]),
]


@pytest.mark.parametrize("epilogue", [False, True], ids=["alone", "add_relu"])
@pytest.mark.parametrize("shape,steps", CHAIN_CASES, ids=[f"{k}-{'-'.join(s[0] for s in c[1])}"
                                                          for k, c in enumerate(CHAIN_CASES)])
def test_layout_chain_matches_torch(shape, steps, epilogue):
    """permute -> slice -> add and the other chains: one kernel, verified on 5 draws."""
    p, ids = _chain(shape, steps, epilogue)
    r = build_region(p, ids, name="chain")
    assert r.kernel.kind in ("layout", "strided_slice")
    assert r.fused, r.fallback_reason
    assert r.verify.ok and r.verify.draws == 5, r.verify
