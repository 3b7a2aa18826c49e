"""The agent loop, optimize, worker and bench on a machine without a GPU (CI)."""
import io
import json
import os
import pytest

from agent_core.agent import NO_GPU_LINE, EventEmitter, optimize, read_events
from agent_core.commands import bench
from agent_core.importers import import_file
from agent_core.project_file import load_program

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "resources", "examples")


def _run(name, tmp_path, **kw):
    buf = io.StringIO()
    prog = import_file(os.path.join(EXAMPLES, name))
    res = optimize(prog, out_dir=tmp_path / name[:-3], device="cpu", emit=EventEmitter(buf), **kw)
    return prog, res, list(read_events(buf.getvalue().splitlines()))


@pytest.mark.parametrize("name", ["mlp6_tiny.py", "transformer_block.py"])
def test_loop_on_cpu_plans_generates_compiles_and_stops(name, tmp_path):
    prog, res, events = _run(name, tmp_path)
    kinds = [e["event"] for e in events]
    assert kinds[0] in ("rewrite", "plan") and kinds[-1] == "done"
    assert kinds.count("plan") == 1
    assert kinds.count("region-proposed") == len(res.outcomes) >= 1
    assert kinds.count("codegen") == kinds.count("compile") >= 1
    assert not {"verify", "profile", "tune-step"} & set(kinds)       # nothing runs without a GPU
    assert events[-1]["status"] == "no-gpu" and res.status == "no-gpu" and not res.gpu
    assert any(e.get("no_gpu") for e in events if e["event"] == "log")
    assert all(e["arch"] == "sm_90" for e in events if e["event"] == "compile")
    compiled = [o for o in res.outcomes if o.status == "compiled"]
    assert len(compiled) == kinds.count("compile")
    for o in res.outcomes:       # every region says what happened to it and why
        assert o.status in ("compiled", "fallback", "library", "view") and o.reason
    assert len(prog.regions) == 0  # the caller's program is left alone


def test_optimize_output_folder(tmp_path):
    _, res, events = _run("transformer_block.py", tmp_path)
    out = tmp_path / "transformer_block"
    kernels = sorted(os.listdir(out / "kernels"))
    assert len(kernels) == sum(1 for e in events if e["event"] == "codegen") and all(k.endswith(".cu") for k in kernels)
    prog = load_program(out / "program.json")
    agent = {r.id: r.schedule.get("agent") for r in prog.regions}
    assert all(a and a["status"] and a["reason"] for a in agent.values())
    for r in prog.regions:
        if agent[r.id]["status"] == "compiled":
            assert r.source and "__global__" in r.source
            assert (out / agent[r.id]["source_path"]).read_text() == r.source
        assert r.log[-1]["actor"] == "agent"
    prof = json.loads((out / "profile.json").read_text())
    assert prof["status"] == "no-gpu" and len(prof["regions"]) == len(prog.regions)


def test_cli_optimize_and_worker_without_gpu(tmp_path, capsys):
    from agent_core.cli import main
    src = os.path.join(EXAMPLES, "softmax_rows.py")
    out = tmp_path / "o"
    assert main(["optimize", src, "-o", str(out), "--cpu"]) == 0
    assert NO_GPU_LINE.format(arch="sm_90") in capsys.readouterr().out
    assert {"program.json", "profile.json", "events.jsonl", "kernels"} <= set(os.listdir(out))
    with open(out / "events.jsonl") as f:
        assert [e["event"] for e in read_events(f)][-1] == "done"
    assert main(["worker", src, "--cpu"]) == 0
    events = list(read_events(capsys.readouterr().out.splitlines()))   # stdout holds nothing but events
    assert events[-1]["event"] == "done" and any(e["event"] == "compile" for e in events)
    assert main(["worker", str(tmp_path / "missing.json"), "--cpu"]) == 1
    last = list(read_events(capsys.readouterr().out.splitlines()))[-1]
    assert last["event"] == "error" and last["fatal"] and "missing.json" in last["message"]


def _rec(name, eager, comp, ours, correct=True):
    return {"problem": name, "ok": True, "correct": correct, "eager_ms": eager, "compile_best_ms": comp,
            "ours_ms": ours, "speedup_eager": eager / ours if eager else None,
            "speedup_compile": comp / ours if comp else None, "kernels": 2, "floor_ms": 0.001, "achieved_gbs": 900.0}


def test_bench_table_and_geometric_means_on_fake_measurements():
    recs = [_rec("a", 2.0, 1.0, 0.5), _rec("b", 8.0, 4.0, 1.0), _rec("c", 1.0, None, 1.0),
            _rec("wrong", 100.0, 100.0, 1.0, correct=False),
            {"problem": "broken", "ok": False, "error": "ImportFailure: broken.py: syntax error at line 3"}]
    s = bench.summary(recs)
    assert s["problems"] == 5 and s["failed"] == 1 and s["correct"] == 3
    assert s["geomean_speedup_eager"] == pytest.approx((4 * 8 * 1) ** (1 / 3))
    assert s["geomean_speedup_compile"] == pytest.approx(8 ** 0.5)
    lines = bench.table(recs)
    assert lines[0].split()[:2] == ["problem", "correct"]
    assert any(ln.startswith("broken") and "FAILED" in ln and "syntax error" in ln for ln in lines)
    assert any(ln.startswith("wrong") and " NO " in ln for ln in lines)
    assert "3.17x vs eager" in lines[-1] and "2.83x vs the better torch.compile" in lines[-1]
    assert "3/5 correct, 1 failed" in lines[-1]


def test_bench_record_from_an_optimize_result_and_guarded_failures(tmp_path, capsys):
    class Args:
        files = [os.path.join(EXAMPLES, "softmax_rows.py"), str(tmp_path / "nope.py")]
        json_out = str(tmp_path / "b.jsonl")
        timeout, time_cap, compile_cap, isolate, jobs = 60.0, 0.0, 0.0, False, 1
        no_tune, tune_trials, draws, trials, no_rewrite, cpu = True, 1, 5, 20, False, True
        no_compile_baselines, compile_budget, compile_modes = False, 60.0, None
        ray, resume, events, kernel_cache = None, False, None, None
    assert bench.run(Args()) == 0
    with open(Args.json_out) as f:
        recs = [json.loads(line) for line in f]
    assert recs[0]["ok"] and recs[0]["compiled"] == 1 and recs[0]["correct"] is None
    assert not recs[1]["ok"] and "no such file" in recs[1]["error"]
    assert "0/2 correct, 1 failed" in capsys.readouterr().out


def test_time_limit_interrupts_python_level_hangs():
    import time
    with pytest.raises(bench.ProblemTimeout):
        with bench.time_limit(0.2):
            time.sleep(5)


def test_waiting_for_the_gpu_does_not_count_against_the_time_limit(tmp_path, monkeypatch):
    # bench --jobs: another problem holds the GPU lock for 0.4 s of a 0.3 s limit; the problem still
    # finishes its own 0.1 s of work, and a real hang after the wait is still cut off
    import fcntl
    import threading
    import time

    from agent_core.agent.phases import PhaseClock
    from agent_core.profile import timing
    lock = tmp_path / "t.lock"
    monkeypatch.setenv(timing.TIMING_LOCK_ENV, str(lock))
    other = open(lock, "a")
    fcntl.flock(other, fcntl.LOCK_EX)                      # another problem measuring
    threading.Timer(0.4, lambda: fcntl.flock(other, fcntl.LOCK_UN)).start()
    clock = PhaseClock()
    with bench.time_limit(0.3, not_counted=lambda: clock.seconds_in("gpu_wait")), clock.running():
        with timing.gpu_work():                            # waits 0.4 s for the lock
            time.sleep(0.1)
    assert clock.totals["gpu_wait"] == pytest.approx(0.4, abs=0.15)
    clock = PhaseClock()
    with pytest.raises(bench.ProblemTimeout, match="waiting for the GPU"):
        fcntl.flock(other, fcntl.LOCK_EX)
        threading.Timer(0.4, lambda: fcntl.flock(other, fcntl.LOCK_UN)).start()
        with bench.time_limit(0.3, not_counted=lambda: clock.seconds_in("gpu_wait")), clock.running():
            with timing.gpu_work():
                time.sleep(5)                              # a hang of its own
    other.close()
