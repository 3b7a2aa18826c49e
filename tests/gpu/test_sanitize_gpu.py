"""GPU: `stitchcuda optimize --sanitize` reruns verification under compute-sanitizer memcheck.

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_sanitize_gpu.py
"""
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="needs compute-sanitizer")]

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.parametrize("example", ["softmax_rows", "pointwise_zoo"])
def test_optimize_sanitize_is_clean(tmp_path, example):
    path = os.path.join(ROOT, "resources", "examples", f"{example}.py")
    proc = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize", path, "-o", str(tmp_path),
                           "--no-tune", "--no-baselines", "--draws", "2", "--sanitize"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "sanitize: clean" in proc.stdout
    report = (tmp_path / "sanitize.txt").read_text()
    assert "ERROR SUMMARY: 0 errors" in report
