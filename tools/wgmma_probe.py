"""Which operand element the tile GEMM's wgmma loop reads for each output, in one launch: a first look
when tests/gpu/test_gemm_wgmma_gpu.py fails, before reading any kernel source.

y = x @ w^T for one warpgroup tile (64 x n8 up to n256, one or two 32-wide k slices), with inputs chosen
so that every output names the element it read (all values exact in TF32, so hi = x and lo = 0):
- B probe: x[m, k] = 1 where k == m mod K, else 0; w[n, k] = 1000 n + k. Then y[m, n] = w[n, m mod K],
  so y decodes to (n', k') = (y // 1000, y % 1000) and should be (n, m mod K).
- A probe: w[n, k] = 1 where k == n mod K, else 0; x[m, k] = 1000 m + k. Then y[m, n] = x[m, n mod K],
  decoding to (m', k') that should be (m, n mod K).
Each mismatch prints as `y[m, n] read (n', k')`; a summary says how many of the outputs were right.
B is [N, K] with K a multiple of 4 (copied straight into the swizzled layout) or with --staged an odd K
(staged, then split into it).

    python3 tools/wgmma_probe.py [--n 8] [--k 32] [--staged] [--cpu]

--cpu runs the same body in the CPU emulator (plain-C++ wgmma, gemm_wgmma.portable_helpers), which reads
the operands the way this project believes the hardware does: there every output is right.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_core.codegen import generate_kernel  # noqa: E402
from agent_core.ir import Program  # noqa: E402


def probe_program(n: int, k: int) -> Program:
    p = Program("wgmma_probe")
    x = p.add_input("x", (64, k))
    w = p.add_input("w", (n, k))
    p.mark_output(p.add_node("linear", [x.id, w.id]).outputs[0])
    return p


def run(ks, p, x: np.ndarray, w: np.ndarray, cpu: bool) -> np.ndarray:
    if cpu:
        from agent_core.writer.emulate import CpuExecutor
        from agent_core.writer.executors import guarded, payload
        out = np.zeros((64, w.shape[0]), np.float32)
        res = CpuExecutor().run(ks, [[guarded(x, 256), guarded(w, 256), guarded(out, 256)]], guard=256)
        return payload(res[0][-1], 256, np.float32, out.shape).copy()
    import torch
    from agent_core.compiler import compile_kernel
    from agent_core.runtime.launch import load_kernel
    loaded = load_kernel(ks, p, compile_kernel(ks))
    y = loaded([torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()])[0]
    torch.cuda.synchronize()
    return y.cpu().numpy()


def report(name: str, y: np.ndarray, want: list[tuple], decode) -> int:
    wrong = [(m, n, decode(y[m, n]), want_mn) for (m, n), want_mn in want if decode(y[m, n]) != want_mn]
    print(f"{name}: {len(want) - len(wrong)} of {len(want)} outputs read the element they should")
    for m, n, got, should in wrong[:40]:
        print(f"  y[{m}, {n}] read {got}, should read {should}")
    return len(wrong)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8, help="columns (block_n): 8 to 256, a multiple of 8")
    ap.add_argument("--k", type=int, default=32, help="the reduction: 32 or 64 (with --staged, 31 or 63)")
    ap.add_argument("--staged", action="store_true", help="an odd K: B staged, then split into the layout")
    ap.add_argument("--cpu", action="store_true", help="run in the CPU emulator instead of on the GPU")
    a = ap.parse_args(argv)
    k = a.k - 1 if a.staged else a.k
    p = probe_program(a.n, k)
    params = {"form": "gemm-3xtf32", "mma": "wgmma", "block_m": 64, "warps_m": 4, "warps_n": 1, "block_n": a.n,
              "block_k": 32, "stages": 2, "slice_acc": False, "portable": a.cpu}
    ks = generate_kernel(p, list(p.nodes), name="wgmma_probe", params=params)
    print(ks.schedule)
    rows, cols = np.arange(64)[:, None], np.arange(k)[None, :]
    bad = 0
    # B probe
    x = (cols == rows % k).astype(np.float32)
    w = (1000 * np.arange(a.n)[:, None] + np.arange(k)[None, :]).astype(np.float32)
    y = run(ks, p, x, w, a.cpu)
    bad += report("B probe", y, [((m, n), (n, m % k)) for m in range(64) for n in range(a.n)],
                  lambda v: (int(round(v)) // 1000, int(round(v)) % 1000))
    # A probe
    w = (np.arange(k)[None, :] == np.arange(a.n)[:, None] % k).astype(np.float32)
    x = (1000 * rows + cols).astype(np.float32)
    y = run(ks, p, x, w, a.cpu)
    bad += report("A probe", y, [((m, n), (m, n % k)) for m in range(64) for n in range(a.n)],
                  lambda v: (int(round(v)) // 1000, int(round(v)) % 1000))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
