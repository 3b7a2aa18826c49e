"""Timing that stops early when the answer is already clear: a candidate (a tuning variant, a library
call's precision form) that is clearly slower than the best one timed so far.

The choice made from a timing is "the fastest, unless a more accurate form is within 5% of it"
(agent.precision.pick) or "the fastest variant" (the loop's tuning). A candidate whose *fastest* of
QUICK_TRIALS replays is already more than CLEARLY_SLOWER times the best median cannot be chosen by
either rule whatever the remaining trials say, so those trials are not run: its quick median is
recorded, marked as such. Anything closer is timed with the full count, as before.
"""
from __future__ import annotations

QUICK_TRIALS = 5
CLEARLY_SLOWER = 1.25


def time_candidate(fn, *, trials: int, best_ms: float | None = None, quick: int = QUICK_TRIALS,
                   margin: float = CLEARLY_SLOWER):
    """(Timing, stopped_early) of fn replayed in a CUDA graph (profile.timing.time_in_graph).
    best_ms: the best median so far (None: time it in full)."""
    from ..profile import timing
    if best_ms is None or trials <= quick:
        return timing.time_in_graph(fn, trials=trials)[0], False
    t = timing.time_in_graph(fn, trials=quick)[0]
    if t.min_ms > best_ms * margin:
        return t, True
    rest = timing.time_in_graph(fn, trials=trials - quick)[0]     # the quick trials count among the full ones
    return timing.summarize(list(t.samples) + list(rest.samples)), False
