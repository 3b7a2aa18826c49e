"""`stitchcuda import FILE.py|module:Class -o prog.json`: turn PyTorch code into a program file.

Also holds `open_program`, which the other commands use to accept a program file, a KernelBench .py
file or a module:Class wherever they take a program.
"""
from __future__ import annotations

import os
import sys

from ..errors import ImportFailure
from ..ir import Program

HELP = "import a KernelBench .py file or module:Class into a program file"


def add_arguments(parser) -> None:
    parser.add_argument("source", help="a KernelBench-format .py file (Model, get_inputs, "
                                       "get_init_inputs) or package.module:Class")
    parser.add_argument("-o", "--output", help="program file to write (default: SOURCE's name with .json, "
                                               "in the current folder)")


def is_program_file(spec: str) -> bool:
    return spec.endswith(".json")


def import_source(spec: str) -> Program:
    """Import a .py file or module:Class through agent_core.importers."""
    from .. import importers
    if not hasattr(importers, "import_file"):
        raise ImportFailure("this build has no PyTorch importer (agent_core.importers.import_file is missing)")
    if spec.endswith(".py") or os.path.isfile(spec):
        if not os.path.isfile(spec):
            raise ImportFailure(f"{spec}: no such file")
        return importers.import_file(spec)
    if ":" in spec:
        return importers.import_module(spec)
    raise ImportFailure(f"'{spec}' is neither a .json program, a .py file nor module:Class")


def open_program(spec: str) -> Program:
    """A program from a .json project file, a KernelBench .py file or module:Class."""
    if is_program_file(spec):
        from ..project_file import load_program
        return load_program(spec)
    return import_source(spec)


def import_warnings(program: Program) -> list[str]:
    return [str(w) for w in program.metadata.get("import_warnings", []) or []]


def run(args) -> int:
    from ..project_file import save_program
    out = args.output or os.path.splitext(os.path.basename(args.source.split(":")[-1]))[0] + ".json"
    program = import_source(args.source)
    warnings = import_warnings(program)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    save_program(program, out)
    params = program.parameters()
    nbytes = sum(v.nbytes for v in params)
    print(f"{args.source} -> {out}: {_count(len(program.nodes), 'node')}, "
          f"{_count(len(program.inputs), 'input')}, {_count(len(params), 'parameter')} "
          f"({_fmt_bytes(nbytes)}), {_count(len(program.outputs), 'output')}"
          + (f", {_count(len(warnings), 'warning')}" if warnings else ""))
    return 0


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
