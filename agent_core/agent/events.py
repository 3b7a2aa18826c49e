"""The agent's event stream: versioned JSON lines, one event per line.

Every line is an object {"v": 1, "event": <name>, "t": <seconds since the run started>, ...fields}.
The CLI prints them as progress, `stitchcuda worker` writes them to stdout for the studio, and
optimize writes them to OUTDIR/events.jsonl. docs/EVENTS.md documents every event and field.
read_events() validates a stream and names the line and the problem of anything that is not an event.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from ..errors import StitchError

VERSION = 1

# event name -> fields it must carry (besides v, event, t); extra fields are allowed
SCHEMA: dict[str, tuple[str, ...]] = {
    "plan": ("program", "nodes", "regions", "kernels"),
    "region-proposed": ("region", "kind", "nodes", "reason"),
    "rewrite": ("rule", "node", "message", "kept"),
    "codegen": ("region", "kernel", "kind", "schedule"),
    "compile": ("region", "kernel", "arch", "seconds", "cached"),
    "verify": ("scope", "ok", "draws"),
    "profile": ("scope", "ms"),
    "tune-step": ("region", "trial", "params", "ok"),
    "precision": ("node", "op", "chosen"),
    "fallback": ("region", "reason"),
    # the model-driven kernel writer (agent_core.writer, docs/WRITER.md), only with a writer configured
    "writer-request": ("region", "round", "model"),
    "writer-delta": ("region", "round", "text"),
    "writer-reply": ("region", "round", "text"),
    "writer-verdict": ("region", "round", "ok", "check", "reason"),
    "writer-done": ("region", "kept", "reason"),
    "bench-progress": ("done", "total", "failed"),     # bench --ray: one per finished problem
    "done": ("status",),
    "error": ("message",),
    "log": ("level", "message"),
}
EVENTS = tuple(SCHEMA)
LEVELS = ("debug", "info", "warning")


class EventError(StitchError):
    """A line of an event stream is not a valid event; the message names the line and the problem."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


def _plain(x):
    """JSON-safe copy: non-finite floats become null (JSON has no NaN), tuples lists, keys strings."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if hasattr(x, "item"):  # numpy / torch scalars
        return _plain(x.item())
    return str(x)


class EventEmitter:
    """Writes events to a file object (one flushed line each) and/or a callback taking the dict.

    emit("verify", scope="region", region="r1", ok=True, draws=5) checks the event name and its
    required fields at once, so a malformed event is a bug found where it is made.
    """

    def __init__(self, sink=None, callback: Callable[[dict], None] | None = None, *, clock=time.perf_counter):
        self.sink = sink
        self.callback = callback
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        self.count = 0
        self.events: list[dict] = []   # everything emitted, for the caller's summary

    def emit(self, event: str, **fields) -> dict:
        if event not in SCHEMA:
            raise EventError(f"unknown event '{event}' (known: {', '.join(EVENTS)})")
        missing = [k for k in SCHEMA[event] if k not in fields]
        if missing:
            raise EventError(f"event '{event}' is missing {', '.join(missing)}")
        rec = {"v": VERSION, "event": event, "t": round(self._clock() - self._t0, 6), **_plain(fields)}
        with self._lock:
            self.count += 1
            self.events.append(rec)
            if self.sink is not None:
                self.sink.write(json.dumps(rec, separators=(",", ":")) + "\n")
                self.sink.flush()
            if self.callback is not None:
                self.callback(rec)
        return rec

    def log(self, message: str, level: str = "info", **fields) -> dict:
        return self.emit("log", level=level, message=message, **fields)


def parse_event(line: str, lineno: int | None = None) -> dict:
    """One line -> the event dict, or EventError saying precisely what is wrong with it."""
    where = f"line {lineno}: " if lineno is not None else ""
    text = line.strip()
    if not text:
        raise EventError(f"{where}empty line", lineno)
    try:
        rec = json.loads(text)
    except ValueError as e:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise EventError(f"{where}not JSON ({e.msg} at column {e.colno}): {shown!r}", lineno) from None
    if not isinstance(rec, dict):
        raise EventError(f"{where}an event must be a JSON object, got {type(rec).__name__}", lineno)
    v = rec.get("v")
    if v != VERSION:
        raise EventError(f"{where}event stream version {v!r}, this reader understands {VERSION}", lineno)
    name = rec.get("event")
    if name not in SCHEMA:
        raise EventError(f"{where}unknown event {name!r} (known: {', '.join(EVENTS)})", lineno)
    t = rec.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
        raise EventError(f"{where}'{name}' event has no valid time 't' (seconds since start): {t!r}", lineno)
    missing = [k for k in SCHEMA[name] if k not in rec]
    if missing:
        raise EventError(f"{where}'{name}' event is missing {', '.join(missing)}", lineno)
    if name == "log" and rec["level"] not in LEVELS:
        raise EventError(f"{where}log level {rec['level']!r} is not one of {', '.join(LEVELS)}", lineno)
    return rec


@dataclass
class BadLine:
    line: int
    text: str
    error: str


def read_events(lines: Iterable[str], *, strict: bool = True, bad: list | None = None) -> Iterator[dict]:
    """Yield the events of a stream (a file object, a list of lines). strict: the first bad line
    raises EventError; otherwise bad lines are skipped and, when `bad` is a list, recorded there as
    BadLine entries (the studio shows them instead of dying on a worker's stray print)."""
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield parse_event(line, i)
        except EventError as e:
            if strict:
                raise
            if bad is not None:
                bad.append(BadLine(i, line.rstrip("\n"), str(e)))
