"""Roofline: each measured kernel's achieved FLOP/s against its arithmetic intensity (FLOP per byte
moved), under the measured bandwidth and compute peaks (log axes). A kernel that does almost no
arithmetic (pointwise) sits at the left edge at the same fraction of the bandwidth roof it reached.
Hovering a point labels it (region, kind, achieved rate); points that coincide are spread apart by a
small fixed offset so each can be hovered and clicked."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg

from .base import FLOOR, ProfilePlot, kind_color, kind_name

X_RANGE = (-3.0, 3.0)      # log10 FLOP/byte
NEAR = 0.03                # points closer than this fraction of both axis spans coincide on screen
SPREAD = 0.035             # ... and are set on a ring of this radius (fraction of the spans)


def spread(points: list[tuple[float, float]], x_span: float, y_span: float) -> list[tuple[float, float]]:
    """The same points, those that coincide moved onto a small ring around their first member, in
    order (deterministic: the same run always draws the same picture)."""
    out = list(points)
    groups: list[list[int]] = []
    for i, (x, y) in enumerate(points):
        for g in groups:
            gx, gy = points[g[0]]
            if abs(x - gx) < NEAR * x_span and abs(y - gy) < NEAR * y_span:
                g.append(i)
                break
        else:
            groups.append([i])
    for g in groups:
        if len(g) < 2:
            continue
        cx, cy = points[g[0]]
        for j, i in enumerate(g):
            a = 2 * math.pi * j / len(g)
            out[i] = (cx + SPREAD * x_span * math.cos(a), cy + SPREAD * y_span * math.sin(a))
    return out


class Roofline(ProfilePlot):
    def __init__(self, data, parent=None):
        self.data = data
        self.hover: pg.TextItem | None = None
        self.hovered: str | None = None
        super().__init__("Roofline", parent)
        self.setLogMode(x=True, y=True)
        self.setLabel("bottom", "FLOP / byte")
        self.setLabel("left", "GFLOP/s")
        self.plotItem.showGrid(x=True, y=True, alpha=0.15)
        self.scatter: pg.ScatterPlotItem | None = None
        self.ceilings: list[pg.TextItem] = []

    def label_for(self, rid: str) -> str:
        """What hovering a point says: the region, its kind and what it achieved against its roof."""
        k = self.data.kernels[rid]
        bw = self.data.bandwidth_gbs
        if k.bound == "compute" and k.achieved_tflops:
            rate = f"{k.achieved_tflops:.2f} TFLOP/s ({100 * k.achieved_tflops / self.data.peak_tflops:.1f}% of peak)"
        else:
            rate = f"{k.achieved_gbs or 0:.1f} GB/s ({100 * (k.achieved_gbs or 0) / bw:.1f}% of {bw:.0f} GB/s)"
        return f"{rid} · {kind_name(k.kind)} · {k.kernel or 'kernel'}\n{rate}"

    def redraw(self) -> None:
        if not hasattr(self, "hovered"):
            return
        pi = self.plotItem
        pi.clear()
        self.hover, self.hovered = None, None
        bw, peak = self.data.bandwidth_gbs, self.data.peak_tflops * 1e3   # GB/s, GFLOP/s
        ai = np.logspace(*X_RANGE, 80)
        pi.plot(ai, np.minimum(bw * ai, peak), pen=pg.mkPen(FLOOR, width=2))
        pts = self.data.roofline_points()
        low = np.log10(bw * 1e-3) - 0.5
        if pts:   # tiny, launch-bound kernels sit far under the roof: keep them in view
            low = min(low, min(np.log10(y) for _, _, y in pts) - 0.5)
        high = np.log10(peak) + 0.9
        pi.setXRange(*X_RANGE, padding=0.02)
        pi.setYRange(low, high, padding=0)
        # the roofs' labels sit under their lines, kept inside the view box at any size
        self.ceilings = [
            self.pin(pg.TextItem(f"{bw / 1e3:.1f} TB/s", color=FLOOR, anchor=(0, 0)), -2.0, np.log10(bw * 1e-2)),
            self.pin(pg.TextItem(f"{peak / 1e3:.0f} TFLOP/s", color=FLOOR, anchor=(1, 0)), X_RANGE[1], np.log10(peak))]
        self.scatter = None
        kinds = {}
        if pts:
            where = spread([(np.log10(x), np.log10(y)) for _, x, y in pts], X_RANGE[1] - X_RANGE[0], high - low)
            spots = []
            for (rid, _x, _y), pos in zip(pts, where):
                k = self.data.kernels[rid]
                kinds.setdefault(kind_name(k.kind), kind_color(k.kind))
                spots.append({"pos": pos, "data": rid, "brush": kind_color(k.kind), "size": 12,
                              "pen": pg.mkPen(self.text_color())})
            # the hover label replaces pyqtgraph's tooltip (which a status-bar message could hide)
            self.scatter = pg.ScatterPlotItem(hoverable=True, tip=None, hoverPen=pg.mkPen(self.text_color(), width=2))
            self.scatter.addPoints(spots)
            self.scatter.sigClicked.connect(lambda _it, points, _ev: len(points) and
                                            self.region_clicked.emit(points[0].data()))
            self.scatter.sigHovered.connect(self._hovered)
            pi.addItem(self.scatter)
        # without measurements the title says why the plot is empty (a note inside crossed the roof)
        self.set_title(self.title + ("" if pts else " (no GPU run)"))
        self.set_legend([("roof (measured peaks)", FLOOR, "line")]
                        + [(name, col, "point") for name, col in kinds.items()])

    def _hovered(self, _item, points, _ev) -> None:
        rid = points[0].data() if len(points) else None
        if rid == self.hovered:
            return
        self.hovered = rid
        if self.hover is not None:
            self.plotItem.removeItem(self.hover)
            self.pinned.pop(self.hover, None)
            self.hover = None
        if rid is None:
            return
        p = points[0].pos()
        (x0, x1), (y0, y1) = self.plotItem.getViewBox().viewRange()
        # open towards the middle of the plot, so the label starts inside it
        anchor = (0 if p.x() < (x0 + x1) / 2 else 1, 1 if p.y() < (y0 + y1) / 2 else 0)
        self.hover = pg.TextItem(self.label_for(rid), color=self.text_color(), anchor=anchor,
                                 fill=pg.mkBrush(self.palette().base().color()), border=pg.mkPen(self.text_color()))
        self.hover.setZValue(10)
        self.pin(self.hover, p.x(), p.y())

    def hover_text(self) -> str:
        return self.hover.toPlainText() if self.hover is not None else ""
