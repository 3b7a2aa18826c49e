"""On the GPU: the cluster-per-row schedule's threads per CTA (256 by default where the rows fill the
SMs, the tuner's 512 and 1024, tests/test_codegen_cluster_threads.py) against torch, 5 random draws at
atol = rtol = 1e-4 (tests/programs.py `fused`): DistilBERT's distillation KL terms at their real size
(2048 x 30522), ragged rows of the same program shape, and the block itself planned through the CLI
(a sum of the terms: one streamed read of each row, tests/test_softmax_dot.py).

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_cluster_threads.py
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent_core.project_file import load_program
from tests.programs import fused
from tests.programs import kl_terms
from tests.test_codegen_split_rows import kl_total

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("params", [None, {"threads_per_row": 512}, {"threads_per_row": 1024}],
                         ids=["default", "512-threads", "1024-threads"])
def test_gpu_kl_terms_cluster_variants_match_torch(params):
    p, nodes = kl_terms((2048, 30522))
    built = fused(p, nodes, "kl_cluster", params=params)
    assert built.kernel.params["schedule"] == "cluster"
    assert built.kernel.block == ((params or {}).get("threads_per_row", 256), 1, 1)


def test_gpu_kl_div_block_planned_through_the_cli_streams_each_row_once(tmp_path):
    out = tmp_path / "kl.json"
    env = {k: v for k, v in os.environ.items() if k != "STITCHCUDA_BLOCKS_SMALL"}
    res = subprocess.run([sys.executable, "-m", "agent_core.cli", "plan", "--json", "-o", str(out),
                          str(ROOT / "benchmarks" / "blocks" / "kl_div_distill_distilbert.py")],
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr
    p = load_program(out)
    (r,) = [r for r in p.regions if r.schedule.get("runs") == "kernel"]
    built = fused(p, r.nodes, "kl_stream")
    assert built.kernel.params["schedule"] == "stream" and built.kernel.params["rounds"] == 1


# (shape, CTAs per row, threads per CTA, row held in registers): ragged rows, rows not a multiple of 4
RAGGED = [((64, 30522), 4, 512, True), ((7, 20001), 4, 512, True), ((33, 60001), 8, 512, True),
          ((7, 20001), 2, 256, False)]


@pytest.mark.parametrize("shape,cluster,threads,cached", RAGGED)
def test_gpu_ragged_rows_with_fewer_threads_match_torch(shape, cluster, threads, cached):
    p, ids = kl_total(shape)
    built = fused(p, ids, f"kl_ragged_{shape[1]}_{threads}", params={
        "cluster": cluster, "threads_per_row": threads, "spread_min_bytes": 0, "split": 1})
    k = built.kernel
    assert k.params["schedule"] == "cluster" and k.block == (threads, 1, 1) and k.params["cached"] == cached
