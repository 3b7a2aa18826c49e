"""Every action of the studio, reached as a user reaches it (pytest-qt, offscreen, CPU).

The menus are walked from menuBar() down (submenus too), the toolbars and the canvas's context menus
are read, and each action is fired on three documents: (a) an empty one, with trigger(); (b) the
bundled mlp_block.py opened through File > Open, with its shortcut pressed on the focused canvas where
it has one; (c) a saved planned program, with a click on its toolbar button where it has one. Each
action must do what its label says (the effect checked per action in EFFECTS: a document, a file, a
dock, a dialog, a status line) or be greyed out with a tooltip that says why. Dialogs are answered
through the window's ask hook, the file dialogs are patched, and any exception that reaches the Qt
event loop fails the test.

Also here: New and Open leave nothing of a replayed H200 run in any dock; a planned file opens with its
estimates; a .py opened over unsaved work asks once; the inspector of a linear node fits its dock.
"""
from __future__ import annotations

import os
import sys

import pytest
from PySide6.QtCore import QPointF, QStandardPaths, Qt
from PySide6.QtWidgets import QApplication, QDockWidget, QFileDialog, QLabel, QToolBar

QStandardPaths.setTestModeEnabled(True)

from agent_core.planner import apply_plan, plan_program  # noqa: E402
from agent_core.project_file import load_program, save_program  # noqa: E402
from app.studio_agent import StudioAgent  # noqa: E402
from graph_editor.region_item import region_label  # noqa: E402
from profiler_view.summary import EMPTY  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "resources", "examples", "mlp_block.py")
SMALL_PY = os.path.join(ROOT, "tests", "data", "mlp_small.py")
H200 = os.path.join(ROOT, "tests", "data", "mlp_small_h200")
SHOTS = os.path.join(ROOT, "test-output", "screenshots")
FAST = ("--no-rewrite", "--no-tune", "--cpu", "--no-baselines")
SLOW_MS = 120_000   # a child process that imports torch, on two shared cores


class Dialogs:
    """The file dialogs, patched: each answers what the test set last (as a user picking a file)."""

    def __init__(self, monkeypatch, tmp_path):
        self.open = EXAMPLE
        self.save = str(tmp_path / "saved.json")
        self.folder = H200
        self.exports = 0
        self.tmp = tmp_path
        self.asked: list[tuple] = []
        monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (self.open, ""))
        monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (self.save, ""))
        monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: self.folder)

    def ask(self, kind, title, text):
        """The window's modal questions: discard unsaved work, a new empty folder for each export."""
        self.asked.append((kind, title, text))
        if kind == "folder":
            self.exports += 1
            return str(self.tmp / f"export{self.exports}")
        return {"unsaved": "discard", "confirm": "yes", "restore": "no"}.get(kind, "ok")


@pytest.fixture
def win(studio_window, monkeypatch, tmp_path):
    """The studio with patched file dialogs, and every exception that reaches the Qt event loop
    recorded (any one fails the test)."""
    raised = []
    chained = sys.excepthook
    monkeypatch.setattr(sys, "excepthook", lambda *exc: (raised.append(exc), chained(*exc)))
    studio_window.dialogs = Dialogs(monkeypatch, tmp_path)
    studio_window.ask = studio_window.dialogs.ask
    studio_window.agent.worker_args = FAST
    studio_window.raised = raised
    yield studio_window
    assert not raised, raised


# reaching the actions ------------------------------------------------------------------------------
def label(action) -> str:
    return action.text().replace("&", "").rstrip("…").strip()


def menu_actions(win) -> list:
    """Every action in the menu bar, submenus walked (a submenu's own action included)."""
    found = []

    def walk(menu):
        for a in menu.actions():
            if a.isSeparator():
                continue
            found.append(a)
            if a.menu() is not None:
                walk(a.menu())
    for top in win.menuBar().actions():
        walk(top.menu())
    return found


def toolbar_actions(win) -> list:
    return [a for tb in win.findChildren(QToolBar) for a in tb.actions() if not a.isSeparator()]


def dock_of(win, action):
    return next((d for d in win.findChildren(QDockWidget) if d.toggleViewAction() is action), None)


def focus_canvas(win, qtbot) -> None:
    """Shortcuts go to the active window: a popup closed offscreen leaves none active."""
    win.windowHandle().requestActivate()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is win, timeout=5_000)
    win.view.setFocus()


def press(win, qtbot, action) -> None:
    """The action's first shortcut, pressed on the focused canvas."""
    focus_canvas(win, qtbot)
    combo = action.shortcut()[0]
    qtbot.keyClick(win.view, combo.key(), combo.keyboardModifiers())


def click_toolbar(win, qtbot, action) -> None:
    tb = next(t for t in win.findChildren(QToolBar) if action in t.actions())
    button = tb.widgetForAction(action)
    assert button is not None and button.isVisible(), label(action)
    qtbot.mouseClick(button, Qt.LeftButton)


def settle(win, qtbot) -> None:
    """Wait for what an action started in the background (an open, an export, a layout, a rewrite
    check), then close what it left open (the quick search, the rewrite dialog)."""
    qtbot.waitUntil(lambda: not win.act["cancel_open"].isEnabled(), timeout=SLOW_MS)
    qtbot.waitUntil(lambda: win.agent.act["export"].isEnabled(), timeout=SLOW_MS)
    qtbot.waitUntil(lambda: not win.layout_runner.busy(), timeout=SLOW_MS)
    check = win.agent.rewrite_check
    qtbot.waitUntil(lambda: check is None or not check.running, timeout=SLOW_MS)
    QApplication.processEvents()
    win.quick.hide()
    if win.agent.rewrite_dialog is not None:
        win.agent.rewrite_dialog.close()
        win.agent.rewrite_dialog = None
    if win.agent.writer_dialog is not None:
        win.agent.writer_dialog.close()
    if win.agent.precision_dialog is not None:
        win.agent.precision_dialog.close()


# what each action must visibly do ------------------------------------------------------------------
class Before:
    """What a user can see, taken before an action (the status lines are emptied first, so any
    message the action gives shows)."""

    def __init__(self, win, state):
        win.status_label.setText("")
        win.refusal_label.setText("")
        p = win.document.program
        self.win, self.state = win, state
        self.doc, self.program, self.doc_path = win.document, p, win.document.path
        self.nodes, self.values, self.outputs = len(p.nodes), len(p.values), list(p.outputs)
        self.regions = len(p.regions)
        self.undo_index = win.document.stack.index()
        self.zoom = win.view.zoom()
        self.theme = win.theme
        self.clip = QApplication.clipboard().text()
        self.asked = len(win.dialogs.asked)
        self.groups = len(win.scene.groups)


def said(win) -> str:
    return (win.status_label.text() + " | " + win.refusal_label.text()).strip(" |")


def replaced(b, win) -> bool:
    return win.document is not b.doc


def opened_file(b, win) -> bool:
    return replaced(b, win) and bool(win.document.program.nodes)


def saved(b, win) -> bool:
    """Written where the dialog said, or (Save of a document with a file) to that file."""
    path = win.document.path
    return bool(path) and os.path.isfile(path) and not win.document.dirty and path in (win.dialogs.save, b.doc_path)


def exported(b, win) -> bool:
    if not b.nodes:
        return "Nothing to export" in said(win)
    folder = str(win.dialogs.tmp / f"export{win.dialogs.exports}")
    return "Exported" in said(win) and os.path.isfile(os.path.join(folder, "CMakeLists.txt"))


def node_count(change):
    def check(b, win):
        n = len(win.document.program.nodes)
        return (n - b.nodes) * change > 0 if b.selected else bool(said(win))
    return check


def copied(b, win) -> bool:
    return (QApplication.clipboard().text() != b.clip and "stitchcuda-clip" in QApplication.clipboard().text()) \
        if b.selected else "Nothing selected" in said(win)


def pasted(b, win) -> bool:
    return len(win.document.program.nodes) > b.nodes or "not hold nodes" in said(win)


def all_selected(b, win) -> bool:
    if not b.nodes and not b.values:
        return "Nothing to select" in said(win)
    return len(win.scene.selected_node_ids()) == len(win.document.program.nodes) and "selected" in said(win)


def fitted(selection):
    def check(b, win):
        sc = win.scene
        items = [i for i in sc.selectedItems()] if selection else list(sc.nodes.values())
        if not items:
            return "Nothing" in said(win)
        seen = win.view.mapToScene(win.view.viewport().rect()).boundingRect()
        return all(seen.contains(i.sceneBoundingRect().center()) for i in items)
    return check


def planned(b, win) -> bool:
    p = win.document.program
    if not p.nodes:
        return "Nothing to plan" in said(win)
    return bool(p.regions) and bool(win.agent.overlay.items) and "Planned" in said(win)


def rewrites_shown(b, win) -> bool:
    if not b.nodes:
        return "Nothing to rewrite" in said(win)
    check, dlg = win.agent.rewrite_check, win.agent.rewrite_dialog
    if check is None or check.running:
        return False
    return (dlg is not None and dlg.isVisible()) or "No rewrite applies" in said(win)


def optimized(b, win) -> bool:
    if not b.nodes:
        return "Nothing to optimize" in said(win) or "Optimize refused" in said(win)
    # the worker started (F5 to the end on the CPU is test_studio_from_scratch's); Cancel Optimize,
    # next in the menu, stops it with Shift+F5 or its toolbar button
    return win.agent.worker.running and "Optimizing" in said(win)


def cancelled(b, win) -> bool:
    return not win.agent.worker.running and "cancelled" in said(win)


def undone(b, win) -> bool:
    return win.document.stack.index() == b.undo_index - 1


def redone(b, win) -> bool:
    return win.document.stack.index() == b.undo_index + 1


def collapsed(b, win) -> bool:
    return len(win.scene.groups) == b.groups + 1 if b.selected_nodes >= 2 else "at least two" in said(win)


# label -> what it must do once triggered (when enabled)
EFFECTS = {
    "Kernel Writer": lambda b, w: w.agent.writer_dialog is not None and w.agent.writer_dialog.isVisible(),
    "Precision and Tolerance": lambda b, w: w.agent.precision_dialog is not None and w.agent.precision_dialog.isVisible(),
    "New": lambda b, w: replaced(b, w) and not w.document.program.nodes,
    "Open": opened_file,
    "Open results": lambda b, w: replaced(b, w) and "H200" in w.agent.profiles.note.text(),
    "Import PyTorch / KernelBench file": opened_file,
    "Cancel opening": lambda b, w: "Cancelled opening" in said(w),
    "Save": saved,
    "Save As": saved,
    "Export CUDA project": exported,
    "Undo": undone,
    "Redo": redone,
    "Cut": node_count(-1),
    "Copy": copied,
    "Paste": pasted,
    "Duplicate": node_count(+1),
    "Delete": node_count(-1),
    "Select All": all_selected,
    "Zoom in": lambda b, w: w.view.zoom() > b.zoom or "as far as it goes" in said(w),
    "Zoom out": lambda b, w: w.view.zoom() < b.zoom or "as far as it goes" in said(w),
    "Fit program": fitted(False),
    "Fit selection": fitted(True),
    "Toggle dark / light theme": lambda b, w: w.theme != b.theme and w.scene.style.name == w.theme,
    "Add node": lambda b, w: w.quick.isVisible(),
    "Auto layout": lambda b, w: ("Laid out" in said(w)) if b.nodes else "Nothing to lay out" in said(w),
    "Collapse selection": collapsed,
    "Expand group": lambda b, w: "Select a collapsed group" in said(w) or len(w.scene.groups) < b.groups,
    "Validate": lambda b, w: "valid" in said(w) or "error" in said(w),
    "Plan regions": planned,
    "Rewrites": rewrites_shown,
    "Optimize": optimized,
    "Cancel Optimize": cancelled,
    "Follow Benchmark Run": lambda b, w: "Following the benchmark run in" in said(w),
    "Stop Following": lambda b, w: "Stopped following" in said(w),
}
SUBMENUS = {"Open Recent"}
NOT_IN_THE_LOOP = {"Quit"}   # it ends the window: fired once, last


def fire(win, qtbot, action, state) -> None:
    """As a user reaches it: (b) its shortcut on the canvas, (c) its toolbar button, else trigger()."""
    if state == "loaded" and not action.shortcut().isEmpty():
        press(win, qtbot, action)
    elif state == "planned" and action in toolbar_actions(win):
        focus_canvas(win, qtbot)
        click_toolbar(win, qtbot, action)
    else:
        action.trigger()


def check_action(win, qtbot, action, state, setup) -> None:
    name = label(action)
    prepare(win, name, setup)
    if name == "Cancel opening" and state == "loaded":   # enabled while an open runs: start one
        win.dialogs.open = SMALL_PY
        win.act["open"].trigger()
    if not action.isEnabled():
        why = action.toolTip()
        assert why and why == action.statusTip() and why != action.property("tip"), \
            f"{state}: '{name}' is disabled without saying why (tooltip {why!r})"
        return
    if action.menu() is not None:
        assert name in SUBMENUS and action.menu().actions(), f"{state}: submenu '{name}' is enabled but empty"
        return
    dock = dock_of(win, action)
    if dock is None and name not in EFFECTS:
        pytest.fail(f"{state}: no expected effect is written for the action '{name}' (add it to EFFECTS)")
    b = Before(win, state)
    b.selected = bool(win.scene.selectedItems())
    b.selected_nodes = len(win.scene.selected_node_ids())
    was = dock.isVisible() if dock is not None else None
    fire(win, qtbot, action, state)
    if dock is not None:
        assert dock.isVisible() != was, f"{state}: '{name}' did not show or hide its dock"
        action.trigger()   # and back, so the next actions see the usual window
        assert dock.isVisible() == was
    else:
        try:
            qtbot.waitUntil(lambda: EFFECTS[name](b, win), timeout=SLOW_MS if name in SLOW else 3_000)
        except qtbot.TimeoutError:
            pytest.fail(f"{state}: '{name}' did nothing visible (status: {said(win)!r})")
    if name != "Optimize":
        settle(win, qtbot)
    assert not win.raised, f"{state}: '{name}' raised {win.raised[-1][:2]}"


SLOW = {"Open", "Import PyTorch / KernelBench file", "Export CUDA project", "Rewrites", "Optimize", "Auto layout",
        "Cancel Optimize", "Cancel opening"}


ON_THE_DOCUMENT_AS_OPENED = {"Plan regions", "Rewrites", "Optimize", "Export CUDA project"}


def prepare(win, name, setup) -> None:
    """What the user does before an action that works on something: a document as the state has it
    (after New or Open replaced it), a node selected, two for Collapse, a paste in the clipboard."""
    if win.document is not setup.doc or (name in ON_THE_DOCUMENT_AS_OPENED and win.document.dirty):
        setup.restore()   # the Edit actions before cut and deleted nodes: the agent gets the program whole
    win.dialogs.open = setup.json
    win.dialogs.save = str(win.dialogs.tmp / f"saved_{setup.state}.json")
    win.dialogs.folder = H200
    if name == "Copy":
        QApplication.clipboard().setText("")
    nodes = list(win.document.program.topo_order())
    if name in ("Cut", "Copy", "Duplicate", "Delete", "Fit selection", "Collapse selection") and nodes:
        win.scene.select_nodes(nodes[:2] if name == "Collapse selection" else nodes[:1])
    if name in ("Fit program", "Fit selection") and nodes:   # zoomed in, away from the program
        win.view.zoom_by(4)
        win.view.centerOn(QPointF(20_000, 20_000))
        items = list(win.scene.nodes.values())
        seen = win.view.mapToScene(win.view.viewport().rect()).boundingRect()
        assert not all(seen.contains(i.sceneBoundingRect().center()) for i in items)
    if name == "Undo" and not win.document.stack.canUndo() and nodes:
        win.scene.select_nodes(nodes[:1])
        win.duplicate()   # something to undo


class Setup:
    """One of the three documents; restore() brings it back after an action replaced it."""

    def __init__(self, win, qtbot, state, json_path):
        self.win, self.qtbot, self.state, self.json = win, qtbot, state, json_path
        self.doc = win.document

    def restore(self) -> None:
        win = self.win
        if self.state == "empty":
            win.act["new"].trigger()
        else:
            assert win.open_path(self.json, layout_sync=True)
        self.doc = win.document


def walk_every_action(win, qtbot, setup) -> set[str]:
    seen = set()
    recent = set(win.recent_menu.actions())   # rebuilt by each open and save: fired once, after the rest
    for action in menu_actions(win):
        if action in recent:
            continue
        name = label(action)
        if name in NOT_IN_THE_LOOP:
            continue
        check_action(win, qtbot, action, setup.state, setup)
        seen.add(name)
    entries = win.recent_menu.actions()
    assert entries, "files were opened and saved, yet File > Open Recent is empty"
    check_recent(win, qtbot, entries[0], setup)
    return seen


def check_recent(win, qtbot, action, setup) -> None:
    """An Open Recent entry opens its file, or says why it could not (a file since moved)."""
    if win.document is not setup.doc:
        setup.restore()
    b = Before(win, setup.state)
    action.trigger()
    qtbot.waitUntil(lambda: replaced(b, win) or len(win.dialogs.asked) > b.asked, timeout=SLOW_MS)
    settle(win, qtbot)


def check_context_menu(win, qtbot, at: QPointF, state) -> int:
    """Every action of the canvas's right-click menu at `at` adds, connects or marks what it says."""
    menu = win.scene.context_menu(at)
    actions = [a for a in menu.actions() if not a.isSeparator()]
    for a in actions:
        name = label(a)
        p = win.document.program
        b = Before(win, state)
        a.trigger()
        QApplication.processEvents()
        if name == "Add node here":
            ok = win.quick.isVisible()
        elif name.startswith(("Add ", "New ")):
            ok = len(p.values) == b.values + 1 and win.document.stack.index() == b.undo_index + 1
        elif "as program output" in name:
            ok = p.outputs != b.outputs
        else:
            ok = False
        assert ok, f"{state}: the context menu's '{name}' did nothing visible"
        win.quick.hide()
        assert not win.raised, f"{state}: context menu '{name}' raised {win.raised[-1][:2]}"
    return len(actions)


def planned_file(tmp_path, program) -> tuple[str, str]:
    """The document saved (loaded.json), and the same planned in agent_core as `stitchcuda plan -o` does
    (planned.json)."""
    path = str(tmp_path / "loaded.json")
    save_program(program, path)
    p = load_program(path)
    apply_plan(p, plan_program(p))
    out = str(tmp_path / "planned.json")
    save_program(p, out)
    return path, out


# the tests -----------------------------------------------------------------------------------------
def test_every_action_on_empty_loaded_and_planned_documents(win, qtbot, tmp_path):
    labels = {label(a) for a in menu_actions(win)}
    # every toolbar button is also in a menu, where the walk below reaches it
    assert not {label(a) for a in toolbar_actions(win)} - labels
    # (b) first, so its File > Open of mlp_block.py gives the program the other two use
    win.dialogs.open = EXAMPLE
    with qtbot.waitSignal(win.opened, timeout=SLOW_MS) as sig:
        win.act["open"].trigger()
    assert sig.args == [EXAMPLE, True] and win.document.program.nodes
    loaded_json, planned_json = planned_file(tmp_path, win.document.program)

    win.act["new"].trigger()
    seen = walk_every_action(win, qtbot, Setup(win, qtbot, "empty", loaded_json))
    # the canvas's context menu on empty canvas (add an input, a parameter, a constant, a node) ...
    win.act["new"].trigger()
    assert check_context_menu(win, qtbot, QPointF(0, 0), "empty") >= 4
    # ... and on a node with open ports (a new input or parameter for each, mark its output)
    lin = win.scene.add_node("linear", QPointF(300, 0))
    QApplication.processEvents()
    node = win.scene.nodes[lin]
    port = win.scene.target_pos(lin, 0)
    assert check_context_menu(win, qtbot, port, "empty") >= 3
    assert check_context_menu(win, qtbot, node.sceneBoundingRect().center(), "empty") >= 1

    assert win.open_path(loaded_json, layout_sync=True)
    seen |= walk_every_action(win, qtbot, Setup(win, qtbot, "loaded", loaded_json))
    assert win.open_path(planned_json, layout_sync=True)
    assert win.document.program.regions
    seen |= walk_every_action(win, qtbot, Setup(win, qtbot, "planned", planned_json))
    assert labels - NOT_IN_THE_LOOP - {label(a) for a in win.recent_menu.actions()} <= seen

    # Quit, last: over unsaved work it asks first (Cancel keeps the window), then closes
    win.scene.add_node("relu", QPointF(0, 0))
    win.ask = lambda kind, title, text: win.dialogs.asked.append((kind, title, text)) or "cancel"
    quit_action = next(a for a in menu_actions(win) if label(a) == "Quit")
    quit_action.trigger()
    assert win.isVisible() and win.dialogs.asked[-1][0] == "unsaved"
    win.ask = win.dialogs.ask
    quit_action.trigger()
    assert not win.isVisible()


def test_new_and_open_leave_nothing_of_a_replayed_run(win, qtbot, tmp_path):
    agent = win.agent
    win.dialogs.folder = H200
    next(a for a in menu_actions(win) if label(a) == "Open results").trigger()
    pv = agent.profiles
    # the replay filled every dock
    assert "Measured on NVIDIA H200" in pv.note.text() and pv.kernels.bars is not None
    assert agent.regions.tree.topLevelItemCount() == 3 and agent.overlay.items
    assert agent.log.tree.topLevelItemCount() > 10 and "H200" in pv.summary.plain_text()
    agent.select_region("r1")
    assert "mlp_small_r1" in agent.source.edit.toPlainText()
    old_nodes = set(win.document.program.nodes)

    win.act["new"].trigger()

    def nothing_left(expect_regions=0):
        assert "Measured" not in pv.note.text() and "H200" not in pv.note.text()
        assert not pv.data.kernels and not pv.data.end_to_end and not pv.data.hardware
        assert pv.kernels.bars is None or not pv.kernels.bars.regions
        assert pv.timeline.bars is None or not pv.timeline.bars.regions
        assert "H200" not in pv.summary.plain_text()
        assert agent.regions.tree.topLevelItemCount() == expect_regions
        assert len(agent.overlay.items) == expect_regions
        assert all(e["event"] == "studio" and e.get("level") == "warning" for e in agent.log.events), agent.log.events
        assert "mlp_small_r1" not in agent.source.edit.toPlainText() and agent.current is None
        assert not old_nodes & set(win.scene.nodes)
    nothing_left()
    assert "mlp_small" not in win.status_label.text() and "New empty program" in win.status_label.text()
    for plot in (pv.kernels, pv.e2e):   # the old run's time axes went with it
        (x0, x1), (y0, y1) = plot.plotItem.getViewBox().viewRange()
        assert max(abs(x0), abs(x1), abs(y0), abs(y1)) <= 1.0, (plot.title, x0, x1, y0, y1)
    assert pv.summary.plain_text() == EMPTY and not agent.source.edit.toPlainText()
    assert "No region selected" in agent.source.title.text()

    # after the replay again, File > Open of a planned program: its own regions, with their estimates
    agent.open_results(H200)
    program = load_program(os.path.join(H200, "program.json"))
    program.regions = []
    program.profile = None
    apply_plan(program, plan_program(program))
    path = str(tmp_path / "planned.json")
    save_program(program, path)
    win.dialogs.open = path
    with qtbot.waitSignal(win.opened, timeout=SLOW_MS):
        win.act["open"].trigger()
    n = len(program.regions)
    assert n and win.document.path == path
    assert "Planner estimates" in pv.note.text()
    assert sorted(pv.data.kernels) == sorted(r.id for r in program.regions)
    assert all(k.est_after_ms is not None and k.ms is None for k in pv.data.kernels.values())
    assert pv.kernels.bars is not None and len(pv.kernels.bars.regions) == 2 * n   # before and after each
    assert "Estimate" in pv.summary.plain_text() or "proposed" in pv.summary.plain_text()
    assert agent.regions.tree.topLevelItemCount() == n
    speedups = [agent.regions.tree.topLevelItem(i).text(4) for i in range(n)]
    assert all(s.endswith("est.") for s in speedups), speedups
    assert sorted(agent.overlay.items) == sorted(r.id for r in program.regions)
    labels = [region_label(item.region) for item in agent.overlay.items.values()]
    assert all("est." in text for text in labels), labels
    assert not agent.log.events or all(e["event"] == "studio" for e in agent.log.events)


def test_new_during_optimize_stops_the_run_and_keeps_nothing_of_it(win, qtbot):
    assert win.open_path(os.path.join(H200, "program.json"))
    agent = win.agent
    focus_canvas(win, qtbot)
    qtbot.keyClick(win.view, Qt.Key_F5)
    assert agent.worker.running and agent.act["cancel"].isEnabled()
    with qtbot.waitSignal(agent.worker.finished, timeout=SLOW_MS):
        win.act["new"].trigger()
        assert not agent.log.events and not agent.profiles.data.kernels
    assert "stopped" in win.status_label.text() and not agent.worker.running
    assert not agent.log.events and not agent.profiles.data.kernels and not win.document.program.regions
    assert agent.act["optimize"].isEnabled() and not agent.act["cancel"].isEnabled()
    assert "not running" in agent.act["cancel"].toolTip()


def test_opening_a_py_over_unsaved_work_asks_once(win, qtbot):
    win.scene.add_node("relu", QPointF(0, 0))
    assert win.document.dirty
    win.dialogs.open = SMALL_PY
    with qtbot.waitSignal(win.opened, timeout=SLOW_MS) as sig:
        win.act["open"].trigger()
    assert sig.args == [SMALL_PY, True]
    assert [a[1] for a in win.dialogs.asked].count("Unsaved changes") == 1, win.dialogs.asked
    # an edit made while a file is read is new unsaved work: asked about again (once more); a program
    # file is read on the loader thread too, and its result waits for the event loop
    win.scene.add_node("relu", QPointF(0, 0))
    win.dialogs.asked.clear()
    win.dialogs.open = os.path.join(H200, "program.json")
    with qtbot.waitSignal(win.opened, timeout=SLOW_MS) as sig:
        win.act["open"].trigger()
        win.scene.add_node("relu", QPointF(0, 0))
    assert sig.args == [win.dialogs.open, True]
    assert [a[1] for a in win.dialogs.asked].count("Unsaved changes") == 2, win.dialogs.asked


def test_inspector_of_a_linear_node_fits_its_dock(win, qtbot, tmp_path):
    assert win.size().width() == 1500 and win.size().height() == 940
    ins = win.inspector

    def section(text):
        return next(lab for lab in ins.widget().findChildren(QLabel) if lab.text() == text)

    def settled():
        for _ in range(3):
            QApplication.processEvents()
    # a linear node with its input, weight and bias: the whole INPUTS section in view, no sideways scroll
    p = load_program(os.path.join(H200, "program.json"))
    win.set_document(win.document.__class__(p))
    lin = next(n for n in p.topo_order() if p.nodes[n].op == "linear")
    win.scene.select_nodes([lin])
    settled()
    assert ins.target == ("node", lin)
    inputs, outputs = section("INPUTS"), section("OUTPUTS")
    view_h = ins.viewport().height()
    assert view_h >= 220, view_h
    end_of_inputs = outputs.mapTo(ins.widget(), outputs.rect().topLeft()).y()
    assert inputs.isVisible() and end_of_inputs <= view_h, (end_of_inputs, view_h)
    assert ins.horizontalScrollBar().maximum() == 0
    os.makedirs(SHOTS, exist_ok=True)
    shot = ins.grab()
    assert shot.height() >= 220 and shot.save(os.path.join(SHOTS, "inspector_linear.png"))
    # a linear built from scratch (its ports open: a New input / New parameter / connect row each)
    win.act["new"].trigger()
    lin = win.scene.add_node("linear", QPointF(0, 0))
    win.scene.select_nodes([lin])
    settled()
    body = ins.widget()
    assert ins.horizontalScrollBar().maximum() == 0 and body.width() <= ins.viewport().width()
    if body.sizeHint().height() > ins.viewport().height():
        assert ins.verticalScrollBar().maximum() > 0   # the rest is a vertical scroll away
    shot = win.grab()
    assert shot.save(os.path.join(SHOTS, "inspector_open_ports.png"))


def test_studio_agent_uses_only_the_window_public_api():
    """studio_agent.py reaches the window through its public actions, menus and docks."""
    import inspect
    import re
    src = inspect.getsource(sys.modules[StudioAgent.__module__])
    assert not re.findall(r"\b(?:w|window|self\.window)\._\w+", src)
    assert "menuBar().actions()" not in src


def test_open_results_shows_the_memory_plan_in_the_summary(win, tmp_path):
    """A run's profile.json with its memory plan: the results summary says the predicted peak against
    the budget and what the plan changed to stay within it."""
    import json
    import shutil
    folder = tmp_path / "run"
    shutil.copytree(H200, folder)
    prof = json.loads((folder / "profile.json").read_text())
    prof["end_to_end"]["memory"] = {
        "budget_bytes": 3 << 20, "budget": "eager's peak, estimated from the program",
        "predicted_peak_bytes": 5 << 19, "peak_step": 2, "cache_bytes": 0, "weights_per_call": ["n4"],
        "split_tf32": {"n4": {"chosen": "3xtf32", "runs_as": "3xtf32", "weights": "split per call"},
                       "n8": {"chosen": "3xtf32", "runs_as": "fp32", "weights": "none"}}}
    (folder / "profile.json").write_text(json.dumps(prof))
    win.dialogs.folder = str(folder)
    next(a for a in menu_actions(win) if label(a) == "Open results").trigger()
    text = win.agent.profiles.summary.plain_text()
    assert ("Memory: 2.5 MiB predicted peak of a 3.0 MiB budget (eager's peak, estimated from the program); "
            "to save memory: 1 split-TF32 call in fp32, 1 call splitting or converting weights every call") in text, text
    os.makedirs(SHOTS, exist_ok=True)
    win.grab().save(os.path.join(SHOTS, "studio_memory_summary.png"))
    win.act["new"].trigger()
    assert "Memory" not in win.agent.profiles.summary.plain_text()
