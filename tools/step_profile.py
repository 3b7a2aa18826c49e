"""Where the time goes, kernel by kernel: ours against Inductor's (a diagnostic; needs a GPU).

Optimizes a program file as bench does (tuned, split-TF32 forms allowed, no baselines timed), then
profiles 10 replays of its CUDA graph and 10 calls of torch.compile(mode="default") of the file's
Model (fp32, TF32 off) with torch.profiler, and prints each side's GPU kernels by total time; above
them, ours' steps one by one outside the graph (CUDA events around each generated kernel and library
call, median of 10): milliseconds, bytes its tensors hold and the bandwidth that is.

    PYTHONPATH=. python3 tools/step_profile.py kernelbench/KernelBench/level3/48_Mamba2ReturnY.py [--no-tune] [--no-inductor]
"""
from __future__ import annotations

import argparse
import io
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

REPLAYS = 10


def kernel_table(run, title: str) -> None:
    from agent_core.profile.launched import gpu_activity
    rows: dict = {}
    for name, us in gpu_activity(run, REPLAYS):
        t, n = rows.get(name, (0.0, 0))
        rows[name] = (t + us, n + 1)
    total = sum(t for t, _ in rows.values()) / REPLAYS
    print(f"\n== {title}: {total / 1000:.3f} ms of kernels per run")
    for name, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        print(f"  {t / REPLAYS / 1000:8.4f} ms  x{n // REPLAYS:<3d} {name[:110]}")


def step_table(exe, program) -> None:
    """Each generated kernel and library call of ours, timed alone with CUDA events."""
    import statistics

    import torch

    from agent_core.program_runtime import executable as X
    times: dict = {}
    raw, library = X.raw_launch, X.ProgramExecutable._run_library

    def timed(key, nbytes, call):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = call()
        b.record()
        times.setdefault(key, [nbytes, []])[1].append((a, b))
        return out

    def size(ts):
        return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))

    def launch(loaded, ins, outs):
        return timed(f"kernel {loaded.kernel.name}", size(ins) + size(outs), lambda: raw(loaded, ins, outs))

    def run_library(self, nid, env):
        node = program.nodes[nid]
        out = timed(f"library {node.name} ({node.op})", 0, lambda: library(self, nid, env))
        times[f"library {node.name} ({node.op})"][0] = size([env.get(v) for v in node.inputs + node.outputs])
        return out
    X.raw_launch, X.ProgramExecutable._run_library = launch, run_library
    try:
        for _ in range(REPLAYS):
            exe._execute()
        torch.cuda.synchronize()
    finally:
        X.raw_launch, X.ProgramExecutable._run_library = raw, library
    print("\n== ours, step by step outside the graph (median of 10)")
    for key, (nbytes, evs) in times.items():
        ms = statistics.median(a.elapsed_time(b) for a, b in evs)
        print(f"  {ms:8.4f} ms {nbytes / 1e6:9.1f} MB {nbytes / ms / 1e6 if ms else 0:7.0f} GB/s  {key}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--no-inductor", action="store_true")
    args = ap.parse_args(argv)
    import torch

    from agent_core.agent import EventEmitter, optimize
    from agent_core.commands.import_cmd import open_program
    from agent_core.profile.baselines import source_callable
    from agent_core.runtime.region import strict_fp32
    res = optimize(open_program(args.file), emit=EventEmitter(io.StringIO()), tune=not args.no_tune,
                   baselines=False, time_regions=False)
    exe = res.executable
    e2e = res.profile["end_to_end"]
    print(f"ours: correct={e2e['correct']} {e2e.get('ms')} ms, graph={exe.graph is not None}")
    for i, step in enumerate(exe.steps):
        print(f"  step {i:3d} {step.label(res.program)}")
        if step.kind == "kernel":     # the schedule the tuner kept
            print(f"           {step.kernel.schedule}")
    step_table(exe, res.program)
    kernel_table(exe.replay, "ours")
    if not args.no_inductor:
        fn, inputs = source_callable(args.file, "cuda")
        strict_fp32()
        compiled = torch.compile(fn, mode="default")
        with torch.no_grad():
            kernel_table(lambda: compiled(*inputs), "torch.compile default")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
