"""A model that imports a package this machine lacks: the import says which package and how to get
it, through the command line, the studio's File > Open, and wherever the file first needs it (its top
level, Model.__init__, forward). A module beside the file is not called a package to install."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from agent_core.errors import ImportFailure
from agent_core.importers import import_file

MISSING = "stitchcuda_no_such_pkg_3f9a"   # a name no machine has installed
SAYS = f"imports {MISSING}, which is not installed on this machine (pip install {MISSING})"

AT_TOP = textwrap.dedent(f"""
    import torch
    import {MISSING}.layers as layers
    class Model(torch.nn.Module):
        def forward(self, x):
            return x
    def get_inputs():
        return [torch.randn(2, 3)]
""")


def _model(where: str) -> str:
    init = f"import {MISSING}" if where == "init" else "pass"
    fwd = f"import {MISSING}" if where == "forward" else "pass"
    return textwrap.dedent(f"""
        import torch
        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                {init}
            def forward(self, x):
                {fwd}
                return x * 2
        def get_inputs():
            return [torch.randn(2, 3)]
    """)


def test_the_command_line_names_the_missing_package(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(AT_TOP)
    r = subprocess.run([sys.executable, "-m", "agent_core.cli", "import", str(path), "-o", str(tmp_path / "m.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert f"model.py {SAYS}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("where, who", [("init", "Model(*init_args)"), ("forward", "the model's forward")])
def test_a_package_needed_later_than_the_top_level_is_named_too(tmp_path, where, who):
    path = tmp_path / "model.py"
    path.write_text(_model(where))
    with pytest.raises(ImportFailure) as err:
        import_file(path)
    assert str(err.value) == f"{who} {SAYS}"


def test_a_missing_module_beside_the_file_keeps_pythons_message(tmp_path):
    (tmp_path / "helpers.py").write_text("X = 1\n")
    path = tmp_path / "model.py"
    path.write_text("import helpers\n" + AT_TOP.replace(f"import {MISSING}.layers as layers\n", ""))
    with pytest.raises(ImportFailure, match=r"model.py: running the file failed: ModuleNotFoundError: "
                                            r"No module named 'helpers'") as err:
        import_file(path)
    assert "pip install" not in str(err.value)


def test_the_studio_shows_which_package_is_missing(studio_window, qtbot, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog
    path = tmp_path / "model.py"
    path.write_text(AT_TOP)
    win = studio_window
    before = win.document
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    with qtbot.waitSignal(win.opened, timeout=120000) as sig:
        win.act["open"].trigger()
    assert sig.args == [str(path), False]
    kind, _title, text = win.ask.asked[-1]
    assert kind == "error" and f"model.py {SAYS}" in text
    assert win.document is before
