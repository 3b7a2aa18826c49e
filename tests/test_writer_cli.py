"""`stitchcuda optimize --writer` as a user runs it: the stub model server as a separate process
(tests/writer_stub.py --replay), the CLI as another, the key in the environment only. Round 1's
reply does not compile, its NVRTC line goes back, round 2's fix is verified under CPU emulation (and
not kept: nothing is timed without a GPU). The key appears nowhere but the Authorization header."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_core.agent import read_events
from agent_core.project_file import load_program, save_program
from tests.writer_cases import REPLIES, case_program
from tests.writer_stub import streamed

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-test-SECRET"


@pytest.fixture
def stub(tmp_path):
    """The stub server process replaying compile_error then fixed: (its URL, the file it logs requests to)."""
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([dict(streamed(""), text_file=str(REPLIES / f"{name}.md"))
                                  for name in ("compile_error", "fixed")]))
    port_file, log = tmp_path / "url.txt", tmp_path / "requests.jsonl"
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "writer_stub.py"), "--replay", str(replay),
                             "--port-file", str(port_file), "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not port_file.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the stub server did not start"
        time.sleep(0.05)
    yield port_file.read_text().strip(), log
    proc.terminate()
    proc.wait(timeout=10)


def _optimize(tmp_path, *extra):
    prog = tmp_path / "writer_demo.json"
    save_program(case_program(), prog)
    out = tmp_path / "out"
    env = dict(os.environ, STITCHCUDA_WRITER_KEY=SECRET, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize", str(prog), "--cpu", "-o", str(out),
                           *extra], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    with open(out / "events.jsonl") as f:
        events = list(read_events(f))
    return proc, out, events


def _requests(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_optimize_with_a_writer_talks_to_the_model_and_keeps_the_key_secret(stub, tmp_path):
    url, log = stub
    proc, out, events = _optimize(tmp_path, "--writer", url, "--writer-model", "stub", "--writer-rounds", "2")
    host = url.split("//")[1].split("/")[0]
    lines = proc.stdout.splitlines()
    # the progress a user reads
    assert f"  r1: writer round 1: asking stub at {host}" in lines
    assert any(ln.startswith("  r1: writer round 1: rejected (compile): ") and "flaot" in ln for ln in lines), lines
    assert any(ln.startswith("  r1: writer round 2: verified: verified under CPU emulation") for ln in lines), lines
    assert any(ln.startswith("  r1: no model kernel kept: verified under CPU emulation; not timed (no GPU), "
                             "ours kept") for ln in lines), lines
    assert any(ln.startswith("writer stub: 2 rounds") and "model kernels kept: none" in ln for ln in lines), lines
    assert "remote" not in proc.stdout          # 127.0.0.1: nothing leaves the machine
    # the event log: both rounds, round 1's compile error fed back in round 2's request
    requests_ev = [e for e in events if e["event"] == "writer-request"]
    assert [e["round"] for e in requests_ev] == [1, 2]
    assert requests_ev[0]["endpoint"] == host and requests_ev[0]["remote"] is False
    feedback = requests_ev[1]["messages"][-1]
    assert feedback["role"] == "user" and "does not compile" in feedback["content"] and "flaot" in feedback["content"]
    v1, v2 = [e for e in events if e["event"] == "writer-verdict"]
    assert (v1["check"], v1["ok"], v2["check"], v2["ok"]) == ("compile", False, "passed", True)
    assert "+  float s = 0.0f;" in v2["diff"]     # the diff against our kernel
    (done,) = [e for e in events if e["event"] == "writer-done"]
    assert done["kept"] is False and done["rounds"] == 2 and done["tokens"] > 0
    assert events[-1]["event"] == "done"
    # the decision log in the program file
    region = load_program(out / "program.json").regions[0]
    (entry,) = [e for e in region.log if e["actor"] == "writer"]
    assert entry["action"] == "not kept" and "not timed (no GPU)" in entry["message"]
    profile = json.loads((out / "profile.json").read_text())
    assert profile["writer"]["rounds"] == 2 and profile["writer"]["regions_kept"] == []
    # the stub saw both requests; the key only in their Authorization header
    reqs = _requests(log)
    assert len(reqs) == 2 and reqs[1]["body"]["messages"] == requests_ev[1]["messages"]
    for r in reqs:
        headers = dict(r["headers"])
        assert headers.pop("Authorization") == f"Bearer {SECRET}"
        assert SECRET not in json.dumps({**r, "headers": headers})
    for name, text in [("stdout", proc.stdout), ("stderr", proc.stderr)] + \
            [(p.name, p.read_text()) for p in out.rglob("*") if p.is_file()]:
        assert SECRET not in text, f"the key leaked into {name}"


def test_without_writer_no_writer_events_and_no_request(stub, tmp_path):
    url, log = stub
    proc, out, events = _optimize(tmp_path)
    assert not [e for e in events if e["event"].startswith("writer-")]
    assert "writer round" not in proc.stdout and "model kernel" not in proc.stdout
    assert "writer" not in json.loads((out / "profile.json").read_text())
    assert not [e for e in load_program(out / "program.json").regions[0].log if e["actor"] == "writer"]
    assert _requests(log) == []


def test_a_bad_writer_flag_fails_with_one_line(tmp_path, capsys):
    from agent_core.cli import main
    prog = tmp_path / "p.json"
    save_program(case_program(), prog)
    assert main(["optimize", str(prog), "--cpu", "-o", str(tmp_path / "o"), "--writer", "ftp://example.com/v1",
                 "--writer-model", "m"]) == 1
    assert capsys.readouterr().err.strip() == ("stitchcuda optimize: error: writer: endpoint URL "
                                               "'ftp://example.com/v1' must start with http:// or https://")
    assert not (tmp_path / "o").exists()
    assert main(["bench", str(prog), "--cpu", "--writer", "http://127.0.0.1:1/v1"]) == 1   # before any problem
    assert capsys.readouterr().err.strip().endswith("writer: --writer needs --writer-model NAME (the model the "
                                                    "endpoint serves)")


def test_bench_passes_the_writer_flags_to_each_isolated_problem_but_never_a_key():
    from agent_core.cli import build_parser
    from agent_core.commands.bench import _forward_flags
    args = build_parser().parse_args(["bench", "p.json", "--isolate", "--writer", "http://127.0.0.1:9/v1",
                                      "--writer-model", "m", "--writer-rounds", "4", "--writer-regions", "r2,r3",
                                      "--writer-key-env", "MY_KEY"])
    flags = _forward_flags(args)
    for flag, value in [("--writer", "http://127.0.0.1:9/v1"), ("--writer-model", "m"), ("--writer-rounds", "4"),
                        ("--writer-regions", "r2,r3"), ("--writer-key-env", "MY_KEY")]:
        assert flags[flags.index(flag) + 1] == value
    assert build_parser().parse_args(["bench", "p.json", *flags]).writer_rounds == 4    # they parse again


def test_a_remote_endpoint_is_said_on_every_request_line():
    from agent_core.agent.progress import format_event
    line = format_event({"event": "writer-request", "region": "r2", "round": 1, "model": "m",
                         "endpoint": "api.example.com", "remote": True})
    assert line == ("  r2: writer round 1: asking m at api.example.com (remote: the region's ops, shapes and our "
                    "kernel leave this machine)")


# bench's own options: how the run is laid out, not how one problem is optimized
RUN_LEVEL = {"--help", "--json", "--jobs", "--isolate", "--time-cap", "--compile-cap", "--resume", "--ray",
             "--kernel-cache", "--events"}


def test_bench_passes_every_option_that_shapes_a_problem_to_its_isolated_process():
    """--jobs and --isolate run each problem as `stitchcuda bench FILE` in its own process: every option
    that changes how a problem is optimized or timed must reach it (--fp32-only did not)."""
    import argparse

    from agent_core.commands import bench
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    given = []
    for action in parser._actions:
        flag = max(action.option_strings, key=len, default=None)
        if flag is None or flag in RUN_LEVEL or flag.startswith("--writer"):
            continue
        if action.nargs == 0:
            given.append(flag)
        else:
            given += [flag, "default" if flag == "--compile-modes" else "7"]
    flags = bench._forward_flags(parser.parse_args(["p.json", "--isolate", *given]))
    missing = [f for f in given if f.startswith("--") and f not in flags]
    assert not missing, missing
