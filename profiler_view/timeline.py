"""The kernel sequence on a time axis, like a trace viewer: one row before fusion (each region's ops
unfused), one after (the fused kernels), laid end to end on one stream. The wheel zooms and a drag
pans the time axis; a bar is labelled only where its label fits at the current zoom; the panel's view
controls sort it slowest first or keep the N slowest."""
from __future__ import annotations

import pyqtgraph as pg

from .base import BEFORE, ClickableBars, ProfilePlot, fmt_ms, kind_color, kind_name, text_width

LABEL_PAD_PX = 6   # clear space a label keeps inside its bar


class Timeline(ProfilePlot):
    def __init__(self, data, parent=None):
        self.data = data
        self.slowest_first, self.top = False, None
        self.labels: list[tuple[pg.TextItem, float, float, float, list[str]]] = []   # item, x, width, y, texts
        self.end = 0.0
        super().__init__("Kernel timeline", parent)
        self.setLabel("bottom", "time (us)")
        self.plotItem.showGrid(x=True, y=False, alpha=0.15)
        self.plotItem.getAxis("left").setWidth(56)
        vb = self.plotItem.getViewBox()
        vb.setMouseEnabled(x=True, y=False)   # zoom and pan in time only
        vb.sigXRangeChanged.connect(lambda *_: self.fit_labels())
        vb.sigResized.connect(lambda *_: self.fit_labels())
        self.bars: ClickableBars | None = None

    def set_view(self, slowest_first: bool, top: int | None) -> None:
        self.slowest_first, self.top = slowest_first, top
        self.redraw()

    def redraw(self) -> None:
        if not hasattr(self, "labels"):
            return
        pi = self.plotItem
        pi.clear()
        self.labels = []
        order = self.data.order(self.slowest_first, self.top)
        regions, x0, y0, w, h, brushes, tips, kinds = [], [], [], [], [], [], [], {}
        for row, after in ((1, False), (0, True)):
            # sorted or cut to the slowest: laid end to end; in program order a kernel keeps its start
            for rid, start, ms, real in self.data.timeline(after, order, packed=self.slowest_first):
                k = self.data.kernels[rid]
                col = pg.mkColor(kind_color(k.kind) if after else pg.mkColor(BEFORE))
                if after:
                    kinds.setdefault(kind_name(k.kind), kind_color(k.kind))
                if not real:
                    col.setAlpha(90)
                regions.append(rid)
                x0.append(start * 1e3)
                y0.append(row - 0.35)
                w.append(ms * 1e3)
                h.append(0.7)
                brushes.append(pg.mkBrush(col))
                tips.append(f"{rid} {'after' if after else 'before'} fusion: {k.kernel or k.kind} "
                            f"{fmt_ms(ms)} from {fmt_ms(start)} ({'measured' if real else 'estimated'}), {k.status}")
        self.bars = None
        self.end = max((x + ww for x, ww in zip(x0, w)), default=0.0)
        if regions:
            self.bars = ClickableBars(regions, self.region_clicked.emit, tips, x0=x0, y0=y0, width=w, height=h,
                                      brushes=brushes, pens=[pg.mkPen(self.palette().base().color(), width=1)] * len(x0))
            pi.addItem(self.bars)
            for rid, x, y, ww in zip(regions, x0, y0, w):
                t = pg.TextItem(rid, color="#ffffff", anchor=(0.5, 0.5))
                t.setVisible(False)
                pi.addItem(t)
                # the longest text that fits is shown: the time too when zoomed in
                self.labels.append((t, x, ww, y + 0.35, [f"{rid} {fmt_ms(ww / 1e3)}", rid]))
        pi.getAxis("left").setTicks([[(0, "fused"), (1, "unfused")]])
        self.set_legend([(name, col, "bar") for name, col in kinds.items()]
                        + ([("unfused ops (torch)", BEFORE, "bar")] if regions else []))
        pi.setYRange(-0.6, 1.6, padding=0)
        self.reset_zoom()

    def reset_zoom(self) -> None:
        """The whole sequence in view."""
        vb = self.plotItem.getViewBox()
        end = self.end or 1.0
        vb.setLimits(xMin=-0.05 * end, xMax=1.05 * end, minXRange=end * 1e-4)
        self.plotItem.setXRange(0, end, padding=0.02)
        self.fit_labels()

    def visible_labels(self) -> list[pg.TextItem]:
        return [t for t, *_ in self.labels if t.isVisible()]

    def fit_labels(self) -> None:
        """Show each bar's longest label that fits inside the visible part of the bar at this zoom."""
        if not self.labels:
            return
        vb = self.plotItem.getViewBox()
        per_px = vb.viewPixelSize()[0]
        if per_px <= 0:
            return
        (lo, hi), _ = vb.viewRange()
        for t, x, ww, y, texts in self.labels:
            left, right = max(x, lo), min(x + ww, hi)
            room = (right - left) / per_px - LABEL_PAD_PX
            text = next((s for s in texts if text_width(t, s) <= room), None)
            if text is None:
                t.setVisible(False)
                continue
            if t.toPlainText() != text:
                t.setText(text)
            t.setPos((left + right) / 2, y)
            t.setVisible(True)
