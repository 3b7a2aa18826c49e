"""Rewrite and plan every KernelBench problem that imports; check the rewritten program numerically.

    nice -n 10 .venv/bin/python tools/kernelbench_plan_report.py kernelbench/KernelBench/level2 \\
        -o docs/benchmarks/kernelbench_plan.md

Each problem runs in its own subprocess with a timeout. A problem whose inputs and parameters fit
--check-limit bytes is imported with its weights, rewritten with every rewrite checked on random
draws, and the whole rewritten program is compared with the original on a fresh draw (the reference
interpreter on the CPU). A larger problem is imported on fake inputs and planned as imported, with no
rewrites (a rewrite is never kept unchecked); the report says so.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one(path: str, check_limit: int, device: str = "cpu") -> dict:
    from agent_core.importers import import_file
    from agent_core.planner import plan_program
    from agent_core.reference import random_inputs, run_reference
    from agent_core.rewrites import close, rewrite_program

    if device.startswith("cuda"):
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False   # fp32 means fp32 (DESIGN.md, "Measuring")
        torch.backends.cudnn.allow_tf32 = False
    row: dict = {"problem": Path(path).stem}
    t0 = time.perf_counter()
    # size first, on the meta device: never allocate what will not be checked
    meta = import_file(path, weights=False)
    size = sum(v.nbytes for v in meta.values.values() if v.producer is None)
    row["bytes"] = size
    row["ops"] = len(meta.nodes)
    if size <= check_limit:
        program = import_file(path)
        res = rewrite_program(program, check=True, draws=1, device=device)
        new = res.program
        inputs = random_inputs(program, seed=7, device=device)
        want, got = run_reference(program, inputs), run_reference(new, inputs)
        bad = [f"{k}: {close(got[k], want[k])}" for k in want if close(got[k], want[k])]
        row.update(checked=True, match=not bad, mismatch=bad, fired=res.rules_fired,
                   refused=[f"{e['rule']}: {e.get('error', '')}" for e in res.refused])
    else:
        new = meta
        row.update(checked=False, match=None, fired={}, refused=[])
    plan = plan_program(new)
    row.update(ops_after=len(new.nodes), regions=len(plan.active), kernels=plan.kernels,
               kinds=sorted({r.kind for r in plan.active}), plan_ms=round(plan.seconds * 1000, 1),
               unfused_ms=plan.estimate.unfused_ms, planned_ms=plan.estimate.planned_ms,
               floor_ms=plan.estimate.floor_ms, seconds=round(time.perf_counter() - t0, 1))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*")
    ap.add_argument("-o", "--output", default="docs/benchmarks/kernelbench_plan.md")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--check-limit", type=int, default=60_000_000, help="bytes of inputs and parameters")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu", help="where the reference runs the checks (cpu or cuda)")
    ap.add_argument("--jobs", type=int, default=1, help="problems in parallel")
    ap.add_argument("--jsonl", help="also write the raw rows here")
    ap.add_argument("--merge", nargs="*", help="write the report from these row files (later ones win)")
    args = ap.parse_args(argv)
    if args.one:
        try:
            print(json.dumps(one(args.one, args.check_limit, args.device)))
        except Exception as e:  # reported as a row, one line
            print(json.dumps({"problem": Path(args.one).stem, "error": f"{type(e).__name__}: {e}"[:300]}))
        return 0
    if args.merge:
        rows: dict = {}
        for fn in args.merge:
            for line in open(fn):
                if line.strip():
                    r = json.loads(line)
                    rows[r["problem"]] = r
        key = lambda r: int(r["problem"].split("_")[0]) if r["problem"].split("_")[0].isdigit() else 0  # noqa: E731
        write_report(sorted(rows.values(), key=key), args)
        return 0
    files = sorted((p for f in args.folders for p in (Path(f).glob("*.py") if Path(f).is_dir() else [Path(f)])),
                   key=lambda p: int(p.name.split("_")[0]) if p.name.split("_")[0].isdigit() else 0)
    out_jsonl = open(args.jsonl, "w") if args.jsonl else None

    def run_one(f):
        try:
            r = subprocess.run([sys.executable, __file__, "--one", str(f), "--check-limit", str(args.check_limit),
                                "--device", args.device],
                               capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
            line = (r.stdout.strip().splitlines() or [""])[-1]
            row = json.loads(line) if line.startswith("{") else {"problem": f.stem,
                                                                  "error": (r.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        except subprocess.TimeoutExpired:
            row = {"problem": f.stem, "error": f"timed out after {args.timeout} s"}
        if out_jsonl:
            out_jsonl.write(json.dumps(row) + "\n")
            out_jsonl.flush()
        print(f"{row['problem']}: " + (row.get("error") or f"{row['ops']} ops -> {row['regions']} regions, "
                                        f"{row['kernels']} kernels, match={row['match']}"), flush=True)
        return row

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
        rows = list(pool.map(run_one, files))
    write_report(rows, args)
    return 0


def write_report(rows, args) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    ok = [r for r in rows if "error" not in r]
    checked = [r for r in ok if r.get("checked")]
    fired: dict = {}
    for r in ok:
        for k, v in r.get("fired", {}).items():
            fired[k] = fired.get(k, 0) + v
    lines = [
        "# KernelBench level 2: rewrites and plans", "",
        f"Command: `nice -n 10 .venv/bin/python tools/kernelbench_plan_report.py {' '.join(args.folders)} "
        f"-o {args.output}`  ",
        f"Date: {datetime.date.today().isoformat()}, commit {commit}; checks run by the reference interpreter "
        f"on {args.device}.", "",
        f"{len(rows)} problems; {len(ok)} imported and planned; {len(checked)} small enough "
        f"(inputs and parameters under {args.check_limit / 1e6:.0f} MB) to rewrite with numerical checks, of "
        f"which {sum(1 for r in checked if r['match'])} match the original on a fresh random draw "
        f"(atol scaled to the output, rtol 1e-4). Larger problems are planned as imported, without rewrites.", "",
        "Rewrites fired in total: " + (", ".join(f"{k} {v}" for k, v in sorted(fired.items())) or "none") + ".", "",
        "Estimates are the planner's roofline on the H200 profile (CUDA graph launches): every op its own "
        "kernel, the plan, and the floor.", "",
        "| problem | ops | ops after rewrites | regions | kernels | region kinds | rewrites fired | checked | "
        "unfused ms | planned ms | floor ms |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['problem']} | | | | | | | not imported: {r['error'].replace('|', '/')} | | | |")
            continue
        fired_s = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in r["fired"].items()) or "-"
        chk = ("match" if r["match"] else "MISMATCH " + "; ".join(r["mismatch"])) if r["checked"] \
            else "too large for the CPU check"
        lines.append(f"| {r['problem']} | {r['ops']} | {r['ops_after']} | {r['regions']} | {r['kernels']} | "
                     f"{', '.join(r['kinds'])} | {fired_s} | {chk} | {r['unfused_ms']:.4f} | "
                     f"{r['planned_ms']:.4f} | {r['floor_ms']:.4f} |")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
