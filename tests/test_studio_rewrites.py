"""Rewrites in the studio (pytest-qt, offscreen): Agent > Rewrites shows what each rule would do, the
program before and after; Apply edits the document as one undo step that Ctrl+Z reverts exactly; the
model stays equivalent to the reference; a stale preview is refused."""
from __future__ import annotations

import os

import pytest
import torch
from PySide6.QtCore import QStandardPaths
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
    assert len(program.nodes) == len(result.program.nodes) < len(before[0])
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


def test_rewrites_dialog_before_after_apply_and_undo(window, tmp_path):
    assert window.open_path(os.path.join(EXAMPLES, "conv_bn_relu.py"), layout_sync=True)
    program = window.document.program
    ops_before = sorted(n.op for n in program.nodes.values())
    dlg = window.agent.rewrite()
    assert dlg is not None and dlg.isVisible()
    assert "fold_batch_norm" in dlg.summary.text() and "3 ops become 2" in dlg.summary.text()
    assert dlg.rules.topLevelItemCount() >= 1 and "batch" in dlg.rules.topLevelItem(0).text(2).lower()
    removed = [program.nodes[n].op for n in dlg.marked(dlg.before)]
    assert "batch_norm" in removed and "conv2d" in removed
    assert [dlg.preview.rewritten.nodes[n].op for n in dlg.marked(dlg.after)] == ["conv2d"]
    assert sorted(n.op for n in program.nodes.values()) == ops_before      # nothing applied yet
    os.makedirs(SHOTS, exist_ok=True)
    dlg.grab().save(os.path.join(SHOTS, "rewrites_dialog.png"))
    dlg.apply_button.click()
    assert sorted(n.op for n in program.nodes.values()) == ["conv2d", "relu"]
    assert len(window.scene.nodes) == 2
    assert [window.scene.nodes[n].isSelected() for n in window.scene.nodes].count(True) == 1
    assert "Ctrl+Z" in _status(window)
    entry = window.agent.log.tree.topLevelItem(window.agent.log.tree.topLevelItemCount() - 1)
    assert "fold_batch_norm" in " ".join(entry.text(c) for c in range(entry.columnCount()))
    window.document.stack.undo()
    assert sorted(n.op for n in program.nodes.values()) == ops_before
    assert len(window.scene.nodes) == 3


def test_a_stale_preview_is_refused(window):
    assert window.open_path(os.path.join(EXAMPLES, "conv_bn_relu.py"), layout_sync=True)
    program = window.document.program
    dlg = window.agent.rewrite()
    relu = next(n for n in program.nodes.values() if n.op == "relu")
    window.document.stack.push(RemoveNode(program, relu.id))     # an edit after the preview
    dlg.apply_button.click()
    assert "changed since" in _status(window)
    assert sorted(n.op for n in program.nodes.values()) == ["batch_norm", "conv2d"]


def test_nothing_to_rewrite_says_so(window):
    assert window.open_path(os.path.join(EXAMPLES, "softmax_rows.py"), layout_sync=True)
    assert window.agent.rewrite() is None
    assert "No rewrite applies" in _status(window)


def _status(window) -> str:
    """What the status bar says: the last message and any refusal beside it."""
    return window.status_label.text() + " | " + window.refusal_label.text()
