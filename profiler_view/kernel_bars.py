"""Per-kernel time bars: each region's ops unfused (grey) beside its fused kernel (kind colour), with
the roofline floor as a gold tick. Measured times when the run had a GPU, else the planner's estimates
(drawn hollow, and the title says so)."""
from __future__ import annotations

import pyqtgraph as pg

from .base import BEFORE, FLOOR, ClickableBars, ProfilePlot, fmt_ms, kind_color

W = 0.38


class KernelBars(ProfilePlot):
    def __init__(self, data, parent=None):
        self.data = data
        super().__init__("Kernel time, before / after fusion", parent)
        self.setLabel("left", "time (us)")
        self.bars: ClickableBars | None = None

    def redraw(self) -> None:
        if not hasattr(self, "data"):
            return
        pi = self.plotItem
        pi.clear()
        ks = list(self.data.kernels.values())
        regions, x0, y0, w, h, brushes, pens, tips = [], [], [], [], [], [], [], []
        measured = any(k.measured for k in ks)
        floor_x, floor_y = [], []
        for i, k in enumerate(ks):
            col = kind_color(k.kind)
            for j, (ms, brush) in enumerate(((k.before_ms, pg.mkColor(BEFORE)), (k.after_ms, col))):
                if ms is None:
                    continue
                real = (k.unfused_ms if j == 0 else k.ms) is not None
                regions.append(k.region)
                x0.append(i - W + j * W)
                y0.append(0.0)
                w.append(W * 0.95)
                h.append(ms * 1e3)
                fill = pg.mkColor(brush)
                if not real:
                    fill.setAlpha(70)
                brushes.append(pg.mkBrush(fill))
                pens.append(pg.mkPen(brush if isinstance(brush, str) else col, width=1))
                what = "unfused ops" if j == 0 else (k.kernel or "fused kernel")
                tips.append(f"{k.region} ({k.kind}): {what} {fmt_ms(ms)} "
                            f"{'measured' if real else 'estimated'}"
                            + (f"\nfloor {fmt_ms(k.floor_ms)}" if k.floor_ms else "")
                            + (f", {k.achieved_gbs:.0f} GB/s" if k.achieved_gbs else ""))
            if k.floor_ms:
                floor_x.append(i + W * 0.475)   # on the fused bar
                floor_y.append(k.floor_ms * 1e3)
        self.bars = None
        if regions:
            self.bars = ClickableBars(regions, self.region_clicked.emit, tips, x0=x0, y0=y0, width=w, height=h,
                                      brushes=brushes, pens=pens)
            pi.addItem(self.bars)
        if floor_x:
            pi.plot(floor_x, floor_y, pen=None, symbol="t1", symbolSize=14, symbolBrush=FLOOR,
                    symbolPen=pg.mkPen(FLOOR), name="floor")
        ax = pi.getAxis("bottom")
        ax.setTicks([[(i, k.region) for i, k in enumerate(ks)]])
        self.plotItem.setTitle(self.title + ("" if measured or not ks else " (estimates)"), size="9pt",
                               color=self.text_color().name())
        if ks:
            pi.setXRange(-0.8, len(ks) - 0.2, padding=0)
        pi.enableAutoRange(axis="y")

    def bar_center(self, region: str):
        """Scene position of the fused bar of `region` (tests click it)."""
        if self.bars is None:
            return None
        for i in reversed(range(len(self.bars.regions))):
            if self.bars.regions[i] == region:
                return self.bars.mapToScene(self.bars.boxes[i].center())
        return None
