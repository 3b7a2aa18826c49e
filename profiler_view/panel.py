"""The Profiles dock's content: the five plots side by side over one ProfileData, fed event by event
(live from the worker, or replayed) or from a profile.json. `region_clicked` carries the region of a
kernel clicked in any plot."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QSizePolicy, QSplitter, QVBoxLayout, QWidget

from .data import ProfileData
from .e2e import EndToEnd
from .kernel_bars import KernelBars
from .roofline import Roofline
from .timeline import Timeline
from .tuning import TuningPlot


class ProfilePanel(QWidget):
    region_clicked = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data = ProfileData()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        self.note = QLabel("No profile yet: Plan shows the planner's estimates; Optimize on a GPU measures.")
        self.note.setObjectName("ProfileNote")
        self.note.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Fixed)
        lay.addWidget(self.note)
        # two rows: what the kernels cost (bars, timeline, end to end), then why (roofline, tuning)
        self.split = QSplitter(Qt.Vertical)
        rows = [QSplitter(Qt.Horizontal), QSplitter(Qt.Horizontal)]
        for r in rows:
            r.setChildrenCollapsible(False)
            self.split.addWidget(r)
        self.kernels = KernelBars(self.data)
        self.e2e = EndToEnd(self.data)
        self.timeline = Timeline(self.data)
        self.roofline = Roofline(self.data)
        self.tuning = TuningPlot(self.data)
        self.plots = {"kernels": self.kernels, "timeline": self.timeline, "e2e": self.e2e,
                      "roofline": self.roofline, "tuning": self.tuning}
        for i, p in enumerate(self.plots.values()):
            rows[0 if i < 3 else 1].addWidget(p)
            p.region_clicked.connect(self.region_clicked)
        rows[0].setSizes([380, 300, 380])
        rows[1].setSizes([500, 560])
        lay.addWidget(self.split, 1)

    def reset(self) -> None:
        self.data = ProfileData()
        for p in self.plots.values():
            p.data = self.data
            p.redraw()
        self._note()

    def apply(self, event: dict) -> None:
        changed = self.data.apply(event)
        for name in changed:
            self.plots[name].redraw()
        if changed:
            self._note()

    def load_profile(self, prof: dict, regions=()) -> None:
        self.data.load_profile(prof, regions)
        self.redraw()

    def show_estimates(self, regions) -> None:
        """The planner's estimates for `regions` (Plan without a GPU)."""
        self.data.load_profile({}, regions)
        self.redraw()

    def redraw(self) -> None:
        for p in self.plots.values():
            p.redraw()
        self._note()

    def _note(self) -> None:
        d = self.data
        if d.has_measurements():
            hw = f" on {d.hardware}" if d.hardware else ""
            self.note.setText(f"Measured{hw}. Click a kernel to select its region.")
        elif d.kernels:
            self.note.setText("Planner estimates (no GPU measurements yet). Click a kernel to select its region.")
        else:
            self.note.setText("No profile yet: Plan shows the planner's estimates; Optimize on a GPU measures.")
