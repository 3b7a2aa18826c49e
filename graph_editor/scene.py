"""The canvas scene: a view of one agent_core Program.

It observes `Program.subscribe` events and keeps one item per node, per program input (and per
parameter or constant no node reads yet: once read, it is drawn inside its reader) and per connected
input port. User gestures become undo commands (graph_editor.commands) pushed on the
document's QUndoStack; the scene never edits its items to reflect an edit, it waits for the model's
event. Collapsed groups live in the model too (program.metadata["editor"]["collapsed"], changed by the
undoable SetCollapsed command); the scene redraws them on the model's groups_changed event.
Port dragging lives in connect.py and collapsing in groups.py (mixed into GraphScene). Inputs,
parameters and constants are added through `add_source` (the palette's and quick search's "input",
"parameter" and "constant" entries reach it through `add_node`).
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, QSizeF, Qt, Signal
from PySide6.QtGui import QPen, QUndoStack
from PySide6.QtWidgets import QGraphicsItem, QGraphicsPathItem, QGraphicsScene, QMenu, QToolTip

from agent_core.ir import Program, Role

from . import commands as C
from .connect import ConnectMixin
from .edge_item import EdgeItem, GroupItem, TerminalItem
from .edge_routes import edge_route, may_route
from .groups import GroupsMixin
from .module_boxes import ModuleBoxes
from .modules import with_modules
from .node_item import NodeItem, node_size
from .overview_item import OverviewItem
from .style import NODE_WIDTH, TERMINAL_H, TERMINAL_W, CanvasStyle

_DRAWN_INSIDE = frozenset((Role.PARAMETER, Role.CONSTANT))
TERMINAL_GAP = 52.0   # between an input terminal and the node below that reads it: clear of a region's
                      # two-line label band (region_item: FRAME_PAD + LABEL_H + LINE2_H), within LAYER_GAP
OVERLAY_Z = -10.0     # region hulls (next issue) are drawn here: under edges and nodes
SOURCE_KINDS = C.SOURCE_ROLES   # the palette's "input", "parameter" and "constant"


class GraphScene(GroupsMixin, ConnectMixin, QGraphicsScene):
    connection_refused = Signal(str)        # the model's reason, for the status bar
    message = Signal(str)                   # other one-line feedback
    quick_search_requested = Signal(QPointF, object)  # scene pos, (side, value_id / (node, port)) or None
    program_changed = Signal()              # any model event (the inspector, the minimap listen)

    def __init__(self, program: Program, stack: QUndoStack, style: CanvasStyle, parent=None):
        super().__init__(parent)
        self.program, self.stack, self.style = program, stack, style
        self.setItemIndexMethod(QGraphicsScene.BspTreeIndex)
        self.nodes: dict[str, NodeItem] = {}
        self.terminals: dict[str, TerminalItem] = {}
        self.edges: dict[tuple[str, int], EdgeItem] = {}
        self.edges_from: dict[str, set[tuple[str, int]]] = {}
        self.edges_into: dict[str, set[int]] = {}
        self.groups: list[GroupItem] = []
        self.group_of: dict[str, GroupItem] = {}
        self.overlays: list[QGraphicsItem] = []
        self.last_refusal: str | None = None
        self._drag = None
        self._drag_path: QGraphicsPathItem | None = None
        self._press_pos: dict[str, QPointF] = {}
        self._positioning = False
        self._low_detail = False
        self._building = False
        self._content: QRectF | None = None   # content_rect cache, dropped on any change
        # where an unconnected terminal sits (where it was added); once read it sits by its reader.
        # View state, not the model's: positions in the model are node positions only.
        self.terminal_home: dict[str, QPointF] = {}
        self._home_next: QPointF | None = None
        self.setBackgroundBrush(style.background)
        self.overview = OverviewItem(self)
        self.modules = ModuleBoxes(self)   # collapses a big model's repeated blocks before the build
        self.rebuild()
        program.subscribe(self._on_event)
        # a program can outlive its scene (a test's shared model, a document shown again): a deleted
        # scene must stop observing it, or the next edit reaches items whose C++ side is gone
        on_event = self._on_event
        self.destroyed.connect(lambda *_: program.unsubscribe(on_event))

    def detach(self) -> None:
        """Stop observing the program (the window replaced this document)."""
        self.program.unsubscribe(self._on_event)

    # building ------------------------------------------------------------------------------
    def rebuild(self) -> None:
        """Items for the whole program at once (opening a file); events keep them in step after."""
        self._content = None
        for item in list(self.items()):
            if item.parentItem() is None and item not in self.overlays and item is not self.overview:
                self.removeItem(item)
        if self.overview.scene() is None:
            self.addItem(self.overview)
        self.nodes.clear(), self.terminals.clear(), self.edges.clear(), self.edges_from.clear()
        self.edges_into.clear()
        self.groups.clear(), self.group_of.clear()
        p = self.program
        self._building = True    # edges are routed once at the end, through the index
        self.setItemIndexMethod(QGraphicsScene.NoIndex)  # one index build at the end, not 10,000 inserts
        for i, nid in enumerate(p.nodes):
            item = self._make_node(nid)
            if p.nodes[nid].pos is None:  # never laid out: a grid until the layout runs
                item.setPos(QPointF((i % 20) * 260.0, (i // 20) * 140.0))
        for vid in self._terminal_values():
            self._make_terminal(vid)
        for nid, node in p.nodes.items():
            for port, vid in enumerate(node.inputs):
                if vid is not None:
                    self._make_edge(vid, nid, port)
        for g in p.metadata.get("editor", {}).get("collapsed", []):
            members = [m for m in g.get("nodes", []) if m in p.nodes]
            if members:
                self._make_group(g.get("name", "group"), members)
        self._place_terminals()
        self.refresh_all_edges()
        # in this order: a scene rect set while unindexed leaves the BSP tree built over nothing
        # useful (every query then tests every item: 12 ms instead of 0.1 ms at 5,000 items)
        self.setItemIndexMethod(QGraphicsScene.BspTreeIndex)
        self.fit_scene_rect(force=True)
        self._building = False
        self.reroute_edges()

    def set_low_detail(self, low: bool) -> None:
        """Zoomed far out items draw a plain box: caching those pixmaps costs more than it saves."""
        if low == self._low_detail:
            return
        self._low_detail = low
        mode = QGraphicsItem.NoCache if low else QGraphicsItem.DeviceCoordinateCache
        for item in list(self.nodes.values()) + list(self.terminals.values()) + self.groups:
            item.setCacheMode(mode)
            item.setFlag(QGraphicsItem.ItemHasNoContents, low)
        for item in self.edges.values():
            item.setFlag(QGraphicsItem.ItemHasNoContents, low)
        self.overview.invalidate()
        self.overview.setVisible(low)

    def _fresh(self, item: QGraphicsItem) -> QGraphicsItem:
        """A new item follows the current detail level."""
        if self._low_detail:
            item.setCacheMode(QGraphicsItem.NoCache)
            item.setFlag(QGraphicsItem.ItemHasNoContents, True)
        return item

    def _make_node(self, nid: str) -> NodeItem:
        item = NodeItem(self.program, nid, self.style)
        pos = self.program.nodes[nid].pos
        if pos is not None:
            item.setPos(QPointF(*pos))
        self.addItem(self._fresh(item))
        self.nodes[nid] = item
        return item

    def _make_terminal(self, vid: str) -> TerminalItem:
        item = TerminalItem(self.program, vid, self.style)
        self.addItem(self._fresh(item))
        self.terminals[vid] = item
        return item

    def _make_edge(self, vid: str, nid: str, port: int) -> EdgeItem | None:
        v = self.program.values.get(vid)
        if v is None or v.role in _DRAWN_INSIDE:
            return None  # parameters are drawn inside the node that reads them
        e = EdgeItem(vid, nid, port, self.style)
        self.addItem(self._fresh(e))
        self.edges[(nid, port)] = e
        self.edges_from.setdefault(vid, set()).add((nid, port))
        self.edges_into.setdefault(nid, set()).add(port)
        return e

    def _remove_edge(self, key) -> None:
        e = self.edges.pop(key, None)
        if e is not None:
            self.edges_from.get(e.value_id, set()).discard(key)
            self.edges_into.get(key[0], set()).discard(key[1])
            self.removeItem(e)

    # positions of ports ------------------------------------------------------------------------
    def source_pos(self, vid: str) -> QPointF | None:
        v = self.program.values.get(vid)
        if v is None:
            return None
        if v.producer:
            g = self.group_of.get(v.producer)
            if g is not None:
                return g.mapToScene(g.output_pos())
            item = self.nodes.get(v.producer)
            if item is None:
                return None
            k = self.program.nodes[v.producer].outputs.index(vid)
            return item.mapToScene(item.output_pos(k))
        t = self.terminals.get(vid)
        return t.mapToScene(t.output_pos()) if t else None

    def target_pos(self, nid: str, port: int) -> QPointF | None:
        g = self.group_of.get(nid)
        if g is not None:
            return g.mapToScene(g.input_pos())
        item = self.nodes.get(nid)
        return item.mapToScene(item.input_pos(port)) if item else None

    def _update_edge(self, key) -> None:
        e = self.edges.get(key)
        if e is None:
            return
        a, b = self.source_pos(e.value_id), self.target_pos(*key)
        if a is None or b is None:
            e.setVisible(False)
            return
        v = self.program.values.get(e.value_id)
        src_group = self.group_of.get(v.producer) if v and v.producer else None
        inside = src_group is not None and src_group is self.group_of.get(key[0])
        e.setVisible(not inside)
        e.set_ends(a, b, edge_route(self, a, b) if not (inside or self._building) else None)

    def refresh_all_edges(self) -> None:
        self.modules.refresh()   # routes between columns keep clear of the module boxes
        if self.groups:
            for key in self.edges:
                self._update_edge(key)
            return
        # the common case (opening a file) inlined: ~7,000 edges, where call overhead is the cost
        p, nodes, terms = self.program, self.nodes, self.terminals
        for (nid, port), e in self.edges.items():
            v = p.values.get(e.value_id)
            if v is None:
                continue
            if v.producer:
                src = nodes.get(v.producer)
                if src is None:
                    continue
                a = src.pos() + src.output_pos(p.nodes[v.producer].outputs.index(e.value_id))
            else:
                t = terms.get(e.value_id)
                if t is None:
                    continue
                a = t.pos() + t.output_pos()
            dst = nodes[nid]
            b = dst.pos() + dst.input_pos(port)
            e.set_ends(a, b, None if self._building else edge_route(self, a, b))

    def reroute_edges(self) -> None:
        """Module boxes moved: the edges routed between columns find their gutters again."""
        if self._building:
            return
        for e in self.edges.values():
            if e.route or may_route(e._a, e._b):
                e.set_ends(e._a, e._b, edge_route(self, e._a, e._b))

    def _edges_of_node(self, nid: str) -> set:
        keys = {(nid, port) for port in self.edges_into.get(nid, ())}
        node = self.program.nodes.get(nid)
        for vid in (node.outputs if node else []):
            keys |= self.edges_from.get(vid, set())
        return keys

    def _node_item_moved(self, nid: str) -> None:
        self._content = None
        if self._low_detail:
            self.overview.invalidate()
        item = self.nodes.get(nid)
        if item is not None and not self._positioning and not self.sceneRect().contains(item.sceneBoundingRect()):
            self.fit_scene_rect()
        for key in self._edges_of_node(nid):
            self._update_edge(key)
        if not self._positioning:
            self._place_terminals_for(nid)

    def _place_terminals(self) -> None:
        for vid in self.terminals:
            self._place_terminal(vid)

    def _place_terminals_for(self, nid: str) -> None:
        node = self.program.nodes.get(nid)
        if node is None:
            return
        for vid in node.inputs:
            if vid in self.terminals:
                self._place_terminal(vid)

    def _place_terminal(self, vid: str) -> None:
        """Left of the first consumer (in id order), level with the port it feeds."""
        t = self.terminals[vid]
        keys = sorted(self.edges_from.get(vid, ()), key=lambda k: (len(k[0]), k[0], k[1]))
        if keys:
            b = self.target_pos(*keys[0])
            t.setPos(b.x() - TERMINAL_W / 2, b.y() - TERMINAL_H - TERMINAL_GAP)
        elif vid in self.terminal_home:
            t.setPos(self.terminal_home[vid])
        elif t.pos() == QPointF(0, 0):
            t.setPos(-TERMINAL_W - TERMINAL_GAP, 40.0 * list(self.terminals).index(vid))
        for key in self.edges_from.get(vid, ()):
            self._update_edge(key)

    # model events --------------------------------------------------------------------------
    def _on_event(self, event: str, payload: dict) -> None:
        self._content = None
        handler = getattr(self, "_ev_" + event, None)
        if handler is not None:
            handler(**payload)
        if self._low_detail:
            self.overview.invalidate()
        self.program_changed.emit()

    def _ev_node_added(self, node_id: str) -> None:
        p = self.program
        if node_id in self.nodes:
            self._ev_node_removed(node_id)
        item = self._make_node(node_id)
        if p.nodes[node_id].pos is None:
            item.setPos(self._free_spot())
        self._sync_inputs(node_id)
        for vid in p.nodes[node_id].outputs:  # restore_node reconnects consumers without an event
            for cid, port in p.consumers(vid):
                self._sync_inputs(cid)
        self._sync_terminals()
        self._node_item_moved(node_id)

    def _ev_node_removed(self, node_id: str) -> None:
        item = self.nodes.pop(node_id, None)
        for port in list(self.edges_into.pop(node_id, ())):
            self._remove_edge((node_id, port))
        if item is not None:
            gone = [vid for vid in self.edges_from if vid not in self.program.values]
            for vid in gone:
                for key in list(self.edges_from.pop(vid)):
                    self._remove_edge(key)
        if item is not None:
            self.removeItem(item)
        g = self.group_of.pop(node_id, None)
        if g is not None:
            g.members.remove(node_id)
            if not g.members:
                self._drop_group(g)
            else:
                g.refresh()
            self._save_groups()
        self._sync_terminals()

    def _ev_node_changed(self, node_id: str) -> None:
        item = self.nodes.get(node_id)
        if item is None:
            return
        item.refresh()
        self._sync_inputs(node_id)
        self._node_item_moved(node_id)

    def _ev_node_moved(self, node_id: str) -> None:
        item = self.nodes.get(node_id)
        pos = self.program.nodes[node_id].pos
        if item is not None and pos is not None and item.pos() != QPointF(*pos):
            item.setPos(QPointF(*pos))
            self._node_item_moved(node_id)

    def _ev_edge_changed(self, node_id: str, port: int) -> None:
        self._sync_terminals()
        self._ev_node_changed(node_id)

    def _ev_value_added(self, value_id: str) -> None:
        self._sync_terminals()

    def _ev_value_removed(self, value_id: str) -> None:
        for key in list(self.edges_from.pop(value_id, set())):
            self._remove_edge(key)
            if key[0] in self.nodes:
                self.nodes[key[0]].refresh()
        t = self.terminals.pop(value_id, None)
        if t is not None:
            self.removeItem(t)
        self._sync_terminals()

    def _terminal_values(self) -> list[str]:
        """Program inputs, then the parameters and constants that no node reads."""
        p = self.program
        read = {v for n in p.nodes.values() for v in n.inputs if v}
        return list(p.inputs) + [vid for vid, v in p.values.items() if v.role in _DRAWN_INSIDE and vid not in read]

    def _sync_terminals(self) -> None:
        want = self._terminal_values()
        keep = set(want)
        for vid in [v for v in self.terminals if v not in keep]:
            self.removeItem(self.terminals.pop(vid))
        for vid in want:
            if vid not in self.terminals:
                if self._home_next is not None:   # the one add_source is adding: where it was asked for
                    self.terminal_home[vid], self._home_next = self._home_next, None
                self._make_terminal(vid)
                self._place_terminal(vid)

    def _ev_value_changed(self, value_id: str) -> None:
        v = self.program.values.get(value_id)
        if v is None:
            return
        if value_id in self.terminals:
            self.terminals[value_id].refresh()
        if v.producer in self.nodes:
            self.nodes[v.producer].refresh()
        for nid, _ in ([] if v.producer else self.program.consumers(value_id)):
            if nid in self.nodes:   # a parameter's shape is printed inside its reader
                self.nodes[nid].refresh()

    def _sync_inputs(self, nid: str) -> None:
        """Make the edge items into `nid` match node.inputs."""
        node = self.program.nodes.get(nid)
        if node is None:
            return
        for port in list(self.edges_into.get(nid, ())):
            if port >= len(node.inputs) or node.inputs[port] != self.edges[(nid, port)].value_id:
                self._remove_edge((nid, port))
        for port, vid in enumerate(node.inputs):
            if vid is not None and (nid, port) not in self.edges:
                if self._make_edge(vid, nid, port) and vid in self.terminals:
                    self._place_terminal(vid)
            self._update_edge((nid, port))

    def _free_spot(self) -> QPointF:
        """The view's centre, or just below the nodes already there (adding twice must not stack
        one node exactly on another)."""
        views = self.views()
        at = views[0].mapToScene(views[0].viewport().rect().center()) - QPointF(100, 30) if views else QPointF(0, 0)
        for _ in range(40):
            hits = [i for i in self.items(QRectF(at, QSizeF(NODE_WIDTH, 60))) if isinstance(i, (NodeItem, TerminalItem))]
            if not hits:
                break
            at = QPointF(at.x(), max(i.sceneBoundingRect().bottom() for i in hits) + 24)
        return at

    def fit_scene_rect(self, force: bool = False) -> None:
        """Keep the scene rect (which the BSP index divides) a margin around the content. Left to
        itself it grows over every item ever shown, and a too-large rect makes the index useless."""
        r = self.content_rect()
        if r.isNull():
            r = QRectF(-500, -500, 1000, 1000)
        if not force and self.sceneRect().contains(r):
            return
        m = max(1500.0, 0.25 * max(r.width(), r.height()))
        self.setSceneRect(r.adjusted(-m, -m, m, m))
        self.overview.set_rect(self.sceneRect())

    def content_rect(self) -> QRectF:
        """What fit-all shows: nodes, inputs and groups (not the overview or helper items)."""
        if self._content is None:
            r = QRectF()
            for item in list(self.nodes.values()) + list(self.terminals.values()) + self.groups:
                if item.isVisible():
                    r = r.united(item.sceneBoundingRect())
            self._content = r
        return QRectF(self._content)

    # selection -----------------------------------------------------------------------------
    def selected_node_ids(self) -> list[str]:
        ids = []
        for item in self.selectedItems():
            if isinstance(item, NodeItem):
                ids.append(item.node_id)
            elif isinstance(item, GroupItem):
                ids.extend(item.members)
        order = {nid: i for i, nid in enumerate(self.program.nodes)}
        return sorted(set(ids), key=order.get)

    def select_nodes(self, node_ids) -> None:
        self.clearSelection()
        for nid in node_ids:
            item = self.group_of.get(nid) or self.nodes.get(nid)
            if item is not None:
                item.setSelected(True)

    # edits (gestures -> commands) ------------------------------------------------------------
    def add_node(self, op: str, pos: QPointF | None = None, connect_from: str | None = None,
                 connect_to: tuple[str, int] | None = None) -> str:
        """Add an op at pos; optionally read `connect_from` on port 0 or feed `connect_to`. One undo step.
        "input", "parameter" and "constant" (the palette's Program entries) go to add_source and
        return the new value's id."""
        if op in SOURCE_KINDS:
            return self.add_source(op, pos, connect_to)
        at = pos if pos is not None else self._free_spot()
        with C.macro(self.stack, f"Add {op}"):
            cmd = C.AddNode(self.program, op, [connect_from] if connect_from else [], pos=(at.x(), at.y()))
            self.stack.push(cmd)
            if connect_to is not None:
                node = self.program.nodes[cmd.node_id]
                if node.outputs:
                    self.try_connect(node.outputs[0], *connect_to)
        self.select_nodes([cmd.node_id])
        return cmd.node_id

    def add_source(self, kind: str, pos: QPointF | None = None, connect_to: tuple[str, int] | None = None,
                   shape=None) -> str:
        """A program input, parameter or constant (commands.add_source names and shapes it) at pos, or
        feeding input port `connect_to`; one undo step. Returns the new value's id and selects it."""
        self._home_next = pos if pos is not None else self._free_spot()
        try:
            vid, reason = C.add_source(self.stack, self.program, kind, connect_to, shape)
        finally:
            self._home_next = None
        if reason:
            self._refuse(reason)
        self.clearSelection()
        target = self.terminals.get(vid) or (self.nodes.get(connect_to[0]) if connect_to else None)
        if target is not None:
            target.setSelected(True)
        return vid

    def set_program_output(self, value_id: str, on: bool) -> None:
        """Mark (or unmark) a node's output as a program output: one undo step."""
        if (value_id in self.program.outputs) != on:
            self.stack.push(C.MarkOutput(self.program, value_id, on))

    def context_menu(self, pos: QPointF) -> QMenu:
        """The canvas's right-click menu at scene `pos` (its QActions are what a right-click offers)."""
        menu = QMenu()
        p = self.program
        item, hit = self._port_under(pos)
        if isinstance(item, NodeItem):
            node = p.nodes[item.node_id]
            if hit is not None and hit[0] == "in" and (hit[1] >= len(node.inputs) or node.inputs[hit[1]] is None):
                port = node.opdef.port_name(hit[1]).rstrip("?")
                for kind in SOURCE_KINDS:
                    menu.addAction(f"New {kind} for {port}",
                                   lambda k=kind, at=(node.id, hit[1]): self.add_source(k, connect_to=at))
                menu.addSeparator()
            for vid in node.outputs:
                v = p.values[vid]
                on = vid in p.outputs
                menu.addAction(f"{'Unmark' if on else 'Mark'} {v.name} as program output",
                               lambda vid=vid, on=on: self.set_program_output(vid, not on))
        elif item is None:
            for kind in SOURCE_KINDS:
                menu.addAction(f"Add {kind} here", lambda k=kind: self.add_source(k, pos))
            menu.addAction("Add node here…", lambda: self.quick_search_requested.emit(pos, None))
        return menu

    def contextMenuEvent(self, event):
        menu = self.context_menu(event.scenePos())
        if menu.isEmpty():
            super().contextMenuEvent(event)
            return
        menu.exec(event.screenPos())
        event.accept()

    def try_connect(self, value_id: str, node_id: str, port: int) -> str | None:
        """Connect if the model allows it; else report the model's reason and return it."""
        reason = self.program.can_connect(value_id, node_id, port)
        if reason:
            self.last_refusal = reason
            self.connection_refused.emit(reason)
            return reason
        node = self.program.nodes[node_id]
        if port < len(node.inputs) and node.inputs[port] == value_id:
            return None
        self.stack.push(C.SetInput(self.program, node_id, port, value_id))
        return None

    def disconnect_port(self, node_id: str, port: int) -> None:
        self.stack.push(C.SetInput(self.program, node_id, port, None))

    def delete_selection(self) -> int:
        """Delete selected nodes (with their edges), inputs and edges as one undo step."""
        p = self.program
        node_ids = self.selected_node_ids()
        edges = [i for i in self.selectedItems() if isinstance(i, EdgeItem)]
        terms = [i.value_id for i in self.selectedItems() if isinstance(i, TerminalItem)]
        if not (node_ids or edges or terms):
            return 0
        order = {nid: i for i, nid in enumerate(p.topo_order())} if not p._has_cycle(p.graph()) else {}
        with C.macro(self.stack, f"Delete {len(node_ids) + len(edges) + len(terms)} items"):
            for e in edges:
                if e.node_id not in node_ids and e.node_id in p.nodes:
                    self.stack.push(C.SetInput(p, e.node_id, e.port, None))
            for nid in sorted(node_ids, key=lambda n: -order.get(n, 0)):
                self.stack.push(C.RemoveNode(p, nid))
            for vid in terms:
                self.stack.push(C.RemoveValue(p, vid))
        return len(node_ids) + len(edges) + len(terms)

    # overlays (the region hulls of the next issue plug in here) ----------------------------------
    def add_overlay(self, item: QGraphicsItem) -> None:
        """Draw `item` under edges and nodes; it is kept across rebuilds. Region hulls use this."""
        item.setZValue(OVERLAY_Z)
        self.overlays.append(item)
        self.addItem(item)

    # sizes and layout input --------------------------------------------------------------------
    def layout_input(self, node_ids=None):
        return program_layout_input(self.program, node_ids)

    def helpEvent(self, event):
        """Tooltips come from the model when asked for (5,000 items need not each hold one)."""
        for item in self.items(event.scenePos(), Qt.IntersectsItemShape, Qt.DescendingOrder):
            text = item.tooltip_text() if hasattr(item, "tooltip_text") else ""
            if isinstance(item, EdgeItem):
                v = self.program.values.get(item.value_id)
                text = f"{v.name}: {v.spec}" if v else ""
            if text:
                QToolTip.showText(event.screenPos(), text, event.widget())
                event.accept()
                return
        QToolTip.hideText()
        event.ignore()

    # background grid ---------------------------------------------------------------------------
    def drawBackground(self, painter, rect: QRectF) -> None:
        painter.fillRect(rect, self.style.background)
        scale = painter.worldTransform().m11()
        if scale < 0.35:
            return  # a grid finer than a few pixels is noise (and costs time on big programs)
        step = 24.0
        left, top = int(rect.left() // step) * step, int(rect.top() // step) * step
        pen = QPen(self.style.grid, 0)
        painter.setPen(pen)
        lines = []
        from PySide6.QtCore import QLineF
        x = left
        while x < rect.right():
            if int(round(x / step)) % 5:
                lines.append(QLineF(x, rect.top(), x, rect.bottom()))
            x += step
        y = top
        while y < rect.bottom():
            if int(round(y / step)) % 5:
                lines.append(QLineF(rect.left(), y, rect.right(), y))
            y += step
        painter.drawLines(lines)
        painter.setPen(QPen(self.style.grid_major, 0))
        major = []
        x = int(rect.left() // (5 * step)) * 5 * step
        while x < rect.right():
            major.append(QLineF(x, rect.top(), x, rect.bottom()))
            x += 5 * step
        y = int(rect.top() // (5 * step)) * 5 * step
        while y < rect.bottom():
            major.append(QLineF(rect.left(), y, rect.right(), y))
            y += 5 * step
        painter.drawLines(major)


def program_layout_input(p: Program, node_ids=None):
    """Plain data for graph_editor.layout (nodes, sizes, edges); program inputs are included as nodes
    so the layout leaves room for their terminals."""
    from .layout import LayoutInput
    ids = list(p.nodes) if node_ids is None else [n for n in node_ids if n in p.nodes]
    idset = set(ids)
    sizes = {nid: node_size(p.nodes[nid]) for nid in ids}
    edges = []
    for nid in list(ids):
        for vid in p.nodes[nid].inputs:
            v = p.values.get(vid) if vid else None
            if v is None:
                continue
            if v.producer in idset:
                edges.append((v.producer, nid))
            elif v.role == Role.INPUT and node_ids is None:
                key = "\0in:" + vid
                if key not in sizes:
                    sizes[key] = (TERMINAL_W, TERMINAL_H)
                    ids.append(key)
                edges.append((key, nid))
    return with_modules(p, LayoutInput(ids, sizes, edges))
