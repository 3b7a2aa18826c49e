"""Tuning: each region's trial times as the agent tries launch parameters, one point per tune-step
event (rejected trials as crosses on the axis), the best so far as a step line. The title says
"(live)" only while a run's events are arriving, not for a replayed or finished run."""
from __future__ import annotations

import pyqtgraph as pg

from agent_core.text import plural

from .base import ProfilePlot

LEGEND_REGIONS = 6   # past this many tuned regions the legend names the first ones and counts the rest
PALETTE = ("#4f9dde", "#d9822b", "#3fb28f", "#9b6ad6", "#c75d9b", "#e0b94a", "#8a8f98")


class TuningPlot(ProfilePlot):
    def __init__(self, data, parent=None):
        self.data = data
        super().__init__("Tuning", parent)
        self.setLabel("bottom", "trial")
        self.setLabel("left", "time (us)")

    def point_count(self) -> int:
        return sum(len(v) for v in self.data.tuning.values())

    def redraw(self) -> None:
        if not hasattr(self, "data"):
            return
        pi = self.plotItem
        pi.clear()
        live = self.data.live and not self.data.finished
        self.set_title(self.title + (" (live)" if live else ""))
        entries = []
        for i, (rid, steps) in enumerate(self.data.tuning.items()):
            col = PALETTE[i % len(PALETTE)]
            ok = [s for s in steps if s.ok and s.ms is not None]
            bad = [s for s in steps if not s.ok or s.ms is None]
            pi.plot([s.trial for s in ok], [s.ms * 1e3 for s in ok], pen=None, symbol="o", symbolSize=7,
                    symbolBrush=col, symbolPen=pg.mkPen(col))
            if i < LEGEND_REGIONS:
                entries.append((rid, col, "point"))
            best, xs, ys = None, [], []
            for s in sorted(ok, key=lambda s: s.trial):
                best = s.ms if best is None else min(best, s.ms)
                xs.append(s.trial)
                ys.append(best * 1e3)
            if xs:
                pi.plot(xs, ys, pen=pg.mkPen(col, width=1.5), stepMode=None)
            if bad:
                low = min((s.ms for s in ok), default=0.001) * 1e3
                pi.plot([s.trial for s in bad], [low * 0.9] * len(bad), pen=None, symbol="x", symbolSize=8,
                        symbolBrush=col, symbolPen=pg.mkPen(col))
        if len(self.data.tuning) > LEGEND_REGIONS:
            entries.append((f"+{plural(len(self.data.tuning) - LEGEND_REGIONS, 'more region')}", self.text_color().name(), ""))
        if self.data.tuning:
            entries.append(("best so far", self.text_color().name(), "line"))
        if any(not s.ok or s.ms is None for steps in self.data.tuning.values() for s in steps):
            entries.append(("rejected trial", self.text_color().name(), "cross"))
        self.set_legend(entries)
        if not self.data.tuning:
            pi.setXRange(0, 6, padding=0)
            pi.setYRange(0, 1, padding=0)
            self.empty_hint("Trials appear here while\nthe agent tunes on a GPU")
            return
        pi.enableAutoRange()
