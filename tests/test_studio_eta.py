"""The studio's progress while the agent runs (pytest-qt, offscreen, CPU): Agent > Optimize starts a real
worker on a three-region program; once a region is done and others are left, the progress bar and the
status line say how long the rest should take, from the pace of the regions done (the events' own
times), and the estimate goes away with the last region."""
from __future__ import annotations

import os

import pytest

from agent_core.agent.progress import eta_words
from agent_core.project_file import load_program
from app.document import Document
from tests.test_studio_agent_worker import FAST, ROOT   # its worker flags; it sets Qt's test mode too

THREE_REGIONS = os.path.join(ROOT, "tests", "data", "mlp_small_cpu", "program.json")


@pytest.fixture
def window(studio_window):
    """The studio on a three-region program with no regions yet, its worker on the CPU (FAST)."""
    program = load_program(THREE_REGIONS)
    program.regions = []
    studio_window.agent.worker_args = FAST
    studio_window.set_document(Document(program))
    studio_window._layout_if_needed(studio_window.document, True)
    return studio_window


def is_outcome(e: dict) -> bool:
    return (e["event"] == "log" and bool(e.get("status"))) or e["event"] == "fallback"


def test_optimize_shows_the_time_left_from_the_pace_of_the_regions_done(window, qtbot):
    agent = window.agent
    seen, shown, fits = [], [], []

    def on_event(e):   # connected after the studio's own handler: the bar shows e already
        seen.append(e)
        shown.append((e, agent.bar.format(), window.status_label.text(), agent.progress.eta_s()))
        fits.append(agent.bar.width() >= agent.bar.fontMetrics().horizontalAdvance(agent.bar.format()))
    agent.worker.event.connect(on_event)
    with qtbot.waitSignal(agent.worker.finished, timeout=180_000) as done:
        agent.act["optimize"].trigger()
    assert done.args[0] == "no-gpu", done.args[1]
    planned = next(e for e in seen if e["event"] == "plan")["regions"]
    assert planned == 3
    # the region loop starts after the last proposal; each outcome sets the pace
    start = [e["t"] for e in seen if e["event"] == "region-proposed"][-1]
    outcomes = [e for e in seen if is_outcome(e)]
    assert len({e["region"] for e in outcomes}) == planned
    for i, first in enumerate(outcomes[:-1], 1):
        e, bar, status, eta = next(s for s in shown if s[0] is first)
        expected = (first["t"] - start) / i * (planned - i)
        assert eta == pytest.approx(expected, abs=1e-6)
        assert bar == f"{i}/3 regions, {eta_words(expected)}", bar
        assert eta_words(expected) in status, status
    assert all(fits)                     # the bar is as wide as its text (160 px clipped "about 2 s left")
    before = next(s for s in shown if s[0]["event"] == "region-proposed")
    assert before[1] in ("", "%p%") or "left" not in before[1]      # no estimate before a region is done
    last = next(s for s in shown if s[0] is outcomes[-1])
    assert last[1] == "3/3 regions" and last[3] is None              # nothing left to estimate
    assert not agent.bar.isVisible()
