"""What tools/bench_rows.py and tools/bench_layout.py share: time one region's generated kernel, in every
tuning variant the agent would try, against torch eager, torch.compile and the bytes floor, and print
one row per (case, variant). GPU only (torch + cupy); a failing variant or case is its own row with its
error, never the end of the run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]


def variant_label(params) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items() if k != "sm_count") if params else "default"


def fmt(v, spec="{:.1f}"):
    return "-" if v is None else spec.format(v)


def survey_region(p, ids, fn, xs, row: dict, args, bw_gbs: float, emit, *, prefix: str,
                  check_fn: bool = False) -> None:
    """Emit one record per tuning variant of the region `ids` of program `p`. `fn(*xs)` is the torch
    code it replaces (xs: the program's inputs, drawn); `row` holds the case's own fields. Every
    variant is verified by build_region on 3 draws; check_fn also compares its first output with fn's."""
    import torch
    from agent_core.agent.tune import tune_space
    from agent_core.codegen import generate_kernel
    from agent_core.profile.timing import time_gpu
    from agent_core.reference import parameter_tensors
    from agent_core.runtime import build_region
    ks0 = generate_kernel(p, ids, name=f"{prefix}_{row['case']}")
    floor_us = ks0.bytes_moved / (bw_gbs * 1e9) * 1e6
    row = {**row, "floor_us": floor_us, "compile_us": None}
    with torch.no_grad():
        try:
            row["eager_us"] = time_gpu(lambda: fn(*xs), trials=args.trials).median_ms * 1e3
        except Exception as exc:
            row["eager_us"], row["eager_error"] = None, first_line(exc)
        if not args.no_compile:
            try:
                torch._dynamo.reset()
                cfn = torch.compile(fn, dynamic=False)
                cfn(*xs)
                row["compile_us"] = time_gpu(lambda: cfn(*xs), trials=args.trials).median_ms * 1e3
            except Exception as exc:
                row["compile_error"] = first_line(exc)
    tensors = {**parameter_tensors(p, "cuda"), **dict(zip(p.inputs, xs))}
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    for params in [None] + tune_space(ks0, sm_count=sm, limit=args.variants):
        rec = {**row, "variant": variant_label(params)}
        try:
            r = build_region(p, ids, name=ks0.name, params=params, draws=3)
            rec["schedule"] = r.kernel.schedule if r.kernel else None
            if not r.fused:
                raise RuntimeError(r.fallback_reason or "not fused")
            ins = [tensors[v].contiguous() for v in r.kernel.inputs]
            outs = [torch.empty(s, dtype=getattr(torch, d), device="cuda") for s, d in r.loaded.specs]
            if check_fn:
                with torch.no_grad():
                    want = fn(*xs)
                    r.loaded(ins, outs)
                    torch.testing.assert_close(outs[0].reshape(want.shape), want, atol=1e-4, rtol=1e-4)
            ours = time_gpu(r.loaded.bind(ins, outs), trials=args.trials).median_ms * 1e3
            rec.update(ours_us=ours, pct_of_floor=100.0 * floor_us / ours, registers=r.loaded.registers,
                       local_bytes=r.loaded.local_bytes)   # local bytes: spills and stack
        except Exception as exc:
            rec["error"] = first_line(exc)
            if args.verbose:
                traceback.print_exc()
        emit(rec)


def main(argv, *, tool: str, doc: str, cases: list, quick: str, run, widths=(26, 22, 22)) -> int:
    """The command line both tools share. cases: tuples whose first field is the name and last the
    --quick flag; run(case, args, bw_gbs, emit) emits the case's rows; quick: --quick's help text."""
    ap = argparse.ArgumentParser(prog=tool, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"the marked subset of cases ({quick})")
    ap.add_argument("--cases", default="", help="only cases whose name contains one of these comma-separated words")
    ap.add_argument("--variants", type=int, default=6, help="tuning variants per case besides the default (6)")
    ap.add_argument("--trials", type=int, default=20, help="timed trials per measurement (median; 20)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--json", help="append one JSON line per (case, variant) here")
    ap.add_argument("--verbose", action="store_true", help="print the traceback of a failing variant")
    args = ap.parse_args(argv)

    import torch
    if not torch.cuda.is_available():
        print(f"{tool}: no CUDA GPU; nothing to measure", file=sys.stderr)
        return 2
    from agent_core.profile.baselines import strict_fp32
    from agent_core.profile.hardware import measure_copy_bandwidth
    strict_fp32()
    bw = measure_copy_bandwidth(2**28)
    words = [w for w in args.cases.split(",") if w]
    chosen = [c for c in cases if (c[-1] or not args.quick) and (not words or any(w in c[0] for w in words))]
    print(f"GPU {torch.cuda.get_device_name(0)}, copy bandwidth {bw:.0f} GB/s, {len(chosen)} cases")
    wc, ws, wv = widths
    head = (f"{'case':<{wc}} {'shape':<{ws}} {'variant':<{wv}} {'ours us':>9} {'eager us':>9} {'compile us':>10} "
            f"{'floor us':>9} {'% floor':>8}  schedule / error")
    print(head)
    print("-" * len(head))
    out = open(args.json, "a") if args.json else None

    def emit(rec):
        print(f"{rec['case']:<{wc}} {'x'.join(map(str, rec['shape'])):<{ws}} {rec['variant'][:wv]:<{wv}} "
              f"{fmt(rec.get('ours_us')):>9} {fmt(rec.get('eager_us')):>9} {fmt(rec.get('compile_us')):>10} "
              f"{fmt(rec.get('floor_us')):>9} {fmt(rec.get('pct_of_floor'), '{:.0f}%'):>8}  "
              f"{rec.get('error') or rec.get('schedule') or ''}", flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()

    t0 = time.time()
    for case in chosen:
        try:
            run(case, args, bw, emit)
        except Exception as exc:   # one case's failure is that case's row, never the run's
            emit({"case": case[0], "shape": [], "variant": "-", "error": first_line(exc)})
        torch.cuda.empty_cache()
    print(f"done in {time.time() - t0:.0f} s")
    if out:
        out.close()
    return 0
