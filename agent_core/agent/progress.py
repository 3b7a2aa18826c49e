"""One short human-readable line per event, for the CLI's progress output."""
from __future__ import annotations

from ..text import first_line, plural


def _us(ms) -> str:
    return "?" if ms is None else (f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms")


def format_event(e: dict) -> str | None:
    """The line to print for event e, or None for events too chatty to print (debug logs)."""
    k = e.get("event")
    if k == "plan":
        return (f"plan: {plural(e['nodes'], 'node')} -> {plural(e['regions'], 'region')}, "
                f"{plural(e['kernels'], 'kernel')} "
                f"(estimated {_us(e.get('unfused_ms'))} unfused, {_us(e.get('planned_ms'))} planned)")
    if k == "region-proposed":
        return f"  {e['region']} {e['kind']}: {plural(len(e['nodes']), 'node')}: {e['reason']}"
    if k == "rewrite":
        return f"rewrite {e['rule']}{'' if e['kept'] else ' (refused)'}: {e['message']}"
    if k == "codegen":
        return f"  {e['region']}: generated {e['kernel']} ({e['kind']}, {e['schedule']})"
    if k == "compile":
        regs = e.get("registers")
        return (f"  {e['region']}: compiled for {e['arch']}" + (" (cached)" if e["cached"] else f" in {e['seconds']:.2f} s")
                + (f", {regs} registers" if regs is not None else "")
                + (f", {e['spill_stores']} B spilled" if e.get("spill_stores") else ""))
    if k == "verify":
        where = e.get("region") or "program"
        return f"  {where}: verify {'ok' if e['ok'] else 'FAILED'} on {plural(e['draws'], 'draw')}" + \
            (f": {e['reason']}" if e.get("reason") else "")
    if k == "tune-step":
        return (f"  {e['region']}: trial {e['trial']} {e['params']}: " +
                (_us(e.get("ms")) + (" (best)" if e.get("best") else "") if e["ok"] else f"rejected ({e.get('reason', '')})"))
    if k == "precision":
        return f"  {e['node']} {e['op']}: {e['chosen']} ({e.get('reason', '')})"
    if k == "profile":
        if e["scope"] == "baseline":
            return f"baseline {e.get('baseline')}: " + (_us(e["ms"]) if e.get("ok") else f"failed: {e.get('error')}")
        if e["scope"] == "program":
            launches = "launches unknown" if e.get("launches") is None else plural(e["launches"], "launch")
            return (f"end to end: {_us(e['ms'])} (floor {_us(e.get('floor_ms'))}, {launches}, "
                    f"{'one CUDA graph' if e.get('cuda_graph') else 'no CUDA graph'})")
        return f"  {e.get('region')}: {_us(e['ms'])} fused vs {_us(e.get('unfused_ms'))} unfused ({e.get('bound')} bound)"
    if k == "fallback":
        return f"  {e['region']}: falls back: {e['reason']}"
    if k.startswith("writer-"):
        return _writer_line(e)
    if k == "error":
        return f"error: {e['message']}"
    if k == "log":
        # the no-GPU line is printed once by the command's summary
        return None if e["level"] == "debug" or e.get("no_gpu") else e["message"]
    if k == "done":
        return f"done ({e['status']})"
    return None


def _writer_line(e: dict) -> str | None:
    """The model-driven writer's events (docs/WRITER.md); streamed text (writer-delta) is not printed."""
    k, where = e["event"], f"  {e['region']}: writer round {e.get('round')}"
    if k == "writer-request":
        remote = " (remote: the region's ops, shapes and our kernel leave this machine)" if e.get("remote") else ""
        return f"{where}: asking {e['model']} at {e.get('endpoint') or '?'}{remote}"
    if k == "writer-reply":
        secs = e.get("seconds")
        return (f"{where}: reply, {plural(e.get('completion_tokens') or 0, 'token')}"
                + (f" in {secs:.1f} s" if secs is not None else "")
                + (f" (cut off: {e['finish_reason']})" if e.get("finish_reason") not in (None, "stop") else ""))
    if k == "writer-verdict":
        if e["ok"]:
            return f"{where}: verified: {first_line(e['reason'])}"
        return f"{where}: rejected ({e['check']}): {first_line(e['reason'])}"
    if k == "writer-done":
        tokens = f" [{plural(e['tokens'], 'token')}]" if e.get("tokens") is not None else ""
        if e["kept"]:
            return f"  {e['region']}: {first_line(e['reason'])}{tokens}"
        return f"  {e['region']}: no model kernel kept: {first_line(e['reason'])}{tokens}"
    return None


class RegionProgress:
    """Regions with an outcome out of those planned, and the time left estimated from the pace of the
    ones done: (t of the last outcome - t when the region loop began) / done, times the regions left.
    Reads the events' own `t`, so a replayed run estimates as the live one did. The end-to-end check,
    timing and baselines after the last region are not in the estimate (nothing measures them early)."""

    def __init__(self):
        self.regions = 0
        self.finished: set[str] = set()
        self._start: float | None = None   # the last event before the first region's work
        self._last: float | None = None    # the latest region outcome

    @property
    def done(self) -> int:
        return len(self.finished)

    def apply(self, e: dict) -> None:
        k, t, rid = e.get("event"), e.get("t"), e.get("region")
        if k == "plan":
            self.regions, self.finished, self._start, self._last = e.get("regions") or 0, set(), t, None
        elif (k == "log" and e.get("status")) or k == "fallback":
            if rid is not None:
                self.finished.add(rid)     # a writer's second outcome for a region is not a new region
            self._last = t
        elif not self.finished and (rid is None or k == "region-proposed"):
            self._start = t                # planning, proposals, the GPU snapshot, precision choices

    def eta_s(self) -> float | None:
        """Seconds left for the regions not done, None before the first outcome or after the last."""
        if not self.finished or self.done >= self.regions or self._start is None or self._last is None:
            return None
        return (self._last - self._start) / self.done * (self.regions - self.done)

    def text(self) -> str:
        """'3/10 regions' and, while an estimate exists, 'about 12 s left'."""
        if not self.regions:
            return ""
        eta = self.eta_s()
        return f"{min(self.done, self.regions)}/{plural(self.regions, 'region')}" + \
            ("" if eta is None else f", {eta_words(eta)}")


def eta_words(seconds: float) -> str:
    if seconds < 1:
        return "under 1 s left"
    if seconds < 90:
        return f"about {seconds:.0f} s left"
    return f"about {seconds / 60:.0f} min left"
