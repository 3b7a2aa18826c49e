"""Regions on the canvas: a translucent rounded hull behind each active region's nodes, coloured by
kind, labelled with its kind and speedup, with the agent's reason as the tooltip.

RegionOverlay observes the program (regions_changed and node events) and the scene (nodes being
dragged), keeps one RegionItem per active region at the scene's OVERLAY_Z, and says which region was
clicked. The hulls are view state only: every region edit goes through the model (regions.py).
"""
from __future__ import annotations

from PySide6.QtCore import QObject, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPainterPath, QPainterPathStroker, QPen, QPolygonF
from PySide6.QtWidgets import QGraphicsItem

from agent_core.regions import active_regions

# the same hues as profiler_view's kernel colours, so a region and its bars read as one thing
KIND_COLORS = {"pointwise": "#4f9dde", "reduction": "#d9822b", "matmul_epilogue": "#9b6ad6",
               "conv_epilogue": "#c75d9b", "sibling": "#3fb28f", "single": "#8a8f98", "opaque": "#6b6f76"}
HULL_PAD = 16.0
LABEL_H = 22.0


def kind_color(kind: str) -> QColor:
    return QColor(KIND_COLORS.get(kind, "#8a8f98"))


def fmt_ms(ms) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.2f} ms"


def speedup(region) -> tuple[float | None, bool]:
    """(speedup, measured): the measured one when the agent timed the region on a GPU, else the
    planner's estimate."""
    agent = (region.schedule or {}).get("agent") or {}
    unfused = agent.get("unfused_ms")
    if region.measured_ms and unfused:
        return unfused / region.measured_ms, True
    if region.est_before_ms and region.est_after_ms:
        return region.est_before_ms / region.est_after_ms, False
    return None, False


def region_label(region) -> str:
    s, measured = speedup(region)
    text = f"{region.id} · {region.kind.replace('_', ' ')}"
    if s is not None:
        text += f" · {s:.2f}x {'measured' if measured else 'est.'}"
    if region.status in ("locked", "accepted", "user-made"):
        text += f" · {region.status}"
    verdict = ((region.schedule or {}).get("agent") or {}).get("status")
    if verdict in ("fallback", "compiled"):     # "fused" already shows as the measured speedup
        text += " · fell back" if verdict == "fallback" else " · compiled"
    return text


def region_tooltip(region) -> str:
    agent = (region.schedule or {}).get("agent") or {}
    lines = [f"<b>{region.id}</b>: {region.kind.replace('_', ' ')} region, {region.status}, "
             f"{len(region.nodes)} node(s)"]
    if region.reason:
        lines.append(f"<i>Why:</i> {region.reason}")
    if region.est_before_ms is not None:
        lines.append(f"<i>Estimate:</i> {fmt_ms(region.est_before_ms)} unfused → {fmt_ms(region.est_after_ms)} fused")
    if region.measured_ms is not None:
        lines.append(f"<i>Measured:</i> {fmt_ms(region.measured_ms)} fused"
                     + (f" vs {fmt_ms(agent['unfused_ms'])} unfused" if agent.get("unfused_ms") else ""))
    if agent.get("status"):
        lines.append(f"<i>Agent:</i> {agent['status']}: {agent.get('reason', '')}")
    return "<br>".join(lines)


def _convex_hull(points: list[QPointF]) -> list[QPointF]:
    pts = sorted({(p.x(), p.y()) for p in points})
    if len(pts) < 3:
        return [QPointF(x, y) for x, y in pts]

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])
    lower, upper = [], []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return [QPointF(x, y) for x, y in lower[:-1] + upper[:-1]]


def hull_path(rects: list[QRectF], pad: float = HULL_PAD) -> QPainterPath:
    """The convex hull of the rects, grown by `pad` with round corners."""
    pts = [c for r in rects for c in (r.topLeft(), r.topRight(), r.bottomLeft(), r.bottomRight())]
    poly = QPainterPath()
    poly.addPolygon(QPolygonF(_convex_hull(pts)))
    poly.closeSubpath()
    st = QPainterPathStroker()
    st.setWidth(2 * pad)
    st.setJoinStyle(Qt.RoundJoin)
    st.setCapStyle(Qt.RoundCap)
    return st.createStroke(poly).united(poly).simplified()


class RegionItem(QGraphicsItem):
    def __init__(self, overlay: "RegionOverlay", region_id: str):
        super().__init__()
        self.overlay, self.region_id = overlay, region_id
        self.path = QPainterPath()
        self._key = None
        self.selected = False
        self.setAcceptHoverEvents(True)
        self.setCursor(Qt.PointingHandCursor)

    @property
    def region(self):
        return next((r for r in self.overlay.scene.program.regions if r.id == self.region_id), None)

    def update_geometry(self, rects: list[QRectF]) -> None:
        key = tuple((r.x(), r.y(), r.width(), r.height()) for r in rects)
        if key == self._key:
            return
        self._key = key
        self.prepareGeometryChange()
        self.path = hull_path(rects)

    def label_rect(self) -> QRectF:
        b = self.path.boundingRect()
        return QRectF(b.left() + 10, b.top() - LABEL_H + 4, max(b.width() - 20, 60), LABEL_H)

    def boundingRect(self) -> QRectF:
        return self.path.boundingRect().united(self.label_rect()).adjusted(-3, -3, 3, 3)

    def shape(self) -> QPainterPath:
        s = QPainterPath(self.path)
        s.addRect(self.label_rect())
        return s

    def tooltip_text(self) -> str:
        r = self.region
        return region_tooltip(r) if r else ""

    def paint(self, p, option, widget=None) -> None:
        r = self.region
        if r is None:
            return
        style = self.overlay.scene.style
        col = kind_color(r.kind)
        fill = QColor(col)
        fill.setAlpha(90 if self.selected else 46)
        pen = QPen(col, 3.0 if self.selected else 1.6)
        pen.setCosmetic(True)
        if r.status == "proposed":
            pen.setStyle(Qt.DashLine)
        elif r.status == "user-made":
            pen.setStyle(Qt.DotLine)
        p.setPen(pen)
        p.setBrush(QBrush(fill))
        p.drawPath(self.path)
        p.setFont(style.font_bold)
        text = region_label(r)
        lr = self.label_rect()
        text = text
        p.setPen(col.lighter(130) if style.name == "dark" else col.darker(140))
        p.drawText(QRectF(lr.left(), lr.top(), max(lr.width(), 400.0), lr.height()),
                   Qt.AlignLeft | Qt.AlignVCenter, text)

    def mousePressEvent(self, ev):
        if ev.button() == Qt.LeftButton:
            ev.accept()
            self.overlay.region_clicked.emit(self.region_id)
        else:
            ev.ignore()


class RegionOverlay(QObject):
    """The region hulls of one GraphScene. `region_clicked(id)` when a hull is clicked."""
    region_clicked = Signal(str)

    def __init__(self, scene, parent=None):
        super().__init__(parent)
        self.scene = scene
        self.items: dict[str, RegionItem] = {}
        self.current: str | None = None
        scene.program.subscribe(self._on_event)
        scene.changed.connect(lambda _rects: self.update_geometry())
        self.rebuild()

    def detach(self) -> None:
        self.scene.program.unsubscribe(self._on_event)
        for item in self.items.values():
            if item.scene() is not None:
                item.scene().removeItem(item)
            if item in self.scene.overlays:
                self.scene.overlays.remove(item)
        self.items.clear()

    def _on_event(self, event: str, payload: dict) -> None:
        if event == "regions_changed":
            self.rebuild()
        elif event in ("node_removed", "node_added", "node_moved", "node_changed"):
            self.update_geometry()

    def rebuild(self) -> None:
        active = {r.id for r in active_regions(self.scene.program)}
        for rid in list(self.items):
            if rid not in active:
                item = self.items.pop(rid)
                self.scene.removeItem(item)
                if item in self.scene.overlays:
                    self.scene.overlays.remove(item)
        for rid in active:
            if rid not in self.items:
                item = RegionItem(self, rid)
                self.items[rid] = item
                self.scene.add_overlay(item)
        if self.current not in active:
            self.current = None
        for rid, item in self.items.items():
            item.selected = rid == self.current
            item._key = None
        self.update_geometry()
        for item in self.items.values():
            item.update()

    def member_rects(self, region) -> list[QRectF]:
        rects = []
        for nid in region.nodes:
            group = self.scene.group_of.get(nid) if hasattr(self.scene, "group_of") else None
            item = group if group is not None else self.scene.nodes.get(nid)
            if item is not None and item.isVisible():
                rects.append(item.sceneBoundingRect())
        return rects

    def update_geometry(self) -> None:
        """Follow moved nodes (called once per scene change batch: Qt coalesces `changed`); an
        unchanged hull is not rebuilt (RegionItem compares its members' rects)."""
        if not self.items:
            return
        regs = self.region_map()
        for rid, item in self.items.items():
            r = regs.get(rid)
            rects = self.member_rects(r) if r is not None else []
            item.setVisible(bool(rects))
            if rects:
                item.update_geometry(rects)

    def region_map(self) -> dict:
        return {r.id: r for r in self.scene.program.regions}

    def select(self, region_id: str | None) -> None:
        self.current = region_id if region_id in self.items else None
        for rid, item in self.items.items():
            if item.selected != (rid == self.current):
                item.selected = rid == self.current
                item.update()
