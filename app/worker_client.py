"""The worker client: runs `python -m agent_core.cli worker FILE` in its own process (QProcess) and
turns its stdout into events, one JSON line each (docs/EVENTS.md).

The studio must outlive anything the worker does: a kernel that faults kills the worker, a hang trips
the watchdog (no output for `timeout_s`), a line that is not an event is reported and skipped. Every
run ends with exactly one `finished(status, message)`: status is done, no-gpu, failed (the worker
reported a fatal error), crashed, timeout or cancelled, and message is one line a user reads.
"""
from __future__ import annotations

import os
import sys

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from agent_core.agent.events import EventError, parse_event

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STDERR_TAIL = 40
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
        self._buf = b""
        self._lineno = 0
        self.stderr_tail: list[str] = []
        self.events: list[dict] = []
        self.bad: list[str] = []
        self._why_killed: str | None = None
        self._ended = True
        self.watchdog = QTimer(self, singleShot=True)
        self.watchdog.timeout.connect(self._timed_out)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.state() != QProcess.NotRunning

    def command(self, spec: str, args=()) -> list[str]:
        return [sys.executable, "-m", "agent_core.cli", "worker", spec, *args]

    def start(self, spec: str, args=(), program: list[str] | None = None) -> None:
        """Start the worker on `spec` (a program file or a .py); `program` replaces the whole command
        line (tests use it to run a misbehaving stand-in)."""
        if self.running:
            raise RuntimeError("a worker is already running; cancel it first")
        cmd = program or self.command(spec, args)
        self._buf, self._lineno, self.stderr_tail, self.events, self.bad = b"", 0, [], [], []
        self._why_killed, self._ended = None, False
        p = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONUNBUFFERED", "1")
        env.insert("PYTHONPATH", ROOT + os.pathsep + env.value("PYTHONPATH", ""))
        p.setProcessEnvironment(env)
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
            self.proc.kill()

    def wait(self, ms: int = 5000) -> bool:
        return self.proc is None or self.proc.waitForFinished(ms)

    # reading -------------------------------------------------------------------------------------
    def _read_stdout(self) -> None:
        self.watchdog.start(int(self.timeout_s * 1000))
        self._buf += bytes(self.proc.readAllStandardOutput())
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            self._line(raw)

    def _line(self, raw: bytes) -> None:
        self._lineno += 1
        text = raw.decode("utf-8", "replace")
        if not text.strip():
            return
        try:
            e = parse_event(text, self._lineno)
        except EventError as err:
            self.bad.append(str(err))
            self.bad_line.emit(f"the worker printed something that is not an event: {err}")
            return
        self.events.append(e)
        self.event.emit(e)

    def _read_stderr(self) -> None:
        self.watchdog.start(int(self.timeout_s * 1000))   # progress on stderr is a sign of life too
        text = bytes(self.proc.readAllStandardError()).decode("utf-8", "replace")
        self.stderr_tail = (self.stderr_tail + [ln for ln in text.splitlines() if ln.strip()])[-STDERR_TAIL:]

    def _timed_out(self) -> None:
        if self.running:
            self._why_killed = "timeout"
            self.proc.kill()

    def _error(self, err) -> None:
        if err == QProcess.FailedToStart:
            self._end("crashed", f"the worker could not start ({self.proc.errorString()})")

    def _finished(self, code: int, status) -> None:
        if self._buf:
            self._buf, rest = b"", self._buf
            self._line(rest)
        last = next((e for e in reversed(self.events) if e["event"] in ("done", "error")), None)
        if self._why_killed == "cancelled":
            self._end("cancelled", "Optimize was cancelled; the program is unchanged")
        elif self._why_killed == "timeout":
            self._end("timeout", f"the worker printed nothing for {self.timeout_s:.0f} s and was stopped "
                                 "(it may have hung in a kernel); the program is unchanged")
        elif last is not None and last["event"] == "done":
            self._end(last.get("status", "done"), f"the agent finished ({last.get('status')})")
        elif last is not None and last.get("fatal"):
            self._end("failed", f"the agent stopped: {last['message']}")
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
