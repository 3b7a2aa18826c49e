"""The Profiles dock's content: the five plots and the results summary over one ProfileData, fed
event by event (live from the worker, or replayed) or from a profile.json. `region_clicked` carries
the region of a kernel clicked in any plot. The view controls above them sort the kernel bars and the
timeline (program order or slowest first), keep the N slowest, and reset the zoom."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QSplitter, QVBoxLayout, QWidget

from .base import ProfilePlot
from .data import ProfileData
from .e2e import EndToEnd
from .kernel_bars import KernelBars
from .roofline import Roofline
from .summary import ResultsSummary
from .timeline import Timeline
from .tuning import TuningPlot

ORDERS = ("Program order", "Slowest first")
TOPS = {"All kernels": None, "Top 10": 10, "Top 20": 20}


class ProfilePanel(QWidget):
    region_clicked = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data = ProfileData()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        top = QHBoxLayout()
        self.note = QLabel("No profile yet: Plan shows the planner's estimates; Optimize on a GPU measures.")
        self.note.setObjectName("ProfileNote")
        self.note.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.note.setWordWrap(True)   # two lines in a narrow dock rather than a cut-off sentence
        self.order = QComboBox()
        self.order.addItems(ORDERS)
        self.order.setToolTip("Kernel bars and timeline: in program order, or the slowest kernel first")
        self.top = QComboBox()
        self.top.addItems(list(TOPS))
        self.top.setToolTip("Kernel bars and timeline: every kernel, or only the slowest ones")
        self.reset_zoom_btn = QPushButton("Reset zoom")
        self.reset_zoom_btn.setToolTip("Show every kernel again (the wheel zooms the time axis, a drag pans it)")
        top.addWidget(self.note, 1)
        top.addWidget(self.order)
        top.addWidget(self.top)
        top.addWidget(self.reset_zoom_btn)
        lay.addLayout(top)
        # two rows: what the kernels cost (bars, timeline, end to end), then why (roofline, tuning) and the summary
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
        self.summary = ResultsSummary(self.data)
        self.plots = {"kernels": self.kernels, "timeline": self.timeline, "e2e": self.e2e,
                      "roofline": self.roofline, "tuning": self.tuning, "summary": self.summary}
        for i, p in enumerate(self.plots.values()):
            rows[0 if i < 3 else 1].addWidget(p)
            p.region_clicked.connect(self.region_clicked)
        rows[0].setSizes([380, 300, 380])
        rows[1].setSizes([380, 380, 300])
        lay.addWidget(self.split, 1)
        self.order.currentIndexChanged.connect(lambda _i: self._view_changed())
        self.top.currentIndexChanged.connect(lambda _i: self._view_changed())
        self.reset_zoom_btn.clicked.connect(self.reset_zoom)

    def _view_changed(self) -> None:
        slowest, top = self.order.currentIndex() == 1, TOPS[self.top.currentText()]
        self.kernels.set_view(slowest, top)
        self.timeline.set_view(slowest, top)

    def reset_zoom(self) -> None:
        self.kernels.reset_zoom()
        self.timeline.reset_zoom()

    def reset(self) -> None:
        """Nothing of the last run or document: no data, and every plot's axes back to a new window's
        (the old run's time ticks stayed on the empty plots)."""
        self.data = ProfileData()
        for p in self.plots.values():
            p.data = self.data
            if isinstance(p, ProfilePlot):
                vb = p.plotItem.getViewBox()
                vb.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
                vb.enableAutoRange()
            p.redraw()
        self._note()

    def apply(self, event: dict) -> None:
        """One event of a run in progress (a replay folds its events into `data` and redraws once)."""
        self.data.live = True
        changed = self.data.apply(event)
        for name in changed:
            self.plots[name].redraw()
        if changed:
            self._note()

    def finish(self) -> None:
        """The run ended (even without a done event: the worker was cancelled or crashed)."""
        self.data.finished = True
        self.tuning.redraw()
        self.summary.redraw()

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
