"""Counts and their nouns agree wherever a user reads them: the plural helper, and the plan command's
summary line for a program of one region (run as a subprocess, as a user runs it)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent_core.agent.progress import format_event
from agent_core.ir import Program
from agent_core.project_file import save_program
from agent_core.text import plural

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("n, word, want", [
    (1, "region", "1 region"), (0, "region", "0 regions"), (2, "kernel", "2 kernels"),
    (1, "launch", "1 launch"), (3, "launch", "3 launches"), (2, "pass", "2 passes"), (2, "box", "2 boxes"),
    (2, "entry", "2 entries"), (2, "day", "2 days"), (2, "cuBLAS call", "2 cuBLAS calls"),
    (-1, "draw", "-1 draws")])
def test_plural_makes_the_noun_agree_with_its_count(n, word, want):
    assert plural(n, word) == want


def test_an_irregular_plural_is_given():
    assert plural(1, "matrix", "matrices") == "1 matrix" and plural(4, "matrix", "matrices") == "4 matrices"


def test_progress_lines_agree_with_their_counts():
    assert format_event({"event": "plan", "nodes": 1, "regions": 1, "kernels": 1}).startswith(
        "plan: 1 node -> 1 region, 1 kernel ")
    assert "on 1 draw" in format_event({"event": "verify", "region": "r1", "ok": True, "draws": 1})
    assert "2 node" not in format_event({"event": "region-proposed", "region": "r1", "kind": "single",
                                         "nodes": ["n1"], "reason": "alone"})


def test_plan_of_a_one_region_program_says_1_region(tmp_path):
    p = Program("one")
    x = p.add_input("x", (64, 128))
    a = p.add_node("relu", [x.id])
    b = p.add_node("exp", [a.outputs[0]])
    p.mark_output(b.outputs[0])
    path = str(tmp_path / "one.json")
    save_program(p, path)
    r = subprocess.run([sys.executable, "-m", "agent_core.cli", "plan", path, "--no-rewrite"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = next(line for line in r.stdout.splitlines() if " -> " in line)
    assert summary.startswith("2 nodes -> 1 region, 1 kernel "), r.stdout
    assert "1 regions" not in r.stdout and "1 kernels" not in r.stdout
