"""Shared look and click handling of the profile plots (pyqtgraph PlotWidgets)."""
from __future__ import annotations

from html import escape

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPalette
from PySide6.QtWidgets import QGraphicsTextItem, QSizePolicy

from agent_core.regions import KIND_HUES

BEFORE = "#8a8f98"
FLOOR = "#c8961e"   # gold that reads on both the dark and the light background


def kind_color(kind: str) -> QColor:
    return QColor(KIND_HUES.get(kind, KIND_HUES["single"]))


def kind_name(kind: str) -> str:
    return (kind or "unknown").replace("_", " ")


TITLE_PT = 9
LEGEND_2_LINES_PX, LEGEND_3_LINES_PX = 130, 200   # plot heights from which the legend may take more lines
TITLE_ROW_PX = 20
GLYPHS = {"bar": "\u25a0", "floor": "\u25b2", "point": "\u25cf", "line": "\u2501", "cross": "\u2715"}


class FlowLegend(pg.GraphicsWidget):
    """A legend under the plot's x axis: coloured glyphs and names flowing over as many lines as the
    plot's width needs, so it never covers data and a narrow plot keeps its height for the data."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.entries: list[tuple[str, str, str]] = []   # (name, colour, glyph)
        self.max_lines = 3
        self.fg = QColor("#888")
        self.text = QGraphicsTextItem(self)
        self.text.setDefaultTextColor(self.fg)
        f = self.text.font()
        f.setPointSizeF(8)
        self.text.setFont(f)
        self.text.document().setDocumentMargin(1)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Fixed)   # as wide as the plot, never wider
        self.setMinimumWidth(0)
        self._fit()

    def set_entries(self, entries: list[tuple[str, str, str]]) -> None:
        self.entries = list(entries)
        self._render()

    def set_color(self, fg: QColor) -> None:
        self.fg = QColor(fg)
        self._render()

    def _render(self) -> None:
        """Entries packed greedily into lines as wide as the plot, at most max_lines of them; a name
        wider than a line is elided, and what does not fit is counted ("+2 more") and in the tooltip."""
        fm = QFontMetricsF(self.text.font())
        width = max(self.size().width() - 4, 40.0)
        gap = fm.horizontalAdvance("   ")
        lines: list[list[tuple[str, float]]] = [[]]   # (html, width) per entry
        used, shown, elided = 0.0, 0, False
        for n, c, g in self.entries:
            glyph = f"{GLYPHS.get(g, g)} "
            name = fm.elidedText(n, Qt.ElideRight, width - fm.horizontalAdvance(glyph))
            elided |= name != n
            w = fm.horizontalAdvance(glyph + name)
            if lines[-1] and used + gap + w > width:
                if len(lines) == self.max_lines:
                    break
                lines.append([])
                used = 0.0
            html = f'<span style="color:{QColor(c).name()}">{GLYPHS.get(g, g)}</span>&nbsp;' + escape(name).replace(" ", "&nbsp;")
            lines[-1].append((html, w))
            used += (gap if used else 0.0) + w
            shown += 1
        if shown < len(self.entries):   # room on the last line for the count of the rest
            while True:
                more = f"+{len(self.entries) - shown} more"
                used = sum(w for _h, w in lines[-1]) + gap * len(lines[-1])
                if not lines[-1] or used + fm.horizontalAdvance(more) <= width:
                    break
                lines[-1].pop()
                shown -= 1
            lines[-1].append((more.replace(" ", "&nbsp;"), 0.0))
        self.setToolTip("\n".join(n for n, _c, _g in self.entries) if shown < len(self.entries) or elided else "")
        self.text.setDefaultTextColor(self.fg)
        self.text.setHtml("<br>".join("&nbsp;&nbsp; ".join(h for h, _w in line) for line in lines))
        self._fit()

    def set_max_lines(self, n: int) -> None:
        if n != self.max_lines:
            self.max_lines = n
            self._render()

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        if abs(ev.newSize().width() - ev.oldSize().width()) > 0.5:
            self._render()

    def _fit(self) -> None:
        width = self.size().width()
        if width > 20:
            self.text.setTextWidth(width)
        h = self.text.document().size().height() if self.entries else 0.0
        if abs(self.minimumHeight() - h) > 0.5 or abs(self.maximumHeight() - h) > 0.5:
            self.setMinimumHeight(h)
            self.setMaximumHeight(h)
            self.updateGeometry()


def text_width(item: pg.TextItem, text: str) -> float:
    """The width `item` takes on screen showing `text`, its margins included."""
    margin = item.textItem.document().documentMargin()
    return QFontMetricsF(item.textItem.font()).horizontalAdvance(text) + 2 * margin


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
        self.full_title = title
        self.plotItem.setTitle(title, size=f"{TITLE_PT}pt")
        self.plotItem.layout.setRowFixedHeight(0, TITLE_ROW_PX)   # pyqtgraph's 30 px row was a sixth of a small plot
        self.plotItem.showGrid(x=False, y=True, alpha=0.15)
        self.plotItem.layout.setContentsMargins(6, 2, 6, 5)   # pyqtgraph sets axis labels 4 px outside their axes
        # under the x axis, so it never hides data; its columns follow the plot's width
        self.legend = FlowLegend()
        self.plotItem.layout.addItem(self.legend, 4, 1)
        self.pinned: dict[pg.TextItem, tuple[float, float]] = {}   # text -> wanted view position
        vb = self.plotItem.getViewBox()
        vb.sigResized.connect(self._keep_pinned_inside)
        vb.sigRangeChanged.connect(self._keep_pinned_inside)
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
        self.legend.set_color(fg)
        self.plotItem.titleLabel.text = None   # set_title redraws in the new colour
        self.set_title(self.full_title)
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

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        if "full_title" in self.__dict__:   # pyqtgraph resizes while it builds the widget
            self.set_title(self.full_title)
            # a short plot keeps its height for the data: fewer legend lines (the rest in its tooltip)
            h = self.height()
            self.legend.set_max_lines(1 if h < LEGEND_2_LINES_PX else 2 if h < LEGEND_3_LINES_PX else 3)

    # title -------------------------------------------------------------------------------------
    def set_title(self, text: str) -> None:
        """Show `text` over the plot, elided to the plot's width (its full text in the tooltip): a
        title wider than the plot had widened pyqtgraph's layout past the widget, clipping its right side."""
        self.full_title = text
        pi = self.plotItem
        left = pi.getAxis("left")
        room = self.width() - (left.width() if left.isVisible() else 0) - 20
        font = QFont(self.font())
        font.setPointSizeF(TITLE_PT)
        shown = QFontMetricsF(font).elidedText(text, Qt.ElideRight, max(room, 30))
        if shown != pi.titleLabel.text:
            pi.setTitle(shown, size=f"{TITLE_PT}pt", color=self.text_color().name())
            pi.layout.setRowFixedHeight(0, TITLE_ROW_PX)
        pi.titleLabel.setToolTip(text if shown != text else "")

    def title_text(self) -> str:
        """The title as shown (elided where the plot is narrow)."""
        return self.plotItem.titleLabel.text

    # legend ------------------------------------------------------------------------------------
    def set_legend(self, entries: list[tuple[str, str, str]]) -> None:
        """(name, colour, glyph) entries shown under the plot; glyph is a GLYPHS key."""
        if entries != self.legend.entries:
            self.legend.set_entries(entries)

    def legend_labels(self) -> list[str]:
        return [n for n, _c, _g in self.legend.entries]

    # texts kept inside the view box ------------------------------------------------------------
    def pin(self, item: pg.TextItem, x: float, y: float) -> pg.TextItem:
        """Add `item` at view position (x, y), moved as little as needed to lie inside the view box
        at every size and range (a ceiling label at the right edge was clipped)."""
        self.pinned[item] = (x, y)
        self.plotItem.addItem(item)
        self._place(item)
        return item

    def _keep_pinned_inside(self, *_args) -> None:
        for item in list(self.pinned):
            if item.scene() is None:   # cleared with the plot
                del self.pinned[item]
            else:
                self._place(item)

    def _place(self, item: pg.TextItem) -> None:
        vb = self.plotItem.getViewBox()
        x, y = self.pinned[item]
        item.setPos(x, y)
        box, r = vb.sceneBoundingRect(), item.sceneBoundingRect()
        if box.width() <= r.width() or box.height() <= r.height():
            return   # the plot is smaller than the text: nothing to fit it into
        dx = max(0.0, box.left() - r.left()) - max(0.0, r.right() - box.right())
        dy = max(0.0, box.top() - r.top()) - max(0.0, r.bottom() - box.bottom())
        if dx or dy:
            item.setPos(vb.mapSceneToView(vb.mapViewToScene(QPointF(x, y)) + QPointF(dx, dy)))

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
