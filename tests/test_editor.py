"""The node canvas on real widgets (pytest-qt): adding, connecting, refusing, editing, undo/redo,
copy/paste, layout, collapse. The scene must always mirror the Program after every step."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF, QStandardPaths, Qt
from PySide6.QtGui import QUndoStack

QStandardPaths.setTestModeEnabled(True)

from agent_core.ir import Program, Role  # noqa: E402
from graph_editor import clipboard  # noqa: E402
from graph_editor.inspector import Inspector  # noqa: E402
from graph_editor.layout import LayoutInput, layered_layout  # noqa: E402
from graph_editor.layout_job import LayoutRunner  # noqa: E402
from graph_editor.palette import PaletteWidget, QuickSearch, fuzzy_score, ops_accepting, search_ops  # noqa: E402
from graph_editor.scene import GraphScene  # noqa: E402
from graph_editor.style import dark  # noqa: E402
from graph_editor.view import GraphView  # noqa: E402


def small_program() -> Program:
    p = Program("small")
    x = p.add_input("x", (4, 8))
    w = p.add_parameter("w", np.ones((8, 8), np.float32))
    lin = p.add_node("linear", [x.id, w.id], pos=(0, 0))
    act = p.add_node("relu", [lin.outputs[0]], pos=(300, 0))
    p.mark_output(act.outputs[0])
    return p


def assert_mirrors(scene: GraphScene) -> None:
    """Items match the model: one item per node, per input and per parameter or constant no node reads
    (a read one is drawn inside its reader), one edge per wired (non-parameter) port."""
    p = scene.program
    assert set(scene.nodes) == set(p.nodes)
    read = {v for n in p.nodes.values() for v in n.inputs if v}
    loose = {vid for vid, v in p.values.items() if v.role in (Role.PARAMETER, Role.CONSTANT) and vid not in read}
    assert set(scene.terminals) == set(p.inputs) | loose
    want = {(n.id, i): v for n in p.nodes.values() for i, v in enumerate(n.inputs)
            if v and p.values[v].role not in (Role.PARAMETER, Role.CONSTANT)}
    assert {k: e.value_id for k, e in scene.edges.items()} == want
    for nid, item in scene.nodes.items():
        if p.nodes[nid].pos is not None:
            assert (item.pos().x(), item.pos().y()) == pytest.approx(p.nodes[nid].pos)


@pytest.fixture
def canvas(qtbot):
    p = small_program()
    stack = QUndoStack()
    scene = GraphScene(p, stack, dark())
    view = GraphView(scene)
    qtbot.addWidget(view)
    view.resize(900, 600)
    view.show()
    return p, stack, scene, view


def test_scene_builds_from_program(canvas):
    p, stack, scene, view = canvas
    assert_mirrors(scene)
    # the parameter is drawn inside linear, not as an edge; x arrives by an edge from its terminal
    lin = next(n for n in p.nodes.values() if n.op == "linear")
    assert (lin.id, 1) not in scene.edges and (lin.id, 0) in scene.edges
    assert scene.nodes[lin.id].labels()[2][1] == ("weight f32[8, 8]", "param")


def test_add_from_palette_then_undo_redo(canvas, qtbot):
    p, stack, scene, view = canvas
    palette = PaletteWidget()
    qtbot.addWidget(palette)
    palette.op_activated.connect(lambda op: scene.add_node(op, QPointF(600, 0)))
    palette.filter.setText("sigmo")
    qtbot.keyClick(palette.filter, Qt.Key_Return)
    added = [n for n in p.nodes.values() if n.op == "sigmoid"]
    assert len(added) == 1 and added[0].pos == (600.0, 0.0)
    assert_mirrors(scene)
    assert scene.selected_node_ids() == [added[0].id]
    stack.undo()
    assert not any(n.op == "sigmoid" for n in p.nodes.values())
    assert_mirrors(scene)
    stack.redo()
    assert any(n.op == "sigmoid" for n in p.nodes.values())
    assert_mirrors(scene)


def test_quick_search_fuzzy_and_compatible_ops(qtbot):
    assert fuzzy_score("ln", "layer_norm") > fuzzy_score("ln", "logsumexp_n" if False else "linear")
    assert search_ops("relu")[0].name == "relu"
    assert search_ops("swish")[0].name == "silu"           # found by alias
    assert search_ops("lnorm")[0].name == "layer_norm"
    from agent_core.ops import TensorSpec
    names = {op.name for op in ops_accepting(TensorSpec((4, 8), "float32"))}
    assert "relu" in names and "softmax" in names
    int_names = {op.name for op in ops_accepting(TensorSpec((4, 8), "bool"))}
    assert "logical_not" in int_names
    qs = QuickSearch()
    qtbot.addWidget(qs)
    got = []
    qs.chosen.connect(got.append)
    qs.open_at(qs.pos())
    qtbot.keyClicks(qs.edit, "gelu")
    qtbot.keyClick(qs.edit, Qt.Key_Return)
    assert got == ["gelu"]


def test_connect_by_drag_logic_and_undo(canvas):
    p, stack, scene, view = canvas
    x = p.inputs[0]
    nid = scene.add_node("add", QPointF(300, 200))
    relu = next(n for n in p.nodes.values() if n.op == "relu")
    # drag from relu's output port onto add's input port 0, then from the x terminal onto port 1
    reason = scene.finish_drag(("out", relu.outputs[0]), scene.target_pos(nid, 0))
    assert reason is None and p.nodes[nid].inputs[0] == relu.outputs[0]
    assert scene.finish_drag(("out", x), scene.target_pos(nid, 1)) is None
    assert p.nodes[nid].inputs == [relu.outputs[0], x] and p.nodes[nid].error is None
    assert_mirrors(scene)
    stack.undo()
    assert p.nodes[nid].inputs[1] is None
    assert_mirrors(scene)
    stack.redo()
    assert p.nodes[nid].inputs[1] == x
    assert_mirrors(scene)


def test_real_mouse_drag_connects(canvas, qtbot):
    p, stack, scene, view = canvas
    nid = scene.add_node("sigmoid", QPointF(300, 200))
    relu = next(n for n in p.nodes.values() if n.op == "relu")
    view.centerOn(QPointF(350, 120))
    a = view.mapFromScene(scene.source_pos(relu.outputs[0]))
    b = view.mapFromScene(scene.target_pos(nid, 0))
    qtbot.mousePress(view.viewport(), Qt.LeftButton, pos=a)
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication
    move = QMouseEvent(QMouseEvent.Type.MouseMove, QPointF(b), view.viewport().mapToGlobal(QPointF(b)),
                       Qt.NoButton, Qt.LeftButton, Qt.NoModifier)
    QApplication.sendEvent(view.viewport(), move)
    qtbot.mouseRelease(view.viewport(), Qt.LeftButton, pos=b)
    assert p.nodes[nid].inputs == [relu.outputs[0]]
    assert_mirrors(scene)


def test_illegal_connections_are_refused_with_the_reason(canvas):
    p, stack, scene, view = canvas
    refused = []
    scene.connection_refused.connect(refused.append)
    lin = next(n for n in p.nodes.values() if n.op == "linear")
    relu = next(n for n in p.nodes.values() if n.op == "relu")
    before = [list(n.inputs) for n in p.nodes.values()]
    depth = stack.count()
    # a cycle: relu's output back into linear
    reason = scene.finish_drag(("out", relu.outputs[0]), scene.target_pos(lin.id, 0))
    assert reason and "cycle" in reason
    # a shape mismatch: x [4, 8] into a matmul with x
    mm = scene.add_node("matmul", QPointF(0, 300))
    depth = stack.count()
    assert scene.try_connect(p.inputs[0], mm, 0) is None
    reason = scene.try_connect(p.inputs[0], mm, 1)
    assert reason and "matmul" in reason
    assert refused[-1] == reason == scene.last_refusal
    assert stack.count() == depth + 1          # only the legal connection became an undo step
    assert [list(n.inputs) for n in p.nodes.values()][:2] == before[:2]


def test_inspector_edits_attribute_with_validation_and_undo(canvas, qtbot):
    p, stack, scene, view = canvas
    nid = scene.add_node("leaky_relu", QPointF(600, 0), connect_from=next(
        n for n in p.nodes.values() if n.op == "relu").outputs[0])
    insp = Inspector()
    qtbot.addWidget(insp)
    insp.set_document(p, stack)
    insp.show_node(nid)
    editor = insp.attr_editors["negative_slope"]
    editor.setText("not a number")
    editor.editingFinished.emit()
    assert insp.attr_errors["negative_slope"].isVisibleTo(insp)
    assert "negative_slope" in insp.attr_errors["negative_slope"].text()
    assert p.nodes[nid].attrs["negative_slope"] == 0.01
    editor.setText("0.2")
    editor.editingFinished.emit()
    assert p.nodes[nid].attrs["negative_slope"] == 0.2
    assert "negative_slope=0.2" in scene.nodes[nid].labels()[4][0]
    stack.undo()
    assert p.nodes[nid].attrs["negative_slope"] == 0.01
    stack.redo()
    assert p.nodes[nid].attrs["negative_slope"] == 0.2


def test_error_badge_not_popup(canvas):
    p, stack, scene, view = canvas
    nid = scene.add_node("add", QPointF(0, 300))
    item = scene.nodes[nid]
    assert item._error and "not connected" in item.tooltip_text()


def test_delete_with_edges_is_one_undo_step(canvas):
    p, stack, scene, view = canvas
    lin = next(n for n in p.nodes.values() if n.op == "linear")
    relu = next(n for n in p.nodes.values() if n.op == "relu")
    scene.select_nodes([lin.id])
    depth = stack.count()
    scene.delete_selection()
    assert stack.count() == depth + 1
    assert lin.id not in p.nodes and p.nodes[relu.id].inputs == [None]
    assert_mirrors(scene)
    stack.undo()
    assert p.nodes[relu.id].inputs == [lin.outputs[0]]
    assert_mirrors(scene)
    # an edge alone: disconnects
    edge = scene.edges[(relu.id, 0)]
    scene.clearSelection()
    edge.setSelected(True)
    scene.delete_selection()
    assert p.nodes[relu.id].inputs == [None]
    stack.undo()
    assert_mirrors(scene)


def test_copy_paste_json_text_roundtrip(canvas):
    p, stack, scene, view = canvas
    ids = list(p.nodes)
    text = clipboard.dumps(clipboard.copy_nodes(p, ids))
    new = clipboard.paste(stack, p, clipboard.loads(text))
    assert len(new) == 2
    lin2 = p.nodes[new[0]]
    # the copy reads the same program input, and owns a copy of the weights
    assert lin2.inputs[0] == p.inputs[0] and lin2.inputs[1] != p.nodes[ids[0]].inputs[1]
    np.testing.assert_array_equal(p.data[lin2.inputs[1]], np.ones((8, 8), np.float32))
    assert p.nodes[new[1]].inputs == [lin2.outputs[0]]
    assert_mirrors(scene)
    stack.undo()  # the whole paste is one step
    assert set(p.nodes) == set(ids)
    assert_mirrors(scene)
    # into another program: the input is created
    q = Program("other")
    qstack = QUndoStack()
    new = clipboard.paste(qstack, q, clipboard.loads(text))
    assert len(q.nodes) == 2 and len(q.inputs) == 1
    assert [d.code for d in q.validate() if d.severity == "error"] == ["no-output"]
    with pytest.raises(clipboard.ClipError, match="not copied nodes"):
        clipboard.loads('{"a": 1}')


def test_layout_is_one_undo_step_and_off_thread(canvas, qtbot):
    p, stack, scene, view = canvas
    for k in range(5):
        scene.add_node("sigmoid", QPointF(0, 0), connect_from=list(p.nodes.values())[-1].outputs[0])
    runner = LayoutRunner()
    before = {n: p.nodes[n].pos for n in p.nodes}
    depth = stack.count()
    with qtbot.waitSignal(runner.finished, timeout=10000):
        runner.start(scene)
    assert stack.count() == depth + 1 and stack.undoText() == "Auto layout"
    ys = [p.nodes[n].pos[1] for n in p.topo_order()]
    assert ys == sorted(ys) and len(set(ys)) == len(ys)  # a chain runs top to bottom, one per layer
    assert_mirrors(scene)
    stack.undo()
    assert {n: p.nodes[n].pos for n in p.nodes} == before
    assert_mirrors(scene)


def test_layout_cancelled_when_program_changes(canvas, qtbot):
    p, stack, scene, view = canvas
    runner = LayoutRunner()
    runner.pool.setMaxThreadCount(1)
    depth = stack.count()
    runner.start(scene)
    scene.add_node("relu", QPointF(0, 400))   # an edit while the layout runs: its result is stale
    runner.wait()
    qtbot.wait(20)
    assert stack.count() == depth + 1 and not runner.busy()


def test_layered_layout_no_overlap():
    nodes = [f"n{i}" for i in range(40)]
    edges = [(f"n{i}", f"n{i + 1}") for i in range(39)] + [(f"n{i}", f"n{i + 5}") for i in range(0, 35, 3)]
    sizes = {n: (200.0, 60.0 + 10 * (i % 3)) for i, n in enumerate(nodes)}
    pos = layered_layout(LayoutInput(nodes, sizes, edges))
    for a, b in edges:
        # top to bottom; a chain this long wraps into columns, so an edge may start the next column
        assert pos[a][1] < pos[b][1] or pos[a][0] + sizes[a][0] < pos[b][0]
    boxes = [(pos[n][0], pos[n][1], pos[n][0] + sizes[n][0], pos[n][1] + sizes[n][1]) for n in nodes]
    for i, r in enumerate(boxes):
        for s in boxes[i + 1:]:
            assert r[2] <= s[0] or s[2] <= r[0] or r[3] <= s[1] or s[3] <= r[1], (r, s)


def test_collapse_and_expand(canvas):
    p, stack, scene, view = canvas
    ids = list(p.nodes)
    g = scene.collapse(ids, "block")
    assert g is not None and not any(scene.nodes[n].isVisible() for n in ids)
    assert p.metadata["editor"]["collapsed"] == [{"name": "block", "nodes": ids}]
    # the edge from x now ends on the group's input port; the internal edge is hidden
    lin, relu = ids
    assert scene.edges[(lin, 0)].isVisible() and scene.edges[(lin, 0)]._b == g.mapToScene(g.input_pos())
    assert not scene.edges[(relu, 0)].isVisible()
    assert set(scene.selected_node_ids()) == set(ids)
    members = scene.expand(g)
    assert members == ids and all(scene.nodes[n].isVisible() for n in ids)
    assert scene.edges[(relu, 0)].isVisible() and p.metadata["editor"]["collapsed"] == []
    # collapsed state survives a rebuild (it is saved with the program)
    scene.collapse(ids, "again")
    scene.rebuild()
    assert len(scene.groups) == 1 and scene.groups[0].name == "again"


def test_low_detail_overview_when_zoomed_out(canvas):
    p, stack, scene, view = canvas
    view.zoom_by(0.1)
    assert scene._low_detail and scene.overview.isVisible()
    view.viewport().repaint()
    assert scene.overview._by_color and scene.overview._lines
    view.zoom_by(10)
    assert not scene._low_detail and not scene.overview.isVisible()


def test_delete_program_input_and_undo_restores_order_and_readers(canvas):
    p, stack, scene, view = canvas
    y = p.add_input("y", (4, 8))
    nid = scene.add_node("add", QPointF(0, 300))
    scene.try_connect(p.inputs[0], nid, 0)
    scene.try_connect(y.id, nid, 1)
    x = p.inputs[0]
    readers = p.consumers(x)
    scene.clearSelection()
    scene.terminals[x].setSelected(True)
    scene.delete_selection()
    assert x not in p.values and x not in scene.terminals
    stack.undo()
    assert p.inputs == [x, y.id] and p.consumers(x) == readers
    assert_mirrors(scene)


def test_mouse_drag_moves_node_as_one_undo_step(canvas, qtbot):
    p, stack, scene, view = canvas
    relu = next(n for n in p.nodes.values() if n.op == "relu")
    item = scene.nodes[relu.id]
    view.centerOn(item)
    start = view.mapFromScene(item.pos() + QPointF(60, 8))   # on the header, away from the ports
    end = start + QPointF(0, 120).toPoint()
    depth = stack.count()
    qtbot.mousePress(view.viewport(), Qt.LeftButton, pos=start)
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication
    for k in (1, 2, 3):
        pt = QPointF(start) + QPointF(0, 40 * k)
        QApplication.sendEvent(view.viewport(), QMouseEvent(
            QMouseEvent.Type.MouseMove, pt, view.viewport().mapToGlobal(pt), Qt.NoButton, Qt.LeftButton,
            Qt.NoModifier))
    qtbot.mouseRelease(view.viewport(), Qt.LeftButton, pos=end)
    assert stack.count() == depth + 1 and stack.undoText().startswith("Move")
    assert p.nodes[relu.id].pos[1] > 60
    assert scene.edges[(relu.id, 0)]._b == scene.target_pos(relu.id, 0)   # the edge followed
    stack.undo()
    assert p.nodes[relu.id].pos == (300.0, 0.0)
    assert_mirrors(scene)


def test_nodes_added_at_the_centre_do_not_stack(canvas):
    p, stack, scene, view = canvas
    a, b = scene.add_node("relu"), scene.add_node("relu")
    assert not scene.nodes[a].sceneBoundingRect().intersects(scene.nodes[b].sceneBoundingRect().adjusted(2, 2, -2, -2))


def test_inspector_parses_conv_padding_as_list_or_mode():
    from agent_core.ops import get_op
    from graph_editor.inspector import parse_attr
    padding = next(a for a in get_op("conv2d").attrs if a.name == "padding")
    assert padding.check("conv2d", parse_attr(padding, "[1, 1]")) == [1, 1]
    assert padding.check("conv2d", parse_attr(padding, "same")) == "same"
    with pytest.raises(Exception, match="padding"):
        padding.check("conv2d", parse_attr(padding, "sideways"))


def test_collapse_and_expand_are_undo_steps(canvas, qtbot):
    p, stack, scene, view = canvas
    ids = list(p.nodes)
    view.setFocus()
    g = scene.collapse(ids, "block")
    assert stack.count() == 1 and stack.undoText() == "Collapse 2 nodes into block"
    stack.undo()   # the model goes back and the scene follows it
    assert p.metadata["editor"]["collapsed"] == [] and not scene.groups
    assert all(scene.nodes[n].isVisible() for n in ids) and scene.edges[(ids[1], 0)].isVisible()
    stack.redo()
    assert [g.name for g in scene.groups] == ["block"] and not scene.nodes[ids[0]].isVisible()
    g = scene.groups[0]
    scene.expand(g)
    assert stack.count() == 2 and stack.undoText() == "Expand block" and not scene.groups
    stack.undo()
    assert p.metadata["editor"]["collapsed"] == [{"name": "block", "nodes": ids}]
    assert len(scene.groups) == 1 and not any(scene.nodes[n].isVisible() for n in ids)
    assert not scene.edges[(ids[1], 0)].isVisible()
    stack.redo()
    assert not scene.groups and p.metadata["editor"]["collapsed"] == []
    # too few nodes: nothing is pushed
    assert scene.collapse(ids[:1]) is None and stack.count() == 2
