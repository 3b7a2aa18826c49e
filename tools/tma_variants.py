"""Which form of the TMA main loop (codegen/gemm_tma.py) runs fastest, each verified and timed against
cuBLAS's TF32 GEMM over the split parts concatenated along K (the library's split-TF32 form: alone, and
with the input's split as a run pays it, the weight's parts cached) and torch's fp32 GEMM, TF32 off.
Each variant is built with build_region (5 draws at 1e-4), timed through its bound launcher, and its
worst error against float64 printed beside torch fp32's. Shapes are M x N x K.

    python3 tools/tma_variants.py [--shapes 4096x4096x4096,...] [--variants '{"sum_slices": 1}',...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = "4096x4096x4096,8192x8192x8192,4096x4096x1024,8192x2048x1024,394x2048x512"
VARIANTS = ['{"sum_slices": 1}', '{"sum_slices": 2}']


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--variants", nargs="*", default=VARIANTS)
    ap.add_argument("--tiles", default="128:4,64:6", help="block_n:stages,...")
    args = ap.parse_args(argv)
    import torch
    from agent_core.codegen.gemm_mma import FORM
    from agent_core.codegen import gemm_tma
    from agent_core.profile.baselines import strict_fp32
    from agent_core.reference import parameter_tensors
    from agent_core.profile.timing import time_gpu
    from agent_core.runtime import build_region
    from agent_core.runtime.split_tf32 import A_LO, split_cat_into, split_tf32
    from tests.test_gemm_epilogue import program
    strict_fp32()
    for shape in args.shapes.split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        p = program(M, N, K)
        tensors = parameter_tensors(p, "cuda")
        by = {p.values[v].name: t for v, t in tensors.items()}
        x = torch.randn(M, K, device="cuda")
        w, b, s = by["w"], by["b"], by["s"]
        exact = torch.tanh(torch.relu(x.double() @ w.double().T + b.double()) * s.double())
        torch_err = (torch.tanh(torch.relu(torch.nn.functional.linear(x, w, b)) * s).double() - exact).abs().max().item()
        fp32_ms = time_gpu(lambda: x @ w.T).median_ms
        xh, xl = split_tf32(x)
        wh, wl = split_tf32(w)
        xc, wc = torch.cat([xl, xh, xh], 1), torch.cat([wh, wh, wl], 1)
        xbuf = torch.empty(M, 3 * K, device="cuda")
        torch.backends.cuda.matmul.allow_tf32 = True
        cat_ms = time_gpu(lambda: xc @ wc.T).median_ms
        # the library's split-TF32 form as a run calls it: the input split into its parts, the weight's cached
        lib_ms = time_gpu(lambda: (split_cat_into(x, xbuf, 1, A_LO), xbuf @ wc.T)).median_ms
        torch.backends.cuda.matmul.allow_tf32 = False
        print(f"{M}x{N}x{K}: cuBLAS fp32 {fp32_ms:.3f} ms, TF32 over concatenated parts {cat_ms:.3f} ms, with the "
              f"input's split {lib_ms:.3f} ms; torch fp32 error {torch_err:.2e}", flush=True)
        for tile in args.tiles.split(","):
            bn, st = (int(v) for v in tile.split(":"))
            for v in args.variants:
                var = json.loads(v)
                params = {**gemm_tma.variants({"form": FORM})[0], "block_n": bn, "stages": st, **var}
                try:
                    r = build_region(p, list(p.nodes), name="tma_variant", params=params)
                except Exception as exc:    # noqa: BLE001 - a variant that fails is reported, not fatal
                    print(f"  {bn}:{params['stages']} {v}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                    continue
                if not r.fused:
                    print(f"  {bn}:{params['stages']} {v}: fell back: {r.fallback_reason[:400]}", flush=True)
                    continue
                ins = [x if vv == p.inputs[0] else tensors[vv] for vv in r.inputs]
                out = torch.empty(M, N, device="cuda")
                launch = r.loaded.bind(ins, [out])
                ms = time_gpu(launch, trials=30).median_ms
                launch()
                err = (out.double() - exact).abs().max().item()
                print(f"  {bn}:{params['stages']} {v}: {ms:.3f} ms, {cat_ms / ms:.3f}x cuBLAS split TF32 ({lib_ms / ms:.3f}x "
                      f"with its input split), "
                      f"{fp32_ms / ms:.2f}x fp32; error {err:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
