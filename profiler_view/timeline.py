"""The kernel sequence on a time axis, like a trace viewer: one row before fusion (each region's ops
unfused), one after (the fused kernels), laid end to end on one stream."""
from __future__ import annotations

import pyqtgraph as pg

from .base import BEFORE, ClickableBars, ProfilePlot, fmt_ms, kind_color


class Timeline(ProfilePlot):
    def __init__(self, data, parent=None):
        self.data = data
        super().__init__("Kernel timeline", parent)
        self.setLabel("bottom", "time (us)")
        self.plotItem.showGrid(x=True, y=False, alpha=0.15)
        self.plotItem.getAxis("left").setWidth(56)
        self.bars: ClickableBars | None = None

    def redraw(self) -> None:
        if not hasattr(self, "data"):
            return
        pi = self.plotItem
        pi.clear()
        regions, x0, y0, w, h, brushes, tips = [], [], [], [], [], [], []
        for row, after in ((1, False), (0, True)):
            for rid, start, ms, real in self.data.timeline(after):
                k = self.data.kernels[rid]
                col = pg.mkColor(kind_color(k.kind) if after else pg.mkColor(BEFORE))
                if not real:
                    col.setAlpha(90)
                regions.append(rid)
                x0.append(start * 1e3)
                y0.append(row - 0.35)
                w.append(ms * 1e3)
                h.append(0.7)
                brushes.append(pg.mkBrush(col))
                tips.append(f"{rid} {'after' if after else 'before'} fusion: {k.kernel or k.kind} "
                            f"{fmt_ms(ms)} from {fmt_ms(start)} ({'measured' if real else 'estimated'})")
        self.bars = None
        if regions:
            self.bars = ClickableBars(regions, self.region_clicked.emit, tips, x0=x0, y0=y0, width=w, height=h,
                                      brushes=brushes, pens=[pg.mkPen(self.palette().base().color(), width=1)] * len(x0))
            pi.addItem(self.bars)
            for rid, x, y, ww in zip(regions, x0, y0, w):
                t = pg.TextItem(rid, color="#ffffff", anchor=(0.5, 0.5))
                t.setPos(x + ww / 2, y + 0.35)
                pi.addItem(t)
        pi.getAxis("left").setTicks([[(0, "fused"), (1, "unfused")]])
        pi.setYRange(-0.6, 1.6, padding=0)
        pi.enableAutoRange(axis="x")
