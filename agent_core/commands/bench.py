"""`stitchcuda bench FILE... --json OUT.jsonl`: optimize each problem and time it against torch.

Per problem (one JSON line each, appended as soon as it is measured): correct, eager_ms, compile_ms
per mode and the better of them, ours_ms, speedups, kernels, floor_ms, achieved GB/s. Each problem is
guarded: a failure (or a timeout) is recorded and the run goes on. A table with geometric means ends
the run.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HELP = "benchmark programs against torch eager and torch.compile"


def add_arguments(parser) -> None:
    parser.add_argument("files", nargs="+", help="program files (.json) or KernelBench .py files")
    parser.add_argument("--json", dest="json_out", help="append one JSON line per problem here")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one problem may take before it is abandoned (default 300)")
    parser.add_argument("--time-cap", type=float, default=0.0,
                        help="stop starting problems after this many seconds (0: no cap); the rest are "
                             "recorded as skipped")
    parser.add_argument("--compile-cap", type=float, default=0.0,
                        help="total seconds of torch.compile for the run (0: no cap); once spent, later "
                             "problems skip the torch.compile baselines (recorded)")
    parser.add_argument("--isolate", action="store_true",
                        help="run each problem in its own process (a faulting kernel or a hang cannot take "
                             "the others down; costs a few seconds of start-up per problem)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="problems run at once, each in its own process (implies --isolate); a "
                             "measurement holds the GPU alone through a file lock that verification and "
                             "reference runs share, but torch.compile's first calls and the CPU load still "
                             "overlap: check against --jobs 1 before quoting timings")
    from .optimize import add_common
    add_common(parser)
    parser.set_defaults(tune_trials=3)


class ProblemTimeout(BaseException):
    """A BaseException so the loop's per-region guards (except Exception) do not swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise ProblemTimeout in this (main) thread after `seconds` (Python-level hangs only)."""
    if not seconds or seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum, frame):
        raise ProblemTimeout(f"timed out after {seconds:.0f} s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def problem_name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def record_from_result(path: str, result, seconds: float) -> dict:
    """The bench line of one optimized problem."""
    prof = result.profile or {}
    e2e = prof.get("end_to_end") or {}
    base = prof.get("baselines") or {}
    counts: dict[str, int] = {}
    for o in result.outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    rec = {"problem": problem_name(path), "file": path, "ok": True, "gpu": result.gpu,
           "correct": e2e.get("correct") if result.gpu else None,
           "ours_ms": e2e.get("ms"), "floor_ms": e2e.get("floor_ms"), "achieved_gbs": e2e.get("achieved_gbs"),
           "pct_of_floor": e2e.get("pct_of_floor"),
           "kernels": sum(1 for o in result.outcomes if o.status == "fused"),
           "launches": e2e.get("launches"), "cuda_graph": e2e.get("cuda_graph"), "regions": counts,
           "split_tf32_nodes": len(prof.get("library_precision") or {}),
           "library_calls": dict(prof.get("library_precision") or {}),   # node -> form, fp32 ones left out
           "compiled": sum(1 for o in result.outcomes if o.status in ("fused", "compiled") or
                           (o.status == "fallback" and o.source_path)),
           "seconds": round(seconds, 2)}
    falls = {o.region: o.reason[:300] for o in result.outcomes if o.status == "fallback"}
    if falls:
        rec["fallbacks"] = falls          # why each region runs unfused (diagnosis without the event log)
    if result.gpu and not e2e.get("correct"):
        rec["verify_reason"] = (e2e.get("verify") or {}).get("reason")
    if prof.get("library_precision_fallback"):
        rec["library_precision_fallback"] = prof["library_precision_fallback"]
    if "error" in base:
        rec["baseline_error"] = base["error"]
    eager = base.get("eager") or {}
    rec["eager_ms"] = eager.get("ms") if eager.get("ok") else None
    if eager and not eager.get("ok"):
        rec["eager_error"] = eager.get("error")
    modes = {}
    for key, e in base.items():
        if not key.startswith("compile_"):
            continue
        mode = key[len("compile_"):]
        modes[mode] = e.get("ms") if e.get("ok") else None
        if not e.get("ok"):
            rec.setdefault("compile_errors", {})[mode] = e.get("error") or e.get("skipped")
    rec["compile_ms"] = modes
    rec["compile_seconds"] = round(sum(float(e.get("compile_s") or 0.0) for k, e in base.items()
                                       if k.startswith("compile_") and isinstance(e, dict)), 2)
    ok_modes = [v for v in modes.values() if v]
    rec["compile_best_ms"] = min(ok_modes) if ok_modes else None
    ours = rec["ours_ms"]
    rec["speedup_eager"] = rec["eager_ms"] / ours if ours and rec["eager_ms"] else None
    rec["speedup_compile"] = rec["compile_best_ms"] / ours if ours and rec["compile_best_ms"] else None
    return rec


def geomean(xs) -> float | None:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _f(x, fmt="{:.4f}") -> str:
    return "-" if x is None else fmt.format(x)


def table(records: list[dict]) -> list[str]:
    """The printed table: one row per problem, then the geometric means over correct problems."""
    head = f"{'problem':<34} {'correct':>7} {'eager ms':>9} {'compile ms':>10} {'ours ms':>9} " \
           f"{'x eager':>7} {'x compile':>9} {'kernels':>7} {'floor ms':>9} {'GB/s':>7}"
    lines = [head, "-" * len(head)]
    for r in records:
        if not r.get("ok"):
            lines.append(f"{r['problem'][:34]:<34} {'FAILED':>7}  {r.get('error', '')[:90]}")
            continue
        corr = "-" if r.get("correct") is None else ("yes" if r["correct"] else "NO")
        lines.append(f"{r['problem'][:34]:<34} {corr:>7} {_f(r.get('eager_ms')):>9} {_f(r.get('compile_best_ms')):>10} "
                     f"{_f(r.get('ours_ms')):>9} {_f(r.get('speedup_eager'), '{:.2f}'):>7} "
                     f"{_f(r.get('speedup_compile'), '{:.2f}'):>9} {r.get('kernels', 0):>7} "
                     f"{_f(r.get('floor_ms')):>9} {_f(r.get('achieved_gbs'), '{:.0f}'):>7}")
    g = summary(records)
    lines.append("-" * len(head))
    lines.append(f"geometric mean over {g['timed']} correct timed problems: {_f(g['geomean_speedup_eager'], '{:.2f}')}x "
                 f"vs eager, {_f(g['geomean_speedup_compile'], '{:.2f}')}x vs the better torch.compile mode "
                 f"({g['compile_timed']} problems); {g['correct']}/{g['problems']} correct, {g['failed']} failed")
    return lines


def summary(records: list[dict]) -> dict:
    ok = [r for r in records if r.get("ok")]
    good = [r for r in ok if r.get("correct")]
    return {"problems": len(records), "failed": len(records) - len(ok), "correct": len(good),
            "timed": sum(1 for r in good if r.get("speedup_eager")),
            "compile_timed": sum(1 for r in good if r.get("speedup_compile")),
            "geomean_speedup_eager": geomean(r.get("speedup_eager") for r in good),
            "geomean_speedup_compile": geomean(r.get("speedup_compile") for r in good)}


def _forward_flags(args) -> list[str]:
    out = ["--timeout", str(args.timeout), "--tune-trials", str(args.tune_trials), "--draws", str(args.draws),
           "--trials", str(args.trials), "--compile-budget", str(args.compile_budget)]
    for flag in ("no_tune", "no_rewrite", "cpu", "no_compile_baselines"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    return out


def run_isolated(path: str, args, no_compile: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "one.jsonl")
        cmd = [sys.executable, "-m", "agent_core.cli", "bench", path, "--json", out] + _forward_flags(args)
        if no_compile and "--no-compile-baselines" not in cmd:
            cmd.append("--no-compile-baselines")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 60)
        except subprocess.TimeoutExpired:
            return {"problem": problem_name(path), "file": path, "ok": False,
                    "error": f"timed out after {args.timeout + 60:.0f} s (process killed)",
                    "seconds": round(time.perf_counter() - t0, 2)}
        try:
            with open(out) as f:
                return json.loads(f.readline())
        except (OSError, ValueError):
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or [""]
            return {"problem": problem_name(path), "file": path, "ok": False,
                    "error": f"the problem's process exited with {proc.returncode}: {tail[0][:300]}",
                    "seconds": round(time.perf_counter() - t0, 2)}


def run_one(path: str, args, no_compile: bool) -> dict:
    from ..agent import EventEmitter
    from .optimize import optimize_spec
    t0 = time.perf_counter()
    emit = EventEmitter()
    saved = args.no_compile_baselines
    args.no_compile_baselines = saved or no_compile
    try:
        with time_limit(args.timeout):
            result = optimize_spec(path, None, emit, args, baselines=True)
        return record_from_result(path, result, time.perf_counter() - t0)
    except (Exception, ProblemTimeout) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        return {"problem": problem_name(path), "file": path, "ok": False,
                "error": f"{type(exc).__name__}: {first[:300]}", "seconds": round(time.perf_counter() - t0, 2)}
    finally:
        args.no_compile_baselines = saved
        _release_gpu_memory()


def _release_gpu_memory() -> None:
    try:
        import gc

        import torch
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass


class _Run:
    """The shared state of one bench run: the caps, the records so far, the JSON-lines file."""

    def __init__(self, args):
        self.args = args
        self.t_start = time.perf_counter()
        self.compile_spent = 0.0
        self.records: dict[int, dict] = {}
        self.out = open(args.json_out, "a") if args.json_out else None
        self.lock = threading.Lock()

    def one(self, i: int, path: str) -> None:
        args = self.args
        if args.time_cap and time.perf_counter() - self.t_start > args.time_cap:
            rec = {"problem": problem_name(path), "file": path, "ok": False,
                   "error": f"skipped: the run's time cap of {args.time_cap:.0f} s was reached", "skipped": True}
        else:
            no_compile = bool(args.compile_cap) and self.compile_spent > args.compile_cap
            isolate = args.isolate or args.jobs > 1
            rec = run_isolated(path, args, no_compile) if isolate else run_one(path, args, no_compile)
            if no_compile and rec.get("ok"):
                rec["compile_skipped"] = f"the run's torch.compile budget of {args.compile_cap:.0f} s was spent"
        rec["jobs"] = args.jobs          # > 1: timed while other problems used the GPU
        with self.lock:
            self.compile_spent += rec.get("compile_seconds") or 0.0
            self.records[i] = rec
            if self.out is not None:
                self.out.write(json.dumps(rec) + "\n")
                self.out.flush()
            status = ("FAILED: " + rec.get("error", "")) if not rec.get("ok") else (
                f"correct={rec.get('correct')} ours {_f(rec.get('ours_ms'))} ms, eager {_f(rec.get('eager_ms'))} ms, "
                f"compile {_f(rec.get('compile_best_ms'))} ms")
            print(f"[{len(self.records)}/{len(args.files)}] {rec['problem']}: {status} ({rec.get('seconds', 0)} s)",
                  flush=True)


def _run_parallel(state: _Run, files: list[str], jobs: int) -> None:
    """Each problem in its own process, `jobs` at a time; timed sections serialized by a file lock."""
    from concurrent.futures import ThreadPoolExecutor

    from ..profile.timing import TIMING_LOCK_ENV
    with tempfile.NamedTemporaryFile(prefix="stitchcuda-timing-", suffix=".lock") as lock:
        saved = os.environ.get(TIMING_LOCK_ENV)
        os.environ[TIMING_LOCK_ENV] = lock.name        # inherited by the problems' processes
        try:
            pool = ThreadPoolExecutor(max_workers=jobs)
            try:
                for f in [pool.submit(state.one, i, p) for i, p in enumerate(files)]:
                    f.result()
            finally:   # on an interrupt, start nothing more; the running problems were interrupted too
                pool.shutdown(wait=True, cancel_futures=True)
        finally:
            if saved is None:
                os.environ.pop(TIMING_LOCK_ENV, None)
            else:
                os.environ[TIMING_LOCK_ENV] = saved


def run(args) -> int:
    state = _Run(args)
    interrupted = False
    try:
        if args.jobs > 1:
            _run_parallel(state, args.files, args.jobs)
        else:
            for i, path in enumerate(args.files):
                state.one(i, path)
    except KeyboardInterrupt:   # a wall-clock cap (timeout -s INT) still gets the table of what ran
        interrupted = True
    finally:
        if state.out is not None:
            state.out.close()
    records = [state.records[i] for i in sorted(state.records)]   # the files' order, whatever finished first
    if interrupted:
        print(f"interrupted after {len(records)} of {len(args.files)} problems")
    for line in table(records):
        print(line)
    if records and not any(r.get("gpu") for r in records):
        from ..agent import NO_GPU_LINE
        print(NO_GPU_LINE.format(arch="sm_90"))
    return 0
