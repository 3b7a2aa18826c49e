"""bench records the agent's own time per phase and our peak GPU memory against eager's (issue #17):
`stitchcuda bench --cpu` as a subprocess writes agent_seconds and agent_phases (documented names, each
>= 0, adding up to agent_seconds, torch's baselines left out) and no memory figure on the CPU; its
table ends with the p50/p95/max of the agent's time; tools/bench_merge.py renders both figures. The
phase clock itself: nested phases count once, an event's seconds are taken from the phase around it,
events from other threads are ignored."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import pytest

from agent_core.agent.phases import EXCLUDED, PHASES, PhaseClock, phase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "tests", "data", "mlp_small_cpu", "program.json")
DOC = os.path.join(ROOT, "docs", "OPTIMIZE.md")


def _bench(*argv, timeout=600):
    return subprocess.run([sys.executable, "-m", "agent_core.cli", "bench", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def documented_phases() -> set[str]:
    """The phase names docs/OPTIMIZE.md's bench section lists (`name`: ... in its phases paragraph)."""
    text = open(DOC, encoding="utf-8").read()
    para = text[text.index("`agent_phases`"):]
    para = para[:para.index("\n\n")]
    return set(re.findall(r"`([a-z_]+)`:", para))


def test_cpu_bench_records_the_agents_time_per_phase_and_no_memory_figure(tmp_path):
    out = tmp_path / "runs.jsonl"
    proc = _bench(PROGRAM, "--cpu", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["ok"], rec
    agent, phases = rec["agent_seconds"], rec["agent_phases"]
    assert 0 < agent <= rec["seconds"]
    assert set(phases) <= set(PHASES) and set(phases) <= documented_phases(), phases
    assert all(v >= 0 for v in phases.values()), phases
    assert sum(phases.values()) == pytest.approx(agent, abs=0.02 + 0.01 * agent), phases
    # a CPU run plans, rewrites, generates, compiles and compiles its tuning variants (the last two
    # may take under a millisecond when the kernel cache already has every kernel)
    for name in ("import", "rewrite", "plan", "generate", "compile", "tune"):
        assert name in phases, (name, phases)
    assert min(phases["import"], phases["rewrite"], phases["generate"]) > 0, phases
    assert "verify" not in phases and "time_program" not in phases     # nothing runs without a GPU
    for key in ("peak_mem_eager_bytes", "peak_mem_ours_bytes", "peak_mem_ratio"):
        assert key in rec and rec[key] is None
    line = next(x for x in proc.stdout.splitlines() if x.startswith("agent time per problem:"))
    assert f"p50 {agent:.1f} s, p95 {agent:.1f} s, max {agent:.1f} s over 1 problem," in line, line
    head = next(x for x in proc.stdout.splitlines() if x.startswith("problem"))
    assert "agent s" in head and "mem/eager" in head


@pytest.mark.slow
def test_torchs_baselines_are_not_the_agents_time(tmp_path):
    """With --compile-modes on the CPU, torch eager and torch.compile are timed too: the problem's
    seconds grow by them, the agent's do not."""
    out = tmp_path / "runs.jsonl"
    proc = _bench(PROGRAM, "--cpu", "--no-tune", "--trials", "2", "--compile-modes", "default",
                  "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["compile_seconds"] > 0, rec
    assert rec["agent_seconds"] + rec["compile_seconds"] <= rec["seconds"] + 0.05
    assert sum(rec["agent_phases"].values()) == pytest.approx(rec["agent_seconds"], abs=0.05)


def test_bench_merge_renders_agent_time_and_peak_memory(tmp_path):
    rows = [
        {"problem": "1_Small", "ok": True, "correct": True, "jobs": 1, "ours_ms": 1.0, "eager_ms": 2.0,
         "agent_seconds": 12.5, "agent_phases": {"compile": 10.0, "other": 2.5},
         "peak_mem_eager_bytes": 64 << 20, "peak_mem_ours_bytes": 96 << 20, "peak_mem_ratio": 1.5},
        {"problem": "2_Lean", "ok": True, "correct": True, "jobs": 1, "ours_ms": 1.0, "eager_ms": 2.0,
         "agent_seconds": 70.0, "peak_mem_eager_bytes": 64 << 20, "peak_mem_ours_bytes": 32 << 20,
         "peak_mem_ratio": 0.5},
        {"problem": "3_Cpu", "ok": True, "correct": None, "jobs": 1, "agent_seconds": 3.0,
         "peak_mem_eager_bytes": None, "peak_mem_ours_bytes": None, "peak_mem_ratio": None},
        {"problem": "4_Old", "ok": True, "correct": True, "jobs": 1, "ours_ms": 1.0, "eager_ms": 1.0},
        {"problem": "5_Graph", "ok": True, "correct": True, "jobs": 1, "ours_ms": 1.0, "eager_ms": 2.0,   # 16 bytes
         "peak_mem_eager_bytes": 80716128, "peak_mem_ours_bytes": 80716144, "peak_mem_ratio": 1.0},  # above
    ]
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_merge.py"), str(runs)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    cols = [c.strip() for c in next(x for x in lines if x.startswith("| problem")).strip("|").split("|")]
    cells = {x.split("|")[1].strip(): [c.strip() for c in x.strip("|").split("|")]
             for x in lines if re.match(r"\| \d_", x)}
    assert all(len(c) == len(cols) for c in cells.values()), cells
    agent, mem = cols.index("agent s"), cols.index("peak mem / eager")
    assert cells["1_Small"][agent] == "12.5" and cells["1_Small"][mem] == "1.50 (96.0 / 64.0 MiB)"
    assert cells["2_Lean"][mem] == "0.50 (32.0 / 64.0 MiB)"
    assert cells["3_Cpu"][mem] == "-" and cells["4_Old"][agent] == "-" and cells["4_Old"][mem] == "-"
    # nearest rank over the three figures: p95 is the largest, p50 the middle one
    assert "- agent time per problem (torch's baselines excluded), 3 rows with a figure: " \
           "p95 70.0 s, p50 12.5 s, max 70.0 s" in proc.stdout
    # by bytes, not the ratio rounded to 1.0: an excess too small for the ratio is named with its bytes
    assert "- peak GPU memory above eager's: 2 of 3 rows measured (1_Small, 5_Graph (+16 bytes))" in proc.stdout
    # rows from a --jobs run that waited for other problems' GPU work: the waits are named, and the
    # p95 with them counted in is given beside the agent's own
    rows[0]["gpu_wait_seconds"], rows[1]["gpu_wait_seconds"] = 30.0, 40.0
    runs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_merge.py"), str(runs)],
                          capture_output=True, text=True, timeout=60)
    assert "- agent time per problem (torch's baselines and waits for other problems' GPU work excluded " \
           "(p95 110.0 s with the waits)), 3 rows with a figure: p95 70.0 s, p50 12.5 s, max 70.0 s" in proc.stdout


class FakeTime:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_phases_are_exclusive_and_events_seconds_come_out_of_the_phase_around_them():
    t = FakeTime()
    clock = PhaseClock(clock=t)
    with clock.running():
        t.now += 1.0                                   # other
        with phase("tune"):
            t.now += 2.0
            with phase("verify"):
                t.now += 3.0                           # counted as verify only
            clock.on_event({"event": "compile", "seconds": 0.5})   # NVRTC time inside the trial
            t.now += 0.5
        with phase("baselines"):
            t.now += 10.0                              # torch's, not the agent's
        worker = threading.Thread(target=lambda: clock.on_event({"event": "codegen", "seconds": 99.0}))
        worker.start()
        worker.join()
        with phase("plan"):                            # a phase on this thread only: none from the thread
            t.now += 0.25
    assert clock.wall == pytest.approx(16.75)
    assert clock.agent_seconds == pytest.approx(6.75)
    assert clock.phases() == {"plan": 0.25, "compile": 0.5, "verify": 3.0, "tune": 2.0, "other": 1.0}
    assert sum(clock.phases().values()) == pytest.approx(clock.agent_seconds)
    assert EXCLUDED == ("baselines", "gpu_wait") and "baselines" not in clock.phases()


def test_an_events_seconds_beyond_the_wall_time_around_it_are_clipped():
    """A compile that ran in a pool reports its NVRTC seconds when this thread picks it up after a shorter
    wait (measured on the H200: phases 8.344 s against 8.28 s of wall): the phases still add up."""
    t = FakeTime()
    clock = PhaseClock(clock=t)
    with clock.running():
        with phase("compile"):
            clock.on_event({"event": "compile", "seconds": 4.0})
            clock.on_event({"event": "codegen", "seconds": 1.0})
            t.now += 1.0                               # the wait this thread saw
        t.now += 0.5
    assert clock.phases() == {"generate": 0.2, "compile": 0.8, "other": 0.5}
    assert sum(clock.phases().values()) == pytest.approx(clock.agent_seconds) == pytest.approx(1.5)


def test_phase_is_a_no_op_without_a_clock_and_names_are_checked():
    with phase("verify"):            # optimize outside bench: nothing is timed, nothing fails
        pass
    clock = PhaseClock()
    with clock.running(), pytest.raises(ValueError, match="unknown phase 'verfy'"):
        with phase("verfy"):
            pass


def test_a_gpu_record_holds_the_spread_of_its_trials_and_each_fused_regions_time():
    """A GPU run's record keeps the fastest and slowest end-to-end trial and each fused region's own
    time, so a disturbed end-to-end figure shows against the regions it is made of."""
    from types import SimpleNamespace as NS

    from agent_core.commands.bench import record_from_result
    outcomes = [NS(region="r1", status="fused", fused_ms=0.032, reason="", source_path="r1.cu"),
                NS(region="r2", status="fallback", fused_ms=None, reason="slower", source_path=None)]
    e2e = {"ms": 0.0795, "correct": True, "timing": {"median_ms": 0.0795, "min_ms": 0.031, "max_ms": 0.09}}
    result = NS(profile={"end_to_end": e2e}, outcomes=outcomes, gpu=True, program=None, writer=None)
    rec = record_from_result("layernorm.py", result, 1.0)
    assert rec["ours_ms"] == 0.0795 and rec["ours_spread_ms"] == [0.031, 0.09]
    assert rec["region_ms"] == {"r1": 0.032}


def test_a_program_that_ran_without_its_cuda_graph_says_why_in_the_record_the_summary_and_the_merge(tmp_path):
    """A capture that fails (23_EfficientNetB1 under --jobs 8 on the H100: 1.89 ms, its steps launched one
    by one, against 0.59 ms with the graph) is kept in the record, listed by bench's closing lines and
    by tools/bench_merge.py, not left as a slow row among the others."""
    from types import SimpleNamespace

    from agent_core.commands.bench import record_from_result
    from agent_core.commands.bench_costs import summary_lines
    why = "CUDA graph capture failed (OutOfMemoryError: CUDA out of memory.); steps run one by one"
    result = SimpleNamespace(gpu=True, outcomes=[], program=None, writer=None,
                             profile={"end_to_end": {"correct": True, "ms": 1.89, "cuda_graph": False,
                                                     "graph_error": why}})
    rec = record_from_result("23_EfficientNetB1.py", result, 51.0)
    assert rec["cuda_graph"] is False and rec["graph_error"] == why
    kept = record_from_result("1_MLP.py", SimpleNamespace(gpu=True, outcomes=[], program=None, writer=None, profile={
        "end_to_end": {"correct": True, "ms": 0.1, "cuda_graph": True, "graph_error": None}}), 9.0)
    assert "graph_error" not in kept
    assert summary_lines([rec, kept])[:2] == ["ran without a CUDA graph: 1 problem", f"  23_EfficientNetB1: {why}"]
    assert not any("CUDA graph" in line for line in summary_lines([kept]))
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps({**r, "jobs": 8, "ours_ms": 1.0, "eager_ms": 1.0}) + "\n" for r in (rec, kept)))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_merge.py"), str(runs)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"- ran without a CUDA graph: 1 problem\n- 23_EfficientNetB1: {why}\n" in proc.stdout


def test_a_program_planned_without_its_rewrites_says_why_in_the_record_and_the_summary():
    """31_VisionAttention under --jobs 8: its rewrites' check most likely did not fit the GPU memory the
    others left, so its written-out attention was planned as it was (14.8 ms on the H100; 5.7 with it
    raised, H200)."""
    from types import SimpleNamespace

    from agent_core.commands.bench import record_from_result
    from agent_core.commands.bench_costs import summary_lines
    why = "DoesNotFit: program '31_VisionAttention': the program needs 33.3 GiB for its tensors, 20.8 GiB free"
    rec = record_from_result("31_VisionAttention.py", SimpleNamespace(
        gpu=True, outcomes=[], program=None, writer=None,
        profile={"rewrites_skipped": why, "end_to_end": {"correct": True, "ms": 14.8, "cuda_graph": True}}), 44.0)
    assert rec["rewrites_skipped"] == why and "graph_error" not in rec
    assert summary_lines([rec])[:2] == ["planned without rewrites: 1 problem", f"  31_VisionAttention: {why}"]


def test_a_record_keeps_why_a_problem_ran_without_a_gpu_and_which_calls_stayed_fp32():
    """34_VanillaRNNHidden found no GPU in its process under --jobs 8 and 44_MiniGPTBlock's split forms
    ran out of memory while timed: both rows say so, which is what bench's crowding check reads."""
    from types import SimpleNamespace

    from agent_core.commands.bench import crowded_out, record_from_result
    rec = record_from_result("34_VanillaRNNHidden.py", SimpleNamespace(
        gpu=False, outcomes=[], program=None, writer=None, profile={"no_gpu": "torch sees no CUDA GPU"}), 31.0)
    assert rec["no_gpu"] == "torch sees no CUDA GPU" and rec["gpu"] is False
    oom = {"n17": "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB"}
    rec = record_from_result("44_MiniGPTBlock.py", SimpleNamespace(
        gpu=True, outcomes=[], program=None, writer=None,
        profile={"library_precision_errors": oom, "end_to_end": {"correct": True, "ms": 20.6, "cuda_graph": True}}), 60.0)
    assert rec["library_precision_errors"] == oom
    assert crowded_out(rec) == oom["n17"]
