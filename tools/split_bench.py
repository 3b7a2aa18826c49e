"""How fast is the split TF32 kernel (runtime/split_kernel.py) against the five torch ops it replaces?
Times, for activations of typical sizes, the plain split, the channel-concatenated [hi, lo, hi] (rows),
and the channel-concatenated parts of a contiguous input in channels-last memory (transposing), each
as the kernel and as the torch ops (split_tf32._split_ops, the copy too for the concatenations), with
the bytes each must move (one read, two or three writes) against the measured copy bandwidth.

    PYTHONPATH=. python3 tools/split_bench.py [--trials 20]

Each line: the case, its shape, torch ops ms, kernel ms, speedup, the kernel's share of copy bandwidth.
"""
from __future__ import annotations

import argparse

import torch

from agent_core.profile.hardware import measure_copy_bandwidth
from agent_core.profile.timing import time_gpu
from agent_core.runtime import split_kernel
from agent_core.runtime import split_tf32 as st

SHAPES = [(10, 64, 112, 112), (10, 256, 56, 56), (8, 512, 28, 28), (2, 3, 224, 224), (4096, 4096), (64, 1000)]


def _torch_cat(t, dst, dim, lo_at):
    c = t.shape[dim]
    parts = [dst.narrow(dim, i * c, c) for i in range(3)]
    st._split_ops(t, parts[0], parts[lo_at])
    parts[3 - lo_at].copy_(parts[0])


def cases(shape):
    """(name, torch-ops call, kernel call, bytes moved) for one input shape."""
    x = torch.randn(shape, device="cuda")
    hi, lo = torch.empty_like(x), torch.empty_like(x)
    n = x.numel() * 4
    yield "split", lambda: st._split_ops(x, hi, lo), lambda: st.split_into(x, hi, lo), 3 * n
    if x.dim() != 4:
        return
    wide = [shape[0], 3 * shape[1], *shape[2:]]
    dst = torch.empty(wide, device="cuda")
    yield "cat rows", lambda: _torch_cat(x, dst, 1, 1), lambda: st.split_cat_into(x, dst, 1, 1), 4 * n
    cl = torch.empty(wide, device="cuda", memory_format=torch.channels_last)
    yield "cat to channels-last", lambda: _torch_cat(x, cl, 1, 1), lambda: st.split_cat_into(x, cl, 1, 1), 4 * n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    assert split_kernel.ready(st._split_ops), "the split kernel did not match the torch ops on this GPU"
    copy_gbs = measure_copy_bandwidth()
    print(f"copy bandwidth {copy_gbs:.0f} GB/s ({torch.cuda.get_device_name()})")
    print(f"{'case':<22} {'shape':<22} {'torch ops ms':>12} {'kernel ms':>10} {'speedup':>8} {'of copy bw':>10}")
    for shape in SHAPES:
        for name, ops, kernel, nbytes in cases(shape):
            t_ops = time_gpu(ops, trials=args.trials).median_ms
            t_kernel = time_gpu(kernel, trials=args.trials).median_ms
            share = nbytes / (t_kernel * 1e-3) / 1e9 / copy_gbs
            print(f"{name:<22} {str(shape):<22} {t_ops:>12.4f} {t_kernel:>10.4f} {t_ops / t_kernel:>7.2f}x {share:>9.0%}")


if __name__ == "__main__":
    main()
