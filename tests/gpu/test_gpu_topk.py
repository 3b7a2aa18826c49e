"""On the GPU: a mixture-of-experts router's softmax and top-k (tests/test_topk.py) at real sizes, each
kernel the planner proposes verified against the reference on 5 random draws.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_topk.py"""
import pytest
import torch

from agent_core.importers import import_nn_module
from agent_core.planner import plan_program
from tests.programs import fused
from tests.test_topk import TopK

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("tokens,experts,k", [(8192, 8, 2), (4096, 64, 6), (2048, 256, 8)])
def test_router_top_k_kernels_verify(tokens, experts, k):
    p = import_nn_module(TopK(k), [torch.randn(tokens, experts)])
    kernels = [r for r in plan_program(p).active if r.kind != "single"]
    assert any(p.nodes[n].op == "argmax" for r in kernels for n in r.nodes)
    for r in kernels:
        fused(p, list(r.nodes), f"topk_{r.id}")
