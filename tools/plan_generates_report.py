"""Plan every KernelBench problem and count proposed / generated / compiled regions.

    nice -n 10 .venv/bin/python tools/plan_generates_report.py /tmp/kb/KernelBench/level1 \\
        /tmp/kb/KernelBench/level2 --jobs 2 -o docs/benchmarks/plan_generates.md

Problems run in worker subprocesses (one per job, each starting torch once and reading problem paths
from stdin); a problem that passes --timeout kills its worker, is reported as timed out, and a fresh
worker takes the next one. Everything runs on the CPU. A problem is imported on fake inputs and
planned as imported; when its parameters fit --rewrite-limit bytes it is also rewritten (unchecked,
on random parameters: only the plan is under test here) and planned again, as `stitchcuda optimize`
plans it.
Every active region is checked against what the plan says it is (schedule["runs"]): a region said to
be a generated kernel (or a library call plus its epilogue kernel) must generate and compile with
NVRTC for sm_90; one said to run through torch must be refused by the generator. The target is zero
"proposed but not generated".
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GENERATED = ("kernel", "library+kernel")


def _count(program, plan, row: dict, seen: set) -> None:
    from agent_core.codegen import generate_kernel
    from agent_core.compiler import compile_kernel
    from agent_core.errors import StitchError
    for r in plan.active:
        runs = r.schedule.get("runs", "?")
        row["runs"][runs] = row["runs"].get(runs, 0) + 1
        if runs in ("alias", "library", "strided_view"):
            continue
        row["proposed"] += runs in GENERATED
        try:
            ks = generate_kernel(program, r.nodes, name=f"k_{r.id}", kind=r.kind)
        except Exception as exc:   # CodegenError, or a generator bug: neither generates
            if runs in GENERATED:
                row["not_generated"].append(f"{r.id} ({r.kind}: {', '.join(program.nodes[n].op for n in r.nodes)}): "
                                            f"{str(exc).splitlines()[0][:200]}")
            continue
        if runs not in GENERATED:
            row["torch_but_generates"].append(f"{r.id} ({', '.join(program.nodes[n].op for n in r.nodes)})")
            continue
        row["generated"] += 1
        if ks.source in seen:
            row["compiled"] += 1
            continue
        try:
            compile_kernel(ks, arch="sm_90")
            seen.add(ks.source)
            row["compiled"] += 1
        except StitchError as exc:
            row["not_compiled"].append(f"{r.id}: {str(exc).splitlines()[0][:200]}")


def one(path: str, rewrite_limit: int) -> dict:
    import torch
    torch.set_num_threads(1)
    from agent_core.importers import import_file
    from agent_core.planner import plan_program
    from agent_core.rewrites import rewrite_program

    t0 = time.perf_counter()
    row: dict = {"problem": Path(path).stem, "proposed": 0, "generated": 0, "compiled": 0, "runs": {},
                 "not_generated": [], "not_compiled": [], "torch_but_generates": []}
    from agent_core.ir import Role
    meta = import_file(path, weights=False)
    # unchecked rewrites never allocate the inputs, only the parameters (drawn at random)
    size = sum(v.nbytes for v in meta.values.values() if v.role in (Role.PARAMETER, Role.CONSTANT))
    row.update(ops=len(meta.nodes), bytes=size, rewritten=size <= rewrite_limit)
    seen: set = set()
    variants = [meta]
    if size <= rewrite_limit:
        variants.append(rewrite_program(meta, check=False).program)
    plan_s = 0.0
    for p in variants:
        plan = plan_program(p)
        plan_s += plan.seconds
        _count(p, plan, row, seen)
    row.update(plan_ms=round(plan_s * 1000, 1), seconds=round(time.perf_counter() - t0, 1))
    return row


def worker(rewrite_limit: int) -> int:
    """Read problem paths from stdin, write one JSON row per problem to stdout (stray prints from a
    problem's own code go to stderr)."""
    out = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        path = line.strip()
        if not path:
            continue
        try:
            row = one(path, rewrite_limit)
        except Exception as e:  # reported as a row, one line
            row = {"problem": Path(path).stem, "error": f"{type(e).__name__}: {e}"[:300]}
        out.write(json.dumps(row) + "\n")
        out.flush()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*")
    ap.add_argument("-o", "--output", default="docs/benchmarks/plan_generates.md")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--rewrite-limit", type=int, default=1_000_000_000, help="bytes of parameters")
    ap.add_argument("--jobs", type=int, default=1, help="problems in parallel")
    ap.add_argument("--jsonl", help="also write the raw rows here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.rewrite_limit)
    files = [p for f in args.folders for p in sorted((Path(f).glob("*.py") if Path(f).is_dir() else [Path(f)]),
                                                     key=_order)]
    out_jsonl = open(args.jsonl, "w") if args.jsonl else None
    commit = _commit()     # the code the run starts with (a commit made while it runs is not in it)

    local = threading.local()

    def run_one(f):
        w = getattr(local, "worker", None)
        if w is None or w.poll() is not None:
            w = local.worker = subprocess.Popen(
                [sys.executable, __file__, "--worker", "--rewrite-limit", str(args.rewrite_limit)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        w.stdin.write(str(f) + "\n")
        w.stdin.flush()
        lines: list = []
        reader = threading.Thread(target=lambda: lines.append(w.stdout.readline()), daemon=True)
        reader.start()
        reader.join(args.timeout)
        if reader.is_alive() or not lines or not lines[0].startswith("{"):
            w.kill()
            w.wait()
            local.worker = None
            row = {"problem": f.stem, "error": f"timed out after {args.timeout} s" if reader.is_alive()
                   else "the worker died"}
        else:
            row = json.loads(lines[0])
        row["level"] = f.parent.name
        if out_jsonl:
            out_jsonl.write(json.dumps(row) + "\n")
            out_jsonl.flush()
        print(f"{row['level']}/{row['problem']}: " + (row.get("error") or (
            f"{row['proposed']} proposed, {row['generated']} generated, {row['compiled']} compiled"
            + (f", NOT GENERATED {row['not_generated']}" if row["not_generated"] else ""))), flush=True)
        return row

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
        rows = list(pool.map(run_one, files))
    write_report(rows, args, commit)
    bad = sum(len(r.get("not_generated", [])) + len(r.get("not_compiled", [])) for r in rows)
    return 1 if bad else 0


def _order(p: Path):
    head = p.name.split("_")[0]
    return int(head) if head.isdigit() else 0


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


def write_report(rows, args, commit: str) -> None:
    ok = [r for r in rows if "error" not in r]
    total = {k: sum(r[k] for r in ok) for k in ("proposed", "generated", "compiled")}
    runs: dict = {}
    for r in ok:
        for k, v in r["runs"].items():
            runs[k] = runs.get(k, 0) + v
    not_gen = [(r, m) for r in ok for m in r["not_generated"]]
    not_comp = [(r, m) for r in ok for m in r["not_compiled"]]
    wrong_torch = [(r, m) for r in ok for m in r["torch_but_generates"]]
    lines = [
        "# Every proposed region generates: " + ", ".join(os.path.basename(os.path.normpath(f)) for f in args.folders), "",
        f"Command: `nice -n 10 .venv/bin/python tools/plan_generates_report.py {' '.join(args.folders)} "
        f"--jobs {args.jobs} -o {args.output}`  ",
        f"Date: {datetime.date.today().isoformat()}, commit {commit}, on the CPU of the shared build machine "
        "(NVRTC compiles for sm_90 without a GPU).", "",
        f"{len(rows)} problems; {len(ok)} imported and planned"
        + (f"; {len(rows) - len(ok)} failed: " + "; ".join(f"{r['problem']}: {r['error']}" for r in rows if "error" in r)
           if len(ok) < len(rows) else "") + ".",
        f"Each is planned as imported and, when its parameters fit "
        f"{args.rewrite_limit / 1e6:.0f} MB ({sum(1 for r in ok if r['rewritten'])} problems), again after the "
        "rewrites (unchecked), as `stitchcuda optimize` plans it; both plans are counted.", "",
        "| | regions |", "| --- | ---: |",
        f"| proposed as a generated kernel (alone, or after a library call) | {total['proposed']} |",
        f"| generated | {total['generated']} |",
        f"| compiled (NVRTC, sm_90) | {total['compiled']} |",
        f"| **proposed but not generated** | **{len(not_gen)}** |",
        f"| generated but not compiled | {len(not_comp)} |",
        f"| said to run through torch, yet generated | {len(wrong_torch)} |", "",
        "Active regions by how the plan says they run: "
        + ", ".join(f"{k} {v}" for k, v in sorted(runs.items(), key=lambda kv: -kv[1])) + " (library: a lone "
        "matmul / convolution through cuBLAS / cuDNN; torch: a node the generator has no kernel for; alias: "
        "views only).", "",
    ]
    for title, items in (("Proposed but not generated", not_gen), ("Not compiled", not_comp),
                         ("Said to run through torch, yet generated", wrong_torch)):
        if items:
            lines += [f"## {title}", ""] + [f"- {r['level']}/{r['problem']}: {m}" for r, m in items] + [""]
    lines += ["## Per problem", "",
              "| level | problem | ops | rewritten | proposed | generated | compiled | torch | library | plan ms |",
              "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['level']} | {r['problem']} | | | | | | | | error: {r['error'].replace('|', '/')} |")
            continue
        lines.append(f"| {r['level']} | {r['problem']} | {r['ops']} | {'yes' if r['rewritten'] else 'no'} | "
                     f"{r['proposed']} | {r['generated']} | {r['compiled']} | {r['runs'].get('torch', 0)} | "
                     f"{r['runs'].get('library', 0)} | {r['plan_ms']} |")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
