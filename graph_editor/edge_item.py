"""Edges (a value read by one input port), program-input terminals, and collapsed groups."""
from __future__ import annotations

from PySide6.QtCore import QLineF, QPointF, QRectF, Qt
from PySide6.QtGui import QFontMetricsF, QPainter, QPainterPath, QPainterPathStroker, QPen
from PySide6.QtWidgets import QGraphicsItem

from agent_core.ir import Program

from .node_item import LOD_DETAIL, LOD_TEXT, draw_far_title, fmt_spec
from .style import GROUP_SIZE, HEADER_H, PAD, PORT_R, ROW_H, TERMINAL_H, TERMINAL_W, CanvasStyle


def curve_reach(a: QPointF, b: QPointF) -> float:
    """How far the curve runs straight down out of its source and into its target (top to bottom
    layout); an edge going back up (to the next column of a wrapped layout) loops out further."""
    dy = b.y() - a.y()
    return max(30.0, dy * 0.5) if dy > 0 else 60.0


def edge_path(a: QPointF, b: QPointF) -> QPainterPath:
    """The drawn curve from an output port (bottom edge) to an input port (top edge)."""
    d = curve_reach(a, b)
    path = QPainterPath(a)
    path.cubicTo(a + QPointF(0, d), b - QPointF(0, d), b)
    return path


class EdgeItem(QGraphicsItem):
    """A curve from a value's source port to one consumer's input port, or, where it climbs to the
    next column of a wrapped layout, an orthogonal route (edge_routes.py). Key: (node id, port)."""
    kind = "edge"

    def __init__(self, value_id: str, node_id: str, port: int, style: CanvasStyle):
        super().__init__()
        self.value_id, self.node_id, self.port = value_id, node_id, port
        self.style = style
        self.setFlag(QGraphicsItem.ItemIsSelectable)
        self._a = self._b = QPointF()
        self.route: list[QPointF] | None = None
        self._path: QPainterPath | None = None
        self._rect = QRectF()

    def set_ends(self, a: QPointF, b: QPointF, route: list[QPointF] | None = None) -> None:
        if a == self._a and b == self._b and route == self.route:
            return
        self.prepareGeometryChange()
        self._a, self._b, self.route = a, b, route
        if route:
            xs, ys = [p.x() for p in route], [p.y() for p in route]
            left, right, top, bottom = min(xs), max(xs), min(ys), max(ys)
        else:
            # the curve's control points are a + (0, dy) and b - (0, dy): its box follows without
            # building the path, which waits until the edge is first painted or hit-tested
            ax, ay, bx, by = a.x(), a.y(), b.x(), b.y()
            dy = curve_reach(a, b)
            top, bottom = min(ay, by - dy), max(ay + dy, by)
            left, right = min(ax, bx), max(ax, bx)
        self._rect = QRectF(left - 3, top - 3, right - left + 6, bottom - top + 6)
        self._path = None

    def lines(self) -> list[QLineF]:
        """What the zoomed-out overview draws: the route's segments, or one straight line."""
        if self.route:
            return [QLineF(p, q) for p, q in zip(self.route, self.route[1:])]
        return [QLineF(self._a, self._b)]

    def path(self) -> QPainterPath:
        if self._path is None:
            if self.route:
                self._path = QPainterPath(self.route[0])
                for pt in self.route[1:]:
                    self._path.lineTo(pt)
            else:
                self._path = edge_path(self._a, self._b)
        return self._path

    def boundingRect(self) -> QRectF:
        return self._rect

    def shape(self) -> QPainterPath:
        s = QPainterPathStroker()
        s.setWidth(8)
        return s.createStroke(self.path())

    def paint(self, p: QPainter, option, widget=None) -> None:
        st = self.style
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        color = st.edge_selected if self.isSelected() else st.edge
        if lod < LOD_TEXT:  # zoomed far out: straight cosmetic lines are all the eye can see
            p.setPen(QPen(color, 0))
            p.drawLines(self.lines())
            return
        p.setRenderHint(QPainter.Antialiasing, True)
        p.setPen(QPen(color, 2.2 if self.isSelected() else 1.5))
        p.setBrush(Qt.NoBrush)
        p.drawPath(self.path())


class TerminalItem(QGraphicsItem):
    """A program input: a pill with its name and shape and one output port on its bottom edge.

    Its position is derived (above its first consumer), never stored: the model keeps node
    positions only, and an input belongs beside what reads it.
    """
    kind = "terminal"

    def __init__(self, program: Program, value_id: str, style: CanvasStyle):
        super().__init__()
        self.program, self.value_id, self.style = program, value_id, style
        self.setFlags(QGraphicsItem.ItemIsSelectable)
        self.setCacheMode(QGraphicsItem.DeviceCoordinateCache)
        self.setZValue(1)
        self.refresh()

    def refresh(self) -> None:
        v = self.program.values[self.value_id]
        fm = QFontMetricsF(self.style.font)
        self._name = fm.elidedText(v.name, Qt.ElideRight, TERMINAL_W * 0.45)
        self._shape = fm.elidedText(fmt_spec(v.shape, v.dtype), Qt.ElideLeft,
                                    TERMINAL_W - 3 * PAD - 4 - fm.horizontalAdvance(self._name))
        self.update()

    def tooltip_text(self) -> str:
        v = self.program.values.get(self.value_id)
        return f"program input {v.name}: {fmt_spec(v.shape, v.dtype)}" if v else ""

    def boundingRect(self) -> QRectF:
        return QRectF(-2, -2, TERMINAL_W + 4, TERMINAL_H + PORT_R + 4)

    def output_pos(self, index: int = 0) -> QPointF:
        return QPointF(TERMINAL_W / 2, TERMINAL_H)

    def port_at(self, local: QPointF):
        return ("out", 0) if (local - self.output_pos()).manhattanLength() <= 14 else None

    def paint(self, p: QPainter, option, widget=None) -> None:
        st = self.style
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        r = QRectF(0, 0, TERMINAL_W, TERMINAL_H)
        p.setRenderHint(QPainter.Antialiasing, lod >= LOD_TEXT)
        p.setPen(QPen(st.node_selected if self.isSelected() else st.accent, 1.4))
        p.setBrush(st.terminal)
        p.drawRoundedRect(r, TERMINAL_H / 2, TERMINAL_H / 2)
        if lod < LOD_TEXT:
            return
        p.setFont(st.font)
        p.setPen(st.text)
        p.drawText(r.adjusted(PAD + 4, 0, 0, 0), Qt.AlignLeft | Qt.AlignVCenter, self._name)
        p.setPen(st.text_muted)
        p.drawText(r.adjusted(0, 0, -PAD - 4, 0), Qt.AlignRight | Qt.AlignVCenter, self._shape)
        p.setPen(QPen(st.accent, 1.5))
        p.setBrush(st.accent)
        p.drawEllipse(self.output_pos(), PORT_R, PORT_R)


class GroupItem(QGraphicsItem):
    """Several nodes collapsed into one: edges into the group meet its top port, edges out of it its
    bottom port. Double-click expands it again. A collapsed module is titled with its path and class."""
    kind = "group"

    def __init__(self, name: str, members: list[str], program: Program, style: CanvasStyle):
        super().__init__()
        self.name, self.members, self.program, self.style = name, list(members), program, style
        self.setFlags(QGraphicsItem.ItemIsSelectable)
        self.setCacheMode(QGraphicsItem.DeviceCoordinateCache)
        self.setZValue(1)
        self._w, self._h = GROUP_SIZE
        self.refresh()

    def refresh(self) -> None:
        ops: dict[str, int] = {}
        for nid in self.members:
            n = self.program.nodes.get(nid)
            if n:
                ops[n.op] = ops.get(n.op, 0) + 1
        summary = ", ".join(f"{k}×{c}" if c > 1 else k for k, c in sorted(ops.items(), key=lambda t: -t[1]))
        fm = QFontMetricsF(self.style.font_small)
        self._summary = fm.elidedText(summary, Qt.ElideRight, self._w - 2 * PAD)
        self._tip = f"{self.name}: {len(self.members)} nodes collapsed ({summary}); double-click to expand"
        count = f"{len(self.members)} nodes"
        room = self._w - 3 * PAD - QFontMetricsF(self.style.font).horizontalAdvance(count)
        bold = QFontMetricsF(self.style.font_bold)
        # the module path says which one it is; its class name is dropped first ("layer3.10 · Bottleneck")
        path = self.name.split(" · ")[0]
        title = next((t for t in (f"▸ {self.name}", f"▸ {path}") if bold.horizontalAdvance(t) <= room), f"▸ {path}")
        self._title = bold.elidedText(title, Qt.ElideMiddle, room)
        self.update()

    def tooltip_text(self) -> str:
        return self._tip

    def far_titles(self) -> list[str]:
        """What a zoomed-out group shows, longest first: "layer3.12 · Bottleneck", "layer3.12", "12"
        (its box, titled around it, says the rest)."""
        path = self.name.split(" · ", 1)[0]
        parts = path.split(".")
        return [self.name, path] + [".".join(parts[-k:]) for k in (2, 1) if k < len(parts)]

    def boundingRect(self) -> QRectF:
        return QRectF(-2, -PORT_R - 2, self._w + 10, self._h + 2 * PORT_R + 10)

    def size(self):
        return self._w, self._h

    def input_pos(self, port: int = 0) -> QPointF:
        return QPointF(self._w / 2, 0.0)

    def output_pos(self, index: int = 0) -> QPointF:
        return QPointF(self._w / 2, self._h)

    def paint(self, p: QPainter, option, widget=None) -> None:
        st = self.style
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        r = QRectF(0, 0, self._w, self._h)
        p.setRenderHint(QPainter.Antialiasing, lod >= LOD_TEXT)
        # a stacked look: two offset outlines behind the body say "several nodes in here"
        p.setBrush(st.group_body)
        p.setPen(QPen(st.node_border, 1))
        for off in (6, 3):
            p.drawRoundedRect(r.translated(off, off), 5, 5)
        p.setPen(QPen(st.node_selected if self.isSelected() else st.accent, 2 if self.isSelected() else 1.4))
        p.drawRoundedRect(r, 5, 5)
        if lod < LOD_DETAIL:
            if lod >= LOD_TEXT:   # (below, the overview item draws the titles that fit)
                draw_far_title(p, r, self.far_titles(), lod, st, st.text)
            return
        p.setPen(st.text)
        p.setFont(st.font_bold)
        p.drawText(QRectF(PAD, 0, self._w - 2 * PAD, HEADER_H), Qt.AlignLeft | Qt.AlignVCenter, self._title)
        p.setFont(st.font)
        p.setPen(st.text_muted)
        p.drawText(QRectF(PAD, 0, self._w - 2 * PAD, HEADER_H), Qt.AlignRight | Qt.AlignVCenter,
                   f"{len(self.members)} nodes")
        p.setFont(st.font_small)
        p.drawText(QRectF(PAD, HEADER_H + ROW_H, self._w - 2 * PAD, ROW_H),
                   Qt.AlignLeft | Qt.AlignVCenter, self._summary)
        p.setPen(QPen(st.accent, 1.5))
        p.setBrush(st.accent)
        p.drawEllipse(self.input_pos(), PORT_R, PORT_R)
        p.drawEllipse(self.output_pos(), PORT_R, PORT_R)

