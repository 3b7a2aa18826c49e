"""`stitchcuda rewrite`, as a shell runs it: the rewrites that fire, -o, --json (what the studio reads)
and the size limit that --check-anyway lifts."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from agent_core.ir import Program
from agent_core.project_file import load_program, program_from_json, save_program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "resources", "examples", "conv_bn_relu.py")


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "agent_core.cli", "rewrite", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})


def test_rewrite_prints_what_fired_and_writes_the_rewritten_program(tmp_path):
    res = _cli(EXAMPLE, "-o", "folded.json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "fold_batch_norm at" in res.stdout and "bias_into_epilogue at" in res.stdout
    assert "3 ops become 3" in res.stdout          # the folded bias is an add the relu's kernel does
    assert sorted(n.op for n in load_program(tmp_path / "folded.json").nodes.values()) == ["add", "conv2d", "relu"]


def test_rewrite_json_is_one_object_with_the_program_inline(tmp_path):
    res = _cli(EXAMPLE, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    assert [e["rule"] for e in obj["fired"]] == ["fold_batch_norm", "bias_into_epilogue"] and obj["refused"] == []
    assert len(program_from_json(obj["program"], None).nodes) == 3
    assert os.listdir(tmp_path) == []


def test_a_program_too_big_to_check_quickly_needs_check_anyway(tmp_path):
    p = Program("big_matmul")
    a, b = p.add_input("a", (4096, 4096)).id, p.add_input("b", (4096, 4096)).id
    p.mark_output(p.add_node("matmul", [a, b]).outputs[0])
    save_program(p, tmp_path / "big.json")
    res = _cli("big.json", cwd=tmp_path)
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert "137 GFLOP" in res.stderr and "--check-anyway" in res.stderr
