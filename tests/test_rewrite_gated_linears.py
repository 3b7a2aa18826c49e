"""The rewrite merge_gated_linears (rewrites/gated_linears.py): a LLaMA-style MLP's gate and up
projections of one input, meeting in silu(gate) * up, become one linear over both weights stacked whose
two halves feed the product; it is checked numerically like every rewrite, the planner then puts the
gated unit in the GEMM's region with the tile form beside, and siblings whose results go their own ways
(q, k, v) or do not match (one bias) are left alone."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from agent_core.ir import Program
from agent_core.planner import plan_program
from agent_core.reference import run_reference
from agent_core.rewrites import rewrite_program


def mlp(tokens=64, width=48, inner=80, bias=(False, False), meet=True):
    """x -> gate = x Wg, up = x Wu -> silu(gate) * up -> down projection (or, meet=False, both returned)."""
    rng = np.random.default_rng(0)
    p = Program("mlp")
    x = p.add_input("x", (2, tokens, width))
    outs = []
    for name, b in zip(("gate", "up"), bias):
        ins = [x.id, p.add_parameter(f"w_{name}", rng.standard_normal((inner, width)).astype(np.float32) / 7).id]
        if b:
            ins.append(p.add_parameter(f"b_{name}", rng.standard_normal(inner).astype(np.float32)).id)
        outs.append(p.add_node("linear", ins, name=name).outputs[0])
    if not meet:
        for v in outs:
            p.mark_output(v)
        return p
    h = p.add_node("mul", [p.add_node("silu", [outs[0]]).outputs[0], outs[1]]).outputs[0]
    down = p.add_parameter("w_down", rng.standard_normal((width, inner)).astype(np.float32) / 9)
    p.mark_output(p.add_node("linear", [h, down.id]).outputs[0])
    return p


@pytest.mark.parametrize("bias", [(False, False), (True, True)], ids=["no_bias", "biases"])
def test_the_two_projections_become_one_linear_with_a_gated_unit_after_it(bias):
    p = mlp(bias=bias)
    res = rewrite_program(p)
    assert res.rules_fired.get("merge_gated_linears") == 1
    q = res.program
    linears = [n for n in q.nodes.values() if n.op == "linear"]
    assert sorted(q.values[n.inputs[1]].shape for n in linears) == [(48, 80), (160, 48)]
    x = torch.randn(2, 64, 48)
    (want,) = run_reference(p, {p.inputs[0]: x}).values()
    (got,) = run_reference(q, {q.inputs[0]: x}).values()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    regs = [r for r in plan_program(q).regions if r.status != "rejected"]
    gated = [r for r in regs if {q.nodes[n].op for n in r.nodes} >= {"linear", "slice", "silu", "mul"}]
    assert len(gated) == 1 and gated[0].kind == "matmul_epilogue" and "tile-GEMM kernel" in gated[0].reason


@pytest.mark.parametrize("kw", [{"meet": False}, {"bias": (True, False)}], ids=["results_apart", "one_bias"])
def test_other_sibling_projections_are_left_alone(kw):
    p = mlp(**kw)
    assert "merge_gated_linears" not in rewrite_program(p).rules_fired
