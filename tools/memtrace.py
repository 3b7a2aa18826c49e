"""Where an optimized program's GPU memory goes, step by step (a diagnostic; needs a GPU).

Runs `stitchcuda bench` in this process with the executable's run traced: after each step, the
allocator's live bytes and the step's own peak (torch.cuda.max_memory_allocated since the step began),
for the warm-up run and the CUDA graph capture that bench's peak-memory measurement builds; prints the
eight steps with the highest peaks of each, then the measured and predicted figures.

    PYTHONPATH=. python3 tools/memtrace.py kernelbench/KernelBench/level3/11_VGG16.py --no-tune --no-compile-baselines
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

RUNS: list[list[tuple]] = []


def _traced_execute(self):
    import torch

    from agent_core.program_runtime.executable import _drop
    env = dict(self.params)
    env.update(zip(self.program.inputs, self.inputs))
    base = torch.cuda.memory_allocated()
    rows = []
    with torch.no_grad():
        for i, (step, release) in enumerate(zip(self.steps, self._release)):
            torch.cuda.reset_peak_memory_stats()
            if step.kind == "kernel":
                self._launch(torch, step, env, release)
            else:
                self._run_library(step.nodes[0], env)
            _drop(env, release[-1])
            rows.append((i, step.label(self.program)[:60], torch.cuda.memory_allocated() - base,
                         torch.cuda.max_memory_allocated() - base))
    RUNS.append(rows)
    return [env[v] for v in self.program.outputs]


def main(argv: list[str]) -> int:
    from agent_core import cli
    from agent_core.profile import peak_memory
    from agent_core.program_runtime.executable import ProgramExecutable
    ProgramExecutable._execute = _traced_execute
    measure = peak_memory.ours_peak

    def traced(program, fused, graph):
        RUNS.clear()
        out = measure(program, fused, graph)
        for k, rows in enumerate(RUNS):
            print(f"--- {'warm-up' if k == 0 else 'capture'} run: {len(rows)} steps")
            for i, label, live, peak in sorted(sorted(rows, key=lambda r: -r[3])[:8]):
                print(f"  step {i:4d} {label:60s} live {live / 2**20:8.1f} MiB, "
                      f"peak in the step {peak / 2**20:8.1f} MiB")
        print("ours:", json.dumps(out))
        return out
    peak_memory.ours_peak = traced
    return cli.main(["bench"] + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
