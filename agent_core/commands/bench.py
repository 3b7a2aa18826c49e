"""`stitchcuda bench FILE... --json OUT.jsonl`: optimize each problem and time it against torch.

Per problem (one JSON line each, appended as soon as it is measured): correct, eager_ms, compile_ms
per mode (--compile-modes; a mode not timed has its reason in compile_errors) and the best of them,
the best baseline of all, ours_ms, speedups, our kernels and launches next to the kernels Inductor
generated per mode (inductor_kernels), floor_ms, achieved GB/s, the agent's own time per phase and
our peak GPU memory against eager's (bench_costs). Each problem is guarded: a failure
(or a timeout) is recorded and the run goes on. A table with geometric means ends the run.
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

from ..profile.baselines import KNOWN_MODES, MODES, parse_modes
from ..text import says_out_of_memory

HELP = "benchmark programs against torch eager and torch.compile"


def _compile_modes(text: str) -> tuple[str, ...]:
    import argparse
    try:
        return parse_modes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser) -> None:
    parser.add_argument("files", nargs="+", help="program files (.json) or KernelBench .py files")
    parser.add_argument("--json", dest="json_out", help="append one JSON line per problem here")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one problem may take before it is abandoned, its waits for other "
                             "problems' GPU work (--jobs) not counted (default 300)")
    parser.add_argument("--time-cap", type=float, default=0.0,
                        help="stop starting problems after this many seconds (0: no cap); the rest are "
                             "recorded as skipped")
    parser.add_argument("--compile-cap", type=float, default=0.0,
                        help="total seconds of torch.compile for the run (0: no cap); once spent, later "
                             "problems skip the torch.compile baselines (recorded)")
    parser.add_argument("--isolate", action="store_true",
                        help="run each problem in its own process (a faulting kernel or a hang cannot take "
                             "the others down; costs a few seconds of start-up per problem)")
    parser.add_argument("--compile-modes", type=_compile_modes, default=None, metavar="MODE,MODE",
                        help="torch.compile modes to time, comma-separated: "
                             f"{', '.join(KNOWN_MODES)} (default {','.join(MODES)}); each records "
                             "the kernels Inductor generated. Without a GPU (or with --cpu) torch is timed "
                             "only when this is given, then on the CPU (Inductor writes C++ there)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="problems run at once, each in its own process (implies --isolate); a "
                             "measurement holds the GPU alone through a file lock that verification and "
                             "reference runs share, but torch.compile's first calls and the CPU load still "
                             "overlap: check against --jobs 1 before quoting timings")
    parser.add_argument("--resume", action="store_true",
                        help="skip the problems the --json file already has a row for (a stopped run goes on)")
    g = parser.add_argument_group("Ray cluster (docs/CLUSTER.md; pip install '.[cluster]')")
    g.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS|auto|local",
                   help="run each problem as a Ray task, one GPU each: local (the default) starts a cluster on "
                        "this machine for the run, auto joins the one `ray start` runs here, else host:port or "
                        "ray://host:10001")
    g.add_argument("--kernel-cache", metavar="DIR",
                   help="with --ray: the compiled-kernel cache every worker uses (default: this machine's for "
                        "local; a multi-host cluster needs a path all nodes share)")
    g.add_argument("--events", metavar="PATH",
                   help="with --ray: append bench-progress events (docs/EVENTS.md) here as JSON lines")
    from .optimize import add_common
    add_common(parser)
    parser.set_defaults(tune_trials=3)


class ProblemTimeout(BaseException):
    """A BaseException so the loop's per-region guards (except Exception) do not swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float, not_counted=None):
    """Raise ProblemTimeout in this (main) thread after `seconds` (Python-level hangs only), not
    counting the seconds not_counted() reports (the waits for other problems' GPU work, bench --jobs):
    when the timer fires, those seconds are granted once more."""
    if not seconds or seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return
    granted = 0.0

    def fire(signum, frame):
        nonlocal granted
        extra = (not_counted() if not_counted else 0.0) - granted
        if extra > 0.01:
            granted += extra
            signal.setitimer(signal.ITIMER_REAL, extra)
            return
        waits = f" of its own ({granted:.0f} s more waiting for the GPU)" if granted else ""
        raise ProblemTimeout(f"timed out after {seconds:.0f} s{waits}")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def problem_name(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _library_forms(program) -> dict:
    from ..agent.precision import library_forms
    return library_forms(program) if program is not None else {}


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
           # the spread of the end-to-end trials and each fused region's own time: a run whose end-to-end
           # time is far above its regions' sum was disturbed (layernorm_residual_bert_base read 79.5 us
           # under --jobs 8 on the H100 and 31.8 us alone)
           "ours_spread_ms": [(e2e.get("timing") or {}).get(k) for k in ("min_ms", "max_ms")],
           "ours_timed_on": e2e.get("timed_on"),
           "region_ms": {o.region: o.fused_ms for o in result.outcomes if o.status == "fused" and o.fused_ms},
           "pct_of_floor": e2e.get("pct_of_floor"),
           "kernels": sum(1 for o in result.outcomes if o.status == "fused"),
           "launches": e2e.get("launches"), "cuda_graph": e2e.get("cuda_graph"), "regions": counts,
           "split_tf32_nodes": len(prof.get("library_precision") or {}),
           "library_calls": dict(prof.get("library_precision") or {}),   # node -> form, fp32 ones left out
           "library_forms": _library_forms(getattr(result, "program", None)),   # every matmul / conv: its form, fp32 included
           "compiled": sum(1 for o in result.outcomes if o.status in ("fused", "compiled") or
                           (o.status == "fallback" and o.source_path)),
           "seconds": round(seconds, 2)}
    falls = {o.region: o.reason[:300] for o in result.outcomes if o.status == "fallback"}
    if falls:
        rec["fallbacks"] = falls          # why each region runs unfused (diagnosis without the event log)
    if result.gpu and not e2e.get("correct"):
        rec["verify_reason"] = (e2e.get("verify") or {}).get("reason")
    if e2e.get("graph_error"):       # the program ran kernel by kernel: far slower where launches dominate
        rec["graph_error"] = e2e["graph_error"]
    if prof.get("no_gpu"):           # why the problem ran without one (a crowded GPU's CUDA set-up can fail)
        rec["no_gpu"] = prof["no_gpu"]
    if prof.get("rewrites_skipped"):  # planned as written (attention not raised, ...): maybe far slower
        rec["rewrites_skipped"] = prof["rewrites_skipped"]
    if prof.get("set_aside"):       # the file's tolerance / allowed precisions: KernelBench's rules hold
        rec["set_aside"] = prof["set_aside"]
    if prof.get("library_precision_errors"):   # calls only run in fp32: a split form could not be timed
        rec["library_precision_errors"] = prof["library_precision_errors"]
    if prof.get("library_precision_fallback"):
        rec["library_precision_fallback"] = prof["library_precision_fallback"]
    memory = e2e.get("memory") or {}
    if memory:            # the memory plan: its prediction, and the split calls it changed to stay in budget
        splits = memory.get("split_tf32") or {}
        rec["memory_plan"] = {"predicted_peak_bytes": memory.get("predicted_peak_bytes"),
                              "budget_bytes": memory.get("budget_bytes"),
                              "run_as_fp32": sorted(n for n, d in splits.items() if d["runs_as"] == "fp32"),
                              "split_per_call": sorted(n for n, d in splits.items()
                                                       if d["runs_as"] != "fp32" and d["weights"] == "split per call"),
                              "weights_per_call": memory.get("weights_per_call") or []}
    if result.writer:      # which regions kept a model kernel, and what it cost
        w = result.writer
        rec["writer"] = {"model": w["model"], "regions_kept": w["regions_kept"], "rounds": w["rounds"],
                         "tokens": w["tokens"]}
    if "error" in base:
        rec["baseline_error"] = base["error"]
    eager = base.get("eager") or {}
    rec["eager_ms"] = eager.get("ms") if eager.get("ok") else None
    if eager and not eager.get("ok"):
        rec["eager_error"] = eager.get("error")
    modes, inductor = {}, {}
    for key, e in base.items():
        if not key.startswith("compile_"):
            continue
        mode = key[len("compile_"):]
        modes[mode] = e.get("ms") if e.get("ok") else None
        if not e.get("ok"):
            rec.setdefault("compile_errors", {})[mode] = e.get("error") or e.get("skipped")
        if e.get("inductor_kernels"):
            inductor[mode] = e["inductor_kernels"]
    rec["compile_ms"] = modes
    rec["compile_seconds"] = round(sum(float(e.get("compile_s") or 0.0) for k, e in base.items()
                                       if k.startswith("compile_") and isinstance(e, dict)), 2)
    ok_modes = [v for v in modes.values() if v]
    rec["compile_best_ms"] = min(ok_modes) if ok_modes else None
    timed = {k: e["ms"] for k, e in base.items() if isinstance(e, dict) and e.get("ok") and e.get("ms")}
    rec["best_baseline"] = min(timed, key=timed.get) if timed else None   # eager or compile_<mode>
    rec["best_baseline_ms"] = timed.get(rec["best_baseline"])
    if base and "error" not in base:
        rec["baseline_device"] = prof.get("baseline_device", "cuda")
    rec["inductor_kernels"] = inductor
    launched = {k[len("compile_"):] if k.startswith("compile_") else k: e["launched"]["kernels"]
                for k, e in base.items() if isinstance(e, dict) and "kernels" in (e.get("launched") or {})}
    if "kernels" in (e2e.get("launched") or {}):
        launched["ours"] = e2e["launched"]["kernels"]
    rec["launched_kernels"] = launched      # per call, counted by the profiler (profile/launched.py)
    rec.update(kernel_comparison(rec["launches"], inductor, launched))
    ours = rec["ours_ms"]
    rec["speedup_eager"] = rec["eager_ms"] / ours if ours and rec["eager_ms"] else None
    rec["speedup_compile"] = rec["compile_best_ms"] / ours if ours and rec["compile_best_ms"] else None
    rec["speedup_best"] = rec["best_baseline_ms"] / ours if ours and rec["best_baseline_ms"] else None
    return rec


def kernel_comparison(launches, inductor: dict, launched: dict | None = None) -> dict:
    """Our kernels per run against the fewest Inductor runs in any mode; more_kernels_than_inductor is
    None when either side is unknown. Where the profiler counted both sides' launched kernels
    (`launched`: "ours", "eager" and each mode), those; else our plan's launches against Inductor's
    code (generated + extern calls, each counted as one kernel: cuDNN's or a fused layer's several
    are not). kernels_counted says which."""
    modes = [n for k, n in (launched or {}).items() if k not in ("ours", "eager")]
    if (launched or {}).get("ours") is not None and modes:
        fewest, ours, how = min(modes), launched["ours"], "launched"
    else:
        totals = [c["generated"] + c["extern"] for c in inductor.values() if "generated" in c]
        fewest, ours, how = (min(totals) if totals else None), launches, "code"
    more = None if fewest is None or ours is None else ours > fewest
    return {"inductor_fewest_kernels": fewest, "more_kernels_than_inductor": more,
            "kernels_counted": how, "ours_kernels_counted": ours}


def geomean(xs) -> float | None:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _f(x, fmt="{:.4f}") -> str:
    return "-" if x is None else fmt.format(x)


MODE_LABELS = {"default": "default", "reduce-overhead": "r-o", "max-autotune": "m-a",
               "max-autotune-no-cudagraphs": "m-a-ncg"}


def modes_run(records: list[dict]) -> list[str]:
    """The torch.compile modes any record has, in the order they ran."""
    return list(dict.fromkeys(m for r in records for m in (r.get("compile_ms") or {})))


def kernels_cell(r: dict) -> str:
    """"ours/Inductor's fewest", with a ! when ours is more (issue #14: never more kernels); launched
    kernels where the profiler counted them (kernel_comparison)."""
    ours = r.get("ours_kernels_counted", r.get("launches"))
    ind = r.get("inductor_fewest_kernels")
    return f"{'-' if ours is None else ours}/{'-' if ind is None else ind}" + \
        ("!" if r.get("more_kernels_than_inductor") else "")


def table(records: list[dict]) -> list[str]:
    """The printed table: one row per problem, then the geometric means over correct problems and
    what the best baseline left out."""
    modes = modes_run(records)
    mode_head = "".join(f" {MODE_LABELS.get(m, m) + ' ms':>10}" for m in modes)
    head = f"{'problem':<34} {'correct':>7} {'eager ms':>9}{mode_head} {'ours ms':>9} " \
           f"{'x eager':>7} {'x compile':>9} {'x best':>6} {'kernels':>7} {'ours/ind':>8} {'floor ms':>9} {'GB/s':>7} " \
           f"{'agent s':>7} {'mem/eager':>9}"
    lines = [head, "-" * len(head)]
    for r in records:
        if not r.get("ok"):
            lines.append(f"{r['problem'][:34]:<34} {'FAILED':>7}  {r.get('error', '')[:90]}")
            continue
        corr = "-" if r.get("correct") is None else ("yes" if r["correct"] else "NO")
        per_mode = "".join(f" {_f((r.get('compile_ms') or {}).get(m)):>10}" for m in modes)
        lines.append(f"{r['problem'][:34]:<34} {corr:>7} {_f(r.get('eager_ms')):>9}{per_mode} "
                     f"{_f(r.get('ours_ms')):>9} {_f(r.get('speedup_eager'), '{:.2f}'):>7} "
                     f"{_f(r.get('speedup_compile'), '{:.2f}'):>9} {_f(r.get('speedup_best'), '{:.2f}'):>6} "
                     f"{r.get('kernels', 0):>7} {kernels_cell(r):>8} "
                     f"{_f(r.get('floor_ms')):>9} {_f(r.get('achieved_gbs'), '{:.0f}'):>7} "
                     f"{_f(r.get('agent_seconds'), '{:.1f}'):>7} {_f(r.get('peak_mem_ratio'), '{:.2f}'):>9}")
    g = summary(records)
    lines.append("-" * len(head))
    lines.append(f"geometric mean over {g['timed']} correct timed problems: {_f(g['geomean_speedup_eager'], '{:.2f}')}x "
                 f"vs eager, {_f(g['geomean_speedup_compile'], '{:.2f}')}x vs the better torch.compile mode "
                 f"({g['compile_timed']} problems), {_f(g['geomean_speedup_best'], '{:.2f}')}x vs the best of eager "
                 f"and every mode run ({g['best_timed']} problems); {g['correct']}/{g['problems']} correct, "
                 f"{g['failed']} failed")
    from .bench_costs import summary_lines
    lines += summary_lines(records)
    lines += notes(records)
    return lines


def notes(records: list[dict]) -> list[str]:
    """What a reader of the geometric means must know: modes the best baseline left out and why, rows
    with more kernels than Inductor, baselines timed on the CPU."""
    out = []
    for r in records:
        for mode, why in (r.get("compile_errors") or {}).items():
            out.append(f"{r['problem']}: torch.compile {mode} is not in the best baseline: {why}")
        for mode, c in (r.get("inductor_kernels") or {}).items():
            if "error" in c:
                out.append(f"{r['problem']}: Inductor's kernels for {mode} not counted: {c['error']}")
    more = [r["problem"] for r in records if r.get("more_kernels_than_inductor")]
    if more:
        out.append(f"more kernels per run than Inductor (ours/ind with !): {', '.join(more)}")
    if any(r.get("baseline_device") == "cpu" for r in records):
        out.append("torch eager and torch.compile were timed on the CPU (no GPU): their ms are CPU times and "
                   "Inductor's counts are of its C++ kernels")
    return out


def summary(records: list[dict]) -> dict:
    ok = [r for r in records if r.get("ok")]
    good = [r for r in ok if r.get("correct")]
    return {"problems": len(records), "failed": len(records) - len(ok), "correct": len(good),
            "timed": sum(1 for r in good if r.get("speedup_eager")),
            "compile_timed": sum(1 for r in good if r.get("speedup_compile")),
            "best_timed": sum(1 for r in good if r.get("speedup_best")),
            "more_kernels_than_inductor": sum(1 for r in ok if r.get("more_kernels_than_inductor")),
            "geomean_speedup_eager": geomean(r.get("speedup_eager") for r in good),
            "geomean_speedup_compile": geomean(r.get("speedup_compile") for r in good),
            "geomean_speedup_best": geomean(r.get("speedup_best") for r in good)}


def _forward_flags(args) -> list[str]:
    out = ["--timeout", str(args.timeout), "--tune-trials", str(args.tune_trials), "--draws", str(args.draws),
           "--trials", str(args.trials), "--compile-budget", str(args.compile_budget)]
    if args.compile_modes:
        out += ["--compile-modes", ",".join(args.compile_modes)]
    for flag in ("no_tune", "no_rewrite", "cpu", "no_compile_baselines", "fp32_only"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    from .optimize import writer_flags
    return out + writer_flags(args)


def run_isolated(path: str, args, no_compile: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "one.jsonl")
        cmd = [sys.executable, "-m", "agent_core.cli", "bench", path, "--json", out] + _forward_flags(args)
        if no_compile and "--no-compile-baselines" not in cmd:
            cmd.append("--no-compile-baselines")
        t0 = time.perf_counter()
        hard = 2 * args.timeout + 60       # its waits for the GPU lock do not count against --timeout
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=hard)
        except subprocess.TimeoutExpired:
            return {"problem": problem_name(path), "file": path, "ok": False,
                    "error": f"timed out after {hard:.0f} s (process killed)",
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
    from ..agent.phases import PhaseClock
    from .bench_costs import agent_fields, peak_memory_fields
    from .optimize import optimize_spec
    t0 = time.perf_counter()
    clock = PhaseClock()               # the agent's own time; its events' seconds feed it
    emit = EventEmitter(callback=clock.on_event)
    saved = args.no_compile_baselines
    args.no_compile_baselines = saved or no_compile
    try:
        with time_limit(args.timeout, not_counted=lambda: clock.seconds_in("gpu_wait")):
            with clock.running():
                result = optimize_spec(path, None, emit, args, baselines=True, kernelbench=True)
            if not result.gpu and args.compile_modes and not args.no_compile_baselines:
                time_torch_on_cpu(path, result, args)
            memory = peak_memory_fields(path, result)
        rec = record_from_result(path, result, time.perf_counter() - t0)
        rec.update(agent_fields(clock), **memory)
        return rec
    except (Exception, ProblemTimeout) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        return {"problem": problem_name(path), "file": path, "ok": False,
                "error": f"{type(exc).__name__}: {first[:300]}", "where": raised_at(exc),
                "seconds": round(time.perf_counter() - t0, 2),
                **agent_fields(clock)}     # how far the agent got (a timeout's figure counts in the p95)
    finally:
        args.no_compile_baselines = saved
        _release_gpu_memory()


def raised_at(exc: BaseException, frames: int = 4) -> list[str]:
    """The innermost frames of the tool's own code an exception passed through ("file:line in
    function"), so a failed row says where it failed (a CUDA fault: the call that reported it)."""
    import traceback
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename).startswith(root)]
    return [f"{os.path.relpath(f.filename, os.path.dirname(root))}:{f.lineno} in {f.name}" for f in ours[-frames:]]


def time_torch_on_cpu(path: str, result, args) -> None:
    """Without a GPU: torch eager and the asked torch.compile modes timed on the CPU, into the
    result's baselines, so Inductor's kernel counts are read on any machine (ours has no time here)."""
    from ..profile.baselines import measure_baselines, program_callable, source_callable
    try:
        fn, inputs = source_callable(path, "cpu") if path.endswith(".py") and os.path.isfile(path) else \
            program_callable(result.program, "cpu")
        base = measure_baselines(fn, inputs, compile_modes=args.compile_modes, trials=args.trials,
                                 compile_budget_s=args.compile_budget, device="cpu")
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        base = {"error": f"{type(exc).__name__}: {first[:300]}"}
    result.profile["baselines"] = base
    result.profile["baseline_device"] = "cpu"


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

    def capped(self) -> bool:
        return bool(self.args.time_cap) and time.perf_counter() - self.t_start > self.args.time_cap

    def skipped(self, path: str) -> dict:
        return {"problem": problem_name(path), "file": path, "ok": False,
                "error": f"skipped: the run's time cap of {self.args.time_cap:.0f} s was reached", "skipped": True}

    def no_compile(self) -> bool:
        return bool(self.args.compile_cap) and self.compile_spent > self.args.compile_cap

    def one(self, i: int, path: str) -> None:
        args = self.args
        no_compile = False
        if self.capped():
            rec = self.skipped(path)
        else:
            no_compile = self.no_compile()
            isolate = args.isolate or args.jobs > 1
            rec = run_isolated(path, args, no_compile) if isolate else run_one(path, args, no_compile)
        rec["jobs"] = args.jobs          # > 1: timed while other problems used the GPU
        self.record(i, rec, no_compile=no_compile)

    def record(self, i: int, rec: dict, *, no_compile: bool = False) -> None:
        """Keep, append and print one problem's row (bench --ray's driver records through this too)."""
        if no_compile and rec.get("ok"):
            rec["compile_skipped"] = f"the run's torch.compile budget of {self.args.compile_cap:.0f} s was spent"
        args = self.args
        with self.lock:
            self.compile_spent += rec.get("compile_seconds") or 0.0
            self.records[i] = rec
            if self.out is not None:
                self.out.write(json.dumps(rec) + "\n")
                self.out.flush()
            status = ("FAILED: " + rec.get("error", "") + "".join(f" (at {w})" for w in rec.get("where", [])[-1:])) \
                if not rec.get("ok") else (
                f"correct={rec.get('correct')} ours {_f(rec.get('ours_ms'))} ms, eager {_f(rec.get('eager_ms'))} ms, "
                f"compile {_f(rec.get('compile_best_ms'))} ms, best {rec.get('best_baseline') or '-'}, "
                f"kernels ours/Inductor {kernels_cell(rec)}"
                + (f"; the file's {' and '.join(rec['set_aside'])} set aside (fp32 at 1e-4)"
                   if rec.get("set_aside") else "")
                + (f"; {rec['graph_error']}" if rec.get("graph_error") else ""))
            where = f" on {rec['host']}" + (f" ({rec['gpu_name']})" if rec.get("gpu_name") else "") \
                if rec.get("host") else ""
            wait = f", {rec['gpu_wait_seconds']:.1f} s waiting for the GPU" if rec.get("gpu_wait_seconds") else ""
            print(f"[{len(self.records)}/{len(args.files)}] {rec['problem']}: {status} ({rec.get('seconds', 0)} s, "
                  f"agent {_f(rec.get('agent_seconds'), '{:.1f}')} s{wait}{where})",
                  flush=True)


def _run_parallel(state: _Run, todo: list[tuple[int, str]], jobs: int) -> None:
    """Each problem in its own process, `jobs` at a time; timed sections serialized by a file lock."""
    from concurrent.futures import ThreadPoolExecutor

    from ..profile.timing import TIMING_LOCK_ENV
    with tempfile.NamedTemporaryFile(prefix="stitchcuda-timing-", suffix=".lock") as lock:
        saved = os.environ.get(TIMING_LOCK_ENV)
        os.environ[TIMING_LOCK_ENV] = lock.name        # inherited by the problems' processes
        try:
            pool = ThreadPoolExecutor(max_workers=jobs)
            try:
                for f in [pool.submit(state.one, i, p) for i, p in todo]:
                    f.result()
            finally:   # on an interrupt, start nothing more; the running problems were interrupted too
                pool.shutdown(wait=True, cancel_futures=True)
        finally:
            if saved is None:
                os.environ.pop(TIMING_LOCK_ENV, None)
            else:
                os.environ[TIMING_LOCK_ENV] = saved


def crowded_out(rec: dict, gpu_seen: bool = False) -> str | None:
    """Why a problem run beside others lost to their GPU memory, or None: its own error; its CUDA graph's
    capture failing for memory, or failing at all beside other problems (20_MobileNetV2 and
    23_EfficientNetB1 under --jobs 8 on the H100 captured alone; their steps had launched one by one,
    0.33x); its rewrites' check not fitting
    (planned as written: most likely why 31_VisionAttention's attention was not raised under --jobs 8 on
    the H100, 14.8 ms, against 5.7 with it raised on the H200 in the sixth session); a region's
    verification whose reference ran out of memory (the region falls back: 74 of
    30_SwinTransformerV2's 77 fallbacks in the same run); or a library call whose split forms could
    not be timed (44_MiniGPTBlock ran every GEMM in fp32 under --jobs 8: 20.6 ms, 12.0 alone); or no
    GPU at all in its process where other problems of the run had one (`gpu_seen`: 34_VanillaRNNHidden
    under --jobs 8 on the H100). A row already run again alone (first_try) is kept as it is."""
    if rec.get("skipped") or rec.get("first_try"):        # a row already run again alone stays
        return None
    graph = rec.get("graph_error") if rec.get("ok") else None
    if graph and ((rec.get("jobs") or 1) > 1 or says_out_of_memory(graph)):
        return graph
    if rec.get("ok") and rec.get("gpu") is False and gpu_seen:
        return f"no GPU in its process ({rec.get('no_gpu') or 'no reason recorded'}) while other problems had one"
    reasons = [rec.get("error")] if not rec.get("ok") else \
        [rec.get("rewrites_skipped"), *(rec.get("fallbacks") or {}).values(),
         *(rec.get("library_precision_errors") or {}).values()]
    for why in reasons:
        if why and (says_out_of_memory(why) or why.startswith("DoesNotFit")):
            return why
    return None


def _rerun_crowded_out(state: _Run, rows: list[tuple[int, str]]) -> None:
    """--jobs: the problems that ran out of GPU memory beside the others (KernelBench level 3 under
    --jobs 8 on one 80 GB GPU: 12_VGG19, 14_DenseNet121DenseBlock and 33_VanillaRNN failed,
    23_EfficientNetB1 lost its CUDA graph and read 1.89 ms against 0.48 alone) run again, one at a time,
    while the time cap allows; the row says what the first try met. A --resume run takes the file's
    crowded rows that were not run again (the earlier call's cap came first) the same way."""
    gpu_seen = any(r.get("gpu") for r in state.records.values())
    for i, path in rows:
        why = crowded_out(state.records[i], gpu_seen) if i in state.records else None
        if why is None or state.capped():
            continue
        print(f"{problem_name(path)}: crowded out beside other problems ({why[:160]}); running it again alone",
              flush=True)
        jobs = state.records[i].get("jobs") or state.args.jobs     # a resumed row's own run
        rec = run_isolated(path, state.args, state.no_compile())
        rec["jobs"] = 1
        rec["first_try"] = f"with --jobs {jobs}: {why[:300]}"
        state.record(i, rec)


def _resumed(args) -> dict[str, dict]:
    """--resume: the rows the --json file already finished (absolute path -> row)."""
    if not args.resume:
        return {}
    if not args.json_out:
        from ..errors import StitchError
        raise StitchError("--resume needs --json FILE (the file an earlier run wrote)")
    from .bench_resume import finished_rows
    done = finished_rows(args.json_out)
    left = sum(os.path.abspath(p) not in done for p in args.files)
    print(f"resume: {len(args.files) - left} of {len(args.files)} problems already in {args.json_out}; "
          f"running the other {left}", flush=True)
    return done


def run(args) -> int:
    from .optimize import writer_config
    writer_config(args)     # a bad --writer flag fails once, before any problem runs
    if args.ray:
        from ..cluster import require_ray
        require_ray()           # without Ray: the install hint, before anything runs
    done = _resumed(args)
    state = _Run(args)
    todo = []
    for i, path in enumerate(args.files):
        if os.path.abspath(path) in done:
            state.records[i] = done[os.path.abspath(path)]
        else:
            todo.append((i, path))
    interrupted = False
    events = open(args.events, "a") if args.ray and args.events else None
    try:
        if args.ray:
            from ..agent import EventEmitter
            from ..cluster.ray_bench import run_on_ray
            run_on_ray(state, todo, run_one, address=args.ray, kernel_cache=args.kernel_cache,
                       events=EventEmitter(events) if events else None)
        elif args.jobs > 1:
            _run_parallel(state, todo, args.jobs)
            # every row: a resumed file's crowded rows too, whose call's time cap left them as they were
            _rerun_crowded_out(state, list(enumerate(args.files)))
        else:
            for i, path in todo:
                state.one(i, path)
    except KeyboardInterrupt:   # a wall-clock cap (timeout -s INT) still gets the table of what ran
        interrupted = True
    finally:
        for f in (state.out, events):
            if f is not None:
                f.close()
    records = [state.records[i] for i in sorted(state.records)]   # the files' order, whatever finished first
    if interrupted:
        print(f"interrupted after {len(records)} of {len(args.files)} problems")
    for line in table(records):
        print(line)
    if records and not any(r.get("gpu") for r in records):
        from ..agent import NO_GPU_LINE
        print(NO_GPU_LINE.format(arch="sm_90"))
    return 0
