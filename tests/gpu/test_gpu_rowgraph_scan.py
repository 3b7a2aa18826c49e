"""On the GPU, at real sizes: cumsum / cumprod in the row graph (rowscan.py) with what fuses around them
(a mask, flips read and written through views, a softmax before), in every schedule (warp, block,
stream) and tuning variant, equal to the reference (which scans in double) at atol = rtol = 1e-5.
(The CPU emulates the same kernels at small sizes: tests/test_rowgraph_scan.py.)

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_rowgraph_scan.py"""
import pytest
import torch

from tests.test_rowgraph_scan import masked, reverse, softmax_then_cumsum, strided

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _check(p, ids, variants=3):
    from agent_core.agent.tune import tune_space
    from agent_core.codegen import generate_kernel
    from agent_core.codegen.rowkernel import generate_multi_reduction
    from agent_core.codegen.region_io import region_io
    from agent_core.reference import run_reference
    from agent_core.runtime.launch import load_kernel
    ks = generate_kernel(p, ids, name="scan")
    assert ks.kind == "row_reduction", ks.kind
    kernels = [ks] + [generate_multi_reduction(p, region_io(p, ids), f"scan_{j}", v)
                      for j, v in enumerate(tune_space(ks, limit=variants))]
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        ins = [(torch.rand(p.values[v].shape, generator=g) + 0.5).cuda() if p.values[v].dtype == "float32" else
               (torch.rand(p.values[v].shape, generator=g) < 0.5).cuda() for v in p.inputs]
        env = run_reference(p, ins, keep=True)
        for k in kernels:
            outs = load_kernel(k, p)([env[v] for v in k.inputs])
            for v, got in zip(k.outputs, outs):
                torch.testing.assert_close(got, env[v], atol=1e-5, rtol=1e-5, msg=lambda m, k=k: f"{k.schedule}: {m}")


@pytest.mark.parametrize("shape", [(4096, 1000), (256, 8192), (64, 32768), (8, 100001)],
                         ids=["warp", "block", "stream", "stream_odd"])
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_masked_scans_equal_the_reference(shape, op):
    _check(*masked(shape, op))


def test_a_reverse_scan_equals_the_reference():
    _check(*reverse((512, 32768)))


@pytest.mark.parametrize("shape", [(1024, 4096), (32, 128256)], ids=["held", "streamed"])
def test_a_running_sum_of_a_softmax_equals_the_reference(shape):
    _check(*softmax_then_cumsum(shape))


@pytest.mark.parametrize("shape", [(64, 512, 256), (8, 20000, 64)], ids=["held_columns", "streamed_columns"])
def test_a_scan_along_a_middle_dim_equals_the_reference(shape):
    _check(*strided(shape))
