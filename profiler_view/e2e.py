"""End to end: the whole program with the generated kernels against torch eager and torch.compile,
timed in the same run (horizontal bars, shortest is best)."""
from __future__ import annotations

import pyqtgraph as pg

from .base import ProfilePlot, fmt_ms

LABELS = {"ours": "StitchCUDA", "eager": "torch eager", "compile_default": "torch.compile",
          "compile_reduce-overhead": "compile (r-o)"}
LEGEND = {"ours": "ours (StitchCUDA)", "eager": "torch eager", "compile_default": "torch.compile",
          "compile_reduce-overhead": "torch.compile reduce-overhead"}
COLORS = {"ours": "#3fb28f", "eager": "#8a8f98", "compile_default": "#4f9dde", "compile_reduce-overhead": "#9b6ad6"}


class EndToEnd(ProfilePlot):
    def __init__(self, data, parent=None):
        self.data = data
        super().__init__("E2E", parent)
        self.setLabel("bottom", "time (us)")
        self.plotItem.showGrid(x=True, y=False, alpha=0.15)
        self.plotItem.getAxis("left").setWidth(96)

    def rows(self) -> list[tuple[str, float | None]]:
        e = self.data.end_to_end
        keys = [k for k in ("eager", "compile_default", "compile_reduce-overhead", "ours") if k in e]
        keys += [k for k in e if k not in keys]
        return [(k, e[k]) for k in keys]

    def redraw(self) -> None:
        if not hasattr(self, "data"):
            return
        pi = self.plotItem
        pi.clear()
        rows = self.rows()
        ours = self.data.end_to_end.get("ours")
        if not rows and self.data.plan.get("unfused_ms") is not None:
            # no GPU: the planner's estimate is all there is
            rows = [("unfused (est.)", self.data.plan["unfused_ms"]), ("planned (est.)", self.data.plan["planned_ms"]),
                    ("floor (est.)", self.data.plan["floor_ms"])]
        ticks = []
        for i, (k, ms) in enumerate(rows):
            ticks.append((i, LABELS.get(k, k)))
            if ms is None:
                t = pg.TextItem(f"failed: {self.data.baseline_errors.get(k, 'no time')[:40]}", color=self.text_color(),
                                anchor=(0, 0.5))
                t.setPos(0, i)
                pi.addItem(t)
                continue
            col = pg.mkColor(COLORS.get(k, "#e0b94a"))
            pi.addItem(pg.BarGraphItem(x0=[0], y=[i], width=[ms * 1e3], height=0.6, brush=col, pen=pg.mkPen(col)))
            note = fmt_ms(ms)
            t = pg.TextItem(note, color=self.text_color(), anchor=(0, 0.5))
            t.setPos(ms * 1e3, i)
            pi.addItem(t)
        pi.getAxis("left").setTicks([ticks])
        self.set_legend([(LEGEND.get(k, k), COLORS.get(k, "#e0b94a"), "bar") for k, ms in rows if ms is not None])
        best = [ms for k, ms in rows if k.startswith("compile") and ms]
        eager = self.data.end_to_end.get("eager")
        title = self.title
        if ours and eager:
            title += f": {eager / ours:.2f}x eager" + (f", {min(best) / ours:.2f}x compile" if best else "")
        pi.setTitle(title, size="9pt", color=self.text_color().name())
        if rows:
            top = max((ms or 0) for _, ms in rows) * 1e3
            pi.setXRange(0, top * 1.7 if top else 1, padding=0)
            pi.setYRange(-0.6, len(rows) - 0.4, padding=0)
