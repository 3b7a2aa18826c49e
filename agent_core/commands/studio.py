"""`stitchcuda studio [FILE]`: open the node-graph editor (app.main.run_studio).

The editor is imported only here, so every other command runs where Qt is not installed. Where the
editor cannot start (PySide6 missing, app.main not there, no display), this prints the program's summary and
says why, with exit status 0: the command exists on every machine.
"""
from __future__ import annotations

import importlib
import os
import sys

HELP = "open the studio (the node-graph editor)"
_QT_MODULES = ("PySide6", "shiboken6", "pyqtgraph")


def add_arguments(parser) -> None:
    parser.add_argument("file", nargs="?", help="a program file (.json), a KernelBench .py file or module:Class")
    parser.add_argument("--screenshot", metavar="OUT.png", help="render the window to OUT.png and exit")
    parser.add_argument("--theme", choices=("dark", "light"), default="dark", help="colour theme (default dark)")


def editor_unavailable() -> str | None:
    """Why the editor cannot be opened here, or None when app.main.run_studio is importable."""
    try:
        mod = importlib.import_module("app.main")
    except ImportError as e:  # ModuleNotFoundError included
        missing = getattr(e, "name", None) or ""
        if missing in ("app", "app.main"):
            return "the editor is not installed (no app.main)"
        if missing.split(".")[0] in _QT_MODULES or any(q in str(e) for q in _QT_MODULES) or ".so" in str(e):
            return f"Qt cannot be loaded ({e})"
        raise
    if not callable(getattr(mod, "run_studio", None)):
        return "app.main has no run_studio()"
    return None


def no_display() -> bool:
    """On Linux without a display Qt aborts the process (it cannot be caught): check first."""
    return (sys.platform.startswith("linux") and not os.environ.get("DISPLAY")
            and not os.environ.get("WAYLAND_DISPLAY") and not os.environ.get("QT_QPA_PLATFORM"))


def run(args) -> int:
    if no_display() and not args.screenshot:
        reason = ("there is no display (DISPLAY and WAYLAND_DISPLAY are unset; "
                  "--screenshot OUT.png renders the window offscreen)")
    else:
        reason = editor_unavailable()
    if reason is None:
        app_main = importlib.import_module("app.main")
        return int(app_main.run_studio(args.file, screenshot=args.screenshot, theme=args.theme) or 0)
    if args.file:
        from .import_cmd import open_program
        from .show import format_summary, summarize
        print(format_summary(summarize(open_program(args.file))))
    print(f"stitchcuda studio: the editor is not available: {reason}; "
          f"{'the summary above is what it would open' if args.file else 'nothing to show'}"
          + ("; no screenshot written" if args.screenshot else ""), file=sys.stderr)
    return 0
