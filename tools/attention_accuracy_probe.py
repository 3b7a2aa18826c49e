"""Our fused attention kernel on the q, k, v an nn.MultiheadAttention makes from inputs in [0, 1) (as
KernelBench's vision attention draws them: a flat softmax over long rows of same-signed values, unlike
the randn draws of tests/gpu/test_attention_gpu.py), each form against float64, next to torch's fp32
paths, and the error after the out-projection, the residual and a LayerNorm (what the program's
end-to-end check compares at 1e-4).

    python tools/attention_accuracy_probe.py --seq 16384 --embed 128 --heads 4 --batch 2
"""
from __future__ import annotations

import argparse
import json


def _fp64_attention(q, k, v, chunk=2048):
    import torch
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    scale = q.shape[-1] ** -0.5
    for b in range(q.shape[0]):
        kb, vb = k[b].double(), v[b].double()
        for i in range(0, q.shape[1], chunk):
            s = (q[b, i:i + chunk].double() @ kb.T) * scale
            out[b, i:i + chunk] = s.softmax(-1) @ vb
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--embed", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--variants", default="3xtf32,3xtf32:tile_acc=0,fp32")
    ap.add_argument("--time", action="store_true")
    a = ap.parse_args(argv)
    import torch
    from agent_core.codegen import generate_kernel
    from agent_core.codegen.attention_cases import Case, attention_program
    from agent_core.runtime.launch import load_kernel
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    T, B, E, H = a.seq, a.batch, a.embed, a.heads
    D = E // H
    mha = torch.nn.MultiheadAttention(E, H).cuda()
    norm = torch.nn.LayerNorm(E).cuda()
    x = torch.rand(T, B, E, device="cuda")
    with torch.no_grad():
        qkv = torch.nn.functional.linear(x, mha.in_proj_weight, mha.in_proj_bias)
        q, k, v = (t.reshape(T, B * H, D).transpose(0, 1).contiguous() for t in qkv.chunk(3, -1))
        ref = _fp64_attention(q, k, v)

        def finish(o):   # [B*H, T, D] -> the block's output (out-projection, residual, LayerNorm)
            o = o.float().transpose(0, 1).reshape(T * B, E)
            return norm(torch.nn.functional.linear(o, mha.out_proj.weight, mha.out_proj.bias).view(T, B, E) + x)

        final_ref = finish(ref)
        math_path = torch.bmm((q * D ** -0.5), k.transpose(1, 2)).softmax(-1) @ v if T <= 16384 else None
        rows = []

        def report(name, o, ms=None):
            err = (o.double() - ref).abs()
            fin = (finish(o).double() - final_ref.double()).abs()
            row = {"variant": name, "max_abs_err": float(err.max()), "mean_signed_err": float((o.double() - ref).mean()),
                   "excess_1e-4": float((err - 1e-4 * ref.abs()).max()),
                   "after_layernorm_max_abs_err": float(fin.max()),
                   "after_layernorm_excess_1e-4": float((fin - 1e-4 * final_ref.double().abs()).max()), "ms": ms}
            rows.append(row)
            print(json.dumps(row), flush=True)

        report("torch sdpa fp32", torch.nn.functional.scaled_dot_product_attention(q, k, v))
        if math_path is not None:
            report("torch bmm-softmax-bmm fp32", math_path)
            del math_path
        torch.cuda.empty_cache()
        prog, nodes = attention_program(Case(1, B * H, T, T, D))
        for spec in a.variants.split(","):
            form, _, extra = spec.partition(":")
            params = {"form": form}
            for kv in filter(None, extra.split(";")):
                key, val = kv.split("=")
                params[key] = int(val) if val.lstrip("-").isdigit() else val
            if "tile_acc" in params:
                params["tile_acc"] = bool(params["tile_acc"])
            ks = generate_kernel(prog, nodes, name="probe_" + form, params=params)
            loaded = load_kernel(ks, prog)
            ins = [t.unsqueeze(0).contiguous() for t in (q, k, v)]
            out = loaded(ins)[0][0]
            ms = None
            if a.time:
                from agent_core.profile.timing import time_gpu
                outs = loaded.bind(ins, [torch.empty(s, dtype=torch.float32, device="cuda") for s, _ in loaded.specs])
                ms = time_gpu(outs).median_ms
            report(f"ours {spec} {ks.params}", out, ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
