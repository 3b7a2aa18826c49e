"""CPU checks for the pieces the GPU benchmarks lean on: the chunked comparison, the reference cache
(bounded, and holding a rewritten program to the original's outputs), the cross-process timing lock
and `bench --jobs`."""
import fcntl
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import agent_core.verify as verify
from agent_core.agent.phases import PhaseClock, phase
from agent_core.agent.refcache import ReferenceCache
from agent_core.commands import bench
from agent_core.commands.bench_costs import agent_fields
from agent_core.importers import import_file
from agent_core.profile import timing

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "resources", "examples")


class _Prog:
    values = {"v": type("V", (), {"name": "out"})()}
    metadata: dict = {}       # the default tolerance


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(verify, "COMPARE_CHUNK", 7)   # many chunks over 100 elements


def test_chunked_compare_finds_the_worst_element_in_any_chunk(small_chunks):
    want = torch.randn(100)
    assert verify.compare(_Prog, "v", want.clone(), want)[0]
    got = want.clone()
    got[57] += 1.0
    got[3] += 1e-3
    ok, max_abs, excess, why = verify.compare(_Prog, "v", got, want)
    assert not ok and max_abs == pytest.approx(1.0) and "element 57" in why


def test_chunked_compare_nan_and_inf(small_chunks):
    want = torch.randn(50)
    got = want.clone()
    got[40] = float("nan")
    ok, _, _, why = verify.compare(_Prog, "v", got, want)
    assert not ok and "NaN" in why
    want[5] = float("inf")
    assert verify.compare(_Prog, "v", want.clone(), want)[0]
    got = want.clone()
    got[5] = 0.0
    assert not verify.compare(_Prog, "v", got, want)[0]


def test_integer_outputs_compare_exactly():
    want = torch.arange(20000, 20010, dtype=torch.int64)   # indices large enough for rtol to hide 1
    assert verify.compare(_Prog, "v", want.clone(), want)[0]
    got = want.clone()
    got[4] += 1
    ok, _, _, why = verify.compare(_Prog, "v", got, want)
    assert not ok and "1 integer element(s) differ" in why


def test_a_reference_that_fails_on_a_draw_is_a_failed_check_not_a_crash():
    def sample(d):
        raise IndexError("Target 7 is out of bounds.")
    res = verify.check_draws(_Prog, ["v"], sample, lambda ins: ins, draws=3, device="cpu")
    assert not res.ok and "the reference cannot run" in res.reason and "IndexError" in res.reason


def test_a_draw_that_ran_out_of_memory_runs_once_more_and_then_says_so():
    """Under bench --jobs the other problems' GPU memory comes and goes: a reference or a candidate that
    ran out of it runs once more (after the allocator's cache is given back) instead of failing the
    region's check; twice out of memory is said as such, without the init-hint advice."""
    calls = {"sample": 0, "run": 0}
    x = torch.ones(3)

    def sample(d):
        calls["sample"] += 1
        if calls["sample"] == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 MiB.")
        return [x], [x * 2]

    def run(ins):
        calls["run"] += 1
        if calls["run"] == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB.")
        return [ins[0] * 2]
    res = verify.check_draws(_Prog, ["v"], sample, run, draws=3, device="cpu")
    assert res.ok, res.reason
    assert calls == {"sample": 4, "run": 4}          # one more of each, for the draws that ran out

    def starved(d):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 MiB.")
    res = verify.check_draws(_Prog, ["v"], starved, run, draws=3, device="cpu")
    assert not res.ok and "the reference ran out of memory twice" in res.reason
    assert "init hint" not in res.reason
    assert bench.crowded_out({"ok": True, "fallbacks": {"r1": f"verification failed: {res.reason}"}})

    def broken(ins):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    res = verify.check_draws(_Prog, ["v"], lambda d: ([x], [x * 2]), broken, draws=3, device="cpu")
    assert not res.ok and "illegal memory access" in res.reason     # any other failure: once, as before


def test_reference_cache_outputs_follow_the_original_program():
    from agent_core.importers import import_nn_module
    x = torch.randn(8, 32)
    prog = import_nn_module(torch.nn.Softmax(dim=1), [x])
    original = import_nn_module(torch.nn.Tanh(), [x])       # the same input, other outputs
    ref = ReferenceCache(prog, set(), device="cpu", original=original)
    inputs = ref.inputs(0)
    assert torch.equal(ref.outputs(0)[0], torch.tanh(inputs[0]))
    assert torch.allclose(ref.draw(0)[prog.outputs[0]], torch.softmax(inputs[0], 1))


def test_reference_cache_drops_old_draws_beyond_its_budget(monkeypatch):
    prog = import_file(os.path.join(EXAMPLES, "softmax_rows.py"))
    monkeypatch.setattr(ReferenceCache, "MAX_CACHED_BYTES", 1)
    ref = ReferenceCache(prog, set(), device="cpu")
    assert ref.max_draws == 1
    first = ref.outputs(0)[0]
    ref.outputs(1)
    assert list(ref._draws) == [1]
    assert torch.equal(ref.outputs(0)[0], first)      # recomputed, the same values


def test_exclusive_timing_holds_the_lock(tmp_path, monkeypatch):
    lock = tmp_path / "t.lock"
    monkeypatch.setenv(timing.TIMING_LOCK_ENV, str(lock))
    with timing.exclusive_timing():
        with open(lock, "a") as f, pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)     # released afterwards


def _another_process_could(lock, mode) -> bool:
    """Whether another process could take the lock in `mode` now (another open file description acts
    as another process would)."""
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False


def test_gpu_work_is_shared_and_a_measurement_inside_it_takes_the_lock_alone(tmp_path, monkeypatch):
    lock = tmp_path / "t.lock"
    monkeypatch.setenv(timing.TIMING_LOCK_ENV, str(lock))

    def other(mode):
        return _another_process_could(lock, mode)
    with timing.gpu_work():
        assert other(fcntl.LOCK_SH) and not other(fcntl.LOCK_EX)
        with timing.exclusive_timing():          # nested: converts this process's lock, no deadlock
            assert not other(fcntl.LOCK_SH)
        assert other(fcntl.LOCK_SH) and not other(fcntl.LOCK_EX)
    assert other(fcntl.LOCK_EX)


@pytest.mark.parametrize("hook", [True, False], ids=["torch's lock hook", "without it (torch 2.11)"])
def test_inductors_autotuning_benchmarks_are_gpu_work_while_torch_compile_builds(tmp_path, monkeypatch, hook):
    from torch._inductor.runtime import benchmarking
    lock = tmp_path / "t.lock"
    monkeypatch.setenv(timing.TIMING_LOCK_ENV, str(lock))
    if not hook:              # the GPU machine's torch has no set_gpu_benchmark_lock_context
        monkeypatch.delattr(benchmarking, "set_gpu_benchmark_lock_context", raising=False)

    def another_problem_could(mode):
        return _another_process_could(lock, mode)
    seen = []

    def do_bench(fn, **kwargs):      # stands in for Triton's, which times fn on the GPU
        fn()
        return 1.0
    monkeypatch.setattr(benchmarking.TritonBenchmarker, "triton_do_bench", property(lambda self: do_bench))
    candidate = lambda: seen.append((another_problem_could(fcntl.LOCK_SH), another_problem_could(fcntl.LOCK_EX)))
    with timing.inductor_benchmarks_as_gpu_work():
        benchmarking.TritonBenchmarker().benchmark_gpu(candidate, is_vetted_benchmarking=True)
    benchmarking.TritonBenchmarker().benchmark_gpu(candidate, is_vetted_benchmarking=True)
    # inside: shared with other untimed work, never with a measurement; outside the span: no lock
    assert seen == [(True, False), (True, True)]


def test_waiting_for_another_problems_measurement_is_not_the_agents_time(tmp_path, monkeypatch):
    lock = tmp_path / "t.lock"
    monkeypatch.setenv(timing.TIMING_LOCK_ENV, str(lock))
    # another bench problem, in its own process, measures for 0.5 s
    other = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time\n"
        f"f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True); time.sleep(0.5)")], stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline().strip() == "held"
    clock = PhaseClock()
    with clock.running(), phase("verify"), timing.gpu_work():
        time.sleep(0.1)                               # the verification itself, once the GPU is free
    other.wait()
    fields = agent_fields(clock)
    assert fields["gpu_wait_seconds"] >= 0.3
    assert 0.1 <= fields["agent_seconds"] < 0.3
    assert fields["agent_phases"]["verify"] >= 0.1 and "gpu_wait" not in fields["agent_phases"]


def test_an_uncontended_lock_records_no_wait(tmp_path, monkeypatch):
    monkeypatch.setenv(timing.TIMING_LOCK_ENV, str(tmp_path / "t.lock"))
    clock = PhaseClock()
    with clock.running(), timing.exclusive_timing():
        pass
    assert agent_fields(clock)["gpu_wait_seconds"] == 0.0


def test_bench_jobs_runs_problems_in_parallel_and_keeps_file_order(tmp_path, capsys):
    files = [os.path.join(EXAMPLES, n) for n in ("softmax_rows.py", "layer_norm.py", "relu_missing.py")]
    out = tmp_path / "b.jsonl"
    parser = __import__("argparse").ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(files + ["--json", str(out), "--jobs", "2", "--cpu", "--no-tune"])
    assert bench.run(args) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["problem"] for r in recs) == ["layer_norm", "relu_missing", "softmax_rows"]
    by = {r["problem"]: r for r in recs}
    assert by["softmax_rows"]["ok"] and by["layer_norm"]["ok"] and not by["relu_missing"]["ok"]
    where = by["relu_missing"]["where"]      # the failure says where in the tool it was raised
    assert where and all(w.startswith("agent_core/") and " in " in w for w in where), where
    printed = capsys.readouterr().out
    assert f"(at {where[-1]})" in printed
    table = printed.split("problem ")[-1].splitlines()
    rows = [line.split()[0] for line in table[2:5]]
    assert rows == ["softmax_rows", "layer_norm", "relu_missing"]
    assert timing.TIMING_LOCK_ENV not in os.environ


def test_sanitize_command_and_cpu_skip(tmp_path, capsys):
    from agent_core.commands import optimize as opt
    parser = __import__("argparse").ArgumentParser()
    opt.add_arguments(parser)
    args = parser.parse_args([os.path.join(EXAMPLES, "softmax_rows.py"), "-o", str(tmp_path), "--sanitize",
                              "--cpu", "--no-tune", "-q"])
    cmd = opt.sanitize_command(args)
    assert cmd[:3] == ["compute-sanitizer", "--tool", "memcheck"]
    assert "--error-exitcode" in cmd and "--no-baselines" in cmd and cmd[cmd.index("-o") + 1].endswith("sanitize")
    assert opt.run(args) == 0
    assert "compute-sanitizer needs a CUDA GPU" in capsys.readouterr().err


def test_a_hold_waits_for_the_gpu_work_it_queued_before_letting_a_measurement_in(tmp_path, monkeypatch):
    """Kernel launches return before the kernels run: a hold that ended with work still queued let
    another problem's measurement run beside it. Leaving a hold synchronizes first, lock still held."""
    lock = tmp_path / "t.lock"
    monkeypatch.setenv(timing.TIMING_LOCK_ENV, str(lock))
    synced = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda *a: synced.append(_another_process_could(lock, fcntl.LOCK_EX)))
    with timing.gpu_work():
        pass
    assert synced == [False]                       # drained while no measurement could start
    assert _another_process_could(lock, fcntl.LOCK_EX)


def test_a_disturbed_set_of_trials_runs_again_and_the_lower_median_counts(monkeypatch):
    """Most trials far above the fastest (work outside the measurement shared the GPU: a 32 us layer
    norm read 79.5 us under bench --jobs 8) run once more, still under the lock; clean ones do not."""
    sets = [[80.0, 79.0, 32.0, 81.0, 78.0], [32.5, 32.0, 33.0, 32.2, 32.1]]
    calls = []

    def fake_trials(fn, trials, warmup, flush):
        calls.append(warmup)
        return timing.summarize(sets[len(calls) - 1])
    monkeypatch.setattr(timing, "_trials", fake_trials)
    t = timing.time_gpu(lambda: None, trials=5)
    assert calls == [timing.DEFAULT_WARMUP, 0] and t.median_ms == 32.2 and t.remeasured
    calls.clear()
    sets.reverse()
    t = timing.time_gpu(lambda: None, trials=5)
    assert calls == [timing.DEFAULT_WARMUP] and t.median_ms == 32.2 and not t.remeasured
    assert not timing.disturbed(timing.summarize([10.0, 11.0, 12.0])) and timing.disturbed(timing.summarize([5.0, 9.0, 9.5]))


def test_a_faulted_gpu_still_lets_the_lock_go(tmp_path, monkeypatch):
    """After a kernel fault the drain's synchronize raises too: the hold is let go all the same, or
    every other problem of the run would wait for this process forever."""
    lock = tmp_path / "t.lock"
    monkeypatch.setenv(timing.TIMING_LOCK_ENV, str(lock))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def fault(*a):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(torch.cuda, "synchronize", fault)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        with timing.exclusive_timing():
            pass
    assert _another_process_could(lock, fcntl.LOCK_EX)


CROWDED = '''
import os
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    if os.environ.get("STITCHCUDA_TIMING_LOCK"):     # set while other problems run (bench --jobs)
        raise RuntimeError("CUDA out of memory. Tried to allocate 32.00 MiB (GPU 0 has 7.12 MiB free)")
    return [torch.randn(4, 16)]


def get_init_inputs():
    return []
'''


def test_bench_jobs_runs_a_problem_that_ran_out_of_memory_beside_others_again_alone(tmp_path):
    """Under --jobs, a problem that failed for GPU memory (the other problems' share of it) runs again
    alone after the others, and its row says what the first try met; a problem that failed for its
    own reasons does not run again."""
    assert timing.TIMING_LOCK_ENV in CROWDED          # the fixture's crowd: the variable --jobs sets
    crowded = tmp_path / "crowded.py"
    crowded.write_text(CROWDED)
    files = [str(crowded), os.path.join(EXAMPLES, "softmax_rows.py"), os.path.join(EXAMPLES, "relu_missing.py")]
    out = tmp_path / "b.jsonl"
    proc = subprocess.run([sys.executable, "-m", "agent_core.cli", "bench", *files, "--json", str(out),
                           "--jobs", "2", "--cpu", "--no-tune"], cwd=os.path.join(os.path.dirname(__file__), ".."),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    tries = [r for r in rows if r["problem"] == "crowded"]
    assert len(tries) == 2 and not tries[0]["ok"] and "out of memory" in tries[0]["error"]
    again = tries[1]
    assert again["ok"] and again["jobs"] == 1 and again["first_try"].startswith("with --jobs 2: ")
    assert "out of memory" in again["first_try"]
    assert [r["problem"] for r in rows].count("relu_missing") == 1          # its own failure: once
    assert "crowded: crowded out beside other problems (ImportFailure: get_inputs() raised RuntimeError: CUDA out of memory." in proc.stdout
    assert "; running it again alone" in proc.stdout
    table = proc.stdout.split("problem ")[-1]
    assert "crowded" in table and "FAILED" not in table.split("crowded")[1].splitlines()[0]


def test_what_counts_as_crowded_out():
    assert bench.crowded_out({"ok": False, "error": "OutOfMemoryError: CUDA out of memory. Tried"})
    assert bench.crowded_out({"ok": False, "error": "DoesNotFit: program 'x' needs 4.5 GiB, 3.8 GiB free"})
    assert bench.crowded_out({"ok": True, "graph_error": "CUDA graph capture failed (OutOfMemoryError: "
                                                         "CUDA out of memory.); steps run one by one"})
    assert not bench.crowded_out({"ok": True, "graph_error": "CUDA graph capture failed (RuntimeError: "
                                                             "operation not permitted when stream is capturing)"})
    assert bench.crowded_out({"ok": True, "rewrites_skipped": "DoesNotFit: program 'v': the program needs 33.3 GiB "
                                                              "for its tensors, the GPU has 20.8 GiB free"})
    assert not bench.crowded_out({"ok": True, "rewrites_skipped": "RewriteError: a rule failed its check"})
    assert bench.crowded_out({"ok": True, "fallbacks": {
        "r1": "correct but not faster than its unfused ops",
        "r2": "verification failed: draw 3: the reference cannot run on this random draw (OutOfMemoryError: "
              "CUDA out of memory. Tried to allocate 12.00 MiB."}})
    assert not bench.crowded_out({"ok": True, "fallbacks": {"r1": "correct but not faster than its unfused ops"}})
    assert not bench.crowded_out({"ok": False, "error": "ProgramError: shape mismatch"})
    # any capture failure beside other problems (cuDNN's out-of-memory fallback synchronises inside
    # the capture, and the error says only that the capture was spoilt); alone, it is the program's own
    spoilt = "CUDA graph capture failed in its capture run (AcceleratorError: operation failed due to a previous error)"
    assert bench.crowded_out({"ok": True, "jobs": 8, "graph_error": spoilt})
    assert not bench.crowded_out({"ok": True, "jobs": 1, "graph_error": spoilt})
    assert not bench.crowded_out({"ok": True, "jobs": 8, "graph_error": spoilt, "first_try": "with --jobs 8: .."})
    # a library call whose split forms could not be timed for memory ran in fp32
    assert bench.crowded_out({"ok": True, "library_precision_errors": {"n17": "OutOfMemoryError: CUDA out of memory."}})
    assert not bench.crowded_out({"ok": True, "library_precision_errors": {"n17": "RuntimeError: bad shape"}})
    # no GPU in its process, where the run's other problems had one; on a machine without one, no rerun
    lost = {"ok": True, "gpu": False, "no_gpu": "torch sees no CUDA GPU", "jobs": 8}
    assert "torch sees no CUDA GPU" in bench.crowded_out(lost, gpu_seen=True)
    assert not bench.crowded_out(lost, gpu_seen=False)
    assert not bench.crowded_out({"ok": False, "error": "skipped: out of memory", "skipped": True})
    assert not bench.crowded_out({"ok": True})


def test_bench_resume_runs_the_files_crowded_rows_again_alone(tmp_path):
    """A resumable level-3 call can reach its time cap before the crowded problems run again alone:
    the next call (--resume) runs them alone, and the rows finished cleanly stay as they were."""
    files = [os.path.join(EXAMPLES, "softmax_rows.py"), os.path.join(EXAMPLES, "relu_missing.py")]
    out = tmp_path / "b.jsonl"
    spoilt = {"problem": "softmax_rows", "file": files[0], "ok": True, "gpu": True, "correct": True,
              "ours_ms": 3.0, "jobs": 8, "graph_error": "CUDA graph capture failed in its capture run "
              "(AcceleratorError: operation failed due to a previous error during capture); steps run one by one"}
    kept = {"problem": "relu_missing", "file": files[1], "ok": False, "error": "ProgramError: its own", "jobs": 8}
    out.write_text(json.dumps(spoilt) + "\n" + json.dumps(kept) + "\n")
    proc = subprocess.run([sys.executable, "-m", "agent_core.cli", "bench", *files, "--json", str(out), "--resume",
                           "--jobs", "2", "--cpu", "--no-tune"], cwd=os.path.join(os.path.dirname(__file__), ".."),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["problem"] for r in rows] == ["softmax_rows", "relu_missing", "softmax_rows"]
    again = rows[-1]
    assert again["jobs"] == 1 and again["first_try"].startswith("with --jobs 8: CUDA graph capture failed")
    assert "softmax_rows: crowded out beside other problems (CUDA graph capture failed" in proc.stdout
