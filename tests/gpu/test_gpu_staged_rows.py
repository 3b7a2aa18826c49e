"""On the GPU: row kernels that stage rows read through a transposing view in shared memory
(codegen/row_stage.py): ViT-B/16's token assembly + layer_norm at its real size, staged with 8 and 32
rows per block and not staged, and other shapes of the class (odd widths, a partial last block, a
permute feeding a softmax). Each is built, launched and verified against torch on 5 random draws at
atol = rtol = 1e-4 (tests/programs.py `fused`); the staged and unstaged kernels give the same bits.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_staged_rows.py
"""
import pytest
import torch

from tests.programs import fused
from tests.test_codegen_layout_rows import _all, permute_softmax, vit_tokens

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = [("vit-b16", vit_tokens, (128, 768, 14)), ("vit-b16-batch-8", vit_tokens, (8, 768, 14)),
         ("vit-odd", vit_tokens, (3, 37, 5)), ("vit-narrow", vit_tokens, (5, 64, 7)),
         ("permute-softmax", permute_softmax, ((8, 1024, 197),)), ("permute-softmax-odd", permute_softmax, ((3, 21, 35),))]


@pytest.mark.parametrize("params", [None, {"block": 1024}, {"stage": False}], ids=["8-rows", "32-rows", "unstaged"])
@pytest.mark.parametrize("case,build,args", CASES, ids=[c[0] for c in CASES])
def test_gpu_staged_rows_match_torch(case, build, args, params):
    p = build(*args)
    r = fused(p, _all(p), f"staged_{case.replace('-', '_')}", params=params)
    assert r.kernel.kind == "row_reduction"
    if params != {"stage": False} and case.startswith("vit-b16"):
        assert r.kernel.params["staged"] and r.kernel.shared_bytes > 0


def test_gpu_staged_and_unstaged_give_the_same_bits():
    """The staging changes where the prologue is computed, not its arithmetic: the tokens and their
    layer_norm come out bit for bit the same from the three variants, and match torch."""
    from agent_core.reference import parameter_tensors, run_reference
    p = vit_tokens(16, 768, 14)
    torch.manual_seed(0)
    x = torch.randn(p.values[p.inputs[0]].shape, device="cuda")
    env = {**parameter_tensors(p, "cuda"), p.inputs[0]: x}
    ref = run_reference(p, [x], keep=True)
    outs = []
    for params in (None, {"block": 1024}, {"stage": False}):
        r = fused(p, _all(p), "staged_bits", params=params)
        outs.append([t.clone() for t in r([env[v] for v in r.inputs])])
        for v, got in zip(r.outputs, outs[-1]):
            torch.testing.assert_close(got, ref[v], atol=1e-4, rtol=1e-4)
    for got in outs[:-1]:
        assert all(torch.equal(a, b) for a, b in zip(got, outs[-1]))
