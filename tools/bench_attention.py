"""Our fused attention kernel against torch's SDPA (the best fp32 backend, TF32 off) and torch.compile
of the same call, over batch x heads x seq x head_dim (seq 128..8192, causal or not, with or without a
padding mask, head dims 64 and 128), timed in one run with CUDA events (agent_core/profile/timing.py).

    python3 tools/bench_attention.py [--out rows.jsonl] [--max-autotune] [--forms 3xtf32,fp32] [--quick] [--tune]
                                     [--seqs 8192] [--dims 128]

Each row: our best form's ms, torch SDPA's best backend and ms, torch.compile's ms, the worst error of
ours against float64 (on a slice of the batch), and the speedup over the better of SDPA and compile.
Prints a markdown table, the geometric mean and the rows below 1.0x.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_core.codegen import generate_kernel  # noqa: E402
from agent_core.codegen.attention_cases import Case, attention_program, reference, reference_inputs  # noqa: E402

# the same token count per row of the grid (batch x heads shrink as the sequence grows)
SEQS = {128: (16, 16), 512: (8, 16), 2048: (2, 16), 8192: (1, 8)}


def grid(quick: bool, seqs=None, dims=(64, 128)) -> list[Case]:
    out = []
    for seq, (b, h) in SEQS.items():
        if (quick and seq > 2048) or (seqs and seq not in seqs):
            continue
        for d in dims:
            for mask in (None, "causal", "padding"):
                out.append(Case(b, h, seq, seq, d, mask=mask))
    return out


def sdpa_fn(case, named):
    import torch.nn.functional as F
    q, k, v, m = named["q"], named["k"], named["v"], named.get("mask")
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=case.mask == "causal")


def best_sdpa(case, named, time_gpu):
    """(ms, backend) of torch's fastest SDPA backend that runs this fp32 case."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    best = (math.inf, "none")
    fn = sdpa_fn(case, named)
    for be in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
        try:
            with sdpa_kernel([be]):
                fn()
                t = time_gpu(fn).median_ms
        except Exception:   # noqa: BLE001 - a backend that does not take fp32 or this mask
            continue
        best = min(best, (t, be.name.lower()))
    return best


def compiled_ms(case, named, time_gpu, mode):
    import torch
    import torch.nn.functional as F

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=case.mask == "causal")
    cf = torch.compile(f, mode=mode, dynamic=False)
    args = (named["q"], named["k"], named["v"], named.get("mask"))
    cf(*args)
    return time_gpu(lambda: cf(*args)).median_ms


def worst_error(case, prog, ks, loaded, ins):
    """Max |ours - float64| over the output (the float64 reference on the GPU, batch element 0)."""
    import torch
    out = loaded(ins)[0]
    named = {prog.values[v].name: t for v, t in zip(ks.inputs, ins)}
    one = {k: t[:1] for k, t in named.items()}
    ref = reference(case, one, dtype=torch.float64)
    return float((out[:1].double() - ref).abs().max()), float(((out[:1].double() - ref).abs() - 1e-4 * ref.abs()).max())


def _compile(job) -> None:
    from agent_core.compiler import compile_source
    compile_source(*job)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="attention_bench.jsonl")
    ap.add_argument("--forms", default="3xtf32")
    ap.add_argument("--max-autotune", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tune", action="store_true", help="also time the tuner's tile / warp variants")
    ap.add_argument("--seqs", default="", help="only these sequence lengths of the grid (comma-separated)")
    ap.add_argument("--dims", default="64,128", help="only these head dims of the grid")
    a = ap.parse_args(argv)
    import torch
    from agent_core.profile.timing import time_gpu
    from agent_core.runtime.launch import load_kernel
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    seqs = [int(x) for x in a.seqs.split(",") if x]
    cases, forms = grid(a.quick, seqs, tuple(int(x) for x in a.dims.split(","))), a.forms.split(",")
    t0 = time.time()
    jobs = {}
    for c in cases:
        prog, nodes = attention_program(c)
        for form in forms:
            jobs[(c, form)] = (prog, generate_kernel(prog, nodes, name=f"bench_{form}", params={"form": form}))
            if a.tune and form == "3xtf32":   # the tuner's variants of the tensor-core form, as the agent tries them
                from agent_core.codegen.attention import tune_variants
                for j, params in enumerate(v for v in tune_variants(jobs[(c, form)][1].params) if v["form"] == form):
                    try:
                        jobs[(c, f"{form}#{j + 1}")] = (prog, generate_kernel(prog, nodes, name=f"bench_{form}_{j}",
                                                                                params=params))
                    except Exception:   # noqa: BLE001 - a variant that does not fit (shared memory)
                        pass
    with ProcessPoolExecutor(12) as pool:   # NVRTC compiles in parallel (the disk cache serves the loads below)
        list(pool.map(_compile, [(ks.source, ks.name) for _, ks in jobs.values()]))
    print(f"compiled {len(jobs)} kernels in {time.time() - t0:.0f} s", flush=True)
    rows = []
    mode = "max-autotune" if a.max_autotune else "default"
    with open(a.out, "w") as f:
        for c in cases:
            ours = {}
            prog = jobs[(c, forms[0])][0]
            ins = reference_inputs(c, prog, jobs[(c, forms[0])][1].inputs, device="cuda")
            err = excess = None
            for form in [f for (cc, f) in jobs if cc == c]:
                ks = jobs[(c, form)][1]
                loaded = load_kernel(ks, prog)
                outs = loaded.bind(ins, [torch.empty(s, dtype=torch.float32, device="cuda") for s, _ in loaded.specs])
                ours[form] = time_gpu(outs).median_ms
                e, x = worst_error(c, prog, ks, loaded, ins)
                err, excess = max(err or 0.0, e), max(excess if excess is not None else -1.0, x)
            named = {prog.values[v].name: t for v, t in zip(jobs[(c, forms[0])][1].inputs, ins)}
            sdpa, backend = best_sdpa(c, named, time_gpu)
            try:
                comp = compiled_ms(c, named, time_gpu, mode)
            except Exception as exc:   # noqa: BLE001
                print(f"torch.compile failed for {c.label()}: {exc}", flush=True)
                comp = math.inf
            form = min(ours, key=ours.get)
            base = min(sdpa, comp)
            row = {"case": c.label(), "B": c.B, "H": c.H, "seq": c.L, "head_dim": c.E, "mask": c.mask or "none",
                   "ours_ms": ours[form], "form": form, "params": jobs[(c, form)][1].params, "forms_ms": ours, "sdpa_ms": sdpa, "sdpa_backend": backend,
                   "compile_ms": comp, "compile_mode": mode, "speedup": base / ours[form],
                   "max_abs_err_vs_fp64": err, "excess_over_1e-4": excess}
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"{c.label()}: ours {ours[form]:.3f} ms ({form}), sdpa {sdpa:.3f} ({backend}), compile {comp:.3f}, "
                  f"{row['speedup']:.2f}x, err {err:.2g}", flush=True)
    print("\n| B x H | seq | d | mask | ours ms (form) | SDPA ms (backend) | compile ms | speedup | max err vs fp64 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['B']}x{r['H']} | {r['seq']} | {r['head_dim']} | {r['mask']} | {r['ours_ms']:.3f} ({r['form']}) | "
              f"{r['sdpa_ms']:.3f} ({r['sdpa_backend']}) | {r['compile_ms']:.3f} | {r['speedup']:.2f}x | "
              f"{r['max_abs_err_vs_fp64']:.2g} |")
    gm = math.exp(sum(math.log(r["speedup"]) for r in rows) / max(len(rows), 1))
    below = [r["case"] for r in rows if r["speedup"] < 1.0]
    print(f"\ngeometric mean {gm:.3f}x over the best of SDPA and torch.compile; {len(below)} row(s) below 1.0x"
          + (": " + ", ".join(below) if below else ""))
    print(f"worst error vs float64: {max(r['max_abs_err_vs_fp64'] for r in rows):.3g}; total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
