"""Screenshots of the studio's main workflows, for the README and for looking at what we build.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python tools/screenshots.py OUT_FOLDER
    QT_QPA_PLATFORM=offscreen .venv/bin/python tools/screenshots.py OUT_FOLDER     # no X server

Writes, each from a fresh document in one 1600 x 1000 window:
  first_open.png       resources/examples/mlp_block.py as first opened
  planned.png          the same after Graph > Plan regions
  replayed_h200.png    tests/data/mlp_small_h200 opened through File > Open results (every dock filled)
  resnet18_fit.png / resnet18_zoom.png     ResNet18 at fit-all and at 80 %
  resnet101_fit.png / resnet101_zoom.png   ResNet101 (Bottlenecks collapsed) at fit-all and at 80 %
  from_scratch.png     a program built from File > New with the user's gestures (Tab input / linear /
                       relu, the inspector's New parameter, the output marked), laid out and planned
  writer.png           the Kernel writer dock on tests/data/writer/studio_run.jsonl (a real CPU worker's
                       writer rounds against tests/writer_stub.py: a compile error, then the fix)
  writer_settings.png  Settings > Kernel Writer… filled in for a remote endpoint
The ResNets are tools/resnets.py's own modules, imported with import_nn_module.
"""
from __future__ import annotations

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    out = os.path.abspath(argv[0])
    os.makedirs(out, exist_ok=True)
    from PySide6.QtWidgets import QApplication
    app = QApplication.instance() or QApplication([])
    from agent_core.project_file import save_program
    from app.main_window import MainWindow
    from tools.resnets import resnet_program

    def window():
        w = MainWindow()
        w.resize(1600, 1000)
        w.show()
        app.processEvents()
        return w

    def settle(w):
        for _ in range(5):
            app.processEvents()
        w.layout_runner.wait()

    def shot(w, name):
        settle(w)
        path = os.path.join(out, name)
        w.grab().save(path)
        print(path)

    w = window()
    w.open_path(os.path.join(ROOT, "resources", "examples", "mlp_block.py"), layout_sync=True)
    shot(w, "first_open.png")
    w.agent.act["plan"].trigger()   # Graph > Plan regions
    shot(w, "planned.png")
    w.hide()      # closing would ask about the unsaved plan

    w = window()
    results = os.path.join(ROOT, "tests", "data", "mlp_small_h200")
    w.agent.open_results(results)     # what File > Open results does after its folder dialog
    shot(w, "replayed_h200.png")
    w.hide()      # closing would ask about the unsaved plan

    w = window()
    from_scratch(w, app)
    shot(w, "from_scratch.png")
    w.hide()

    w = window()
    writer(w, app, out)
    shot(w, "writer.png")
    w.hide()

    tmp = tempfile.mkdtemp(prefix="stitchcuda-shots-")
    for depth in (18, 101):
        path = os.path.join(tmp, f"resnet{depth}.json")
        save_program(resnet_program(depth), path)
        w = window()
        w.open_path(path, layout_sync=True)
        settle(w)
        w.view.fit_all()
        shot(w, f"resnet{depth}_fit.png")
        r = w.view.scene().content_rect()
        w.view.resetTransform()
        w.view.zoom_by(0.8)
        w.view.centerOn(r.center().x(), r.top() + 420)
        shot(w, f"resnet{depth}_zoom.png")
        w.hide()
    return 0


def writer(w, app, out: str) -> None:
    """The writer's case program (tests/writer_cases.py), planned, with a recorded writer run replayed
    (as Open results replays events) and round 1's verdict and diff shown; then the settings dialog
    for a remote endpoint, shot on its own (it is a window of its own)."""
    import json

    from PySide6.QtCore import QSettings

    from app.document import Document
    from app.writer_settings import WriterSettingsDialog
    from tests.writer_cases import case_program, region_and_ours
    program = case_program()
    region_and_ours(program)
    w.set_document(Document(program))
    w._layout_if_needed(w.document, True)
    w.view.show_program()
    with open(os.path.join(ROOT, "tests", "data", "writer", "studio_run.jsonl"), encoding="utf-8") as f:
        w.agent.replay([json.loads(line) for line in f if line.strip()])
    w.agent.select_region("r1")
    w.agent.writer_dock.raise_()
    w.agent.writer.select("r1", 1)
    w.agent.writer.tabs.setCurrentIndex(1)   # the diff: red and green lines
    tmp = tempfile.mkdtemp(prefix="stitchcuda-shots-settings-")
    dlg = WriterSettingsDialog(QSettings(os.path.join(tmp, "writer.conf"), QSettings.IniFormat), w)
    dlg.url.setText("https://api.example.com/v1")
    dlg.model.setEditText("qwen2.5-coder-32b")
    dlg.key_stored.setChecked(True)
    dlg.key.setText("sk-example-not-a-key")
    dlg.show()
    for _ in range(5):
        app.processEvents()
    path = os.path.join(out, "writer_settings.png")
    dlg.grab().save(path)
    print(path)
    dlg.close()


def from_scratch(w, app) -> None:
    """File > New, then what a user does (as tests/test_studio_from_scratch.py does it): Tab to add,
    the inspector to shape the input and make the weight and bias, the context menu for the output."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    def settle():
        for _ in range(3):
            app.processEvents()

    def tab_add(text):
        w.view.setFocus()
        QTest.keyClick(w.view, Qt.Key_Tab)
        QTest.keyClicks(w.quick.edit, text)
        QTest.keyClick(w.quick.edit, Qt.Key_Return)
        settle()

    def type_into(editor, text):
        editor.setFocus()
        editor.selectAll()
        QTest.keyClicks(editor, text)
        QTest.keyClick(editor, Qt.Key_Return)
        settle()

    w.act["new"].trigger()
    p, sc = w.document.program, w.scene
    tab_add("input")
    x = p.inputs[0]
    sc.clearSelection()
    sc.terminals[x].setSelected(True)          # the inspector shows the input
    settle()
    type_into(w.inspector.source_editors[(x, "shape")], "64, 256")
    type_into(w.inspector.source_editors[(x, "name")], "tokens")
    tab_add("linear")
    lin = next(n.id for n in p.nodes.values() if n.op == "linear")
    sc.finish_drag(("out", x), sc.target_pos(lin, 0))
    sc.select_nodes([lin])
    settle()
    for port in (1, 2):                      # New parameter: weight [out, in], then bias [out]
        QTest.mouseClick(w.inspector.port_actions[(port, "parameter")], Qt.LeftButton)
        settle()
    tab_add("relu")
    relu = next(n.id for n in p.nodes.values() if n.op == "relu")
    sc.finish_drag(("out", p.nodes[lin].outputs[0]), sc.target_pos(relu, 0))
    menu = sc.context_menu(sc.nodes[relu].sceneBoundingRect().center())
    next(a for a in menu.actions() if a.text().startswith("Mark") and "program output" in a.text()).trigger()
    w.act["layout"].trigger()
    w.layout_runner.wait()
    settle()
    w.agent.act["plan"].trigger()
    w.view.fit_all()
    sc.select_nodes([lin])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
