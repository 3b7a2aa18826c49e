"""The kernel writer in the studio (issue #18), driven as a user drives it (pytest-qt, offscreen, CPU).

Settings > Kernel Writer… is filled in with the keyboard and saved: the endpoint lands in the user's
settings and never in a saved program; Test Connection lists a real stub server's models off the GUI
thread. Agent > Ask the Model (menu, shortcut, the Regions list's right-click) is greyed out with a reason
until an endpoint is set and a region selected; triggered, it launches the worker with the writer flags
and the key only in the worker's environment. A recorded stream of writer events fills the Kernel writer
dock (conversation, verdicts, diff) and the decision log, readable at 1200 x 750. End to end, the real
worker runs on the CPU against tests/writer_stub.py as a process (a compile error, then the fix), and
Cancel during a slow reply stops it with the document unchanged.
"""
from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import time

import pytest
from PySide6.QtCore import QPoint, QSettings, QStandardPaths, Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication

QStandardPaths.setTestModeEnabled(True)

from app.document import Document  # noqa: E402
from app.writer_dock import proposed_source  # noqa: E402
from app.writer_settings import DEFAULT_KEY_ENV, NO_ENDPOINT  # noqa: E402
from tests.writer_cases import case_program, region_and_ours, reply_text  # noqa: E402
from tests.writer_stub import plain, slow, streamed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ("--no-rewrite", "--no-tune", "--cpu", "--no-baselines")
KEY = "sk-test-9f31c-NEVER-SHOWN"
SLOW_MS = 180_000   # a worker imports torch, plans, compiles with NVRTC and runs g++ on the CPU


@pytest.fixture
def settings_home(tmp_path):
    """The user's settings file under tmp_path, so no test sees another's endpoint (or the real one)."""
    previous = os.path.dirname(os.path.dirname(QSettings("StitchCUDA", "path-probe").fileName()))
    QSettings.setPath(QSettings.NativeFormat, QSettings.UserScope, str(tmp_path / "config"))
    yield tmp_path / "config" / "StitchCUDA" / "Studio.conf"
    QSettings.setPath(QSettings.NativeFormat, QSettings.UserScope, previous)


@pytest.fixture
def window(settings_home, studio_window):
    """The studio on the writer's case program (one row region, r1), planned."""
    studio_window.agent.worker_args = FAST
    program = case_program()
    region_and_ours(program)
    studio_window.set_document(Document(program))
    studio_window._layout_if_needed(studio_window.document, True)
    return studio_window


def set_endpoint(win, qtbot, url: str, model: str = "stub-model", key: str | None = None, rounds: int = 2):
    """Settings > Kernel Writer…, filled in with the keyboard and the mouse, then Save."""
    win.agent.act["writer_settings"].trigger()
    dlg = win.agent.writer_dialog
    assert dlg is not None and dlg.isVisible()
    dlg.url.selectAll()
    qtbot.keyClicks(dlg.url, url)
    dlg.model.lineEdit().selectAll()
    qtbot.keyClicks(dlg.model.lineEdit(), model)
    dlg.limits["rounds"].selectAll()
    qtbot.keyClicks(dlg.limits["rounds"], str(rounds))
    if key is not None:
        qtbot.mouseClick(dlg.key_stored, Qt.LeftButton, pos=QPoint(8, dlg.key_stored.height() // 2))
        assert dlg.key.isEnabled()
        qtbot.keyClicks(dlg.key, key)
        assert dlg.key.echoMode() == dlg.key.EchoMode.Password and key not in dlg.key.displayText()
    qtbot.mouseClick(dlg.buttons.button(dlg.buttons.StandardButton.Save), Qt.LeftButton)
    assert not dlg.isVisible(), dlg.problem.text()
    return dlg


def click_region(win, qtbot, rid: str = "r1") -> None:
    tree = win.agent.regions.tree
    item = next(tree.topLevelItem(i) for i in range(tree.topLevelItemCount()) if tree.topLevelItem(i).text(0) == rid)
    qtbot.mouseClick(tree.viewport(), Qt.LeftButton, pos=tree.visualItemRect(item).center())
    assert win.agent.current == rid


def focus_canvas(win, qtbot) -> None:
    """Shortcuts go to the active window: the dialog, closed offscreen, leaves none active."""
    win.windowHandle().requestActivate()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is win, timeout=5_000)
    win.view.setFocus()


def snapshot(win):
    return [r.to_dict() for r in win.document.program.regions], win.document.stack.count()


class StubProcess:
    """tests/writer_stub.py run as its own process (as a model server is), replaying `responses`."""

    def __init__(self, tmp_path, responses: list[dict]):
        replay = tmp_path / "replay.json"
        replay.write_text(json.dumps(responses))
        self.port_file, self.log = tmp_path / "stub.url", tmp_path / "requests.jsonl"
        self.proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "writer_stub.py"), "--replay",
                                      str(replay), "--port-file", str(self.port_file), "--log", str(self.log)])
        deadline = time.monotonic() + 30
        while not self.port_file.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "the stub server did not start"
            time.sleep(0.05)
        self.url = self.port_file.read_text().strip()

    def requests(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def stub(tmp_path):
    made = []

    def start(responses):
        made.append(StubProcess(tmp_path, responses))
        return made[-1]
    yield start
    for s in made:
        s.stop()


# the settings dialog ------------------------------------------------------------------------------------
def test_endpoint_is_set_in_the_dialog_and_kept_in_the_user_settings_only(window, qtbot, settings_home, tmp_path):
    agent = window.agent
    ask = agent.act["ask_model"]
    assert not ask.isEnabled() and ask.toolTip() == NO_ENDPOINT   # off until an endpoint is set
    set_endpoint(window, qtbot, "https://models.example.com/v1", "big-coder", key=KEY, rounds=4)
    stored = QSettings("StitchCUDA", "Studio")    # read back from the file, as the next start would
    stored.sync()
    assert stored.value("writer/url") == "https://models.example.com/v1"
    assert stored.value("writer/model") == "big-coder" and int(stored.value("writer/rounds")) == 4
    assert stored.value("writer/key") == KEY and stored.value("writer/key_mode") == "stored"
    # a remote endpoint is named, with what leaves the machine, in the dock
    assert "sent to models.example.com" in agent.writer.notice.text()
    assert "weights and data are not" in agent.writer.notice.text()
    # saved programs hold nothing of it
    path = tmp_path / "saved.json"
    assert window.save_as(str(path))
    text = path.read_text()
    assert KEY not in text and "models.example.com" not in text and "big-coder" not in text
    # the dialog opens again on what was saved, the key masked
    agent.act["writer_settings"].trigger()
    dlg = agent.writer_dialog
    assert dlg.url.text() == "https://models.example.com/v1" and dlg.key_stored.isChecked()
    assert KEY not in dlg.key.displayText() and "sent to models.example.com" in dlg.privacy.text()
    # clearing the URL turns the feature off again
    dlg.url.clear()
    qtbot.mouseClick(dlg.buttons.button(dlg.buttons.StandardButton.Save), Qt.LeftButton)
    assert not ask.isEnabled() and ask.toolTip() == NO_ENDPOINT
    assert QSettings("StitchCUDA", "Studio").value("writer/key") is None   # no key kept for nothing


def test_the_dialog_refuses_what_cannot_work_and_says_why(window, qtbot):
    window.agent.act["writer_settings"].trigger()
    dlg = window.agent.writer_dialog
    qtbot.keyClicks(dlg.url, "ftp://x/v1")
    qtbot.keyClicks(dlg.model.lineEdit(), "m")
    qtbot.mouseClick(dlg.buttons.button(dlg.buttons.StandardButton.Save), Qt.LeftButton)
    assert dlg.isVisible() and "http://" in dlg.problem.text()
    dlg.url.clear()
    qtbot.keyClicks(dlg.url, "http://127.0.0.1:8000/v1")
    assert "nothing leaves it" in dlg.privacy.text()
    qtbot.mouseClick(dlg.key_stored, Qt.LeftButton, pos=QPoint(8, dlg.key_stored.height() // 2))
    qtbot.mouseClick(dlg.buttons.button(dlg.buttons.StandardButton.Save), Qt.LeftButton)
    assert dlg.isVisible() and "API key" in dlg.problem.text()
    assert QSettings("StitchCUDA", "Studio").value("writer/url") is None   # nothing was stored


def test_test_connection_lists_the_servers_models_off_the_gui_thread(window, qtbot, stub):
    server = stub([{"type": "raw", "status": 200, "headers": {"Content-Type": "application/json"},
                    "body": json.dumps({"object": "list", "data": [{"id": "qwen-coder"}, {"id": "llama-70b"}]})},
                   {"type": "http_error", "status": 401, "body": {"error": {"message": "bad key"}}}])
    window.agent.act["writer_settings"].trigger()
    dlg = window.agent.writer_dialog
    qtbot.keyClicks(dlg.url, server.url)
    with qtbot.waitSignal(dlg.tested, timeout=20_000) as got:
        qtbot.mouseClick(dlg.test_btn, Qt.LeftButton)
        assert not dlg.test_btn.isEnabled()   # asked on a pool thread: the dialog is back at once
    assert got.args[0] and "2 models" in dlg.test_result.text() and "qwen-coder" in dlg.test_result.text()
    assert [dlg.model.itemText(i) for i in range(dlg.model.count())] == ["qwen-coder", "llama-70b"]
    with qtbot.waitSignal(dlg.tested, timeout=20_000) as got:
        qtbot.mouseClick(dlg.test_btn, Qt.LeftButton)
    assert not got.args[0] and "HTTP 401" in dlg.test_result.text() and "API key" in dlg.test_result.text()
    assert [r["path"] for r in server.requests()] == ["/v1/models", "/v1/models"] or \
        all(r["path"].endswith("/models") for r in server.requests())


# the ask action -----------------------------------------------------------------------------------------
def test_ask_is_greyed_out_with_a_reason_until_it_can_run(window, qtbot):
    agent = window.agent
    ask = agent.act["ask_model"]
    assert ask in agent.window.menu("agent").actions() and ask.shortcut().toString() == "Ctrl+Shift+M"
    shortcuts = [s.toString() for a in window.findChildren(type(ask)) if a is not ask for s in a.shortcuts()]
    assert "Ctrl+Shift+M" not in shortcuts
    set_endpoint(window, qtbot, "http://127.0.0.1:9/v1")
    agent.select_region(None)
    assert not ask.isEnabled() and "Select a region" in ask.toolTip()
    # the Regions list's right-click menu selects the row under the mouse and offers the ask
    tree = agent.regions.tree
    menu = agent.region_menu(tree.visualItemRect(tree.topLevelItem(0)).center())
    assert agent.current == "r1" and ask in menu.actions() and ask.isEnabled()


def test_ask_launches_the_worker_with_the_key_only_in_its_environment(window, qtbot, stub):
    server = stub([slow(120)])
    agent = window.agent
    set_endpoint(window, qtbot, server.url, key=KEY)
    click_region(window, qtbot)
    before = snapshot(window)
    focus_canvas(window, qtbot)
    qtbot.keyClick(window.view, Qt.Key_M, Qt.ControlModifier | Qt.ShiftModifier)   # as a user asks
    assert agent.worker.running and not agent.act["ask_model"].isEnabled()
    assert "A run is going" in agent.act["ask_model"].toolTip()
    argv = agent.worker.proc.arguments()
    assert all(KEY not in a for a in argv) and all(KEY not in a for a in agent.worker.arguments)
    i = argv.index("--writer")
    assert argv[i + 1] == server.url and argv[argv.index("--writer-regions") + 1] == "r1"
    assert argv[argv.index("--writer-model") + 1] == "stub-model" and argv[argv.index("--writer-rounds") + 1] == "2"
    assert argv[argv.index("--writer-key-env") + 1] == DEFAULT_KEY_ENV
    assert agent.worker.proc.processEnvironment().value(DEFAULT_KEY_ENV) == KEY
    assert agent.writer_dock.isVisible()
    with qtbot.waitSignal(agent.worker.finished, timeout=30_000) as done:
        agent.act["cancel"].trigger()
    assert done.args[0] == "cancelled" and "Ask the model was cancelled" in done.args[1]
    assert snapshot(window) == before and agent.act["ask_model"].isEnabled()


def test_a_key_from_the_environment_is_named_not_copied_and_no_key_means_none(window, qtbot, stub, monkeypatch):
    server = stub([slow(120), slow(120)])
    agent = window.agent
    monkeypatch.setenv("MY_MODEL_KEY", KEY)
    monkeypatch.setenv(DEFAULT_KEY_ENV, "inherited-but-not-asked-for")
    agent.act["writer_settings"].trigger()
    dlg = agent.writer_dialog
    qtbot.keyClicks(dlg.url, server.url)
    qtbot.keyClicks(dlg.model.lineEdit(), "stub-model")
    qtbot.mouseClick(dlg.key_from_env, Qt.LeftButton, pos=QPoint(8, dlg.key_from_env.height() // 2))
    dlg.key_env.selectAll()
    qtbot.keyClicks(dlg.key_env, "MY_MODEL_KEY")
    qtbot.mouseClick(dlg.buttons.button(dlg.buttons.StandardButton.Save), Qt.LeftButton)
    assert QSettings("StitchCUDA", "Studio").value("writer/key") is None   # only the variable's name is kept
    click_region(window, qtbot)
    for mode, want in (("env", "MY_MODEL_KEY"), ("none", DEFAULT_KEY_ENV)):
        if mode == "none":
            agent.act["writer_settings"].trigger()
            dlg = agent.writer_dialog
            qtbot.mouseClick(dlg.key_none, Qt.LeftButton, pos=QPoint(8, dlg.key_none.height() // 2))
            qtbot.mouseClick(dlg.buttons.button(dlg.buttons.StandardButton.Save), Qt.LeftButton)
        agent.act["ask_model"].trigger()
        argv, env = agent.worker.proc.arguments(), agent.worker.proc.processEnvironment()
        assert argv[argv.index("--writer-key-env") + 1] == want and all(KEY not in a for a in argv)
        if mode == "env":   # the worker reads the variable the studio was started with
            assert env.value("MY_MODEL_KEY") == KEY
        else:               # no key asked for: none sent, not even one inherited
            assert not env.contains(DEFAULT_KEY_ENV)
        with qtbot.waitSignal(agent.worker.finished, timeout=30_000):
            agent.act["cancel"].trigger()


# a recorded stream ----------------------------------------------------------------------------------------
def recorded_stream(program) -> list[dict]:
    """What a worker prints for region r1 with --writer (docs/EVENTS.md): a compile error in round 1,
    the fix verified in round 2 (on the CPU: not timed, ours kept)."""
    region, ours = region_and_ours(program)
    t = iter(x * 0.5 for x in range(100))

    def ev(name, **f):
        return {"v": 1, "event": name, "t": next(t), "region": "r1", **f}

    sent = [{"role": "system", "content": "You write CUDA kernels for StitchCUDA."},
            {"role": "user", "content": f"Region r1: softmax, mul, add on x[32, 200]. Our kernel:\n{ours.source}"}]
    first, second = reply_text("compile_error"), reply_text("fixed")
    diff = "".join(difflib.unified_diff(ours.source.splitlines(True), proposed_source(second).splitlines(True),
                                        "ours/writer_demo_r1.cu", "model/writer_demo_r1_model.cu"))
    again = sent + [{"role": "assistant", "content": first},
                    {"role": "user", "content": "Round 1 did not compile: line 35: error: identifier \"flaot\" is undefined"}]
    common = dict(model="stub-model", endpoint="models.example.com", remote=True)
    return [
        {"v": 1, "event": "plan", "t": 0.0, "program": "writer_demo", "nodes": 3, "regions": 1, "kernels": 1},
        ev("writer-request", round=1, messages=sent, **common),
        ev("writer-delta", round=1, text=first[:300]),
        ev("writer-delta", round=1, text=first[300:]),
        ev("writer-reply", round=1, text=first, prompt_tokens=900, completion_tokens=700, finish_reason="stop",
           seconds=3.2),
        ev("writer-verdict", round=1, ok=False, check="compile",
           reason='line 35: error: identifier "flaot" is undefined', ms=None, ours_ms=None, kernel=None, diff=None),
        ev("writer-request", round=2, messages=again, **common),
        ev("writer-delta", round=2, text=second[:200]),
        ev("writer-reply", round=2, text=second, prompt_tokens=1700, completion_tokens=720, finish_reason="stop",
           seconds=3.0),
        ev("writer-verdict", round=2, ok=True, check="ok", reason="verified on 3 draws under CPU emulation",
           ms=None, ours_ms=None, max_abs_err=2e-7, kernel="writer_demo_r1_model", diff=diff),
        ev("writer-done", kept=False, reason="verified under CPU emulation; not timed (no GPU), ours kept",
           model="stub-model", rounds=2, tokens=4020, ms=None, ours_ms=None),
    ]


def test_a_recorded_stream_fills_the_dock_the_diff_and_the_decision_log(window, qtbot):
    agent = window.agent
    window.resize(1200, 750)
    events = recorded_stream(window.document.program)
    for e in events[:4]:   # live: the first reply grows as its deltas arrive
        agent.on_event(e)
    dock = agent.writer
    assert dock.rounds("r1") == [1] and dock.conversation.toPlainText().endswith(events[3]["text"])
    assert "streaming" in dock.conversation.toPlainText()
    for e in events[4:]:
        agent.on_event(e)
    assert dock.rounds("r1") == [1, 2]
    region_row = dock.tree.topLevelItem(0)
    assert region_row.text(1) == "ours kept" and [region_row.child(i).text(1) for i in range(2)] == ["compile", "passed"]
    assert region_row.child(0).foreground(1).color() != region_row.child(1).foreground(1).color()
    dock.select("r1", 1)
    assert "rejected: compile" in dock.verdict.text() and "flaot" in dock.verdict.text()
    assert "You write CUDA kernels" in dock.conversation.toPlainText() and "700 tokens" in dock.conversation.toPlainText()
    dock.select("r1", 2)
    text = dock.conversation.toPlainText()
    assert "sends the conversation of round 1 again" in text and "did not compile" in text
    assert "You write CUDA kernels" not in text   # not repeated: round 1 shows it
    diff = dock.diff.toPlainText().splitlines()
    assert diff[0].startswith("--- ours/") and any(ln.startswith("+") for ln in diff[2:])
    marked = {s.cursor.blockNumber() for s in dock.diff.extraSelections()}
    assert marked == {i for i, ln in enumerate(diff) if ln[:1] in "+-@" and ln[:3] not in ("+++", "---")}
    assert dock.diff.font().fixedPitch() or QFontMetrics(dock.diff.font()).horizontalAdvance("i") == \
        QFontMetrics(dock.diff.font()).horizontalAdvance("m")
    # the proposal in the Generated source dock, and back to ours when the region is picked again
    qtbot.mouseClick(dock.source_btn, Qt.LeftButton)
    assert "writer_demo_r1" in agent.source.edit.toPlainText() and "round 2" in agent.source.title.text()
    assert agent.source.edit.toPlainText() == proposed_source(events[8]["text"])
    # the decision log: one row per request and verdict, and the outcome (no streamed text)
    rows = [agent.log.tree.topLevelItem(i) for i in range(agent.log.tree.topLevelItemCount())]
    steps = [r.text(1) for r in rows if r.text(1).startswith("writer")]
    assert steps == ["writer-request", "writer-verdict", "writer-request", "writer-verdict", "writer-done"]
    verdicts = [r for r in rows if r.text(1) == "writer-verdict"]
    assert "rejected (compile)" in verdicts[0].text(3) and "verified" in verdicts[1].text(3)
    assert "no model kernel kept" in rows[-1].text(3)


def test_a_kept_model_kernel_is_what_the_source_view_shows(window, qtbot):
    """The regions a finished run applies carry the kept kernel and the writer's decision-log entry
    (agent.loop: r.source, r.note("writer", "kept", ...)); the source view says whose kernel it is."""
    from agent_core.regions import replace_regions
    from graph_editor.region_commands import RegionEditCommand
    program = window.document.program
    fixed = proposed_source(reply_text("fixed"))
    region = program.regions[0].__class__.from_dict(program.regions[0].to_dict())
    region.source = fixed
    region.note("writer", "kept", "model kernel kept (round 2): 3.1 us vs ours 4.0 us")
    window.document.stack.push(RegionEditCommand(program, replace_regions(program, [region], label="Optimize results")))
    click_region(window, qtbot)
    src = window.agent.source
    assert src.edit.toPlainText() == fixed
    assert "written by the model and kept" in src.status.text() and "3.1 us vs ours 4.0 us" in src.status.text()


def test_the_dock_reads_at_1200_by_750(window, qtbot):
    agent = window.agent
    window.resize(1200, 750)
    agent.replay(recorded_stream(window.document.program))
    agent.writer_dock.show()
    agent.writer_dock.raise_()
    for _ in range(5):
        QApplication.processEvents()
    dock = agent.writer
    dock.select("r1", 1)
    QApplication.processEvents()
    assert dock.width() >= 560 and dock.height() >= 200, (dock.width(), dock.height())
    fm = QFontMetrics(dock.tree.font())
    for i in range(dock.tree.topLevelItem(0).childCount()):   # the round and its verdict are whole
        row = dock.tree.topLevelItem(0).child(i)
        assert fm.horizontalAdvance(row.text(0)) + 30 <= dock.tree.columnWidth(0), row.text(0)
        assert fm.horizontalAdvance(row.text(1)) + 8 <= dock.tree.viewport().width() - dock.tree.columnWidth(0)
    lines = dock.conversation.viewport().height() // QFontMetrics(dock.conversation.font()).lineSpacing()
    assert lines >= 6, lines
    assert dock.verdict.height() >= dock.verdict.heightForWidth(dock.verdict.width())   # wrapped, not cut
    assert dock.notice.height() >= dock.notice.heightForWidth(dock.notice.width())
    assert dock.conversation.horizontalScrollBar().maximum() == 0   # the conversation wraps
    shots = os.path.join(ROOT, "test-output", "screenshots")
    os.makedirs(shots, exist_ok=True)
    window.grab().save(os.path.join(shots, "writer_dock_1200x750.png"))


# the real worker ------------------------------------------------------------------------------------------
def reply(name: str) -> dict:
    return streamed(reply_text(name), chunk=200)


def test_the_worker_against_the_stub_server_shows_both_rounds(window, qtbot, stub):
    server = stub([reply("compile_error"), reply("fixed")])
    agent = window.agent
    set_endpoint(window, qtbot, server.url, key=KEY, rounds=2)
    click_region(window, qtbot)
    with qtbot.waitSignal(agent.worker.finished, timeout=SLOW_MS) as done:
        agent.act["ask_model"].trigger()
    status, message = done.args
    assert status == "no-gpu", (message, agent.worker.stderr_tail[-5:])
    dock = agent.writer
    assert dock.rounds("r1") == [1, 2]
    verdicts = [dock.talks["r1"].rounds[n].verdict for n in (1, 2)]
    assert verdicts[0]["check"] == "compile" and not verdicts[0]["ok"], verdicts[0]
    assert verdicts[1]["ok"], verdicts[1]
    assert "not timed" in dock.talks["r1"].done["reason"]
    # the model saw our kernel and round 1's compile error; the key went in the header only
    asked = server.requests()
    assert len(asked) == 2 and "flaot" in json.dumps(asked[1]["body"]["messages"])
    assert all(r["headers"].get("Authorization") == f"Bearer {KEY}" for r in asked)
    assert KEY not in dock.all_text()
    log = "\n".join(agent.log.tree.topLevelItem(i).text(3) for i in range(agent.log.tree.topLevelItemCount()))
    assert KEY not in log and "rejected (compile)" in log
    assert "Ask the model finished" in window.status_label.text()


def test_cancel_during_a_slow_reply_stops_the_worker_and_keeps_the_document(window, qtbot, stub):
    server = stub([slow(120, then=plain(reply_text("good")))])
    agent = window.agent
    set_endpoint(window, qtbot, server.url)
    click_region(window, qtbot)
    before = snapshot(window)
    agent.act["ask_model"].trigger()
    qtbot.waitUntil(lambda: agent.writer.rounds("r1") == [1], timeout=SLOW_MS)   # the request is out
    qtbot.waitUntil(lambda: len(server.requests()) == 1, timeout=10_000)
    t0 = time.monotonic()
    with qtbot.waitSignal(agent.worker.finished, timeout=20_000) as done:
        focus_canvas(window, qtbot)
        qtbot.keyClick(window.view, Qt.Key_F5, Qt.ShiftModifier)
    assert done.args[0] == "cancelled" and time.monotonic() - t0 < 10
    assert snapshot(window) == before and agent.live is None
    assert agent.worker.proc.state() == agent.worker.proc.ProcessState.NotRunning
