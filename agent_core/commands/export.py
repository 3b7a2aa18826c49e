"""`stitchcuda export prog.json|model.py -o OUTDIR`: the program as a standalone CUDA project.

Plans the program first if it has no regions, then writes the kernels, the entry point with its memory
plan, a host driver, CMakeLists.txt (with a ctest test), a Python binding, a README and the data the
test runs on, into a fresh folder beside OUTDIR that replaces it only when complete (agent_core.output_dir).
See docs/EXPORT.md.
"""
from __future__ import annotations

from ..output_dir import MARKER

HELP = "export the optimized program as a standalone CUDA project"


def add_arguments(parser) -> None:
    parser.add_argument("program", help="a program file (.json), a KernelBench .py file or module:Class")
    parser.add_argument("-o", "--output", required=True,
                        help="folder to write the project into: new or empty (a failed export leaves it as it was)")
    parser.add_argument("--no-params", action="store_true",
                        help="leave the parameters out of data/ (large models)")
    parser.add_argument("--arch", default="90", help="default CMAKE_CUDA_ARCHITECTURES (default 90)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the saved inputs (default 0)")
    parser.add_argument("--force", action="store_true",
                        help=f"replace an earlier export or optimize output there: only a folder holding its "
                             f"{MARKER} marker and no file stitchcuda did not write; never the input's folder, "
                             "the current or home folder, / or a symbolic link")


def run(args) -> int:
    from ..output_dir import check_target, input_paths
    protect = input_paths(args.program)
    check_target(args.output, "export", force=args.force, protect=protect)   # before torch loads
    from ..export import export_program
    from .import_cmd import open_program

    program = open_program(args.program)
    result = export_program(program, args.output, params=not args.no_params, arch=args.arch, seed=args.seed,
                            overwrite=args.force, protect=protect)
    kernels = sum(1 for s in result.schedule.steps if s.kind == "kernel")
    gemms = sum(1 for s in result.schedule.steps if s.kind == "gemm")
    print(f"{program.name}: {len(result.schedule.steps)} launches ({kernels} generated kernels, {gemms} cuBLAS "
          f"calls), workspace {result.memory.arena_bytes} bytes, data {result.data_bytes} bytes")
    for w in result.warnings:
        print(f"warning: {w}")
    print(f"wrote {len(result.files)} files to {result.outdir}; build: cmake -S {result.outdir} -B "
          f"{result.outdir}/build && cmake --build {result.outdir}/build -j")
    return 0
