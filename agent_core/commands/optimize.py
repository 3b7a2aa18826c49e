"""`stitchcuda optimize prog.json|model.py -o OUTDIR`: the whole agent loop.

Writes OUTDIR/program.json (the rewritten program with its regions: status, reasons, sources,
measurements), OUTDIR/kernels/*.cu, OUTDIR/profile.json and OUTDIR/events.jsonl. Without a GPU it
plans, rewrites, generates and compiles (sm_90), writes the sources and the program file, prints that
no GPU is present and exits 0. Everything, the event log included, goes into a fresh folder beside
OUTDIR that replaces it only when the run succeeded (agent_core.output_dir): a rerun replaces the
folder an earlier optimize wrote, a failed run leaves it as it was.
"""
from __future__ import annotations

import contextlib
import os
import sys

from ..output_dir import MARKER
from ..text import plural

HELP = "plan, generate, compile, verify and time CUDA for a program"


def add_common(parser) -> None:
    parser.add_argument("--no-tune", action="store_true", help="keep each region's default launch parameters")
    parser.add_argument("--tune-trials", type=int, default=6, help="parameter sets tried per region (default 6)")
    parser.add_argument("--draws", type=int, default=5, help="random draws each verification uses (default 5)")
    parser.add_argument("--trials", type=int, default=20, help="timed trials per measurement, median (default 20)")
    parser.add_argument("--no-rewrite", action="store_true", help="plan the program as it is")
    parser.add_argument("--fp32-only", action="store_true",
                        help="run every matmul and convolution in plain fp32, never as split TF32")
    parser.add_argument("--cpu", action="store_true", help="do not use a GPU even if there is one")
    parser.add_argument("--no-compile-baselines", action="store_true",
                        help="time torch eager only, not torch.compile")
    parser.add_argument("--compile-budget", type=float, default=120.0,
                        help="seconds of torch.compile per problem before further modes are skipped (default 120)")
    add_writer(parser)


WRITER_KEY_ENV = "STITCHCUDA_WRITER_KEY"


def add_writer(parser) -> None:
    """The model-driven kernel writer (docs/WRITER.md); off unless --writer is given."""
    g = parser.add_argument_group("model-driven kernel writer (docs/WRITER.md)")
    g.add_argument("--writer", metavar="URL", default=None,
                   help="an OpenAI-compatible API base (e.g. http://127.0.0.1:8000/v1): a model proposes kernels "
                        "for each region, kept only when they pass every check and beat ours; a remote URL "
                        "receives the regions' ops, shapes and our kernels (never weights or data)")
    g.add_argument("--writer-model", metavar="NAME", help="the model name the endpoint serves")
    g.add_argument("--writer-rounds", metavar="N", type=int, default=3,
                   help="rounds of propose, check and feedback per region (default 3)")
    g.add_argument("--writer-regions", metavar="R1,R2", default="",
                   help="only these region ids (default: every region that runs a kernel or falls back)")
    g.add_argument("--writer-key-env", metavar="VAR", default=WRITER_KEY_ENV,
                   help=f"the environment variable holding the endpoint's API key (default {WRITER_KEY_ENV}); "
                        "the key is never taken from the command line")
    for flag, key, what in (("--writer-max-tokens", "max_tokens", "the most tokens one reply may have"),
                            ("--writer-region-token-cap", "region_token_cap",
                             "tokens (prompts included) after which a region is asked no more"),
                            ("--writer-run-token-cap", "run_token_cap",
                             "tokens (prompts included) after which no region of the run is asked")):
        g.add_argument(flag, metavar="N", type=int, default=_writer_default(key),
                       help=f"{what} (default {_writer_default(key):,})")


def _writer_default(key: str):
    from dataclasses import fields

    from ..writer.config import WriterConfig
    return next(f.default for f in fields(WriterConfig) if f.name == key)


def writer_config(args):
    """The WriterConfig the flags ask for, validated, or None without --writer."""
    if not getattr(args, "writer", None):
        return None
    from ..writer.config import WriterConfig, WriterError
    if not args.writer_model:
        raise WriterError("writer: --writer needs --writer-model NAME (the model the endpoint serves)")
    regions = tuple(r.strip() for r in (args.writer_regions or "").split(",") if r.strip())
    return WriterConfig(args.writer, args.writer_model, rounds=args.writer_rounds, key_env=args.writer_key_env,
                        regions=regions, max_tokens=args.writer_max_tokens,
                        region_token_cap=args.writer_region_token_cap,
                        run_token_cap=args.writer_run_token_cap).validate()


def writer_flags(args) -> list[str]:
    """The writer flags again, for a child process (bench --isolate); never the key itself."""
    if not getattr(args, "writer", None):
        return []
    out = ["--writer", args.writer, "--writer-model", args.writer_model or "", "--writer-rounds",
           str(args.writer_rounds), "--writer-key-env", args.writer_key_env, "--writer-max-tokens",
           str(args.writer_max_tokens), "--writer-region-token-cap", str(args.writer_region_token_cap),
           "--writer-run-token-cap", str(args.writer_run_token_cap)]
    return out + (["--writer-regions", args.writer_regions] if args.writer_regions else [])


def add_arguments(parser) -> None:
    parser.add_argument("program", help="a program file (.json), a KernelBench .py file or module:Class")
    parser.add_argument("-o", "--output", required=True,
                        help="output folder: new, empty or one an earlier optimize wrote (replaced when this "
                             "run succeeds; a failed run leaves it as it was); never a folder holding files "
                             "stitchcuda did not write, the input's folder, the current or home folder, / or a "
                             "symbolic link")
    parser.add_argument("--force", action="store_true",
                        help=f"also replace a folder an export wrote (it holds the {MARKER} marker and no file "
                             "stitchcuda did not write)")
    parser.add_argument("--no-baselines", action="store_true", help="do not time torch eager / torch.compile")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
    parser.add_argument("--sanitize", action="store_true",
                        help="afterwards, verify the generated kernels again under compute-sanitizer memcheck "
                             "(no tuning, no baselines; slow); exit 3 when it reports an error")
    add_common(parser)
    g = parser.add_argument_group("precision (docs/OPTIMIZE.md#the-programs-tolerance)")
    g.add_argument("--tolerance", type=float, metavar="T",
                   help="atol = rtol = T for every verification instead of 1e-4 (kept in the program file)")
    g.add_argument("--allow-precision", metavar="FORMS", default="",
                   help="also let matmuls and convolutions run in these lower precisions where they verify "
                        "within the tolerance: a comma list of tf32, fp16, bf16 (kept in the program file)")
    g = parser.add_argument_group("Ray cluster (docs/CLUSTER.md; pip install '.[cluster]')")
    g.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS|auto|local",
                   help="run each region's tuning trials as a Ray task (one GPU each; with --cpu, compile "
                        "them on the cluster's CPUs): local starts a cluster on this machine for the run, "
                        "auto joins the one `ray start` runs here, else host:port or ray://host:10001; the "
                        "region's full verification and the end-to-end program stay on this machine's GPU")
    g.add_argument("--kernel-cache", metavar="DIR",
                   help="with --ray: the compiled-kernel cache the workers and this driver use (default: this "
                        "machine's for local; a multi-host cluster needs a path all nodes share)")


def baseline_for(spec: str):
    """(fn, inputs) to time as torch's baseline: the file's own Model for a .py, else None (the program)."""
    if spec.endswith(".py") and os.path.isfile(spec):
        from ..profile.baselines import source_callable
        return source_callable(spec)
    return None


def output_for(args):
    """The fresh folder optimize writes into (moved to args.output when the run succeeds; see
    agent_core.output_dir), or a null context yielding None without -o."""
    if args.output is None:
        return contextlib.nullcontext()
    from ..output_dir import input_paths, output_folder
    return output_folder(args.output, "optimize", force=getattr(args, "force", False),   # the worker has none
                         protect=input_paths(args.program), hint="--force" if hasattr(args, "force") else None)


def set_precision(program, args, emit, kernelbench: bool = False) -> list[str]:
    """--tolerance and --allow-precision into the program's metadata (optimize() checks them, also where
    the program file set them itself). kernelbench (bench): KernelBench's rules, fp32 at 1e-4, whatever
    the file says; returns the settings it set aside (bench records them)."""
    from ..errors import ProgramError
    from ..runtime.low_precision import allowed
    if kernelbench:
        dropped = [k for k in ("tolerance", "allow_precision") if program.metadata.pop(k, None) is not None]
        if dropped:
            emit.log(f"{' and '.join(dropped)} of the program file not used: bench verifies at 1e-4 in fp32, "
                     "as its baselines run", level="warning")
        return dropped
    if getattr(args, "tolerance", None) is not None:
        program.metadata["tolerance"] = {"atol": args.tolerance, "rtol": args.tolerance}
    forms = [f.strip().lower() for f in (getattr(args, "allow_precision", "") or "").split(",") if f.strip()]
    if forms:
        program.metadata["allow_precision"] = forms
    if allowed(program) and getattr(args, "fp32_only", False):
        raise ProgramError("--fp32-only keeps every matmul and convolution in fp32: it cannot also allow "
                           + ", ".join(allowed(program)))
    return []


def optimize_spec(spec: str, out_dir, emit, args, *, baselines: bool = True, final_dir=None, tuner=None,
                  kernelbench: bool = False):
    from ..agent import optimize
    from ..agent.phases import phase
    from ..profile.hardware import no_gpu_reason
    from .import_cmd import open_program
    writer = writer_config(args)     # a bad flag fails before the program is opened
    with phase("import"):
        program = open_program(spec)
        program.check()
    set_aside = set_precision(program, args, emit, kernelbench)
    gpu = not args.cpu and no_gpu_reason() is None
    base_fn = None
    if gpu and baselines:
        try:
            with phase("baselines"):     # torch's Model for its baselines: not the agent's time
                base_fn = baseline_for(spec)
        except Exception as exc:  # the program's own op-by-op run is the baseline then
            emit.log(f"the file's Model could not be built for the baseline ({type(exc).__name__}: {exc}); "
                     "timing the program op by op instead", level="warning")
    from ..profile.baselines import MODES
    modes = () if args.no_compile_baselines else (getattr(args, "compile_modes", None) or MODES)   # bench --compile-modes
    result = optimize(program, out_dir=out_dir, device=None if gpu else "cpu", emit=emit, tune=not args.no_tune,
                    draws=args.draws, tune_trials=args.tune_trials, trials=args.trials,
                    rewrite=not args.no_rewrite, baselines=baselines, baseline_fn=base_fn, compile_modes=modes,
                    compile_budget_s=args.compile_budget, split_tf32=not getattr(args, "fp32_only", False),
                    final_dir=final_dir, writer=writer, writer_sanitize=bool(getattr(args, "sanitize", False)),
                    **({"tuner": tuner} if tuner is not None else {}))     # --ray (cluster/ray_tune.py)
    if set_aside:
        result.profile["set_aside"] = set_aside
    return result


def run(args) -> int:
    from ..agent import EventEmitter
    from ..agent.progress import format_event

    def show(e):
        if args.quiet:
            return
        line = format_event(e)
        if line:
            print(line, flush=True)
    from ..cluster.ray_tune import ray_tuning
    if args.ray:
        from ..cluster import require_ray
        require_ray()           # without Ray: the install hint, before anything runs
    with output_for(args) as tmp, open(tmp / "events.jsonl", "w") as log:   # the log streams into tmp
        emit = EventEmitter(log, show)
        with ray_tuning(args.ray, args.kernel_cache) as tuner:      # None without --ray
            result = optimize_spec(args.program, str(tmp), emit, args, baselines=not args.no_baselines,
                                   final_dir=args.output, tuner=tuner)
    result.out_dir = args.output
    counts = {}
    for o in result.outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    print(f"{result.program.name}: {plural(len(result.outcomes), 'region')}: "
          + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    prof = result.profile
    if result.gpu:
        e2e = prof.get("end_to_end", {})
        line = f"end to end {e2e.get('ms', 0):.4f} ms, {'correct' if e2e.get('correct') else 'NOT CORRECT'}"
        if prof.get("speedup_vs_eager"):
            line += f", {prof['speedup_vs_eager']:.2f}x vs eager"
        if prof.get("speedup_vs_compile"):
            line += f", {prof['speedup_vs_compile']:.2f}x vs torch.compile"
        print(line)
    else:
        from ..agent import NO_GPU_LINE
        print(NO_GPU_LINE.format(arch="sm_90"))
    if result.writer:
        w = result.writer
        kept = ", ".join(w["regions_kept"]) or "none"
        print(f"writer {w['model']}: {plural(w['rounds'], 'round')}, {plural(w['tokens'], 'token')}, "
              f"model kernels kept: {kept}" + (f" (stopped: {w['stopped']})" if w.get("stopped") else ""))
    print(f"wrote {args.output}/program.json, kernels/, profile.json, events.jsonl")
    sys.stdout.flush()
    if args.sanitize:
        return sanitize(args, result.gpu)
    return 0


def sanitize_command(args) -> list[str]:
    """The optimize run repeated under compute-sanitizer memcheck: every kernel is loaded, verified
    on the draws and run end to end once more with out-of-bounds and misaligned accesses checked."""
    return ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", str(SANITIZE_ERROR_EXIT),
            "--print-limit", "20", sys.executable, "-m", "agent_core.cli", "optimize", args.program,
            "-o", os.path.join(args.output, "sanitize"), "--no-tune", "--no-baselines", "--quiet",
            "--draws", str(min(args.draws, 2)), "--trials", "1"] + (["--no-rewrite"] if args.no_rewrite else [])


SANITIZE_ERROR_EXIT = 3


def sanitize(args, gpu: bool) -> int:
    import shutil
    import subprocess
    if not gpu:
        print("sanitize: skipped, compute-sanitizer needs a CUDA GPU", file=sys.stderr)
        return 0
    if shutil.which("compute-sanitizer") is None:
        print("sanitize: compute-sanitizer is not on PATH (it comes with the CUDA toolkit)", file=sys.stderr)
        return 2
    cmd = sanitize_command(args)
    print("sanitize: " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    report = os.path.join(args.output, "sanitize.txt")
    with open(report, "w") as f:
        f.write(proc.stdout + proc.stderr)
    from ..output_dir import add_to_marker
    add_to_marker(args.output, ["sanitize.txt"])   # a rerun may replace it (sanitize/ has its own marker)
    summary = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR SUMMARY" in ln]
    if proc.returncode == SANITIZE_ERROR_EXIT:
        print(f"sanitize: memcheck found errors ({summary[-1] if summary else 'see the report'}); report: {report}")
        return SANITIZE_ERROR_EXIT
    if proc.returncode != 0:
        print(f"sanitize: the run under compute-sanitizer failed (exit {proc.returncode}); report: {report}")
        return proc.returncode
    print(f"sanitize: clean ({summary[-1].strip('= ') if summary else 'no errors'}); report: {report}")
    return 0
