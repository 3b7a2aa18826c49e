"""A run's progress: one live line on stderr when it is a terminal, and `bench-progress` events
(docs/EVENTS.md) for a reader that is not one (a log file, the studio)."""
from __future__ import annotations

import sys
import time


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """done / total, running, failed and an ETA from the rate so far (problems run side by side, so
    the elapsed time per finished problem already counts the cluster's width)."""

    def __init__(self, total: int, *, emit=None, stream=None, clock=time.monotonic):
        self.total, self.done, self.failed, self.running = total, 0, 0, 0
        self.emit = emit                       # an EventEmitter or None
        self.stream = sys.stderr if stream is None else stream
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self._clock = clock
        self._t0 = clock()

    def eta_s(self) -> float | None:
        if not self.done:
            return None
        return (self._clock() - self._t0) / self.done * (self.total - self.done)

    def line(self) -> str:
        return (f"{self.done}/{self.total} done, {self.running} running, {self.failed} failed, "
                f"{_clock(self._clock() - self._t0)} elapsed, ETA {_clock(self.eta_s())}")

    def update(self, *, running: int, finished: dict | None = None) -> None:
        self.running = running
        if finished is not None:
            self.done += 1
            self.failed += not finished.get("ok")
        if self.emit is not None and finished is not None:
            eta = self.eta_s()
            self.emit.emit("bench-progress", done=self.done, total=self.total, failed=self.failed,
                           running=running, eta_s=None if eta is None else round(eta, 1),
                           problem=finished.get("problem"), ok=bool(finished.get("ok")))
        if self.live:
            self.stream.write("\r\033[K" + self.line())
            self.stream.flush()

    def clear(self) -> None:
        """Wipe the live line, before a line of output takes its place (it is drawn again next update)."""
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()

    close = clear


def event_line(e: dict) -> str:
    """A `bench-progress` event as the live line says it, without the elapsed time the reader cannot
    know: `3/10 done, 2 running, 1 failed, ETA 1:30` (the studio's Follow Benchmark Run)."""
    eta = None if e.get("done", 0) >= e.get("total", 0) else e.get("eta_s")
    return (f"{e.get('done', 0)}/{e.get('total', 0)} done, {e.get('running', 0)} running, {e.get('failed', 0)} failed"
            + (f", ETA {_clock(eta)}" if eta is not None else ""))
