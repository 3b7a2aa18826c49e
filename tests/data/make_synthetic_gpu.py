"""Builds tests/data/mlp_small_gpu_synthetic/ from the real CPU recording in mlp_small_cpu/.

The CPU run's events are kept as they were recorded; the GPU-only events (hardware log, verify,
tune-step, profile of regions, program and baselines) are inserted where agent_core/agent/loop.py
emits them, with the fields it emits, and profile.json gets the shape optimize writes on a GPU.
The timings are made up (plausible H200 numbers for a tiny MLP): this fixture exercises the studio's
plots until a log recorded on the H200 replaces it. Run: python tests/data/make_synthetic_gpu.py
"""
import copy
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
SRC, DST = os.path.join(HERE, "mlp_small_cpu"), os.path.join(HERE, "mlp_small_gpu_synthetic")
HW = {"name": "synthetic H200 (hand-made test data, not a measurement)", "compute_capability": "9.0", "sm_count": 132, "copy_bandwidth_gbs": 4200.0}
# region -> (default ms, trial ms (None = rejected), unfused ms, bytes, flops)
TIMES = {"r1": (0.0046, [0.0049, 0.0043, None, 0.0044, 0.0047], 0.0071, 8448, 32768),
         "r2": (0.0045, [0.0047, 0.0042, 0.0044, None, 0.0046], 0.0069, 8448, 32768)}
LIB_MS = {"r3": 0.0038}


def attribution(ms, nbytes, flops):
    floor = max(nbytes / 4200e9 * 1e3, flops / 51e12 * 1e3)
    return {"ms": ms, "bound": "launch", "floor_ms": floor, "pct_of_floor": 100 * floor / ms,
            "achieved_gbs": nbytes / (ms * 1e-3) / 1e9, "achieved_tflops": flops / (ms * 1e-3) / 1e12,
            "bytes": nbytes, "flops": flops, "registers": 32, "shared_bytes": 0, "local_bytes": 0}


def main():
    if os.path.isdir(DST):
        shutil.rmtree(DST)
    shutil.copytree(SRC, DST)
    events = [json.loads(x) for x in open(os.path.join(SRC, "events.jsonl"))]
    out, t = [], 0.0
    prof = json.load(open(os.path.join(SRC, "profile.json")))
    prof.update(gpu=True, status="done", hardware=HW)

    def ev(name, **f):
        nonlocal t
        t += 0.05
        out.append({"v": 1, "event": name, "t": round(t, 6), **f})

    for e in events:
        t = max(t, e["t"])
        if e["event"] == "log" and e.get("no_gpu"):
            continue
        if e["event"] == "done":
            ev("verify", scope="program", ok=True, draws=5, max_abs_err=2.4e-7, reason=None)
            ev("profile", scope="program", ms=0.0139, floor_ms=0.0021, achieved_gbs=2.2, launches=5,
               cuda_graph=True, arena_bytes=6144)
            for key, ms in (("eager", 0.0318), ("compile_default", 0.0291), ("compile_reduce-overhead", 0.0167)):
                ev("profile", scope="baseline", baseline=key, ms=ms, ok=True, error=None)
            ev("done", status="done", regions=3, outcomes={"fused": 2, "library": 1}, ours_ms=0.0139,
               out_dir=None)
            continue
        if e["event"] == "log" and e.get("status") == "compiled":
            rid = e["region"]
            d, trials, unf, nb, fl = TIMES[rid]
            kernel = f"mlp_small_{rid}"
            ev("verify", scope="region", region=rid, kernel=kernel, ok=True, draws=5, max_abs_err=1.2e-7,
               candidate="default")
            ev("tune-step", region=rid, trial=0, params={"block": 256, "vector_width": 4}, ok=True, ms=d, best=True)
            best = d
            recs = [{"trial": 0, "params": {"block": 256, "vector_width": 4}, "ms": d, "ok": True}]
            for i, ms in enumerate(trials, 1):
                params = {"block": [128, 256, 512, 64, 1024][i - 1], "vector_width": 4 if i % 2 else 2}
                if ms is None:
                    rec = {"trial": i, "params": params, "ok": False, "best": False,
                           "reason": "value 0, draw 0, element 17: 0.5 vs 0.25 (tolerance 1e-05)"}
                    ev("verify", scope="region", region=rid, kernel=kernel, ok=False, draws=1,
                       candidate=f"trial {i}", reason=rec["reason"])
                else:
                    ev("verify", scope="region", region=rid, kernel=kernel, ok=True, draws=1,
                       max_abs_err=1e-7, candidate=f"trial {i}")
                    rec = {"trial": i, "params": params, "ok": True, "ms": ms, "best": ms < best}
                    best = min(best, ms)
                ev("tune-step", region=rid, **rec)
                recs.append(rec)
            ev("verify", scope="region", region=rid, kernel=kernel, ok=True, draws=5, max_abs_err=1.2e-7,
               candidate="tuned best")
            att = attribution(best, nb, fl)
            ev("profile", scope="region", region=rid, kernel=kernel, unfused_ms=unf,
               **{k: v for k, v in att.items()})
            reason = (f"verified on 5 draws and {unf / best:.2f}x faster than its 2 unfused op(s) "
                      f"({best * 1e3:.1f} us vs {unf * 1e3:.1f} us)")
            ev("log", level="info", message=f"region {rid}: fused: {reason}", region=rid, status="fused")
            for r in prof["regions"]:
                if r["region"] == rid:
                    r.update(status="fused", reason=reason, fused_ms=best, unfused_ms=unf, attribution=att,
                             trials=recs, params=recs[0]["params"])
            continue
        out.append(e)
        if e["event"] == "region-proposed" and e["region"] == "r3":
            ev("log", level="info", message=f"GPU: {HW['name']}, 132 SMs, copy bandwidth 4200 GB/s", hardware=HW)
    prof["end_to_end"] = {"ms": 0.0139, "bound": "launch", "floor_ms": 0.0021, "pct_of_floor": 15.1,
                          "achieved_gbs": 2.2, "correct": True, "launches": 5, "cuda_graph": True}
    prof["baselines"] = {"eager": {"ok": True, "ms": 0.0318}, "compile_default": {"ok": True, "ms": 0.0291},
                         "compile_reduce-overhead": {"ok": True, "ms": 0.0167}}
    prof["speedup_vs_eager"], prof["speedup_vs_compile"] = 0.0318 / 0.0139, 0.0167 / 0.0139
    with open(os.path.join(DST, "events.jsonl"), "w") as f:
        f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in out)
    with open(os.path.join(DST, "profile.json"), "w") as f:
        json.dump(prof, f, indent=1)
    pj = json.load(open(os.path.join(DST, "program.json")))
    for r in pj.get("regions", []):
        if r["id"] in TIMES:
            o = next(x for x in prof["regions"] if x["region"] == r["id"])
            r["measured_ms"] = o["fused_ms"]
            r["schedule"]["agent"] = {k: o[k] for k in ("status", "reason", "kernel", "source_path", "params",
                                                        "fused_ms", "unfused_ms")}
            r["log"].append({"time": "2026-11-30T00:00:00Z", "actor": "agent", "action": "kept",
                             "message": o["reason"]})
    with open(os.path.join(DST, "program.json"), "w") as f:
        json.dump(pj, f, indent=1)


if __name__ == "__main__":
    main()
