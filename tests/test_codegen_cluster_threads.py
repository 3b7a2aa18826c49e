"""The cluster-per-row schedule's threads per CTA as a tuner choice (codegen/rowkernel.py `_schedule`,
row_tuning.tune_variants).

DistilBERT's distillation KL (2048 rows of 30522, student and teacher, 3 rounds) runs a cluster of
4 CTAs of 1024 threads per row: 40 registers a thread, so one CTA fills an SM's 64K registers and its
loads wait while it reduces (28% of the copy floor on the H200 at 9c9edc0). Half the threads hold
twice the floats each; then two CTAs share an SM, one loading while the other reduces. The tuner
times it beside the cluster sizes it already tried.

CPU: planned through the CLI at the real size (no tensors), the variant keeps the row in registers,
compiles without spills, and fits two CTAs per SM by ptxas's register count where the default fits
one (the CPU emulator runs no clusters, so the numbers are checked on the GPU only).
GPU (`-m gpu`, tests/gpu/test_gpu_cluster_threads.py): the variant against torch over 5 draws at the
block's size and on ragged rows.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_core.codegen import generate_kernel
from agent_core.codegen.row_tuning import tune_variants
from agent_core.compiler import compile_kernel
from agent_core.project_file import load_program

ROOT = Path(__file__).resolve().parent.parent
SM_REGISTERS = 65536


@pytest.fixture(scope="module")
def kl_region(tmp_path_factory):
    """The block planned once through the CLI (about 25 s at its real size): (program, region nodes)."""
    out = tmp_path_factory.mktemp("kl") / "kl.json"
    env = {k: v for k, v in os.environ.items() if k != "STITCHCUDA_BLOCKS_SMALL"}
    res = subprocess.run([sys.executable, "-m", "agent_core.cli", "plan", "--json", "-o", str(out),
                          str(ROOT / "benchmarks" / "blocks" / "kl_div_distill_distilbert.py")],
                         capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kernels"] == 1
    p = load_program(out)
    (r,) = [r for r in p.regions if r.schedule.get("runs") == "kernel"]
    return p, r.nodes


def _ctas_per_sm(ks) -> int:
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and c.registers, c.summary()
    return SM_REGISTERS // (c.registers * ks.block[0])


def test_half_the_threads_per_cta_fit_two_ctas_per_sm_with_the_row_in_registers(kl_region):
    p, nodes = kl_region
    ks = generate_kernel(p, nodes, name="kl")
    assert ks.params["schedule"] == "cluster" and ks.params["threads_per_row"] == 1024
    variants = [{k: v for k, v in o.items() if k != "sm_count"} for o in tune_variants(ks.params)]
    assert {"cluster": ks.params["cluster"], "threads_per_row": 512} in variants
    half = generate_kernel(p, nodes, name="kl", params={"threads_per_row": 512})
    assert half.params["schedule"] == "cluster" and half.params["cluster"] == ks.params["cluster"]
    assert half.params["cached"] and half.block == (512, 1, 1)   # still one read of the row
    assert _ctas_per_sm(ks) == 1 and _ctas_per_sm(half) >= 2


def test_a_tuner_threads_per_row_outside_the_cluster_rule_is_refused():
    from agent_core.codegen.kernel import CodegenError
    from tests.programs import kl_terms
    p, nodes = kl_terms((2048, 30522))      # the block's terms at its size: a cluster of 4 CTAs per row
    assert generate_kernel(p, nodes, name="kl").params["schedule"] == "cluster"
    for bad in (64, 384, 2048):
        with pytest.raises(CodegenError, match="threads_per_row of a cluster row"):
            generate_kernel(p, nodes, name="kl", params={"threads_per_row": bad})
