"""rewrites/einsum.py: an einsum written out as the aten ops torch runs for it (bmm, mul, sum, permutes
and reshapes), so its products and copies fuse with their neighbours. Each bmm sums what torch's
does in its order: the rewritten program gives torch.einsum's bits on the CPU, not just values within
tolerance. What it cannot write out stays one einsum node."""
import pytest
import torch

from agent_core.ir import Program
from agent_core.ops.einsum_plan import plan_flops
from agent_core.reference import random_inputs, run_reference
from agent_core.rewrites import rewrite_program
from agent_core.rewrites.einsum import lower_einsum


def einsum_program(eq, *shapes):
    p = Program("einsum")
    ins = [p.add_input(f"x{i}", s).id for i, s in enumerate(shapes)]
    y = p.add_node("einsum", ins, {"equation": eq}).outputs[0]
    p.mark_output(y)
    return p


def ops(p):
    return [p.nodes[n].op for n in p.topo_order()]


# Mamba2's chunked scan (KernelBench level 3, 48/49 spell them this way) and other common forms
WRITTEN_OUT = [
    ("bclhn,bcshn,bhcls,bcshp->bclhp", (2, 4, 16, 3, 8), (2, 4, 16, 3, 8), (2, 3, 4, 16, 16), (2, 4, 16, 3, 5)),
    ("bclhn,bhcl,bclhp->bchpn", (2, 4, 16, 3, 8), (2, 3, 4, 16), (2, 4, 16, 3, 5)),
    ("bhzc,bchpn->bzhpn", (2, 3, 5, 5), (2, 5, 3, 4, 8)),
    ("bclhn,bchpn,bhcl->bclhp", (2, 4, 16, 3, 8), (2, 4, 3, 5, 8), (2, 3, 4, 16)),
    ("bhid,bhjd,bhj->bhi", (2, 3, 7, 5), (2, 3, 6, 5), (2, 3, 6)),
    ("ij,ij->i", (9, 7), (9, 7)),
]


@pytest.mark.parametrize("case", WRITTEN_OUT, ids=[w[0] for w in WRITTEN_OUT])
def test_an_einsum_is_written_out_and_gives_torchs_bits(case):
    eq, *shapes = case
    p = einsum_program(eq, *shapes)
    res = rewrite_program(p, rules=[lower_einsum])
    got_ops = ops(res.program)
    assert "einsum" not in got_ops and res.rules_fired["lower_einsum"] == 1
    assert set(got_ops) <= {"bmm", "mul", "sum", "permute", "reshape"}
    message = res.fired[0]["message"]
    assert eq in message and "written out as torch runs it" in message
    for seed in (0, 1, 2):
        inputs = random_inputs(p, seed=seed)
        want = torch.einsum(eq, *inputs.values())
        (got,) = run_reference(res.program, inputs).values()
        assert got.shape == want.shape and torch.equal(got, want), (seed, (got - want).abs().max())


def test_a_plain_matmul_einsum_stays_one_node():
    """'bhqd,bhkd->bhqk' is one bmm on views already (raise_attention reads that form): left alone."""
    p = einsum_program("bhqd,bhkd->bhqk", (2, 3, 8, 4), (2, 3, 8, 4))
    res = rewrite_program(p, rules=[lower_einsum])
    assert ops(res.program) == ["einsum"] and not res.fired


def test_a_repeated_label_stays_with_torch():
    """A diagonal ('ii->i') is not among the ops written out: the einsum is kept."""
    p = einsum_program("bii->bi", (2, 5, 5))
    res = rewrite_program(p, rules=[lower_einsum])
    assert ops(res.program) == ["einsum"]


def test_flops_count_torchs_bmms_not_every_index_at_once():
    """Mamba2's diagonal block at its level-3 size: torch runs 21 GFLOP of bmm's, not the 275 GFLOP
    of every index multiplied together; the program's estimate counts torch's."""
    eq = "bclhn,bcshn,bhcls,bcshp->bclhp"
    shapes = [(16, 8, 64, 8, 64), (16, 8, 64, 8, 64), (16, 8, 8, 64, 64), (16, 8, 64, 8, 64)]
    p = einsum_program(eq, *shapes)
    ours = p.node_flops(p.topo_order()[0])
    assert ours == plan_flops(eq, shapes)
    naive = 2 * 16 * 8 * 64 * 8 * 64 * 64 * 64
    assert ours < naive / 10
