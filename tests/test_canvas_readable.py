"""The canvas reads well on real models, as a person opens them (issue #15): File > Open, View > Fit.

Module titles sit in their box's band above every child; input terminals keep clear of region frames;
edges climbing to the next column of a wrapped box run only horizontally and vertically, through the
gutter, crossing no item they do not connect; the 5,000-node decoder stack of tools/bench_editor.py
opens with its layers collapsed, and at fit-all its group titles are at least 8 px on screen."""
from __future__ import annotations

import os

import pytest
from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QFileDialog

from agent_core.project_file import save_program
from graph_editor.node_item import far_title
from graph_editor.region_item import LABEL_H, label_lines, region_label
from graph_editor.style import READABLE_PX
from tools.resnets import resnet_program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _open(win, qtbot, monkeypatch, path: str) -> None:
    """File > Open with `path` chosen in its dialog, then View > Fit program."""
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (path, ""))
    with qtbot.waitSignal(win.opened, timeout=120_000):
        win.act["open"].trigger()
    # a big program is laid out on the worker thread after it is shown
    qtbot.waitUntil(lambda: all(n.pos is not None for n in win.document.program.nodes.values()), timeout=60_000)
    win.view.setFocus()
    win.act["fit"].trigger()
    qtbot.wait(200)     # the frames and titles follow on the next turns of the event loop


@pytest.fixture(scope="module")
def resnet101_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("canvas") / "resnet101.json")
    save_program(resnet_program(101), path)
    return path


def _readable_group_titles(win) -> list[str]:
    """The titles the collapsed groups show at the view's zoom (drawn by the items, or by the
    overview below node_item.LOD_TEXT: both through far_title) that are READABLE_PX or more."""
    t = win.view.viewportTransform()
    out = []
    for g in win.scene.groups:
        fit = far_title(t.mapRect(_body(g)), g.far_titles(), 1.0, win.scene.style) if g.isVisible() else None
        if fit and fit[1] >= READABLE_PX:
            out.append(fit[0])
    return out


def _body(item) -> QRectF:
    w, h = item.size()
    return QRectF(item.pos().x(), item.pos().y(), w, h)


def test_module_titles_sit_in_a_band_above_every_child(studio_window, qtbot, monkeypatch, resnet101_file):
    win = studio_window
    _open(win, qtbot, monkeypatch, resnet101_file)
    sc = win.scene
    boxes = sc.modules.items
    shown = {p: b for p, b in boxes.items() if b.isVisible()}
    assert {"layer1", "layer2", "layer3", "layer4"} <= set(shown)
    titled = 0
    for path, box in shown.items():
        title = box.title_scene_rect()
        if title is None:
            continue
        titled += 1
        assert box.title_rect().contains(title), path           # inside its own band ...
        for nid in box.members:                                  # ... above every child
            item = sc.group_of.get(nid) or sc.nodes[nid]
            assert not title.intersects(_body(item)), (path, nid)
        for other, child in shown.items():
            if other.startswith(path + "."):
                assert not title.intersects(child.rect), (path, other)
    assert titled >= 4 and all(shown[s].label.font_px(win.view.zoom()) >= READABLE_PX
                               for s in ("layer1", "layer2", "layer3", "layer4"))
    # the collapsed Bottlenecks show their names at a readable size at fit-all
    assert len(_readable_group_titles(win)) == len(sc.groups) == 33


def test_edges_between_wrapped_columns_are_orthogonal_and_cross_nothing(studio_window, qtbot, monkeypatch,
                                                                         resnet101_file):
    win = studio_window
    _open(win, qtbot, monkeypatch, resnet101_file)
    sc = win.scene
    routed = [e for e in sc.edges.values() if e.isVisible() and e.route]
    assert len(routed) >= 4        # layer3 wraps into columns, and the stages into two
    bodies = [(it, _body(it)) for it in list(sc.nodes.values()) + sc.groups if it.isVisible()]
    for e in routed:
        ends = {sc.group_of.get(e.node_id) or sc.nodes[e.node_id]}
        v = sc.program.values[e.value_id]
        ends.add(sc.group_of.get(v.producer) or sc.nodes[v.producer])
        for seg in e.lines():
            assert seg.dx() == 0 or seg.dy() == 0, (e.value_id, seg)
            r = QRectF(seg.p1(), seg.p2()).normalized().adjusted(-0.5, -0.5, 0.5, 0.5)
            for item, body in bodies:
                if item not in ends:
                    assert not r.intersects(body.adjusted(1, 1, -1, -1)), (e.value_id, seg, item)
    # a climbing edge is never drawn as one curve across the columns
    for e in sc.edges.values():
        if e.isVisible() and e._b.y() < e._a.y() - 200:
            assert e.route


def test_input_terminals_keep_clear_of_region_frames(studio_window, qtbot, monkeypatch):
    win = studio_window
    _open(win, qtbot, monkeypatch, os.path.join(ROOT, "resources", "examples", "mlp_block.py"))
    win.agent.act["plan"].trigger()          # Graph > Plan regions
    qtbot.waitUntil(lambda: bool(win.agent.overlay.items), timeout=30_000)
    frames = [i for i in win.agent.overlay.items.values() if i.isVisible()]
    assert len(frames) >= 3
    for vid, t in win.scene.terminals.items():
        for f in frames:
            assert not f.path.intersects(t.sceneBoundingRect()), (vid, f.region_id)
    bold, small = win.scene.style.metrics("font_bold"), win.scene.style.metrics("font_small")
    for f in frames:      # a label too long for one line gets a second one, not an ellipsis
        lr = f.label_rect()
        if lr.height() < LABEL_H:
            assert bold.horizontalAdvance(region_label(f.region)) <= lr.width(), f.region_id
        else:
            head, figures = label_lines(f.region)
            assert bold.horizontalAdvance(head) <= lr.width() and small.horizontalAdvance(figures) <= lr.width()


def test_the_5000_node_decoder_stack_opens_collapsed_and_readable(studio_window, qtbot, monkeypatch):
    from tools.bench_editor import cached_program_file
    win = studio_window
    _open(win, qtbot, monkeypatch, cached_program_file(5000))
    sc = win.scene
    assert len(sc.program.nodes) > 4500
    assert len(sc.groups) >= 100 and all(g.name.endswith("· LlamaDecoderLayer") for g in sc.groups)
    assert sum(i.isVisible() for i in sc.nodes.values()) < 20
    zoom = win.view.zoom()
    shown = {p: b for p, b in sc.modules.items.items() if b.isVisible()}
    assert {"model", "model.layers"} <= set(shown)
    for path in ("model", "model.layers"):
        assert shown[path].label.font_px(zoom) >= READABLE_PX and shown[path].title_scene_rect() is not None
    assert len(_readable_group_titles(win)) == len(sc.groups)


def test_a_collapsed_group_drops_its_class_name_before_its_path(studio_window, qtbot, monkeypatch, resnet101_file):
    """Zoomed in, "layer3.10 · Bottleneck" that does not fit reads "layer3.10", never "layer3.1…neck"."""
    win = studio_window
    _open(win, qtbot, monkeypatch, resnet101_file)
    titles = {g.name: g._title for g in win.scene.groups}
    assert len(titles) == 33
    for name, title in titles.items():
        path = name.split(" · ")[0]
        assert title in (f"▸ {name}", f"▸ {path}"), (name, title)
