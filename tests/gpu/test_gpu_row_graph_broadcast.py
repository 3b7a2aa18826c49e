"""On the GPU, at real sizes: the row graph's operands smaller than the rows (a channel bias beside
[N, C] rows, a per-sample count beside [B, D] rows, a causal mask over [L, L] beside
[B, H, L, L] rows, a scale computed from a scalar) and its (sample, group) rows of group_norm and
instance_norm, each equal to torch (fp32, TF32 off) at atol = rtol = 1e-4.
(The CPU emulates the same kernels at small sizes: tests/test_codegen_multi_reduce.py.)

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_row_graph_broadcast.py"""
import pytest
import torch

from tests.programs import fused
from tests.test_codegen_multi_reduce import (causal_scaled_softmax, channel_stats_bias, group_norm_silu,
                                             pooled_over_count)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("builder,shape", [(channel_stats_bias, (16, 64, 56, 56)), (pooled_over_count, (256, 128, 384)),
                                           (causal_scaled_softmax, (8, 12, 512, 512))])
def test_operands_smaller_than_the_rows_in_one_kernel_equal_torch(builder, shape):
    p, ids = builder(shape)
    r = fused(p, ids, p.name)            # generated, launched and verified on 5 draws
    assert r.kernel.params["reductions"] == 2, r.kernel.params


@pytest.mark.parametrize("shape,groups,instance", [((16, 320, 64, 64), 32, False), ((8, 512, 1024), 32, False),
                                                   ((16, 64, 32, 32), None, True), ((2, 64, 256, 256), 8, False)])
def test_group_rows_equal_torch(shape, groups, instance):
    from agent_core.codegen.region_io import region_io
    from agent_core.codegen.rowkernel import generate_multi_reduction
    from agent_core.reference import run_reference
    from agent_core.runtime.launch import load_kernel
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    p, ids = group_norm_silu(shape, groups, instance)
    ks = generate_multi_reduction(p, region_io(p, ids), "gn")
    loaded = load_kernel(ks, p)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        ins = [(torch.randn(p.values[v].shape, generator=g) * 3 + 1).cuda() for v in p.inputs]
        env = run_reference(p, ins, keep=True)
        outs = loaded([env[v] for v in ks.inputs])
        for v, got in zip(ks.outputs, outs):
            torch.testing.assert_close(got, env[v], atol=1e-4, rtol=1e-4)
