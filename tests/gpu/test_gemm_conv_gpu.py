"""On the GPU: the implicit-GEMM convolution (codegen/gemm_conv.py on the tile GEMM, 3xTF32 mma.sync).
Each kernel is built, launched and verified against torch on 5 random draws at atol = rtol = 1e-4
(tests/programs.py `fused`): conv1d / 2d / 3d with strides, padding, dilation, groups, a ragged Cout, no bias,
and the tile variants the tuner tries; level 2's 3-D convolution over 8 channels stays inside the
tolerance against float64, at most a few times torch's own fp32 error.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gemm_conv_gpu.py
"""
import pytest
import torch

from tests.programs import fused
from tests.test_gemm_conv import conv_program

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

VARIANTS = [{}, {"block_m": 256, "warps_m": 8}, {"block_m": 64, "warps_m": 2}, {"block_k": 16, "stages": 4}]
CASES = [((16, 3, 34, 33), 16, (3, 3), {"padding": 1}),
         ((8, 5, 301), 20, (4,), {"stride": 2, "padding": 3, "dilation": 2}),
         ((4, 8, 10, 18, 17), 32, (3, 3, 3), {}),
         ((4, 64, 14, 14), 72, (3, 3), {"padding": "same", "bias": False}),
         ((2, 16, 9, 9), 128, (1, 1), {}),
         ((4, 24, 15, 15), 48, (3, 3), {"padding": 1, "groups": 3}), ((8, 64, 14, 14), 64, (1, 1), {"groups": 8})]


@pytest.mark.parametrize("params", VARIANTS, ids=["default", "256rows", "64rows", "k16-4stages"])
@pytest.mark.parametrize("x_shape,cout,kernel,kw", CASES, ids=[f"conv{len(k)}d-{'x'.join(map(str, s))}-to{c}"
                                                               for s, c, k, _ in CASES])
def test_implicit_gemm_conv_matches_torch(x_shape, cout, kernel, kw, params):
    from agent_core.codegen.gemm_mma import default_params, gemm_spec
    from agent_core.codegen.region_io import region_io
    p = conv_program(x_shape, cout, kernel, **kw)
    v = {**default_params(gemm_spec(p, region_io(p, list(p.nodes)))), **params}
    v["warps_n"] = min(v["warps_n"], 16 // v["warps_m"])     # 256 rows of 8 warps leave room for 2 across
    r = fused(p, list(p.nodes), "conv_gemm_gpu", params={**v, "form": "gemm-3xtf32"})
    assert r.kernel.kind == "gemm"


def test_level2_3d_conv_stays_inside_the_tolerance_against_float64():
    from agent_core.reference import parameter_tensors, run_reference
    p = conv_program((16, 8, 16, 32, 32), 32, (3, 3, 3), epilogue=False)
    r = fused(p, list(p.nodes), "conv3d_l2", params={"form": "gemm-3xtf32"})
    torch.manual_seed(1)
    x = torch.randn(16, 8, 16, 32, 32, device="cuda")
    params = parameter_tensors(p, "cuda")
    env = {**params, p.inputs[0]: x}
    got = r([env[v] for v in r.inputs])[0]
    ref32 = run_reference(p, [x], keep=True)[p.outputs[0]]
    by_name = {p.values[v].name: t.double() for v, t in params.items()}
    ref64 = torch.nn.functional.conv3d(x.double(), by_name["w"], by_name["b"])
    ours_err = (got.double() - ref64).abs().max().item()
    torch_err = (ref32.double() - ref64).abs().max().item()
    print(f"conv3d 8 -> 32 channels: ours {ours_err:.2e}, torch fp32 {torch_err:.2e} against float64")
    assert ours_err < 1e-4 and ours_err <= 4 * torch_err + 1e-6, (ours_err, torch_err)


CONV_MODELS = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv3d(8, 32, 3)                  # then pointwise ops: the tile form is the other form timed
        self.b = nn.Conv2d(32, 64, 3, padding=1)       # alone (a softmax follows): timed against cuDNN
    def forward(self, x, u):
        return torch.sigmoid(torch.relu(self.a(x)) * 2.0), torch.softmax(self.b(u), dim=1)
def get_inputs(): return [torch.randn(8, 8, 10, 34, 34), torch.randn(8, 32, 32, 32)]
def get_init_inputs(): return []
'''


def test_the_agent_times_the_implicit_gemm_against_cudnn_and_says_which_runs(tmp_path):
    """`optimize` as a subprocess: the conv + epilogue region and the lone convolution each run as the
    faster of cuDNN (+ epilogue kernel) and our implicit GEMM, the whole program verifies, and each
    outcome names what runs and the time it was measured against."""
    import json
    import os
    import subprocess
    import sys
    src = tmp_path / "convs.py"
    src.write_text(CONV_MODELS)
    out = tmp_path / "out"
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    p = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize", str(src), "-o", str(out),
                        "--no-baselines", "--draws", "3", "--trials", "10"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.path.abspath(root)),
                       timeout=600, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    profile = json.loads((out / "profile.json").read_text())
    assert profile["end_to_end"]["correct"], profile["end_to_end"]["verify"]
    for o in profile["regions"]:
        print(f"{o['region']}: {o['status']}: {o['reason']}")
    lone = [o for o in profile["regions"] if "implicit GEMM (" in o["reason"] or "implicit-GEMM kernel (" in o["reason"]]
    assert len(lone) == 1, "the lone convolution's outcome names the implicit GEMM"
    assert (lone[0]["status"] == "fused" and "instead of cuDNN's" in lone[0]["reason"]) or \
           (lone[0]["status"] == "library" and "was correct but slower" in lone[0]["reason"]), lone[0]
    epilogue = [o for o in profile["regions"] if "tile GEMM" in o["reason"] and o not in lone]
    assert len(epilogue) == 1, "the conv + epilogue region's outcome says how the tile form did"
