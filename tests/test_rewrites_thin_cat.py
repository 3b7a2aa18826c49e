"""A cat of pieces one element thick along its dim (rewrites/thin_cat.py): a reduction over that dim is
a fold of the pieces, a pointwise op against a value broadcast along it runs on each piece. Checked
through rewrite_program (the engine compares every rewrite with the original numerically), then the
Mixtral router's renormalised top-2 weights: one row kernel with the softmax over the experts instead of
a kernel of their own, run by the CPU emulator against the reference.
"""
import shutil

import numpy as np
import pytest
import torch

from agent_core.ir import Program
from agent_core.reference import run_reference
from agent_core.rewrites import rewrite_program
from tests.planned import block, plan


def _pieces(n=6, k=3, thick=1):
    p = Program("pieces")
    xs = [p.add_input(f"x{i}", (n, thick)) for i in range(k)]
    c = p.add_node("cat", [x.id for x in xs], {"dim": -1})
    return p, c.outputs[0], [torch.randn(n, thick) for _ in xs]


def _ops(program) -> list[str]:
    return [n.op for n in program.nodes.values()]


@pytest.mark.parametrize("op, keepdim, fold", [("sum", True, "add"), ("mean", False, "add"),
                                               ("max", True, "maximum"), ("min", False, "minimum")])
def test_a_reduction_over_a_thin_cat_folds_its_pieces(op, keepdim, fold):
    p, cat, inputs = _pieces()
    r = p.add_node(op, [cat], {"dim": [-1], "keepdim": keepdim})
    p.mark_output(r.outputs[0])
    res = rewrite_program(p)                    # checked against the original on random draws
    assert res.rules_fired.get("reduce_of_thin_cat") == 1, res.fired
    ops = _ops(res.program)
    assert "cat" not in ops and op not in ops and ops.count(fold) == 2, ops
    got = run_reference(res.program, inputs, keep=True)[res.program.outputs[0]]
    want = getattr(torch, op)(torch.cat(inputs, dim=-1), dim=-1, keepdim=keepdim)
    want = want.values if op in ("max", "min") else want
    assert torch.allclose(got, want, atol=1e-6)


def test_a_divisor_broadcast_along_a_thin_cat_divides_each_piece():
    # the router's renormalisation: weights / weights.sum(-1, keepdim=True) over [first, second]
    p, cat, inputs = _pieces(k=2)
    s = p.add_node("sum", [cat], {"dim": [-1], "keepdim": True})
    d = p.add_node("div", [cat, s.outputs[0]])
    p.mark_output(d.outputs[0])
    res = rewrite_program(p)
    assert res.rules_fired == {"reduce_of_thin_cat": 1, "pointwise_of_thin_cat": 1}, res.fired
    last = [n for n in res.program.nodes.values() if n.outputs[0] in res.program.outputs]
    assert last[0].op == "cat" and _ops(res.program).count("div") == 2, _ops(res.program)
    w = torch.cat(inputs, dim=-1)
    got = run_reference(res.program, inputs, keep=True)[res.program.outputs[0]]
    assert torch.allclose(got, w / w.sum(-1, keepdim=True), atol=1e-6)


def test_thick_pieces_other_dims_and_full_size_operands_are_left_alone():
    p, cat, _ = _pieces(thick=2)                # pieces two elements thick
    p.mark_output(p.add_node("sum", [cat], {"dim": [-1], "keepdim": True}).outputs[0])
    assert not rewrite_program(p).fired
    q, cat, _ = _pieces()                       # a sum over the rows, not over the cat's dim
    q.mark_output(q.add_node("sum", [cat], {"dim": [0], "keepdim": True}).outputs[0])
    assert not rewrite_program(q).fired
    r, cat, _ = _pieces()                       # a divisor that is not broadcast along the cat's dim
    full = r.add_input("full", (6, 3))
    r.mark_output(r.add_node("div", [cat, full.id]).outputs[0])
    assert not rewrite_program(r).fired


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_mixtral_router_renormalises_its_top2_in_the_softmax_kernel():
    from agent_core.codegen import generate_kernel
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import guarded, payload
    planned, program = plan(block("router_top2_mixtral"))
    active = [r for r in planned["regions"] if r["status"] == "proposed"]
    assert len(active) == 2, [r["reason"] for r in active]     # the dot products, then the rest
    tail = active[1]
    names = [program.nodes[n].name for n in tail["nodes"]]
    assert {"softmax", "add", "div", "cat"} <= {program.nodes[n].op for n in tail["nodes"]}, names
    ks = generate_kernel(program, tail["nodes"], name="router_tail")
    torch.manual_seed(0)
    env = run_reference(program, [torch.randn(program.values[v].shape) for v in program.inputs], keep=True)
    guard = 256
    bufs = [guarded(env[v].contiguous().numpy(), guard) for v in ks.inputs]
    bufs += [guarded(np.zeros(program.values[v].shape, env[v].numpy().dtype), guard) for v in ks.outputs]
    res = CpuExecutor().run(ks, [bufs], guard=guard)
    for k, v in enumerate(ks.outputs):
        want = env[v]
        got = torch.from_numpy(payload(res[0][len(ks.inputs) + k], guard, want.numpy().dtype,
                                       tuple(want.shape)).copy())
        assert torch.allclose(got.to(want.dtype), want, atol=1e-6), (program.values[v].name, (got - want).abs().max())
