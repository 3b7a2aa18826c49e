"""The losses lowered as torch's formulas (rewrites/loss_formulas.py): each lowered program matches the op's
torch reference on random draws, for every reduction and the attributes that change the formula, including
targets of +1 / -1, probabilities of exactly 0 and 1 (binary cross entropy's -100 clamp) and vectors at the
eps; and a model using them optimizes to generated kernels (the loss no longer runs through torch)."""
import io

import pytest
import torch

from agent_core.agent import EventEmitter, optimize
from agent_core.importers import import_file
from agent_core.ir import Program
from agent_core.reference import random_inputs, run_reference
from agent_core.rewrites import rewrite_program
from agent_core.rewrites.lowering import lower_loss

SIGNS = {"kind": "uniform", "low": -1.0, "high": 1.0}     # drawn, then made +1 / -1
UNIT = {"kind": "uniform", "low": 0.05, "high": 0.95}

# (op, attrs, [(input name, shape, init)], inputs turned into signs)
CASES = [("hinge_loss", {"reduction": r}, [("x", (8, 1), None), ("y", (8,), SIGNS)], ["y"]) for r in ("mean", "none")] + [
    ("hinge_embedding_loss", {"reduction": r, "margin": m}, [("x", (6, 5), None), ("y", (6, 5), SIGNS)], ["y"])
    for r, m in (("mean", 1.0), ("sum", 0.3), ("none", 2.0))] + [
    ("margin_ranking_loss", {"reduction": r, "margin": m}, [("a", (9,), None), ("b", (9,), None), ("y", (9,), SIGNS)], ["y"])
    for r, m in (("mean", 0.0), ("none", 0.5))] + [
    ("binary_cross_entropy", {"reduction": r}, [("x", (7, 3), UNIT), ("t", (7, 3), {"kind": "uniform"})] +
     ([("w", (3,), {"kind": "positive"})] if w else []), []) for r in ("mean", "sum", "none") for w in (False, True)] + [
    ("pairwise_distance", {"p": pn, "eps": 1e-6, "keepdim": k}, [("a", (5, 8), None), ("b", (5, 8), None)], [])
    for pn, k in ((2.0, False), (1.0, True), (3.0, False))] + [
    ("triplet_margin_loss", {"reduction": r, "margin": 0.5, "p": pn, "eps": 1e-6, "swap": s},
     [("a", (6, 10), None), ("p", (6, 10), None), ("n", (6, 10), None)], [])
    for r, pn, s in (("mean", 2.0, False), ("none", 2.0, True), ("sum", 1.0, False))] + [
    ("triplet_margin_loss", {"reduction": "mean", "margin": 1.0, "p": 2.0, "eps": 1e-6, "swap": False},
     [("a", (10,), None), ("p", (10,), None), ("n", (10,), None)], [])] + [
    ("cosine_embedding_loss", {"reduction": r, "margin": m}, [("a", (6, 16), None), ("b", (6, 16), None), ("y", (6,), SIGNS)], ["y"])
    for r, m in (("mean", 0.0), ("none", 0.2), ("sum", -0.5))] + [
    ("cosine_embedding_loss", {"reduction": "mean", "margin": 0.1}, [("a", (16,), None), ("b", (16,), None), ("y", (), SIGNS)], ["y"])]


def _program(op, attrs, inputs):
    p = Program(op)
    ids = [p.add_input(name, shape, init=init).id for name, shape, init in inputs]
    p.mark_output(p.add_node(op, ids, dict(attrs)).outputs[0])
    return p


@pytest.mark.parametrize("op,attrs,inputs,signs", CASES, ids=lambda x: str(x).replace(" ", "")[:60])
def test_lowered_formula_matches_the_op(op, attrs, inputs, signs):
    p = _program(op, attrs, inputs)
    result = rewrite_program(p, rules=[lower_loss], check=False)
    assert result.rules_fired == {"lower_loss": 1}
    lowered = result.program
    assert not any(n.op == op for n in lowered.nodes.values())
    for seed in range(3):
        drawn = random_inputs(p, seed)
        for name in signs:
            drawn[name] = torch.where(drawn[name] >= 0, 1.0, -1.0)
        if op == "binary_cross_entropy":
            drawn["x"].view(-1)[:2] = torch.tensor([0.0, 1.0])     # log(0) is clamped at -100
        if op == "cosine_embedding_loss":
            drawn["a"].view(-1)[:drawn["a"].shape[-1]] *= 1e-9     # a near-zero vector: the 1e-12 decides
        want = next(iter(run_reference(p, drawn).values()))
        got = next(iter(run_reference(lowered, drawn).values()))
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_a_triplet_and_bce_model_optimizes_to_generated_kernels(tmp_path):
    """A model with nn.TripletMarginLoss and F.binary_cross_entropy: the losses are written out and fused into
    generated kernels (each verified against the reference), none runs through torch."""
    src = tmp_path / "metric_losses.py"
    src.write_text(
        "import torch, torch.nn as nn, torch.nn.functional as F\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.triplet = nn.TripletMarginLoss(margin=0.3)\n"
        "    def forward(self, a, p, n, prob, target):\n"
        "        return self.triplet(a, p, n) + F.binary_cross_entropy(torch.sigmoid(prob), target)\n"
        "def get_inputs():\n"
        "    return [torch.randn(32, 64), torch.randn(32, 64), torch.randn(32, 64), torch.randn(32, 8), torch.rand(32, 8)]\n"
        "def get_init_inputs():\n"
        "    return []\n")
    res = optimize(import_file(str(src)), device="cpu", emit=EventEmitter(io.StringIO()))
    ops = {n.op for n in res.program.nodes.values()}
    assert not ops & {"triplet_margin_loss", "binary_cross_entropy"}
    assert not [o.reason for o in res.outcomes if o.status == "fallback"]
    assert any(o.status == "compiled" for o in res.outcomes)
