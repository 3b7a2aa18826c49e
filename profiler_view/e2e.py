"""End to end: the whole program with the generated kernels against torch eager and torch.compile,
timed in the same run (horizontal bars, shortest is best). Each bar carries its own label, name and
time, at its end or inside it, so the plot needs neither axis names nor a legend; the time axis is
stretched just enough for every label to fit, and a label that fits nowhere is left out."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtGui import QFont

from .base import ProfilePlot, fmt_ms, text_width

# on the bars (short: a label must fit a small plot), and in full where there is room (the results summary)
LABELS = {"ours": "StitchCUDA", "eager": "torch eager", "compile_default": "torch.compile",
          "compile_reduce-overhead": "compile r-o"}
NAMES = {"ours": "ours (StitchCUDA)", "eager": "torch eager", "compile_default": "torch.compile",
         "compile_reduce-overhead": "torch.compile (reduce-overhead)"}
COLORS = {"ours": "#3fb28f", "eager": "#8a8f98", "compile_default": "#4f9dde", "compile_reduce-overhead": "#9b6ad6"}
ORDER = ("ours", "compile_default", "compile_reduce-overhead", "eager")   # top to bottom
LABEL_PT = 8
PAD_PX = 4      # between a bar's end and its label, and inside a bar around one
BAR_H = 0.62    # of a row


class EndToEnd(ProfilePlot):
    def __init__(self, data, parent=None):
        self.data = data
        self.labels: list[tuple[pg.TextItem, float, int, list[str]]] = []   # item, ms, row, texts longest first
        super().__init__("E2E", parent)
        self.setLabel("bottom", "time (us)")
        self.plotItem.showGrid(x=True, y=False, alpha=0.15)
        self.plotItem.hideAxis("left")   # the bars name themselves
        vb = self.plotItem.getViewBox()
        vb.setMouseEnabled(x=False, y=False)
        vb.sigResized.connect(lambda *_: self.fit_labels())

    def rows(self) -> list[tuple[str, float | None]]:
        """(baseline key, ms) measured, eager first and ours last (the order the CLI prints)."""
        e = self.data.end_to_end
        keys = [k for k in ("eager", "compile_default", "compile_reduce-overhead", "ours") if k in e]
        keys += [k for k in e if k not in keys]
        return [(k, e[k]) for k in keys]

    def shown_rows(self) -> list[tuple[str, str, float | None]]:
        """(key, name, ms) top to bottom: the measured rows, else the planner's estimates."""
        rows = self.rows()
        if rows:
            rank = {k: i for i, k in enumerate(ORDER)}
            rows.sort(key=lambda r: rank.get(r[0], len(ORDER)))
            return [(k, LABELS.get(k, k), ms) for k, ms in rows]
        p = self.data.plan
        if p.get("unfused_ms") is None:
            return []
        # no GPU: the planner's estimate is all there is
        return [("est", "planned (est.)", p["planned_ms"]), ("est", "unfused (est.)", p["unfused_ms"]),
                ("est", "memory floor (est.)", p["floor_ms"])]

    def redraw(self) -> None:
        if not hasattr(self, "labels"):
            return
        pi = self.plotItem
        pi.clear()
        self.labels = []
        rows = self.shown_rows()
        font = QFont(self.font())
        font.setPointSizeF(LABEL_PT)
        n = len(rows)
        for i, (k, name, ms) in enumerate(rows):
            y = n - 1 - i
            if ms is None:
                why = self.data.baseline_errors.get(k, "no time")
                texts, ms = [f"{name}: failed ({why})", f"{name}: failed"], 0.0
            else:
                col = pg.mkColor(COLORS.get(k, "#e0b94a"))
                pi.addItem(pg.BarGraphItem(x0=[0], y=[y], width=[ms * 1e3], height=BAR_H, brush=col, pen=pg.mkPen(col)))
                texts = [f"{name} {fmt_ms(ms)}", fmt_ms(ms)]
            t = pg.TextItem(texts[0], color=self.text_color(), anchor=(0, 0.5))
            t.setFont(font)
            t.textItem.document().setDocumentMargin(1)
            pi.addItem(t)
            self.labels.append((t, ms * 1e3, y, texts))
        self.set_legend([])
        ours, eager = self.data.end_to_end.get("ours"), self.data.end_to_end.get("eager")
        best = [ms for k, ms in self.rows() if k.startswith("compile") and ms]
        title = self.title
        if ours and eager:
            title += f": {eager / ours:.2f}x eager" + (f", {min(best) / ours:.2f}x compile" if best else "")
        self.set_title(title)
        pi.setYRange(-0.6, max(n, 1) - 0.4, padding=0)
        self.fit_labels()

    def fit_labels(self) -> None:
        """Stretch the time axis so that each label fits after its bar or inside it, in the longest
        form that fits at this width (name and time, else the time alone, else none)."""
        if not self.labels:
            return
        vb = self.plotItem.getViewBox()
        width = vb.width()
        if width <= 0:
            return
        top = max(us for _t, us, _y, _texts in self.labels) or 1.0
        chosen = {}
        for t, us, _y, texts in self.labels:
            fits = [s for s in texts if text_width(t, s) + 2 * PAD_PX < width]
            chosen[t] = fits[0] if fits else None
        x_max = top * 1.02
        for _ in range(4):   # an axis stretched for one label shrinks the bars others sat inside
            need = top * 1.02
            for t, us, _y, _texts in self.labels:
                if chosen[t] is None:
                    continue
                w = text_width(t, chosen[t]) + PAD_PX
                if us / x_max * width < w + PAD_PX:   # not inside: after the bar
                    need = max(need, us * width / (width - w))
            if abs(need - x_max) < 1e-9 * top:
                break
            x_max = need
        vb.setXRange(0, x_max, padding=0)
        for t, us, y, _texts in self.labels:
            text = chosen[t]
            w = text_width(t, text) + PAD_PX if text else 0.0
            inside = us / x_max * width >= w + PAD_PX
            if text is None or (not inside and us / x_max * width + w > width):   # the stretch did not settle
                t.setVisible(False)
                continue
            t.setVisible(True)
            if t.toPlainText() != text:
                t.setText(text)
            t.setColor("#ffffff" if inside else self.text_color())
            t.setAnchor((1, 0.5) if inside else (0, 0.5))
            t.setPos(us - PAD_PX * x_max / width if inside else us + PAD_PX * x_max / width, y)

    def visible_labels(self) -> list[pg.TextItem]:
        return [t for t, *_ in self.labels if t.isVisible()]
