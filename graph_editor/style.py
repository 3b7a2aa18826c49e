"""Canvas colours and metrics for the dark and light themes (widgets are styled by resources/theme/*.qss).

Category colours are the same hue in both themes so a user's eye learns them once; only the
lightness changes to keep contrast with the node body.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF

NODE_WIDTH = 190.0
HEADER_H = 24.0
ROW_H = 18.0
ATTR_H = 16.0
PAD = 6.0
PORT_R = 5.0
TERMINAL_W = 170.0
TERMINAL_H = 26.0
MAX_ATTR_LINES = 2
GROUP_SIZE = (240.0, HEADER_H + 2 * ROW_H + PAD)   # a collapsed group's item (the layout needs it)
READABLE_PX = 8    # no text is drawn smaller than this many screen pixels
TITLE_PX = 11      # zoomed out, item titles are drawn this many screen pixels high

CATEGORY_HUES = {
    "pointwise": 150, "reduction": 32, "normalization": 280, "matmul": 210, "convolution": 0,
    "pooling": 185, "layout": 50, "opaque": 0,
}


@dataclass
class CanvasStyle:
    name: str
    background: QColor
    grid: QColor
    grid_major: QColor
    node_body: QColor
    node_border: QColor
    node_selected: QColor
    text: QColor
    text_muted: QColor
    edge: QColor
    edge_selected: QColor
    error: QColor
    accent: QColor
    terminal: QColor
    group_body: QColor
    minimap_bg: QColor
    header_lightness: int
    header_saturation: int
    font: QFont = field(default_factory=QFont)
    font_bold: QFont = field(default_factory=QFont)
    font_small: QFont = field(default_factory=QFont)

    _metrics: dict = field(default_factory=dict)
    _elided: dict = field(default_factory=dict)

    def metrics(self, which: str) -> QFontMetricsF:
        fm = self._metrics.get(which)
        if fm is None:
            fm = self._metrics[which] = QFontMetricsF(getattr(self, which))
        return fm

    def elide(self, which: str, text: str, width: float, mode=Qt.ElideRight) -> str:
        """Elided text, memoised: a 5,000-node program repeats the same shapes and port names."""
        key = (which, text, int(width), mode)
        out = self._elided.get(key)
        if out is None:
            out = self._elided[key] = self.metrics(which).elidedText(text, mode, int(width))
        return out

    def screen_font(self, px: float, bold: bool = True) -> tuple[QFont, QFontMetricsF]:
        """A font `px` pixels high wherever it is painted: zoomed out, titles are drawn at a size
        someone can read rather than scaled down with the canvas."""
        key = ("screen", int(px), bold)
        f = self._metrics.get(key)
        if f is None:
            font = QFont(self.font_bold if bold else self.font)
            font.setPixelSize(max(1, int(px)))
            f = self._metrics[key] = (font, QFontMetricsF(font))
        return f

    def category_color(self, category: str) -> QColor:
        c = self._metrics.get(("color", category))
        if c is None:
            sat = 0 if category == "opaque" else self.header_saturation
            c = self._metrics[("color", category)] = QColor.fromHsl(CATEGORY_HUES.get(category, 0), sat,
                                                                     self.header_lightness)
        return c


def _fonts(style: CanvasStyle) -> CanvasStyle:
    base = QFont()
    base.setPointSizeF(9.0)
    bold = QFont(base)
    bold.setBold(True)
    bold.setPointSizeF(9.5)
    small = QFont(base)
    small.setPointSizeF(8.0)
    style.font, style.font_bold, style.font_small = base, bold, small
    return style


def dark() -> CanvasStyle:
    return _fonts(CanvasStyle(
        name="dark", background=QColor("#1e2127"), grid=QColor("#252931"), grid_major=QColor("#2c313a"),
        node_body=QColor("#2b2f37"), node_border=QColor("#3d434e"), node_selected=QColor("#f0b429"),
        text=QColor("#e6e9ef"), text_muted=QColor("#9aa3b2"), edge=QColor("#7c8594"),
        edge_selected=QColor("#f0b429"), error=QColor("#ef5350"), accent=QColor("#4fa3ff"),
        terminal=QColor("#33503f"), group_body=QColor("#30353f"), minimap_bg=QColor(20, 22, 27, 220),
        header_lightness=92, header_saturation=120,
    ))


def light() -> CanvasStyle:
    return _fonts(CanvasStyle(
        name="light", background=QColor("#f4f5f7"), grid=QColor("#e8eaee"), grid_major=QColor("#dcdfe5"),
        node_body=QColor("#ffffff"), node_border=QColor("#c3c8d1"), node_selected=QColor("#d98e04"),
        text=QColor("#1f2329"), text_muted=QColor("#5f6775"), edge=QColor("#8a93a3"),
        edge_selected=QColor("#d98e04"), error=QColor("#d32f2f"), accent=QColor("#1a73e8"),
        terminal=QColor("#dff1e6"), group_body=QColor("#eef0f4"), minimap_bg=QColor(255, 255, 255, 225),
        header_lightness=205, header_saturation=150,
    ))


def for_theme(name: str) -> CanvasStyle:
    return light() if name == "light" else dark()
