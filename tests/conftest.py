"""Fixtures shared by the tests. Qt is imported inside them: the GPU machine runs tests without it."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

_GUI = ("PySide6", "pyqtgraph", "app", "graph_editor", "profiler_view")


def _imports_gui_at_top(path: Path) -> bool:
    for line in path.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if line.startswith(("import ", "from ")) and words[1].split(".")[0] in _GUI:
            return True   # an unindented import: it runs when pytest collects the module
    return False


# the studio's tests import Qt at module level; the GPU machine has no PySide6 (`pytest -m gpu` there),
# so without it those modules are not collected (found by reading them: nobody keeps a list)
QT_MODULES = sorted(p.name for p in Path(__file__).parent.glob("test_*.py") if _imports_gui_at_top(p))
collect_ignore = [] if importlib.util.find_spec("PySide6") else QT_MODULES

# CI draws the same hypothesis examples every run (a submission lands or not on its code, not on the
# draw); a local run keeps exploring new ones
try:
    from hypothesis import settings as _hypothesis_settings
    _hypothesis_settings.register_profile("ci", derandomize=True)
    if os.environ.get("CI"):
        _hypothesis_settings.load_profile("ci")
except ImportError:   # the GPU image has no hypothesis
    pass


@pytest.fixture(autouse=True)
def _destroy_closed_widgets():
    """The widgets pytest-qt closes at a test's end (with deleteLater) are destroyed then, not in
    whatever later test next runs an event loop: a window destroyed in the middle of another test, or
    left half-alive while one restyles the application, has crashed a worker."""
    yield
    if "PySide6.QtCore" in sys.modules:
        from PySide6.QtCore import QCoreApplication, QEvent
        if QCoreApplication.instance() is not None:
            QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)


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
    # destroyed now, not whenever the garbage collector meets its Python wrapper: a window left
    # half-alive has crashed a later test's style change (pytest-qt only closes what it is given)
    from PySide6.QtCore import QCoreApplication, QEvent
    win.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)
