"""The planner's working order keeps each chain together (planner/state.py, fast_topo_order).

A merge rewrites the stretch of the order between its two groups, so independent blocks interleaved
level by level made every merge in a program of many blocks scan most of the program. These tests
time nothing: they check the order itself and the plan a user reads from it.
"""
from __future__ import annotations

from agent_core.ir import Program
from agent_core.planner import plan_program
from agent_core.planner.state import fast_topo_order


def _rope_blocks(blocks: int) -> tuple[Program, list[set[str]]]:
    """Independent RoPE blocks, each on its own input (7 nodes a block), and each block's node ids."""
    p = Program("rope_blocks")
    shape = (2, 16, 32)
    cos, sin = (p.add_parameter(n, shape=shape[-2:]).id for n in ("cos", "sin"))
    members = []
    for k in range(blocks):
        before = set(p.nodes)
        x = p.add_input(f"x{k}", shape).id
        a = p.add_node("slice", [x], {"dim": -1, "start": 16, "end": None}).outputs[0]
        b = p.add_node("slice", [x], {"dim": -1, "start": 0, "end": 16}).outputs[0]
        a = p.add_node("neg", [a]).outputs[0]
        r = p.add_node("mul", [p.add_node("cat", [a, b], {"dim": -1}).outputs[0], sin]).outputs[0]
        p.mark_output(p.add_node("add", [p.add_node("mul", [x, cos]).outputs[0], r]).outputs[0])
        members.append(set(p.nodes) - before)
    return p, members


def _is_topological(p: Program, order: list[str]) -> bool:
    pos = {n: i for i, n in enumerate(order)}
    return sorted(order) == sorted(p.nodes) and all(
        pos[p.values[v].producer] < pos[nid]
        for nid, n in p.nodes.items() for v in n.inputs if v and p.values[v].producer)


def test_independent_blocks_stay_contiguous_in_creation_order():
    p, members = _rope_blocks(12)
    order = fast_topo_order(p)
    assert _is_topological(p, order)
    spans = [order[7 * k:7 * (k + 1)] for k in range(12)]
    assert [set(s) for s in spans] == members        # block k is positions 7k..7k+6, in block order


def test_a_chain_with_side_inputs_is_contiguous():
    # each step reads the chain and a value made from a parameter on the side: the chain never
    # waits behind the other steps' side values
    p = Program("chain")
    x = p.add_input("x", (8, 8)).id
    w = p.add_parameter("w", shape=(8, 8)).id
    chain = []
    for _ in range(20):
        side = p.add_node("tanh", [w])
        step = p.add_node("add", [x, side.outputs[0]])
        x = step.outputs[0]
        chain += [side.id, step.id]
    p.mark_output(x)
    order = fast_topo_order(p)
    assert _is_topological(p, order) and order == chain


def test_plan_numbers_regions_block_by_block():
    # what the Regions dock lists: the regions of the first block come first, then the second's, ...
    p, members = _rope_blocks(6)
    block_of = {n: k for k, m in enumerate(members) for n in m}
    plan = plan_program(p)
    firsts = [min(block_of[n] for n in r.nodes) for r in plan.active]
    assert len(plan.active) >= 2 and firsts == sorted(firsts), firsts
