"""Import every KernelBench problem in the given folders and report how it went (markdown).

    nice -n 10 .venv/bin/python tools/kernelbench_report.py kernelbench/KernelBench/level1 \
        kernelbench/KernelBench/level2 -o docs/KERNELBENCH_IMPORT.md

Each problem runs in its own subprocess with a timeout (some problems hold tens of GB of inputs).
Nothing is shrunk: a problem whose inputs and parameters together stay under --verify-limit
elements is imported with its weights and its program is checked against the module on 2 random
draws (the reference interpreter, agent_core.reference); a larger one is imported on fake inputs
(its shapes exactly as given) and not run, and one whose parameters alone exceed --weights-limit is
built on the meta device (parameters with shapes, no data). With --device cuda every problem that
fits the GPU is verified there.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _sizes(path: Path) -> tuple[int, int]:
    """(input elements, parameter elements) of a problem, measured on the meta device."""
    import torch
    from agent_core.importers import load_source

    mod = load_source(path)
    torch.manual_seed(0)
    with torch.device("meta"):
        ins = mod.get_inputs()
        model = mod.Model(*mod.get_init_inputs())
    n_in = sum(t.numel() for t in ins if isinstance(t, torch.Tensor))
    n_p = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    return n_in, n_p


def run_one(path: Path, verify_limit: float, weights_limit: float, device: str, announce: bool = False) -> dict:
    import torch
    from agent_core.errors import StitchError
    from agent_core.importers import import_file, load_source, verify_import

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res: dict = {"problem": f"{path.parent.name}/{path.name}"}
    t0 = time.time()
    try:
        n_in, n_p = _sizes(path)
    except Exception as e:  # the import below reports the real cause
        n_in = n_p = -1
        res["size_error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    res["elements"] = n_in + n_p
    weights = n_p <= weights_limit
    try:
        program = import_file(path, weights=weights)
    except StitchError as e:
        res.update(status="fail", error=str(e), seconds=round(time.time() - t0, 1))
        return res
    except Exception as e:  # a bug in the importer: still a row in the report
        res.update(status="fail", error=f"internal {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                   seconds=round(time.time() - t0, 1))
        return res
    res["import_seconds"] = round(time.time() - t0, 1)
    res["nodes"] = len(program.nodes)
    res["opaque"] = program.metadata.get("opaque_ops", {})
    res["warnings"] = program.metadata.get("import_warnings", [])
    res["method"] = program.metadata.get("import_method")
    res["weights"] = weights
    res["status"] = "opaque" if res["opaque"] else "clean"
    if announce:  # the parent keeps this if verification then runs past the timeout
        print("@@IMPORTED " + json.dumps(res), flush=True)
    if not weights:
        res["verify"] = "skipped: parameters not materialized"
    elif n_in + n_p > verify_limit:
        res["verify"] = f"skipped: {n_in + n_p:.2g} elements > {verify_limit:.2g}"
    else:
        try:
            mod = load_source(path)
            torch.manual_seed(0)
            model = mod.Model(*mod.get_init_inputs())
            err = verify_import(program, model, draws=2, device=device)
            res["verify"] = "ok"
            res["max_err"] = err
        except StitchError as e:
            res["verify"] = f"MISMATCH: {e}"
        except (RuntimeError, MemoryError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            res["verify"] = f"skipped: {'out of memory' if 'memory' in msg.lower() else msg[:120]}"
    res["seconds"] = round(time.time() - t0, 1)
    return res


def _child(args) -> None:
    if args.mem_limit_gb:
        lim = int(args.mem_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    res = run_one(Path(args.one), args.verify_limit, args.weights_limit, args.device, announce=True)
    print("@@RESULT " + json.dumps(res))


def _spawn(path: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--one", str(path), "--verify-limit", str(args.verify_limit),
           "--weights-limit", str(args.weights_limit), "--device", args.device,
           "--mem-limit-gb", str(args.mem_limit_gb)]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        for line in out.splitlines():
            if line.startswith("@@IMPORTED "):
                res = json.loads(line[len("@@IMPORTED "):])
                res.update(verify=f"skipped: verification ran past the {args.timeout} s timeout",
                           seconds=args.timeout)
                return res
        return {"problem": f"{path.parent.name}/{path.name}", "status": "timeout",
                "error": f"no result within {args.timeout} s", "seconds": args.timeout}
    for line in p.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT "):])
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return {"problem": f"{path.parent.name}/{path.name}", "status": "fail",
            "error": f"the import process died (exit {p.returncode}): {tail[:200]}", "seconds": round(time.time() - t0, 1)}


def _key(p: Path):
    stem = p.name.split("_")[0]
    return (p.parent.name, int(stem) if stem.isdigit() else 0, p.name)


def report(results: list[dict], args, started: str, wall: float) -> str:
    n = len(results)
    clean = [r for r in results if r["status"] == "clean"]
    opaque = [r for r in results if r["status"] == "opaque"]
    failed = [r for r in results if r["status"] in ("fail", "timeout")]
    ops = Counter()
    for r in opaque:
        for op, k in r["opaque"].items():
            ops[op] += k
    problems_per_op = Counter(op for r in opaque for op in r["opaque"])
    verified = [r for r in results if r.get("verify") == "ok"]
    mismatch = [r for r in results if str(r.get("verify", "")).startswith("MISMATCH")]
    skipped = [r for r in results if str(r.get("verify", "")).startswith("skipped")]
    lines = [
        "# KernelBench import report", "",
        f"Generated {started} by `tools/kernelbench_report.py` (ScalingIntelligence/KernelBench, "
        f"commit {args.commit or 'unknown'}).", "",
        "Command:", "", "```", args.command_line, "```", "",
        f"Settings: per-problem timeout {args.timeout} s, verification on `{args.device}` for problems with at most "
        f"{args.verify_limit:.2g} input + parameter elements (2 random draws each, atol = rtol = 1e-4), "
        f"parameters left unmaterialized above {args.weights_limit:.2g} elements. Wall time {wall / 60:.1f} min.", "",
        "## Summary", "",
        f"| | problems |", "| --- | --- |",
        f"| imported | {len(clean) + len(opaque)} / {n} |",
        f"| with no opaque node | {len(clean)} |",
        f"| with opaque nodes | {len(opaque)} |",
        f"| failed | {len(failed)} |",
        f"| reference matches the module | {len(verified)} |",
        f"| reference differs from the module | {len(mismatch)} |",
        f"| not verified (size, see column) | {len(skipped)} |", "",
    ]
    if ops:
        lines += ["Opaque aten ops (nodes / problems):", ""]
        lines += [f"- `{op}`: {k} / {problems_per_op[op]}" for op, k in ops.most_common()]
        lines.append("")
    if failed:
        lines += ["Failures:", ""]
        lines += [f"- {r['problem']}: {r.get('error')}" for r in failed]
        lines.append("")
    if mismatch:
        lines += ["Mismatches:", ""]
        lines += [f"- {r['problem']}: {r['verify']}" for r in mismatch]
        lines.append("")
    lines += ["## Problems", "", "| problem | status | nodes | opaque ops | verify | max abs err | s |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        op = ", ".join(f"{k} x{v}" for k, v in r.get("opaque", {}).items()) or ""
        err = f"{r['max_err']:.2g}" if "max_err" in r else ""
        status = r["status"] if r["status"] not in ("fail", "timeout") else f"{r['status']}: {r.get('error', '')}"
        lines.append(f"| {r['problem']} | {status} | {r.get('nodes', '')} | {op} | {r.get('verify', '')} | {err} | "
                     f"{r.get('seconds', '')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", type=Path)
    ap.add_argument("-o", "--output", type=Path, help="write the markdown report here (default: stdout)")
    ap.add_argument("--json", type=Path, help="also write the raw results as JSON lines")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--verify-limit", type=float, default=2e8)
    ap.add_argument("--weights-limit", type=float, default=5e7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mem-limit-gb", type=float, default=0)
    ap.add_argument("--commit", default="")
    ap.add_argument("--jobs", type=int, default=1, help="problems run in parallel")
    ap.add_argument("--only", default="", help="comma-separated substrings; run only matching problems")
    ap.add_argument("--from-json", type=Path, nargs="*", help="rebuild the report from earlier --json results")
    ap.add_argument("--date", default="", help="with --from-json: when the results were measured")
    ap.add_argument("--wall", type=float, default=0.0, help="with --from-json: minutes the runs took")
    ap.add_argument("--run-command", default="", help="with --from-json: the command(s) that made the results")
    ap.add_argument("--in-process", action="store_true",
                    help="no subprocess per problem (fast import-only scans: use with --weights-limit -1)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        _child(args)
        return 0
    if args.from_json:
        args.command_line = args.run_command
        merged: dict[str, dict] = {}
        for j in args.from_json:  # later files override earlier ones, problem by problem
            for line in j.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    merged[r["problem"]] = r
        results = sorted(merged.values(), key=lambda r: _key(Path(r["problem"])))
        text = report(results, args, args.date or "unknown", args.wall * 60)
        (args.output.write_text(text) if args.output else sys.stdout.write(text))
        return 0
    files = sorted((f for d in args.dirs for f in d.glob("*.py")), key=_key)
    if args.only:
        files = [f for f in files if any(s in f.name for s in args.only.split(","))]
    exe = Path(sys.executable)
    exe = exe.relative_to(ROOT).as_posix() if exe.is_relative_to(ROOT) else "python3"
    args.command_line = " ".join([exe, "tools/kernelbench_report.py", *(argv or sys.argv[1:])])
    if os.nice(0) > 0:
        args.command_line = f"nice -n {os.nice(0)} " + args.command_line
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.time()
    results = []

    def one(f):
        r = run_one(f, args.verify_limit, args.weights_limit, args.device) if args.in_process else _spawn(f, args)
        print(f"{r['problem']}: {r['status']} {r.get('verify', '')} {r.get('error', '')} "
              f"{dict(r.get('opaque', {})) or ''} ({r.get('seconds')} s)", file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(r) + "\n")
        return r

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(one, files))
    text = report(results, args, started, time.time() - t0)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
