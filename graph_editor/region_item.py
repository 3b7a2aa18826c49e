"""Regions on the canvas: a tinted frame behind each active region's nodes, coloured by kind, labelled
with its kind and speedup, with the agent's reason as the tooltip.

A frame is the union of its members' bodies grown by FRAME_PAD (less than half the layout's gaps),
joined where two members sit one above the other with nothing between them, and with a label band
above its topmost member. Whatever another region's frame already covers is cut out, so no point of
the canvas is in two regions: membership is never ambiguous, even where a user dragged nodes together.
The label sits inside the band, away from the border.

RegionOverlay observes the program (regions_changed and node events) and the scene (nodes being
dragged), keeps one RegionItem per active region at the scene's OVERLAY_Z, and says which region was
clicked. The hulls are view state only: every region edit goes through the model (regions.py).
"""
from __future__ import annotations

from PySide6.QtCore import QObject, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPainterPath, QPen
from PySide6.QtWidgets import QGraphicsItem

from agent_core.regions import KIND_HUES, active_regions

FRAME_PAD = 8.0    # below half of the layout's NODE_GAP: two regions' frames never touch
LABEL_H = 22.0     # the label band above a region's top member: one line ...
LINE2_H = 12.0     # ... and this much more where the label needs a second (its figures, smaller)
LABEL_LOD = 0.63   # below this zoom the 9.5 pt label is under 8 px: the hull's colour says the kind


def kind_color(kind: str) -> QColor:
    return QColor(KIND_HUES.get(kind, KIND_HUES["single"]))


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
        launches = (region.schedule or {}).get("launches")
        runs = f" ({launches} launch{'es' if launches != 1 else ''})" if launches else ""
        lines.append(f"<i>Estimate:</i> {fmt_ms(region.est_before_ms)} unfused → {fmt_ms(region.est_after_ms)} "
                     f"planned{runs}")
    if region.measured_ms is not None:
        lines.append(f"<i>Measured:</i> {fmt_ms(region.measured_ms)} fused"
                     + (f" vs {fmt_ms(agent['unfused_ms'])} unfused" if agent.get("unfused_ms") else ""))
    if agent.get("status"):
        lines.append(f"<i>Agent:</i> {agent['status']}: {agent.get('reason', '')}")
    return "<br>".join(lines)


def _body(item) -> QRectF:
    w, h = item.size()
    return QRectF(item.pos().x(), item.pos().y(), w, h)


def label_lines(region) -> tuple[str, str]:
    """The label as (what it is, its figures): "r1 · matmul epilogue", "1.25x est. · locked"."""
    text = region_label(region)
    head = f"{region.id} · {region.kind.replace('_', ' ')}"
    return head, text[len(head) + 3:]


def frame_path(rects: list[QRectF], obstacles: list[QRectF] = (), lines: int = 1) -> tuple[QPainterPath, QRectF]:
    """(the region's outline, its label's rect) around member bodies `rects`, with a band of `lines`
    label lines above the top member; `obstacles` are the bodies of every other visible item (and
    the input terminals), which a joining bridge must not cross."""
    grown = [r.adjusted(-FRAME_PAD, -FRAME_PAD, FRAME_PAD, FRAME_PAD) for r in rects]
    path = QPainterPath()
    path.setFillRule(Qt.WindingFill)   # overlapping pieces are one area, not holes (odd-even)
    for g in grown:
        path.addRoundedRect(g, 6, 6)
    # bridges: a member directly below another, overlapping in x, nothing in between
    by_top = sorted(grown, key=lambda r: r.top())
    for i, a in enumerate(by_top):
        for b in by_top[i + 1:]:
            left, right = max(a.left(), b.left()) + 8, min(a.right(), b.right()) - 8
            if right - left < 24 or b.top() <= a.bottom():
                continue
            bridge = QRectF(left, a.bottom() - 1, right - left, b.top() - a.bottom() + 2)
            if not any(bridge.intersects(o) for o in obstacles):
                path.addRect(bridge)
            break
    top = by_top[0]
    band_h = LABEL_H + (lines - 1) * LINE2_H
    band = QRectF(top.left(), top.top() - band_h, top.width(), band_h + 6)
    path.addRoundedRect(band, 6, 6)
    return path.simplified(), QRectF(band.left() + 9, band.top() + 4, band.width() - 18, band_h - 6)


def _rect_key(r: QRectF) -> tuple:
    return (round(r.x(), 1), round(r.y(), 1), round(r.width(), 1), round(r.height(), 1))


class RegionItem(QGraphicsItem):
    def __init__(self, overlay: "RegionOverlay", region_id: str):
        super().__init__()
        self.overlay, self.region_id = overlay, region_id
        self.path = QPainterPath()
        self._label = QRectF()
        self._key = None
        self.selected = False
        self.setAcceptHoverEvents(True)
        self.setCursor(Qt.PointingHandCursor)

    @property
    def region(self):
        return next((r for r in self.overlay.scene.program.regions if r.id == self.region_id), None)

    def set_geometry(self, path: QPainterPath, label: QRectF) -> None:
        self.prepareGeometryChange()
        self.path, self._label = path, label

    def label_rect(self) -> QRectF:
        return QRectF(self._label)

    def boundingRect(self) -> QRectF:
        return self.path.boundingRect().adjusted(-3, -3, 3, 3)

    def shape(self) -> QPainterPath:
        return self.path

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
        if option.levelOfDetailFromTransform(p.worldTransform()) < LABEL_LOD:
            return   # a few pixels high: colour says the kind, the tooltip says the rest
        lr = self.label_rect()
        p.setFont(style.font_bold)
        p.setPen(style.text)
        if lr.height() < LABEL_H:      # one line holds it all
            p.drawText(lr, Qt.AlignLeft | Qt.AlignVCenter, style.elide("font_bold", region_label(r), lr.width()))
            return
        head, figures = label_lines(r)
        line = QRectF(lr.left(), lr.top(), lr.width(), LABEL_H - 6)
        p.drawText(line, Qt.AlignLeft | Qt.AlignVCenter, style.elide("font_bold", head, lr.width()))
        p.setFont(style.font_small)
        p.setPen(style.text_muted)
        p.drawText(line.translated(0, LINE2_H + 1), Qt.AlignLeft | Qt.AlignVCenter,
                   style.elide("font_small", figures, lr.width()))

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
        self._key = None
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
        self.drop_items(active)
        for rid in active:
            if rid not in self.items:
                item = RegionItem(self, rid)
                self.items[rid] = item
                self.scene.add_overlay(item)
        if self.current not in active:
            self.current = None
        for rid, item in self.items.items():
            item.selected = rid == self.current
        self._key = None
        self.update_geometry()
        for item in self.items.values():
            item.update()

    def drop_items(self, keep) -> None:
        """Remove the hulls of regions not in `keep`."""
        for rid in [rid for rid in self.items if rid not in keep]:
            item = self.items.pop(rid)
            self.scene.removeItem(item)
            if item in self.scene.overlays:
                self.scene.overlays.remove(item)

    def member_rects(self, region) -> list[QRectF]:
        rects = []
        for nid in region.nodes:
            group = self.scene.group_of.get(nid) if hasattr(self.scene, "group_of") else None
            item = group if group is not None else self.scene.nodes.get(nid)
            if item is not None and item.isVisible():
                r = _body(item)
                if r not in rects:
                    rects.append(r)
        return rects

    def update_geometry(self) -> None:
        """Follow moved nodes (called once per scene change batch: Qt coalesces `changed`); nothing
        is rebuilt while no member moved. Frames are cut in order, so the first region keeps a
        point two frames would share."""
        if not self.items:
            return
        regs = self.region_map()
        members = {rid: self.member_rects(regs[rid]) if rid in regs else [] for rid in self.items}
        key = tuple((rid, tuple((r.x(), r.y(), r.width(), r.height()) for r in rs)) for rid, rs in members.items())
        if key == self._key:
            return
        self._key = key
        obstacles = [_body(i) for i in list(self.scene.nodes.values()) + list(self.scene.groups)
                     if i.isVisible()]
        obstacles += [t.sceneBoundingRect() for t in self.scene.terminals.values() if t.isVisible()]
        fm = self.scene.style.metrics("font_bold")
        taken = QPainterPath()
        for rid, item in self.items.items():
            rects = members[rid]
            item.setVisible(bool(rects))
            if not rects:
                continue
            own = set(map(_rect_key, rects))
            others = [o for o in obstacles if _rect_key(o) not in own]
            room = min(rects, key=lambda r: r.top()).width() + 2 * FRAME_PAD - 18
            lines = 1 if fm.horizontalAdvance(region_label(regs[rid])) <= room else 2
            path, label = frame_path(rects, others, lines)
            if not taken.isEmpty():
                path = path.subtracted(taken)
            item.set_geometry(path, label)
            taken = taken.united(path)

    def region_map(self) -> dict:
        return {r.id: r for r in self.scene.program.regions}

    def select(self, region_id: str | None) -> None:
        self.current = region_id if region_id in self.items else None
        for rid, item in self.items.items():
            if item.selected != (rid == self.current):
                item.selected = rid == self.current
                item.update()
