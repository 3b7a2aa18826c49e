"""The agent in the studio, replayed (pytest-qt, offscreen): a results folder opens with its regions
on the canvas, their reasons, their source and every profile plot filled; the live tuning plot grows
per tune-step; clicking a hull, a bar or a log entry selects the region; region edits undo; Plan works
without a GPU; compile errors are marked at their line. Screenshots in both themes.

Data (tests/data): mlp_small_h200 was recorded on the H200 (`stitchcuda optimize tests/data/mlp_small.py
-o mlp_small_h200 --compile-budget 40`, 2026-11-30); mlp_small_cpu and residual_add_layer_norm_cpu are
real `stitchcuda optimize --cpu` recordings. Counts are read from the recording, not restated here.
"""
from __future__ import annotations

import os

import pytest
from PySide6.QtCore import QPointF, QRectF, QSizeF, QStandardPaths, Qt
from PySide6.QtWidgets import QApplication

QStandardPaths.setTestModeEnabled(True)

from agent_core.agent.events import read_events  # noqa: E402
from agent_core.project_file import load_program  # noqa: E402
from app.decision_log import is_problem  # noqa: E402
from tests.studio import Answers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
GPU = os.path.join(DATA, "mlp_small_h200")
CPU = os.path.join(DATA, "residual_add_layer_norm_cpu")
SHOTS = os.path.join(ROOT, "test-output", "screenshots")
RECORDED = list(read_events(open(os.path.join(GPU, "events.jsonl"))))
TUNE_STEPS = [e for e in RECORDED if e["event"] == "tune-step"]


@pytest.fixture
def window(studio_window):
    return studio_window


def click_scene(window, scene_pos: QPointF, qtbot):
    vp = window.view.viewport()
    qtbot.mouseClick(vp, Qt.LeftButton, pos=window.view.mapFromScene(scene_pos))


def test_results_replay_fills_canvas_source_and_every_plot(window, qtbot):
    agent = window.agent
    assert agent.open_results(GPU)
    program = window.document.program
    ov = agent.overlay
    assert sorted(ov.items) == ["r1", "r2", "r3"]
    # hulls behind their nodes, each around its members, with the agent's reason in the tooltip
    for rid, item in ov.items.items():
        region = next(r for r in program.regions if r.id == rid)
        assert item.zValue() < 0 and item.isVisible()
        for nid in region.nodes:
            assert item.path.boundingRect().contains(window.scene.nodes[nid].sceneBoundingRect())
        assert region.reason and region.reason[:40] in item.tooltip_text()
    assert "measured" in ov.items["r1"].tooltip_text().lower()
    # clicking a hull selects the region and shows its CUDA
    item = ov.items["r2"]
    click_scene(window, item.label_rect().center() + QPointF(-item.label_rect().width() / 2 + 30, 0), qtbot)
    assert agent.current == "r2"
    assert "mlp_small_r2" in agent.source.edit.toPlainText()
    assert "relu" in agent.source.title.text()
    assert agent.regions.selected_ids() == ["r2"]
    # every plot has data
    pv = agent.profiles
    assert pv.kernels.bars is not None and len(pv.kernels.bars.regions) == 6   # before + after, 3 regions
    assert [k for k, _ in pv.e2e.rows()] == ["eager", "compile_default", "compile_reduce-overhead", "ours"]
    assert pv.timeline.bars is not None and len(pv.timeline.bars.regions) == 6
    assert pv.roofline.scatter is not None and len(pv.roofline.scatter.points()) == 2
    assert pv.tuning.point_count() == len(TUNE_STEPS) > 0
    assert "H200" in pv.note.text()
    # the decision log lists every event; the Problems filter keeps exactly the recording's problems
    assert agent.log.tree.topLevelItemCount() >= len(RECORDED) - 1
    agent.log.kind.setCurrentText("Problems")
    assert agent.log.visible_count() == sum(1 for e in RECORDED if is_problem(e))
    agent.log.kind.setCurrentText("All steps")


def test_live_tuning_plot_grows_per_tune_step(window):
    agent = window.agent
    window.set_document(window.document.__class__(load_program(os.path.join(GPU, "program.json"))))
    events = list(read_events(open(os.path.join(GPU, "events.jsonl"))))
    agent.profiles.reset()
    seen = 0
    for e in events:
        agent.on_event(e)
        if e["event"] == "tune-step":
            seen += 1
        assert agent.profiles.tuning.point_count() == seen
    assert seen == len(TUNE_STEPS)
    ours = next(e["ms"] for e in events if e["event"] == "profile" and e.get("scope") == "program")
    assert agent.profiles.data.end_to_end["ours"] == pytest.approx(ours)


def test_clicking_a_bar_or_a_log_entry_selects_the_region(window, qtbot):
    agent = window.agent
    agent.open_results(GPU)
    window.profile_dock.raise_()
    QApplication.processEvents()
    plot = agent.profiles.kernels
    sp = plot.bar_center("r1")
    assert sp is not None
    qtbot.mouseClick(plot.viewport(), Qt.LeftButton, pos=plot.mapFromScene(sp))
    assert agent.current == "r1"
    assert "mlp_small_r1" in agent.source.edit.toPlainText()
    tl = agent.profiles.timeline
    i = max(j for j, r in enumerate(tl.bars.regions) if r == "r2")
    qtbot.mouseClick(tl.viewport(), Qt.LeftButton,
                     pos=tl.mapFromScene(tl.bars.mapToScene(tl.bars.boxes[i].center())))
    assert agent.current == "r2"
    agent.select_region(None)
    log = agent.log.tree
    row = next(i for i in range(log.topLevelItemCount()) if log.topLevelItem(i).text(2) == "r3")
    agent.log_dock.raise_()
    log.scrollToItem(log.topLevelItem(row))
    QApplication.processEvents()
    rect = log.visualItemRect(log.topLevelItem(row))
    qtbot.mouseClick(log.viewport(), Qt.LeftButton, pos=rect.center())
    assert agent.current == "r3"


def test_region_edits_from_the_list_are_undoable(window, qtbot):
    agent = window.agent
    agent.open_results(CPU)
    program, stack = window.document.program, window.document.stack
    lst = agent.regions
    before = [r.to_dict() for r in program.regions]
    lst.select("r1")
    lst.reject()
    assert program.regions[0].status == "rejected" and not agent.overlay.items
    stack.undo()
    assert [r.to_dict() for r in program.regions] == before and "r1" in agent.overlay.items
    lst.select("r1")
    lst.lock()
    assert program.regions[0].status == "locked"
    assert "locked" in agent.overlay.items["r1"].tooltip_text()
    lst.lock()
    assert program.regions[0].status == "accepted"
    # split needs canvas nodes of the region; the refusal says what to do
    msgs = []
    lst.message.connect(lambda text, err: msgs.append((text, err)))
    window.scene.select_nodes([])
    lst.split()
    assert msgs[-1][1] and "Select some" in msgs[-1][0]
    first = program.regions[0].nodes[0]
    window.scene.select_nodes([first])
    lst.split()
    assert len(program.regions) == 2 and len(agent.overlay.items) == 2
    lst.tree.clearSelection()
    for i in range(lst.tree.topLevelItemCount()):
        lst.tree.topLevelItem(i).setSelected(True)
    lst.merge()
    assert len(program.regions) == 1
    while stack.canUndo():
        stack.undo()
    assert [r.to_dict() for r in program.regions] == before
    # a region collapses into one node; its hull then wraps that node
    lst.select("r1")
    lst.collapse()
    assert len(window.scene.groups) == 1 and set(window.scene.groups[0].members) == set(program.regions[0].nodes)
    # frames follow the scene's coalesced `changed` signal: the hull moves on the next turn of the loop
    g = window.scene.groups[0]
    body = QRectF(g.pos(), QSizeF(*g.size()))
    qtbot.waitUntil(lambda: agent.overlay.items["r1"].path.boundingRect().contains(body), timeout=3000)
    window.scene.expand(window.scene.groups[0])
    # drawing over nodes that already belong to a region is refused with the model's reason
    window.scene.select_nodes(program.regions[0].nodes)
    lst.draw()
    assert msgs[-1][1] and "already belong" in msgs[-1][0]


def test_plan_without_gpu_shows_regions_and_estimates(window):
    agent = window.agent
    program = load_program(os.path.join(GPU, "program.json"))
    program.regions = []
    window.set_document(window.document.__class__(program))
    window._layout_if_needed(window.document, True)
    agent.plan()
    assert len(agent.overlay.items) == 3
    assert all(item.isVisible() for item in agent.overlay.items.values())
    assert "est." in agent.overlay.items["r1"].tooltip_text() or "Estimate" in agent.overlay.items["r1"].tooltip_text()
    assert "estimates" in agent.profiles.note.text()
    assert len(agent.profiles.kernels.bars.regions) == 6
    assert agent.profiles.e2e.rows() == []   # nothing measured: the plot shows the planner's estimate
    agent.select_region("r1")   # a planned region has no stored source: generated on demand
    assert "__global__" in agent.source.edit.toPlainText()
    assert "on demand" in agent.source.status.text()
    window.document.stack.undo()
    assert not program.regions and not agent.overlay.items


def test_diff_against_a_tuning_variant(window):
    agent = window.agent
    agent.open_results(GPU)
    agent.select_region("r1")
    sv = agent.source
    trials = [e for e in TUNE_STEPS if e["region"] == "r1" and e.get("ms") and not e.get("best")]
    assert sv.variant.isVisible() and sv.variant.count() == 1 + len(trials)   # this kernel + the others measured
    assert f"{trials[0]['ms'] * 1e3:.1f} us" in sv.variant.itemText(1)
    sv.variant.setCurrentIndex(1)
    text = sv.edit.toPlainText()
    assert text.startswith("--- this kernel") and "\n+" in text and "\n-" in text
    assert sv.edit.extraSelections()
    sv.variant.setCurrentIndex(0)
    assert "__global__" in sv.edit.toPlainText() and not sv.edit.toPlainText().startswith("---")


def test_compile_errors_are_marked_at_their_line(window):
    sv = window.agent.source
    window.agent.open_results(CPU)
    window.agent.select_region("r1")
    sv.show_compile_error("region r1: CUDA compile error at line 12: expected a ';'")
    sels = sv.edit.extraSelections()
    assert len(sels) == 1 and sels[0].cursor.blockNumber() == 11
    assert "line 12" in sv.status.text()
    # a real NVRTC error on a broken kernel lands on the line it names
    sv.edit.setPlainText('extern "C" __global__ void k(float* x) {\n  x[0] = 1.0f\n}\n')
    assert not sv.compile_shown()
    sels = sv.edit.extraSelections()
    assert len(sels) == 1 and sels[0].cursor.blockNumber() in (1, 2)


def test_screenshots_with_regions_source_and_profiles(window, qtbot):
    os.makedirs(SHOTS, exist_ok=True)
    for theme in ("dark", "light"):
        if window.theme != theme:
            window.toggle_theme()
        window.agent.open_results(GPU)
        window.agent.select_region("r1")
        QApplication.processEvents()
        window.view.fit_all()   # after the docks took their room
        QApplication.processEvents()
        path = os.path.join(SHOTS, f"studio_agent_{theme}.png")
        window.screenshot(path)
        assert os.path.getsize(path) > 20_000


def _file_action(window, text):
    file_menu = window.menuBar().actions()[0].menu()
    return next(a for a in file_menu.actions() if a.text().replace("&", "").startswith(text))


def test_export_cuda_project_from_the_file_menu(window, qtbot, tmp_path):
    program = load_program(os.path.join(DATA, "mlp_small_cpu", "program.json"))   # tests/data/mlp_small.py
    program.regions = []   # the export plans it on its own copy; the document must keep no regions
    window.set_document(window.document.__class__(program))
    before = window.document.stack.count()
    out = tmp_path / "mlp_cuda"
    window.ask = Answers(folder=str(out))
    with qtbot.waitSignal(window.agent.exported, timeout=60000) as sig:
        _file_action(window, "Export CUDA project").trigger()
        assert "Exporting" in window.status_label.text() and window.agent.bar.isVisible()
    assert sig.args == [str(out), True]
    assert (out / "CMakeLists.txt").is_file() and (out / "manifest.json").is_file()
    assert list((out / "kernels").glob("*.cu"))
    assert "Exported" in window.status_label.text() and not window.agent.bar.isVisible()
    assert not program.regions and window.document.stack.count() == before and not window.document.dirty
    # a folder that is not empty is refused before anything runs
    window.ask = Answers(folder=str(out))
    assert not window.agent.export_dialog()
    assert "not empty" in window.refusal_label.text()


def test_refused_export_shows_its_reason_and_leaves_the_document(window, qtbot, tmp_path):
    from agent_core.importers import import_file
    model = tmp_path / "sorted_rows.py"  # torch.sort has no library op: an opaque node, no CUDA path
    model.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                     "        return torch.sort(x, dim=1).values\n\n"
                     "def get_inputs():\n    return [torch.randn(4, 33)]\n\ndef get_init_inputs():\n    return []\n")
    p = import_file(str(model))
    window.set_document(window.document.__class__(p))
    window.ask = Answers(folder=str(tmp_path / "sorted_cuda"))
    with qtbot.waitSignal(window.agent.exported, timeout=60000) as sig:
        _file_action(window, "Export CUDA project").trigger()
    assert sig.args[1] is False
    reason = window.refusal_label.text()
    assert reason.startswith("Export refused") and "opaque" in reason and "\n" not in reason
    assert not p.regions and window.document.stack.count() == 0 and not window.document.dirty


def test_region_collapse_is_one_undo_step(window):
    agent = window.agent
    agent.open_results(GPU)
    stack = window.document.stack
    n = stack.count()
    agent.regions.select("r1")
    agent.regions.collapse()
    assert len(window.scene.groups) == 1 and stack.count() == n + 1
    window.act["undo"].trigger()
    assert not window.scene.groups and window.document.program.metadata["editor"]["collapsed"] == []
    window.act["redo"].trigger()
    assert len(window.scene.groups) == 1


def test_live_hulls_grow_and_relabel_from_the_recorded_run(window):
    from graph_editor.region_item import region_label
    program = load_program(os.path.join(GPU, "program.json"))
    program.regions = []                       # as a fresh document before Optimize
    window.set_document(window.document.__class__(program))
    agent = window.agent
    agent._start_live()
    counts = []
    for e in RECORDED:
        agent.on_event(e)
        counts.append(len(agent.live.items))
    proposals = [e["region"] for e in RECORDED if e["event"] == "region-proposed"]
    assert max(counts) == len(proposals) == 3 and sorted(agent.live.items) == sorted(proposals)
    assert counts == sorted(counts)           # hulls only ever appear during a run
    fused = [e["region"] for e in RECORDED if e["event"] == "log" and e.get("status") == "fused"]
    for rid in fused:
        live = agent.live.live[rid]
        assert "measured" in region_label(live) and live.measured_ms
        assert live.reason[:30] in agent.live.items[rid].tooltip_text()
    agent._end_live()
    assert agent.live is None and not program.regions     # nothing was stored in the document


def test_a_live_hull_that_lost_gives_way_to_its_parts(window):
    """A region that verified but lost is tried as its parts (agent/split_lost.py): their proposals
    name it in split_from, and its hull gives way to theirs."""
    program = load_program(os.path.join(GPU, "program.json"))
    program.regions = []
    window.set_document(window.document.__class__(program))
    agent = window.agent
    agent._start_live()
    proposal = next(e for e in RECORDED if e["event"] == "region-proposed" and len(e["nodes"]) == 2)
    rid, (a, b) = proposal["region"], proposal["nodes"]
    agent.on_event(proposal)
    agent.on_event({"event": "fallback", "region": rid, "reason": "correct but not faster than its unfused ops"})
    assert sorted(agent.live.items) == [rid]
    for k, node in enumerate((a, b), 1):
        agent.on_event({"event": "region-proposed", "region": f"{rid}_{k}", "kind": "single", "nodes": [node],
                        "reason": f"Split from {rid}.", "split_from": rid})
    assert sorted(agent.live.items) == [f"{rid}_1", f"{rid}_2"] and rid not in agent.live.live
    hulls = [i for i in window.scene.items() if type(i).__name__ == "LiveRegionItem"]
    assert sorted(i.region_id for i in hulls) == [f"{rid}_1", f"{rid}_2"]
    os.makedirs(SHOTS, exist_ok=True)
    window.view.fit_all()
    QApplication.processEvents()
    window.screenshot(os.path.join(SHOTS, "studio_live_split.png"))
    agent._end_live()


def test_an_epilogue_region_says_it_runs_as_the_library_call_and_a_kernel(window):
    assert window.open_path(os.path.join(ROOT, "resources", "examples", "gemm_scale_sigmoid.py"), layout_sync=True)
    window.agent.act["plan"].trigger()
    program = window.document.program
    epilogue = next(r for r in program.regions if r.kind == "matmul_epilogue")
    tip = window.agent.overlay.items[epilogue.id].tooltip_text()
    assert "planned (2 launches)" in tip and "cuBLAS + epilogue kernel" in tip, tip


def test_a_pooling_region_is_planned_listed_and_drawn_in_its_own_hue(window):
    from agent_core.regions import KIND_HUES, KINDS
    from graph_editor.region_list import RegionList
    assert set(KIND_HUES) <= set(KINDS)                           # one table for canvas and profiles
    assert window.open_path(os.path.join(ROOT, "resources", "examples", "conv_relu_maxpool.py"), layout_sync=True)
    window.agent.act["plan"].trigger()                            # Graph > Plan regions
    program = window.document.program
    pooled = [r for r in program.regions if r.kind == "pooling"]
    assert [[program.nodes[n].op for n in r.nodes] for r in pooled] == [["relu", "max_pool2d"],
                                                                          ["relu", "avg_pool2d", "tanh"]]
    tip = window.agent.overlay.items[pooled[0].id].tooltip_text()
    assert "pooling kernel" in tip and "applies relu to each element a window reads" in tip, tip
    tree = window.findChild(RegionList).tree
    rows = {tree.topLevelItem(i).text(0): tree.topLevelItem(i) for i in range(tree.topLevelItemCount())}
    for r in pooled:
        assert rows[r.id].text(1) == "pooling"
        assert rows[r.id].foreground(1).color().name() == KIND_HUES["pooling"]
