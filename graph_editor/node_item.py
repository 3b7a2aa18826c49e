"""The canvas item for one program node: header with the op, typed ports, key attributes, output shapes.

The item reads the model on `refresh()` and caches the elided strings it paints, so painting never
touches the Program. Ports are geometry inside the item (not child items): 5,000 nodes stay 5,000
items, and the scene asks `port_at()` when a drag starts.
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFontMetricsF, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QGraphicsItem, QStyleOptionGraphicsItem

from agent_core.errors import StitchError
from agent_core.ir import Node, Program, Role
from agent_core.ops import get_op

from .style import ATTR_H, HEADER_H, MAX_ATTR_LINES, NODE_WIDTH, PAD, PORT_R, READABLE_PX, ROW_H, TITLE_PX, CanvasStyle

SHORT_DTYPE = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64",
               "int32": "i32", "int8": "i8", "uint8": "u8", "bool": "bool"}
LOD_TEXT = 0.3     # below this zoom the overview item draws every item (scene.set_low_detail)
LOD_DETAIL = 0.66  # below this zoom 9 pt text is under 8 px: an item is its op-kind colour and a title


def fmt_spec(shape, dtype) -> str:
    return f"{SHORT_DTYPE.get(dtype, dtype)}[{', '.join(map(str, shape))}]"


def fmt_attr(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(fmt_attr(x) for x in v) + "]"
    if isinstance(v, str):
        return v
    return str(v)


_OP_INFO: dict[str, tuple] = {}
_NO_DEFAULT = object()


def _op_info(op: str):
    """(declared port count, variadic, attribute defaults) per op, looked up once per op name."""
    info = _OP_INFO.get(op)
    if info is None:
        try:
            opdef = get_op(op)
            info = (len(opdef.inputs), opdef.variadic, {a.name: a.default for a in opdef.attrs})
        except StitchError:
            info = (0, False, {})
        _OP_INFO[op] = info
    return info


def input_port_count(node: Node) -> int:
    """Ports drawn on the left: every declared port, plus one free port on a variadic op."""
    declared, variadic, _ = _op_info(node.op)
    return max(declared, len(node.inputs) + (1 if variadic else 0))


def attr_text(node: Node) -> str:
    """Attributes a user set (non-default ones), the ones worth reading on the canvas."""
    defs = _op_info(node.op)[2]
    return ", ".join(f"{k}={fmt_attr(v)}" for k, v in node.attrs.items() if defs.get(k, _NO_DEFAULT) != v)


def node_size(node: Node) -> tuple[float, float]:
    """Item size from the model alone (the layout needs it before any item exists)."""
    rows = max(input_port_count(node), len(node.outputs), 1)
    text = attr_text(node)
    lines = 0 if not text else min(MAX_ATTR_LINES, 1 + len(text) // 34)
    return NODE_WIDTH, HEADER_H + rows * ROW_H + lines * ATTR_H + PAD


_NODE_FLAGS = QGraphicsItem.ItemIsMovable | QGraphicsItem.ItemIsSelectable
_TEXT_ON_DARK, _TEXT_ON_LIGHT = QColor("#f3f5f8"), QColor("#1f2329")


class NodeItem(QGraphicsItem):
    kind = "node"

    def __init__(self, program: Program, node_id: str, style: CanvasStyle):
        super().__init__()
        self.program = program
        self.node_id = node_id
        self.style = style
        self.setFlags(_NODE_FLAGS)
        self.setCacheMode(QGraphicsItem.DeviceCoordinateCache)
        self.setZValue(1)
        self._w = self._h = 0.0
        self._labels_ready = False
        self.refresh()

    # model -> item -------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the node. Only the size and colours are computed now; the texts wait for the
        first detailed paint (a 5,000-node program opens zoomed out and never needs most of them)."""
        node = self.program.nodes[self.node_id]
        size = node_size(node)
        if size != (self._w, self._h):
            if self.scene() is not None:  # a new item is not indexed yet: nothing to announce
                self.prepareGeometryChange()
            self._w, self._h = size
            m = PORT_R + 2
            self._bounds = QRectF(-m, -m, self._w + 2 * m, self._h + 2 * m)
        try:
            self._category = node.opdef.category
        except Exception:
            self._category = "opaque"
        self._header_color = self.style.category_color(self._category)
        self._header_text = _TEXT_ON_DARK if self._header_color.lightness() < 128 else _TEXT_ON_LIGHT
        self._n_in, self._n_out = input_port_count(node), len(node.outputs)
        self._error = node.error
        self._labels_ready = False
        if self.scene() is not None:
            self.update()

    def tooltip_text(self) -> str:
        node = self.program.nodes.get(self.node_id)
        if node is None:
            return ""
        return node.error or f"{node.name} ({node.op})"

    def far_titles(self) -> list[str]:
        """What a zoomed-out node shows, longest first: its op."""
        return [self.program.nodes[self.node_id].op]

    def labels(self):
        """(title, subtitle, input labels, output labels, attribute lines), elided to fit."""
        if not self._labels_ready:
            self._make_labels()
        return self._title, self._subtitle, self._in_labels, self._out_labels, self._attr_lines

    def _make_labels(self) -> None:
        node = self.program.nodes[self.node_id]
        st = self.style
        try:
            opdef = node.opdef
        except Exception:
            opdef = None
        badge = 18 if node.error else 0
        title = st.elide("font_bold", node.op, self._w - 2 * PAD - badge)
        self._title = title
        rest = self._w - 3 * PAD - st.metrics("font_bold").horizontalAdvance(title) - badge
        self._subtitle = st.elide("font_small", node.name, rest, Qt.ElideLeft) if rest > 24 and node.name != node.op else ""
        half = self._w / 2 - PAD - 2
        self._in_labels = []
        for i in range(self._n_in):
            vid = node.inputs[i] if i < len(node.inputs) else None
            name = opdef.port_name(i) if opdef else f"in{i}"
            v = self.program.values.get(vid) if vid else None
            kind = "free" if v is None else ("param" if v.role in (Role.PARAMETER, Role.CONSTANT) else "wire")
            text = name if kind != "param" else f"{name} {fmt_spec(v.shape, v.dtype)}"
            width = half if i < self._n_out else self._w - 2 * PAD
            self._in_labels.append((st.elide("font", text, width), kind))
        self._out_labels = []
        fm = st.metrics("font")
        for k, vid in enumerate(node.outputs):
            v = self.program.values[vid]
            # the output's shape gets whatever the input label beside it leaves free
            used = fm.horizontalAdvance(self._in_labels[k][0]) + 12 if k < len(self._in_labels) else 0
            room = self._w - 2 * PAD - 4 - used
            self._out_labels.append((st.elide("font", fmt_spec(v.shape, v.dtype), max(half, room), Qt.ElideLeft),
                                     vid in self.program.outputs))
        text = attr_text(node)
        lines = int((self._h - HEADER_H - PAD - max(self._n_in, self._n_out, 1) * ROW_H) // ATTR_H)
        self._attr_lines = _wrap(text, st.metrics("font_small"), self._w - 2 * PAD, lines)
        self._labels_ready = True

    # geometry ------------------------------------------------------------------------------
    def boundingRect(self) -> QRectF:
        return self._bounds

    def shape(self) -> QPainterPath:
        p = QPainterPath()
        p.addRect(QRectF(0, -PORT_R, self._w, self._h + 2 * PORT_R))
        return p

    def size(self) -> tuple[float, float]:
        return self._w, self._h

    # the layout runs top to bottom: inputs arrive on the top edge, outputs leave from the bottom
    def input_pos(self, port: int) -> QPointF:
        return QPointF(self._w * (port + 1) / (self._n_in + 1), 0.0)

    def output_pos(self, index: int) -> QPointF:
        return QPointF(self._w * (index + 1) / (self._n_out + 1), self._h)

    def port_at(self, local: QPointF) -> tuple[str, int] | None:
        """('in', port) or ('out', index) when `local` is on a port (with a forgiving margin)."""
        grab = PORT_R + 5
        for i in range(self._n_in):
            if (local - self.input_pos(i)).manhattanLength() <= grab * 1.4:
                return "in", i
        for k in range(self._n_out):
            if (local - self.output_pos(k)).manhattanLength() <= grab * 1.4:
                return "out", k
        return None

    # painting ------------------------------------------------------------------------------
    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        st = self.style
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        body = QRectF(0, 0, self._w, self._h)
        selected = self.isSelected()
        border = QPen(st.node_selected if selected else (st.error if self._error else st.node_border),
                      2.0 if selected else 1.0)
        if lod < LOD_DETAIL:
            p.setPen(Qt.NoPen if not selected else border)
            p.setBrush(self._header_color)
            p.drawRect(body)
            if lod >= LOD_TEXT:   # (below, the overview item draws the titles that fit)
                draw_far_title(p, body, self.far_titles(), lod, st, self._header_text)
            return
        self.labels()
        p.setRenderHint(QPainter.Antialiasing, True)
        p.setPen(border)
        p.setBrush(st.node_body)
        p.drawRoundedRect(body, 5, 5)
        header = QPainterPath()
        header.addRoundedRect(QRectF(0.5, 0.5, self._w - 1, HEADER_H), 4.5, 4.5)
        square = QPainterPath()
        square.addRect(QRectF(0.5, HEADER_H / 2, self._w - 1, HEADER_H / 2))
        p.fillPath(header.united(square), self._header_color)
        p.setPen(self._header_text)
        p.setFont(st.font_bold)
        hdr = QRectF(PAD, 0, self._w - 2 * PAD, HEADER_H)
        p.drawText(hdr, Qt.AlignLeft | Qt.AlignVCenter, self._title)
        if self._subtitle:
            p.setFont(st.font_small)
            c = QColor(self._header_text)
            c.setAlpha(190)
            p.setPen(c)
            p.drawText(hdr.adjusted(0, 0, -(18 if self._error else 0), 0), Qt.AlignRight | Qt.AlignVCenter,
                       self._subtitle)
        if self._error:
            p.setPen(Qt.NoPen)
            p.setBrush(st.error)
            c = QPointF(self._w - PAD - 6, HEADER_H / 2)
            p.drawEllipse(c, 7, 7)
            p.setPen(QColor("white"))
            p.setFont(st.font_bold)
            p.drawText(QRectF(c.x() - 7, c.y() - 7, 14, 14), Qt.AlignCenter, "!")
        self._paint_rows(p)

    def _paint_rows(self, p: QPainter) -> None:
        """One row per input (its name, a parameter's shape) and the output shapes on the right; the
        ports themselves sit on the top and bottom edges, where the edges meet them."""
        st = self.style
        p.setFont(st.font)
        for i, (label, kind) in enumerate(self._in_labels):
            y = HEADER_H + i * ROW_H
            p.setPen(st.text_muted if kind != "wire" else st.text)
            p.drawText(QRectF(PAD, y, self._w, ROW_H), Qt.AlignLeft | Qt.AlignVCenter, label)
            c = self.input_pos(i)
            if kind == "param":
                p.setPen(QPen(st.text_muted, 1.2))
                p.setBrush(st.node_body)
                p.drawRect(QRectF(c.x() - 3.5, c.y() - 3.5, 7, 7))
            else:
                p.setPen(QPen(st.edge if kind == "free" else st.accent, 1.5))
                p.setBrush(st.node_body if kind == "free" else st.accent)
                p.drawEllipse(c, PORT_R, PORT_R)
        for k, (label, is_out) in enumerate(self._out_labels):
            y = HEADER_H + k * ROW_H
            p.setPen(st.text)
            p.drawText(QRectF(0, y, self._w - PAD, ROW_H), Qt.AlignRight | Qt.AlignVCenter, label)
            c = self.output_pos(k)
            p.setPen(QPen(st.accent, 1.5))
            p.setBrush(st.accent)
            if is_out:  # a program output: a diamond, the mark users look for at the end of a graph
                d = PORT_R + 1.5
                p.setBrush(st.node_selected)
                p.setPen(QPen(st.node_selected, 1.0))
                p.drawPolygon([QPointF(c.x(), c.y() - d), QPointF(c.x() + d, c.y()),
                               QPointF(c.x(), c.y() + d), QPointF(c.x() - d, c.y())])
            else:
                p.drawEllipse(c, PORT_R, PORT_R)
        if self._attr_lines:
            p.setFont(st.font_small)
            p.setPen(st.text_muted)
            y0 = HEADER_H + max(len(self._in_labels), len(self._out_labels), 1) * ROW_H
            for j, line in enumerate(self._attr_lines):
                p.drawText(QRectF(PAD, y0 + j * ATTR_H, self._w - 2 * PAD, ATTR_H),
                           Qt.AlignLeft | Qt.AlignVCenter, line)


def far_title(rect: QRectF, candidates, lod: float, style: CanvasStyle) -> tuple[str, int] | None:
    """Zoomed out: (the first of `candidates`, longest first, that fits `rect`, its size in screen
    pixels): TITLE_PX, smaller where rect is low or narrow, never under READABLE_PX. `lod` is the
    painter's scale (screen pixels per unit of rect). None when none fits. Memoised per screen size:
    every zoom step repaints each item, and most share a size and a title."""
    key = ("far", tuple(candidates), int(rect.width() * lod), int(rect.height() * lod), round(lod, 3))
    if key not in style._elided:
        style._elided[key] = _far_title(rect, candidates, lod, style)
    return style._elided[key]


def _far_title(rect: QRectF, candidates, lod: float, style: CanvasStyle) -> tuple[str, int] | None:
    top = int(min(TITLE_PX, rect.height() * lod - 4))
    room = rect.width() - 8 / lod     # 4 screen pixels each side
    for text in candidates:
        for px in range(top, READABLE_PX - 1, -1):
            if text and style.screen_font(px / lod)[1].horizontalAdvance(text) <= room:
                return text, px
    return None


def draw_far_title(p: QPainter, rect: QRectF, candidates, lod: float, style: CanvasStyle, color) -> bool:
    """far_title's choice drawn centred in rect; False when none fits."""
    fit = far_title(rect, candidates, lod, style)
    if fit is None:
        return False
    p.setFont(style.screen_font(fit[1] / lod)[0])
    p.setPen(color)
    p.drawText(rect, Qt.AlignCenter, fit[0])
    return True


def _wrap(text: str, fm: QFontMetricsF, width: float, max_lines: int) -> list[str]:
    """Break 'a=1, b=2, ...' at commas into at most max_lines lines, eliding the last."""
    if not text or max_lines <= 0:
        return []
    lines, cur = [], ""
    for part in text.split(", "):
        trial = part if not cur else f"{cur}, {part}"
        if fm.horizontalAdvance(trial) <= width or not cur:
            cur = trial
        else:
            lines.append(cur)
            cur = part
    lines.append(cur)
    if len(lines) > max_lines:
        lines = lines[:max_lines - 1] + [", ".join(lines[max_lines - 1:])]
    return [fm.elidedText(line, Qt.ElideRight, width) for line in lines]

