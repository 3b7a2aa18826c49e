"""Reductions and pools moved in front of a linear map (agent_core/rewrites/linear_reduce.py): each
rewrite fires where it should, matches the original program on random draws (the engine's check, and
again here in float64 against torch), and leaves alone what it cannot express."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from agent_core.ir import Program
from agent_core.reference import random_inputs, run_reference
from agent_core.rewrites.engine import rewrite_program
from agent_core.rewrites.linear_reduce import offset_indicator, pool_linear, reduce_conv_spatial

RULES = [reduce_conv_spatial]


def conv_then_reduce(op: str, x_shape, w_shape, attrs, reduce: str, dims, keepdim: bool, bias: bool = True):
    p = Program(op)
    x = p.add_input("x", x_shape)
    rng = np.random.default_rng(0)
    w = p.add_parameter("w", rng.standard_normal(w_shape).astype(np.float32) * 0.2)
    ins = [x.id, w.id]
    if bias:
        cout = w_shape[0] if op.startswith("conv") and "transpose" not in op else w_shape[1] * attrs.get("groups", 1)
        ins.append(p.add_parameter("b", rng.standard_normal(cout).astype(np.float32)).id)
    c = p.add_node(op, ins, attrs)
    r = p.add_node(reduce, [c.outputs[0]], {"dim": dims, "keepdim": keepdim})
    p.mark_output(r.outputs[0])
    return p


def outputs(p: Program, seed: int) -> list[torch.Tensor]:
    values = run_reference(p, random_inputs(p, seed=seed))
    return [t.double() for t in values.values()]  # in the order of p.outputs


CASES = [
    # KernelBench-like: a global mean after a transposed conv (42/44), a mean over depth (13)
    ("conv_transpose2d", (2, 4, 9, 11), (4, 6, 3, 3), {"stride": 1, "padding": 0}, "mean", [2, 3], True),
    ("conv_transpose2d", (2, 4, 8, 8), (4, 6, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1},
     "mean", [2, 3], True),
    ("conv_transpose3d", (2, 3, 6, 5, 7), (3, 4, 3, 3, 3), {"stride": 1, "padding": 1}, "mean", [2], True),
    ("conv2d", (2, 3, 12, 10), (5, 3, 3, 3), {"stride": 1, "padding": 1}, "sum", [2, 3], False),
    ("conv2d", (2, 4, 13, 10), (6, 2, 3, 2), {"stride": 2, "padding": 2, "dilation": 2, "groups": 2},
     "mean", [3], False),
    ("conv1d", (3, 4, 40), (5, 4, 4), {"stride": 3, "padding": 1}, "sum", [-1], True),
    ("conv_transpose1d", (2, 6, 20), (6, 2, 5), {"stride": 3, "padding": 2, "output_padding": 1, "groups": 3},
     "mean", [2], False),
    ("conv3d", (1, 2, 7, 6, 9), (3, 2, 3, 1, 3), {"stride": 1, "padding": 0}, "mean", [2, 4], True),
    ("conv_transpose2d", (2, 4, 7, 7), (4, 3, 3, 3), {"stride": 2, "padding": 0, "groups": 1, "dilation": 2},
     "sum", [2, 3], True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[4]}{c[5]}")
def test_reduction_after_conv_moves_in_front_and_matches(case, monkeypatch):
    op, xs, ws, attrs, reduce, dims, keep = case
    monkeypatch.setattr("agent_core.rewrites.linear_reduce._profitable", lambda before, after: True)
    for bias in (True, False):
        p = conv_then_reduce(op, xs, ws, attrs, reduce, dims, keep, bias)
        res = rewrite_program(p, RULES, draws=3)
        assert res.rules_fired.get("reduce_conv_spatial") == 1, (res.refused, res.fired)
        q = res.program
        assert op not in {n.op for n in q.nodes.values()}, "the full convolution must be gone"
        for seed in range(3):
            for a, b in zip(outputs(p, seed), outputs(q, seed)):
                assert a.shape == b.shape
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_indicator_counts_each_output_position_once():
    # conv: every output position reads exactly one input per kernel offset (or padding)
    a = offset_indicator(False, size_in=10, size_out=5, kernel=3, stride=2, pad=1, dil=1)
    assert a.shape == (3, 10) and a.sum(axis=1).tolist() == [4, 5, 5]
    # transposed: input i writes i*2 - 1 + k; output size 10
    t = offset_indicator(True, size_in=5, size_out=10, kernel=3, stride=2, pad=1, dil=1)
    assert t[0].tolist() == [0, 1, 1, 1, 1] and t[1].tolist() == [1] * 5


def test_cheap_convolutions_and_channel_reductions_are_left_alone():
    small = conv_then_reduce("conv2d", (1, 2, 4, 4), (2, 2, 3, 3), {"padding": 1}, "mean", [2, 3], True)
    assert not rewrite_program(small, RULES).fired  # the box sums would cost as much as the conv
    chan = conv_then_reduce("conv2d", (2, 8, 64, 64), (16, 8, 3, 3), {"padding": 1}, "sum", [1], True)
    assert not rewrite_program(chan, RULES).fired
    same = conv_then_reduce("conv2d", (2, 8, 64, 64), (16, 8, 3, 3), {"padding": "same"}, "mean", [2, 3], True)
    assert not rewrite_program(same, RULES).fired


def test_large_global_mean_after_transposed_conv_fires_without_help():
    p = conv_then_reduce("conv_transpose2d", (8, 16, 64, 64), (16, 32, 3, 3), {"stride": 2, "padding": 1,
                         "output_padding": 1}, "mean", [2, 3], True)
    res = rewrite_program(p, RULES, draws=2)
    assert res.rules_fired.get("reduce_conv_spatial") == 1
    assert "linear layer" in res.fired[0]["message"] and "GFLOP" in res.fired[0]["message"]


@pytest.mark.parametrize("kernel,stride,matmul", [(4, None, False), (3, 2, False), (5, 5, True), (1, 1, False)])
def test_average_pool_after_linear_becomes_a_narrower_linear(kernel, stride, matmul):
    p = Program("pool_linear")
    x = p.add_input("x", (6, 20))
    rng = np.random.default_rng(1)
    if matmul:
        w = p.add_parameter("w", rng.standard_normal((20, 24)).astype(np.float32))
        y = p.add_node("matmul", [x.id, w.id]).outputs[0]
    else:
        w = p.add_parameter("w", rng.standard_normal((24, 20)).astype(np.float32))
        b = p.add_parameter("b", rng.standard_normal(24).astype(np.float32))
        y = p.add_node("linear", [x.id, w.id, b.id]).outputs[0]
    u = p.add_node("unsqueeze", [y], {"dim": 1}).outputs[0]  # the pool wants [N, C, L], as in KernelBench
    pooled = p.add_node("avg_pool1d", [u], {"kernel_size": [kernel], "stride": [stride] if stride else None})
    sq = p.add_node("squeeze", [pooled.outputs[0]], {"dim": [1]})
    g = p.add_node("gelu", [sq.outputs[0]])
    p.mark_output(g.outputs[0])
    res = rewrite_program(p, [pool_linear], draws=3)
    assert res.rules_fired.get("pool_linear") == 1, res.refused
    ops = [n.op for n in res.program.nodes.values()]
    assert "avg_pool1d" not in ops and "matmul" not in ops
    linear = next(n for n in res.program.nodes.values() if n.op == "linear")
    assert res.program.values[linear.inputs[1]].shape[0] == (24 - kernel) // (stride or kernel) + 1
    for seed in range(3):
        for a, b in zip(outputs(p, seed), outputs(res.program, seed)):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_padded_pool_or_a_pool_over_something_else_is_left_alone():
    p = Program("pool")
    x = p.add_input("x", (6, 2, 20))
    w = p.add_parameter("w", np.ones((24, 20), np.float32))
    y = p.add_node("linear", [x.id, w.id]).outputs[0]
    pad = p.add_node("avg_pool1d", [y], {"kernel_size": [3], "padding": [1]})
    p.mark_output(pad.outputs[0])
    assert not rewrite_program(p, [pool_linear]).fired
