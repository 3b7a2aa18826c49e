"""On the GPU: linear resampling (tests/test_upsample_linear.py's cases), nearest resampling by a whole
factor (views), and nan_to_num, each as the kernel the planner proposes, verified against the reference
on 5 random draws; DeepLab-sized logits upsampled into a log-softmax over the classes as one kernel.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_resample.py"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agent_core.importers import import_nn_module
from agent_core.planner import plan_program
from tests.programs import fused
from tests.test_upsample_linear import CASES, Resample, SegHead

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _one_region(module, inputs):
    p = import_nn_module(module, inputs)
    [region] = plan_program(p).active
    return p, list(region.nodes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_linear_resampling_runs_as_a_verified_kernel(name):
    shape, kw = CASES[name]
    p, ids = _one_region(Resample(**kw), [torch.randn(*shape)])
    assert fused(p, ids, name).kernel.kind == "pooling"


def test_upsampled_logits_into_a_log_softmax_run_as_one_verified_kernel():
    p, ids = _one_region(SegHead(), [torch.randn(2, 19, 64, 128)])
    assert fused(p, ids, "seg").kernel.kind == "row_reduction"


class Nearest(nn.Module):
    def forward(self, x, skip):
        return torch.nan_to_num(torch.cat([F.interpolate(x, scale_factor=2), skip], 1)).sigmoid()


def test_nearest_upsampling_and_nan_to_num_run_as_one_verified_kernel():
    p, ids = _one_region(Nearest(), [torch.randn(2, 8, 32, 48), torch.randn(2, 4, 64, 96)])
    fused(p, ids, "nearest")
