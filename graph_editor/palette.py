"""Adding nodes: the op palette (a filterable tree grouped by category, drag onto the canvas) and the
quick search that Tab or a double-click opens at the cursor (fuzzy on names and aliases; after a drag
from a free port it offers only ops that accept that value).

Both also list the program's sources first: "input", "parameter" (also found as "weight") and
"constant". They are not ops; GraphScene.add_node hands their names to add_source."""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QMimeData, QPoint, Qt, Signal
from PySide6.QtGui import QDrag
from PySide6.QtWidgets import (QFrame, QLabel, QLineEdit, QListWidget, QListWidgetItem, QTreeWidget,
                               QTreeWidgetItem, QVBoxLayout, QWidget)

from agent_core.errors import StitchError
from agent_core.ops import CATEGORIES, OpDef, TensorSpec, all_ops

MIME_OP = "application/x-stitchcuda-op"
PROGRAM_CATEGORY = "program"


@dataclass(frozen=True)
class SourceEntry:
    """A palette entry that makes a value without a producer (what an op entry's OpDef is for ops)."""
    name: str
    aliases: tuple[str, ...]
    doc: str
    category: str = PROGRAM_CATEGORY
    inputs: tuple[str, ...] = ()
    attrs: tuple = ()


SOURCE_ENTRIES = (
    SourceEntry("input", ("program input", "argument"),
                "A program input: a tensor the caller passes in; its shape and dtype are set in the inspector."),
    SourceEntry("parameter", ("weight", "bias", "param"),
                "A parameter (weights): shape, dtype and how it is drawn (normal, uniform, zeros, ones)."),
    SourceEntry("constant", ("const", "scalar", "literal"),
                "A constant: a scalar or a small tensor typed in the inspector."),
)


def palette_entries() -> list:
    """What the palette and the quick search offer: the program's sources, then every op."""
    return [*SOURCE_ENTRIES, *all_ops()]


def _category_rank(category: str) -> int:
    return -1 if category == PROGRAM_CATEGORY else CATEGORIES.index(category)


def fuzzy_score(query: str, text: str) -> int | None:
    """A score (higher is better) if the query's letters appear in order in text, else None.
    Prefix and word-start matches score higher: 'ln' finds layer_norm, 'relu' ranks relu first."""
    q, t = query.lower().replace(" ", ""), text.lower()
    if not q:
        return 0
    if t == q:
        return 1000
    if t.startswith(q):
        return 800 - len(t)
    if q in t:
        return 600 - t.index(q) - len(t)
    score, i, prev = 0, 0, -2
    for ch in q:
        j = t.find(ch, i)
        if j < 0:
            return None
        start = j == 0 or t[j - 1] in "_ "
        score += 10 + (15 if start else 0) + (8 if j == prev + 1 else 0)
        prev, i = j, j + 1
    return score - len(t)


def search_ops(query: str, ops: list[OpDef] | None = None) -> list[OpDef]:
    """Entries (ops, and the sources when given them) matching query on name or an alias, best first."""
    ops = all_ops() if ops is None else ops
    scored = []
    for op in ops:
        best = max((s for s in (fuzzy_score(query, n) for n in (op.name, *op.aliases)) if s is not None),
                   default=None)
        if best is not None:
            scored.append((-best, _category_rank(op.category), op.name, op))
    scored.sort(key=lambda t: t[:3])
    return [t[3] for t in scored]


def ops_accepting(spec: TensorSpec) -> list[OpDef]:
    """Ops whose first input can read a value of this spec with default attributes. Ops needing
    other inputs too are offered when their first port is a tensor port (the rest stay open)."""
    out = []
    for op in all_ops():
        if not op.inputs:
            continue
        lo, _ = op.arity()
        try:
            attrs = op.normalize_attrs({})
        except StitchError:
            out.append(op)  # a required attribute: cannot probe, let the user decide
            continue
        if lo > 1:
            out.append(op)
            continue
        try:
            op.infer([spec] + [None] * (len(op.inputs) - 1), attrs)
        except Exception:  # op-specific checks raise all kinds of errors; a refusal is all we need
            continue
        out.append(op)
    return out


def op_tooltip(op: OpDef) -> str:
    lines = [f"<b>{op.name}</b> <i>({op.category})</i>"]
    if op.doc:
        lines.append(op.doc)
    if op.inputs:
        lines.append("inputs: " + ", ".join(op.inputs))
    if op.attrs:
        lines.append("attributes: " + ", ".join(a.name for a in op.attrs))
    if op.aliases:
        lines.append("also: " + ", ".join(op.aliases))
    return "<br>".join(lines)


class PaletteWidget(QWidget):
    """The palette dock's content. `op_activated(name)` on double-click or Enter."""
    op_activated = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.filter = QLineEdit(placeholderText="Filter (fuzzy: input, weight, ln, relu…)")
        self.filter.setClearButtonEnabled(True)
        self.tree = _OpTree()
        self.tree.setHeaderHidden(True)
        self.tree.setDragEnabled(True)
        self.tree.setIndentation(12)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.filter)
        lay.addWidget(self.tree)
        self.filter.textChanged.connect(self.refresh)
        self.filter.returnPressed.connect(self._activate_first)
        self.tree.itemActivated.connect(self._activated)
        self.refresh()

    def refresh(self) -> None:
        """Rebuild from the registry (more ops may have been registered since)."""
        query = self.filter.text().strip()
        ops = search_ops(query, palette_entries()) if query else palette_entries()
        self.tree.clear()
        groups: dict[str, QTreeWidgetItem] = {}
        for op in ops:
            g = groups.get(op.category)
            if g is None:
                g = groups[op.category] = QTreeWidgetItem([op.category.capitalize()])
                g.setFlags(Qt.ItemIsEnabled)
                f = g.font(0)
                f.setBold(True)
                g.setFont(0, f)
            item = QTreeWidgetItem([op.name])
            item.setData(0, Qt.UserRole, op.name)
            item.setToolTip(0, op_tooltip(op))
            g.addChild(item)
        order = sorted(groups, key=_category_rank) if not query else list(groups)
        for cat in order:
            self.tree.addTopLevelItem(groups[cat])
            groups[cat].setText(0, f"{cat.capitalize()}  ({groups[cat].childCount()})")
        if query:
            self.tree.expandAll()
        else:
            self.tree.collapseAll()
            for cat in (PROGRAM_CATEGORY, "matmul", "normalization", "convolution"):  # short; pointwise is long
                if cat in groups:
                    groups[cat].setExpanded(True)

    def _activate_first(self) -> None:
        for i in range(self.tree.topLevelItemCount()):
            g = self.tree.topLevelItem(i)
            if g.childCount():
                self.op_activated.emit(g.child(0).data(0, Qt.UserRole))
                return

    def _activated(self, item: QTreeWidgetItem, col: int) -> None:
        name = item.data(0, Qt.UserRole)
        if name:
            self.op_activated.emit(name)


class _OpTree(QTreeWidget):
    def startDrag(self, actions):
        item = self.currentItem()
        name = item.data(0, Qt.UserRole) if item else None
        if not name:
            return
        md = QMimeData()
        md.setData(MIME_OP, name.encode())
        md.setText(name)
        drag = QDrag(self)
        drag.setMimeData(md)
        drag.exec(Qt.CopyAction)


class QuickSearch(QFrame):
    """A popup with a search field and the best matches; `chosen(op name)` on Enter or click."""
    chosen = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent, Qt.Popup)
        self.setObjectName("QuickSearch")
        self.setFrameShape(QFrame.StyledPanel)
        self.title = QLabel()
        self.title.setObjectName("QuickSearchTitle")
        self.edit = QLineEdit(placeholderText="Search ops, input, parameter, constant…")
        self.list = QListWidget()
        self.list.setMinimumHeight(240)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.setSpacing(4)
        lay.addWidget(self.title)
        lay.addWidget(self.edit)
        lay.addWidget(self.list)
        self.resize(320, 340)
        self._ops: list[OpDef] = []
        self.edit.textChanged.connect(self._fill)
        self.edit.returnPressed.connect(self._accept_current)
        self.list.itemActivated.connect(lambda it: self._accept(it.data(Qt.UserRole)))
        self.list.itemClicked.connect(lambda it: self._accept(it.data(Qt.UserRole)))
        self.edit.installEventFilter(self)

    def open_at(self, global_pos: QPoint, ops: list[OpDef] | None = None, title: str = "Add node") -> None:
        self._ops = palette_entries() if ops is None else ops
        self.title.setText(title)
        self.edit.clear()
        self._fill("")
        self.move(global_pos)
        self.show()
        self.edit.setFocus()

    def _fill(self, text: str) -> None:
        self.list.clear()
        found = search_ops(text, self._ops)
        for op in found if not text else found[:60]:
            alias = f"  ({', '.join(op.aliases)})" if op.aliases else ""
            it = QListWidgetItem(f"{op.name}{alias}    · {op.category}")
            it.setData(Qt.UserRole, op.name)
            it.setToolTip(op_tooltip(op))
            self.list.addItem(it)
        if self.list.count():
            self.list.setCurrentRow(0)

    def eventFilter(self, obj, event):
        if obj is self.edit and event.type() == event.Type.KeyPress and event.key() in (Qt.Key_Down, Qt.Key_Up):
            row = self.list.currentRow() + (1 if event.key() == Qt.Key_Down else -1)
            self.list.setCurrentRow(max(0, min(self.list.count() - 1, row)))
            return True
        return super().eventFilter(obj, event)

    def _accept_current(self) -> None:
        it = self.list.currentItem()
        if it is not None:
            self._accept(it.data(Qt.UserRole))

    def _accept(self, name: str) -> None:
        self.hide()
        self.chosen.emit(name)
