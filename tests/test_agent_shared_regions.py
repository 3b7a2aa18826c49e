"""Issue 17: regions that run the same kernel on the same shapes are verified, tuned and timed once
(agent/shared_regions.py), each keeps a verdict of its own, and a failure is never shared as a pass.

The loop runs its GPU path on the CPU (tests/test_agent_mockgpu.py's mock: real sm_90 compiles,
kernels evaluated with torch, timing counted in torch op calls); what is counted are the loop's own
verify and tune-step events."""
import io

import numpy as np
import pytest

from agent_core.agent import EventEmitter, optimize, read_events
from agent_core.agent.shared_regions import region_signature
from agent_core.codegen import generate_kernel
from agent_core.ir import Program
from tests.test_agent_mockgpu import SABOTAGED, mock_gpu  # noqa: F401  (the fixture)

BLOCKS = 5


def blocks(n=BLOCKS, width=24, batch=8, odd_width=None) -> Program:
    """n x (linear -> gelu -> mul by a per-block scale): equal shapes, so one signature; odd_width
    makes the last block wider (another signature)."""
    rng = np.random.default_rng(1)
    p = Program("repeated_blocks")
    h = p.add_input("x", (batch, width)).id
    for i in range(n):
        w_out = odd_width if (odd_width and i == n - 1) else width
        w = p.add_parameter(f"b{i}.w", rng.standard_normal((w_out, p.values[h].shape[1])).astype(np.float32) * 0.2).id
        s = p.add_parameter(f"b{i}.s", rng.standard_normal((w_out,)).astype(np.float32)).id
        h = p.add_node("linear", [h, w]).outputs[0]
        h = p.add_node("gelu", [h]).outputs[0]
        h = p.add_node("mul", [h, s]).outputs[0]
    p.mark_output(h)
    return p


def _run(prog, tmp_path, **kw):
    buf = io.StringIO()
    res = optimize(prog, out_dir=tmp_path, emit=EventEmitter(buf), tune_trials=2, baseline_fn=(None, []), rewrite=False,
                   baselines=False, **kw)
    return res, list(read_events(buf.getvalue().splitlines()))


def _generated(res):
    return [o for o in res.outcomes if o.status not in ("library", "view")]


def test_identical_regions_are_verified_and_timed_once_and_each_keeps_a_verdict(mock_gpu, tmp_path):
    res, events = _run(blocks(), tmp_path)
    gen = _generated(res)
    assert len(gen) == BLOCKS, [(o.region, o.status, o.reason) for o in res.outcomes]
    full = [e for e in events if e["event"] == "verify" and e["scope"] == "region" and e["draws"] == 5]
    own = [e for e in events if e["event"] == "verify" and e["scope"] == "region"
           and str(e.get("candidate", "")).startswith("shared with")]
    tuned = {e["region"] for e in events if e["event"] == "tune-step"}
    first = gen[0].region
    # the first region alone is verified on 5 draws and tuned; the others are checked on 1 own draw
    assert {e["region"] for e in full} == {first}
    assert sorted(e["region"] for e in own) == sorted(o.region for o in gen[1:])
    assert all(e["ok"] and e["draws"] == 1 for e in own)
    assert tuned == {first}
    for o in gen:
        assert o.status == "fused" and o.fused_ms == gen[0].fused_ms and o.unfused_ms == gen[0].unfused_ms
    for o in gen[1:]:
        assert f"same shapes as region {first}" in o.reason and "own inputs checked on 1 draw" in o.reason
    for r in res.program.regions:       # the saved program says so, region by region
        if r.id in {o.region for o in gen}:
            assert r.schedule["agent"]["status"] == "fused" and r.source
    stats = res.profile["shared_regions"]
    assert stats["measured"] == 1 and stats["shared"] == BLOCKS - 1 and stats["repeated_signatures"] == 1
    # every region's own kernel is written, named after it, and the whole program still verifies
    assert len({o.source_path for o in gen}) == BLOCKS
    e2e = res.profile["end_to_end"]
    assert e2e["correct"] and e2e["generated_kernels"] == BLOCKS


def test_a_region_of_other_shapes_is_measured_on_its_own(mock_gpu, tmp_path):
    res, events = _run(blocks(odd_width=16), tmp_path)
    gen = _generated(res)
    full = {e["region"] for e in events if e["event"] == "verify" and e["scope"] == "region" and e["draws"] == 5}
    assert full == {gen[0].region, gen[-1].region}      # the wider last block has its own signature
    assert "same shapes as region" not in gen[-1].reason
    assert res.profile["shared_regions"]["measured"] == 2


def test_a_failing_kernel_is_not_shared_as_passing(mock_gpu, tmp_path):
    first_res, _ = _run(blocks(), tmp_path / "probe")
    first = _generated(first_res)[0].region
    SABOTAGED.add(f"_{first}")          # the first region's kernel is off by 1e-2: it fails verification
    res, events = _run(blocks(), tmp_path / "run")
    gen = _generated(res)
    assert gen[0].status == "fallback" and gen[0].reason.startswith("verification failed")
    for o in gen[1:]:       # the others run the same code: they fall back too, and say where it failed
        assert o.status == "fallback" and o.reason.startswith("verification failed")
        assert f"region {first}" in o.reason
    assert res.profile["end_to_end"]["correct"] and res.profile["end_to_end"]["generated_kernels"] == 0


def test_a_region_failing_its_own_check_is_optimized_on_its_own(mock_gpu, tmp_path):
    probe, _ = _run(blocks(), tmp_path / "probe")
    gen0 = _generated(probe)
    bad = gen0[2].region
    SABOTAGED.add(f"_{bad}")            # only the third block's kernel is wrong
    res, events = _run(blocks(), tmp_path / "run")
    by = {o.region: o for o in res.outcomes}
    assert by[bad].status == "fallback" and by[bad].reason.startswith("verification failed")
    assert "same shapes" not in by[bad].reason
    # its own check failed, then its own full verification (5 draws) ran and failed
    mine = [e for e in events if e["event"] == "verify" and e["scope"] == "region" and e["region"] == bad]
    assert [e["draws"] for e in mine][0] == 1 and not mine[0]["ok"] and any(not e["ok"] for e in mine[1:])
    others = [o for o in _generated(res) if o.region != bad]
    assert all(o.status == "fused" for o in others)
    assert res.profile["shared_regions"]["own_check_failed"] == 1
    assert res.profile["end_to_end"]["correct"]


def test_the_signature_ignores_names_and_sees_shapes_ops_and_constants():
    p = blocks(odd_width=16)
    from agent_core.planner import apply_plan, plan_program
    plan = plan_program(p)
    apply_plan(p, plan)
    regs = [r for r in plan.active if len(r.nodes) > 1]
    sigs = []
    for r in regs:
        ks = generate_kernel(p, r.nodes, name=f"k_{r.id}", kind=r.kind)
        sigs.append(region_signature(p, r.nodes, ks))
    assert len(set(sigs[:-1])) == 1 and sigs[-1] != sigs[0]
    # a constant that differs (gelu's approximation) changes the signature
    r = regs[1]
    gelu = next(n for n in r.nodes if p.nodes[n].op == "gelu")
    p.nodes[gelu].attrs["approximate"] = "tanh"
    ks = generate_kernel(p, r.nodes, name=f"k_{r.id}", kind=r.kind)
    assert region_signature(p, r.nodes, ks) != sigs[0]


def test_integer_inputs_are_never_shared():
    p = Program("idx")
    x = p.add_input("x", (4, 8)).id
    i = p.add_input("i", (4, 8), dtype="int64", init={"kind": "randint", "low": 0, "high": 8}).id
    y = p.add_node("gather", [x, i], {"dim": 1}).outputs[0]
    p.mark_output(p.add_node("relu", [y]).outputs[0])
    nodes = list(p.nodes)
    try:
        ks = generate_kernel(p, nodes, name="k")
    except Exception:
        pytest.skip("no kernel for gather here")
    assert region_signature(p, nodes, ks) is None
