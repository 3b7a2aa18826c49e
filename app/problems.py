"""Plan and Optimize refuse a program that does not validate, and say why in a Problems dock.

`refuse_if_invalid(window, "Plan")` runs Program.validate(); when it finds errors nothing is planned or
started, and the dock lists every problem (errors first, then warnings). Clicking one selects its node
(or the input / parameter it names) and centres it on the canvas. While problems are listed the dock
checks again after each edit and empties itself once the program is valid; New and Open clear it.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QDockWidget, QLabel, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

ROLE_TARGET = Qt.UserRole   # ("node", id) / ("value", id) / None on each row


def refuse_if_invalid(window, what: str) -> bool:
    """True when the document's program has validation errors: the Problems dock lists them and the
    status bar says what was refused. False (and an emptied list) when `what` may run."""
    panel = problems_panel(window)
    errors = panel.check()
    if not errors:
        return False
    panel.dock.show()
    panel.dock.raise_()
    first = errors[0].message
    window.status(f"{what} refused: {len(errors)} problem{'s' * (len(errors) > 1)} in the program "
                  f"(listed in Problems): {first}", error=True)
    return True


def problems_panel(window) -> "ProblemsPanel":
    """The window's Problems panel, made (with its dock, under the canvas) the first time it is asked for."""
    panel = window.findChild(ProblemsPanel)
    if panel is None:
        panel = ProblemsPanel(window)
    return panel


class ProblemsPanel(QWidget):
    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.summary = QLabel("")
        self.summary.setObjectName("Muted")
        self.summary.setWordWrap(True)
        self.list = QListWidget()
        self.list.setWordWrap(True)
        self.list.setToolTip("Click a problem to select its node on the canvas")
        self.list.itemClicked.connect(self.go_to)
        self.list.itemActivated.connect(self.go_to)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.summary)
        lay.addWidget(self.list, 1)
        self.dock = QDockWidget("Problems", window)
        self.dock.setObjectName("ProblemsDock")
        self.dock.setWidget(self)
        window.addDockWidget(Qt.BottomDockWidgetArea, self.dock)
        window.menu("view").addAction(self.dock.toggleViewAction())
        logs = [d for d in window.findChildren(QDockWidget) if d.objectName() == "DecisionLogDock"]
        if logs:   # a tab beside the decision log, not one more strip squeezing the canvas
            window.tabifyDockWidget(logs[0], self.dock)
        self._recheck = QTimer(self, singleShot=True, interval=150, timeout=self._edited_check)
        self._scene = None
        window.document_set.connect(self._document_set)
        self._document_set()

    # following the document --------------------------------------------------------------------------
    def _document_set(self) -> None:
        if self._scene is not None:
            try:
                self._scene.program_changed.disconnect(self._edited)
            except (RuntimeError, TypeError):   # the old scene is already gone
                pass
        self._scene = self.window.scene
        if self._scene is not None:
            self._scene.program_changed.connect(self._edited)
        self.show_problems([])

    def _edited(self) -> None:
        if self.list.count() and not self._recheck.isActive():   # only while something is listed
            self._recheck.start()

    def _edited_check(self) -> None:
        self.check()

    # listing -------------------------------------------------------------------------------------------
    def check(self) -> list:
        """Validate the document's program, list what it finds; returns the errors."""
        diags = self.window.document.program.validate()
        errors = [d for d in diags if d.severity == "error"]
        self.show_problems(diags if errors else [])
        return errors

    def show_problems(self, diags) -> None:
        self.list.clear()
        errors = [d for d in diags if d.severity == "error"]
        colours = {"error": QColor("#e5534b"), "warning": QColor("#c69026")}
        for d in diags:
            it = QListWidgetItem(f"{d.severity}: {d.message}")
            it.setForeground(QBrush(colours.get(d.severity, QColor("#8b949e"))))
            target = ("node", d.node_id) if d.node_id else (("value", d.value_id) if d.value_id else None)
            it.setData(ROLE_TARGET, target)
            it.setToolTip(d.message + ("\nClick to select it on the canvas" if target else ""))
            self.list.addItem(it)
        if errors:
            self.summary.setText(f"{len(errors)} error{'s' * (len(errors) > 1)} stop Plan and Optimize. "
                                 "Click one to select its node; the list empties once the program is valid.")
            self.dock.setWindowTitle(f"Problems ({len(errors)})")
        else:
            self.summary.setText("No problems: Plan and Optimize can run.")
            self.dock.setWindowTitle("Problems")

    def go_to(self, item: QListWidgetItem) -> None:
        """Select what the problem names and centre it in the view."""
        target = item.data(ROLE_TARGET)
        scene = self.window.scene
        if not target or scene is None:
            return
        kind, ident = target
        canvas_item = (scene.group_of.get(ident) or scene.nodes.get(ident)) if kind == "node" \
            else scene.terminals.get(ident)
        if canvas_item is None:
            if kind == "value":   # a parameter drawn inside its reader: select the reader
                readers = self.window.document.program.consumers(ident)
                canvas_item = scene.nodes.get(readers[0][0]) if readers else None
            if canvas_item is None:
                return
        scene.clearSelection()
        canvas_item.setSelected(True)
        self.window.view.centerOn(canvas_item)
