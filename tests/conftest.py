"""Fixtures shared by the tests. Qt is imported inside them: the GPU machine runs tests without it."""
import pytest


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
