"""While a studio window is open, Python's cyclic collector runs on the GUI thread only (app/gui_gc.py):
a collection on a pool thread can destroy Qt objects off the GUI thread. Every collection is recorded
with its thread while the studio lays out and opens a program on its pool threads."""
import gc
import threading

import pytest
from PySide6.QtCore import QPointF
from PySide6.QtWidgets import QFileDialog

from agent_core.project_file import save_program


@pytest.fixture
def collections():
    """The thread of every collection from here to the end of the test."""
    seen = []

    def record(phase, info):
        if phase == "start":
            seen.append(threading.get_ident())
    gc.callbacks.append(record)
    yield seen
    gc.callbacks.remove(record)


def test_no_collection_runs_off_the_gui_thread_while_the_studio_lays_out_and_opens(studio_window, qtbot, tmp_path,
                                                                                  monkeypatch, collections):
    win, gui = studio_window, threading.get_ident()
    assert not gc.isenabled()
    sc = win.scene
    prev = None
    for _ in range(120):    # laying out a long chain allocates past the collector's thresholds
        nid = sc.add_node("sigmoid", QPointF(0, 0))
        if prev:
            sc.try_connect(win.document.program.nodes[prev].outputs[0], nid, 0)
        prev = nid
    sc.clearSelection()
    for _ in range(3):
        with qtbot.waitSignal(win.layout_runner.finished, timeout=30000):
            win.act["layout"].trigger()
    path = str(tmp_path / "chain.json")
    save_program(win.document.program, path)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (path, ""))
    with qtbot.waitSignal(win.opened, timeout=30000):     # File > Open reads it on a pool thread
        win.act["open"].trigger()
    qtbot.waitUntil(lambda: len(collections) >= 2, timeout=5000)     # the GUI thread's timer collects
    assert set(collections) == {gui}


def test_the_collector_is_back_when_the_last_window_closes(qtbot):
    from app.main_window import MainWindow
    from tests.studio import Answers
    assert gc.isenabled()
    wins = [MainWindow(restore_settings=False) for _ in range(2)]
    for w in wins:
        w.ask = Answers(unsaved="discard")
        w.agent.shutdown()
    assert not gc.isenabled()
    wins[0].close()
    assert not gc.isenabled()
    wins[1].close()
    assert gc.isenabled()
    for w in wins:
        w.deleteLater()


def test_a_window_destroyed_without_closing_gives_the_collector_back(qtbot):
    from PySide6.QtCore import QCoreApplication, QEvent

    from app.main_window import MainWindow
    assert gc.isenabled()
    win = MainWindow(restore_settings=False)
    win.agent.shutdown()
    assert not gc.isenabled()
    win.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)
    assert gc.isenabled()
