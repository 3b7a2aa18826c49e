"""On the GPU: softmax-weighted sums folded in one pass (tests/test_softmax_dot.py's modules) at sizes
whose rows stream (30k-class distillation, soft-label cross entropy, entropy), each the kernel the
planner proposes, verified against the reference on 5 random draws.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_softmax_dot.py"""
import pytest
import torch

from agent_core.importers import import_nn_module
from agent_core.planner import plan_program
from agent_core.rewrites import rewrite_program
from tests.programs import fused
from tests.test_softmax_dot import KL, Entropy, SoftCrossEntropy, WeightedMean

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("module", [KL, SoftCrossEntropy, Entropy, WeightedMean], ids=lambda m: m.__name__)
@pytest.mark.parametrize("shape", [(512, 30522), (64, 65536)], ids=["30k", "64k"])
def test_a_softmax_weighted_sum_over_long_rows_runs_as_one_verified_kernel(module, shape):
    s, t = torch.randn(*shape) * 3, torch.randn(*shape) * 3
    p = rewrite_program(import_nn_module(module(), [s, t])).program
    # the region of the softmax-weighted sum (a mean over the rows after it may be a region of its own)
    [region] = [r for r in plan_program(p).active if any(p.nodes[n].op == "softmax" for n in r.nodes)]
    run = fused(p, list(region.nodes), f"sd_{module.__name__}")
    assert "softdot" in run.kernel.source and run.kernel.params["rounds"] == 1
