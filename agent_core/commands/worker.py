"""`stitchcuda worker prog.json|model.py`: the agent loop as a JSON-lines event stream on stdout.

The studio starts this in a separate process (a kernel that faults kills the worker, not the editor)
and reads one event per line (docs/EVENTS.md); anything else the loop would print goes to stderr.
The last event is `done`, or `error` when the run failed. With -o the outputs are written as
`optimize -o` writes them (a fresh folder moved into place at the end; agent_core.output_dir).
"""
from __future__ import annotations

import contextlib
import sys

HELP = "run the agent loop as a JSON-lines event stream (for the studio)"


def add_arguments(parser) -> None:
    parser.add_argument("program", help="a program file (.json), a KernelBench .py file or module:Class")
    parser.add_argument("-o", "--output", help="also write the optimize outputs to this folder")
    parser.add_argument("--no-baselines", action="store_true", help="do not time torch eager / torch.compile")
    from .optimize import add_common
    add_common(parser)


def run(args) -> int:
    from ..agent import EventEmitter
    from ..errors import StitchError
    from .optimize import optimize_spec, output_for
    out = sys.stdout
    emit = EventEmitter(out)
    # stray prints from imported model code must not corrupt the stream
    with contextlib.redirect_stdout(sys.stderr):
        try:
            with output_for(args) as tmp:   # written beside -o, moved there when the run succeeds
                optimize_spec(args.program, tmp and str(tmp), emit, args, baselines=not args.no_baselines,
                              final_dir=args.output)
        except (StitchError, OSError, ValueError) as exc:
            emit.emit("error", message=str(exc).replace("\n", " "), fatal=True)
            return 1
        except Exception as exc:
            emit.emit("error", message=f"internal error ({type(exc).__name__}): {exc}".replace("\n", " "), fatal=True)
            return 1
    return 0
