"""Issue 17: where the agent's GPU time goes. Library calls of one signature are timed once and each
other node checks the chosen form on its own tensors (agent/precision_share.py); regions under a
share of the program keep default parameters (agent/tune_budget.py), counting the regions that share
their kernel; a clearly slower candidate stops after a few timed trials (agent/quick_timing.py).

Run through the loop's GPU path on the CPU (tests/test_agent_mockgpu.py's mock), counting events
and timed calls."""
import io

import numpy as np
import pytest

import agent_core.agent.tune_budget as tune_budget
import agent_core.profile.timing as timing
import agent_core.runtime.split_tf32 as split_mod
from agent_core.agent import EventEmitter, optimize, read_events
from agent_core.agent.quick_timing import QUICK_TRIALS, time_candidate
from agent_core.ir import Program
from tests.test_agent_mockgpu import _fp32_looks_slow, mock_gpu  # noqa: F401  (the fixture)
from tests.test_agent_shared_regions import BLOCKS, blocks


def _run(prog, tmp_path, **kw):
    prog.metadata["memory_budget_bytes"] = 1 << 40     # room for every split form (test_memory_plan has the budget)
    buf = io.StringIO()
    kw.setdefault("tune_trials", 2)
    res = optimize(prog, out_dir=tmp_path, emit=EventEmitter(buf), baseline_fn=(None, []), baselines=False,
                   rewrite=False, **kw)
    return res, list(read_events(buf.getvalue().splitlines()))


def _linears(res):
    return [n.id for n in res.program.nodes.values() if n.op == "linear"]


def test_library_calls_of_one_shape_are_timed_once_and_each_checks_its_own_tensors(mock_gpu, tmp_path,
                                                                                   monkeypatch):
    _fp32_looks_slow(monkeypatch)        # split TF32 wins where it is timed
    timed = []
    fake = timing.time_in_graph
    monkeypatch.setattr(timing, "time_in_graph", lambda fn, **kw: timed.append(kw.get("trials")) or fake(fn, **kw))
    ran = []
    real = split_mod.run_split_tf32
    monkeypatch.setattr(split_mod, "run_split_tf32", lambda p, nid, env, *a: ran.append(nid) or real(p, nid, env, *a))
    res, events = _run(blocks(), tmp_path, tune=False, time_regions=False)
    lin = _linears(res)
    prec = {e["node"]: e for e in events if e["event"] == "precision"}
    assert set(prec) == set(lin) and len(lin) == BLOCKS
    first = [n for n in lin if "shared_with" not in prec[n]]
    assert len(first) == 1 and all(prec[n]["shared_with"] == first[0] for n in lin if n != first[0])
    # every node runs split TF32 (the first's choice) and each of the others ran it on its own tensors
    assert all(prec[n]["chosen"] == split_mod.TF32X3 for n in lin)
    assert res.program.metadata["library_precision"] == {n: split_mod.TF32X3 for n in lin}
    gains = res.program.metadata["library_precision_gain_ms"]     # the first's saving, shared with the others
    assert set(gains) == set(lin) and len(set(gains.values())) == 1
    assert set(lin[1:]) <= set(ran)
    # the forms of one node timed (fp32, 3xtf32, 3xtf32-cat) and nothing else before the end-to-end program
    assert res.profile["end_to_end"]["correct"]
    assert timed == [20] + [QUICK_TRIALS, 20 - QUICK_TRIALS] * 2   # fp32 in full, each split form quick then the rest
    assert "fp32_ms" in prec[first[0]] and "fp32_ms" not in prec[lin[-1]]


def test_a_node_whose_own_tensors_disagree_is_timed_on_its_own(mock_gpu, tmp_path, monkeypatch):
    _fp32_looks_slow(monkeypatch)
    probe, _ = _run(blocks(), tmp_path / "probe", tune=False, time_regions=False)
    odd = _linears(probe)[3]
    import agent_core.agent.precision as precision
    for name in ("run_split_tf32", "run_split_tf32_cat"):    # both split forms are off for one node's operands only
        def wrong_for_one(p, nid, env, *args, real=getattr(split_mod, name)):
            real(p, nid, env, *args)
            if nid == odd:
                out = p.nodes[nid].outputs[0]
                env[out] = env[out] + 1e-2
        monkeypatch.setattr(split_mod, name, wrong_for_one)
        monkeypatch.setattr(precision, name, wrong_for_one)
    res, events = _run(blocks(), tmp_path / "run", tune=False, time_regions=False)
    prec = [e for e in events if e["event"] == "precision" and e["node"] == odd]
    assert len(prec) == 1 and "shared_with" not in prec[0] and "fp32_ms" in prec[0]
    assert prec[0]["chosen"] == "fp32" and "disagreed" in prec[0]["reason"]
    assert odd not in res.program.metadata["library_precision"]
    assert len(res.program.metadata["library_precision"]) == BLOCKS - 1
    assert res.profile["end_to_end"]["correct"]


def _big_and_small() -> Program:
    rng = np.random.default_rng(0)
    p = Program("big_and_small")
    x = p.add_input("x", (1024, 2048)).id
    h = p.add_node("mul", [p.add_node("gelu", [x]).outputs[0], x]).outputs[0]
    w = p.add_parameter("w", rng.standard_normal((4, 2048)).astype(np.float32)).id
    y = p.add_node("linear", [h, w]).outputs[0]
    y = p.add_node("mul", [p.add_node("tanh", [y]).outputs[0], y]).outputs[0]
    p.mark_output(h)
    p.mark_output(y)
    return p


def test_a_small_region_keeps_its_defaults_and_says_why(mock_gpu, tmp_path, monkeypatch):
    res0, _ = _run(_big_and_small(), tmp_path / "probe", tune=False)
    shares = {r.id: r.est_after_ms for r in res0.program.regions}
    big, small = max(shares, key=shares.get), min(shares, key=shares.get)
    total = sum(shares.values())
    cut = (shares[small] / total + shares[big] / total) / 2        # between the two regions' shares
    monkeypatch.setattr(tune_budget, "MIN_SHARE", cut)
    res, events = _run(_big_and_small(), tmp_path / "run")
    tuned = {e["region"] for e in events if e["event"] == "tune-step" and e["trial"] != 0}
    assert big in tuned and small not in tuned
    o = {x.region: x for x in res.outcomes}[small]
    skip = [t for t in o.trials if t["trial"] == "skipped"]
    assert skip and "not tuned" in skip[0]["reason"] and "% of the program's estimated time" in skip[0]["reason"]
    assert o.status in ("fused", "fallback") and res.profile["end_to_end"]["correct"]


def test_a_region_repeated_often_enough_is_tuned_once(mock_gpu, tmp_path, monkeypatch):
    """Each block alone is under the bar, the five together are over it: tuned, once."""
    res0, _ = _run(blocks(), tmp_path / "probe", tune=False)
    gen = [r for r in res0.program.regions if r.est_after_ms and len(r.nodes) > 1]
    total = res0.program.regions and sum(r.est_after_ms or 0 for r in res0.program.regions)
    one = gen[0].est_after_ms / total
    monkeypatch.setattr(tune_budget, "MIN_SHARE", one * 2)    # one block is under, five are over
    res, events = _run(blocks(), tmp_path / "run")
    tuned = {e["region"] for e in events if e["event"] == "tune-step" and e["trial"] != 0}
    assert len(tuned) == 1
    assert not any(t["trial"] == "skipped" for o in res.outcomes for t in o.trials)


@pytest.mark.parametrize("slower,stopped", [(2.0, True), (1.1, False)])
def test_a_clearly_slower_candidate_stops_after_the_quick_trials(monkeypatch, slower, stopped):
    calls = []

    def fake_in_graph(fn, *, trials=20, **kw):
        calls.append(trials)
        return timing.summarize([slower] * trials), "graph"
    monkeypatch.setattr(timing, "time_in_graph", fake_in_graph)
    t, early = time_candidate(lambda: None, trials=20, best_ms=1.0)
    assert early is stopped
    assert sum(calls) == (QUICK_TRIALS if stopped else 20) and t.trials == sum(calls)
    calls.clear()
    t, early = time_candidate(lambda: None, trials=20)        # nothing to compare with: all trials
    assert not early and calls == [20]
