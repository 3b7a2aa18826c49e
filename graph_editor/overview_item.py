"""Zoomed far out, the whole program is drawn by this one item in a few bulk calls (drawRects per
category colour, one drawLines for all edges) while node and edge items stop painting
(ItemHasNoContents) but stay selectable. Collapsed groups, and nodes big enough on screen, keep a
title at a readable screen size where one fits (node_item.draw_far_title). Thousands of Python paint() calls per frame is what makes
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
        self._titled: list = []

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
        self._titled = [item for item in list(sc.groups) + list(sc.nodes.values()) if item.isVisible()]
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
        self._paint_titles(p, option.exposedRect)

    def titles(self, transform) -> list[tuple[QRectF, list[str], object]]:
        """(screen rect, title candidates, item) of every item tall enough on screen for a title."""
        from .style import READABLE_PX
        out = []
        for item in self._titled:
            w, h = item.size()
            r = QRectF(item.pos().x(), item.pos().y(), w, h)
            screen = transform.mapRect(r)
            if screen.height() >= READABLE_PX + 4 and screen.width() >= 5 * READABLE_PX:
                out.append((screen, item.far_titles(), item))
        return out

    def _paint_titles(self, p: QPainter, exposed: QRectF) -> None:
        from .node_item import draw_far_title
        t = p.worldTransform()
        shown = [x for x in self.titles(t) if t.mapRect(exposed).intersects(x[0])]
        if not shown or len(shown) > 800:   # a thousand labels at once would read as noise anyway
            return
        st = self._scene.style
        p.save()
        p.resetTransform()
        p.setRenderHint(QPainter.TextAntialiasing, True)
        for screen, candidates, item in shown:
            color = getattr(item, "_header_text", None) or st.text
            draw_far_title(p, screen, candidates, 1.0, st, color)
        p.restore()
