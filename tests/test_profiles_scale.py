"""Profiles that scale (pytest-qt, offscreen): the profile dock fed a recorded H200 run and a synthetic
40-region one. Timeline labels never overlap and appear as the user zooms in; top-N and slowest-first
views; a legend on every plot; the roofline labels the point under the mouse and spreads coinciding
points; ceiling and axis labels stay inside at the default and a small size; the results summary shows
the run's figures until reset(); the tuning title says "live" only while a run streams; the region
table reads the same status as the hulls and plots; the source view numbers its lines. The dock is
grabbed to PNGs (test-output/screenshots) at its default size with both runs."""
from __future__ import annotations

import itertools
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PySide6.QtCore import QPoint, QPointF, QRectF, Qt
from PySide6.QtGui import QFontMetricsF, QWheelEvent
from PySide6.QtWidgets import QApplication

from agent_core.agent.events import read_events
from agent_core.project_file import load_program
from profiler_view.panel import ProfilePanel
from profiler_view.roofline import spread
from profiler_view.summary import EMPTY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU = os.path.join(ROOT, "tests", "data", "mlp_small_h200")
CPU = os.path.join(ROOT, "tests", "data", "mlp_small_cpu")
SHOTS = os.path.join(ROOT, "test-output", "screenshots")
DEFAULT, SMALL = (1060, 420), (760, 360)   # the dock's size in the studio's layout, and a cramped one

KINDS = ("pointwise", "reduction", "matmul_epilogue", "conv_epilogue", "sibling", "single")


def synthetic_events(n: int = 40) -> list[dict]:
    """A run of `n` regions whose kernel times spread over two orders of magnitude (deterministic),
    with a few identical kernels (they coincide on the roofline) and every fifth region falling back."""
    ev = [{"event": "plan", "regions": n, "unfused_ms": 0.5, "planned_ms": 0.3, "floor_ms": 0.01}]
    ms = [0.002 + 0.0005 * ((i * 37) % 23) + (0.05 if i % 11 == 3 else 0.0) for i in range(n)]
    for i in range(n):
        ev.append({"event": "region-proposed", "region": f"r{i + 1}", "kind": KINDS[i % len(KINDS)],
                   "nodes": [f"n{i}"], "est_before_ms": ms[i] * 1.5, "est_after_ms": ms[i]})
    ev.append({"event": "log", "level": "info", "message": "GPU: test",
               "hardware": {"name": "NVIDIA H200", "copy_bandwidth_gbs": 4200.0}})
    for i in range(n):
        rid = f"r{i + 1}"
        if i % 5 == 4:
            ev.append({"event": "fallback", "region": rid, "reason": f"verification failed on draw 2 ({rid})"})
            continue
        for t in range(3 if i < 8 else 0):
            ev.append({"event": "tune-step", "region": rid, "trial": t, "ok": True, "best": t == 0,
                       "ms": ms[i] * (1 + 0.1 * t), "params": {"block": 128 << t}})
        same = i in (1, 2)   # two identical kernels: one point on the roofline unless spread
        ev.append({"event": "profile", "scope": "region", "region": rid, "kernel": f"k_{rid}",
                   "ms": 0.004 if same else ms[i], "unfused_ms": (0.004 if same else ms[i]) * 1.6,
                   "bound": "memory", "floor_ms": ms[i] / 4, "bytes": 1 << 20, "flops": (1 << 18) if same else (i + 1) << 16,
                   "achieved_gbs": 250.0 if same else 100.0 + i, "achieved_tflops": 0.05})
        ev.append({"event": "log", "level": "info", "region": rid, "status": "fused",
                   "message": f"region {rid}: fused: verified and faster"})
    ev.append({"event": "profile", "scope": "program", "ms": sum(ms) * 0.8, "launches": n + 4})
    ev.append({"event": "profile", "scope": "baseline", "baseline": "eager", "ms": sum(ms) * 2, "ok": True})
    ev.append({"event": "profile", "scope": "baseline", "baseline": "compile_default", "ms": sum(ms) * 1.2, "ok": True})
    ev.append({"event": "done", "status": "done", "regions": n})
    return ev


def recorded(folder: str) -> tuple[list[dict], dict, object]:
    events = [e for e in read_events(open(os.path.join(folder, "events.jsonl"))) if isinstance(e, dict)]
    return events, json.load(open(os.path.join(folder, "profile.json"))), load_program(os.path.join(folder, "program.json"))


def panel_for(qtbot, events, profile=None, program=None, size=DEFAULT, live=False) -> ProfilePanel:
    """A shown panel fed the way the studio feeds it: event by event while live, else replayed
    (folded in, drawn once), then the run's profile.json."""
    p = ProfilePanel()
    qtbot.addWidget(p)
    p.resize(*size)
    p.show()
    qtbot.waitExposed(p)
    for e in events:
        p.apply(e) if live else p.data.apply(e)
    p.redraw()
    if profile is not None:
        p.load_profile(profile, program.regions)
    QApplication.processEvents()
    return p


@pytest.fixture(scope="module")
def h200():
    return recorded(GPU)


def scene_rect(item) -> QRectF:
    return item.mapRectToScene(item.boundingRect())


def label_rects(tl) -> list[QRectF]:
    return [scene_rect(t) for t in tl.visible_labels()]


def test_timeline_labels_fit_their_bars_never_overlap_and_appear_as_the_user_zooms(qtbot):
    p = panel_for(qtbot, synthetic_events(40), live=True)
    tl, vb = p.timeline, p.timeline.plotItem.getViewBox()
    counts = []
    for frac in (1.0, 0.25, 0.06):
        vb.setXRange(0, tl.end * frac, padding=0)
        QApplication.processEvents()
        rects = label_rects(tl)
        for a, b in itertools.combinations(rects, 2):
            assert not a.intersects(b), "two timeline labels overlap"
        view = vb.sceneBoundingRect()
        for r in rects:
            assert view.contains(r)
        counts.append(len(rects))
    assert counts[0] < counts[1] < counts[2], counts
    # every shown label sits inside its own bar
    for t, x, w, y, _texts in tl.labels:
        if t.isVisible():
            bar = QRectF(vb.mapViewToScene(QPointF(x, y + 0.35)), vb.mapViewToScene(QPointF(x + w, y - 0.35)))
            assert bar.normalized().adjusted(-1, -1, 1, 1).contains(scene_rect(t))
    # the wheel zooms the time axis (and never the rows); Reset zoom shows everything again
    (lo, hi), rows = vb.viewRange()
    centre = tl.mapFromScene(vb.sceneBoundingRect().center())
    wheel = QWheelEvent(QPointF(centre), QPointF(tl.mapToGlobal(centre)), QPoint(0, 0), QPoint(0, 240),
                        Qt.NoButton, Qt.NoModifier, Qt.NoScrollPhase, False)
    QApplication.sendEvent(tl.viewport(), wheel)
    QApplication.processEvents()
    (lo2, hi2), rows2 = vb.viewRange()
    assert hi2 - lo2 < (hi - lo) * 0.9 and rows2 == pytest.approx(rows)
    qtbot.mouseClick(p.reset_zoom_btn, Qt.LeftButton)
    (lo3, hi3), _ = vb.viewRange()
    assert lo3 <= 0 and hi3 >= tl.end and len(tl.visible_labels()) == counts[0]


def test_top_ten_slowest_first_shows_ten_bars_slowest_first(qtbot):
    p = panel_for(qtbot, synthetic_events(40))
    p.order.setCurrentText("Slowest first")
    p.top.setCurrentText("Top 10")
    tl = p.timeline
    fused = [(r, box) for r, box in zip(tl.bars.regions, tl.bars.boxes) if box.center().y() < 0.5]
    assert len(fused) == 10
    widths = [box.width() for _, box in fused]
    assert widths == sorted(widths, reverse=True)
    xs = [box.left() for _, box in fused]
    assert xs == sorted(xs)   # laid end to end in that order
    slowest = sorted(p.data.kernels.values(), key=lambda k: -(k.after_ms or 0))[:10]
    assert {r for r, _ in fused} == {k.region for k in slowest}
    assert len(set(p.kernels.bars.regions)) == 10 and p.kernels.names[0] == fused[0][0]
    p.top.setCurrentText("All kernels")
    assert len({r for r in tl.bars.regions}) == 40


def test_every_plot_has_a_legend_under_its_axis_or_names_its_bars(qtbot, h200):
    events, prof, program = h200
    p = panel_for(qtbot, events, prof, program)
    want = {"kernels": {"unfused ops (torch)", "fused kernel (ours)", "memory floor"},
            "timeline": {"unfused ops (torch)", "matmul epilogue"},
            "roofline": {"roof (measured peaks)", "matmul epilogue"},
            "tuning": {"r1", "r2", "best so far"}}
    for name, labels in want.items():
        plot = p.plots[name]
        assert labels <= set(plot.legend_labels()), name
        assert plot.legend.isVisible() and plot.legend.size().height() > 5, name
        assert not scene_rect(plot.legend).intersects(plot.plotItem.getViewBox().sceneBoundingRect()), name
    # the E2E bars carry their names and times themselves: no legend to decode
    assert sorted(t.toPlainText() for t in p.e2e.visible_labels()) == [
        "StitchCUDA 15.8 us", "compile r-o 152.2 us", "torch eager 49.9 us", "torch.compile 227.5 us"]
    assert p.e2e.legend_labels() == []


def test_roofline_spreads_coinciding_points_and_labels_the_one_under_the_mouse(qtbot, h200):
    events, prof, program = h200
    p = panel_for(qtbot, events, prof, program)
    rf = p.roofline
    pts = {pt.data(): rf.mapFromScene(rf.scatter.mapToScene(pt.pos())) for pt in rf.scatter.points()}
    assert set(pts) == {"r1", "r2"}
    # the two recorded kernels achieve nearly the same rate: spread so that each can be hovered
    assert (pts["r1"] - pts["r2"]).manhattanLength() > 12
    for rid, pos in pts.items():
        def hovered(rid=rid, pos=pos):
            # pyqtgraph sends hover events from its own mouse tracking: a loaded machine can drop one
            # move, so the pointer wiggles onto the point again until the label shows (as a user's would)
            qtbot.mouseMove(rf.viewport(), pos + QPoint(2, 0))
            qtbot.mouseMove(rf.viewport(), pos)
            return rf.hover_text().startswith(f"{rid} · matmul epilogue · mlp_small_{rid}\n")
        qtbot.waitUntil(hovered, timeout=10_000)
        assert "GB/s" in rf.hover_text()
        assert rf.plotItem.getViewBox().sceneBoundingRect().contains(scene_rect(rf.hover))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3), st.floats(-3, 5)), max_size=12))
def test_spread_is_deterministic_and_separates_coinciding_points(pts):
    out = spread(pts, 6.0, 8.0)
    assert out == spread(pts, 6.0, 8.0) and len(out) == len(pts)
    for (a, moved_a), (b, moved_b) in itertools.combinations(zip(pts, out), 2):
        if a == b:   # the very same point twice ends up in two places
            assert moved_a != moved_b


def assert_apart_and_inside(rects: list[QRectF], box: QRectF, what: str) -> None:
    for a, b in itertools.combinations(rects, 2):
        assert not a.intersects(b), (what, a, b)
    for r in rects:
        assert box.contains(r), (what, r, box)


@pytest.mark.parametrize("size", [DEFAULT, SMALL], ids=["default", "small"])
@pytest.mark.parametrize("run", ["h200", "cpu", "40 regions"])
def test_nothing_is_clipped_or_overlaps(qtbot, h200, size, run):
    if run == "h200":
        p = panel_for(qtbot, *h200, size=size)
    elif run == "cpu":
        p = panel_for(qtbot, *recorded(CPU), size=size)
    else:
        p = panel_for(qtbot, synthetic_events(40), size=size, live=True)
    rf = p.roofline
    view = rf.plotItem.getViewBox().sceneBoundingRect()
    for t in rf.ceilings:
        assert view.contains(scene_rect(t)), (t.toPlainText(), scene_rect(t), view)
    # the note over the plots is whole: on one line where it fits, else wrapped onto more
    note = p.note
    assert note.fontMetrics().horizontalAdvance(note.text()) <= note.width() or (
        note.wordWrap() and note.heightForWidth(note.width()) <= note.height()), note.text()
    # the E2E bars' labels: each bar's, never on another's, all inside the plot's data area
    e2e = p.e2e
    labels = e2e.visible_labels()
    assert len(labels) == len(e2e.shown_rows()) >= 3, [t.toPlainText() for t in labels]
    assert_apart_and_inside([scene_rect(t) for t in labels], e2e.plotItem.getViewBox().sceneBoundingRect(), "e2e")
    for plot in (p.kernels, p.timeline, p.e2e, p.roofline, p.tuning):
        whole = QRectF(plot.viewport().rect())
        # pyqtgraph's layout stays inside the widget (a long title once widened it past the right edge)
        assert plot.plotItem.sceneBoundingRect().right() <= whole.right() + 0.5, plot.title
        for name in ("left", "bottom"):
            ax = plot.plotItem.getAxis(name)
            if ax.isVisible() and ax.label.isVisible() and ax.label.toPlainText():
                assert whole.contains(scene_rect(ax.label)), (plot.title, name)
        if plot.legend.entries:
            assert whole.contains(scene_rect(plot.legend)), plot.title
        title = plot.plotItem.titleLabel
        assert whole.contains(scene_rect(title.item)), plot.title
        assert not scene_rect(title.item).intersects(plot.plotItem.getViewBox().sceneBoundingRect()), plot.title
        if size == DEFAULT and run == "h200":   # room for every title in full
            assert plot.title_text() == plot.full_title, plot.full_title
        else:   # elided where narrow, the full title in its tooltip
            assert plot.title_text() == plot.full_title or title.toolTip() == plot.full_title
        # the legend's lines are the lines it drew: an entry never wraps onto one more
        fm_line = QFontMetricsF(plot.legend.text.font()).lineSpacing()
        assert plot.legend.size().height() <= plot.legend.max_lines * fm_line + 4, plot.title


def test_summary_shows_the_recorded_run_until_reset(qtbot, h200):
    events, prof, program = h200
    p = panel_for(qtbot, events, prof, program)
    text = p.summary.plain_text()
    for figure in ("15.8 us", "49.9 us, ours 3.17x faster", "227.5 us", "14.43x faster", "152.2 us", "9.66x faster",
                   "NVIDIA H200", "2 fused, 1 library of 3 regions", "5 end to end"):
        assert figure in text, figure
    p.reset()
    assert p.summary.plain_text() == EMPTY
    cpu, cprof, cprog = recorded(CPU)
    p2 = panel_for(qtbot, cpu, cprof, cprog)
    assert "not timed: no GPU" in p2.summary.plain_text()
    assert "2 compiled, 1 library" in p2.summary.plain_text()
    p3 = panel_for(qtbot, synthetic_events(40), live=True)
    assert "Fallback: r5: verification failed on draw 2 (r5)" in p3.summary.plain_text()
    with qtbot.waitSignal(p3.region_clicked) as sig:   # a fallback's region id selects that region
        p3.summary.label.linkActivated.emit("region:r5")
    assert sig.args == ["r5"]


def test_tuning_title_says_live_only_while_a_run_streams(qtbot, h200):
    events, prof, program = h200
    replayed = panel_for(qtbot, events, prof, program)
    assert replayed.tuning.plotItem.titleLabel.text == "Tuning"
    live = panel_for(qtbot, [e for e in events if e["event"] != "done"], live=True)
    assert live.tuning.plotItem.titleLabel.text == "Tuning (live)"
    live.apply(events[-1])   # the done event
    assert live.tuning.plotItem.titleLabel.text == "Tuning"
    cut = panel_for(qtbot, events[:10], live=True)
    cut.finish()   # the worker stopped without a done event
    assert cut.tuning.plotItem.titleLabel.text == "Tuning"


def test_region_table_hulls_and_plots_show_one_status(studio_window):
    from graph_editor.region_item import region_label
    agent = studio_window.agent
    assert agent.open_results(CPU)
    tree = agent.regions.tree
    table = {tree.topLevelItem(i).text(0): tree.topLevelItem(i).text(2) for i in range(tree.topLevelItemCount())}
    assert table == {"r1": "compiled", "r2": "compiled", "r3": "library"}
    for rid, status in table.items():
        assert agent.profiles.data.kernels[rid].status == status
    for rid in ("r1", "r2"):
        assert "compiled" in region_label(agent.overlay.items[rid].region)
    assert agent.open_results(GPU)
    assert [tree.topLevelItem(i).text(2) for i in range(3)] == ["fused", "fused", "library"]


def test_source_view_gutter_numbers_every_line(qtbot):
    from app.source_view import SourceView
    v = SourceView()
    qtbot.addWidget(v)
    v.resize(500, 300)
    v.show()
    qtbot.waitExposed(v)
    ed = v.edit
    ed.setPlainText("\n".join(f"int x{i} = {i};" for i in range(9)))
    narrow = ed.gutter.width()
    assert ed.visible_line_numbers() == list(range(1, 10))
    ed.setPlainText("\n".join(f"int x{i} = {i};" for i in range(150)))
    QApplication.processEvents()
    assert ed.gutter.width() > narrow   # three digits need more room than two
    assert ed.viewportMargins().left() == ed.gutter.width() == ed.gutter_width()
    shown = ed.visible_line_numbers()
    assert shown[0] == 1 and shown == list(range(1, len(shown) + 1)) and len(shown) > 5
    ed.verticalScrollBar().setValue(ed.verticalScrollBar().maximum())
    QApplication.processEvents()
    assert ed.visible_line_numbers()[-1] == 150
    img = ed.gutter.grab().toImage()   # digits are painted: the gutter is not one flat colour
    colours = {img.pixel(x, y) for x in range(0, img.width(), 2) for y in range(0, img.height(), 2)}
    assert len(colours) > 2
    v.show_compile_error("compile error at line 140: expected ';'")
    assert ed.marked_line == 140 and 140 in ed.visible_line_numbers()


def test_profile_dock_screenshots_at_the_default_size(studio_window, h200):
    """The dock as the studio lays it out, with the recorded run and with 40 regions (look at them)."""
    os.makedirs(SHOTS, exist_ok=True)
    agent = studio_window.agent
    assert agent.open_results(GPU)
    QApplication.processEvents()
    dock = studio_window.profile_dock
    assert dock.width() > 600 and dock.height() > 250
    dock.grab().save(os.path.join(SHOTS, "profiles_h200.png"))
    agent.profiles.reset()
    for e in synthetic_events(40):
        agent.profiles.apply(e)
    QApplication.processEvents()
    dock.grab().save(os.path.join(SHOTS, "profiles_40_regions.png"))
    tl = agent.profiles.timeline
    for a, b in itertools.combinations(label_rects(tl), 2):
        assert not a.intersects(b)


def test_a_live_runs_memory_plan_reaches_the_summary(qtbot, h200):
    """The worker's end-to-end profile event carries the memory plan's summary; the results summary
    says it while the run streams."""
    from agent_core.program_runtime.memory_plan import memory_summary
    events, _, _ = h200
    plan = {"predicted_peak_bytes": 3 << 20, "budget_bytes": 2 << 20, "budget": "given",
            "split_tf32": {"n4": {"runs_as": "fp32"}}, "weights_per_call": []}
    e2e = {"event": "profile", "scope": "program", "ms": 0.0158, "launches": 5, "memory": memory_summary(plan)}
    p = panel_for(qtbot, [e for e in events if e["event"] != "done"] + [e2e], live=True)
    assert ("Memory: 3.0 MiB predicted peak, over its 2.0 MiB budget (given); to save memory: "
            "1 split-TF32 call in fp32") in p.summary.plain_text()
