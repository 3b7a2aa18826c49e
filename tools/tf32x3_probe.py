"""How accurate and fast are our fp32 library calls on tensor cores? Times every matmul / linear / bmm /
convolution of the given program files in fp32 (TF32 off, what the baselines run), as one TF32 call, and
as the runtime's split TF32 (runtime.split_tf32.run_split_tf32: each operand split into a TF32 high
part and its TF32 remainder, three tensor-core products hi*hi + hi*lo + lo*hi; weights split once
beforehand), with errors against a float64 run of the same call.
(The records of 2026-11-30 in docs/benchmarks/h200-2026-11-30c/ came from a first version that summed
its own three calls, split by truncating hi and without rounding lo, and took cuDNN's heuristic
algorithms unless --cudnn-benchmark was given.)

    PYTHONPATH=. python3 tools/tf32x3_probe.py kernelbench/KernelBench/level2/*.py [--json OUT] [--cudnn-benchmark]

Each line: the problem, the op and its input shapes, fp32 ms, 3xTF32 ms, the split of the activation
ms (included in the 3xTF32 time), and the worst error of fp32, 3xTF32 and one TF32 call in units of
the 1e-4 tolerance (below 1 passes).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from agent_core.reference import run_node
from agent_core.runtime.split_tf32 import SPLIT_OPS, run_split_tf32, split_tf32, tf32_tensor_cores

sys.path.insert(0, os.path.dirname(__file__))
from bench_kernels import timed  # noqa: E402  (median of 20 after warm-up, L2 flushed before each)
from library_calls import exact_result, flusher, library_calls, tolerance_units, write_rows  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="fp32 convolutions pick algorithms by timing")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    flush = flusher()
    rows = []
    for problem, program, node, a, b, bias in library_calls(args.files, lambda n: n.op in SPLIT_OPS):
        env = {v: t for v, t in zip(node.inputs, (a, b, bias)) if v}
        out = node.outputs[0]

        def run(how, node=node, env=env):
            result = dict(env)
            how(program, node.id, result)
            return result[out]

        def one_tf32(program, nid, result):
            with tf32_tensor_cores():
                run_node(program, nid, result)
        with torch.no_grad():
            exact = exact_result(node, a, b, bias)
            row = {"problem": problem, "op": node.op, "a": list(a.shape), "b": list(b.shape),
                   "fp32_ms": timed(lambda: run(run_node), flush),
                   "tf32x3_ms": timed(lambda: run(run_split_tf32), flush),
                   "tf32_ms": timed(lambda: run(one_tf32), flush),
                   "split_ms": timed(lambda: split_tf32(a), flush),
                   "fp32_err": tolerance_units(run(run_node), exact),
                   "tf32_err": tolerance_units(run(one_tf32), exact),
                   "tf32x3_err": tolerance_units(run(run_split_tf32), exact)}
        del exact
        rows.append(row)
        print(f"{row['problem'][:44]:44s} {node.op:17s} a{row['a']} b{row['b']}: fp32 {row['fp32_ms']:.3f} "
              f"3xtf32 {row['tf32x3_ms']:.3f} (split {row['split_ms']:.3f}, 1xtf32 {row['tf32_ms']:.3f}) ms "
              f"= {row['fp32_ms'] / row['tf32x3_ms']:.2f}x; err fp32 {row['fp32_err']:.3f} "
              f"3xtf32 {row['tf32x3_err']:.3f} tf32 {row['tf32_err']:.2f}", flush=True)
        torch.cuda.empty_cache()
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
