"""The studio opening hostile .py files the way a user does (File > Open with the dialog answered): a
file that loops is cancelled with Esc, the Cancel button or a second open, and its process dies; files
that call os._exit or sys.exit show their error; the window, its document and later opens still work."""
from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest
from PySide6.QtCore import QStandardPaths, Qt
from PySide6.QtWidgets import QFileDialog

QStandardPaths.setTestModeEnabled(True)  # settings and recovery files go to a throw-away location

from agent_core.ir import Program  # noqa: E402
from agent_core.project_file import dumps, save_program  # noqa: E402

GOOD = textwrap.dedent("""
    import torch
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2.0
    def get_inputs():
        return [torch.randn(4, 8)]
    def get_init_inputs():
        return []
""")


def looping(tmp_path, name="loop.py") -> tuple[str, str]:
    """A file that writes its process id, then loops at top level: (path, pid file)."""
    pid_file = tmp_path / (name + ".pid")
    path = tmp_path / name
    path.write_text(f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True:\n    pass\n")
    return str(path), str(pid_file)


def program_file(tmp_path, name="base.json") -> str:
    p = Program("base")
    x = p.add_input("x", (4,))
    b = p.add_parameter("b", np.ones(4, np.float32))
    p.mark_output(p.add_node("add", [x.id, b.id]).outputs[0])
    path = str(tmp_path / name)
    save_program(p, path)
    return path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def started(qtbot, pid_file: str) -> int:
    """The importing process's id once the file runs."""
    qtbot.waitUntil(lambda: os.path.exists(pid_file) and os.path.getsize(pid_file) > 0, timeout=60000)
    return int(open(pid_file).read())


@pytest.fixture
def win(studio_window, tmp_path, qtbot, monkeypatch):
    """The window with base.json open; `choose(path)` answers the next File > Open dialog."""
    w = studio_window
    assert w.open_path(program_file(tmp_path))
    w.activateWindow()
    chosen = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (chosen.pop(0), ""))
    w.choose = chosen.append
    return w


def file_open(win, path):
    win.choose(path)
    win.act["open"].trigger()


def test_a_looping_file_is_cancelled_with_escape_and_the_next_open_succeeds(win, qtbot, tmp_path):
    before_doc, before = win.document, dumps(win.document.program)
    loop, pid_file = looping(tmp_path)
    file_open(win, loop)
    assert win.act["cancel_open"].isEnabled() and win.cancel_open_button.isVisible()
    pid = started(qtbot, pid_file)
    with qtbot.waitSignal(win.opened, timeout=5000) as sig:
        qtbot.keyClick(win.view, Qt.Key_Escape)
    assert sig.args == [loop, False]
    qtbot.waitUntil(lambda: not alive(pid), timeout=5000)       # the file's process is gone
    assert win.document is before_doc and dumps(win.document.program) == before
    assert not win.act["cancel_open"].isEnabled() and not win.cancel_open_button.isVisible()
    assert "Cancelled opening loop.py" in win.status_label.text()
    assert not any(a[0] == "error" for a in win.ask.asked)      # a cancel is not an error
    good = tmp_path / "good.py"
    good.write_text(GOOD)
    with qtbot.waitSignal(win.opened, timeout=60000) as sig:
        file_open(win, str(good))
    assert sig.args == [str(good), True]
    assert {n.op for n in win.document.program.nodes.values()} == {"relu", "mul_scalar"}
    assert win.document.path is None and win.document.dirty     # an import is unsaved


def test_the_cancel_button_and_a_second_open_each_stop_a_looping_import(win, qtbot, tmp_path):
    loop, pid_file = looping(tmp_path)
    file_open(win, loop)
    pid = started(qtbot, pid_file)
    with qtbot.waitSignal(win.opened, timeout=5000) as sig:
        qtbot.mouseClick(win.cancel_open_button, Qt.LeftButton)
    assert sig.args == [loop, False]
    qtbot.waitUntil(lambda: not alive(pid), timeout=5000)

    # a second File > Open while one runs cancels the first (never queued behind it)
    loop2, pid_file2 = looping(tmp_path, "loop2.py")
    file_open(win, loop2)
    pid2 = started(qtbot, pid_file2)
    other = program_file(tmp_path, "other.json")
    results = []
    win.opened.connect(lambda path, ok: results.append((path, ok)))
    with qtbot.waitSignal(win.opened, timeout=10000, check_params_cb=lambda path, ok: path == other):
        file_open(win, other)
    assert results == [(loop2, False), (other, True)]
    assert win.document.path == other
    qtbot.waitUntil(lambda: not alive(pid2), timeout=5000)


@pytest.mark.parametrize("body, says", [
    ("import os\nos._exit(0)\n", "the file ended the import process with exit status 0"),
    ("import sys\nsys.exit(0)\n", "the file called sys.exit(0)"),
])
def test_a_file_that_exits_shows_its_error_and_the_studio_goes_on(win, qtbot, tmp_path, body, says):
    before_doc = win.document
    bad = tmp_path / "model.py"
    bad.write_text(body)
    with qtbot.waitSignal(win.opened, timeout=60000) as sig:
        file_open(win, str(bad))
    assert sig.args == [str(bad), False]
    kind, title, text = win.ask.asked[-1]
    assert kind == "error" and f"model.py: {says}" in text
    assert win.document is before_doc
    other = program_file(tmp_path, "other.json")
    with qtbot.waitSignal(win.opened, timeout=10000) as sig:
        file_open(win, other)
    assert sig.args == [other, True] and win.document.path == other
