"""Time a program's generated region kernels in chosen parameter variants, one by one (a diagnostic;
needs a GPU). The program is imported, rewritten (unchecked) and planned as optimize plans it; each
region asked for is built with each variant (verified on 2 draws against the reference), then its
kernel alone is timed on random inputs of the region's own shapes (replays of a CUDA graph of its one
launch, CUDA events, L2 flushed, median of 30), with the bytes it moves and the bandwidth that is. A
variant that fails prints its reason.

    PYTHONPATH=. python3 tools/region_variants.py kernelbench/KernelBench/level3/48_Mamba2ReturnY.py \\
        '{"r11": [{}, {"unroll": 2}], "r13": [{}, {"tiled": false}]}'

Region ids are the plan's (`stitchcuda plan FILE` lists them); {} is the default schedule.
Kernels are loaded under a short hashed symbol (_c36 and the like), not the region's name: to profile
one variant with Nsight Compute, pick it by that prefix:

    ncu --clock-control none -k regex:^_c -c 1 --section SpeedOfLight python3 tools/region_variants.py FILE '{"r1": [{}]}'
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def random_input(value, torch):
    if value.dtype == "bool":
        return torch.rand(value.shape, device="cuda") > 0.5
    if value.dtype in ("int64", "int32"):
        return torch.zeros(value.shape, dtype=getattr(torch, value.dtype), device="cuda")
    return torch.randn(value.shape, device="cuda")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    import torch

    from agent_core.importers import import_file
    from agent_core.planner import plan_program
    from agent_core.profile.timing import time_in_graph
    from agent_core.rewrites import rewrite_program
    from agent_core.runtime import build_region
    program = rewrite_program(import_file(argv[0], weights=False), check=False).program
    wanted = json.loads(argv[1])
    for region in plan_program(program).active:
        for params in wanted.get(region.id, []):
            label = f"{region.id:5s} {json.dumps(params):36s}"
            run = build_region(program, region.nodes, name=f"k_{region.id}", kind=region.kind,
                               params=params or None, draws=2)
            if run.loaded is None:
                print(f"{label} not built: {run.fallback_reason[:200]}", flush=True)
                continue
            ks = run.kernel
            ins = [random_input(program.values[v], torch) for v in ks.inputs]
            outs = [torch.empty(program.values[v].shape, dtype=getattr(torch, program.values[v].dtype), device="cuda")
                    for v in ks.outputs]
            # the launch captured in a CUDA graph and replayed, as the agent times a region: no Python
            # launch path (argument checks, DLPack views) inside the timed span
            ms = time_in_graph(lambda r=run, i=ins, o=outs: r.loaded(i, o), trials=30)[0].median_ms
            print(f"{label} {ms:8.4f} ms {ks.bytes_moved / ms / 1e6:6.0f} GB/s  {ks.schedule}", flush=True)
            del ins, outs, run
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
