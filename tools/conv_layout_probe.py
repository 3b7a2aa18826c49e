"""Where do convolutions lose to torch.compile? Times every convolution of the given program files
through cuDNN in the contiguous layout (what the agent runs) and in channels-last (what Inductor's
layout optimisation picks), fp32 with TF32 off, the channels-last input conversion timed separately;
with --cudnn-benchmark, cuDNN picks each algorithm by timing it instead of by its heuristics.

    PYTHONPATH=. python3 tools/conv_layout_probe.py kernelbench/KernelBench/level2/*Conv3d*.py [--json OUT]

Each line: the problem, the conv's input and weight shapes, contiguous ms, channels-last ms, the
input conversion ms. Median of 20 after warm-up, L2 flushed before each trial.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_kernels import timed  # noqa: E402  (median of 20 after warm-up, L2 flushed before each)
from library_calls import flusher, library_calls, write_rows  # noqa: E402

CHANNELS_LAST = {2: torch.channels_last, 3: torch.channels_last_3d}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="let cuDNN time its algorithms per shape (torch.backends.cudnn.benchmark)")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    flush = flusher()
    rows = []

    def wanted(node):
        return node.opdef.category == "convolution" and int(node.op[-2]) in CHANNELS_LAST
    for problem, _, node, x, w, b in library_calls(args.files, wanted):
        cl = CHANNELS_LAST[int(node.op[-2])]

        def call(x, w, b, node=node):
            return node.opdef.reference([x, w, b], node.attrs)
        x_cl, w_cl = x.contiguous(memory_format=cl), w.contiguous(memory_format=cl)
        row = {"problem": problem, "op": node.op, "x": list(x.shape), "w": list(w.shape),
               "contiguous_ms": timed(lambda: call(x, w, b), flush),
               "channels_last_ms": timed(lambda: call(x_cl, w_cl, b), flush),
               "to_channels_last_ms": timed(lambda: x.contiguous(memory_format=cl), flush)}
        rows.append(row)
        print(f"{row['problem'][:40]:40s} {node.op:16s} x{row['x']} w{row['w']}: contiguous "
              f"{row['contiguous_ms']:.3f} ms, channels-last {row['channels_last_ms']:.3f} ms "
              f"(+{row['to_channels_last_ms']:.3f} ms to convert the input)", flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
