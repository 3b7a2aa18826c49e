"""While a studio window is open, Python's cyclic garbage collector runs on the GUI thread only.

Python collects cycles on whichever thread crosses an allocation threshold. The studio runs Python on
pool threads (opening and importing files, auto-layout, the export, the kernel writer's test), and a
collection there can free a cycle that holds Qt objects, destroying them off the GUI thread, which Qt
does not survive (pyqtgraph's GarbageCollector exists for the same reason; the likely cause of a
pytest worker that crashed in the middle of a studio test). So while a window is open the automatic
collector is off and a GUI-thread timer collects each generation whose threshold has been crossed,
as the collector would have; when the last window closes, what piled up is collected there and the
collector is as it was.
"""
from __future__ import annotations

import gc

import shiboken6
from PySide6.QtCore import QTimer

INTERVAL_MS = 250
_windows: set[int] = set()
_timer: QTimer | None = None
_was_enabled = False


def hold(window) -> None:
    """Collect on the GUI thread (call from it) until release_id(id(window))."""
    global _timer, _was_enabled
    if not _windows:
        _was_enabled = gc.isenabled()
        gc.disable()
        if _timer is None or not shiboken6.isValid(_timer):
            _timer = QTimer()
            _timer.setInterval(INTERVAL_MS)
            _timer.timeout.connect(collect_due)
        _timer.start()
    _windows.add(id(window))


def release_id(key: int, collect: bool = True) -> None:
    """The window id(window) == key closed or was destroyed; after the last one, what piled up is
    collected (not from inside a destructor: collect=False) and the collector is back as it was
    before the first."""
    if key not in _windows:
        return
    _windows.discard(key)
    if not _windows:
        if shiboken6.isValid(_timer):    # at interpreter exit PySide may have deleted it first
            _timer.stop()
        if collect:
            gc.collect()
        if _was_enabled:
            gc.enable()


def collect_due() -> int:
    """What the automatic collector does when an allocation crosses the youngest generation's
    threshold: collect the oldest generation whose count passed its threshold. The objects found
    unreachable."""
    counts, limits = gc.get_count(), gc.get_threshold()
    if counts[0] <= limits[0]:
        return 0
    return gc.collect(max(g for g in range(3) if counts[g] > limits[g]))
