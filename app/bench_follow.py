"""Agent > Follow Benchmark Run…: the live progress of a `stitchcuda bench --events PATH` run (on a Ray
cluster or not) in the studio's status bar: done / total, running, failed and the time left.

The bench driver appends `bench-progress` events (docs/EVENTS.md) to PATH, one per finished problem,
and `done` at the end. The studio reads the file's new whole lines every READ_MS (a line still being
written waits for its newline), so it follows a run on this machine or on a cluster's head node whose
file it can read (a shared folder); it never starts or stops the run. The bar is its own, beside the
Optimize bar: an Optimize may run while a benchmark is followed.
"""
from __future__ import annotations

import json
import os

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QFileDialog, QProgressBar

from agent_core.cluster.progress import event_line

READ_MS = 250


class BenchFollow(QObject):
    def __init__(self, window):
        super().__init__(window)
        w = self.window = window
        self.path: str | None = None
        self._offset = 0
        self._partial = b""
        self.last: dict | None = None      # the latest bench-progress event of the run followed
        self.finished = False
        self.timer = QTimer(self)
        self.timer.setInterval(READ_MS)
        self.timer.timeout.connect(self.read)
        self.bar = QProgressBar()
        self.bar.setMaximumHeight(14)
        self.bar.setTextVisible(True)
        self.bar.hide()
        w.statusBar().addPermanentWidget(self.bar)
        self.act = {
            "follow": w.add_action("&Follow Benchmark Run…", self.follow_dialog, None, None,
                                   "Show the progress of a stitchcuda bench run from the file its --events "
                                   "option writes (done, running, failed, time left)"),
            "stop": w.add_action("Stop &Following", self.stop, None, None,
                                 "Stop following the benchmark run (the run itself goes on)"),
        }
        m = w.menu("agent")
        m.addSeparator()
        m.addAction(self.act["follow"])
        m.addAction(self.act["stop"])
        self._enable()

    def _enable(self) -> None:
        self.window.set_enabled(self.act["stop"], self.path is not None,
                                "No benchmark run is followed: Agent > Follow Benchmark Run… picks one")

    def follow_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Follow a benchmark run (the file bench --events writes)",
                                              self.window.last_dir(), "Events (*.jsonl *.json *.log);;All files (*)")
        if path:
            self.follow(path)

    def follow(self, path: str) -> None:
        """Follow the run whose events `path` receives, from the file's start (a run that began before
        is shown where it is now)."""
        self.stop(quiet=True)
        self.path, self._offset, self._partial, self.last, self.finished = path, 0, b"", None, False
        self._enable()
        self.bar.setRange(0, 0)         # busy until the first problem finishes
        self._bar_text(f"waiting for {os.path.basename(path)}")
        self.bar.show()
        self.window.status(f"Following the benchmark run in {path}: no problem has finished yet")
        self.timer.start()
        self.read()

    def stop(self, quiet: bool = False) -> None:
        if self.path is None:
            return
        self.timer.stop()
        self.bar.hide()
        path, self.path = self.path, None
        self._enable()
        if not quiet:
            self.window.status(f"Stopped following {path} (the run itself goes on)")

    def read(self) -> None:
        """Take the file's new whole lines; a missing file is waited for, a file that was cut or
        replaced is read again from its start."""
        if self.path is None:
            return
        try:
            size = os.path.getsize(self.path)
            if size < self._offset:
                self._offset, self._partial = 0, b""
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        changed = False
        for raw in lines:
            try:
                e = json.loads(raw)
            except ValueError:
                continue            # not an event line (another tool's output in the same file)
            if not isinstance(e, dict):
                continue
            if e.get("event") == "bench-progress":
                if self.finished or (self.last and e.get("done", 0) <= self.last.get("done", 0)):
                    self.finished = False       # a new run appended to the same file
                self.last, changed = e, True
            elif e.get("event") == "done" and self.last is not None:
                self.finished, changed = e.get("status") or "done", True
        if changed:
            self._show()

    def _show(self) -> None:
        e = self.last
        line = event_line(e)
        if self.finished:
            self.bar.hide()
            self.window.status(f"Benchmark run {'interrupted' if self.finished == 'interrupted' else 'finished'}: "
                               f"{line}")
            return
        self.bar.setRange(0, max(1, int(e.get("total") or 0)))
        self.bar.setValue(int(e.get("done") or 0))
        self._bar_text(line)
        self.bar.show()
        self.window.status(f"Benchmark run: {line}" + (f" (last: {e['problem']}, {'ok' if e.get('ok') else 'FAILED'})"
                                                       if e.get("problem") else ""))

    def _bar_text(self, text: str) -> None:
        self.bar.setFormat(text)
        self.bar.setFixedWidth(max(160, self.bar.fontMetrics().horizontalAdvance(text) + 24))
