"""`stitchcuda studio [FILE]`: open the node-graph editor (app.main.run_studio).

The editor is imported only here, so every other command runs where Qt is not installed. Where the
editor cannot start (PySide6 missing, app.main not there, no display, a system library that Qt's xcb
plugin needs is missing), this prints the program's summary and says why (naming the package to
install), with exit status 0: the command exists on every machine.
"""
from __future__ import annotations

import importlib
import importlib.util
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
        for name in ("PySide6.QtWidgets", "pyqtgraph", "app.main"):  # app.main imports Qt only when run
            mod = importlib.import_module(name)
    except ImportError as e:  # ModuleNotFoundError included
        missing = getattr(e, "name", None) or ""
        if missing in ("app", "app.main"):
            return "the editor is not installed (no app.main)"
        if missing.split(".")[0] in _QT_MODULES:
            return (f"its packages are not installed ({missing.split('.')[0]} is missing; "
                    "pip install 'stitchcuda[studio]', or pip install -e '.[studio]' in a checkout)")
        if any(q in str(e) for q in _QT_MODULES) or ".so" in str(e):
            return f"Qt cannot be loaded ({e})"
        raise
    if not callable(getattr(mod, "run_studio", None)):
        return "app.main has no run_studio()"
    return None


def no_display() -> bool:
    """On Linux without a display Qt aborts the process (it cannot be caught): check first."""
    return (sys.platform.startswith("linux") and not os.environ.get("DISPLAY")
            and not os.environ.get("WAYLAND_DISPLAY") and not os.environ.get("QT_QPA_PLATFORM"))


def debian_package(soname: str) -> str:
    """The Debian / Ubuntu package that usually ships a library: libxcb-cursor.so.0 -> libxcb-cursor0,
    libxkbcommon-x11.so.0 -> libxkbcommon-x11-0 (a dash before the version when the name ends in a digit)."""
    name, _, version = soname.partition(".so")
    name, version = name.lower(), version.lstrip(".").split(".")[0]
    return f"{name}-{version}" if name[-1:].isdigit() else f"{name}{version}"


def missing_xcb_libraries() -> list[str]:
    """The system libraries Qt's xcb platform plugin needs and cannot find (ldd says "not found").

    Qt aborts the whole process when the plugin fails to load ("could not load the Qt platform plugin
    xcb"), naming neither the library nor its package; Qt 6.5 and later need libxcb-cursor0, which
    many desktops lack. Empty when everything is there, or when this cannot be checked here."""
    import shutil
    import subprocess
    if not sys.platform.startswith("linux") or shutil.which("ldd") is None:
        return []
    try:   # found, not imported: agent_core never imports Qt (tests/test_layering.py)
        spec = importlib.util.find_spec("PySide6")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    qt = os.path.join(list(spec.submodule_search_locations)[0], "Qt")
    files = [os.path.join(qt, "plugins", "platforms", "libqxcb.so"), os.path.join(qt, "lib", "libQt6XcbQpa.so.6")]
    missing: list[str] = []
    for f in (f for f in files if os.path.exists(f)):
        try:
            out = subprocess.run(["ldd", f], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        for line in out.splitlines():
            lib, _, where = line.strip().partition(" => ")
            if where.strip() == "not found" and lib not in missing:
                missing.append(lib)
    return missing


def uses_xcb() -> bool:
    """Qt picks xcb on Linux when X is the display and nothing else was asked for."""
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0] == "xcb"
    return sys.platform.startswith("linux") and bool(os.environ.get("DISPLAY")) \
        and not os.environ.get("WAYLAND_DISPLAY")


def xcb_problem() -> str | None:
    missing = missing_xcb_libraries() if uses_xcb() else []
    if not missing:
        return None
    packages = " ".join(dict.fromkeys(debian_package(m) for m in missing))
    return (f"Qt's X11 (xcb) platform plugin needs {', '.join(missing)}, which this machine lacks; "
            f"on Debian or Ubuntu: sudo apt-get install {packages}")


def run(args) -> int:
    if no_display() and not args.screenshot:
        reason = ("there is no display (DISPLAY and WAYLAND_DISPLAY are unset; "
                  "--screenshot OUT.png renders the window offscreen)")
    else:
        reason = (None if args.screenshot else xcb_problem()) or editor_unavailable()
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
