"""Agent > Precision and Tolerance… driven as a user drives it (pytest-qt, offscreen): the program's
tolerance and allowed lower precisions are typed and ticked, checked as typed, saved as one undo step
into the program (so the worker's Optimize and the saved file carry them), undone with Ctrl+Z's action;
a project file's malformed setting is reported instead of opening the dialog."""
from __future__ import annotations

import os

from PySide6.QtCore import QPoint, Qt

from agent_core.project_file import load_program, save_program
from agent_core.runtime.low_precision import allowed
from agent_core.verify import tolerance
from app.document import Document
from tests.test_cli import mlp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _open(win):
    win.agent.act["precision"].trigger()
    dlg = win.agent.precision_dialog
    assert dlg is not None and dlg.isVisible()
    return dlg


def _type(qtbot, edit, text):
    edit.selectAll()
    qtbot.keyClicks(edit, text)


def test_the_tolerance_and_allowed_precisions_are_saved_into_the_program_as_one_undo_step(studio_window, qtbot,
                                                                                         tmp_path):
    win = studio_window
    program, _ = mlp(tmp_path)
    win.set_document(Document(program))
    program = win.document.program
    assert "Precision and &Tolerance…" in [a.text() for a in win.menu("agent").actions()]
    dlg = _open(win)
    assert (dlg.atol.text(), dlg.rtol.text()) == ("0.0001", "0.0001")
    assert not any(box.isChecked() for box in dlg.forms.values())
    save = dlg.buttons.button(dlg.buttons.StandardButton.Save)
    _type(qtbot, dlg.atol, "abc")
    assert not save.isEnabled() and "atol must be a number" in dlg.problem.text() == save.toolTip()
    _type(qtbot, dlg.atol, "2")
    assert not save.isEnabled() and "above 0 and below 1" in dlg.problem.text()
    _type(qtbot, dlg.atol, "1e-3")
    _type(qtbot, dlg.rtol, "2e-3")
    assert save.isEnabled() and dlg.problem.text() == ""
    box = dlg.forms["bf16"]
    qtbot.mouseClick(box, Qt.LeftButton, pos=QPoint(8, box.height() // 2))
    assert box.isChecked()
    shots = os.path.join(ROOT, "test-output", "screenshots")
    os.makedirs(shots, exist_ok=True)
    dlg.grab().save(os.path.join(shots, "precision_dialog.png"))
    depth = win.document.stack.count()
    qtbot.mouseClick(save, Qt.LeftButton)
    assert not dlg.isVisible()
    assert tolerance(program) == (1e-3, 2e-3) and allowed(program) == ["bf16"]
    assert win.document.stack.count() == depth + 1 and not win.document.stack.isClean()
    assert "atol 0.001, rtol 0.002" in win.status_label.text() and "bf16" in win.status_label.text()
    path = str(tmp_path / "handed.json")          # what the worker gets, and what File > Save writes
    save_program(program, path)
    assert tolerance(load_program(path)) == (1e-3, 2e-3) and allowed(load_program(path)) == ["bf16"]
    win.act["undo"].trigger()
    assert "tolerance" not in program.metadata and allowed(program) == []
    win.act["redo"].trigger()
    assert tolerance(program) == (1e-3, 2e-3)
    dlg = _open(win)                               # opens on what the program holds
    assert (dlg.atol.text(), dlg.rtol.text()) == ("0.001", "0.002") and dlg.forms["bf16"].isChecked()
    qtbot.mouseClick(dlg.buttons.button(dlg.buttons.StandardButton.RestoreDefaults), Qt.LeftButton)
    qtbot.mouseClick(dlg.buttons.button(dlg.buttons.StandardButton.Save), Qt.LeftButton)
    assert "tolerance" not in program.metadata and "allow_precision" not in program.metadata


def test_saving_unchanged_settings_adds_no_undo_step(studio_window, qtbot, tmp_path):
    win = studio_window
    win.set_document(Document(mlp(tmp_path)[0]))
    dlg = _open(win)
    depth = win.document.stack.count()
    qtbot.mouseClick(dlg.buttons.button(dlg.buttons.StandardButton.Save), Qt.LeftButton)
    assert win.document.stack.count() == depth and not dlg.isVisible()


def test_a_malformed_setting_in_the_file_is_reported_and_the_program_kept(studio_window, tmp_path):
    win = studio_window
    program, _ = mlp(tmp_path)
    program.metadata["tolerance"] = {"atol": "loose"}
    win.set_document(Document(program))
    win.agent.act["precision"].trigger()
    assert win.agent.precision_dialog is None
    assert "tolerance atol must be a number" in win.refusal_label.text()
    assert win.document.program.metadata["tolerance"] == {"atol": "loose"}
