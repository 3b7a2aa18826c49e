"""Bandwidth of generated pointwise and row-reduction kernels on large shapes, against the device's
measured copy bandwidth and torch eager, timed the same way (CUDA events, warm-up, L2 flushed
between trials, median of 20).

    PYTHONPATH=. python3 tools/bench_kernels.py [--json OUT.json] [--numel 268435456]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from agent_core.codegen import generate_kernel
from agent_core.ir import Program
from agent_core.runtime.launch import load_kernel

TRIALS, WARMUP = 20, 3


def timed(fn, flush) -> float:
    """Median milliseconds of fn over TRIALS runs, L2 flushed before each."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(TRIALS):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def case(name, build, eager, shapes):
    """build(program) -> (node ids, output node); eager(*tensors) -> the torch result."""
    p = Program(name)
    ins = [p.add_input(f"in{k}", s) for k, s in enumerate(shapes)]
    ids, out = build(p, [v.id for v in ins])
    p.mark_output(out)
    return p, ids, eager


def pw_relu(p, ins):
    n = p.add_node("relu", ins)
    return [n.id], n.outputs[0]


def pw_chain(p, ins):
    a = p.add_node("add", ins)
    g = p.add_node("gelu", [a.outputs[0]])
    m = p.add_node("mul_scalar", [g.outputs[0]], {"value": 2.0})
    return [a.id, g.id, m.id], m.outputs[0]


def row(op, **attrs):
    def build(p, ins):
        a = dict(attrs)
        if op in ("layer_norm", "rms_norm"):
            a["normalized_shape"] = [p.values[ins[0]].shape[-1]]
        n = p.add_node(op, ins, a)
        return [n.id], n.outputs[0]
    return build


def row_layout(dims):
    def build(p, ins):
        n = p.add_node("permute", ins, {"dims": dims})
        return [n.id], n.outputs[0]
    return build


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--numel", type=int, default=1 << 28, help="floats per large tensor (default 2^28 = 1 GiB)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no GPU: nothing to measure", file=sys.stderr)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    N = args.numel
    dev = torch.cuda.get_device_properties(0)
    flush_buf = torch.empty(2 * dev.L2_cache_size // 4 + (64 << 20), dtype=torch.float32, device="cuda")

    def flush():
        flush_buf.zero_()

    x = torch.randn(N, device="cuda")
    y = torch.empty_like(x)
    copy_ms = timed(lambda: y.copy_(x), flush)
    copy_gbs = 2 * 4 * N / copy_ms / 1e6
    del x, y
    results = [{"case": "copy (torch)", "ms": copy_ms, "GB/s": copy_gbs, "of_copy": 1.0}]
    print(f"device: {dev.name}, {dev.multi_processor_count} SMs, L2 {dev.L2_cache_size >> 20} MiB")
    print(f"copy bandwidth: {copy_gbs:.0f} GB/s ({N} floats)")

    C, HW = 256, N // (64 * 256)
    cases = [
        case("relu", pw_relu, lambda a: torch.relu(a), [(N,)]),
        case("add_bias_gelu_mul", pw_chain, lambda a, b: torch.nn.functional.gelu(a + b) * 2.0,
             [(64, C, HW), (C, 1)]),
        case("softmax_1024", row("softmax", dim=-1), lambda a: torch.softmax(a, -1), [(N // 1024, 1024)]),
        case("softmax_4096", row("softmax", dim=-1), lambda a: torch.softmax(a, -1), [(N // 4096, 4096)]),
        case("softmax_16384", row("softmax", dim=-1), lambda a: torch.softmax(a, -1), [(N // 16384, 16384)]),
        case("softmax_262144_online", row("softmax", dim=-1), lambda a: torch.softmax(a, -1),
             [(N // 262144, 262144)]),
        case("log_softmax_1024", row("log_softmax", dim=-1), lambda a: torch.log_softmax(a, -1),
             [(N // 1024, 1024)]),
        case("layer_norm_1024", row("layer_norm"),
             lambda a, w, b: torch.nn.functional.layer_norm(a, (1024,), w, b), [(N // 1024, 1024), (1024,), (1024,)]),
        case("rms_norm_4096", row("rms_norm", eps=1e-6),
             lambda a, w: torch.nn.functional.rms_norm(a, (4096,), w, 1e-6), [(N // 4096, 4096), (4096,)]),
        case("logsumexp_1024", row("logsumexp", dim=[-1]), lambda a: torch.logsumexp(a, -1), [(N // 1024, 1024)]),
        case("sum_128", row("sum", dim=[-1]), lambda a: a.sum(-1), [(N // 128, 128)]),
        case("transpose_16384", row_layout([1, 0]), lambda a: a.t().contiguous(), [(16384, N // 16384)]),
        case("permute_0213", row_layout([0, 2, 1, 3]), lambda a: a.permute(0, 2, 1, 3).contiguous(),
             [(64, 256, N // (64 * 256 * 64), 64)]),
        case("split_logsumexp_2rows", row("logsumexp", dim=[-1]), lambda a: torch.logsumexp(a, -1), [(2, N // 2)]),
        case("column_sum_dim0", row("sum", dim=[0]), lambda a: a.sum(0), [(4096, N // 4096)]),
        case("column_softmax_dim1", row("softmax", dim=1), lambda a: torch.softmax(a, 1),
             [(64, 1024, N // (64 * 1024))]),
    ]
    print(f"{'case':<42}{'schedule':<52}{'ours ms':>9}{'GB/s':>8}{'% copy':>8}{'eager ms':>10}{'speedup':>9}  ok")
    variants = {  # launch parameters a tuner would try: recorded next to the default choice
        "softmax_1024": [{"threads_per_row": 16}, {"threads_per_row": 64}],
        "softmax_4096": [{"threads_per_row": 128}, {"threads_per_row": 512}],
        "softmax_16384": [{"threads_per_row": 512}],
        "layer_norm_1024": [{"threads_per_row": 64}, {"threads_per_row": 128}],
        "add_bias_gelu_mul": [{"block": 512}, {"vector_width": 1}, {"unroll": 1}],
        "relu": [{"unroll": 1}, {"unroll": 8}],
    }
    runs = [(p, ids, eager, None) for p, ids, eager in cases]
    runs += [(p, ids, eager, v) for p, ids, eager in cases for v in variants.get(p.name, [])]
    for p, ids, eager, params in runs:
        ks = generate_kernel(p, ids, name=p.name, params=params)
        k = load_kernel(ks, p)
        ins = [torch.randn(p.values[v].shape, device="cuda") for v in ks.inputs]
        outs = [torch.empty(p.values[v].shape, device="cuda") for v in ks.outputs]
        launch = k.bind(ins, outs)
        ms = timed(launch, flush)
        ref = eager(*ins)
        eager_ms = timed(lambda: eager(*ins), flush)
        ok = torch.allclose(outs[0].reshape(ref.shape), ref, atol=1e-4, rtol=1e-4)
        gbs = ks.bytes_moved / ms / 1e6
        label = p.name + ("" if not params else " " + ",".join(f"{a}={b}" for a, b in params.items()))
        r = {"case": label, "params": params, "schedule": ks.schedule, "ms": ms, "GB/s": gbs, "of_copy": gbs / copy_gbs,
             "eager_ms": eager_ms, "speedup_vs_eager": eager_ms / ms, "bytes": ks.bytes_moved, "ok": bool(ok),
             "registers": k.registers, "local_bytes": k.local_bytes}
        results.append(r)
        print(f"{label[:40]:<42}{ks.schedule[:50]:<52}{ms:>9.3f}{gbs:>8.0f}{100 * gbs / copy_gbs:>7.1f}%"
              f"{eager_ms:>10.3f}{eager_ms / ms:>8.2f}x  {'ok' if ok else 'MISMATCH'}", flush=True)
        del ins, outs, ref, launch, k
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev.name, "copy_GBps": copy_gbs, "numel": N, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
