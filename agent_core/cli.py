"""`stitchcuda`: one console command with subcommands.

Each subcommand lives in agent_core/commands/<name>.py with `HELP`, `add_arguments(parser)` and
`run(args) -> int`. Modules are imported only when their command runs, so `stitchcuda plan` never
loads Qt and `stitchcuda studio` loads it only then.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import signal
import sys
import threading
import traceback

from .errors import StitchError

# name -> (module, one-line help). Order is the order of `stitchcuda --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "import": ("agent_core.commands.import_cmd", "import a KernelBench .py file or module:Class into a program file"),
    "show": ("agent_core.commands.show", "summarise a program: nodes by category, parameters, bytes, FLOPs"),
    "run": ("agent_core.commands.run", "run the reference interpreter and print output shapes and checksums"),
    "rewrite": ("agent_core.commands.rewrite", "show the algebraic rewrites the agent would make, each checked"),
    "plan": ("agent_core.commands.plan", "propose fused and stitched regions with their reasons"),
    "optimize": ("agent_core.commands.optimize", "plan, generate, compile, verify and time CUDA for a program"),
    "bench": ("agent_core.commands.bench", "benchmark programs against torch eager and torch.compile"),
    "worker": ("agent_core.commands.worker", "run the agent loop as a JSON-lines event stream (for the studio)"),
    "export": ("agent_core.commands.export", "export the optimized program as a standalone CUDA project"),
    "studio": ("agent_core.commands.studio", "open the studio (the node-graph editor)"),
}


def _available() -> dict[str, tuple[str, str]]:
    """Commands whose module exists (later issues add theirs)."""
    out = {}
    for name, (mod, help_) in COMMANDS.items():
        if importlib.util.find_spec(mod) is not None:
            out[name] = (mod, help_)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stitchcuda", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (mod, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.set_defaults(_module=mod)
        importlib.import_module(mod).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if threading.current_thread() is threading.main_thread():
        # Ctrl+C and `timeout -s INT` stop a run even when it was started with SIGINT ignored (an
        # asynchronous job of a non-interactive shell inherits that): it ends as "interrupted", 130
        signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except BrokenPipeError:  # `stitchcuda show x.json | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("stitchcuda: interrupted", file=sys.stderr)
        return 130
    except (StitchError, OSError, ValueError) as e:
        if args.debug:
            traceback.print_exc()
        name = type(e).__name__ if not isinstance(e, StitchError) else "error"
        print(f"stitchcuda {args.command}: {name}: {e}".replace("\n", " "), file=sys.stderr)
        return 1
    except Exception as e:  # a bug: still one line unless --debug
        if args.debug:
            traceback.print_exc()
        print(f"stitchcuda {args.command}: internal error ({type(e).__name__}): {e}; rerun with --debug",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
