"""The worker process from the studio (pytest-qt, offscreen, CPU): a real `stitchcuda worker` streams
plan, codegen and compile events while the window keeps handling events, and its regions are applied as
one undoable edit; a worker killed mid-run, one that hangs, one that prints garbage and one that is
cancelled are each reported, and the document is unchanged."""
from __future__ import annotations

import os
import sys
import time

import pytest
from PySide6.QtCore import QStandardPaths, Qt, QTimer

QStandardPaths.setTestModeEnabled(True)

from agent_core.project_file import load_program  # noqa: E402
from app.document import Document  # noqa: E402
from app.worker_client import WorkerClient  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "tests", "data", "residual_add_layer_norm_cpu", "program.json")
FAST = ("--no-rewrite", "--no-tune", "--cpu", "--no-baselines")


@pytest.fixture
def window(studio_window):
    studio_window.agent.worker_args = FAST
    program = load_program(PROGRAM)
    program.regions = []      # the worker plans them
    studio_window.set_document(Document(program))
    studio_window._layout_if_needed(studio_window.document, True)
    return studio_window


def snapshot(win):
    return [r.to_dict() for r in win.document.program.regions], win.document.stack.count()


def test_real_worker_streams_events_while_the_gui_stays_responsive(window, qtbot):
    agent = window.agent
    ticks = []
    timer = QTimer(interval=50, timeout=lambda: ticks.append(time.perf_counter()))
    timer.start()
    seen, hulls = [], []

    def on_event(e):   # connected after the studio's own handler: the live overlay has seen e
        seen.append(e["event"])
        if e["event"] == "region-proposed":
            hulls.append(sorted(agent.live.items) if agent.live is not None else None)
    agent.worker.event.connect(on_event)
    with qtbot.waitSignal(agent.worker.finished, timeout=120_000) as done:
        window.view.setFocus()
        qtbot.keyClick(window.view, Qt.Key_F5)   # as a user starts it
        assert agent.act["cancel"].isEnabled() and agent.bar.isVisible()
    timer.stop()
    status, message = done.args
    assert status == "no-gpu", message
    for name in ("plan", "region-proposed", "codegen", "compile", "done"):
        assert name in seen
    # the hulls grew on the canvas one proposal at a time, then gave way to the document's regions
    assert [len(h) for h in hulls] == list(range(1, len(hulls) + 1)), hulls
    assert agent.live is None
    # the event loop kept running: many ticks, none held up for long
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) > 20 and max(gaps) < 2.0
    # the finished run's regions (with their CUDA) are on the document, as one undoable edit
    program = window.document.program
    assert program.regions, window.refusal_label.text()
    assert all(r.source for r in program.regions if r.kind == "reduction")
    assert sorted(agent.overlay.items) == sorted(r.id for r in program.regions)
    assert "Optimize finished" in window.status_label.text() and not agent.bar.isVisible()
    agent.select_region(program.regions[0].id)
    assert "__global__" in agent.source.edit.toPlainText()
    window.document.stack.undo()
    assert program.regions == []


def test_killed_worker_is_reported_and_the_document_is_unchanged(window, qtbot):
    agent = window.agent
    before = snapshot(window)
    with qtbot.waitSignal(agent.worker.event, timeout=60_000, check_params_cb=lambda e: e["event"] == "plan"):
        agent.act["optimize"].trigger()
    with qtbot.waitSignal(agent.worker.finished, timeout=60_000) as done:
        agent.worker.proc.kill()          # mid-run, as if a kernel had faulted and taken the process down
    status, message = done.args
    assert status == "crashed" and "unchanged" in message
    assert snapshot(window) == before
    assert agent.live is None and not any(type(i).__name__ == "LiveRegionItem" for i in window.scene.items())
    assert "crashed" in window.refusal_label.text() or "killed" in window.refusal_label.text() \
        or "before finishing" in window.refusal_label.text()
    assert not agent.worker.running and agent.act["optimize"].isEnabled()


def test_cancel_stops_the_worker(window, qtbot):
    agent = window.agent
    before = snapshot(window)
    with qtbot.waitSignal(agent.worker.finished, timeout=60_000) as done:
        agent.act["optimize"].trigger()
        agent.act["cancel"].trigger()
    assert done.args[0] == "cancelled"
    assert snapshot(window) == before
    assert "cancelled" in agent.log.tree.topLevelItem(agent.log.tree.topLevelItemCount() - 1).text(3)


STAND_IN = r'''
import sys, time
print("Loading model... (a stray print)")
print('{"v":1,"event":"plan","t":0.1,"program":"p","nodes":2,"regions":1,"kernels":1}', flush=True)
print("{not json", flush=True)
sys.stderr.write("%s\n")
sys.stderr.flush()
%s
'''


def stand_in(qtbot, body: str, stderr: str = "working", timeout_s: float = 30.0):
    client = WorkerClient(timeout_s=timeout_s)
    events, bad = [], []
    client.event.connect(events.append)
    client.bad_line.connect(bad.append)
    with qtbot.waitSignal(client.finished, timeout=30_000) as done:
        client.start("", program=[sys.executable, "-c", STAND_IN % (stderr, body)])
    return done.args, events, bad


def test_garbage_lines_are_reported_and_skipped(qtbot):
    (status, message), events, bad = stand_in(qtbot, "sys.exit(0)")
    assert [e["event"] for e in events] == ["plan"]
    assert len(bad) == 2 and "not JSON" in bad[0] and "Loading model" in bad[0]
    assert status == "crashed" and "exited with code 0" in message   # no done event: not a finished run


def test_a_worker_that_dies_says_why(qtbot):
    (status, message), events, _ = stand_in(qtbot, "sys.exit(3)", stderr="CUDA error: an illegal memory access")
    assert status == "crashed" and "code 3" in message and "illegal memory access" in message


def test_a_hung_worker_trips_the_watchdog(qtbot):
    t0 = time.perf_counter()
    (status, message), events, _ = stand_in(qtbot, "time.sleep(60)", timeout_s=1.5)
    assert status == "timeout" and "printed nothing" in message and "unchanged" in message
    assert time.perf_counter() - t0 < 20
