"""Agent > Rewrites: the algebraic rewrites the agent would make, before and after, applied to the
document as one undoable edit only when the user says so.

Each rewrite was checked on random draws of the reference (agent_core.rewrites); the dialog lists the
ones that fired with the rule's own explanation, the ones refused with why, and the program's nodes
before and after (removed ones marked in the first list, new ones in the second).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QHBoxLayout, QLabel, QListWidget, QListWidgetItem,
                               QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget)

from agent_core.errors import StitchError
from agent_core.ir import Program
from agent_core.project_file import save_program
from graph_editor.rewrite_commands import kept_nodes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REMOVED = ("-", QColor(226, 96, 96))     # diff-style marker and colour of a node that goes away
ADDED = ("+", QColor(86, 196, 120))      # ... and of one the rewrites put in
MARKED = Qt.UserRole + 1


@dataclass
class RewritePreview:
    program: Program          # the document's program, untouched
    rewritten: Program        # the copy with the rewrites applied
    fired: list[dict]
    refused: list[dict]

    @property
    def summary(self) -> str:
        if not self.fired:
            return "No rewrite applies to this program."
        counts: dict[str, int] = {}
        for e in self.fired:
            counts[e["rule"]] = counts.get(e["rule"], 0) + 1
        rules = ", ".join(f"{r} x{n}" for r, n in sorted(counts.items()))
        n = len(self.fired)
        return (f"{n} rewrite{'s fire' if n != 1 else ' fires'}: {len(self.program.nodes)} ops become "
                f"{len(self.rewritten.nodes)} ({rules}). Each was checked against the reference on random draws.")

    def removed_nodes(self) -> set[str]:
        return set(self.program.nodes) - kept_nodes(self.program, self.rewritten)

    def added_nodes(self) -> set[str]:
        return set(self.rewritten.nodes) - kept_nodes(self.program, self.rewritten)


def too_big_reason(program: Program) -> str | None:
    """Why checking the rewrites here may take long (the same limit as `stitchcuda optimize` on a CPU)."""
    from agent_core.agent.loop import too_big_to_check
    big = too_big_to_check(program)
    return (f"checking rewrites runs the reference on the CPU, and for this program ({big}) that may take "
            "minutes") if big else None


class RewriteCheck(QObject):
    """`stitchcuda rewrite --json` on a saved copy of the program, in a child process: a long check
    never blocks the editor, Cancel kills it, and a rewrite rule that crashes takes only the child down.
    Ends with exactly one of ready(RewritePreview) or failed(message)."""
    ready = Signal(object)
    failed = Signal(str)

    def __init__(self, program: Program, check_anyway: bool = False, parent=None):
        super().__init__(parent)
        self.program = program
        self.folder = tempfile.mkdtemp(prefix="stitchcuda-rewrite-")
        self._out, self._ended = b"", False
        path = os.path.join(self.folder, "program.json")
        save_program(program, path)   # StitchError / OSError reach the caller: nothing was started
        self.proc = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONPATH", ROOT + os.pathsep + env.value("PYTHONPATH", ""))
        self.proc.setProcessEnvironment(env)
        self.proc.setWorkingDirectory(self.folder)
        self.proc.readyReadStandardOutput.connect(self._read)
        self.proc.finished.connect(self._finished)
        self.proc.errorOccurred.connect(self._error)
        args = ["-m", "agent_core.cli", "rewrite", path, "--json"] + (["--check-anyway"] if check_anyway else [])
        self.proc.start(sys.executable, args)

    @property
    def running(self) -> bool:
        return self.proc.state() != QProcess.NotRunning

    def cancel(self) -> None:
        if self.running:
            self._end(self.failed, "Rewrites: the check was cancelled; nothing changed")
            self.proc.kill()
            self.proc.waitForFinished(2000)

    def _read(self) -> None:
        self._out += bytes(self.proc.readAllStandardOutput())

    def _error(self, err) -> None:
        if err == QProcess.FailedToStart:
            self._end(self.failed, f"Rewrites could not be checked: the check could not start "
                                   f"({self.proc.errorString()})")

    def _finished(self, code: int, _status) -> None:
        from agent_core.project_file import program_from_json
        self._read()
        err = bytes(self.proc.readAllStandardError()).decode("utf-8", "replace").strip().splitlines()
        if code != 0:
            why = err[-1] if err else f"the check exited with code {code}"
            self._end(self.failed, f"Rewrites could not be checked: {why.removeprefix('stitchcuda rewrite: ')}")
            return
        try:
            obj = json.loads(self._out.decode("utf-8").strip().splitlines()[-1])
            rewritten = program_from_json(obj["program"], None)
        except (ValueError, KeyError, IndexError, StitchError) as e:
            self._end(self.failed, f"Rewrites could not be checked: the check's answer was unreadable ({e})")
            return
        self._end(self.ready, RewritePreview(self.program, rewritten, list(obj["fired"]), list(obj["refused"])))

    def _end(self, signal, value) -> None:
        if self._ended:
            return
        self._ended = True
        shutil.rmtree(self.folder, ignore_errors=True)
        signal.emit(value)


def _node_line(program: Program, nid: str) -> str:
    node = program.nodes[nid]
    args = ", ".join(program.values[v].name if v else "-" for v in node.inputs)
    outs = ", ".join(f"{program.values[v].name} {list(program.values[v].shape)}" for v in node.outputs)
    return f"{node.name} = {node.op}({args}) -> {outs}"


class RewriteDialog(QDialog):
    apply_requested = Signal()

    def __init__(self, preview: RewritePreview, parent=None):
        super().__init__(parent)
        self.preview = preview
        self.setWindowTitle(f"Rewrites: {preview.program.name}")
        self.resize(980, 560)
        lay = QVBoxLayout(self)
        self.summary = QLabel(preview.summary)
        self.summary.setWordWrap(True)
        lay.addWidget(self.summary)
        self.rules = QTreeWidget()
        self.rules.setHeaderLabels(["Rule", "At", "What it does"])
        self.rules.setRootIsDecorated(False)
        for e in preview.fired:
            item = QTreeWidgetItem([e["rule"], self._where(e), e["message"]])
            item.setToolTip(2, e["message"])
            self.rules.addTopLevelItem(item)
        for e in preview.refused:
            item = QTreeWidgetItem([e["rule"], self._where(e), f"refused: {e.get('error') or e['message']}"])
            for c in range(3):
                item.setForeground(c, QBrush(QColor(140, 140, 140)))
            self.rules.addTopLevelItem(item)
        self.rules.resizeColumnToContents(0)
        lay.addWidget(self.rules, 1)
        sides = QHBoxLayout()
        self.before = self._side(sides, "Before", preview.program, preview.removed_nodes(), REMOVED)
        self.after = self._side(sides, "After", preview.rewritten, preview.added_nodes(), ADDED)
        for side in (self.before, self.after):
            side.setStyleSheet("font-family: monospace;")
        lay.addLayout(sides, 3)
        buttons = QDialogButtonBox()
        self.apply_button = buttons.addButton("Apply (Ctrl+Z undoes)", QDialogButtonBox.AcceptRole)
        self.apply_button.setEnabled(bool(preview.fired))
        buttons.addButton(QDialogButtonBox.Close)
        buttons.accepted.connect(self._apply)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)

    def _where(self, e: dict) -> str:
        node = self.preview.program.nodes.get(e.get("node"))
        return node.name if node is not None else str(e.get("node_name") or e.get("node") or "")

    def _side(self, row: QHBoxLayout, title: str, program: Program, marked: set[str], mark) -> QListWidget:
        box = QWidget()
        v = QVBoxLayout(box)
        v.setContentsMargins(0, 0, 0, 0)
        v.addWidget(QLabel(f"<b>{title}</b> ({len(program.nodes)} ops)"))
        lst = QListWidget()
        sign, color = mark
        for nid in program.topo_order():
            line = _node_line(program, nid)
            item = QListWidgetItem(f"{sign if nid in marked else ' '} {line}")
            item.setData(Qt.UserRole, nid)
            item.setToolTip(line)
            if nid in marked:
                item.setData(MARKED, True)
                item.setForeground(QBrush(color))
            lst.addItem(item)
        v.addWidget(lst)
        row.addWidget(box)
        return lst

    def marked(self, side: QListWidget) -> list[str]:
        return [side.item(i).data(Qt.UserRole) for i in range(side.count())
                if side.item(i).data(MARKED)]

    def _apply(self) -> None:
        self.apply_requested.emit()
        self.accept()
