"""Fixtures shared by the tests. Qt is imported inside them: the GPU machine runs tests without it."""
import importlib.util

import pytest

# the studio's tests import Qt at module level; the GPU machine has no PySide6 (`pytest -m gpu` there)
QT_MODULES = ["test_app.py", "test_editor.py", "test_studio_agent.py", "test_studio_agent_worker.py",
              "test_studio_rewrites.py"]
collect_ignore = [] if importlib.util.find_spec("PySide6") else QT_MODULES


@pytest.fixture
def studio_window(qtbot):
    """The main window, dark, without saved settings or leftover recovery files, 1500 x 940 and
    shown; modal questions go to an Answers (unsaved changes: discard). Closed clean afterwards,
    with any worker or export it started stopped."""
    from app import recovery
    from app.main_window import MainWindow

    from tests.studio import Answers
    for r in recovery.pending():
        recovery.discard(r["file"])
    win = MainWindow(theme="dark", restore_settings=False)
    win.ask = Answers(unsaved="discard")
    qtbot.addWidget(win)
    win.resize(1500, 940)
    win.show()
    yield win
    win.agent.shutdown()
    win.document.mark_clean()
    win.close()
