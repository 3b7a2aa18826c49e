"""The Decision log dock: what the agent did and why, one row per event (live or replayed), with
filters by step and by text; clicking a row selects what it is about (a region, or a node for a
rewrite). Problems (failed verification, fallbacks, errors, a worker's garbage lines) stand out."""
from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLineEdit, QStyledItemDelegate, QTreeWidget, QTreeWidgetItem,
                               QVBoxLayout, QWidget)

from agent_core.agent.progress import format_event

# filter name -> the events it shows (None: all)
FILTERS = {"All steps": None, "Plan": {"plan", "region-proposed", "rewrite"}, "Codegen & compile": {"codegen", "compile"},
           "Verify": {"verify"}, "Tuning": {"tune-step"}, "Profile": {"profile"},
           "Outcomes": {"fallback", "done", "log"},
           "Model writer": {"writer-request", "writer-verdict", "writer-done"}, "Problems": None}


def is_problem(e: dict) -> bool:
    k = e.get("event")
    return (k in ("error", "fallback", "studio") and e.get("level") != "info") or \
        (k == "verify" and not e.get("ok")) or (k == "log" and e.get("level") == "warning") or \
        (k == "tune-step" and not e.get("ok")) or (k == "rewrite" and not e.get("kept")) or \
        (k == "writer-verdict" and not e.get("ok"))


def describe(e: dict) -> str:
    if e.get("event") == "studio":   # the studio's own notes (worker crashed, bad line, ...)
        return e.get("message", "")
    return (format_event(e) or e.get("message") or e.get("event", "")).strip()


class WrappingDelegate(QStyledItemDelegate):
    """A row as tall as its text wrapped to the column's width (QTreeView's own word wrap measures
    rows without the column's width, so they stayed one line and were cut off)."""

    def __init__(self, tree):
        super().__init__(tree)
        self.tree = tree

    def sizeHint(self, option, index):
        size = super().sizeHint(option, index)
        width = max(self.tree.header().sectionSize(index.column()) - 8, 20)
        text = option.fontMetrics.boundingRect(QRect(0, 0, width, 1 << 20), Qt.TextWordWrap, index.data() or "")
        return QSize(size.width(), max(size.height(), text.height() + 8))   # the style keeps 3-4 px above and below


class DecisionLog(QWidget):
    entry_clicked = Signal(dict)   # the event of the clicked row

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        row = QHBoxLayout()
        self.kind = QComboBox()
        self.kind.addItems(list(FILTERS))
        self.kind.currentIndexChanged.connect(lambda _i: self._apply_filter())
        self.text = QLineEdit()
        self.text.setPlaceholderText("Filter: region, kernel, word…")
        self.text.setClearButtonEnabled(True)
        self.text.textChanged.connect(lambda _t: self._apply_filter())
        row.addWidget(self.kind)
        row.addWidget(self.text, 1)
        lay.addLayout(row)
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["t (s)", "Step", "About", "What and why"])
        self.tree.setRootIsDecorated(False)
        # long reasons wrap onto more lines in the last column instead of being cut off
        self.tree.setUniformRowHeights(False)
        self.tree.setWordWrap(True)
        # the first three columns as narrow as their usual content, so "What and why" has the room;
        # a longer "About" (a baseline's name) is elided in the middle and whole in its tooltip
        fm = self.tree.fontMetrics()
        for i, sample in enumerate(("999.99", "region-proposed", "r999")):
            self.tree.setColumnWidth(i, max(fm.horizontalAdvance(sample), fm.horizontalAdvance(self.tree.headerItem().text(i))) + 16)
        self.tree.header().setStretchLastSection(True)
        self.tree.setItemDelegateForColumn(3, WrappingDelegate(self.tree))
        # rows wrap to the width their column has now: Qt measures a row's height once, so a resized
        # column left long reasons cut off with "..." (relaid out once per burst of resizes)
        self._relayout = QTimer(self, singleShot=True, interval=0, timeout=self.tree.doItemsLayout)
        self.tree.header().sectionResized.connect(lambda *_: self._relayout.start())
        self.tree.itemClicked.connect(lambda it, _c: self.entry_clicked.emit(it.data(0, Qt.UserRole)))
        lay.addWidget(self.tree, 1)
        self.events: list[dict] = []

    def clear(self) -> None:
        self.events.clear()
        self.tree.clear()

    def add(self, e: dict) -> None:
        self.events.append(e)
        about = e.get("region") or e.get("node") or e.get("baseline") or ""
        t = e.get("t")
        it = QTreeWidgetItem([f"{t:.2f}" if isinstance(t, (int, float)) else "", e.get("event", ""), str(about),
                              describe(e)])
        it.setData(0, Qt.UserRole, e)
        for c in range(4):   # a narrowed column still shows its whole cell on hover
            it.setToolTip(c, describe(e) if c == 3 else it.text(c))
        if is_problem(e):
            for c in range(4):
                it.setForeground(c, QColor("#e06c6c"))
        self.tree.addTopLevelItem(it)
        it.setHidden(not self._visible(e))
        if not it.isHidden():
            self.tree.scrollToItem(it)

    def note(self, message: str, level: str = "warning") -> None:
        """A row from the studio itself (the worker died, printed garbage, was cancelled...)."""
        self.add({"event": "studio", "level": level, "message": message})

    def _visible(self, e: dict) -> bool:
        name = self.kind.currentText()
        want = FILTERS.get(name)
        if name == "Problems" and not is_problem(e):
            return False
        if want is not None and e.get("event") not in want:
            return False
        q = self.text.text().strip().lower()
        if q and q not in (describe(e) + " " + str(e.get("region") or "") + " " + str(e.get("kernel") or "")).lower():
            return False
        return True

    def _apply_filter(self) -> None:
        for i in range(self.tree.topLevelItemCount()):
            it = self.tree.topLevelItem(i)
            it.setHidden(not self._visible(it.data(0, Qt.UserRole)))

    def visible_count(self) -> int:
        return sum(1 for i in range(self.tree.topLevelItemCount()) if not self.tree.topLevelItem(i).isHidden())
