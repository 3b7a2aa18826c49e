"""A region that verified but lost to its unfused ops is tried again as the planner's next split of it
(agent/split_lost.py): on the mock GPU of test_agent_mockgpu (kernels compiled for real, launched by a
fake that runs their nodes with torch, time counted in torch op calls), a slowed fused kernel falls
back and its parts are generated, verified, timed and kept in its place."""
import io
from types import SimpleNamespace

import torch

from agent_core.agent import EventEmitter, optimize, read_events
from agent_core.agent.loop import RegionOutcome
from agent_core.agent.refcache import ReferenceCache
from agent_core.agent.split_lost import LOST, next_split, worth_splitting
from agent_core.planner import apply_plan, plan_program
from agent_core.reference import run_reference
from agent_core.regions import Region
from tests.pool_prologue_cases import chain
from tests.test_agent_mockgpu import SLOWED, mock_gpu  # noqa: F401 (the fixture)


def _planned(name="tanh_pool_group_norm"):
    p, ids, shape = chain(name)
    apply_plan(p, plan_program(p))
    return p, ids


def test_the_next_split_is_the_planners_plan_of_the_nodes_with_the_region_rejected():
    p, ids = _planned()
    [r] = p.regions
    assert sorted(r.nodes) == sorted(ids) and r.status == "proposed"
    parts = next_split(p, r)
    ops = [[p.nodes[n].op for n in part.nodes] for part in parts]
    assert ops == [["tanh", "max_pool2d"], ["group_norm"]], ops
    assert parts[0].kind == "pooling" and "max_pool2d applies tanh" in parts[0].reason
    assert p.regions == [r] and r.status == "proposed"      # the program's own regions untouched


def test_the_other_regions_stay_as_they_are():
    p, ids = _planned()
    x = p.add_input("y", [4, 64])
    s = p.add_node("softmax", [x.id], {"dim": -1})
    e = p.add_node("exp", [s.outputs[0]])
    p.mark_output(e.outputs[0])
    apply_plan(p, plan_program(p))
    lost = next(r for r in p.regions if set(r.nodes) == set(ids))
    other = next(r for r in p.regions if r is not lost)
    parts = next_split(p, lost)
    assert all(set(part.nodes) <= set(ids) for part in parts) and len(parts) == 2
    assert other in p.regions and other.status == "proposed" and sorted(other.nodes) == sorted([s.id, e.id])


def test_which_lost_regions_are_worth_splitting():
    agent = SimpleNamespace(planned_ms=1.0, shared=None)
    big = Region("r1", "reduction", ["n1", "n2"], est_after_ms=0.2)
    lost = RegionOutcome("r1", "fallback", f"{LOST} (30.0 us vs 20.0 us)")
    assert worth_splitting(agent, big, lost)
    assert not worth_splitting(agent, Region("r2", "reduction", ["n1", "n2"], est_after_ms=0.005), lost)   # 0.5%
    assert not worth_splitting(agent, Region("r3", "single", ["n1"], est_after_ms=0.2), lost)
    assert not worth_splitting(agent, big, RegionOutcome("r1", "fallback", "verification failed: draw 1"))
    assert not worth_splitting(agent, big, RegionOutcome("r1", "fused", "verified"))


def test_the_reference_cache_keeps_a_split_regions_new_boundary():
    p, ids = _planned()
    pooled = p.nodes[ids[1]].outputs[0]
    cache = ReferenceCache(p, set())
    assert pooled not in cache.draw(0)
    cache.also_keep([pooled])
    want = run_reference(p, cache.inputs(0), keep=True)[pooled]
    torch.testing.assert_close(cache.draw(0)[pooled], want)


def test_a_region_that_loses_is_replaced_by_its_parts_which_win(mock_gpu, tmp_path):
    p, ids = _chain_program()
    SLOWED.add("tanh_pool_group_norm_r1 ")      # the fused kernel alone (its parts are r1_1, r1_2)
    buf = io.StringIO()
    res = optimize(p, out_dir=tmp_path, emit=EventEmitter(buf), tune_trials=2, baseline_fn=(None, []))
    events = list(read_events(buf.getvalue().splitlines()))
    by_id = {o.region: o for o in res.outcomes}
    assert by_id["r1"].status == "fallback" and by_id["r1"].reason.startswith(LOST)
    assert "tried as the planner's next split of it instead: r1_1 (tanh, max_pool2d); r1_2 (group_norm)" \
        in by_id["r1"].reason
    assert by_id["r1_1"].status == by_id["r1_2"].status == "fused", res.outcomes
    assert [(r.id, r.kind) for r in res.program.regions] == [("r1_1", "pooling"), ("r1_2", "reduction")]
    assert res.program.regions[0].reason.startswith("Split from r1, which verified but was slower than its "
                                                    "unfused ops")
    split = [e for e in events if e["event"] == "region-proposed" and e.get("split_from") == "r1"]
    assert [e["region"] for e in split] == ["r1_1", "r1_2"]
    e2e = res.profile["end_to_end"]
    assert e2e["correct"] and e2e["generated_kernels"] == 2


def test_a_region_that_wins_is_not_split(mock_gpu, tmp_path):
    p, ids = _chain_program()
    res = optimize(p, out_dir=tmp_path, emit=EventEmitter(io.StringIO()), tune_trials=2, baseline_fn=(None, []))
    assert [(o.region, o.status) for o in res.outcomes] == [("r1", "fused")]
    assert [r.id for r in res.program.regions] == ["r1"]


def _chain_program():
    p, ids, _ = chain("tanh_pool_group_norm")
    p.name = "tanh_pool_group_norm"
    return p, ids
