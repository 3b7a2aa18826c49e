"""On the GPU: guarded loads (codegen/rowguard.py) at real sizes against torch, atol = rtol = 1e-5:
GPT-2's causal softmax (8 x 12 x 1024 x 1024), BLOOM's future mask with ALiBi (1 x 32 x 2048 x 2048,
one block per row), a causal row of scalar loads, and BERT's key padding through masked_fill (also
over rows long enough for a cluster per row and for split rows), and cross entropy whose ignored
labels' rows are never read (also DeepLab's per-pixel loss, a column per pixel, with void pixels).

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_guarded_loads.py
"""
import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.reference import run_reference
from tests.test_codegen_guarded_loads import causal, cross_entropy, padded_keys, segmentation_loss

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = {
    "GPT-2 causal 8 x 12 x 1024": lambda: causal((8, 12, 1024, 1024)),
    "BLOOM future + ALiBi 32 x 2048": lambda: causal((1, 32, 2048, 2048), reverse=True, bias=True),
    "causal scalar loads 2 x 4 x 1001": lambda: causal((2, 4, 1001, 1001)),
    "BERT key padding 16 x 12 x 512": lambda: padded_keys((16, 12, 512, 512)),
    "key padding, a cluster per row 128 x 20000": lambda: padded_keys((1, 1, 128, 20000)),
    "key padding, split rows 64 x 30000": lambda: padded_keys((1, 1, 64, 30000)),
    "cross entropy 4096 x 32000, a third of the labels ignored": lambda: cross_entropy((4096, 32000)),
    "cross entropy 1024 x 50257 (scalar loads), ignored rows": lambda: cross_entropy((1024, 50257), "sum"),
    "per-pixel loss 8 x 19 x 512 x 1024, void pixels": lambda: segmentation_loss((8, 19, 512, 1024)),
}


@pytest.mark.parametrize("case", CASES)
def test_gpu_guarded_loads_match_torch(case):
    from agent_core.runtime.launch import load_kernel
    program, ids, inputs = CASES[case]()
    ks = generate_kernel(program, ids, name="guarded")
    assert "take_scores" in ks.source or ks.params["guarded_rows"] == ["logits"], ks.params
    want = run_reference(program, inputs, keep=True)
    k = load_kernel(ks, program)
    by_value = dict(zip(program.inputs, inputs))
    got = k([by_value[v].cuda() for v in ks.inputs])[0].cpu()
    torch.testing.assert_close(got, want[ks.outputs[0]].reshape(got.shape), atol=1e-5, rtol=1e-5)
