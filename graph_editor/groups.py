"""Collapsing a group of nodes into one item and expanding it again (part of GraphScene).

Groups are view state, not edits: they are kept in program.metadata["editor"]["collapsed"] so they
survive saving, and they are not undo steps. Edges crossing a group's border end on its ports;
edges inside it are hidden. The planner's fused regions (next issue) can collapse the same way.
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF
from PySide6.QtWidgets import QGraphicsItem

from .edge_item import GroupItem


class GroupsMixin:
    def collapse(self, node_ids, name: str | None = None) -> GroupItem | None:
        members = [n for n in node_ids if n in self.nodes and n not in self.group_of]
        if len(members) < 2:
            self.message.emit("select at least two nodes to collapse")
            return None
        g = self._make_group(name or f"group {len(self.groups) + 1}", members)
        self._save_groups()
        self.clearSelection()
        g.setSelected(True)
        return g

    def expand(self, group: GroupItem) -> list[str]:
        members = list(group.members)
        self._drop_group(group)
        self._save_groups()
        self.select_nodes(members)
        return members

    def _make_group(self, name: str, members: list[str]) -> GroupItem:
        g = GroupItem(name, members, self.program, self.style)
        g.setFlag(QGraphicsItem.ItemIsMovable, False)
        rect = QRectF()
        for nid in members:
            item = self.nodes[nid]
            rect = rect.united(item.sceneBoundingRect())
            item.setVisible(False)
            self.group_of[nid] = g
        w, h = g.size()
        g.setPos(rect.center() - QPointF(w / 2, h / 2))
        self.addItem(self._fresh(g))
        self.groups.append(g)
        self._refresh_group_edges(members)
        return g

    def _drop_group(self, g: GroupItem) -> None:
        for nid in g.members:
            self.group_of.pop(nid, None)
            if nid in self.nodes:
                self.nodes[nid].setVisible(True)
        self.groups.remove(g)
        self.removeItem(g)
        self._refresh_group_edges([m for m in g.members if m in self.program.nodes])

    def _refresh_group_edges(self, members) -> None:
        keys = set()
        for nid in members:
            if nid in self.program.nodes:
                keys |= self._edges_of_node(nid)
        for key in keys:
            self._update_edge(key)
        for nid in members:
            self._place_terminals_for(nid)
        self.overview.invalidate()
        self._content = None

    def _save_groups(self) -> None:
        meta = self.program.metadata.setdefault("editor", {})
        meta["collapsed"] = [{"name": g.name, "nodes": list(g.members)} for g in self.groups]
