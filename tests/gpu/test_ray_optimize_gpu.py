"""On the GPU: `optimize --ray local` times each region's tuning trials in a Ray worker that holds a GPU
(`num_gpus=1`), verifies each on that worker, and the driver verifies the kept kernel on every draw and
the end-to-end program on its own GPU, against torch, as without --ray.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_ray_optimize_gpu.py
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("ray")

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

PROGRAM = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, a, b, c):
            return (torch.softmax(a, dim=1), nn.functional.layer_norm(b, (1024,)),
                    nn.functional.gelu(c) * 2.0 + 1.0)


    def get_inputs():
        return [torch.randn(4096, 1000), torch.randn(2048, 1024), torch.randn(8192, 2048)]


    def get_init_inputs():
        return []
''')


def _run(spec, out, *extra):
    proc = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize", str(spec), "-o", str(out),
                           "--no-baselines", *extra], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_trials_are_timed_on_ray_workers_and_the_program_verifies_on_the_driver(tmp_path):
    spec = tmp_path / "three.py"
    spec.write_text(PROGRAM)
    ray_run = _run(spec, tmp_path / "ray", "--ray", "local", "--kernel-cache", str(tmp_path / "kernels"))
    assert "correct" in ray_run.stdout and "NOT CORRECT" not in ray_run.stdout, ray_run.stdout
    prof = json.loads((tmp_path / "ray" / "profile.json").read_text())
    assert prof["end_to_end"]["correct"] and prof["end_to_end"]["verify"]["draws"] >= 5
    events = [json.loads(line) for line in (tmp_path / "ray" / "events.jsonl").read_text().splitlines()]
    where = [e for e in events if e["event"] == "log" and " trial(s) on " in e["message"]]
    tuned = [r for r in prof["regions"] if len(r["trials"]) > 1]
    assert len(tuned) == 3 and len(where) == 3, [e["message"] for e in where]
    for e in where:
        assert torch.cuda.get_device_name(0) in e["message"] and e["attempts"] == 1
    for r in tuned:
        assert r["trials"][0]["trial"] == 0 and "host" not in r["trials"][0]      # the default: timed here
        remote = r["trials"][1:]
        assert all("host" in t for t in remote) and any(t["ok"] for t in remote)
        for t in remote:
            if t.get("best"):      # kept only after the driver verified and timed it faster than the default
                assert t["driver_ms"] < r["trials"][0]["ms"]
                assert r["params"] == t["params"]
        assert r["status"] in ("fused", "fallback") and "verification failed" not in r["reason"]
    # the same program without --ray: the same regions, and it verifies too
    local = _run(spec, tmp_path / "local")
    assert "correct" in local.stdout and "NOT CORRECT" not in local.stdout
    plain = json.loads((tmp_path / "local" / "profile.json").read_text())
    assert [r["region"] for r in plain["regions"]] == [r["region"] for r in prof["regions"]]
