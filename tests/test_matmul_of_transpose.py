"""a @ w.t() as linear(a, w) (rewrites/rules.matmul_of_transpose): the rewritten program matches on
random draws, and other transposes (batched, a dim that is not swapped) stay; a permute that only a
library call reads is planned as torch's strided view, costing nothing, and not absorbed into its
producer's kernel (where it was a transposed, uncoalesced store); a CLIP-style similarity matrix of
normalised embeddings plans through the CLI with no permute left."""
import pytest
import torch

from agent_core.ir import Program
from agent_core.planner import plan_program
from agent_core.reference import random_inputs, run_reference
from agent_core.rewrites import rewrite_program
from agent_core.rewrites.rules import matmul_of_transpose
from tests.programs import cli

SIMILARITY = '''import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def forward(self, image, text):
        return F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).t()
def get_inputs():
    return [torch.randn(256, 64), torch.randn(192, 64)]
def get_init_inputs():
    return []
'''


def _program(a_shape, w_shape, op, attrs):
    p = Program("mmt")
    a = p.add_input("a", a_shape)
    w = p.add_input("w", w_shape)
    t = p.add_node(op, [w.id], attrs)
    p.mark_output(p.add_node("matmul", [a.id, t.outputs[0]]).outputs[0])
    return p


@pytest.mark.parametrize("a_shape,op,attrs", [((64, 32), "permute", {"dims": [1, 0]}),
                                             ((3, 10, 32), "transpose", {"dim0": 0, "dim1": 1}),
                                             ((32,), "transpose", {"dim0": -1, "dim1": -2})])
def test_a_matmul_by_a_transposed_matrix_is_a_linear(a_shape, op, attrs):
    p = _program(a_shape, (48, 32), op, attrs)
    result = rewrite_program(p, rules=[matmul_of_transpose], check=False)
    assert result.rules_fired == {"matmul_of_transpose": 1}
    ops = [n.op for n in result.program.nodes.values()]
    assert ops == ["linear"], ops
    for seed in range(3):
        drawn = random_inputs(p, seed)
        want = next(iter(run_reference(p, drawn).values()))
        got = next(iter(run_reference(result.program, drawn).values()))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_batched_and_unswapped_transposes_stay():
    batched = Program("bmm")
    a = batched.add_input("a", (2, 8, 16))
    w = batched.add_input("w", (2, 12, 16))
    t = batched.add_node("transpose", [w.id], {"dim0": 1, "dim1": 2})
    batched.mark_output(batched.add_node("matmul", [a.id, t.outputs[0]]).outputs[0])
    assert rewrite_program(batched, rules=[matmul_of_transpose], check=False).rules_fired == {}
    same = _program((8, 16), (16, 12), "permute", {"dims": [0, 1]})
    assert rewrite_program(same, rules=[matmul_of_transpose], check=False).rules_fired == {}


def test_a_permute_only_a_library_call_reads_stays_a_strided_view():
    """Planned as it is (no rewrite): the normalisation's kernel does not store the transpose."""
    p = Program("similarity")
    a = p.add_input("a", (512, 64))
    b = p.add_input("b", (384, 64))
    n = p.add_node("mul_scalar", [b.id], {"value": 0.5})
    t = p.add_node("permute", [n.outputs[0]], {"dims": [1, 0]})
    p.mark_output(p.add_node("matmul", [a.id, t.outputs[0]]).outputs[0])
    plan = plan_program(p)
    region = next(r for r in plan.active if t.id in r.nodes)
    assert region.nodes == [t.id], [(r.nodes, r.reason) for r in plan.active]
    assert "strided view" in region.reason


def test_a_similarity_of_normalised_embeddings_plans_with_no_permute(tmp_path):
    f = tmp_path / "similarity.py"
    f.write_text(SIMILARITY)
    res = cli("plan", str(f))
    assert res.returncode == 0, res.stderr
    assert "rewrite matmul_of_transpose:" in res.stdout
    regions = [ln for ln in res.stdout.splitlines() if ln[:1] == "r" and ln[1:2].isdigit()]
    assert len(regions) == 3 and not any("permute" in ln for ln in regions), regions    # two norms, the linear
