"""Rewrites in the studio (pytest-qt, offscreen): Agent > Rewrites shows what each rule would do, the
program before and after; Apply edits the document as one undo step that Ctrl+Z reverts exactly; the
model stays equivalent to the reference; a stale preview is refused."""
from __future__ import annotations

import os

import pytest
import torch
from PySide6.QtCore import QStandardPaths, Qt
from PySide6.QtGui import QUndoStack

QStandardPaths.setTestModeEnabled(True)

from agent_core.importers import import_file  # noqa: E402
from agent_core.reference import random_inputs, run_reference  # noqa: E402
from agent_core.rewrites import rewrite_program  # noqa: E402
from graph_editor.commands import RemoveNode  # noqa: E402
from graph_editor.rewrite_commands import apply_rewritten  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "resources", "examples")
SHOTS = os.path.join(os.path.dirname(__file__), "..", "test-output", "screenshots")
REWRITTEN = ["conv_bn_relu", "conv2d_bias_relu", "linear_sum_features", "matmul_dropout_mean_softmax"]


def _shape(program):
    return [(n, program.nodes[n].op, tuple(program.nodes[n].inputs)) for n in program.topo_order()], \
        list(program.outputs), sorted(program.values)


@pytest.mark.parametrize("name", REWRITTEN)
def test_apply_rewritten_is_one_exact_undo_step(qapp, name):
    program = import_file(os.path.join(EXAMPLES, f"{name}.py"))
    result = rewrite_program(program)
    assert result.fired
    before = _shape(program)
    stack = QUndoStack()
    added = apply_rewritten(stack, program, result.program)
    assert stack.count() == 1 and added
    program.check()
    assert len(program.nodes) == len(result.program.nodes) <= len(before[0])
    drawn = random_inputs(program, 3)
    got, want = run_reference(program, drawn), run_reference(result.program, drawn)
    assert len(got) == len(want)
    for a, b in zip(got.values(), want.values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    stack.undo()
    assert _shape(program) == before
    stack.redo()
    program.check()
    assert len(program.nodes) == len(result.program.nodes)


@pytest.fixture
def window(studio_window):
    return studio_window


def test_rewrites_dialog_before_after_apply_and_undo(window, qtbot, tmp_path):
    assert window.open_path(os.path.join(EXAMPLES, "conv_bn_relu.py"), layout_sync=True)
    program = window.document.program
    ops_before = sorted(n.op for n in program.nodes.values())
    dlg = _rewrites(window, qtbot)
    assert dlg is not None and dlg.isVisible()
    # batch norm folded into the conv, whose bias then becomes an add the relu's kernel does
    assert "fold_batch_norm" in dlg.summary.text() and "bias_into_epilogue" in dlg.summary.text()
    assert "3 ops become 3" in dlg.summary.text()
    assert dlg.rules.topLevelItemCount() >= 1 and "batch" in dlg.rules.topLevelItem(0).text(2).lower()
    # the second rule fired on the conv the first one made: named, though neither side has that node
    assert [dlg.rules.topLevelItem(k).text(1) for k in (0, 1)] == ["batch_norm", "conv2d"]
    removed = [program.nodes[n].op for n in dlg.marked(dlg.before)]
    assert "batch_norm" in removed and "conv2d" in removed
    assert [dlg.preview.rewritten.nodes[n].op for n in dlg.marked(dlg.after)] == ["conv2d", "add"]
    assert sorted(n.op for n in program.nodes.values()) == ops_before      # nothing applied yet
    os.makedirs(SHOTS, exist_ok=True)
    dlg.grab().save(os.path.join(SHOTS, "rewrites_dialog.png"))
    dlg.apply_button.click()
    assert sorted(n.op for n in program.nodes.values()) == ["add", "conv2d", "relu"]
    assert len(window.scene.nodes) == 3
    selected = sorted(program.nodes[n].op for n in window.scene.nodes if window.scene.nodes[n].isSelected())
    assert selected == ["add", "conv2d"]                                   # what the rewrite added
    assert "Ctrl+Z" in _status(window)
    tree = window.agent.log.tree
    last_two = [tree.topLevelItem(tree.topLevelItemCount() - k) for k in (2, 1)]
    logged = [" ".join(e.text(c) for c in range(e.columnCount())) for e in last_two]
    assert "fold_batch_norm" in logged[0] and "bias_into_epilogue" in logged[1], logged
    window.document.stack.undo()
    assert sorted(n.op for n in program.nodes.values()) == ops_before
    assert len(window.scene.nodes) == 3


def test_a_stale_preview_is_refused(window, qtbot):
    assert window.open_path(os.path.join(EXAMPLES, "conv_bn_relu.py"), layout_sync=True)
    program = window.document.program
    dlg = _rewrites(window, qtbot)
    relu = next(n for n in program.nodes.values() if n.op == "relu")
    window.document.stack.push(RemoveNode(program, relu.id))     # an edit after the preview
    dlg.apply_button.click()
    assert "changed since" in _status(window)
    assert sorted(n.op for n in program.nodes.values()) == ["batch_norm", "conv2d"]


def test_nothing_to_rewrite_says_so(window, qtbot):
    assert window.open_path(os.path.join(EXAMPLES, "softmax_rows.py"), layout_sync=True)
    assert _rewrites(window, qtbot) is None
    assert "No rewrite applies" in _status(window)


def _big_program():
    from agent_core.ir import Program
    p = Program("big_matmul")
    a, b = p.add_input("a", (4096, 4096)).id, p.add_input("b", (4096, 4096)).id
    p.mark_output(p.add_node("matmul", [a, b]).outputs[0])
    return p


def test_a_big_program_asks_before_checking_and_the_check_can_be_cancelled(window, qtbot):
    from app.document import Document
    window.set_document(Document(_big_program()))
    window.ask.answers["confirm"] = "no"
    assert _rewrites(window, qtbot, wait=False) is None
    assert window.ask.asked[-1][0] == "confirm" and "Check anyway" in window.ask.asked[-1][2]
    assert "not checked" in _status(window) and window.agent.rewrite_check is None
    window.ask.answers["confirm"] = "yes"           # check anyway: it runs in a child, the editor stays live
    _rewrites(window, qtbot, wait=False)
    check = window.agent.rewrite_check
    assert check.running and "--check-anyway" in check.proc.arguments()
    qtbot.waitUntil(lambda: window.agent.rewrite_progress.isVisible(), timeout=3000)   # shown after 300 ms, not Qt's 4 s
    from PySide6.QtWidgets import QPushButton
    cancel = window.agent.rewrite_progress.findChild(QPushButton)
    assert cancel.text() == "Cancel"
    with qtbot.waitSignal(window.agent.rewrites_checked, timeout=10_000):
        qtbot.mouseClick(cancel, Qt.LeftButton)
    assert not check.running and not os.path.exists(check.folder)
    assert "cancelled" in _status(window) and window.agent.rewrite_dialog is None


def test_a_check_that_fails_in_its_process_is_reported(window, qtbot):
    from app.document import Document
    program = _big_program()
    window.set_document(Document(program))
    window.ask.answers["confirm"] = "yes"
    _rewrites(window, qtbot, wait=False)
    with qtbot.waitSignal(window.agent.rewrites_checked, timeout=10_000):
        window.agent.rewrite_check.proc.kill()     # as if a rule had crashed the process
    assert "could not be checked" in _status(window) and window.agent.rewrite_dialog is None
    assert window.document.program is program and len(program.nodes) == 1


def _rewrites(window, qtbot, wait: bool = True):
    """Agent > Rewrites as a user starts it; the dialog it opened, or None."""
    window.agent.rewrite_dialog = None
    if wait:
        with qtbot.waitSignal(window.agent.rewrites_checked, timeout=120_000):
            window.agent.act["rewrite"].trigger()
    else:
        window.agent.act["rewrite"].trigger()
    return window.agent.rewrite_dialog


def _status(window) -> str:
    """What the status bar says: the last message and any refusal beside it."""
    return window.status_label.text() + " | " + window.refusal_label.text()
