"""On the GPU: the blocks that now plan into fewer kernels (tests/test_plan_block_kernels.py), at their
test size and at their real size, planned through the CLI; every generated region is built, run and
verified against the torch reference (5 draws, atol = rtol = 1e-4), none falls back.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_block_kernels.py
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent_core.project_file import load_program

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = ["qk_rmsnorm_qwen3", "masked_softmax_bert_base", "squeeze_excitation_efficientnet_b0",
          "kl_div_distill_distilbert"]


@pytest.mark.parametrize("small", [True, False], ids=["test-size", "real-size"])
@pytest.mark.parametrize("block", BLOCKS)
def test_each_generated_region_of_the_block_matches_torch(block, small, tmp_path):
    from agent_core.runtime.region import build_region
    env = {k: v for k, v in os.environ.items() if k != "STITCHCUDA_BLOCKS_SMALL"}
    env.update({"PYTHONPATH": str(ROOT), **({"STITCHCUDA_BLOCKS_SMALL": "1"} if small else {})})
    saved = tmp_path / "plan.json"
    out = subprocess.run([sys.executable, "-m", "agent_core.cli", "plan", str(ROOT / "benchmarks" / "blocks" / f"{block}.py"),
                          "--json", "-o", str(saved)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    program = load_program(saved)
    built = 0
    for r in program.regions:
        if r.schedule.get("runs") not in ("kernel", "library+kernel"):
            continue
        runner = build_region(program, r.nodes, name=f"{block}_{r.id}")
        assert runner.fused, f"{r.id} fell back: {runner.fallback_reason}"
        assert runner.verify is not None and runner.verify.ok, (r.id, runner.verify)
        built += 1
    assert built, plan["regions"]
