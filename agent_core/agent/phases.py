"""Where the agent's own time goes: seconds per phase of one optimize run (bench's `agent_phases`).

A PhaseClock is made current for the run (`with clock.running():`); the loop marks its phases with
`with phase("verify"):`, a no-op when no clock is current (optimize outside bench, the studio's worker)
or on another thread. Time is exclusive: a phase nested in another (a tuning trial's verification)
counts in the inner one only, and time in no marked phase is `other`, so the phases add up to the
run's wall time. Where an event already carries the seconds its step took (plan, codegen, compile),
the clock takes that figure from the event (on_event, the emitter's callback) instead of timing the
step again; only events emitted on the clock's own thread count, so compiles run in a pool cannot add
up to more than the wall time they overlap.

Phases listed in EXCLUDED are timed but are not the agent's time: torch's baselines, and `gpu_wait`,
the time spent blocked on the GPU lock of a `bench --jobs N` run while another problem measures or
verifies (profile.timing), which an optimize run alone never spends.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
import time

# every phase a record may name, in pipeline order; docs/OPTIMIZE.md says what each covers
PHASES = ("import", "rewrite", "plan", "precision", "generate", "compile", "load", "verify", "time_regions",
          "tune", "writer", "build", "time_program", "other")
EXCLUDED = ("baselines", "gpu_wait")
EVENT_PHASES = {"plan": "plan", "codegen": "generate", "compile": "compile"}   # events with `seconds`

_current: contextvars.ContextVar["PhaseClock | None"] = contextvars.ContextVar("stitchcuda_phase_clock",
                                                                                default=None)


class PhaseClock:
    def __init__(self, clock=time.perf_counter):
        self._clock = clock
        self._thread = threading.get_ident()
        self._stack: list[list] = []          # [name, start, seconds attributed to phases inside it]
        self.totals: dict[str, float] = {}
        self.wall = 0.0

    @contextlib.contextmanager
    def running(self):
        """The run itself: the outermost frame (its own time is `other`), made current for phase()."""
        token = _current.set(self)
        t0 = self._clock()
        try:
            with self.phase("other"):
                yield self
        finally:
            self.wall += self._clock() - t0
            _current.reset(token)

    def seconds_in(self, name: str) -> float:
        """Seconds spent in phase `name` so far, one still open included (a wait the caller is in)."""
        now = self._clock()
        return self.totals.get(name, 0.0) + sum(max(0.0, now - f[1] - f[2]) for f in self._stack if f[0] == name)

    @contextlib.contextmanager
    def phase(self, name: str):
        if name not in PHASES and name not in EXCLUDED:
            raise ValueError(f"unknown phase {name!r} (known: {', '.join(PHASES + EXCLUDED)})")
        frame = [name, self._clock(), 0.0, {}]   # name, start, seconds inside it, seconds add()ed to it
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            elapsed = self._clock() - frame[1]
            self._add(name, max(0.0, elapsed - frame[2]))
            self._clip(frame, frame[2] - elapsed)
            if self._stack:
                self._stack[-1][2] += elapsed

    def _clip(self, frame, excess: float) -> None:
        """An event's seconds can exceed the wall time they were reported in (a compile that ran in a
        pool while this thread waited less): the excess comes off those events' phases, in proportion,
        so the phases still add up to the wall time."""
        added = frame[3]
        total = sum(added.values())
        if excess <= 0 or total <= 0:
            return
        for name, secs in added.items():
            self.totals[name] -= min(secs, excess * secs / total)

    def add(self, name: str, seconds: float) -> None:
        """Seconds measured elsewhere (an event's `seconds`), taken out of the enclosing phase."""
        seconds = max(0.0, float(seconds))
        self._add(name, seconds)
        if self._stack:
            self._stack[-1][2] += seconds
            self._stack[-1][3][name] = self._stack[-1][3].get(name, 0.0) + seconds

    def _add(self, name: str, seconds: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + seconds

    def on_event(self, e: dict) -> None:
        name = EVENT_PHASES.get(e.get("event"))
        secs = e.get("seconds")
        if name and isinstance(secs, (int, float)) and not isinstance(secs, bool) and \
                threading.get_ident() == self._thread:
            self.add(name, secs)

    @property
    def agent_seconds(self) -> float:
        """The run's wall time less the excluded phases (torch's baselines, waits for other problems)."""
        return max(0.0, self.wall - sum(self.totals.get(n, 0.0) for n in EXCLUDED))

    def phases(self) -> dict[str, float]:
        """Seconds per phase that ran (rounded to ms), excluded ones left out; they add up to agent_seconds
        up to rounding."""
        return {n: round(self.totals[n], 3) for n in PHASES if n in self.totals}


def phase(name: str):
    """The current clock's phase, or nothing when no clock runs on this thread."""
    clock = _current.get()
    if clock is None or threading.get_ident() != clock._thread:
        return contextlib.nullcontext()
    return clock.phase(name)


def phase_clock() -> PhaseClock | None:
    """The clock of the run in progress on this thread, if any (its events feed it via on_event)."""
    return _current.get()
