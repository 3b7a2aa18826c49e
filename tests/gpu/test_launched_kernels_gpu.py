"""On the GPU: the profiler's count of the kernels a call launches (profile/launched.py), eager and
inside a replayed CUDA graph alike, memory copies left out; a convolution with a bias is two kernels
(cuDNN's, then torch's add), which a count of calls in code takes for one.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_launched_kernels_gpu.py
"""
import pytest
import torch

from agent_core.profile.launched import launched_kernels

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_eager_ops_a_graph_replay_and_a_biased_convolution_are_counted_kernel_by_kernel():
    x = torch.randn(1 << 20, device="cuda")
    assert launched_kernels(lambda: torch.relu(x) * 2) == {"kernels": 2}
    host = torch.empty_like(x, device="cpu")
    assert launched_kernels(lambda: host.copy_(x)) == {"kernels": 0}         # a memcpy is not a kernel
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = torch.sigmoid(x) + 1                                               # warm-up
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = torch.tanh(torch.sigmoid(x) + 1)
    assert launched_kernels(g.replay) == {"kernels": 3}
    conv = torch.nn.Conv2d(8, 8, 3, padding=1).cuda().eval()
    img = torch.randn(4, 8, 32, 32, device="cuda")
    with torch.no_grad():
        assert launched_kernels(lambda: conv(img))["kernels"] >= 2
        conv.bias = None
        with_bias_gone = launched_kernels(lambda: conv(img))["kernels"]
        conv.bias = torch.nn.Parameter(torch.zeros(8, device="cuda"))
        assert launched_kernels(lambda: conv(img))["kernels"] == with_bias_gone + 1

