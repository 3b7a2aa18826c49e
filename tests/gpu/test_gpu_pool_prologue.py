"""On the GPU: windowed poolings feeding a reduction or another pooling, as one kernel with each pooled
element computed from its window where it is read (codegen/layout_graph.py), match the reference on 5
random draws (atol = rtol = 1e-4): the CPU tests' cases, level 2's 43 chain at more channels, and a
pool of a pool.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_pool_prologue.py"""
import pytest
import torch

from tests.pool_prologue_cases import CASES, MP3, chain
from tests.programs import fused

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("name", sorted(CASES))
def test_pools_before_a_reduction_run_as_one_verified_kernel(name):
    p, ids, _ = chain(name)
    r = fused(p, ids, name)
    assert r.kernel.kind == "row_reduction"


def test_level_2_43s_chain_at_64_channels():
    p, ids, _ = chain("wide_lse", ([2, 64, 8, 32, 32], [("max_pool3d", MP3), ("relu", {}),
                                                        ("logsumexp", {"dim": [1], "keepdim": True}), ("relu", {})]))
    fused(p, ids, "wide_lse")


def test_a_pool_of_a_pool_runs_as_one_verified_kernel():
    p, ids, _ = chain("pools", ([2, 16, 8, 32, 32], [("max_pool3d", MP3), ("relu", {}), ("max_pool3d", MP3)]))
    r = fused(p, ids, "pools")
    assert r.kernel.kind == "pooling"
