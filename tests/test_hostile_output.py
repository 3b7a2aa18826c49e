"""`export` and `optimize` never destroy what they did not write (agent_core/output_dir.py): --force onto
the input's folder, `.`, home, `/`, a folder with a user's file, a link or a file is refused with one
line and changes nothing; an earlier output of the tool is replaced; a run that fails midway (an
exception, Ctrl+C, a failed final move) leaves the target exactly as it was and no temporary folder.
Every check hashes the folders before and after (tests/hostile.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_core import output_dir
from agent_core.cli import main as cli_main
from agent_core.export import export_program
from agent_core.ir import Program
from agent_core.output_dir import MARKER, OutputRefused, check_target, read_marker
from agent_core.project_file import load_program, save_program
from tests.hostile import snapshot, unchanged

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "tests" / "data" / "residual_add_layer_norm_cpu" / "program.json"
FAST = ["--cpu", "--no-tune", "-q"]     # optimize without a GPU: plan, generate, compile


def cli(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "agent_core.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def refused(proc, *words) -> str:
    """The one stderr line of a refusal, holding every word."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return one_line(proc.stderr, *words)


def refused_here(capsys, *argv) -> str:
    """The command run in this process (cheaper than a subprocess): its one-line refusal."""
    assert cli_main([str(a) for a in argv]) == 1
    return capsys.readouterr().err


def one_line(err: str, *words) -> str:
    line = err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    for w in words:
        assert w in line, line
    return line


def tiny(name="tiny") -> Program:
    p = Program(name)
    x = p.add_input("x", (4, 8))
    y = p.add_node("relu", [x.id])
    p.mark_output(y.outputs[0])
    return p


def no_leftovers(parent: Path) -> None:
    """No temporary folder of a run (new or set aside) is left beside the target."""
    left = [n for n in os.listdir(parent) if ".stitchcuda-new-" in n or ".stitchcuda-old-" in n]
    assert not left, left


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A project folder (base.json with its .npz sidecar, a user's notes), an earlier export of a
    different program and an earlier optimize output, each written once by the real commands."""
    root = tmp_path_factory.mktemp("hostile_output")
    project = root / "project"
    project.mkdir()
    save_program(load_program(SMALL), project / "base.json", inline_limit=0)   # parameters in the sidecar
    assert (project / "base.json.npz").is_file()
    (project / "notes.txt").write_text("the user's own file\n")
    save_program(tiny(), root / "tiny.json")
    assert cli("export", root / "tiny.json", "-o", root / "earlier_export").returncode == 0
    proc = cli("optimize", project / "base.json", "-o", root / "earlier_opt", *FAST)
    assert proc.returncode == 0, proc.stderr
    return root


def copy_of(src: Path, dst: Path) -> Path:
    import shutil
    shutil.copytree(src, dst, symlinks=True)
    return dst


# --- export --------------------------------------------------------------------------------------
def test_force_onto_the_folder_holding_the_input_is_refused_and_changes_nothing(work):
    project = work / "project"
    with unchanged(project):
        refused(cli("export", "base.json", "-o", ".", "--force", cwd=project), "current folder")


def test_force_onto_home_is_refused(work, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export PS1='$ '\n")
    with unchanged(home):
        refused(cli("export", work / "tiny.json", "-o", home, "--force", env={"HOME": str(home)}), "home folder")


@pytest.mark.parametrize("where, why", [
    (".", "current folder"), ("..", "holds the current folder"), ("~", "your home folder"),
    ("/", "root folder"), ("project", "holds the input"), ("project/base.json", "is the input"),
    ("project/base.json.npz", "is the input"), ("", "current folder")])
def test_places_never_written_whatever_they_hold(work, monkeypatch, where, why):
    monkeypatch.chdir(work / "project" if where in (".", "..", "") else work)
    monkeypatch.setenv("HOME", str(work / "home"))
    target = os.path.expanduser(where)
    protect = output_dir.input_paths(work / "project" / "base.json")
    for force in (False, True):
        with pytest.raises(OutputRefused, match=why) as err:
            check_target(target, "export", force=force, protect=protect)
        assert "--force" not in str(err.value)    # --force cannot help, so it is not suggested


def test_force_onto_an_export_holding_a_user_file_is_refused_and_names_it(work, tmp_path, capsys):
    out = copy_of(work / "earlier_export", tmp_path / "out")
    (out / "build").mkdir()
    (out / "build" / "CMakeCache.txt").write_text("the user's build\n")
    (out / "my_notes.md").write_text("mine\n")
    with unchanged(tmp_path):
        line = refused(cli("export", work / "tiny.json", "-o", out, "--force"), "build/", "my_notes.md",
                       "did not write")
        line = one_line(refused_here(capsys, "export", work / "tiny.json", "-o", out), "not empty", "build/")
    assert "--force" not in line   # it would not be allowed, so it is not suggested


def test_an_earlier_export_is_replaced_only_with_force(work, tmp_path, capsys):
    out = copy_of(work / "earlier_export", tmp_path / "out")
    old_kernels = sorted(p.name for p in (out / "kernels").iterdir())
    with unchanged(tmp_path):
        one_line(refused_here(capsys, "export", work / "project" / "base.json", "-o", out), "earlier export",
                 "pass --force")
    with unchanged(work / "project"):
        proc = cli("export", work / "project" / "base.json", "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr
    new_kernels = sorted(p.name for p in (out / "kernels").iterdir())
    assert new_kernels and not set(new_kernels) & set(old_kernels)
    marker = read_marker(out)
    assert marker["kind"] == "export" and "manifest.json" in marker["files"]
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != MARKER)
    assert marker["files"] == on_disk
    assert json.loads((out / "manifest.json").read_text())["program"] == "residual_add_layer_norm"
    no_leftovers(tmp_path)


def test_a_link_or_a_file_as_target_is_refused(work, tmp_path, capsys):
    elsewhere = copy_of(work / "earlier_export", tmp_path / "elsewhere")
    (tmp_path / "link").symlink_to(elsewhere)
    (tmp_path / "file.txt").write_text("not a folder\n")
    with unchanged(tmp_path):
        refused(cli("export", work / "tiny.json", "-o", tmp_path / "link", "--force"), "symbolic link")
        one_line(refused_here(capsys, "export", work / "tiny.json", "-o", tmp_path / "file.txt", "--force"),
                 "is a file")


def test_a_link_inside_an_earlier_export_makes_it_foreign(work, tmp_path):
    out = copy_of(work / "earlier_export", tmp_path / "out")
    (tmp_path / "precious").write_text("outside\n")
    os.remove(out / "README.md")
    (out / "README.md").symlink_to(tmp_path / "precious")   # listed by the marker, but a link: not ours
    with unchanged(tmp_path), pytest.raises(OutputRefused, match="README.md"):
        export_program(tiny(), out, overwrite=True)


@pytest.mark.parametrize("stop", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_an_export_that_fails_midway_leaves_the_target_and_no_temporary_folder(work, tmp_path, monkeypatch, stop):
    import agent_core.export as export
    out = copy_of(work / "earlier_export", tmp_path / "out")

    def readme(*a, **k):   # written after the kernels, sources and data
        raise stop
    monkeypatch.setattr(export, "readme", readme)
    with unchanged(tmp_path), pytest.raises(type(stop)):
        export_program(tiny("other"), out, overwrite=True)
    with unchanged(tmp_path), pytest.raises(type(stop)):   # the parents it made go too
        export_program(tiny("other"), tmp_path / "new" / "deeper" / "out")


def test_a_failed_move_in_puts_the_old_folder_back(work, tmp_path, monkeypatch):
    out = copy_of(work / "earlier_export", tmp_path / "out")
    real_rename = os.rename

    def rename(src, dst):
        if ".stitchcuda-new-" in os.path.basename(src):
            raise OSError(28, "No space left on device")
        real_rename(src, dst)
    monkeypatch.setattr(output_dir.os, "rename", rename)
    with unchanged(tmp_path), pytest.raises(OSError, match="No space"):
        export_program(tiny("other"), out, overwrite=True)


def test_files_added_while_an_export_runs_stop_the_replace(work, tmp_path, monkeypatch):
    import agent_core.export as export
    out = copy_of(work / "earlier_export", tmp_path / "out")
    real = export.readme

    def readme(*a, **k):
        (out / "added_meanwhile.txt").write_text("the user saved this during the export\n")
        return real(*a, **k)
    monkeypatch.setattr(export, "readme", readme)
    with pytest.raises(OutputRefused, match="added_meanwhile.txt"):
        export_program(tiny("other"), out, overwrite=True)
    assert (out / "added_meanwhile.txt").is_file() and read_marker(out)["files"] == read_marker(
        work / "earlier_export")["files"]
    no_leftovers(tmp_path)


# --- optimize ------------------------------------------------------------------------------------
def test_optimize_replaces_its_own_earlier_output_but_not_a_users_folder(work, tmp_path, capsys):
    out = copy_of(work / "earlier_opt", tmp_path / "opt")
    os.utime(out / "events.jsonl", (0, 0))
    before = (out / "events.jsonl").stat().st_mtime
    with unchanged(work / "project"):
        proc = cli("optimize", work / "project" / "base.json", "-o", out, *FAST)
    assert proc.returncode == 0, proc.stderr
    assert (out / "events.jsonl").stat().st_mtime != before and read_marker(out)["kind"] == "optimize"
    done = json.loads((out / "events.jsonl").read_text().splitlines()[-1])
    assert done["event"] == "done" and done["out_dir"] == str(out)   # not the temporary folder's name
    no_leftovers(tmp_path)
    users = tmp_path / "users"
    users.mkdir()
    (users / "events.jsonl").write_text('{"the user": "log"}\n')
    with unchanged(tmp_path):
        one_line(refused_here(capsys, "optimize", work / "project" / "base.json", "-o", users, *FAST),
                 "events.jsonl", "did not write")
    with unchanged(work / "earlier_export"):   # an export's folder needs --force
        one_line(refused_here(capsys, "optimize", work / "tiny.json", "-o", work / "earlier_export", *FAST),
                 "earlier export", "pass --force")


@pytest.mark.parametrize("stop, code", [(RuntimeError("late failure"), 1), (KeyboardInterrupt(), 130)])
def test_a_failed_optimize_leaves_the_earlier_output_and_its_events(work, tmp_path, monkeypatch, stop, code):
    import agent_core.agent.loop as loop
    out = copy_of(work / "earlier_opt", tmp_path / "opt")

    def write_outputs(result):   # after every kernel and event of the run
        raise stop
    monkeypatch.setattr(loop, "_write_outputs", write_outputs)
    with unchanged(tmp_path):
        assert cli_main(["optimize", str(work / "project" / "base.json"), "-o", str(out), *FAST]) == code


def test_the_worker_refuses_a_users_folder_with_one_fatal_event(work, tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("mine\n")
    with unchanged(tmp_path):
        assert cli_main(["worker", str(work / "tiny.json"), "-o", str(tmp_path), "--cpu"]) == 1
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(events) == 1 and events[0]["fatal"] and "mine.txt" in events[0]["message"]
    assert "--force" not in events[0]["message"]   # the worker has no --force


# --- the rule itself -----------------------------------------------------------------------------
NAMES = st.lists(st.sampled_from(["a.txt", "kernels/k.cu", "data/inputs/x.bin", "data/y.bin", "README.md",
                                  "python/p.py", "notes", "build/CMakeCache.txt"]), unique=True, max_size=5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ours=NAMES, theirs=NAMES, force=st.booleans(), kind=st.sampled_from(output_dir.KINDS),
       wrote=st.sampled_from(output_dir.KINDS))
def test_a_folder_is_replaced_only_when_every_file_is_the_tools(ours, theirs, force, kind, wrote):
    """`kind` may go into a folder `wrote` left with `ours` listed in its marker and `theirs` not: only
    when it is empty, or holds nothing unlisted and --force is given (or optimize reruns over its own)."""
    theirs = [t for t in theirs if t not in ours]
    with tempfile.TemporaryDirectory() as d:
        target = Path(d) / "out"
        target.mkdir()
        for rel in ours + theirs:
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            (target / rel).write_text(rel)
        if ours:
            output_dir.write_marker(target, wrote, ours)
        before = snapshot(d)
        allowed = not (ours or theirs) or (ours and not theirs and (force or kind == wrote == "optimize"))
        try:
            check_target(target, kind, force=force)
            assert allowed
        except OutputRefused as e:
            assert not allowed
            for t in theirs:   # each user file is named, or the folder of it that the tool did not make
                assert any(p in str(e) for p in [t] + [f"{q}/" for q in Path(t).parents if str(q) != "."]), e
        assert snapshot(d) == before


def test_sanitize_writes_into_the_moved_output_and_a_rerun_may_replace_it(work, tmp_path, monkeypatch):
    """--sanitize's run (here without compute-sanitizer in front, which needs a GPU) writes OUT/sanitize/
    and OUT/sanitize.txt after the move; both count as the tool's, so optimize may replace OUT again."""
    import argparse
    import shutil

    from agent_core.commands import optimize as opt
    out = copy_of(work / "earlier_opt", tmp_path / "opt")
    real_run = subprocess.run

    def without_sanitizer(cmd, **kw):
        return real_run(cmd[cmd.index(sys.executable):], env=dict(os.environ, PYTHONPATH=str(ROOT)), **kw)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(subprocess, "run", without_sanitizer)
    parser = argparse.ArgumentParser()
    opt.add_arguments(parser)
    args = parser.parse_args([str(work / "project" / "base.json"), "-o", str(out), "--sanitize", *FAST])
    assert opt.sanitize(args, gpu=True) == 0
    assert (out / "sanitize" / "program.json").is_file() and read_marker(out / "sanitize")["kind"] == "optimize"
    assert "sanitize.txt" in read_marker(out)["files"]
    assert output_dir.foreign_files(out) == [] and check_target(out, "optimize") is True
