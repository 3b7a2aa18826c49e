"""A cat's arms read before its select (codegen/views.render_layout_arms, the layout graph's `select`):
every arm loads at its offset clamped into its source, so a warp whose lanes straddle the arms (RoPE's
halves of a head) issues all their loads at once instead of branching. It is the default where a warp
straddles a cat's arms (H100, L2 flushed: GPT-NeoX's partial RoPE 0.108 -> 0.097 ms) and the branched
form is the tuner's alternative. Emulated on the CPU, every form equals torch, including arms whose
unclamped offset would fall outside their source, pads' constant arms and a gather arm (which keeps
its branch)."""
import pytest
import torch

from agent_core.agent.tune import tune_space
from agent_core.codegen import generate_kernel
from agent_core.ir import Program
from agent_core.reference import run_reference
from tests import planned
from tests.test_codegen_column_tiles import _emulate_region

pytestmark = pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulator needs g++")


def _variants(ks) -> list[dict]:
    return [{k: v for k, v in o.items() if k != "sm_count"} for o in tune_space(ks)]


def _emulated_equals_torch(p, r, params, seed=0):
    g = torch.Generator().manual_seed(seed)
    ins = [torch.randn(p.values[v].shape, generator=g) if p.values[v].dtype == "float32" else
           torch.randint(0, int(p.values[v].init["high"]), p.values[v].shape, generator=g) for v in p.inputs]
    env = run_reference(p, ins, keep=True)
    ks, outs = _emulate_region(p, r, env, params=params)
    for v, got in outs.items():
        torch.testing.assert_close(got, env[v], rtol=0, atol=1e-6, equal_nan=True)
    return ks


@pytest.mark.parametrize("block", ["rope_partial_gptneox_pythia", "rope_qk_llama7b"])
@pytest.mark.parametrize("params", [None, {"in_turn": True}, {"vector": False, "pack": False}])
def test_rope_with_every_arm_read_before_the_select_equals_torch(block, params):
    _, p = planned.plan(planned.block(block))
    [r] = [r for r in p.regions if r.schedule.get("runs") == "kernel"]
    plain = generate_kernel(p, r.nodes, name="rope")
    assert plain.params["straddles"] and plain.params["select"] and {"select": False} in _variants(plain)
    branched = _emulated_equals_torch(p, r, {**(params or {}), "select": False})
    assert not branched.params["select"] and "every arm read" not in branched.source
    ks = _emulated_equals_torch(p, r, params)
    assert ks.params["select"] and "every arm read before the select" in ks.source
    # no arm's load waits behind a branch: each cat returns a select of locals
    cats = [ln for ln in ks.source.splitlines() if "every arm read" in ln]
    assert cats and all("? arm" in nxt for ln, nxt in zip(ks.source.splitlines(), ks.source.splitlines()[1:])
                        if "every arm read" in ln)
    # each arm loads at a clamped offset: a lane of the other arm reads a valid element and drops it
    arms = [part for ln in ks.source.splitlines() for part in ln.split("const ")[1:] if part.split()[1].startswith("arm")]
    assert arms and all("(min(max((index_t)(" in a for a in arms)


def _cat_program(pieces, dim, pad=None, gather=False):
    """x_k of shapes `pieces` (along dim) -> [pad] -> cat along dim -> * 2; or an embedding arm."""
    p = Program()
    xs = [p.add_input(f"x{k}", s) for k, s in enumerate(pieces)]
    ids = [x.id for x in xs]
    if pad is not None:
        ids[0] = p.add_node("pad", [ids[0]], {"pad": pad, "mode": "constant", "value": 0.5}).outputs[0]
    if gather:
        table = p.add_input("table", (16, pieces[0][-1]))
        idx = p.add_input("idx", pieces[0][:-1], dtype="int64", init={"kind": "randint", "low": 0, "high": 16})
        ids[0] = p.add_node("embedding", [idx.id, table.id], {}).outputs[0]
    c = p.add_node("cat", ids, {"dim": dim})
    y = p.add_node("mul_scalar", [c.outputs[0]], {"value": 2.0})
    p.mark_output(y.outputs[0])
    return p


@pytest.mark.parametrize("case", ["halves", "thirds_scalar", "pad_arm", "stack_like_narrow"])
def test_a_straddled_cat_selects_and_equals_torch(case):
    p = {"halves": lambda: _cat_program([(3, 8), (3, 8)], -1),
         "thirds_scalar": lambda: _cat_program([(7, 5), (7, 6), (7, 3)], 1),
         "pad_arm": lambda: _cat_program([(4, 6), (4, 8)], 1, pad=[1, 1]),
         "stack_like_narrow": lambda: _cat_program([(2, 1, 4), (2, 3, 4)], 1)}[case]()
    nodes = [n for n in p.nodes]
    plain = generate_kernel(p, nodes, name="cat", kind="layout", params={"pack": False})
    assert plain.params["straddles"] and plain.params["select"]
    from types import SimpleNamespace
    r = SimpleNamespace(nodes=nodes, id="r1")
    for seed in range(3):
        ks = _emulated_equals_torch(p, r, {"pack": False}, seed)
        _emulated_equals_torch(p, r, {"pack": False, "select": False}, seed)
    assert ks.params["select"]


def test_a_gather_arm_keeps_its_branch_and_a_wide_cat_keeps_its_branches():
    from types import SimpleNamespace
    p = _cat_program([(4, 8), (4, 8)], -1, gather=True)
    nodes = list(p.nodes)
    ks = _emulated_equals_torch(p, SimpleNamespace(nodes=nodes, id="r1"), {"select": True})
    assert "every arm read before the select" not in ks.source     # the index load itself could be out of range
    wide = _cat_program([(64, 1024), (64, 1024)], 0)
    ks = generate_kernel(wide, list(wide.nodes), name="cat", kind="layout")
    assert not ks.params["straddles"] and not ks.params["select"]
    assert not any("select" in o for o in _variants(ks))
