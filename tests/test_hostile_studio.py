"""Hostile start-up files and a hostile worker stream (pytest-qt, offscreen).

Each damaged recovery copy, settings value, settings file and theme file is written into a private
data / config folder, then the studio starts through its real start path (app.main.open_studio, or
`stitchcuda studio --screenshot` as a process): it starts, shows a one-line notice naming the file or
key, and the bad file was renamed NAME.bad-<time> with its bytes intact (every other file as it was).
A worker stand-in printing 100k junk lines and a 10 MB line between real events: every event arrives,
the event loop keeps ticking, the client's buffers stay bounded and the Decision log holds the first
200 junk lines (cut) and the count of the rest.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
import tracemalloc
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st
from PySide6.QtCore import QPointF, QSettings, QStandardPaths, QTimer

QStandardPaths.setTestModeEnabled(True)   # as the other studio tests; the `home` fixture turns it off

from agent_core.ir import Program  # noqa: E402
from agent_core.project_file import save_program  # noqa: E402
from app import recovery, theme as themes  # noqa: E402
from app.main import application, open_studio  # noqa: E402
from app.worker_client import BAD_CHARS, KEEP_BAD, MAX_LINE  # noqa: E402
from tests.hostile import snapshot, unchanged  # noqa: E402
from tests.studio import Answers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEM = "0123456789abcdef"


@pytest.fixture
def home(qapp, tmp_path, monkeypatch):
    """This test's own recovery folder and settings file (XDG folders under tmp_path, Qt's shared test
    location off meanwhile, so parallel runs never see each other's bad files)."""
    application()   # the studio's organisation and application names, as a real start sets them
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    test_mode = QStandardPaths.isTestModeEnabled()
    QStandardPaths.setTestModeEnabled(False)
    previous = os.path.dirname(os.path.dirname(QSettings("StitchCUDA", "path-probe").fileName()))
    QSettings.setPath(QSettings.NativeFormat, QSettings.UserScope, str(tmp_path / "config"))
    folder = tmp_path / "data" / "StitchCUDA" / "Studio" / "recovery"
    folder.mkdir(parents=True)
    conf = tmp_path / "config" / "StitchCUDA" / "Studio.conf"
    conf.parent.mkdir(parents=True)
    yield SimpleNamespace(recovery=folder, conf=conf, tmp=tmp_path)
    QSettings.setPath(QSettings.NativeFormat, QSettings.UserScope, previous)
    QStandardPaths.setTestModeEnabled(test_mode)


@pytest.fixture
def start(qtbot, home):
    """Start the studio the way `stitchcuda studio` does (without the event loop); closed afterwards."""
    windows = []

    def go(theme="dark", **answers):
        win = open_studio(theme, ask=Answers(**{"restore": "yes", **answers}))
        qtbot.addWidget(win)
        windows.append(win)
        assert win.isVisible()
        return win
    yield go
    for win in windows:
        win.agent.shutdown()
        win.document.mark_clean()
        win.close()
        win.deleteLater()    # destroyed at the test's end by conftest's _destroy_closed_widgets


def program(name="rescued") -> Program:
    p = Program(name)
    x = p.add_input("x", (4, 4))
    p.mark_output(p.add_node("relu", [x.id]).outputs[0])
    return p


def copy(folder, stem=STEM, meta=None, saved_at=None, original=None):
    """A recovery copy as the studio writes it; `meta` (bytes) replaces its note."""
    save_program(program(), folder / f"{stem}.json")
    note = meta if meta is not None else json.dumps({"original": original, "saved_at": saved_at or time.time()})
    (folder / f"{stem}.meta.json").write_bytes(note if isinstance(note, bytes) else note.encode())


def assert_set_aside(before: dict, after: dict, names) -> None:
    """Each of `names` is gone and sits, byte for byte, under exactly one NAME.bad-<time>; nothing
    else changed."""
    moved = set()
    for name in names:
        assert name not in after, f"{name} is still there"
        aside = [k for k in after if k.startswith(name + ".bad-")]
        assert len(aside) == 1, (name, sorted(after))
        assert after[aside[0]] == before[name], f"{name} changed while it was set aside"
        moved.add(aside[0])
    assert {k: v for k, v in after.items() if k not in moved} == \
        {k: v for k, v in before.items() if k not in names}


def assert_noticed(win, *words) -> str:
    """One notice has all `words`; it is on the status bar and in the Decision log."""
    hits = [n for n in win.notices if all(w in n for w in words)]
    assert hits, (words, win.notices)
    assert "\n" not in hits[0]
    assert win.refusal_label.text().startswith(win.notices[-1])
    assert any(e.get("event") == "studio" and e.get("message") == hits[0] for e in win.agent.log.events)
    return hits[0]


# recovery folder --------------------------------------------------------------------------------------
def _fifo(f, stem):
    copy(f, stem)
    os.remove(f / f"{stem}.meta.json")
    os.mkfifo(f / f"{stem}.meta.json")   # opening it would block the start for ever


def _link(f, stem, part):
    copy(f, stem)
    outside = f.parent / f"elsewhere-{stem}{part}"
    os.replace(f / f"{stem}{part}", outside)
    os.symlink(outside, f / f"{stem}{part}")


def _only(f, stem, part):
    copy(f, stem)
    (f / f"{stem}.json.npz").write_bytes(b"PK\x05\x06" + bytes(18))
    for p in (".meta.json", ".json", ".json.npz"):
        if p != part:
            os.remove(f / f"{stem}{p}")


def _directory(f, stem):
    copy(f, stem)
    os.remove(f / f"{stem}.meta.json")
    os.mkdir(f / f"{stem}.meta.json")


def _note(meta: bytes):
    return lambda f, stem: copy(f, stem, meta=meta)


M, J, N = ".meta.json", ".json", ".json.npz"
RECOVERY_CASES = {   # how the copy is damaged, its files that are set aside, words of the notice
    "meta is a list": (_note(b"[]"), [M, J], ["JSON list, not an object"]),
    "saved_at is text": (_note(b'{"original": null, "saved_at": "yesterday"}'), [M, J],
                         ["saved_at is not a number", "yesterday"]),
    "saved_at is NaN": (_note(b'{"original": null, "saved_at": NaN}'), [M, J], ["saved_at"]),
    "saved_at is huge": (_note(b'{"original": null, "saved_at": 1' + b"0" * 400 + b"}"), [M, J], ["saved_at"]),
    "saved_at is missing": (_note(b'{"original": null}'), [M, J], ["saved_at"]),
    "original is a number": (_note(b'{"original": 5, "saved_at": 1.0}'), [M, J], ["original is not a file path"]),
    "original has a NUL": (_note(b'{"original": "a\\u0000b", "saved_at": 1.0}'), [M, J], ["original"]),
    "meta is not UTF-8": (_note(b'\xff\xfe{"saved_at": 1}'), [M, J], ["not UTF-8"]),
    "meta is not JSON": (_note(b'{"saved_at": '), [M, J], ["not JSON"]),
    "meta nests deeply": (_note(b"[" * 50_000), [M, J], ["nested too deeply"]),
    "meta is huge": (_note(b'{"saved_at": 1, "pad": "' + b"x" * (1 << 20) + b'"}'), [M, J],
                     ["1,048,", "more than the 65,536"]),
    "meta is a fifo": (_fifo, [M, J], ["is not a regular file"]),
    "meta is a folder": (_directory, [M, J], ["is not a regular file"]),
    "meta is a symlink": (lambda f, stem: _link(f, stem, M), [M, J], ["is a symbolic link"]),
    "program is a symlink": (lambda f, stem: _link(f, stem, J), [M, J], ["is a symbolic link"]),
    "meta is missing": (lambda f, stem: _only(f, stem, J), [J], ["its note (.meta.json) is missing"]),
    "program is missing": (lambda f, stem: _only(f, stem, M), [M], ["program copy (.json) is missing"]),
    "sidecar alone": (lambda f, stem: _only(f, stem, N), [N], ["sidecar without its program"]),
    "program does not load": (lambda f, stem: (copy(f, stem), (f / f"{stem}.json").write_text('{"format": 0}')),
                              [M, J], ["does not load"]),
}


def test_damaged_recovery_copies_are_set_aside_with_notices_and_a_good_one_is_offered(home, start):
    """Every damaged kind at once, beside a good copy older than all of them: one start sets each
    aside (bytes intact, nothing else touched) with its own notice, then offers the good one."""
    stems = {case: f"{i:016x}" for i, case in enumerate(RECOVERY_CASES, 1)}
    for case, (make, _names, _words) in RECOVERY_CASES.items():
        make(home.recovery, stems[case])
    copy(home.recovery, stem="f" * 16, saved_at=time.time() - 60, original="/tmp/work.json")
    outside = {k: v for k, v in snapshot(home.recovery.parent).items() if not k.startswith("recovery")}
    before = {k: v for k, v in snapshot(home.recovery).items() if not k.startswith("f" * 16)}
    win = start()
    aside = [stems[c] + part for c, (_m, names, _w) in RECOVERY_CASES.items() for part in names]
    assert_set_aside(before, snapshot(home.recovery), aside)   # the good copy is gone: it was restored
    for case, (_make, names, words) in RECOVERY_CASES.items():
        assert_noticed(win, stems[case] + names[0], *words)
    assert len(win.notices) == len(RECOVERY_CASES)
    assert {k: v for k, v in snapshot(home.recovery.parent).items() if not k.startswith("recovery")} == outside
    (kind, _title, text), = win.ask.asked   # the one question: restore the good copy
    assert kind == "restore" and "/tmp/work.json" in text and "Damaged start-up files were set aside" in text
    assert win.document.program.name == "rescued" and win.document.dirty
    assert win.document.path == "/tmp/work.json" and not (home.recovery / ("f" * 16 + J)).exists()
    with unchanged(home.recovery):   # set aside for good: the next start has nothing to say
        again = start()
    assert again.notices == [] and again.ask.asked == []


def test_a_name_that_is_not_utf8_is_set_aside(home, start):
    bad = os.fsdecode(b"\xff\xfe.meta.json")
    (home.recovery / bad).write_bytes(b'{"original": null, "saved_at": 1.0}')
    before = snapshot(home.recovery)
    win = start()
    assert_set_aside(before, snapshot(home.recovery), [bad])
    assert_noticed(win, "\\xff\\xfe.meta.json", "not UTF-8")


def test_a_file_where_the_recovery_folder_belongs_is_set_aside(home, start):
    shutil.rmtree(home.recovery)
    home.recovery.write_bytes(b"not a folder")
    before = snapshot(home.recovery.parent)
    win = start()
    after = snapshot(home.recovery.parent)
    assert after["recovery"][0] == "dir"
    assert_set_aside(before, {k: v for k, v in after.items() if k != "recovery"}, ["recovery"])
    assert_noticed(win, "Recovery folder", "set aside as recovery.bad-", "is not a folder")
    win.scene.add_node("relu", QPointF(0, 0))
    assert win.autosave() and recovery.pending()   # autosave works again


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)
METAS = JSON | st.fixed_dictionaries({"original": JSON, "saved_at": JSON}) | \
    st.fixed_dictionaries({"original": st.none() | st.text(max_size=40), "saved_at": st.integers() | st.floats()})


def _good(meta) -> bool:
    """The note the studio can use: an object, saved_at a finite number, original a path or null."""
    if not isinstance(meta, dict):
        return False
    t, o = meta.get("saved_at"), meta.get("original")
    try:
        t_ok = isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(float(t))
    except OverflowError:
        t_ok = False
    try:
        o_ok = o is None or (isinstance(o, str) and o != "" and "\x00" not in o and bool(os.fsencode(o)))
    except UnicodeEncodeError:
        o_ok = False
    return t_ok and o_ok


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(meta=METAS)
def test_random_notes_are_offered_or_set_aside_never_fatal(home, meta):
    shutil.rmtree(home.recovery)
    home.recovery.mkdir()
    copy(home.recovery, meta=json.dumps(meta).encode())
    before = snapshot(home.recovery)
    found = recovery.scan()
    after = snapshot(home.recovery)
    if _good(meta):
        assert after == before and found.notices == [] and len(found.entries) == 1
        prog, original = recovery.restore(found.entries[0]["file"])
        assert prog.name == "rescued" and original == meta.get("original")
    else:
        assert found.entries == [] and len(found.notices) == 1 and STEM + M in found.notices[0]
        assert_set_aside(before, after, [STEM + M, STEM + J])


# settings ---------------------------------------------------------------------------------------------
SETTINGS_CASES = {   # [General] line, words of the notice
    "theme": ("theme=a, b", ["'theme'", "['a', 'b']", "reset to dark"]),
    "geometry": ("geometry=abc", ["'geometry'", "'abc'", "window size"]),
    "windowState": ("windowState=5", ["'windowState'", "dock layout"]),
    "recent": ("recent=1, @Invalid(), /no/such/file.json, {real}, relative.json", ["'recent'", "4 of its 5 entries"]),
}
JUNK_BYTES = {   # values of the right type that Qt refuses to restore
    "geometry": ("geometry=@ByteArray(junk\\0\\x1)", ["'geometry' could not be restored"]),
    "windowState": ("windowState=@ByteArray(\\xff\\xff\\xff)", ["'windowState' could not be restored"]),
    "theme": ("theme=purple", ["'theme'", "'purple'"]),
    "recent": ("recent=5", ["'recent'", "1 of its 1 entries"]),
}


@pytest.mark.parametrize("cases", [SETTINGS_CASES, JUNK_BYTES], ids=["wrong types", "refused values"])
def test_bad_settings_are_reset_with_notices(cases, home, start):
    real = str(home.tmp / "real.json")
    save_program(program(), real)
    home.conf.write_text("[General]\n" + "\n".join(line for line, _ in cases.values()).replace("{real}", real) + "\n")
    win = start(theme=None)
    assert win.theme == "dark" and len(win.notices) == len(cases)
    for _line, words in cases.values():
        assert_noticed(win, *words)
    stored = QSettings("StitchCUDA", "Studio")
    assert [stored.value(k) for k in ("theme", "geometry", "windowState")] == [None, None, None]   # defaults
    want = [real] if "{real}" in cases["recent"][0] else []
    assert (stored.value("recent") or []) == want and [a.text() for a in win.recent_menu.actions()] == want


def _pickled_setting(home, marker) -> str:
    """A settings file whose 'recent' holds a pickled object that creates `marker` when unpickled,
    written by QSettings itself in another process (as a hostile tool could)."""
    code = ("import sys\nfrom PySide6.QtCore import QSettings\n"
            "class Evil:\n    def __reduce__(self):\n        return (open, (sys.argv[1], 'w'))\n"
            "s = QSettings('StitchCUDA', 'Studio'); s.setValue('recent', Evil()); s.sync()\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(home.tmp / "config")}
    subprocess.run([sys.executable, "-c", code, str(marker)], env=env, check=True, timeout=60)
    text = home.conf.read_text()
    assert "@Variant(" in text and not marker.exists()
    return text


def test_settings_file_with_a_pickled_object_is_set_aside_unread_by_the_cli(home):
    marker = home.tmp / "pickle-ran"
    _pickled_setting(home, marker)
    (home.conf.parent / "other.conf").write_text("[General]\nx=1\n")
    before = snapshot(home.conf.parent)
    out = home.tmp / "shot.png"
    env = {**os.environ, "XDG_DATA_HOME": str(home.tmp / "data"), "XDG_CONFIG_HOME": str(home.tmp / "config"),
           "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-m", "agent_core.cli", "studio", "--screenshot", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 10_000 and not marker.exists()
    notice, = [ln for ln in r.stderr.splitlines() if "Studio.conf" in ln]
    assert "set aside as Studio.conf.bad-" in notice and "serialized object" in notice
    after = {k: v for k, v in snapshot(home.conf.parent).items() if k != "Studio.conf"}   # the run saved anew
    assert_set_aside(before, after, ["Studio.conf"])


def test_an_escaped_pickled_setting_is_set_aside_too(home, start):
    marker = home.tmp / "pickle-ran"
    text = _pickled_setting(home, marker)
    home.conf.write_text(text.replace("@Variant(", "\\x40Variant("))   # Qt un-escapes this to @Variant(
    before = snapshot(home.conf.parent)
    win = start(theme=None)
    assert not marker.exists()
    assert_noticed(win, "Studio.conf", "serialized object")
    assert_set_aside(before, snapshot(home.conf.parent), ["Studio.conf"])


@pytest.mark.parametrize("case", ["huge", "folder"])
def test_an_unusable_settings_file_is_set_aside(case, home, start):
    if case == "huge":
        home.conf.write_text("[General]\ntheme=dark\npad=" + "x" * (2 << 20) + "\n")
    else:
        home.conf.mkdir()
    before = snapshot(home.conf.parent)
    win = start(theme=None)
    assert_noticed(win, "Studio.conf", "more than" if case == "huge" else "not a regular file")
    assert_set_aside(before, snapshot(home.conf.parent), ["Studio.conf"])


# theme files ------------------------------------------------------------------------------------------
def test_damaged_theme_files_fall_back_with_a_notice(home, start, qapp):
    fake = home.tmp / "resources" / "theme"
    shutil.copytree(themes.THEME_DIR, fake)
    (fake / "dark.json").write_text('{"window": "red; } QWidget { font-size: 90px"}')   # would end a QSS rule
    (fake / "studio.qss").unlink()
    (fake / "icons" / "save.svg").write_bytes(b"\xff\xfe not an svg")
    (fake / "icons" / "undo.svg").write_text("<svg not closed")
    real, themes.THEME_DIR = themes.THEME_DIR, str(fake)
    try:
        with unchanged(fake):   # the studio's own files are not renamed
            win = start()
        assert_noticed(win, "theme/dark.json", "built-in dark colours")
        assert_noticed(win, "theme/studio.qss", "missing")
        assert_noticed(win, "theme/icons/save.svg", "not UTF-8")
        assert_noticed(win, "theme/icons/undo.svg", "not an SVG")
        assert qapp.palette().window().color().name() == themes.BUILT_IN["dark"]["window"]
        assert win.act["save"].icon().isNull() and not win.act["open"].icon().isNull()
    finally:
        themes.THEME_DIR = real
        themes.apply(qapp, "dark")   # the real look for the tests that follow
        themes.take_notices()


# the worker's stream ----------------------------------------------------------------------------------
JUNK = r'''
import json, sys
def ev(name, **kw):
    print(json.dumps({"v": 1, "event": name, "t": 0.1, **kw}), flush=True)
ev("plan", program="p", nodes=2, regions=1, kernels=1)
sys.stdout.write("y" * 10_000_000 + "\n")       # one 10 MB line, written in one go
sys.stdout.flush()
ev("log", level="info", message="after the long line")
for i in range(100_000):
    print(f"junk {i}: Loading weights " + "z" * 400)
sys.stderr.write("e" * 100_000 + "\n")
ev("log", level="info", message="after the junk")
for i in range(20):
    ev("log", level="info", message=f"event {i}")
ev("done", status="stand-in")
'''


def test_a_junk_flood_is_bounded_and_the_gui_keeps_ticking(studio_window, qtbot):
    win, worker = studio_window, studio_window.agent.worker
    ticks, held = [], []

    def tick():
        ticks.append(time.perf_counter())
        held.append(worker.buffered_bytes())
    timer = QTimer(interval=20, timeout=tick)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    timer.start()
    with qtbot.waitSignal(worker.finished, timeout=120_000) as done:
        worker.start("", program=[sys.executable, "-c", JUNK])
    timer.stop()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert done.args[0] == "stand-in", done.args
    assert [e.get("message", e["event"]) for e in worker.events] == \
        ["plan", "after the long line", "after the junk"] + [f"event {i}" for i in range(20)] + ["done"]
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) > 10 and max(gaps) < 0.5, max(gaps)
    assert max(held) <= MAX_LINE + 64 * 1024 and peak < 48 << 20, (max(held), peak)
    rows = [e["message"] for e in win.agent.log.events if e.get("event") == "studio"]
    junk = [r for r in rows if r.startswith("the worker printed something that is not an event")]
    assert len(junk) == KEEP_BAD and all(len(r) <= BAD_CHARS for r in junk)
    assert "10,000,000 bytes long, cut at 1,048,576" in junk[0] and "junk 0: Loading weights" in junk[1]
    assert "and 99,801 more lines that were not events" in rows
    assert worker.bad_count == 100_001 and len(worker.bad) == KEEP_BAD
    assert all(len(line) <= 500 for line in worker.stderr_tail)
