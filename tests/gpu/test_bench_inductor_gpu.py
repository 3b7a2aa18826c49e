"""On the GPU: every asked torch.compile mode, max-autotune included, is timed in the same process as
ours and records the kernels Inductor generated for it (Triton kernels, cuBLAS calls), read from the
compile the timing did; `bench` puts them next to our launches and flags a block where ours are more.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_bench_inductor_gpu.py
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from agent_core.profile.baselines import measure_baselines

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_each_mode_is_timed_and_counts_inductors_triton_kernels_and_cublas_calls():
    x = torch.randn(256, 512, device="cuda")
    w = torch.randn(512, 512, device="cuda")

    def fn(a, b):
        return torch.relu(a @ b) * 0.5 + a

    base = measure_baselines(fn, [x, w], compile_modes=("default", "reduce-overhead", "max-autotune"),
                             trials=5, compile_budget_s=600.0)
    for mode in ("default", "reduce-overhead", "max-autotune"):
        e = base[f"compile_{mode}"]
        assert e["ok"] and e["ms"] > 0, e
        counts = e["inductor_kernels"]
        assert "error" not in counts and counts["generated"] + counts["extern"] >= 1, (mode, counts)
    # fp32 with TF32 off: default keeps the matmul in cuBLAS and fuses relu, scale and add after it
    assert base["compile_default"]["inductor_kernels"] == {"generated": 1, "extern": 1}


def test_bench_records_inductors_counts_per_mode_next_to_ours(tmp_path):
    block = tmp_path / "linear_gelu_residual.py"
    block.write_text(textwrap.dedent('''
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(1024, 1024)

            def forward(self, x):
                return torch.nn.functional.gelu(self.fc(x)) + x


        def get_inputs():
            return [torch.randn(512, 1024)]


        def get_init_inputs():
            return []
    '''))
    out = tmp_path / "b.jsonl"
    proc = subprocess.run([sys.executable, "-m", "agent_core.cli", "bench", str(block), "--no-tune", "--trials", "5",
                           "--compile-modes", "default,max-autotune", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["ok"] and rec["gpu"] and rec["baseline_device"] == "cuda", rec
    assert list(rec["compile_ms"]) == ["default", "max-autotune"]
    for mode, ms in rec["compile_ms"].items():
        assert ms or rec["compile_errors"][mode]
        if ms:
            assert rec["inductor_kernels"][mode]["generated"] >= 1
    assert rec["best_baseline_ms"] <= min([rec["eager_ms"]] + [v for v in rec["compile_ms"].values() if v])
    assert isinstance(rec["launches"], int) and isinstance(rec["more_kernels_than_inductor"], bool)
    assert rec["more_kernels_than_inductor"] == (rec["launches"] > rec["inductor_fewest_kernels"])
