"""Real models are readable: module paths from the importer, a top-to-bottom layout grouped by module,
region frames that never share a point, and no node text when zoomed out."""
from __future__ import annotations

import json
import time

import pytest
import torch
from PySide6.QtCore import QRectF
from PySide6.QtGui import QImage, QPainter, QUndoStack

from agent_core.importers import import_nn_module
from agent_core.planner import apply_plan, plan_program
from agent_core.project_file import load_program, save_program
from graph_editor.layout import layered_layout
from graph_editor.region_item import RegionOverlay
from graph_editor.scene import GraphScene, program_layout_input
from graph_editor.style import dark, light
from graph_editor.view import GraphView
from tools.resnets import resnet_program


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(Inner(), Inner())

    def forward(self, x):
        return self.blocks(x).sum(-1)


def test_importer_records_module_paths_and_they_survive_saving(tmp_path):
    p = import_nn_module(Outer(), [torch.randn(2, 8)], name="outer")
    mods = p.metadata["modules"]
    paths = {p.nodes[n].op: path for n, path in mods["nodes"].items() if n in p.nodes and path.startswith("blocks.0")}
    assert paths["relu"] == "blocks.0" and paths["linear"] == "blocks.0.fc"
    assert mods["classes"]["blocks.0"] == "Inner" and mods["classes"]["blocks"] == "Sequential"
    assert mods["classes"]["blocks.0.fc"] == "Linear"
    sum_node = next(n for n in p.nodes.values() if n.op == "sum")
    assert mods["nodes"][sum_node.id] == ""          # forward's own op: the model itself
    save_program(p, str(tmp_path / "outer.json"))
    back = load_program(str(tmp_path / "outer.json"))
    assert back.metadata["modules"] == json.loads(json.dumps(mods))


@pytest.fixture(scope="module")
def resnet18():
    return resnet_program(18)


@pytest.fixture(scope="module")
def resnet101():
    return resnet_program(101)


_SHOWN: list = []


@pytest.fixture(autouse=True)
def _keep_views_alive():
    """The views a test shows stay referenced until its teardown: pytest-qt holds added widgets only
    weakly, and a shown view that the garbage collector frees while Qt paints it (pytest-qt processes
    events after the test returns) crashes the process."""
    yield
    for view in _SHOWN:
        view.close()
    _SHOWN.clear()


def _laid_out(program, qtbot, style=dark):
    pos = layered_layout(program_layout_input(program))
    for nid, xy in pos.items():
        if nid in program.nodes:
            program.nodes[nid].pos = xy
    view = GraphView()
    qtbot.addWidget(view)
    _SHOWN.append(view)
    stack = QUndoStack(view)
    scene = GraphScene(program, stack, style(), view)   # owned by the view: never painted after it is gone
    view.set_scene(scene)
    view.resize(1600, 1000)
    view.show()
    qtbot.waitExposed(view)
    view.fit_all()
    return scene, view


def _body(item) -> QRectF:
    w, h = item.size()
    return QRectF(item.pos().x(), item.pos().y(), w, h)


def test_resnet18_reads_top_to_bottom_as_stages_of_blocks(resnet18, qtbot):
    p = resnet18
    scene, view = _laid_out(p, qtbot)
    r = scene.content_rect()
    assert 0.4 < r.height() / r.width() < 1.6, r   # screen-shaped: the stages wrap into columns
    assert view.zoom() > 0.12
    boxes = scene.modules.boxes()
    blocks = [b for b in boxes if b.count(".") == 1]   # layer1.0 ... layer4.1: the BasicBlocks
    assert len(blocks) == 8 and {"layer1", "layer2", "layer3", "layer4"} <= set(boxes)
    paths = p.metadata["modules"]["nodes"]
    for path in blocks:
        members = [n for n, mp in paths.items() if n in p.nodes and (mp == path or mp.startswith(path + "."))]
        assert len(members) >= 5
        for nid in members:
            assert boxes[path].contains(_body(scene.nodes[nid])), (path, nid)
        stage = path.split(".")[0]
        assert boxes[stage].contains(boxes[path])
    for siblings in ([b for b in blocks], ["layer1", "layer2", "layer3", "layer4"]):
        for i, a in enumerate(siblings):
            for b in siblings[i + 1:]:
                assert not boxes[a].intersects(boxes[b]), (a, b)
    # an edge inside a block runs downwards, from an output on a bottom edge to an input on a top edge
    conv = next(n for n, mp in paths.items() if mp == "layer1.0.conv1")
    bn = next(n for n, mp in paths.items() if mp == "layer1.0.bn1")
    e = scene.edges[(bn, 0)]
    assert e._a.y() == pytest.approx(_body(scene.nodes[conv]).bottom()) and e._b.y() > e._a.y()


@pytest.mark.parametrize("style", [dark, light])
def test_region_frames_never_share_a_point_and_labels_sit_inside(qtbot, style):
    p = resnet_program(18)
    apply_plan(p, plan_program(p))
    scene, view = _laid_out(p, qtbot, style)
    overlay = RegionOverlay(scene, view)
    items = [i for i in overlay.items.values() if i.isVisible()]
    assert len(items) >= 10
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            common = a.path.intersected(b.path)
            assert common.boundingRect().width() * common.boundingRect().height() < 1e-6, (a.region_id, b.region_id)
    for item in items:
        lr = item.label_rect()
        assert item.path.contains(lr.adjusted(-2, -2, 2, 2)), item.region_id     # inside, off the border
        for nid in item.region.nodes:
            assert not lr.intersects(_body(scene.nodes[nid]))                     # not under its own nodes
            assert item.path.contains(_body(scene.nodes[nid]).center())


def _render(scene, rect: QRectF, scale: float) -> QImage:
    img = QImage(int(rect.width() * scale), int(rect.height() * scale), QImage.Format_ARGB32)
    img.fill(0)
    painter = QPainter(img)
    scene.render(painter, QRectF(0, 0, img.width(), img.height()), rect)
    painter.end()
    return img


def test_node_text_is_not_painted_when_zoomed_out(qtbot):
    from agent_core.ir import Program
    p = Program("lod")
    x = p.add_input("x", (4, 8))
    n = p.add_node("relu", [x.id], pos=(0, 0), name="first_name")
    p.mark_output(n.outputs[0])
    scene = GraphScene(p, QUndoStack(), dark())
    rect = scene.nodes[n.id].sceneBoundingRect()
    near, far = _render(scene, rect, 1.0), _render(scene, rect, 0.25)
    p.rename(n.outputs[0], "other")   # changes only text: the shape label
    p.nodes[n.id].name = "a_very_different_name"
    scene.nodes[n.id].refresh()
    assert _render(scene, rect, 1.0) != near          # close up the text is drawn ...
    assert _render(scene, rect, 0.25) == far          # ... zoomed out it is not


def test_resnet101_opens_with_its_bottlenecks_collapsed_and_lays_out_fast(resnet101, qtbot):
    p = resnet101
    assert 330 <= len(p.nodes) <= 360
    t = time.perf_counter()
    data = program_layout_input(p)
    pos = layered_layout(data)
    elapsed = time.perf_counter() - t
    assert elapsed < 10.0                          # about 0.05 s here; docs/benchmarks/editor.md
    groups = p.metadata["editor"]["collapsed"]
    assert len(groups) == 33 and all(g["name"].endswith("· Bottleneck") for g in groups)
    for nid, xy in pos.items():
        if nid in p.nodes:
            p.nodes[nid].pos = xy
    scene, view = _laid_out(p, qtbot)
    assert len(scene.groups) == 33 and sum(i.isVisible() for i in scene.nodes.values()) < 20
    rects = [_body(g) for g in scene.groups]
    for i, a in enumerate(rects):
        for b in rects[i + 1:]:
            assert not a.intersects(b)
    r = scene.content_rect()
    assert 0.4 < r.height() / r.width() < 1.6 and view.zoom() > 0.2   # fits a screen readably
    # expanding one block lays the program out again with room for its nodes
    g = scene.groups[5]
    members = scene.expand(g)
    bodies = [_body(scene.nodes[m]) for m in members]
    for i, a in enumerate(bodies):
        for b in bodies[i + 1:]:
            assert not a.intersects(b)
