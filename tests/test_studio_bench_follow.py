"""Agent > Follow Benchmark Run… (pytest-qt, offscreen): the studio follows a `bench --events PATH` file
while it is appended, and its status-bar progress says done / running / failed and the time left.

The file is written as bench's driver writes it: agent_core.cluster.progress.Progress (the class that
`bench --ray` updates once per finished problem) emitting through an EventEmitter into the file, with a
clock the test moves, so the ETA shown is the one that clock implies.
"""
from __future__ import annotations

import os

from PySide6.QtCore import QStandardPaths
from PySide6.QtWidgets import QFileDialog

QStandardPaths.setTestModeEnabled(True)

from agent_core.agent.events import EventEmitter  # noqa: E402
from agent_core.cluster.progress import Progress  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHOTS = os.path.join(ROOT, "test-output", "screenshots")


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _action(win, text):
    return next(a for a in win.menu("agent").actions() if a.text().replace("&", "") == text)


def test_following_an_appended_events_file_shows_done_running_failed_and_eta(studio_window, qtbot, monkeypatch,
                                                                               tmp_path):
    win = studio_window
    events = tmp_path / "events.jsonl"
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(events), ""))
    follow, stop = _action(win, "Follow Benchmark Run…"), _action(win, "Stop Following")
    bar = win.bench_follow.bar
    assert not stop.isEnabled() and "No benchmark run is followed" in stop.toolTip()
    follow.trigger()                                  # the file does not exist yet: the run has not started
    assert bar.isVisible() and bar.maximum() == 0 and stop.isEnabled()
    assert "no problem has finished yet" in win.status_label.text()

    clock = _Clock()
    with open(events, "a") as sink:
        progress = Progress(4, emit=EventEmitter(sink), clock=clock, stream=open(os.devnull, "w"))
        clock.now += 30
        progress.update(running=2, finished={"problem": "19_ReLU", "ok": True})
        qtbot.waitUntil(lambda: bar.format() == "1/4 done, 2 running, 0 failed, ETA 1:30", timeout=3000)
        assert (bar.value(), bar.maximum()) == (1, 4)
        assert "last: 19_ReLU, ok" in win.status_label.text()
        assert bar.width() >= bar.fontMetrics().horizontalAdvance(bar.format())      # the text is not clipped
        clock.now += 10
        progress.update(running=2, finished={"problem": "23_Softmax", "ok": False})
        qtbot.waitUntil(lambda: bar.format() == "2/4 done, 2 running, 1 failed, ETA 0:40", timeout=3000)
        assert "last: 23_Softmax, FAILED" in win.status_label.text()
        os.makedirs(SHOTS, exist_ok=True)
        win.grab().save(os.path.join(SHOTS, "bench_follow.png"))
        sink.write('{"v": 1, "event": "bench-progress", "done": 3, "to')   # half a line: not read yet
        sink.flush()
        qtbot.wait(600)
        assert bar.format().startswith("2/4 done")
    with open(events, "rb+") as f:               # the driver's next write ends that line; here, cut it off
        f.truncate(f.seek(0, 2) - len('{"v": 1, "event": "bench-progress", "done": 3, "to'))
    with open(events, "a") as sink:
        progress.emit = EventEmitter(sink)
        clock.now += 10
        progress.update(running=1, finished={"problem": "40_LayerNorm", "ok": True})
        clock.now += 5
        progress.update(running=0, finished={"problem": "1_GEMM", "ok": True})
        progress.emit.emit("done", status="done")
    qtbot.waitUntil(lambda: not bar.isVisible(), timeout=3000)
    assert win.status_label.text() == "Benchmark run finished: 4/4 done, 0 running, 1 failed"
    stop.trigger()
    assert not stop.isEnabled() and "Stopped following" in win.status_label.text()


def test_a_run_stopped_by_ctrl_c_reads_interrupted(studio_window, tmp_path):
    events = tmp_path / "events.jsonl"
    clock = _Clock()
    with open(events, "w") as sink:
        p = Progress(3, emit=EventEmitter(sink), clock=clock, stream=open(os.devnull, "w"))
        clock.now += 20
        p.update(running=1, finished={"problem": "a", "ok": True})
        p.emit.emit("done", status="interrupted")     # bench --ray's driver after Ctrl+C
    studio_window.bench_follow.follow(str(events))    # an ended run opened afterwards: where it stopped
    assert studio_window.status_label.text() == "Benchmark run interrupted: 1/3 done, 1 running, 0 failed, ETA 0:40"
    assert not studio_window.bench_follow.bar.isVisible()
