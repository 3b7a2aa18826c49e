"""Connecting by dragging from a port, moving nodes, double-click (part of GraphScene).

A drag from an output onto an input asks the model (Program.can_connect) and either pushes one
SetInput command or reports the model's reason; released on empty canvas it asks for the quick
search with only the ops that fit. A drag from a connected input moves or removes that edge.
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QPen
from PySide6.QtWidgets import QGraphicsPathItem, QToolTip

from . import commands as C
from .edge_item import GroupItem, TerminalItem, edge_path
from .node_item import NodeItem


class ConnectMixin:
    def _port_under(self, pos: QPointF):
        for item in self.items(pos, Qt.IntersectsItemShape, Qt.DescendingOrder):
            if isinstance(item, (NodeItem, TerminalItem)) and item.isVisible():
                hit = item.port_at(item.mapFromScene(pos))
                if hit is not None:
                    return item, hit
                if isinstance(item, NodeItem):
                    return item, None
        return None, None

    def _drag_start(self, item, hit):
        """What a drag from this port carries: ('out', value_id) or ('in', node, port, current value)."""
        side, idx = hit
        if isinstance(item, TerminalItem):
            return ("out", item.value_id)
        node = self.program.nodes[item.node_id]
        if side == "out":
            return ("out", node.outputs[idx])
        current = node.inputs[idx] if idx < len(node.inputs) else None
        return ("in", item.node_id, idx, current)

    def mousePressEvent(self, event):
        if event.button() == Qt.LeftButton:
            item, hit = self._port_under(event.scenePos())
            if hit is not None:
                self._drag = self._drag_start(item, hit)
                self._drag_origin = event.scenePos()
                if self._drag[0] == "in" and self._drag[3] is not None:
                    self._drag_origin = self.source_pos(self._drag[3]) or event.scenePos()
                elif self._drag[0] == "out":
                    self._drag_origin = self.source_pos(self._drag[1]) or event.scenePos()
                self._drag_path = QGraphicsPathItem()
                self._drag_path.setPen(QPen(self.style.accent, 1.6, Qt.DashLine))
                self._drag_path.setZValue(5)
                self.addItem(self._drag_path)
                event.accept()
                return
        super().mousePressEvent(event)
        self._press_pos = {nid: item.pos() for nid, item in self.nodes.items() if item.isSelected()}

    def mouseMoveEvent(self, event):
        if self._drag is not None:
            a, b = self._drag_origin, event.scenePos()
            if self._drag[0] == "in" and self._drag[3] is None:
                a, b = b, self.target_pos(self._drag[1], self._drag[2])
            self._drag_path.setPath(edge_path(a, b))
            event.accept()
            return
        super().mouseMoveEvent(event)
        if self._press_pos and event.buttons() & Qt.LeftButton:  # nodes being dragged: edges follow
            for nid in self._press_pos:
                self._node_item_moved(nid)

    def mouseReleaseEvent(self, event):
        if self._drag is not None:
            drag, self._drag = self._drag, None
            self.removeItem(self._drag_path)
            self._drag_path = None
            reason = self.finish_drag(drag, event.scenePos())
            if reason and event.widget() is not None:
                QToolTip.showText(event.screenPos(), reason, event.widget())
            event.accept()
            return
        super().mouseReleaseEvent(event)
        self._commit_moves()

    def finish_drag(self, drag, pos: QPointF) -> str | None:
        """Complete a port drag released at scene `pos`; returns the refusal reason, if any."""
        item, hit = self._port_under(pos)
        if drag[0] == "out":
            vid = drag[1]
            if hit is not None and hit[0] == "in" and isinstance(item, NodeItem):
                return self.try_connect(vid, item.node_id, hit[1])
            if hit is None and item is None:
                self.quick_search_requested.emit(pos, ("out", vid))
                return None
            return self._refuse("connect an output port to an input port")
        _, nid, port, current = drag
        if hit is not None and hit[0] == "out":
            src = self._drag_start(item, hit)[1]
            return self.try_connect(src, nid, port)
        if current is not None and hit is not None and hit[0] == "in" and isinstance(item, NodeItem):
            # moving an existing edge to another input port: one undo step
            reason = self.program.can_connect(current, item.node_id, hit[1])
            if reason:
                return self._refuse(reason)
            with C.macro(self.stack, "Move connection"):
                self.disconnect_port(nid, port)
                self.try_connect(current, item.node_id, hit[1])
            return None
        if item is None and current is not None:
            self.disconnect_port(nid, port)
            return None
        if item is None:
            self.quick_search_requested.emit(pos, ("in", (nid, port)))
            return None
        return self._refuse("connect an input port to an output port")

    def _refuse(self, reason: str) -> str:
        self.last_refusal = reason
        self.connection_refused.emit(reason)
        return reason

    def _commit_moves(self) -> None:
        """After a drag of nodes: one MoveNodes command for everything that moved."""
        moves = {}
        for nid, before in self._press_pos.items():
            item = self.nodes.get(nid)
            if item is not None and item.pos() != before:
                moves[nid] = (item.pos().x(), item.pos().y())
        self._press_pos = {}
        if moves:
            self.stack.push(C.MoveNodes(self.program, moves, f"Move {len(moves)} node{'s' * (len(moves) > 1)}"))

    def mouseDoubleClickEvent(self, event):
        for item in self.items(event.scenePos()):
            if isinstance(item, GroupItem):
                self.expand(item)
                event.accept()
                return
            if isinstance(item, (NodeItem, TerminalItem)):
                super().mouseDoubleClickEvent(event)
                return
            if getattr(item, "kind", "") == "module":   # a module box: its title collapses it
                super().mouseDoubleClickEvent(event)
                if event.isAccepted():
                    return
        self.quick_search_requested.emit(event.scenePos(), None)
        event.accept()
