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
import json
import os
import sys

import torch
import torch.nn.functional as F

from agent_core.importers import import_file
from agent_core.ops.common import ntuple
from agent_core.reference import parameter_tensors

sys.path.insert(0, os.path.dirname(__file__))
from bench_kernels import timed  # noqa: E402  (median of 20 after warm-up, L2 flushed before each)

FLUSH_BYTES = 256 * 2**20  # larger than the H200's 60 MB L2


def conv_call(node, d: int):
    a = node.attrs
    if node.op.startswith("conv_transpose"):
        fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[d]
        kw = dict(stride=ntuple(a["stride"], d, "stride"), padding=ntuple(a["padding"], d, "padding"),
                  output_padding=ntuple(a["output_padding"], d, "output_padding"), groups=a["groups"],
                  dilation=ntuple(a["dilation"], d, "dilation"))
    else:
        fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[d]
        pad = a["padding"] if isinstance(a["padding"], str) else ntuple(a["padding"], d, "padding")
        kw = dict(stride=ntuple(a["stride"], d, "stride"), padding=pad,
                  dilation=ntuple(a["dilation"], d, "dilation"), groups=a["groups"])
    return lambda x, w, b: fn(x, w, b, **kw)


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
    scratch = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    flush = scratch.zero_
    rows = []
    for path in args.files:
        program = import_file(path)
        params = parameter_tensors(program, "cuda")
        for node in program.nodes.values():
            if node.opdef.category != "convolution":
                continue
            d = int(node.op[-2])
            cl = {2: torch.channels_last, 3: torch.channels_last_3d}.get(d)
            if cl is None:
                continue
            xv = program.values[node.inputs[0]]
            x = torch.randn(xv.shape, device="cuda")
            w = params.get(node.inputs[1])
            w = w if w is not None else torch.randn(program.values[node.inputs[1]].shape, device="cuda")
            b = params.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
            call = conv_call(node, d)
            x_cl, w_cl = x.contiguous(memory_format=cl), w.contiguous(memory_format=cl)
            row = {"problem": path.rsplit("/", 1)[-1][:-3], "op": node.op, "x": list(xv.shape), "w": list(w.shape),
                   "contiguous_ms": timed(lambda: call(x, w, b), flush),
                   "channels_last_ms": timed(lambda: call(x_cl, w_cl, b), flush),
                   "to_channels_last_ms": timed(lambda: x.contiguous(memory_format=cl), flush)}
            rows.append(row)
            print(f"{row['problem'][:40]:40s} {node.op:16s} x{row['x']} w{row['w']}: contiguous "
                  f"{row['contiguous_ms']:.3f} ms, channels-last {row['channels_last_ms']:.3f} ms "
                  f"(+{row['to_channels_last_ms']:.3f} ms to convert the input)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
