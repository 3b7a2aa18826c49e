"""The results summary beside the plots: end-to-end time against torch eager and torch.compile with
the speedups, the kernels and launches, each fallback with its reason, and the device it was measured
on (or that nothing was timed without a GPU). Read from the same ProfileData as the plots, so it
stays until the next run replaces the data, and reset() clears it."""
from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QVBoxLayout, QWidget

from agent_core.text import plural

from .base import fmt_ms
from .e2e import NAMES

EMPTY = "No results yet: Optimize (F5) or File > Open results fills this summary."
MIB = 1 << 20


def memory_text(m: dict) -> str:
    """The memory plan in a line: its predicted peak against its budget, and what it changed to save
    memory."""
    peak, budget = m["predicted_peak_bytes"], m.get("budget_bytes")
    text = f"{peak / MIB:.1f} MiB predicted peak"
    if budget is not None:
        text += (f" of a {budget / MIB:.1f} MiB budget" if peak <= budget
                 else f", over its {budget / MIB:.1f} MiB budget") + (f" ({m['budget']})" if m.get("budget") else "")
    changed = []
    if m.get("run_as_fp32"):
        changed.append(f"{plural(m['run_as_fp32'], 'split-TF32 call')} in fp32")
    if m.get("weights_per_call"):
        changed.append(f"{plural(m['weights_per_call'], 'call')} splitting or converting weights every call")
    if changed:
        text += "; to save memory: " + ", ".join(changed)
    return text


class ResultsSummary(QWidget):
    region_clicked = Signal(str)   # a region named in the summary was clicked

    def __init__(self, data, parent=None):
        super().__init__(parent)
        self.data = data
        self.title = "Results"
        self.setMinimumSize(180, 120)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 4, 4, 4)
        self.label = QLabel()
        self.label.setObjectName("ResultsSummary")
        self.label.setWordWrap(True)
        self.label.setAlignment(Qt.AlignTop | Qt.AlignLeft)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.LinksAccessibleByMouse)
        self.label.linkActivated.connect(lambda href: self.region_clicked.emit(href.removeprefix("region:")))
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.NoFrame)
        scroll.setWidget(self.label)
        lay.addWidget(scroll)
        self.rows: list[tuple[str, str]] = []   # (heading, plain text) as shown, for tests and copying
        self.redraw()

    def plain_text(self) -> str:
        return "\n".join(f"{h}: {t}" if h else t for h, t in self.rows)

    def redraw(self) -> None:
        self.rows = self._rows()
        html = [f"<b>{escape(self.title)}</b>"]
        for head, text in self.rows:
            body = escape(text)
            for rid in self.data.kernels:   # region ids become links that select the region
                body = body.replace(f"{rid}:", f'<a href="region:{rid}">{rid}</a>:')
            html.append(f"<b>{escape(head)}:</b> {body}" if head else body)
        self.label.setText("<br>".join(html))

    def _rows(self) -> list[tuple[str, str]]:
        d = self.data
        if not d.kernels and not d.end_to_end and not d.finished:
            return [("", EMPTY)]
        rows: list[tuple[str, str]] = []
        if d.gpu is False:
            rows.append(("Device", "not timed: no GPU (kernels generated and compiled only)"))
        elif d.hardware:
            rows.append(("Device", f"{d.hardware}, {d.bandwidth_gbs:.0f} GB/s copy"))
        elif d.live and not d.finished:
            rows.append(("Device", "waiting for the worker's first measurement"))
        ours = d.end_to_end.get("ours")
        if ours is not None:
            rows.append(("StitchCUDA", f"{fmt_ms(ours)} end to end"))
            for key in ("eager", "compile_default", "compile_reduce-overhead"):
                if key not in d.end_to_end:
                    continue
                ms = d.end_to_end[key]
                if ms is None:
                    why = d.baseline_errors.get(key, "no time")
                    rows.append((NAMES[key], f"failed: {why}"))
                else:
                    ratio = ms / ours if ms >= ours else ours / ms
                    rows.append((NAMES[key], f"{fmt_ms(ms)}, ours {ratio:.2f}x {'faster' if ms >= ours else 'slower'}"))
        elif d.plan.get("unfused_ms") is not None:
            rows.append(("Estimate", f"{fmt_ms(d.plan['unfused_ms'])} unfused, {fmt_ms(d.plan['planned_ms'])} planned "
                                     f"(memory floor {fmt_ms(d.plan['floor_ms'])})"))
        outcomes = d.outcomes()
        if outcomes:
            rows.append(("Kernels", ", ".join(f"{len(v)} {k}" for k, v in outcomes.items())
                         + f" of {plural(len(d.kernels), 'region')}"))
        elif d.kernels:
            rows.append(("Kernels", f"{plural(len(d.kernels), 'region')} proposed"))
        if d.launches is not None:
            rows.append(("Launches", f"{d.launches} end to end"))
        if d.memory:
            rows.append(("Memory", memory_text(d.memory)))
        for rid in outcomes.get("fallback", []):
            rows.append(("Fallback", f"{rid}: {d.kernels[rid].reason or 'no reason given'}"))
        if d.outcome.startswith("failed"):
            rows.append(("Run", d.outcome))
        return rows
