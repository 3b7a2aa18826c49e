"""`stitchcuda rewrite prog.json|model.py [-o OUT.json] [--json]`: the algebraic rewrites the agent
would make, each checked on random draws of the reference, without planning or generating anything.

Prints one line per rewrite that fired and per rewrite its check refused; -o writes the rewritten
program. `--json` prints one JSON object instead, {"fired", "refused", "program"} with the rewritten
program inline (agent_core.project_file.program_to_json): the studio's Agent > Rewrites runs this
command in a child process, so a long check never blocks the editor and can be cancelled.
"""
from __future__ import annotations

import json
import sys

HELP = "show the algebraic rewrites the agent would make, each checked on the reference"


def add_arguments(parser) -> None:
    parser.add_argument("program", help="a program file (.json), a KernelBench .py file or module:Class")
    parser.add_argument("-o", "--output", help="write the rewritten program to this file")
    parser.add_argument("--json", action="store_true", help="print one JSON object (for scripts and the studio)")
    parser.add_argument("--check-anyway", action="store_true",
                        help="check a program the size limit would skip (the check runs the reference on the "
                             "CPU and may take long)")


def run(args) -> int:
    from ..agent.loop import too_big_to_check
    from ..errors import StitchError
    from ..project_file import program_to_json, save_program
    from ..rewrites import rewrite_program
    from .import_cmd import open_program

    program = open_program(args.program)
    program.check()
    big = too_big_to_check(program)
    if big and not args.check_anyway:
        raise StitchError(f"checking rewrites runs the reference on the CPU and this program ({big}) would take "
                          "long; pass --check-anyway to check it here, or run stitchcuda optimize on a GPU machine")
    result = rewrite_program(program)
    if args.output:
        save_program(result.program, args.output)
    if args.json:
        json.dump({"fired": result.fired, "refused": result.refused, "program": program_to_json(result.program)},
                  sys.stdout)
        print()
        return 0
    for e in result.fired:
        print(f"{e['rule']} at {e.get('node') or '-'}: {e['message']}")
    for e in result.refused:
        print(f"refused {e['rule']} at {e.get('node') or '-'}: {e.get('error') or e['message']}")
    print(f"{program.name}: {len(result.fired)} rewrites fired, {len(result.refused)} refused by their check; "
          f"{len(program.nodes)} ops become {len(result.program.nodes)}"
          + (f"; wrote {args.output}" if args.output else ""))
    return 0
