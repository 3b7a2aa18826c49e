"""Roofline: each measured kernel's achieved FLOP/s against its arithmetic intensity (FLOP per byte
moved), under the measured bandwidth and compute peaks (log axes). A kernel that does almost no
arithmetic (pointwise) sits at the left edge at the same fraction of the bandwidth roof it reached."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg

from .base import FLOOR, ProfilePlot, kind_color


class Roofline(ProfilePlot):
    def __init__(self, data, parent=None):
        self.data = data
        super().__init__("Roofline", parent)
        self.setLogMode(x=True, y=True)
        self.setLabel("bottom", "FLOP / byte")
        self.setLabel("left", "GFLOP/s")
        self.plotItem.showGrid(x=True, y=True, alpha=0.15)
        self.scatter: pg.ScatterPlotItem | None = None

    def redraw(self) -> None:
        if not hasattr(self, "data"):
            return
        pi = self.plotItem
        pi.clear()
        bw, peak = self.data.bandwidth_gbs, self.data.peak_tflops * 1e3   # GB/s, GFLOP/s
        ai = np.logspace(-3, 3, 80)
        pi.plot(ai, np.minimum(bw * ai, peak), pen=pg.mkPen(FLOOR, width=2))
        for text, x, y in ((f"{bw / 1e3:.1f} TB/s", 1e-2, bw * 1e-2), (f"{peak / 1e3:.0f} TFLOP/s", 1e3, peak)):
            t = pg.TextItem(text, color=FLOOR, anchor=(1 if "FLOP" in text else 0, 1))
            t.setPos(np.log10(x), np.log10(y))
            pi.addItem(t)
        pts = self.data.roofline_points()
        self.scatter = None
        if pts:
            spots = []
            for rid, x, y in pts:
                k = self.data.kernels[rid]
                tip = (f"{rid} {k.kernel or ''}: {k.achieved_gbs or 0:.0f} GB/s"
                       + (f", {k.achieved_tflops * 1e3:.1f} GFLOP/s" if k.achieved_tflops else "")
                       + f" ({100 * (k.achieved_gbs or 0) / bw:.1f}% of {bw:.0f} GB/s)")
                spots.append({"pos": (np.log10(x), np.log10(y)), "data": rid, "brush": kind_color(k.kind),
                              "size": 12, "pen": pg.mkPen(self.text_color()), "tip": tip})
            self.scatter = pg.ScatterPlotItem(hoverable=True, tip=lambda x, y, data: data)
            self.scatter.addPoints([{k: v for k, v in s.items() if k != "tip"} | {"data": s["data"]} for s in spots])
            self.tips = {s["data"]: s["tip"] for s in spots}
            self.scatter.opts["tip"] = lambda x, y, data: self.tips.get(data, data)
            self.scatter.sigClicked.connect(lambda _it, points, _ev: points and self.region_clicked.emit(points[0].data()))
            pi.addItem(self.scatter)
        pi.setXRange(-3, 3, padding=0.02)
        low = np.log10(bw * 1e-3) - 0.5
        if pts:   # tiny, launch-bound kernels sit far under the roof: keep them in view
            low = min(low, min(np.log10(y) for _, _, y in pts) - 0.5)
        pi.setYRange(low, np.log10(peak) + 0.9, padding=0)
        if not pts:
            t = pg.TextItem("Measured kernels appear here\n(needs a GPU run)", color=self.text_color(),
                            anchor=(0.5, 0.5))
            t.setPos(1.4, np.log10(bw * 1e-3) + 0.5)   # under the compute roof, clear of the line
            pi.addItem(t)
