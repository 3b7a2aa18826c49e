"""Zoomed far out, the whole program is drawn by this one item in a few bulk calls (drawRects per
category colour, one drawLines for all edges) while node and edge items stop painting
(ItemHasNoContents) but stay selectable. Thousands of Python paint() calls per frame is what makes
big graphs crawl; this keeps a zoom step on a 2,000-node program to a few milliseconds."""
from __future__ import annotations

from PySide6.QtCore import QLineF, QRectF, Qt
from PySide6.QtGui import QPainter, QPen
from PySide6.QtWidgets import QGraphicsItem


class OverviewItem(QGraphicsItem):
    def __init__(self, scene):
        super().__init__()
        self._scene = scene
        self.setZValue(2)
        self.setFlag(QGraphicsItem.ItemIsSelectable, False)
        self.setAcceptedMouseButtons(Qt.NoButton)
        self.setVisible(False)
        self._dirty = True
        self._rect = QRectF()
        self._by_color: list = []
        self._lines: list[QLineF] = []

    def invalidate(self) -> None:
        """The program or positions changed: collect again before the next paint."""
        self._dirty = True
        self.update()

    def _collect(self) -> None:
        sc = self._scene
        by_color: dict[int, tuple] = {}
        for item in list(sc.nodes.values()) + list(sc.terminals.values()) + sc.groups:
            if not item.isVisible():
                continue
            r = item.sceneBoundingRect()
            color = getattr(item, "_header_color", None) or sc.style.accent
            by_color.setdefault(color.rgba(), (color, []))[1].append(r)
        self._by_color = list(by_color.values())
        self._lines = [ln for e in sc.edges.values() if e.isVisible() for ln in e.lines()]
        self._dirty = False

    def set_rect(self, rect: QRectF) -> None:
        """The scene's rect, given by the scene when it changes it: the item never stretches the
        scene's index, and answering boundingRect needs no collect."""
        self.prepareGeometryChange()
        self._rect = QRectF(rect)

    def boundingRect(self) -> QRectF:
        return self._rect

    def paint(self, p: QPainter, option, widget=None) -> None:
        if self._dirty:
            self._collect()
        st = self._scene.style
        p.setRenderHint(QPainter.Antialiasing, False)
        p.setPen(QPen(st.edge, 0))
        p.drawLines(self._lines)
        p.setPen(QPen(st.node_border, 0))
        for color, rects in self._by_color:
            p.setBrush(color)
            p.drawRects(rects)
        selected = [i.sceneBoundingRect() for i in self._scene.selectedItems() if i.kind != "edge"]
        if selected:
            p.setPen(QPen(st.node_selected, 0))
            p.setBrush(st.node_selected)
            p.drawRects(selected)
