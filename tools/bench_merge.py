"""Merge `stitchcuda bench --json` files into one markdown table with geometric means.

Files later on the command line override earlier ones problem by problem, so a quiet re-time (--jobs 1)
listed after a parallel sweep replaces its numbers; each row says which kind of run it comes from.

    python tools/bench_merge.py --title "KernelBench level 2" sweep_a.jsonl sweep_b.jsonl quiet.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from agent_core.commands.bench import geomean, modes_run  # noqa: E402
from agent_core.commands.bench_costs import (above_names, agent_time_scope, agent_time_summary,  # noqa: E402
                                             memory_summary, degraded_lines)
from agent_core.text import plural  # noqa: E402


def load(paths: list[str]) -> list[dict]:
    by: dict[str, dict] = {}
    order: list[str] = []
    for path in paths:
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("skipped") and rec["problem"] in by:
                    continue                       # a capped run does not erase an earlier measurement
                if rec["problem"] not in by:
                    order.append(rec["problem"])
                rec["source"] = os.path.basename(path)
                by[rec["problem"]] = rec
    return [by[p] for p in sorted(order, key=_natural)]


def _natural(name: str):
    head = name.split("_", 1)[0]
    return (0, int(head), name) if head.isdigit() else (1, 0, name)


def _f(x, fmt="{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def timing_kind(rec: dict) -> str:
    jobs = rec.get("jobs")
    if jobs is None:     # records written before bench noted it: quiet runs are named so
        return "alone" if "quiet" in rec.get("source", "") else "parallel"
    return "alone" if jobs == 1 else f"parallel ({jobs})"


def markdown(records: list[dict], title: str) -> list[str]:
    modes = modes_run(records)
    lines = [f"### {title}", "",
             "| problem | correct | eager ms | " + "".join(f"{m} ms | " for m in modes) +
             "best baseline ms | ours ms | x eager | x compile | x best | kernels ours / Inductor | "
             "library calls not plain fp32 | floor ms | agent s | peak mem / eager | timed | run |",
             "| --- | --- | ---: | " + "---: | " * len(modes) + "---: | ---: | ---: | ---: | ---: | ---: | ---: | "
             "---: | ---: | ---: | --- | --- |"]
    for r in records:
        if not r.get("ok"):
            lines.append(f"| {r['problem']} | not run: {r.get('error', '')[:80]} |" + " |" * (13 + len(modes)))
            continue
        corr = "yes" if r.get("correct") else ("NO: " + str(r.get("verify_reason"))[:60])
        per_mode = "".join(f"{mode_cell(r, m)} | " for m in modes)
        lines.append(f"| {r['problem']} | {corr} | {_f(r.get('eager_ms'))} | {per_mode}{best_cell(r)} | "
                     f"{_f(r.get('ours_ms'))} | {_f(r.get('speedup_eager'), '{:.2f}')} | "
                     f"{_f(r.get('speedup_compile'), '{:.2f}')} | {_f(r.get('speedup_best'), '{:.2f}')} | "
                     f"{kernels_cell(r)} | {r.get('split_tf32_nodes', '-')} | {_f(r.get('floor_ms'))} | "
                     f"{_f(r.get('agent_seconds'), '{:.1f}')} | {memory_cell(r)} | {timing_kind(r)} | {r['source']} |")
    lines += [""] + summary_lines(records)
    return lines


def mode_cell(r: dict, mode: str) -> str:
    ms = r.get("compile_ms") or {}
    if mode not in ms:
        return "-"                                  # this record's run did not ask for the mode
    return _f(ms[mode]) if ms[mode] else "not timed"


def best_cell(r: dict) -> str:
    name = r.get("best_baseline")
    if not name:
        return "-"
    return f"{_f(r.get('best_baseline_ms'))} ({name.removeprefix('compile_')})"


def memory_cell(r: dict) -> str:
    """Our peak GPU memory over eager's, with both in MiB (bench_costs; '-' on CPU runs and old records)."""
    ratio = r.get("peak_mem_ratio")
    if ratio is None:
        return "-"
    return f"{ratio:.2f} ({r['peak_mem_ours_bytes'] / 2**20:.1f} / {r['peak_mem_eager_bytes'] / 2**20:.1f} MiB)"


def kernels_cell(r: dict) -> str:
    """ours / Inductor's fewest: launched kernels where the profiler counted both (marked), else our
    plan's launches against Inductor's code (bench.kernel_comparison)."""
    ours, ind = r.get("ours_kernels_counted", r.get("launches")), r.get("inductor_fewest_kernels")
    cell = f"{'-' if ours is None else ours} / {'-' if ind is None else ind}" + \
        (" launched" if r.get("kernels_counted") == "launched" else "")
    return cell + (" (more than Inductor)" if r.get("more_kernels_than_inductor") else "")


def summary_lines(records: list[dict]) -> list[str]:
    ran = [r for r in records if r.get("ok")]
    good = [r for r in ran if r.get("correct")]
    alone = [r for r in good if timing_kind(r) == "alone"]
    out = [f"- correct: {len(good)}/{len(ran)} that ran ({len(records)} problems)"]
    for label, rs in (("all correct", good), ("timed alone", alone)):
        ge = geomean(r.get("speedup_eager") for r in rs)
        gc = geomean(r.get("speedup_compile") for r in rs)
        gb = geomean(r.get("speedup_best") for r in rs)
        out.append(f"- geometric mean, {label} ({len(rs)}): {_f(ge, '{:.2f}')}x vs eager, "
                   f"{_f(gc, '{:.2f}')}x vs the better torch.compile mode, "
                   f"{_f(gb, '{:.2f}')}x vs the best of eager and every torch.compile mode run")
    compared = [r for r in ran if r.get("more_kernels_than_inductor") is not None]
    more = [r["problem"] for r in compared if r["more_kernels_than_inductor"]]
    if compared:
        out.append(f"- more kernels than Inductor: {len(more)} of {len(compared)} rows"
                   + (f" ({', '.join(more)})" if more else ""))
    t = agent_time_summary(records)     # failed rows count: a timeout is agent time too
    if t["measured"]:
        out.append(f"- agent time per problem ({agent_time_scope(t)}), {plural(t['measured'], 'row')} with a figure: "
                   f"p95 {t['p95']:.1f} s, p50 {t['p50']:.1f} s, max {t['max']:.1f} s")
    out += [f"- {line.strip()}" for line in degraded_lines(ran)]
    m = memory_summary(ran)
    if m["measured"]:
        out.append(f"- peak GPU memory above eager's: {len(m['above_eager'])} of {plural(m['measured'], 'row')} measured"
                   + (f" ({', '.join(above_names(m))})" if m["above_eager"] else ""))
    for r in ran:
        for mode, why in (r.get("compile_errors") or {}).items():
            out.append(f"- {r['problem']}: {mode} left out of the best baseline: {why}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--title", default="bench")
    args = ap.parse_args(argv)
    print("\n".join(markdown(load(args.files), args.title)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
