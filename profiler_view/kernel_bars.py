"""Per-kernel time bars: each region's ops unfused (grey) beside its fused kernel (kind colour), with
the memory floor as a gold marker. Measured times when the run had a GPU, else the planner's estimates
(drawn faint, and the title says so). The panel's view controls sort them slowest first or keep the
N slowest; region names on the axis are thinned to those that fit."""
from __future__ import annotations

import pyqtgraph as pg

from .base import BEFORE, FLOOR, ClickableBars, ProfilePlot, fmt_ms, kind_color

W = 0.38
OURS = "#9b6ad6"   # the legend's sample for "ours": each bar itself takes its region kind's colour


class KernelBars(ProfilePlot):
    def __init__(self, data, parent=None):
        self.data = data
        super().__init__("Kernel time, unfused / fused", parent)
        self.setLabel("left", "time (us)")
        self.slowest_first, self.top = False, None
        self.names: list[str] = []
        self.bars: ClickableBars | None = None
        vb = self.plotItem.getViewBox()
        vb.setMouseEnabled(x=True, y=False)
        vb.sigXRangeChanged.connect(lambda *_: self._fit_ticks())
        vb.sigResized.connect(lambda *_: self._fit_ticks())

    def set_view(self, slowest_first: bool, top: int | None) -> None:
        self.slowest_first, self.top = slowest_first, top
        self.redraw()

    def redraw(self) -> None:
        if not hasattr(self, "data"):
            return
        pi = self.plotItem
        pi.clear()
        ks = [self.data.kernels[r] for r in self.data.order(getattr(self, "slowest_first", False),
                                                             getattr(self, "top", None))]
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
                tips.append(f"{k.region} ({k.kind}, {k.status}): {what} {fmt_ms(ms)} "
                            f"{'measured' if real else 'estimated'}"
                            + (f"\nmemory floor {fmt_ms(k.floor_ms)} (bytes / measured bandwidth)" if k.floor_ms else "")
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
            pi.plot(floor_x, floor_y, pen=None, symbol="t1", symbolSize=14 if len(ks) <= 12 else 8, symbolBrush=FLOOR,
                    symbolPen=pg.mkPen(FLOOR), name="floor")
        self.names = [k.region for k in ks]
        entries = [("unfused ops (torch)", BEFORE, "bar"), ("fused kernel (ours)", OURS, "bar")]
        if floor_x:
            entries.append(("memory floor", FLOOR, "floor"))   # a bar's tooltip says how it is computed
        self.set_legend(entries if ks else [])
        self.set_title(self.title + ("" if measured or not ks else " (estimates)"))
        self.reset_zoom()
        pi.enableAutoRange(axis="y")

    def reset_zoom(self) -> None:
        n = max(len(self.names), 1)
        vb = self.plotItem.getViewBox()
        vb.setLimits(xMin=-1.0, xMax=n, minXRange=2.0)
        self.plotItem.setXRange(-0.8, n - 0.2, padding=0)
        self._fit_ticks()

    def _fit_ticks(self) -> None:
        """Every k-th region name on the axis, k the smallest that keeps the names apart at this zoom."""
        ax = self.plotItem.getAxis("bottom")
        if not self.names:
            ax.setTicks([[]])
            return
        per_px = self.plotItem.getViewBox().viewPixelSize()[0]
        widest = max(self.fontMetrics().horizontalAdvance(n) for n in self.names) + 8
        step = 1
        if per_px > 0:
            while step < len(self.names) and step / per_px < widest:
                step += 1
        ax.setTicks([[(i, n) for i, n in enumerate(self.names) if i % step == 0]])

    def bar_center(self, region: str):
        """Scene position of the fused bar of `region` (tests click it)."""
        if self.bars is None:
            return None
        for i in reversed(range(len(self.bars.regions))):
            if self.bars.regions[i] == region:
                return self.bars.mapToScene(self.bars.boxes[i].center())
        return None
