"""Collapsing a group of nodes into one item and expanding it again (part of GraphScene).

Groups live in program.metadata["editor"]["collapsed"], so they survive saving. Collapsing and
expanding are undo steps (commands.SetCollapsed) that change only that list; the scene follows the
"groups_changed" event. Edges crossing a group's border end on its ports; edges inside it are
hidden. The planner's fused regions collapse the same way.
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF
from PySide6.QtWidgets import QGraphicsItem

from . import commands as C
from .edge_item import GroupItem


class GroupsMixin:
    def collapse(self, node_ids, name: str | None = None) -> GroupItem | None:
        members = [n for n in node_ids if n in self.nodes and n not in self.group_of]
        if len(members) < 2:
            self.message.emit("select at least two nodes to collapse")
            return None
        name = name or f"group {len(self.groups) + 1}"
        groups = self._group_dicts() + [{"name": name, "nodes": members}]
        self.stack.push(C.SetCollapsed(self.program, groups, f"Collapse {len(members)} nodes into {name}"))
        g = self.group_of.get(members[0])
        self.clearSelection()
        if g is not None:
            g.setSelected(True)
        return g

    def expand(self, group: GroupItem) -> list[str]:
        """One undo step. Members the layout stacked under the group (a module collapsed when the
        program opened) have no places of their own yet: the program is laid out again with it open."""
        members = list(group.members)
        groups = [d for g, d in zip(self.groups, self._group_dicts()) if g is not group]
        with C.macro(self.stack, f"Expand {group.name}"):
            self.stack.push(C.SetCollapsed(self.program, groups, f"Expand {group.name}"))
            if self._stacked(members):
                from .layout import layered_layout
                pos = layered_layout(self.layout_input())
                self.stack.push(C.MoveNodes(self.program, {k: v for k, v in pos.items() if k in self.program.nodes},
                                            "Auto layout"))
                self.place_groups()
        self.select_nodes([m for m in members if m in self.nodes])
        return members

    def _stacked(self, members) -> bool:
        centres = set()
        for nid in members:
            item = self.nodes.get(nid)
            if item is not None:
                w, h = item.size()
                centres.add((round(item.pos().x() + w / 2), round(item.pos().y() + h / 2)))
        return len(members) > 1 and len(centres) == 1

    def place_groups(self) -> None:
        """Centre each collapsed item on its members again (after a layout moved them)."""
        for g in self.groups:
            rect = QRectF()
            for nid in g.members:
                item = self.nodes.get(nid)
                if item is not None:
                    w, h = item.size()
                    rect = rect.united(QRectF(item.pos().x(), item.pos().y(), w, h))
            w, h = g.size()
            g.setPos(rect.center() - QPointF(w / 2, h / 2))
            self._refresh_group_edges(g.members)

    def _group_dicts(self) -> list[dict]:
        return [{"name": g.name, "nodes": list(g.members)} for g in self.groups]

    def _ev_groups_changed(self) -> None:
        """Make the group items match the metadata: keep the unchanged ones, drop and make the rest."""
        p = self.program
        want = []
        for d in p.metadata.get("editor", {}).get("collapsed", []):
            members = [m for m in d.get("nodes", []) if m in p.nodes]
            if members:
                want.append((d.get("name", "group"), tuple(members)))
        have = {(g.name, tuple(g.members)): g for g in self.groups}
        for key, g in have.items():
            if key not in want:
                self._drop_group(g)
        for name, members in want:
            if (name, members) not in have:
                self._make_group(name, list(members))
        order = {key: i for i, key in enumerate(want)}
        self.groups.sort(key=lambda g: order.get((g.name, tuple(g.members)), len(order)))

    def _make_group(self, name: str, members: list[str]) -> GroupItem:
        g = GroupItem(name, members, self.program, self.style)
        g.setFlag(QGraphicsItem.ItemIsMovable, False)
        rect = QRectF()
        for nid in members:
            item = self.nodes[nid]
            w, h = item.size()
            rect = rect.united(QRectF(item.pos().x(), item.pos().y(), w, h))
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
