"""Which form of a split-TF32 convolution is fastest? For every convolution of the given program files,
times plain fp32 (cuDNN heuristics) against split TF32 (runtime.split_tf32, cuDNN benchmark mode) in
four forms: three convolutions summed, or one convolution over the channel-concatenated parts
[hi, lo, hi] x [hi, hi, lo] (groups = 1 only); each in the contiguous layout and in channels-last (the
parts are written channels-last by the split itself; the result is made contiguous again, timed).
Errors against float64 in units of the 1e-4 tolerance, as tools/tf32x3_probe.py.

    PYTHONPATH=. python3 tools/conv_tf32_layout_probe.py kernelbench/KernelBench/level2/*Conv*.py [--json OUT]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from agent_core.runtime.split_tf32 import split_tf32, tf32_tensor_cores

sys.path.insert(0, os.path.dirname(__file__))
from bench_kernels import timed  # noqa: E402
from library_calls import exact_result, flusher, library_calls, tolerance_units, write_rows  # noqa: E402

LAYOUT = {4: torch.channels_last, 5: torch.channels_last_3d}


def forms(node, a, w, bias):
    ref, attrs = node.opdef.reference, node.attrs
    transposed = node.op.startswith("conv_transpose")
    cl = LAYOUT.get(a.dim())

    def split(t, layout):
        hi, lo = split_tf32(t)
        return (hi, lo) if layout is None else (hi.contiguous(memory_format=layout), lo.contiguous(memory_format=layout))
    w_parts = {lay: split(w, lay) for lay in (None, cl)}

    def summed(layout):
        def run():
            a_hi, a_lo = split(a, layout)
            w_hi, w_lo = w_parts[layout]
            with tf32_tensor_cores():
                out = ref([a_lo, w_hi, None], attrs)
                out += ref([a_hi, w_lo, None], attrs)
                out += ref([a_hi, w_hi, bias], attrs)
            return out.contiguous()
        return run

    def concatenated(layout):
        w_hi, w_lo = w_parts[layout]
        w_cat = torch.cat([w_hi, w_hi, w_lo], dim=0 if transposed else 1)
        if layout is not None:
            w_cat = w_cat.contiguous(memory_format=layout)

        def run():
            a_hi, a_lo = split_tf32(a)
            a_cat = torch.cat([a_hi, a_lo, a_hi], dim=1)
            if layout is not None:
                a_cat = a_cat.contiguous(memory_format=layout)
            with tf32_tensor_cores():
                return ref([a_cat, w_cat, bias], attrs).contiguous()
        return run
    out = {"sum": summed(None)}
    if cl is not None:
        out["sum_cl"] = summed(cl)
    if attrs.get("groups", 1) == 1:
        out["cat"] = concatenated(None)
        if cl is not None:
            out["cat_cl"] = concatenated(cl)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    flush = flusher()
    rows = []
    calls = library_calls(args.files, lambda n: n.opdef.category == "convolution", unique_shapes=True)
    for problem, _, node, a, w, bias in calls:
        ref, attrs = node.opdef.reference, node.attrs
        with torch.no_grad():
            exact = exact_result(node, a, w, bias)
            row = {"problem": problem, "op": node.op, "a": list(a.shape), "w": list(w.shape),
                   "fp32_ms": timed(lambda: ref([a, w, bias], attrs), flush)}
            for name, run in forms(node, a, w, bias).items():
                row[name + "_ms"] = timed(run, flush)
                row[name + "_err"] = tolerance_units(run(), exact)
        del exact
        torch.cuda.empty_cache()
        rows.append(row)
        best = min((k for k in row if k.endswith("_ms") and k != "fp32_ms"), key=row.get)
        print(f"{row['problem'][:40]:40s} {node.op:16s} a{row['a']} w{row['w']} fp32 {row['fp32_ms']:.3f} | "
              + " ".join(f"{k[:-3]} {row[k]:.3f}" for k in row if k.endswith("_ms") and k != "fp32_ms")
              + f" | best {best[:-3]} {row['fp32_ms'] / row[best]:.2f}x err {row[best[:-3] + '_err']:.3f}",
              flush=True)
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
