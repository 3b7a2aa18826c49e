"""Can tensor cores run our fp32 library calls at fp32 accuracy? Times every matmul / linear / bmm /
convolution of the given program files in fp32 (TF32 off, what the agent and the baselines run) and as
split TF32 ("3xTF32": each operand split into a TF32-exact high part and its remainder, three tensor-core
products hi*hi + hi*lo + lo*hi summed in fp32; the runtime's split_tf32), weights split once beforehand.
(The records of 2026-11-30 in docs/benchmarks/h200-2026-11-30c/ came from a first version whose
split truncated hi instead of rounding it and left lo unrounded.) Errors are measured
against a float64 run of the same call.

    PYTHONPATH=. python3 tools/tf32x3_probe.py kernelbench/KernelBench/level2/*.py [--json OUT] [--cudnn-benchmark]

Each line: the problem, the op and its input shapes, fp32 ms, 3xTF32 ms, the split of the activation
ms (included in the 3xTF32 time), and the worst error of fp32 and of 3xTF32 in units of the 1e-4
tolerance (|got - exact| / (1e-4 + 1e-4 |exact|); below 1 passes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from agent_core.importers import import_file
from agent_core.reference import parameter_tensors
from agent_core.runtime.split_tf32 import split_tf32 as split

sys.path.insert(0, os.path.dirname(__file__))
from bench_kernels import timed  # noqa: E402  (median of 20 after warm-up, L2 flushed before each)

FLUSH_BYTES = 256 * 2**20
BILINEAR = ("matmul", "bmm", "linear", "conv1d", "conv2d", "conv3d",
            "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def tolerance_units(got, exact):
    return float(((got.double() - exact).abs() / (1e-4 + 1e-4 * exact.abs())).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json")
    ap.add_argument("--cudnn-benchmark", action="store_true")
    args = ap.parse_args(argv)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    scratch = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    flush = scratch.zero_
    rows = []
    for path in args.files:
        try:
            program = import_file(path)
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            print(f"{path}: import failed: {exc}", flush=True)
            continue
        params = parameter_tensors(program, "cuda")
        for node in program.nodes.values():
            if node.op not in BILINEAR:
                continue
            ref = node.opdef.reference
            a = torch.randn(program.values[node.inputs[0]].shape, device="cuda")
            b = params.get(node.inputs[1])
            b = b if b is not None else torch.randn(program.values[node.inputs[1]].shape, device="cuda")
            bias = params.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
            attrs = node.attrs

            def call(x, w, c=None, tf32=False):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                torch.backends.cudnn.allow_tf32 = tf32
                return ref([x, w, c], attrs)

            b_hi, b_lo = split(b)

            def x3():
                a_hi, a_lo = split(a)
                out = call(a_lo, b_hi, tf32=True)
                out += call(a_hi, b_lo, tf32=True)
                out += call(a_hi, b_hi, bias, tf32=True)
                return out

            with torch.no_grad():
                exact = ref([a.double(), b.double(), bias.double() if bias is not None else None], attrs)
                fp32 = call(a, b, bias)
                tf32 = call(a, b, bias, tf32=True)
                row = {"problem": path.rsplit("/", 1)[-1][:-3], "op": node.op,
                       "a": list(a.shape), "b": list(b.shape),
                       "fp32_ms": timed(lambda: call(a, b, bias), flush),
                       "tf32x3_ms": timed(x3, flush),
                       "tf32_ms": timed(lambda: call(a, b, bias, tf32=True), flush),
                       "split_ms": timed(lambda: split(a), flush),
                       "fp32_err": tolerance_units(fp32, exact),
                       "tf32_err": tolerance_units(tf32, exact),
                       "tf32x3_err": tolerance_units(x3(), exact)}
            del exact, fp32, tf32
            rows.append(row)
            print(f"{row['problem'][:44]:44s} {node.op:17s} a{row['a']} b{row['b']}: fp32 {row['fp32_ms']:.3f} "
                  f"3xtf32 {row['tf32x3_ms']:.3f} (split {row['split_ms']:.3f}, 1xtf32 {row['tf32_ms']:.3f}) ms "
                  f"= {row['fp32_ms'] / row['tf32x3_ms']:.2f}x; err fp32 {row['fp32_err']:.3f} "
                  f"3xtf32 {row['tf32x3_err']:.3f} tf32 {row['tf32_err']:.2f}", flush=True)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
