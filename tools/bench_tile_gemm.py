"""Our tile GEMM (codegen/gemm_mma.py) with its epilogue fused, and the implicit-GEMM convolution
(codegen/gemm_conv.py), against what runs without them, timed in one run on one GPU (fp32, TF32 off):

- the library form + epilogue kernel: cuBLAS / cuDNN through torch in each precision form the agent
  chooses from (fp32; split TF32 as three tensor-core calls, or one over channel-concatenated parts for
  a convolution), then our generated epilogue kernel;
- torch eager, and torch.compile in each asked mode, on the same function.

    python3 tools/bench_tile_gemm.py [--out rows.jsonl] [--only gemm,square,gated,conv] [--compile-modes default,max-autotune]

On sm_90 our forms include the TMA loop's tiles (codegen/gemm_tma.py) where the GEMM takes them.

Cases (issue #16's done-when): epilogue-heavy GEMMs (N <= 4096, then GELU and a row logsumexp), large
square GEMMs (bias only: the GEMM itself against cuBLAS in the same split-TF32 form), gated units after a
linear (chunk(2, -1), value * act(gate): the output's two halves in one tile), and convolutions of
few input channels (2-D and 3-D) followed by pointwise ops. Every form is built with build_region:
compiled, launched and verified against the reference on 5 draws at 1e-4 before it is timed; ours is
the best of the tuner's tile variants (and, for a convolution of a short reduction, the direct
convolution: `"form": "conv-direct"` in a row's params when it won). Each row records our worst error against float64, torch fp32's,
and the speedup over the best other form. Prints a markdown table, the geometric mean per group and
every row below 1.0x.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_core.ir import Program  # noqa: E402

GEMMS = [(4096, 1024, 1024), (8192, 2048, 1024), (4096, 4096, 2048), (16384, 1024, 512), (2048, 4096, 4096)]
SQUARES = [(4096, 4096, 4096), (8192, 8192, 8192)]
# gated units after a linear (M, H, K, act): Stable Diffusion 1.5's GEGLU (2 x 4096 tokens, width 320), a
# Conformer-style GLU, and a SwiGLU over 2048 tokens of width 2048 (inner 5632)
GATED = [(8192, 1280, 320, "gelu"), (12800, 512, 512, "sigmoid"), (2048, 5632, 2048, "silu")]
# (input shape, Cout, kernel, padding, groups): RGB and 8-channel 2-D convolutions, 3-D ones over 3 and 8
# channels, a ResNet 3x3, a pointwise (1x1) one, and ShuffleNet's grouped 1x1
CONVS = [((128, 3, 64, 64), 16, (3, 3), 1, 1), ((64, 8, 128, 128), 64, (3, 3), 0, 1),
         ((32, 3, 16, 64, 64), 16, (3, 3, 3), 0, 1), ((16, 8, 16, 64, 64), 32, (3, 3, 3), 0, 1),
         ((32, 64, 56, 56), 64, (3, 3), 1, 1), ((32, 512, 400), 1024, (1,), 0, 1), ((32, 240, 28, 28), 240, (1, 1), 0, 3)]


def _init(rng, shape, fan_in):
    bound = 1 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


def gemm_case(M, N, K, reduce_rows: bool):
    """x [M, K] -> linear (+ bias) [-> gelu -> logsumexp over the row]; the torch function of it."""
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(0)
    p = Program(f"gemm_{M}x{N}x{K}")
    x = p.add_input("x", (M, K))
    w, b = p.add_parameter("w", _init(rng, (N, K), K)), p.add_parameter("b", _init(rng, (N,), K))
    y = p.add_node("linear", [x.id, w.id, b.id]).outputs[0]
    if reduce_rows:
        g = p.add_node("gelu", [y], {"approximate": "none"}).outputs[0]
        y = p.add_node("logsumexp", [g], {"dim": [-1], "keepdim": False}).outputs[0]

        def fn(x, w, b):
            return torch.logsumexp(F.gelu(F.linear(x, w, b)), -1)
    else:
        fn = F.linear
    p.mark_output(y)
    return p, fn, ("x", "w", "b")


def gated_case(M, H, K, act):
    """x [M, K] -> linear to 2H (+ bias) -> value, gate = chunk(2, -1) -> value * act(gate); the torch
    function of it."""
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(0)
    p = Program(f"gated_{act}_{M}x{H}x{K}")
    x = p.add_input("x", (M, K))
    w, b = p.add_parameter("w", _init(rng, (2 * H, K), K)), p.add_parameter("b", _init(rng, (2 * H,), K))
    y = p.add_node("linear", [x.id, w.id, b.id]).outputs[0]
    value = p.add_node("slice", [y], {"dim": -1, "start": 0, "end": H}).outputs[0]
    gate = p.add_node("slice", [y], {"dim": -1, "start": H, "end": 2 * H}).outputs[0]
    p.mark_output(p.add_node("mul", [value, p.add_node(act, [gate]).outputs[0]]).outputs[0])
    f = {"gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid}[act]

    def fn(x, w, b):
        v, g = F.linear(x, w, b).chunk(2, -1)
        return v * f(g)
    return p, fn, ("x", "w", "b")


def conv_case(x_shape, cout, kernel, padding, groups):
    """x -> conv{d}d (+ bias) -> relu -> * s (per channel) -> tanh; the torch function of it."""
    import torch
    import torch.nn.functional as F
    d = len(kernel)
    rng = np.random.default_rng(0)
    p = Program(f"conv{d}d_{'x'.join(map(str, x_shape))}_to{cout}")
    x = p.add_input("x", x_shape)
    fan = x_shape[1] // groups * math.prod(kernel)
    w = p.add_parameter("w", _init(rng, (cout, x_shape[1] // groups, *kernel), fan))
    b = p.add_parameter("b", _init(rng, (cout,), fan))
    y = p.add_node(f"conv{d}d", [x.id, w.id, b.id], {"stride": [1] * d, "padding": [padding] * d,
                                                      "dilation": [1] * d, "groups": groups}).outputs[0]
    s = p.add_parameter("s", rng.standard_normal((cout,) + (1,) * d).astype(np.float32))
    r = p.add_node("relu", [y]).outputs[0]
    p.mark_output(p.add_node("tanh", [p.add_node("mul", [r, s.id]).outputs[0]]).outputs[0])
    conv = getattr(F, f"conv{d}d")

    def fn(x, w, b, s):
        return torch.tanh(torch.relu(conv(x, w, b, padding=padding, groups=groups)) * s)
    return p, fn, ("x", "w", "b", "s")


def bench_case(group, label, prog, fn, arg_names, modes, time_gpu):
    import torch
    from agent_core.codegen import gemm_tma
    from agent_core.codegen.gemm_mma import FORM, default_params, gemm_spec, tma_alternatives, tune_variants
    from agent_core.codegen.region_io import region_io
    from agent_core.reference import parameter_tensors
    from agent_core.runtime import build_region
    from agent_core.runtime.split_tf32 import TF32X3, TF32X3_CAT, can_concatenate
    nodes = list(prog.nodes)
    anchor = nodes[0]
    torch.manual_seed(0)
    env = {**parameter_tensors(prog, "cuda"),
           prog.inputs[0]: torch.randn(prog.values[prog.inputs[0]].shape, device="cuda")}
    named = {prog.values[v].name: t for v, t in env.items()}
    args = [named[n] for n in arg_names]
    row = {"group": group, "case": label, "forms_ms": {}, "failed": {}}

    def timed(key, build):
        try:
            runner = build()
        except Exception as exc:   # noqa: BLE001 - a form that cannot run here is recorded, not fatal
            row["failed"][key] = f"{type(exc).__name__}: {exc}"[:300]
            return None
        if not runner.fused:
            row["failed"][key] = runner.fallback_reason
            return None
        ins = [env[v] for v in runner.inputs]
        row["forms_ms"][key] = time_gpu(lambda: runner(ins)).median_ms
        return runner

    # the library call in each precision form, then our epilogue kernel (or the call alone)
    lib_forms = ["fp32"] + ([TF32X3] if prog.nodes[anchor].opdef.category != "convolution" else []) + \
        ([TF32X3_CAT] if can_concatenate(prog, anchor) else [])
    for form in lib_forms:
        prog.metadata["library_precision"] = {} if form == "fp32" else {anchor: form}
        if len(nodes) > 1:
            timed(f"library {form} + epilogue", lambda: build_region(prog, nodes, name=f"lib_{form.replace('-', '_')}"))
        else:
            from agent_core.runtime.split_tf32 import run_library_node
            x_env = dict(env)
            row["forms_ms"][f"library {form}"] = time_gpu(lambda: run_library_node(prog, anchor, x_env)).median_ms
    prog.metadata["library_precision"] = {}
    spec = gemm_spec(prog, region_io(prog, nodes))
    best = None
    from agent_core.codegen.conv import direct_alternative
    from agent_core.compiler import default_arch
    tma = tma_alternatives(spec) if gemm_tma.tried_on(default_arch()) else []
    ours = [{**v, "form": FORM} for v in [default_params(spec)] + tma + tune_variants(default_params(spec))]
    ours += direct_alternative(prog, region_io(prog, nodes))     # the direct convolution where the agent tries it
    for j, params in enumerate(ours):
        r = timed(f"ours #{j}", lambda: build_region(prog, nodes, name=f"tile_{j}", params=params))
        if r is not None and (best is None or row["forms_ms"][f"ours #{j}"] < row["forms_ms"][best[0]]):
            best = (f"ours #{j}", r, params)
    row["forms_ms"]["eager"] = time_gpu(lambda: fn(*args)).median_ms
    for mode in modes:
        try:
            cf = torch.compile(fn, mode=mode, dynamic=False)
            cf(*args)
            row["forms_ms"][f"compile {mode}"] = time_gpu(lambda: cf(*args)).median_ms
        except Exception as exc:   # noqa: BLE001 - a mode that fails on this machine is recorded, not fatal
            row["failed"][f"compile {mode}"] = f"{type(exc).__name__}: {exc}"[:300]
    if best is None:
        row["speedup"] = None
        return row
    key, runner, params = best
    ins = [env[v] for v in runner.inputs]
    got = runner(ins)[0].double()
    ref64 = fn(*(a.double() for a in args))
    others = {k: v for k, v in row["forms_ms"].items() if not k.startswith("ours")}
    base = min(others, key=others.get)
    row.update({"ours_ms": row["forms_ms"][key], "ours": key, "params": params, "kernel": "conv-direct" if params["form"] != FORM else params.get("mma", "mma.sync"),
                "best_other": base,
                "best_other_ms": others[base], "speedup": others[base] / row["forms_ms"][key],
                "max_abs_err_vs_fp64": float((got - ref64).abs().max()),
                "torch_fp32_err_vs_fp64": float((fn(*args).double() - ref64).abs().max())})
    lib = {k: v for k, v in others.items() if k.startswith("library")}
    if lib:
        row["vs_best_library"] = min(lib.values()) / row["ours_ms"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tile_gemm_bench.jsonl")
    ap.add_argument("--only", default="gemm,square,gated,conv")
    ap.add_argument("--compile-modes", default="default")
    a = ap.parse_args(argv)
    import torch
    from agent_core.profile.timing import time_gpu
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    modes = [m for m in a.compile_modes.split(",") if m]
    groups = a.only.split(",")
    cases = ([("gemm", f"{M}x{N}x{K} gelu+lse", *gemm_case(M, N, K, True)) for M, N, K in GEMMS] * ("gemm" in groups)
             + [("square", f"{M}x{N}x{K}", *gemm_case(M, N, K, False)) for M, N, K in SQUARES] * ("square" in groups)
             + [("gated", f"{M}x{2 * H}x{K} {act} gate", *gated_case(M, H, K, act)) for M, H, K, act in GATED]
             * ("gated" in groups)
             + [("conv", f"conv{len(k)}d {'x'.join(map(str, s))}->{c}" + (f" g{g}" if g > 1 else ""),
                 *conv_case(s, c, k, pad, g)) for s, c, k, pad, g in CONVS] * ("conv" in groups))
    t0 = time.time()
    rows = []
    with open(a.out, "w") as f:
        for group, label, prog, fn, names in cases:
            row = bench_case(group, label, prog, fn, names, modes, time_gpu)
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"{label}: " + ", ".join(f"{k} {v:.3f}" for k, v in row["forms_ms"].items())
                  + (f"; {row['speedup']:.2f}x over {row['best_other']}" if row.get("speedup") else "; ours failed")
                  + (f"; failed: {row['failed']}" if row["failed"] else ""), flush=True)
    print("\n| group | case | ours ms | best other ms (form) | x best other | x best library | err vs fp64 (torch fp32's) |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        if r.get("speedup") is None:
            print(f"| {r['group']} | {r['case']} | failed | | | | |")
            continue
        print(f"| {r['group']} | {r['case']} | {r['ours_ms']:.3f} | {r['best_other_ms']:.3f} ({r['best_other']}) | "
              f"{r['speedup']:.2f} | {r.get('vs_best_library', float('nan')):.2f} | "
              f"{r['max_abs_err_vs_fp64']:.2g} ({r['torch_fp32_err_vs_fp64']:.2g}) |")
    for g in dict.fromkeys(r["group"] for r in rows):
        sp = [r["speedup"] if r.get("speedup") else 1.0 for r in rows if r["group"] == g]
        below = [r["case"] for r in rows if r["group"] == g and (r.get("speedup") or 0) < 1.0]
        print(f"{g}: geometric mean {math.exp(sum(map(math.log, sp)) / len(sp)):.3f}x over the best other form "
              f"(a failed row counts 1.0x); {len(below)} below 1.0x" + (": " + ", ".join(below) if below else ""))
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
