"""The region list dock: every region with its kind, status, size, estimate and measurement, and the
edits a user makes to the agent's plan (accept, reject, lock, split, merge, draw from the canvas
selection, plan). Each edit is one undo command over agent_core.regions; a refused edit says why."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QGridLayout, QPushButton, QTreeWidget, QTreeWidgetItem,
                               QVBoxLayout, QWidget)

from agent_core import regions as R
from agent_core.text import plural

from .region_commands import push_region_edit
from .region_item import fmt_ms, kind_color, speedup

COLUMNS = ("Region", "Kind", "Status", "Nodes", "Speedup", "Measured")
NODES = 3            # shown last: the column that gives up its room first
HEADER_PAD_PX = 12   # a header section's text margins
MIN_COLUMN_PX = 24
VERDICTS = {"fallback": "fell back"}   # the agent's outcome in the words the hull's label uses


def status_text(region) -> str:
    """The region's status as the hull and the profile plots show it: the agent's verdict once a run
    gave one (read from the same schedule["agent"] the hull reads), with the user's decision when it
    is more than "proposed"."""
    verdict = ((region.schedule or {}).get("agent") or {}).get("status")
    if not verdict:
        return region.status
    verdict = VERDICTS.get(verdict, verdict)
    return verdict if region.status == "proposed" else f"{region.status} · {verdict}"


class RegionList(QWidget):
    region_selected = Signal(str)   # the user picked a region in the list
    message = Signal(str, bool)     # text, is an error
    collapse_requested = Signal(str)   # draw the region as one node (an undoable canvas command)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.program = self.stack = None
        self.selected_nodes = lambda: []   # the canvas selection (the window sets this)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setRootIsDecorated(False)
        self.tree.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.tree.setUniformRowHeights(True)
        self.tree.itemSelectionChanged.connect(self._picked)
        self.tree.headerItem().setToolTip(4, "Unfused time over fused time: measured, or the planner's estimate (est.)")
        self.tree.header().setStretchLastSection(False)
        self.tree.header().moveSection(NODES, len(COLUMNS) - 1)
        self.tree.headerItem().setToolTip(NODES, "Nodes in the region")
        self.tree.header().setMinimumSectionSize(MIN_COLUMN_PX)
        self.tree.setTextElideMode(Qt.ElideMiddle)   # "accepted · fell back" keeps both ends
        lay.addWidget(self.tree, 1)
        grid = QGridLayout()
        grid.setSpacing(3)
        self.buttons = {}
        for i, (key, text, tip) in enumerate((
                ("plan", "Plan", "Run the planner on the program (keeps accepted, locked and hand-made regions)"),
                ("accept", "Accept", "Accept the selected regions"),
                ("reject", "Reject", "Reject the selected regions (the planner will not propose them again)"),
                ("lock", "Lock", "Lock the selected region, or unlock it"),
                ("split", "Split", "Split the region: the selected canvas nodes become a region of their own"),
                ("merge", "Merge", "Merge the selected regions into one"),
                ("draw", "From selection", "Draw a region around the nodes selected on the canvas"),
                ("remove", "Remove", "Remove the selected regions"),
                ("collapse", "Collapse", "Draw the selected region as one node on the canvas (Ctrl+Shift+G expands)"))):
            b = QPushButton(text)
            b.setToolTip(tip)
            b.clicked.connect(getattr(self, key))
            grid.addWidget(b, i // 5, i % 5)
            self.buttons[key] = b
        lay.addLayout(grid)
        self._syncing = False

    # model -------------------------------------------------------------------------------------
    def set_document(self, program, stack) -> None:
        if self.program is not None:
            self.program.unsubscribe(self._on_event)
        self.program, self.stack = program, stack
        program.subscribe(self._on_event)
        self.refresh()

    def _on_event(self, event: str, payload: dict) -> None:
        if event == "regions_changed":
            self.refresh()

    def refresh(self) -> None:
        keep = set(self.selected_ids())
        self._syncing = True
        self.tree.clear()
        for r in self.program.regions if self.program else []:
            s, measured = speedup(r)
            it = QTreeWidgetItem([r.id, r.kind.replace("_", " "), status_text(r), str(len(r.nodes)),
                                  "-" if s is None else f"{s:.2f}x" + ("" if measured else " est."),
                                  fmt_ms(r.measured_ms)])
            it.setData(0, Qt.UserRole, r.id)
            it.setForeground(1, kind_color(r.kind))
            it.setToolTip(0, r.reason)
            it.setToolTip(1, f"{it.text(1)}: {r.reason}")   # the whole cell, were it elided
            agent = (r.schedule or {}).get("agent") or {}
            it.setToolTip(2, f"{it.text(2)}: {agent.get('reason') or r.reason}")
            if r.status == "rejected":
                for c in range(len(COLUMNS)):
                    it.setForeground(c, self.palette().placeholderText().color())
            self.tree.addTopLevelItem(it)
            it.setSelected(r.id in keep)
        self._syncing = False
        self.fit_columns()

    def fit_columns(self) -> None:
        """Each column as wide as its header and cells; where that is wider than the list, the node
        count gives up room first (down to its digits), then status and kind (down to their headers),
        eliding what no longer fits (the cells' tooltips hold the whole text), so Region, Speedup and
        Measured stay whole."""
        tree, head = self.tree, self.tree.header()
        fm = tree.fontMetrics()
        want, floor = [], []
        for c in range(len(COLUMNS)):
            cells = tree.sizeHintForColumn(c)   # the widest cell, its margins included
            title = fm.horizontalAdvance(COLUMNS[c]) + HEADER_PAD_PX
            want.append(max(cells, title))
            floor.append(max(cells, MIN_COLUMN_PX) if c == NODES else title)
        widths = list(want)
        for c in (NODES, 2, 1):   # nodes, status, then kind
            over = sum(widths) - tree.viewport().width()
            if over <= 0:
                break
            widths[c] = max(floor[c], widths[c] - over)
        for c, w in enumerate(widths):
            head.resizeSection(c, w)

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        self.fit_columns()

    def selected_ids(self) -> list[str]:
        return [it.data(0, Qt.UserRole) for it in self.tree.selectedItems()]

    def select(self, region_id: str | None) -> None:
        """Show region_id as the selected row (from a click on the canvas or a plot)."""
        self._syncing = True
        for i in range(self.tree.topLevelItemCount()):
            it = self.tree.topLevelItem(i)
            it.setSelected(it.data(0, Qt.UserRole) == region_id)
            if it.isSelected():
                self.tree.scrollToItem(it)
        self._syncing = False

    def _picked(self) -> None:
        if self._syncing:
            return
        ids = self.selected_ids()
        if len(ids) == 1:
            self.region_selected.emit(ids[0])

    # edits -------------------------------------------------------------------------------------
    def _edit(self, fn, *args) -> object:
        result, err = push_region_edit(self.stack, self.program, fn, *args)
        if err:
            self.message.emit(err, True)
        return result

    def _each(self, verb: str, fn) -> None:
        ids = self.selected_ids()
        if not ids:
            self.message.emit(f"Select a region to {verb}", True)
            return
        if len(ids) == 1:
            self._edit(fn, ids[0])
            return
        self.stack.beginMacro(f"{verb.capitalize()} {len(ids)} regions")
        try:
            for rid in ids:
                self._edit(fn, rid)
        finally:
            self.stack.endMacro()

    def accept(self) -> None:
        self._each("accept", R.accept)

    def reject(self) -> None:
        self._each("reject", R.reject)

    def remove(self) -> None:
        self._each("remove", R.remove_region)

    def lock(self) -> None:
        def toggle(program, rid):
            return R.unlock(program, rid) if R.get_region(program, rid).status == "locked" else R.lock(program, rid)
        self._each("lock", toggle)

    def merge(self) -> None:
        ids = self.selected_ids()
        if len(ids) < 2:
            self.message.emit("Select two or more regions to merge", True)
            return
        merged = self._edit(R.merge_regions, ids)
        if merged is not None:
            self.message.emit(f"Merged {', '.join(ids)} into {merged.id}", False)

    def split(self) -> None:
        ids = self.selected_ids()
        if len(ids) != 1:
            self.message.emit("Select one region to split, and the nodes that become the new part on the canvas",
                              True)
            return
        r = R.get_region(self.program, ids[0])
        part = [n for n in self.selected_nodes() if n in r.nodes]
        rest = [n for n in r.nodes if n not in part]
        if not part or not rest:
            self.message.emit(f"Select some, not all, of region {r.id}'s nodes on the canvas: they become the new "
                              "part", True)
            return
        new = self._edit(R.split_region, r.id, [rest, part])
        if new:
            self.message.emit(f"Split {r.id} into {', '.join(x.id for x in new)}", False)

    def draw(self) -> None:
        nodes = self.selected_nodes()
        if not nodes:
            self.message.emit("Select the nodes of the new region on the canvas first", True)
            return
        region = self._edit(R.draw_region, nodes)
        if region is not None:
            self.message.emit(f"Drew region {region.id} ({region.kind}) around {plural(len(nodes), 'node')}", False)
            self.select(region.id)
            self.region_selected.emit(region.id)

    def collapse(self) -> None:
        ids = self.selected_ids()
        if len(ids) != 1:
            self.message.emit("Select one region to collapse", True)
            return
        self.collapse_requested.emit(ids[0])

    def plan(self) -> None:
        from agent_core.planner import apply_plan, plan_program
        errors = [d for d in self.program.validate() if d.severity == "error"]
        if errors:   # a plan of a graph that does not validate estimates nonsense: say why instead
            self.message.emit(f"Could not plan: {errors[0].message} ({plural(len(errors), 'problem')}; "
                              "Agent > Plan regions lists them)", True)
            return
        try:
            p = plan_program(self.program)
        except Exception as e:   # a program the planner cannot read (e.g. unconnected ports): say why
            self.message.emit(f"Could not plan: {e}", True)
            return
        self._edit(lambda program: apply_plan(program, p))
        self.message.emit(f"Planned {plural(len(p.active), 'region')}, {plural(p.kernels, 'kernel')}: estimated "
                          f"{p.estimate.unfused_ms * 1e3:.1f} us unfused → {p.estimate.planned_ms * 1e3:.1f} us", False)
        self.last_plan = p
