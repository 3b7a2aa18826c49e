"""A program built from an empty document, as a user builds it (pytest-qt, offscreen, CPU): File > New,
Tab "input", its shape typed in the inspector, Tab "linear", a drag to connect, weight and bias made
from the inspector, Tab "relu", its output marked from the context menu, then Plan, F5 (the worker
on the CPU) and File > Export CUDA project. Each gesture is one undo step that restores the program
exactly. Plan and Optimize refuse an invalid graph and list its problems, each one clickable."""
from __future__ import annotations

import json
import os
import sys

import pytest
from PySide6.QtCore import QPointF, QStandardPaths, Qt
from PySide6.QtWidgets import QApplication, QCheckBox

QStandardPaths.setTestModeEnabled(True)

from agent_core.ir import Role  # noqa: E402
from agent_core.project_file import program_to_json  # noqa: E402
from app.problems import ProblemsPanel  # noqa: E402
from graph_editor.edge_item import TerminalItem  # noqa: E402

from tests.studio import Answers  # noqa: E402

FAST = ("--no-rewrite", "--no-tune", "--cpu", "--no-baselines")


@pytest.fixture
def win(studio_window, monkeypatch):
    """The studio, with every exception that reaches the Qt event loop recorded (and failing the test)."""
    raised = []
    chained = sys.excepthook
    monkeypatch.setattr(sys, "excepthook", lambda *exc: (raised.append(exc), chained(*exc)))
    studio_window.raised = raised
    yield studio_window
    assert not raised, raised


def snapshot(win) -> str:
    """The program as its file holds it, less two things that carry no meaning: the id counter (undo
    never hands out an id twice) and the recorded shape of what a node whose inference fails makes
    (the model keeps the last shape it inferred; the node's error is what the editor shows)."""
    program = win.document.program
    obj = program_to_json(program)
    obj.pop("next_id")
    broken = {vid for n in program.nodes.values() if n.error for vid in n.outputs}
    for v in obj["values"]:
        if v["id"] in broken:
            v["shape"] = v["dtype"] = "(not inferred)"
    return json.dumps(obj, sort_keys=True)


def one_undo_step(win, gesture):
    """Run a gesture; it must add exactly one undo step, whose undo restores the program exactly and
    whose redo restores what the gesture made. Returns what the gesture returned."""
    stack = win.document.stack
    before, depth = snapshot(win), stack.count()
    result = gesture()
    settle()
    after = snapshot(win)
    assert stack.count() == depth + 1, [stack.text(i) for i in range(stack.count())]
    assert after != before
    stack.undo()
    assert snapshot(win) == before
    stack.redo()
    settle()
    assert snapshot(win) == after
    return result


def settle():
    QApplication.processEvents()   # the inspector rebuilds on the next loop turn after an edit
    QApplication.processEvents()


def tab_add(win, qtbot, text: str) -> None:
    """Tab on the canvas, type, Enter: what a user does to add an op, input, parameter or constant."""
    win.view.setFocus()
    qtbot.keyClick(win.view, Qt.Key_Tab)
    assert win.quick.isVisible()
    qtbot.keyClicks(win.quick.edit, text)
    qtbot.keyClick(win.quick.edit, Qt.Key_Return)
    assert not win.quick.isVisible()


def type_into(qtbot, editor, text: str) -> None:
    editor.setFocus()
    editor.selectAll()
    qtbot.keyClicks(editor, text)
    qtbot.keyClick(editor, Qt.Key_Return)
    settle()


def choose(combo, data) -> None:
    """Pick an entry of a combo box as a user does (the activated signal a click or Enter gives)."""
    i = combo.findData(data)
    assert i >= 0, data
    combo.setCurrentIndex(i)
    combo.activated.emit(i)
    settle()


def click_on(win, qtbot, item) -> None:
    """A click on the item's body, left of centre (the middle of a terminal is near its port)."""
    r = item.sceneBoundingRect()
    at = win.view.mapFromScene(QPointF(r.left() + 0.2 * r.width(), r.center().y()))
    qtbot.mouseClick(win.view.viewport(), Qt.LeftButton, pos=at)
    assert item.isSelected()
    settle()


def only(items):
    items = list(items)
    assert len(items) == 1, items
    return items[0]


def test_program_built_from_scratch_plans_optimizes_and_exports(win, qtbot, tmp_path):
    win.act["new"].trigger()
    program = win.document.program
    assert not program.nodes and not program.values

    # an input, from Tab "input", drawn as a terminal where the quick search was opened
    one_undo_step(win, lambda: tab_add(win, qtbot, "input"))
    x = only(program.inputs)
    terminal = win.scene.terminals[x]
    assert isinstance(terminal, TerminalItem)
    click_on(win, qtbot, terminal)   # the inspector shows it
    shape = win.inspector.source_editors[(x, "shape")]
    # a bad shape is refused with a message and changes nothing
    depth, before = win.document.stack.count(), snapshot(win)
    type_into(qtbot, shape, "4, x")
    err = win.inspector.source_errors[x]
    assert err.isVisibleTo(win.inspector) and "not a shape" in err.text()
    type_into(qtbot, win.inspector.source_editors[(x, "shape")], "4, 0")
    assert "at least 1" in win.inspector.source_errors[x].text()
    assert win.document.stack.count() == depth and snapshot(win) == before
    one_undo_step(win, lambda: type_into(qtbot, win.inspector.source_editors[(x, "shape")], "[4, 32]"))
    assert program.values[x].shape == (4, 32)
    one_undo_step(win, lambda: type_into(qtbot, win.inspector.source_editors[(x, "name")], "tokens"))
    assert program.values[x].name == "tokens"

    # linear from Tab, wired from the input's terminal by the connect gesture
    one_undo_step(win, lambda: tab_add(win, qtbot, "linear"))
    lin = only(n.id for n in program.nodes.values() if n.op == "linear")
    sc = win.scene
    one_undo_step(win, lambda: sc.finish_drag(("out", x), sc.target_pos(lin, 0)))
    assert program.nodes[lin].inputs[0] == x

    # weight and bias from the inspector: the weight is shaped [out, in] from the input
    sc.select_nodes([lin])
    settle()
    new_weight = win.inspector.port_actions[(1, "parameter")]
    assert "[32, 32]" in new_weight.text()
    one_undo_step(win, lambda: qtbot.mouseClick(win.inspector.port_actions[(1, "parameter")], Qt.LeftButton))
    w = program.nodes[lin].inputs[1]
    assert program.values[w].role == Role.PARAMETER and program.values[w].shape == (32, 32)
    assert program.data[w].shape == (32, 32) and w not in sc.terminals   # drawn inside linear
    one_undo_step(win, lambda: type_into(qtbot, win.inspector.source_editors[(w, "shape")], "16, 32"))
    assert program.values[program.nodes[lin].outputs[0]].shape == (4, 16)
    one_undo_step(win, lambda: choose(win.inspector.source_editors[(w, "init")], "uniform"))
    assert program.values[w].init == {"kind": "uniform", "low": 0.0, "high": 1.0}
    one_undo_step(win, lambda: type_into(qtbot, win.inspector.source_editors[(w, "low")], "-0.25"))
    data = program.data[w]
    assert program.values[w].init["low"] == -0.25 and data.min() >= -0.25 and data.max() <= 1.0
    assert "[16]" in win.inspector.port_actions[(2, "parameter")].text()
    one_undo_step(win, lambda: qtbot.mouseClick(win.inspector.port_actions[(2, "parameter")], Qt.LeftButton))
    b = program.nodes[lin].inputs[2]
    assert program.values[b].shape == (16,) and program.nodes[lin].error is None
    one_undo_step(win, lambda: choose(win.inspector.source_editors[(b, "init")], "zeros"))
    assert not program.data[b].any()

    # relu from Tab, fed by linear; its output marked from the context menu (and unmarked, and back)
    one_undo_step(win, lambda: tab_add(win, qtbot, "relu"))
    relu = only(n.id for n in program.nodes.values() if n.op == "relu")
    one_undo_step(win, lambda: sc.finish_drag(("out", program.nodes[lin].outputs[0]), sc.target_pos(relu, 0)))
    out = program.nodes[relu].outputs[0]
    menu = sc.context_menu(sc.nodes[relu].sceneBoundingRect().center())
    mark = only(a for a in menu.actions() if a.text().startswith("Mark") and "program output" in a.text())
    one_undo_step(win, mark.trigger)
    assert program.outputs == [out]
    sc.select_nodes([relu])
    settle()
    box = only(c for c in win.inspector.widget().findChildren(QCheckBox) if c.text() == "program output")
    assert box.isChecked()
    one_undo_step(win, lambda: qtbot.mouseClick(box, Qt.LeftButton))
    assert program.outputs == []
    win.document.stack.undo()
    assert program.outputs == [out]
    assert not [d for d in program.validate() if d.severity == "error"]

    # Plan (Ctrl+Shift+P's action) gives regions
    win.agent.act["plan"].trigger()
    assert program.regions and any(lin in r.nodes for r in program.regions)

    # Optimize (F5) runs the worker on the CPU to the end
    win.agent.worker_args = FAST
    with qtbot.waitSignal(win.agent.worker.finished, timeout=120_000) as done:
        win.windowHandle().requestActivate()   # offscreen, a closed popup leaves no window active
        qtbot.waitUntil(lambda: QApplication.activeWindow() is win, timeout=5_000)
        win.view.setFocus()
        qtbot.keyClick(win.view, Qt.Key_F5)
        assert win.agent.worker.running, (win.refusal_label.text(), win.status_label.text(),
                                          QApplication.activeWindow(), QApplication.focusWidget())
    assert done.args[0] == "no-gpu", done.args

    # File > Export CUDA project writes a project into the folder the dialog gives
    dest = tmp_path / "from_scratch_cuda"
    win.ask = Answers(folder=str(dest))
    with qtbot.waitSignal(win.agent.exported, timeout=60_000) as sig:
        win.agent.act["export"].trigger()
    assert sig.args == [str(dest), True], win.refusal_label.text()
    assert (dest / "CMakeLists.txt").is_file() and list((dest / "kernels").glob("*.cu"))

    shot = os.environ.get("STITCHCUDA_SCRATCH_SHOT")
    if shot:   # for looking at it: STITCHCUDA_SCRATCH_SHOT=/tmp/scratch.png pytest -k from_scratch
        with qtbot.waitSignal(win.layout_runner.finished, timeout=10_000):
            win.act["layout"].trigger()
        win.view.fit_all()
        settle()
        win.grab().save(shot)


def test_plan_and_optimize_refuse_an_invalid_graph_and_list_its_problems(win, qtbot):
    win.act["new"].trigger()
    program = win.document.program
    tab_add(win, qtbot, "linear")
    lin = only(program.nodes)
    win.scene.clearSelection()
    depth = win.document.stack.count()

    win.agent.act["plan"].trigger()
    assert program.regions == [] and win.document.stack.count() == depth
    assert "Plan refused" in win.refusal_label.text()
    panel = win.findChild(ProblemsPanel)
    assert panel.dock.isVisible()
    texts = [panel.list.item(i).text() for i in range(panel.list.count())]
    unconnected = only(i for i, t in enumerate(texts) if "not connected" in t)
    assert "x, weight" in texts[unconnected] and "linear" in texts[unconnected]
    # clicking the problem selects the node it names (and centres it)
    item = panel.list.item(unconnected)
    qtbot.mouseClick(panel.list.viewport(), Qt.LeftButton, pos=panel.list.visualItemRect(item).center())
    assert win.scene.selected_node_ids() == [lin]

    # Optimize (F5) is refused too: no worker starts
    win.view.setFocus()
    qtbot.keyClick(win.view, Qt.Key_F5)
    assert not win.agent.worker.running and "Optimize refused" in win.refusal_label.text()

    # fixing it from the inspector empties the list, and Plan runs
    settle()
    qtbot.mouseClick(win.inspector.port_actions[(0, "input")], Qt.LeftButton)
    settle()
    qtbot.mouseClick(win.inspector.port_actions[(1, "parameter")], Qt.LeftButton)
    settle()
    assert panel.list.count()   # still no program output
    win.scene.set_program_output(program.nodes[lin].outputs[0], True)
    qtbot.waitUntil(lambda: panel.list.count() == 0, timeout=5_000)
    assert panel.dock.windowTitle() == "Problems"
    win.agent.act["plan"].trigger()
    assert program.regions or "Planned" in win.status_label.text()


def test_palette_and_context_menu_make_inputs_parameters_and_constants(win, qtbot):
    win.act["new"].trigger()
    program, sc = win.document.program, win.scene
    # the palette tree lists them under Program; "weight" finds the parameter
    win.palette.filter.setText("weight")
    qtbot.keyClick(win.palette.filter, Qt.Key_Return)
    w = only(program.values)
    assert program.values[w].role == Role.PARAMETER and w in sc.terminals   # unread: a terminal
    # a constant from the canvas's context menu, where it was asked for; its value typed in the inspector
    at = QPointF(400, 300)
    menu = sc.context_menu(at)
    one_undo_step(win, only(a for a in menu.actions() if a.text() == "Add constant here").trigger)
    c = only(v for v in program.values if program.values[v].role == Role.CONSTANT)
    assert sc.terminals[c].pos() == at
    click_on(win, qtbot, sc.terminals[c])
    value = win.inspector.source_editors[(c, "value")]
    type_into(qtbot, value, "[1, 2")
    assert "not a value" in win.inspector.source_errors[c].text() and program.data[c].shape == ()
    one_undo_step(win, lambda: type_into(qtbot, win.inspector.source_editors[(c, "value")], "[[1, 2], [3, 4]]"))
    assert program.values[c].shape == (2, 2) and program.data[c].tolist() == [[1, 2], [3, 4]]
    # an unconnected port of a node offers a new input, parameter or constant on right-click
    tab_add(win, qtbot, "add")
    add = only(n.id for n in program.nodes.values() if n.op == "add")
    port = sc.target_pos(add, 1)
    menu = sc.context_menu(port)
    one_undo_step(win, only(a for a in menu.actions() if a.text() == "New constant for b").trigger)
    assert program.values[program.nodes[add].inputs[1]].role == Role.CONSTANT
    # connecting an existing value from the inspector: the parameter leaves the canvas for its reader
    sc.select_nodes([add])
    settle()
    pick = win.inspector.port_actions[(0, "connect")]
    one_undo_step(win, lambda: choose(pick, c))
    assert program.nodes[add].inputs[0] == c and c not in sc.terminals


def test_the_regions_dock_plan_button_refuses_an_invalid_graph_too(win, qtbot):
    """relu -> sigmoid on an input plans fine, but with no program output it is not a program."""
    win.act["new"].trigger()
    sc = win.scene
    x = sc.add_source("input", QPointF(0, 0))
    relu = sc.add_node("relu", QPointF(0, 100), connect_from=x)
    sc.add_node("sigmoid", QPointF(0, 250), connect_from=win.document.program.nodes[relu].outputs[0])
    qtbot.mouseClick(win.agent.regions.buttons["plan"], Qt.LeftButton)
    assert win.document.program.regions == []
    assert "Could not plan: the program has no output" in win.refusal_label.text()
