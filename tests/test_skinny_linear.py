"""A linear layer with 2 to 8 output features written as that many dot products of each row
(rewrites/skinny_linear.py): the rewritten program matches the linear on random draws, with and without
bias and on 3-d inputs, and a matmul by such a weight (x @ W, and x @ W.T through matmul_of_transpose); wider layers, one feature and weights that are inputs stay as they are; a
Mixtral-style router plans the dot products as one row kernel that reads the weight rows 4 at a time,
and a small router optimizes on the CPU to generated kernels only (each verified), driven as a user
would through the CLI."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.importers import import_file
from agent_core.ir import Program
from agent_core.planner import plan_program
from agent_core.reference import random_inputs, run_reference
from agent_core.rewrites import rewrite_program
from agent_core.rewrites.rules import matmul_of_transpose
from agent_core.rewrites.skinny_linear import skinny_linear

ROUTER = '''import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__(); self.gate = nn.Linear({k}, {n}, bias=False)
    def forward(self, x):
        weights, experts = torch.topk(torch.softmax(self.gate(x), dim=-1), 2, dim=-1)
        return weights / weights.sum(dim=-1, keepdim=True), experts
def get_inputs():
    return [torch.randn({m}, {k})]
def get_init_inputs():
    return []
'''


def _linear(shape, features, bias=True, weight_input=False):
    rng = np.random.default_rng(0)
    p = Program("linear")
    x = p.add_input("x", shape)
    w = p.add_input("w", (features, shape[-1])) if weight_input else \
        p.add_parameter("w", rng.standard_normal((features, shape[-1])).astype(np.float32))
    ins = [x.id, w.id] + ([p.add_parameter("b", rng.standard_normal(features).astype(np.float32)).id] if bias else [])
    p.mark_output(p.add_node("linear", ins).outputs[0])
    return p


@pytest.mark.parametrize("shape,features,bias", [((64, 256), 8, True), ((3, 40, 128), 5, False), ((16, 64), 2, True)])
def test_the_dot_products_match_the_linear(shape, features, bias):
    p = _linear(shape, features, bias)
    result = rewrite_program(p, rules=[skinny_linear], check=False)
    assert result.rules_fired == {"skinny_linear": 1}
    ops = [n.op for n in result.program.nodes.values()]
    assert "linear" not in ops and ops.count("sum") == features and ops.count("cat") == 1
    for seed in range(3):
        drawn = random_inputs(p, seed)
        want = next(iter(run_reference(p, drawn).values()))
        got = next(iter(run_reference(result.program, drawn).values()))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("form", ["x @ W", "x @ W.T", "x @ W.permute"])
def test_a_matmul_by_a_narrow_weight_is_rewritten_too(form):
    rng = np.random.default_rng(1)
    p = Program("matmul")
    x = p.add_input("x", (2, 30, 96))
    if form == "x @ W":
        w = p.add_parameter("w", rng.standard_normal((96, 6)).astype(np.float32)).id
    else:
        wt = p.add_parameter("w", rng.standard_normal((6, 96)).astype(np.float32)).id
        attrs = {"dim0": 0, "dim1": 1} if form == "x @ W.T" else {"dims": [1, 0]}
        w = p.add_node("transpose" if form == "x @ W.T" else "permute", [wt], attrs).outputs[0]
    p.mark_output(p.add_node("matmul", [x.id, w]).outputs[0])
    # x @ W.T becomes linear(x, W) first (rules.matmul_of_transpose), then its dot products
    result = rewrite_program(p, rules=[matmul_of_transpose, skinny_linear], check=False)
    assert result.rules_fired == ({"skinny_linear": 1} if form == "x @ W" else
                                  {"matmul_of_transpose": 1, "skinny_linear": 1})
    assert [n.op for n in result.program.nodes.values()].count("sum") == 6
    for seed in range(2):
        drawn = random_inputs(p, seed)
        torch.testing.assert_close(next(iter(run_reference(result.program, drawn).values())),
                                   next(iter(run_reference(p, drawn).values())), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape,features,weight_input", [((64, 256), 16, False), ((64, 256), 1, False),
                                                         ((64, 256), 4, True), ((64, 32), 4, False)])
def test_wide_single_feature_input_weight_or_short_rows_stay_a_linear(shape, features, weight_input):
    p = _linear(shape, features, weight_input=weight_input)
    assert rewrite_program(p, rules=[skinny_linear], check=False).rules_fired == {}


def test_a_router_plans_its_dot_products_as_one_row_kernel_reading_weights_four_at_a_time(tmp_path):
    src = tmp_path / "router.py"
    src.write_text(ROUTER.format(m=8192, k=4096, n=8))
    program = import_file(str(src), weights=False)
    result = rewrite_program(program, check=False)
    assert result.rules_fired.get("skinny_linear") == 1
    plan = plan_program(result.program)
    dots = [r for r in plan.active if sum(result.program.nodes[n].op == "sum" for n in r.nodes) == 8]
    assert len(dots) == 1 and dots[0].kind == "reduction" and "linear" not in {
        result.program.nodes[n].op for r in plan.active for n in r.nodes}
    ks = generate_kernel(result.program, dots[0].nodes, name="router_dots")
    assert ks.params["reductions"] == 8 and ks.params["row_reads"] == 1
    assert ks.source.count("reinterpret_cast<const float4*>(gate_weight_row") == 8   # W's rows, float4
    assert compile_kernel(ks, arch="sm_90").spill_stores == 0


def test_a_small_router_optimizes_to_generated_kernels_from_the_cli(tmp_path):
    src = tmp_path / "router.py"
    src.write_text(ROUTER.format(m=64, k=128, n=8))
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize", str(src), "-o", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "skinny_linear" in res.stdout
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] in ("fallback", "error")], events
    done = [e for e in events if e["event"] == "done"][-1]
    assert done["outcomes"].get("compiled", 0) >= 1 and not done["outcomes"].get("fallback"), done
