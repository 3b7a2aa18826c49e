"""Layout kernels against torch on one GPU: pixel_shuffle (r = 2, 3, 4) + a broadcast mean, a
ShuffleNet channel shuffle (cat, view, transpose, view), a channels-last permute and YOLOv5's
detection decode. For each, our kernel is generated per variant (the default and the tile sizes
the tuner tries, agent_core.agent.tune.tune_space), verified against torch on 3 draws (atol = rtol =
1e-4) and timed against torch eager and torch.compile, all with the L2 flushed.

    python3 tools/bench_layout.py --quick        # under 3 minutes on an H200
    python3 tools/bench_layout.py --json layout.jsonl

One table: case, variant, our us, eager us, torch.compile us, floor us (the region's bytes read once
+ written / the measured copy bandwidth), % of floor, schedule. A failing variant prints its error
in its row and the run goes on. Needs torch and cupy only (no PySide6).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RGB_MEAN = (0.4488, 0.4371, 0.4040)


def _node(p, op, ins, attrs=None):
    return p.add_node(op, [v if isinstance(v, str) else v.id for v in ins], attrs or {})


def pixel_shuffle(shape, r):
    """F.pixel_shuffle(x, r) + mean[1, C, 1, 1], as the importer writes it (reshape, permute, reshape)."""
    import numpy as np
    import torch
    from agent_core.ir import Program
    n, c, h, w = shape
    co = c // (r * r)
    p = Program(f"pixel_shuffle_{r}")
    x = p.add_input("x", shape)
    mean = np.resize(np.array(RGB_MEAN, dtype=np.float32), co).reshape(1, co, 1, 1)
    m = p.add_parameter("rgb_mean", data=mean)
    a = _node(p, "reshape", [x], {"shape": [n, co, r, r, h, w]})
    b = _node(p, "permute", [a.outputs[0]], {"dims": [0, 1, 4, 2, 5, 3]})
    c2 = _node(p, "reshape", [b.outputs[0]], {"shape": [n, co, h * r, w * r]})
    d = _node(p, "add", [c2.outputs[0], m])
    p.mark_output(d.outputs[0])
    mt = torch.from_numpy(mean)
    return p, [a.id, b.id, c2.id, d.id], lambda t: torch.nn.functional.pixel_shuffle(t, r) + mt.to(t.device)


def channel_shuffle(shape, groups, cat=True, channels_last=False):
    """ShuffleNetV2: cat(a, b) along channels, then view(n, g, c/g, ...), transpose(1, 2), view back.
    channels_last: the data is [n, h, w, c] and the shuffle runs over the last dim."""
    import torch
    from agent_core.ir import Program
    p = Program("channel_shuffle")
    n, c = shape[0], (shape[-1] if channels_last else shape[1])
    half = list(shape)
    cdim = len(shape) - 1 if channels_last else 1
    half[cdim] = c // 2
    ids = []
    if cat:
        xa, xb = p.add_input("a", half), p.add_input("b", half)
        k = _node(p, "cat", [xa, xb], {"dim": cdim})
        ids.append(k.id)
        cur = k.outputs[0]
    else:
        cur = p.add_input("x", shape).id
    split = list(shape[:cdim]) + [groups, c // groups] + list(shape[cdim + 1:])
    a = _node(p, "reshape", [cur], {"shape": split})
    t = _node(p, "transpose", [a.outputs[0]], {"dim0": cdim, "dim1": cdim + 1})
    b = _node(p, "reshape", [t.outputs[0]], {"shape": list(shape)})
    ids += [a.id, t.id, b.id]
    p.mark_output(b.outputs[0])

    def fn(*ts):
        x = torch.cat(ts, dim=cdim) if cat else ts[0]
        return x.view(split).transpose(cdim, cdim + 1).contiguous().view(list(shape))
    return p, ids, fn


def permute(shape, dims):
    import torch
    from agent_core.ir import Program
    p = Program("permute")
    x = p.add_input("x", shape)
    a = _node(p, "permute", [x], {"dims": list(dims)})
    p.mark_output(a.outputs[0])
    return p, [a.id], lambda t: t.permute(*dims).contiguous()


def detect_decode(small=False):
    """benchmarks/blocks/detect_decode_yolov5.py as imported: every node but the final relabelling
    reshape (the region the planner makes of it)."""
    from agent_core.importers import import_file, load_source
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "blocks", "detect_decode_yolov5.py")
    old = os.environ.get("STITCHCUDA_BLOCKS_SMALL")
    os.environ["STITCHCUDA_BLOCKS_SMALL"] = "1" if small else "0"
    try:
        mod = load_source(path)
        p = import_file(path)
    finally:
        if old is None:
            os.environ.pop("STITCHCUDA_BLOCKS_SMALL", None)
        else:
            os.environ["STITCHCUDA_BLOCKS_SMALL"] = old
    order = p.topo_order()
    ids = order[:-1] if p.nodes[order[-1]].op == "reshape" else order
    model, moved = mod.Model(), {}

    def fn(t):      # moved once: Module.to on every call would be timed as eager's
        if t.device not in moved:
            moved[t.device] = model.to(t.device)
        return moved[t.device](t)
    return p, ids, fn


# name, builder, input shapes, quick
CASES = [
    ("pixel_shuffle_r2", lambda: pixel_shuffle((8, 12, 256, 256), 2), [(8, 12, 256, 256)], True),
    ("pixel_shuffle_r3", lambda: pixel_shuffle((8, 27, 256, 256), 3), [(8, 27, 256, 256)], True),
    ("pixel_shuffle_r4", lambda: pixel_shuffle((8, 48, 256, 256), 4), [(8, 48, 256, 256)], True),
    ("channel_shuffle_nchw", lambda: channel_shuffle((64, 232, 28, 28), 2), [(64, 116, 28, 28)] * 2, True),
    ("channel_shuffle_nhwc", lambda: channel_shuffle((64, 28, 28, 232), 2, channels_last=True),
     [(64, 28, 28, 116)] * 2, False),
    ("permute_0231", lambda: permute((32, 256, 56, 56), (0, 2, 3, 1)), [(32, 256, 56, 56)], True),
    ("detect_decode_yolov5", lambda: detect_decode(), [(16, 3, 80, 80, 85)], True),
]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]


def variant_label(params) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items() if k != "sm_count") if params else "default"


def run_case(name, builder, shapes, args, bw_gbs, emit):
    import torch
    from agent_core.agent.tune import tune_space
    from agent_core.codegen import generate_kernel
    from agent_core.profile.timing import time_gpu
    from agent_core.reference import parameter_tensors
    from agent_core.runtime import build_region
    p, ids, fn = builder()
    xs = [torch.randn(s, device="cuda") for s in shapes]
    row = {"case": name, "shape": list(shapes[0])}
    ks0 = generate_kernel(p, ids, name=f"layout_{name}")
    floor_us = ks0.bytes_moved / (bw_gbs * 1e9) * 1e6
    row["floor_us"] = floor_us
    with torch.no_grad():
        try:
            row["eager_us"] = time_gpu(lambda: fn(*xs), trials=args.trials).median_ms * 1e3
        except Exception as exc:
            row["eager_us"], row["eager_error"] = None, first_line(exc)
        row["compile_us"] = None
        if not args.no_compile:
            try:
                torch._dynamo.reset()
                cfn = torch.compile(fn, dynamic=False)
                cfn(*xs)
                row["compile_us"] = time_gpu(lambda: cfn(*xs), trials=args.trials).median_ms * 1e3
            except Exception as exc:
                row["compile_error"] = first_line(exc)
    params_t = parameter_tensors(p, "cuda")
    by_input = dict(zip(p.inputs, xs))
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    for params in [None] + tune_space(ks0, sm_count=sm, limit=args.variants):
        rec = {**row, "variant": variant_label(params)}
        try:
            r = build_region(p, ids, name=f"layout_{name}", params=params, draws=3)
            rec["schedule"] = r.kernel.schedule if r.kernel else None
            if not r.fused:
                raise RuntimeError(r.fallback_reason or "not fused")
            ins = [by_input[v] if v in by_input else params_t[v].contiguous() for v in r.kernel.inputs]
            outs = [torch.empty(s, dtype=getattr(torch, d), device="cuda") for s, d in r.loaded.specs]
            with torch.no_grad():
                want = fn(*xs)
                r.loaded(ins, outs)
                torch.testing.assert_close(outs[0].reshape(want.shape), want, atol=1e-4, rtol=1e-4)
            ours = time_gpu(r.loaded.bind(ins, outs), trials=args.trials).median_ms * 1e3
            rec.update(ours_us=ours, pct_of_floor=100.0 * floor_us / ours, registers=r.loaded.registers,
                       local_bytes=r.loaded.local_bytes)
        except Exception as exc:
            rec["error"] = first_line(exc)
            if args.verbose:
                traceback.print_exc()
        emit(rec)


def fmt(v, spec="{:.1f}"):
    return "-" if v is None else spec.format(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the marked subset of cases (under 3 minutes)")
    ap.add_argument("--cases", default="", help="only cases whose name contains one of these comma-separated words")
    ap.add_argument("--variants", type=int, default=6, help="tuning variants per case besides the default (6)")
    ap.add_argument("--trials", type=int, default=20, help="timed trials per measurement (median; 20)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--json", help="append one JSON line per (case, variant) here")
    ap.add_argument("--verbose", action="store_true", help="print the traceback of a failing variant")
    args = ap.parse_args(argv)

    import torch
    if not torch.cuda.is_available():
        print("bench_layout: no CUDA GPU; nothing to measure", file=sys.stderr)
        return 2
    from agent_core.profile.baselines import strict_fp32
    from agent_core.profile.hardware import measure_copy_bandwidth
    strict_fp32()
    bw = measure_copy_bandwidth(2**28)
    words = [w for w in args.cases.split(",") if w]
    cases = [c for c in CASES if (c[3] or not args.quick) and (not words or any(w in c[0] for w in words))]
    print(f"GPU {torch.cuda.get_device_name(0)}, copy bandwidth {bw:.0f} GB/s, {len(cases)} cases")
    head = (f"{'case':<24} {'shape':<18} {'variant':<28} {'ours us':>9} {'eager us':>9} {'compile us':>10} "
            f"{'floor us':>9} {'% floor':>8}  schedule / error")
    print(head)
    print("-" * len(head))
    out = open(args.json, "a") if args.json else None

    def emit(rec):
        print(f"{rec['case']:<24} {'x'.join(map(str, rec['shape'])):<18} {rec['variant'][:28]:<28} "
              f"{fmt(rec.get('ours_us')):>9} {fmt(rec.get('eager_us')):>9} {fmt(rec.get('compile_us')):>10} "
              f"{fmt(rec.get('floor_us')):>9} {fmt(rec.get('pct_of_floor'), '{:.0f}%'):>8}  "
              f"{rec.get('error') or rec.get('schedule') or ''}", flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()

    t0 = time.time()
    for name, builder, shapes, _ in cases:
        try:
            run_case(name, builder, shapes, args, bw, emit)
        except Exception as exc:   # one case's failure is that case's row, never the run's
            emit({"case": name, "shape": list(shapes[0]), "variant": "-", "error": first_line(exc)})
        torch.cuda.empty_cache()
    print(f"done in {time.time() - t0:.0f} s")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
