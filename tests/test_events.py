"""The agent's event stream: emitter, schema, and a reader that names what is wrong with a line."""
import io
import json

import pytest

from agent_core.agent import SCHEMA, VERSION, EventEmitter, EventError, parse_event, read_events


def _fields(name):
    return {k: ("x" if k not in ("ok", "kept", "cached") else True) for k in SCHEMA[name]}


def test_every_event_round_trips_through_the_reader():
    buf = io.StringIO()
    em = EventEmitter(buf)
    for name in SCHEMA:
        em.emit(name, **_fields(name)) if name != "log" else em.log("hello")
    lines = buf.getvalue().splitlines()
    assert len(lines) == len(SCHEMA) == em.count
    events = list(read_events(lines))
    assert [e["event"] for e in events] == list(SCHEMA)
    assert all(e["v"] == VERSION and e["t"] >= 0 for e in events)
    ts = [e["t"] for e in events]
    assert ts == sorted(ts)


def test_emitter_refuses_unknown_events_and_missing_fields():
    em = EventEmitter(io.StringIO())
    with pytest.raises(EventError, match="unknown event 'plam'"):
        em.emit("plam", program="p")
    with pytest.raises(EventError, match="'verify' is missing ok, draws"):
        em.emit("verify", scope="region")


def test_emitter_callback_and_json_safety():
    seen = []
    em = EventEmitter(callback=seen.append)
    em.emit("profile", scope="region", ms=float("nan"), extra=(1, 2), regions={1: "a"})
    assert seen[0]["ms"] is None and seen[0]["extra"] == [1, 2] and seen[0]["regions"] == {"1": "a"}
    json.dumps(seen[0], allow_nan=False)


@pytest.mark.parametrize("line, message", [
    ("hello world", "line 1: not JSON"),
    ("[1, 2]", "line 1: an event must be a JSON object, got list"),
    ('{"v": 2, "event": "done", "t": 0, "status": "done"}', "line 1: event stream version 2"),
    ('{"event": "done", "t": 0, "status": "done"}', "line 1: event stream version None"),
    ('{"v": 1, "event": "dnoe", "t": 0}', "line 1: unknown event 'dnoe'"),
    ('{"v": 1, "event": "done", "status": "done"}', "line 1: 'done' event has no valid time"),
    ('{"v": 1, "event": "done", "t": -1, "status": "done"}', "no valid time"),
    ('{"v": 1, "event": "done", "t": true, "status": "done"}', "no valid time"),
    ('{"v": 1, "event": "compile", "t": 1, "region": "r1"}', "'compile' event is missing kernel, arch, seconds, cached"),
    ('{"v": 1, "event": "log", "t": 1, "level": "loud", "message": "m"}', "log level 'loud'"),
    ('{"v": 1, "event": "done", "t": 1, "status": "done"', "not JSON"),
])
def test_reader_names_the_problem_of_each_garbage_line(line, message):
    with pytest.raises(EventError, match=message.replace("(", r"\(").replace("[", r"\[")) as info:
        list(read_events([line]))
    assert info.value.line == 1


def test_lenient_reader_skips_and_records_bad_lines():
    good = json.dumps({"v": 1, "event": "done", "t": 0.5, "status": "done"})
    bad: list = []
    lines = [good, "Traceback (most recent call last):", "", good + "\n", "{}"]
    events = list(read_events(lines, strict=False, bad=bad))
    assert len(events) == 2
    assert [b.line for b in bad] == [2, 5]
    assert "not JSON" in bad[0].error and bad[0].text.startswith("Traceback")
    assert "version None" in bad[1].error


def test_parse_event_without_line_number():
    with pytest.raises(EventError, match="^empty line$"):
        parse_event("   ")
