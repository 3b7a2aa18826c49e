"""`stitchcuda import FILE.py|module:Class -o prog.json`: turn PyTorch code into a program file.

Also holds `open_program`, which the other commands use to accept a program file, a KernelBench .py
file or a module:Class wherever they take a program.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from ..errors import ImportFailure

if TYPE_CHECKING:   # the CLI parses its arguments (and imports in a child) before loading torch
    from ..ir import Program

HELP = ("import a KernelBench .py file or module:Class into a program file (this runs the file's code, "
        "in a child process with a time limit)")

DESCRIPTION = (HELP + ". Importing a .py executes it: its top level, Model.__init__, get_inputs, "
               "get_init_inputs and forward. It runs in a separate process that is stopped after --timeout "
               "seconds, so a file that hangs, exits or crashes gives one error line and leaves the tool "
               "running. Opening a .json program file never runs code.")


def add_arguments(parser) -> None:
    parser.description = DESCRIPTION
    parser.add_argument("source", help="a KernelBench-format .py file (Model, get_inputs, "
                                       "get_init_inputs) or package.module:Class; its code runs")
    parser.add_argument("-o", "--output", help="program file to write (default: SOURCE's name with .json, "
                                               "in the current folder)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="stop the import after S seconds (default: 120)")


def is_python_source(spec: str) -> bool:
    """Whether `spec` names code to import (a .py file or module:Class) rather than a program file:
    .py imports; anything else that exists is a program file; then module:Class."""
    if spec.endswith(".py"):
        return True
    return not os.path.exists(spec) and not spec.endswith(".json") and ":" in spec


def import_source(spec: str, *, timeout: float | None = None,
                  limit_hint: str = " (stitchcuda import --timeout S allows longer)") -> Program:
    """Import a .py file or module:Class in a child process (agent_core.importers.isolated): the file's
    code runs there, under a time limit (default 120 s), so no way it can end takes this process down."""
    if spec.endswith(".py"):
        if not os.path.isfile(spec):
            raise ImportFailure(f"{spec}: no such file")
    elif ":" not in spec:
        raise ImportFailure(f"'{spec}' is neither a .json program, a .py file nor module:Class")
    from ..importers.isolated import DEFAULT_TIMEOUT, import_isolated
    return import_isolated(spec, timeout=DEFAULT_TIMEOUT if timeout is None else timeout, limit_hint=limit_hint)


def read_program_file(spec: str) -> Program:
    """A project file, checked to be JSON before it is parsed (a file of any name is read as one)."""
    from ..errors import FileFormatError
    from ..project_file import load_program
    if os.path.isfile(spec):
        try:
            with open(spec, "rb") as f:
                head = f.read(4096)
        except OSError as e:
            raise FileFormatError(f"{spec}: cannot read ({e.strerror or e})") from None
        if not head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"{"):
            raise FileFormatError(f"{os.path.basename(spec)}: not a StitchCUDA program file "
                                  f"(expected JSON starting with '{{')")
    return load_program(spec)


def open_program(spec: str) -> Program:
    """A program from a project file, a KernelBench .py file or module:Class (imported in a child
    process). Decided by what `spec` is, not only its suffix (see is_python_source)."""
    if is_python_source(spec) or not (os.path.exists(spec) or spec.endswith(".json")):
        return import_source(spec)
    return read_program_file(spec)


def import_warnings(program: Program) -> list[str]:
    return [str(w) for w in program.metadata.get("import_warnings", []) or []]


def run(args) -> int:
    from ..project_file import save_program
    out = args.output or os.path.splitext(os.path.basename(args.source.split(":")[-1]))[0] + ".json"
    program = import_source(args.source, timeout=args.timeout, limit_hint=" (--timeout)")
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
