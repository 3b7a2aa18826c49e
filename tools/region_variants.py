"""Time a program's generated region kernels in chosen parameter variants, one by one (a diagnostic;
needs a GPU). The program is imported, rewritten (unchecked) and planned as optimize plans it; each
region asked for is built with each variant (verified on 2 draws against the reference), then its
kernel alone is timed (replays of a CUDA graph of its one launch, CUDA events, L2 flushed, median of
30), with the bytes it moves and the bandwidth that is. A variant that fails prints its reason.

The kernel reads the values its region reads when the program runs on the file's own get_inputs()
(the reference run on the GPU, weights and buffers as the module builds them): a guarded kernel's
traffic depends on them (a causal mask, ignored labels). `--random` times it on random inputs of the
region's own shapes instead (no reference run: for programs whose values do not fit the GPU at once).

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


def file_values(program, path: str, device: str = "cuda") -> dict:
    """Every value of the program run on the file's get_inputs(), by value id."""
    from agent_core.profile.baselines import source_callable
    from agent_core.reference import run_reference
    _, inputs = source_callable(path, device)
    return run_reference(program, inputs, device=device, keep=True)


def main(argv: list[str]) -> int:
    random = "--random" in argv
    argv = [a for a in argv if a != "--random"]
    if len(argv) != 2:
        print(__doc__)
        return 2
    import torch

    from agent_core.importers import import_file
    from agent_core.planner import plan_program
    from agent_core.profile.timing import time_in_graph
    from agent_core.rewrites import rewrite_program
    from agent_core.runtime import build_region
    program = rewrite_program(import_file(argv[0], weights=not random), check=False).program
    values = {} if random else file_values(program, argv[0])
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
            ins = [values[v].contiguous() if v in values else random_input(program.values[v], torch) for v in ks.inputs]
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
