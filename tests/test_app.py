"""The studio window end to end (pytest-qt, offscreen): import an example, screenshots in both themes,
save / reopen / compare, clipboard, undo history, layout and collapse from the menus, and safety
(unsaved prompt, autosave recovery, load errors that leave the document alone)."""
from __future__ import annotations

import os

import pytest
from PySide6.QtCore import QPointF, QStandardPaths, Qt
from PySide6.QtWidgets import QApplication

QStandardPaths.setTestModeEnabled(True)  # settings and recovery files go to a throw-away location

from agent_core.project_file import dumps, load_program, save_program  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from tests.studio import Answers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "resources", "examples", "mlp_block.py")
SHOTS = os.path.join(ROOT, "test-output", "screenshots")

SMALL_MODULE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)
    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0

def get_inputs():
    return [torch.randn(8, 32)]

def get_init_inputs():
    return []
'''


@pytest.fixture
def window(studio_window):
    return studio_window


def example_path(tmp_path) -> str:
    if os.path.exists(EXAMPLE):
        return EXAMPLE
    path = tmp_path / "small_model.py"
    path.write_text(SMALL_MODULE)
    return str(path)


def test_import_example_screenshots_save_reopen(window, qtbot, tmp_path):
    win = window
    assert win.open_path(example_path(tmp_path), layout_sync=True)
    p = win.document.program
    assert len(p.nodes) >= 2 and all(n.pos is not None for n in p.nodes.values())
    assert win.document.dirty and win.document.path is None   # an import is unsaved
    assert set(win.scene.nodes) == set(p.nodes)
    # the dark and the light screenshot of the imported example
    os.makedirs(SHOTS, exist_ok=True)
    win.view.show_program()
    first = p.topo_order()[0]
    win.scene.select_nodes([first])               # the inspector shows a node in the screenshots
    assert win.inspector.target == ("node", first)
    win.screenshot(os.path.join(SHOTS, "studio_dark.png"))
    win.toggle_theme()
    assert win.theme == "light" and win.scene.style.name == "light"
    win.screenshot(os.path.join(SHOTS, "studio_light.png"))
    for name in ("studio_dark.png", "studio_light.png"):
        assert os.path.getsize(os.path.join(SHOTS, name)) > 20_000
    # save, reopen, compare
    path = str(tmp_path / "prog.json")
    assert win.save_as(path)
    assert not win.document.dirty and win.document.path == path
    assert win.open_path(path)
    assert dumps(win.document.program) == dumps(p)
    assert {n: v.pos for n, v in win.document.program.nodes.items()} == {n: v.pos for n, v in p.nodes.items()}


def test_edit_undo_history_copy_paste_through_window(window, qtbot, tmp_path):
    win = window
    sc = win.scene
    a = sc.add_node("relu", QPointF(0, 0))
    win.document.program.add_input("x", (2, 3))  # a model edit outside the undo stack shows up too
    x = win.document.program.inputs[0]
    assert x in sc.terminals
    sc.try_connect(x, a, 0)
    assert win.history.stack() is win.document.stack and win.document.stack.count() == 2
    assert win.document.dirty and win.isWindowModified()
    # copy / paste through the system clipboard, as our mime type and as plain JSON text
    sc.select_nodes([a])
    assert win.copy()
    new = win.paste()
    assert len(new) == 1 and win.document.program.nodes[new[0]].inputs == [x]
    text = QApplication.clipboard().text()
    assert '"stitchcuda-clip"' in text
    QApplication.clipboard().setText(text)       # text only, as if pasted from an editor
    assert len(win.paste()) == 1
    QApplication.clipboard().setText("hello")
    assert win.paste() == [] and "not hold nodes" in win.refusal_label.text()
    win.document.stack.undo()
    win.document.stack.undo()
    assert set(win.document.program.nodes) == {a}
    # duplicate and delete from the menus
    sc.select_nodes([a])
    assert len(win.duplicate()) == 1
    win.act["delete"].trigger()
    win.document.stack.undo()
    assert len(win.document.program.nodes) == 2


def test_layout_and_collapse_from_menus(window, qtbot):
    win = window
    sc = win.scene
    prev = None
    for k in range(6):
        nid = sc.add_node("sigmoid", QPointF(0, 0))
        if prev:
            sc.try_connect(win.document.program.nodes[prev].outputs[0], nid, 0)
        prev = nid
    sc.clearSelection()
    with qtbot.waitSignal(win.layout_runner.finished, timeout=10000):
        win.act["layout"].trigger()
    assert win.document.stack.undoText() == "Auto layout"
    sc.select_nodes(list(win.document.program.nodes)[:3])
    win.act["collapse"].trigger()
    assert len(sc.groups) == 1 and "Collapsed 3 nodes" in win.status_label.text()
    assert win.document.stack.undoText().startswith("Collapse 3 nodes")
    win.act["expand"].trigger()
    assert not sc.groups
    # each gesture is one undo step, from the keyboard too
    win.activateWindow()
    win.view.setFocus()
    qtbot.keyClick(win.view, Qt.Key_Z, Qt.ControlModifier)
    assert len(sc.groups) == 1 and win.document.program.metadata["editor"]["collapsed"][0]["nodes"]
    qtbot.keyClick(win.view, Qt.Key_Z, Qt.ControlModifier)
    assert not sc.groups and win.document.stack.undoText() == "Auto layout"
    qtbot.keyClick(win.view, Qt.Key_Y, Qt.ControlModifier)
    qtbot.keyClick(win.view, Qt.Key_Y, Qt.ControlModifier)
    assert not sc.groups and win.document.stack.undoText().startswith("Expand")


def test_load_error_keeps_document_and_shows_cause(window, tmp_path):
    win = window
    nid = win.scene.add_node("relu", QPointF(0, 0))
    before = win.document
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "stitchcuda-program", "version": 1, "nodes": [')
    win.ask = Answers(unsaved="discard")
    assert not win.open_path(str(bad))
    kind, title, text = win.ask.asked[-1]
    assert kind == "error" and str(bad) in text and len(text.splitlines()[-1]) > 10
    assert win.document is before and nid in win.document.program.nodes
    assert not win.open_path(str(tmp_path / "missing.json"))
    assert "no such file" in win.ask.asked[-1][2]


def test_unsaved_prompt_on_close(window):
    win = window
    win.scene.add_node("relu", QPointF(0, 0))
    win.ask = Answers(unsaved="cancel")
    assert not win.close() and win.isVisible()
    assert win.ask.asked[-1][0] == "unsaved"
    win.ask = Answers(unsaved="discard")
    assert win.close()


def test_autosave_and_recovery(window, qtbot, tmp_path):
    win = window
    nid = win.scene.add_node("gelu", QPointF(10, 20))
    rec = win.autosave()
    assert rec and os.path.exists(rec)
    assert win.autosave() is None              # nothing changed since: nothing written
    text = dumps(win.document.program)
    # a crash: the window goes away without a clean close; the next session offers the copy
    win2 = MainWindow(theme="light", restore_settings=False)
    qtbot.addWidget(win2)
    win2.ask = Answers(restore="yes")
    assert win2.offer_recovery()
    assert dumps(win2.document.program) == text and nid in win2.document.program.nodes
    assert win2.document.dirty and not os.path.exists(rec)
    win2.document.mark_clean()
    win2.close()


def test_screenshot_entry_point(tmp_path):
    """`python -m app FILE --screenshot OUT.png --theme light`, as a shell runs it (in a process of its
    own: the studio's start sets application-wide state that must not leak into other tests)."""
    import subprocess
    import sys
    from agent_core.ir import Program
    p = Program("cli")
    x = p.add_input("x", (4, 4))
    p.mark_output(p.add_node("relu", [x.id]).outputs[0])
    src = tmp_path / "p.json"
    save_program(p, src)
    out = tmp_path / "shot.png"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def studio(path):
        return subprocess.run([sys.executable, "-m", "app", str(path), "--screenshot", str(out), "--theme", "light"],
                              capture_output=True, text=True, cwd=root, timeout=120,
                              env={**os.environ, "PYTHONPATH": root})
    res = studio(src)
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size > 10_000
    assert studio(tmp_path / "nope.json").returncode == 1
    assert load_program(src).name == "cli"


def test_tab_quick_search_and_drag_to_empty_canvas(window, qtbot):
    win = window
    sc = win.scene
    win.view.setFocus()
    qtbot.keyClick(win.view, "\t")
    assert win.quick.isVisible() and win.quick.title.text() == "Add node"
    qtbot.keyClicks(win.quick.edit, "layer_norm")
    assert win.quick.list.currentItem().data(0x0100) == "layer_norm"
    win.quick.hide()
    # a drag from a free output released on empty canvas offers only ops that accept the value
    x = win.document.program.add_input("mask", (4, 4), "bool").id
    sc.finish_drag(("out", x), QPointF(5000, 5000))
    offered = {win.quick.list.item(i).data(0x0100) for i in range(win.quick.list.count())}
    assert "logical_not" in offered and "relu" not in offered
    win.quick._accept("logical_not")
    node = next(n for n in win.document.program.nodes.values() if n.op == "logical_not")
    assert node.inputs == [x] and node.pos == (5000.0, 5000.0)
    assert win.document.stack.undoText() == "Add logical_not"   # add + connect: one step


def test_open_in_background_keeps_window_usable(window, qtbot, tmp_path):
    win = window
    path = example_path(tmp_path)
    with qtbot.waitSignal(win.opened, timeout=60000) as sig:
        win.open_in_background(path)
        assert win.status_label.text().startswith("Opening")   # returned at once
    assert sig.args == [path, True] and len(win.document.program.nodes) >= 2
    with qtbot.waitSignal(win.opened, timeout=10000) as sig:
        win.open_in_background(str(tmp_path / "missing.json"))
    assert sig.args[1] is False and "no such file" in win.ask.asked[-1][2]
