"""Losses lowered to pointwise ops and reductions match the op's torch reference, for every reduction
and the attributes that change the formula; lowered examples then compile instead of falling back."""
import io
import os

import pytest
import torch

from agent_core.agent import EventEmitter, optimize
from agent_core.importers import import_file
from agent_core.ir import Program
from agent_core.reference import random_inputs, run_reference
from agent_core.rewrites import rewrite_program
from agent_core.rewrites.lowering import lower_loss

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "resources", "examples")

CASES = [("mse_loss", {"reduction": r}, (6, 7), (6, 7)) for r in ("none", "mean", "sum")] + [
    ("mse_loss", {"reduction": "mean"}, (5, 1, 3), (4, 3)),            # broadcast
    ("l1_loss", {"reduction": "sum"}, (9,), (9,)),
    ("smooth_l1_loss", {"reduction": "mean", "beta": 1.0}, (8, 5), (8, 5)),
    ("smooth_l1_loss", {"reduction": "none", "beta": 0.3}, (8, 5), (8, 5)),
    ("smooth_l1_loss", {"reduction": "sum", "beta": 0.0}, (8, 5), (8, 5)),
    ("huber_loss", {"reduction": "mean", "delta": 0.5}, (8, 5), (8, 5)),
    ("huber_loss", {"reduction": "none", "delta": 2.0}, (3, 4), (3, 4)),
    ("kl_div", {"reduction": "batchmean", "log_target": False}, (6, 10), (6, 10)),
    ("kl_div", {"reduction": "sum", "log_target": True}, (6, 10), (6, 10)),
    ("kl_div", {"reduction": "none", "log_target": False}, (6, 10), (6, 10)),
    ("kl_div", {"reduction": "mean", "log_target": False}, (6, 10), (6, 10)),
    ("cosine_similarity", {"dim": 1, "eps": 1e-8}, (7, 16), (7, 16)),
    ("cosine_similarity", {"dim": -1, "eps": 1e-8}, (3, 4, 16), (1, 4, 16)),
    ("cosine_similarity", {"dim": 0, "eps": 0.5}, (5, 6), (5, 6)),     # eps clamps small norms
]


def _program(op, attrs, sa, sb):
    p = Program(op)
    a = p.add_input("a", sa).id
    init = {"kind": "softmax"} if op == "kl_div" and not attrs.get("log_target") else None
    b = p.add_input("b", sb, init=init).id
    p.mark_output(p.add_node(op, [a, b], dict(attrs)).outputs[0])
    return p


@pytest.mark.parametrize("op,attrs,sa,sb", CASES, ids=lambda x: str(x).replace(" ", ""))
def test_lowered_loss_matches_the_op(op, attrs, sa, sb):
    p = _program(op, attrs, sa, sb)
    result = rewrite_program(p, rules=[lower_loss], check=False)
    lowered = result.program
    assert result.rules_fired == {"lower_loss": 1} and not any(n.op == op for n in lowered.nodes.values())
    for seed in range(3):
        drawn = random_inputs(p, seed)
        if op == "kl_div" and not attrs.get("log_target"):
            drawn["b"][0, :3] = 0.0              # zero probabilities contribute 0, not NaN
        if op == "cosine_similarity":
            drawn["a"][0] *= 1e-9                 # a near-zero vector: the eps clamp decides
        want = next(iter(run_reference(p, drawn).values()))
        got = next(iter(run_reference(lowered, drawn).values()))
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["mse_loss_functional", "smooth_l1_loss", "kl_div_loss", "cosine_similarity_loss"])
def test_lowered_examples_compile_instead_of_falling_back(name):
    res = optimize(import_file(os.path.join(EXAMPLES, f"{name}.py")), device="cpu", emit=EventEmitter(io.StringIO()))
    assert not [o.reason for o in res.outcomes if o.status == "fallback"]
    assert any(o.status == "compiled" for o in res.outcomes)
