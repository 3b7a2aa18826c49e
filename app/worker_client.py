"""The worker client: runs `python -m agent_core.cli worker FILE` in its own process (QProcess) and
turns its stdout into events, one JSON line each (docs/EVENTS.md).

The studio must outlive anything the worker does: a kernel that faults kills the worker, a hang trips
the watchdog (no output for `timeout_s`), a line that is not an event is reported and skipped. Every
run ends with exactly one `finished(status, message)`: status is done, no-gpu, failed (the worker
reported a fatal error), crashed, timeout or cancelled, and message is one line a user reads.

Nothing the worker prints can hold up the GUI or grow it without bound: a line longer than MAX_LINE is
cut as it arrives (the rest of it is dropped up to its newline, never buffered); of the lines that are
not events the first KEEP_BAD are reported (each cut to BAD_CHARS) and the rest only counted ("and
99,800 more lines that were not events" at the end); lines are parsed and their events emitted for at
most TICK_S per turn of the event loop, the rest after a zero-timer; the stderr tail keeps STDERR_TAIL
lines of at most STDERR_CHARS.
"""
from __future__ import annotations

import os
import sys
import time
from collections import deque

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from agent_core.agent.events import EventError, parse_event

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STDERR_TAIL = 40
STDERR_CHARS = 500
MAX_LINE = 1 << 20    # bytes; an event is a few KiB at most, so a longer line is not one
KEEP_BAD = 200        # lines that are not events, reported one by one; the rest are counted
BAD_CHARS = 300
TICK_S = 0.02         # parsing and emitting per turn of the event loop
WATCHDOG_S = 180.0   # torch's import and a first NVRTC compile take a while; a minute of silence is normal on CPU


class WorkerClient(QObject):
    event = Signal(dict)
    bad_line = Signal(str)              # the reader's one-line complaint about a line that is not an event
    finished = Signal(str, str)         # status, message
    started = Signal()

    def __init__(self, parent=None, timeout_s: float = WATCHDOG_S):
        super().__init__(parent)
        self.timeout_s = timeout_s
        self.proc: QProcess | None = None
        self.what = "Optimize"
        self.arguments: list[str] = []
        self._reset()
        self._ended = True
        self.watchdog = QTimer(self, singleShot=True)
        self.watchdog.timeout.connect(self._timed_out)
        self._more = QTimer(self, singleShot=True, interval=0)   # the rest of a burst, after the GUI's turn
        self._more.timeout.connect(self._drain)

    def _reset(self) -> None:
        self._partial = bytearray()   # the line being received, at most MAX_LINE bytes
        self._cut = 0                 # bytes of that line dropped past MAX_LINE
        self._lineno = 0
        self._queue: deque = deque()  # (line number, bytes, None) to parse, or (n, None, report) in order
        self._draining = False
        self._exit = None             # (code, exit status) once the process ended
        self.stderr_tail: list[str] = []
        self.events: list[dict] = []
        self.bad: list[str] = []      # the reports of the first KEEP_BAD lines that were not events
        self.bad_count = 0            # all of them
        self._why_killed: str | None = None

    @property
    def running(self) -> bool:
        """From start() until finished is emitted (the last events may be parsed after the exit)."""
        return self.proc is not None and not self._ended

    def buffered_bytes(self) -> int:
        """What the client holds of the stream right now: the partial line and the lines to parse."""
        return len(self._partial) + sum(len(raw or b"") for _n, raw, _r in self._queue)

    def command(self, spec: str, args=()) -> list[str]:
        return [sys.executable, "-m", "agent_core.cli", "worker", spec, *args]

    def start(self, spec: str, args=(), program: list[str] | None = None, env: dict | None = None,
              what: str = "Optimize") -> None:
        """Start the worker on `spec` (a program file or a .py); `program` replaces the whole command
        line (tests use it to run a misbehaving stand-in). `env`: variables set for the worker (a value
        of None removes one): how a secret such as the writer's API key reaches it, never argv.
        `what` names the run in the messages ("Optimize was cancelled")."""
        if self.running:
            raise RuntimeError("a worker is already running; cancel it first")
        cmd = program or self.command(spec, args)
        self._more.stop()
        self._reset()
        self._ended = False
        self.what = what
        self.arguments = list(cmd)   # what was launched (never a secret: those go through env)
        p = QProcess(self)
        penv = QProcessEnvironment.systemEnvironment()
        penv.insert("PYTHONUNBUFFERED", "1")
        penv.insert("PYTHONPATH", ROOT + os.pathsep + penv.value("PYTHONPATH", ""))
        for name, value in (env or {}).items():
            penv.remove(name) if value is None else penv.insert(name, value)
        p.setProcessEnvironment(penv)
        p.setWorkingDirectory(ROOT)
        p.readyReadStandardOutput.connect(self._read_stdout)
        p.readyReadStandardError.connect(self._read_stderr)
        p.finished.connect(self._finished)
        p.errorOccurred.connect(self._error)
        self.proc = p
        p.start(cmd[0], cmd[1:])
        self.watchdog.start(int(self.timeout_s * 1000))
        self.started.emit()

    def cancel(self) -> None:
        if self.running:
            self._why_killed = "cancelled"
            self._queue.clear()   # events still to parse no longer matter
            self.proc.kill()

    def wait(self, ms: int = 5000) -> bool:
        return self.proc is None or self.proc.waitForFinished(ms)

    # reading -------------------------------------------------------------------------------------
    def _read_stdout(self) -> None:
        self.watchdog.start(int(self.timeout_s * 1000))
        self._take(bytes(self.proc.readAllStandardOutput()))
        self._drain()

    def _take(self, data: bytes) -> None:
        """Split what arrived into lines (a pipe's worth at a time), cutting each at MAX_LINE."""
        *lines, tail = data.split(b"\n")
        for raw in lines:
            if self._partial or self._cut:   # the end of a line begun in an earlier read
                self._append(raw)
                self._end_line()
            else:
                self._line(raw[:MAX_LINE], max(0, len(raw) - MAX_LINE))
        self._append(tail)

    def _append(self, part: bytes) -> None:
        room = MAX_LINE - len(self._partial)
        if len(part) > room:   # the rest of this line is dropped as it arrives, up to its newline
            self._cut += len(part) - room
            part = part[:room]
        self._partial += part

    def _end_line(self) -> None:
        raw, cut = bytes(self._partial), self._cut
        self._partial, self._cut = bytearray(), 0
        self._line(raw, cut)

    def _line(self, raw: bytes, cut: int) -> None:
        self._lineno += 1
        report = None
        if cut:
            report = self._not_event(f"line {self._lineno}: {len(raw) + cut:,} bytes long, cut at {MAX_LINE:,}: "
                                     f"{raw[:60].decode('utf-8', 'replace')!r}...")
        elif raw.lstrip()[:1] == b"{":
            self._queue.append((self._lineno, raw, None))
        elif raw.strip() and len(self.bad) >= KEEP_BAD:
            self.bad_count += 1
        elif raw.strip():   # not an object, so not an event: only its first bytes are worth parsing
            try:
                parse_event(raw[:BAD_CHARS].decode("utf-8", "replace"), self._lineno)
            except EventError as err:
                report = self._not_event(str(err))
        if report is not None:   # in the queue, so it is shown in its place among the events
            self._queue.append((self._lineno, None, report))

    def _not_event(self, why: str) -> str | None:
        """Count a line that is not an event; the report to show while fewer than KEEP_BAD were."""
        self.bad_count += 1
        if len(self.bad) >= KEEP_BAD:
            return None
        report = f"the worker printed something that is not an event: {why}"
        report = report if len(report) <= BAD_CHARS else report[: BAD_CHARS - 3] + "..."
        self.bad.append(report)
        return report

    def _drain(self) -> None:
        """Parse and emit in order for at most TICK_S; schedule the rest; conclude once the process
        has ended and nothing is left."""
        if self._draining:   # a slot of ours ran the event loop: the outer call carries on
            return
        self._draining = True
        try:
            stop = time.perf_counter() + TICK_S
            while self._queue and time.perf_counter() < stop:
                n, raw, report = self._queue.popleft()
                if report is not None:
                    self.bad_line.emit(report)
                    continue
                try:
                    e = parse_event(raw.decode("utf-8", "replace"), n)
                except EventError as err:
                    report = self._not_event(str(err))
                    if report is not None:
                        self.bad_line.emit(report)
                    continue
                self.events.append(e)
                self.event.emit(e)
        finally:
            self._draining = False
        if self._queue:
            self._more.start()
        elif self._exit is not None and not self._ended:
            self._conclude(*self._exit)

    def _read_stderr(self) -> None:
        self.watchdog.start(int(self.timeout_s * 1000))   # progress on stderr is a sign of life too
        text = bytes(self.proc.readAllStandardError()).decode("utf-8", "replace")
        lines = [ln[:STDERR_CHARS] for ln in text.splitlines()[-STDERR_TAIL:] if ln.strip()]
        self.stderr_tail = (self.stderr_tail + lines)[-STDERR_TAIL:]

    def _timed_out(self) -> None:
        if self.running:
            self._why_killed = "timeout"
            self.proc.kill()

    def _error(self, err) -> None:
        if err == QProcess.FailedToStart:
            self._end("crashed", f"the worker could not start ({self.proc.errorString()})")

    def _finished(self, code: int, status) -> None:
        self.watchdog.stop()
        self._take(bytes(self.proc.readAllStandardOutput()))
        if self._partial or self._cut:
            self._end_line()
        if self._why_killed:   # cancelled or stopped: what it printed last no longer matters
            self._queue.clear()
        self._exit = (code, status)
        self._drain()

    def _conclude(self, code: int, status) -> None:
        dropped = self.bad_count - len(self.bad)
        if dropped:
            self.bad_line.emit(f"and {dropped:,} more lines that were not events")
        last = next((e for e in reversed(self.events) if e["event"] in ("done", "error")), None)
        if self._why_killed == "cancelled":
            self._end("cancelled", f"{self.what} was cancelled; the program is unchanged")
        elif self._why_killed == "timeout":
            self._end("timeout", f"the worker printed nothing for {self.timeout_s:.0f} s and was stopped "
                                 "(it may have hung in a kernel); the program is unchanged")
        elif last is not None and last["event"] == "done":
            self._end(last.get("status", "done"), f"the agent finished ({last.get('status')})")
        elif last is not None and last.get("fatal"):
            self._end("failed", f"the agent stopped: {str(last['message'])[:BAD_CHARS]}")
        else:
            how = ("was killed" if status == QProcess.CrashExit else f"exited with code {code}")
            tail = f": {self.stderr_tail[-1]}" if self.stderr_tail else ""
            self._end("crashed", f"the worker {how} before finishing{tail}; the program is unchanged")

    def _end(self, status: str, message: str) -> None:
        if self._ended:
            return
        self._ended = True
        self.watchdog.stop()
        self.finished.emit(status, message)
