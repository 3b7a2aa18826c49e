"""agent_core runs on GPU servers without Qt: it must never import Qt, pyqtgraph or the GUI packages.

Checked twice: statically (every import statement of every file, so a lazy import inside a function
is caught too) and dynamically (importing every agent_core module in a fresh interpreter leaves no
Qt module loaded).
"""
from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "agent_core"
FORBIDDEN = ("PySide6", "PySide2", "PyQt5", "PyQt6", "shiboken6", "shiboken2", "pyqtgraph", "qtpy",
             "app", "graph_editor", "profiler_view")
# The one sanctioned way up the layers: `stitchcuda studio` opens the editor by name, lazily.
# `stitchcuda studio` is the one command that opens the GUI: it imports app.main, and locates PySide6
# (find_spec, without importing it) to check the system libraries Qt's xcb plugin needs
ALLOWED_DYNAMIC = {("agent_core/commands/studio.py", "app.main"), ("agent_core/commands/studio.py", "PySide6")}


def _top(name: str) -> str:
    return name.split(".")[0]


def forbidden_imports(path: pathlib.Path, rel: str | None = None) -> list[str]:
    rel = rel or path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    bad = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if fname in ("import_module", "__import__", "find_spec"):
                if (rel, node.args[0].value) not in ALLOWED_DYNAMIC:
                    names = [node.args[0].value]
        bad += [f"{rel}:{node.lineno}: imports {n}" for n in names if _top(n) in FORBIDDEN]
    return bad


def test_no_file_under_agent_core_imports_qt_or_the_gui():
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 5
    bad = [b for f in files for b in forbidden_imports(f)]
    assert not bad, "agent_core must not import Qt or the GUI packages:\n" + "\n".join(bad)


def test_the_scan_catches_a_lazy_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from PySide6 import QtWidgets\n    import pyqtgraph as pg\n"
                     "    import importlib\n    importlib.import_module('graph_editor.scene')\n"
                     "    importlib.import_module('app.main')\n")
    found = forbidden_imports(probe, "agent_core/probe.py")
    assert [f.split(": ")[1] for f in found] == ["imports PySide6", "imports pyqtgraph", "imports graph_editor.scene",
                                                 "imports app.main"]


_IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
import agent_core
failed = {}
names = ["agent_core"]
for m in pkgutil.walk_packages(agent_core.__path__, "agent_core."):
    names.append(m.name)
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
bad = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
print(json.dumps({"modules": names, "failed": failed, "loaded": bad}))
"""


def test_importing_every_agent_core_module_loads_no_qt():
    code = f"FORBIDDEN = {FORBIDDEN!r}\n" + _IMPORT_ALL
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(out["modules"]) > 5
    assert not out["failed"], f"agent_core modules that fail to import: {out['failed']}"
    assert not out["loaded"], f"importing agent_core loaded {out['loaded']}"


def test_the_cli_parses_its_arguments_without_loading_torch():
    """`stitchcuda --help` answers at once, and `stitchcuda import` starts its import child before the
    parent loads torch (a file that fails there never costs the parent torch's 3 s): no command module
    imports torch until its command runs."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "agent_core.cli", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0 and "plan" in res.stdout, res.stderr[-2000:]
    loaded = [line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if "|" in line]
    assert "agent_core.errors" in loaded
    assert not [m for m in loaded if m.split(".")[0] == "torch"], "parsing the CLI's arguments loaded torch"
