"""Where an optimized program's GPU memory goes, call by call (a diagnostic; needs a GPU).

Runs `stitchcuda bench` in this process with the executable's library calls and kernel steps
wrapped: after each, the allocator's live bytes and the call's own peak (since it began), both above
what was allocated when its run started, for the warm-up run and the CUDA graph capture that bench's
peak-memory measurement builds (a second build: the per-call resets of the peak counter would spoil
bench's own figure, which comes from a first, untraced one); prints the eight calls with the highest peaks of each, then the
measured and predicted figures.

    PYTHONPATH=. python3 tools/memtrace.py kernelbench/KernelBench/level3/11_VGG16.py --no-tune --no-compile-baselines
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

RUNS: list[list[tuple]] = []      # per run: (label, live bytes, peak bytes), above the run's start
BASE: list[int] = []
TRACING = [False]                 # the per-call resets would spoil bench's own peak: off while it measures


def _wrap(cls, name: str, label) -> None:
    method = getattr(cls, name)

    def run(self, *args):
        import torch
        if not TRACING[0]:
            return method(self, *args)
        torch.cuda.reset_peak_memory_stats()
        out = method(self, *args)
        RUNS[-1].append((label(self, *args)[:60], torch.cuda.memory_allocated() - BASE[-1],
                         torch.cuda.max_memory_allocated() - BASE[-1]))
        return out
    setattr(cls, name, run)


def _trace(cls) -> None:
    execute = cls._execute

    def run(self):
        import torch
        if not TRACING[0]:
            return execute(self)
        RUNS.append([])
        BASE.append(torch.cuda.memory_allocated())
        return execute(self)
    cls._execute = run
    _wrap(cls, "_run_library", lambda self, nid, env: f"{self.program.nodes[nid].name} ({self.program.nodes[nid].op})")
    _wrap(cls, "_launch", lambda self, torch, step, env, release: step.label(self.program))


def main(argv: list[str]) -> int:
    from agent_core import cli
    from agent_core.profile import peak_memory
    from agent_core.program_runtime.executable import ProgramExecutable
    _trace(ProgramExecutable)
    measure = peak_memory.ours_peak

    def traced(program, fused, graph):
        out = measure(program, fused, graph)          # bench's figure, untouched
        RUNS.clear()
        BASE.clear()
        TRACING[0] = True
        try:
            measure(program, fused, graph)            # again, call by call
        finally:
            TRACING[0] = False
        for k, rows in enumerate(RUNS):
            print(f"--- {'warm-up' if k == 0 else 'capture'} run: {len(rows)} calls")
            top = sorted(range(len(rows)), key=lambda i: -rows[i][2])[:8]
            for i in sorted(top):
                label, live, peak = rows[i]
                print(f"  {i:4d} {label:60s} live {live / 2**20:8.1f} MiB, peak in the call {peak / 2**20:8.1f} MiB")
        print("ours:", json.dumps(out))
        return out
    peak_memory.ours_peak = traced
    return cli.main(["bench"] + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
