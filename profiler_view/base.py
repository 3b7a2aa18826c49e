"""Shared look and click handling of the profile plots (pyqtgraph PlotWidgets)."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QRectF, QTimer, Signal
from PySide6.QtGui import QColor, QPalette

# kernel colours by region kind: the same hues the canvas uses for its region hulls
KIND_COLORS = {"pointwise": "#4f9dde", "reduction": "#d9822b", "matmul_epilogue": "#9b6ad6",
               "conv_epilogue": "#c75d9b", "sibling": "#3fb28f", "single": "#8a8f98", "opaque": "#6b6f76"}
BEFORE = "#8a8f98"
FLOOR = "#c8961e"   # gold that reads on both the dark and the light background


def kind_color(kind: str) -> QColor:
    return QColor(KIND_COLORS.get(kind, "#8a8f98"))


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.2f} ms"


class ProfilePlot(pg.PlotWidget):
    """A PlotWidget that follows the application palette (light or dark) and reports clicks on a
    kernel as its region id."""
    region_clicked = Signal(str)

    def __init__(self, title: str, parent=None):
        super().__init__(parent=parent)
        self.title = title
        self.setMenuEnabled(False)
        self.setMinimumSize(140, 120)
        self.plotItem.setTitle(title, size="9pt")
        self.plotItem.showGrid(x=False, y=True, alpha=0.15)
        self._restyle_pending = False
        self.restyle()

    def restyle(self) -> None:
        if getattr(self, "plotItem", None) is None:   # a palette event while pyqtgraph builds the widget
            return
        pal = self.palette()
        bg, fg = pal.color(QPalette.Base), pal.color(QPalette.Text)
        self.setBackground(bg)
        self.fg = fg
        for name in ("left", "bottom"):
            ax = self.plotItem.getAxis(name)
            ax.setPen(pg.mkPen(fg))
            ax.setTextPen(pg.mkPen(fg))
        self.plotItem.setTitle(self.title, size="9pt", color=fg.name())
        self.redraw()

    def changeEvent(self, ev):
        # a theme switch sends many palette events: restyle once, after the last
        if ev.type() == QEvent.PaletteChange and not getattr(self, "_restyle_pending", True):
            self._restyle_pending = True
            QTimer.singleShot(0, self, self._restyle_later)   # dropped if the plot is gone
        super().changeEvent(ev)

    def _restyle_later(self) -> None:
        self._restyle_pending = False
        self.restyle()

    def redraw(self) -> None:   # subclasses draw their data
        pass

    def empty_hint(self, text: str) -> None:
        """Say in the plot why it is empty (e.g. nothing is measured without a GPU)."""
        t = pg.TextItem(text, color=self.text_color(), anchor=(0.5, 0.5))
        vb = self.plotItem.getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        t.setPos((x0 + x1) / 2, (y0 + y1) / 2)
        self.plotItem.addItem(t)

    def text_color(self) -> QColor:
        return getattr(self, "fg", QColor("#888"))


class ClickableBars(pg.BarGraphItem):
    """Bars (given by x0, y0, width, height lists) that say which one was clicked, and show a tooltip
    per bar (pyqtgraph's BarGraphItem does neither)."""

    def __init__(self, regions: list[str], on_click, tips: list[str] | None = None, **opts):
        super().__init__(**opts)
        self.regions = list(regions)
        self.on_click = on_click
        self.tips = tips or []
        self.setAcceptHoverEvents(True)
        self.boxes = [QRectF(x, y, w, h).normalized() for x, y, w, h in
                      zip(opts["x0"], opts["y0"], opts["width"], opts["height"])]

    def index_at(self, pos) -> int | None:
        for i, r in enumerate(self.boxes):
            if r.contains(pos):
                return i
        return None

    def mouseClickEvent(self, ev):
        i = self.index_at(ev.pos())
        if i is None:
            ev.ignore()
            return
        ev.accept()
        self.on_click(self.regions[i])

    def hoverEvent(self, ev):
        if ev.isExit():
            self.setToolTip("")
            return
        i = self.index_at(ev.pos())
        self.setToolTip(self.tips[i] if i is not None and i < len(self.tips) else "")
