"""`stitchcuda run prog.json|FILE.py`: run the reference interpreter on random inputs.

Runs on the GPU when torch sees one. Prints each output's shape, dtype and a checksum (sum and sum of
absolute values, in float64) so two runs, or a run and a generated kernel, can be compared by eye.
A program whose tensors do not fit the device (or the host) is refused before anything is allocated.
"""
from __future__ import annotations

import json
import time

from ..errors import ProgramError
from .import_cmd import open_program

HELP = "run the reference interpreter and print output shapes and checksums"


def add_arguments(parser) -> None:
    parser.add_argument("program", help="a program file (.json), a KernelBench .py file or module:Class")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to run (default: the GPU when there is one)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args) -> int:
    import torch

    from ..memory_check import require_fits
    from ..reference import parameter_tensors, random_inputs, run_reference
    program = open_program(args.program)
    program.check()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise ProgramError("--device cuda: torch sees no CUDA GPU here")
    require_fits(program, device, label=args.program)  # random_inputs checks too; this names the file
    inputs = random_inputs(program, seed=args.seed, device=device)
    params = parameter_tensors(program, device)

    def once():
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = run_reference(program, inputs, device=device, params=params)
        if device == "cuda":
            torch.cuda.synchronize()
        return out, (time.perf_counter() - t0) * 1e3
    first_ms = once()[1]  # the first run pays for lazy initialisation; its outputs are dropped at once
    outputs, ms = once()
    rows = []
    for name, t in outputs.items():
        d = t.detach().to(torch.float64)
        rows.append({"name": name, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                     "sum": d.sum().item(), "abs_sum": d.abs().sum().item()})
    if args.json:
        print(json.dumps({"program": program.name, "device": device, "seed": args.seed, "outputs": rows,
                          "time_ms": ms, "first_time_ms": first_ms}, indent=1))
        return 0
    gpu = f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""
    print(f"{program.name}: reference on {device}{gpu}, seed {args.seed}, {len(program.nodes)} nodes")
    for r in rows:
        print(f"  {r['name']}: {r['dtype']}[{', '.join(map(str, r['shape']))}]  "
              f"sum {r['sum']:.9g}  abs-sum {r['abs_sum']:.9g}")
    print(f"time: {ms:.3f} ms (first run {first_ms:.3f} ms)")
    return 0
