"""Hostile .py files given to `stitchcuda import` (a real subprocess each, run side by side): every way
a file can end (a loop, sys.exit, os._exit, a signal, KeyboardInterrupt, a BaseException, a flood of
output, a fork) gives exit status 1 and one clear stderr line, writes no output, leaves its folder
exactly as it was, leaves no temporary folder and no process behind. Also: the child importer hands
back what the in-process importer makes (import warnings included), and program files are recognised
by their content, not their name."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from agent_core.errors import ImportFailure, StitchError
from agent_core.project_file import program_to_json
from tests.hostile import unchanged

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODEL = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
{forward}
def get_inputs():
    return [torch.randn(4, 8)]
def get_init_inputs():
    return []
"""


def model(forward: str, top: str = "") -> str:
    return top + MODEL.format(forward=textwrap.indent(textwrap.dedent(forward), " " * 8))


# name -> (file text, what its one stderr line says after "NAME: ", extra arguments); {side} is a
# folder outside the checked one, where a file leaves the ids of the processes it starts
CASES = {
    "loop_top": ("import os\nopen('{side}/loop_top.pid', 'w').write(str(os.getpid()))\nwhile True:\n    pass\n",
                 "importing took longer than 3 s (--timeout) and was stopped", ["--timeout", "3"]),
    "loop_forward": (model("while True:\n    x = x + 1\nreturn x\n"),
                     "importing took longer than 3 s (--timeout) and was stopped", ["--timeout", "3"]),
    "exit0": ("import sys\nsys.exit(0)\n", "the file called sys.exit(0) while importing; no program was made", []),
    "exit3": (model("import sys\nsys.exit(3)\n"), "the file called sys.exit(3) while importing; no program was made",
              []),
    "os_exit0": ("import os\nos._exit(0)\n",
                 "the file ended the import process with exit status 0 (os._exit or a crash) while importing; "
                 "no program was made", []),
    "segv": ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
             "the import process was killed by SIGSEGV (Segmentation fault) while importing; no program was made",
             []),
    "interrupt": ("raise KeyboardInterrupt\n", "the file raised KeyboardInterrupt while importing; no program was made",
                  []),
    "base_exc": ("class Halt(BaseException):\n    pass\nraise Halt('stop here')\n",
                 "the file raised Halt: stop here (a BaseException) while importing; no program was made", []),
    "prints": ("import sys\nline = 'x' * 999\nfor _ in range(50_000):\n    print(line)\n",
               "the file printed more than 8 MiB while importing and was stopped; no program was made", []),
    # a grandchild that would sleep on, holding the output pipes; the import itself would succeed
    "fork": (model("return x * 2\n", top="import os, time\nif os.fork() == 0:\n"
                                         "    open('{side}/fork.pid', 'w').write(str(os.getpid()))\n"
                                         "    time.sleep(600)\n    os._exit(0)\n"
                                         "while not os.path.exists('{side}/fork.pid'):\n    time.sleep(0.01)\n"),
             "the file forked a process while importing; importing must not start processes that outlive it, "
             "so no program was made", []),
}


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting to be reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def cli(*argv, cwd, tmpdir=None, timeout=120):
    env = {**os.environ, "PYTHONPATH": ROOT}
    if tmpdir:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run([sys.executable, "-m", "agent_core.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case imported at once, each in its own folder (checked unchanged) with its own TMPDIR;
    alongside, `show` of a text file (in `files`)."""
    base = tmp_path_factory.mktemp("hostile_import")
    files = base / "files"
    files.mkdir()
    (files / "prog.txt").write_text("this is not a program\n")
    extra = {"text": ("show", "prog.txt")}
    side = base / "side"
    side.mkdir()
    folders = {}
    for name, (text, _, _) in CASES.items():
        folder = base / name
        (folder / "tmp").mkdir(parents=True)
        (folder / "work").mkdir()
        (folder / "work" / "model.py").write_text(text.replace("{side}", str(side)))
        (folder / "work" / "notes.txt").write_text("a file of the user's\n")
        folders[name] = folder

    def one(name):
        if name in extra:
            return cli(*extra[name], cwd=files)
        folder = folders[name]
        return cli("import", "model.py", "-o", "out.json", *CASES[name][2], cwd=folder / "work",
                   tmpdir=folder / "tmp")

    names = list(CASES) + list(extra)
    with ExitStack() as stack:
        for folder in [*(f / "work" for f in folders.values()), files]:
            stack.enter_context(unchanged(folder))
        with ThreadPoolExecutor(len(names)) as pool:
            results = dict(zip(names, pool.map(one, names)))
    return {"results": results, "folders": folders, "side": side}


@pytest.mark.parametrize("name", list(CASES))
def test_every_way_a_file_can_end_is_one_line_and_exit_1(outcomes, name):
    proc = outcomes["results"][name]
    folder = outcomes["folders"][name]
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert not proc.stdout
    lines = proc.stderr.splitlines()
    assert lines == [f"stitchcuda import: error: model.py: {CASES[name][1]}"], proc.stderr
    assert not (folder / "work" / "out.json").exists()          # and the folder is as it was (fixture)
    assert not [n for n in os.listdir(folder / "tmp") if n.startswith("stitchcuda-import-")]  # its folder is gone


@pytest.mark.parametrize("name", ["loop_top", "fork"])
def test_no_process_the_file_started_outlives_the_import(outcomes, name):
    pid = int((outcomes["side"] / f"{name}.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_the_child_hands_back_what_the_in_process_importer_makes_with_its_warnings(tmp_path):
    """An opaque op's warning lives in program.metadata and survives the trip through the project file."""
    from agent_core.importers import import_file
    from agent_core.importers.isolated import import_isolated
    src = tmp_path / "upsample.py"
    src.write_text(model("import torch.nn.functional as F\n"
                         "return torch.sigmoid(F.interpolate(x[None, None], scale_factor=1.5, mode='nearest'))\n"))
    child = import_isolated(str(src))
    assert any("upsample_nearest2d" in w for w in child.metadata["import_warnings"])
    assert program_to_json(child) == program_to_json(import_file(str(src)))


def test_a_cancelled_import_stops_at_once(tmp_path):
    import threading

    from agent_core.importers.isolated import ImportCancelled, IsolatedImport
    src = tmp_path / "slow.py"
    src.write_text("import time\ntime.sleep(600)\n")
    job = IsolatedImport(str(src), timeout=300)
    threading.Timer(0.5, job.cancel).start()
    t0 = time.monotonic()
    with pytest.raises(ImportCancelled, match=r"^slow\.py: the import was cancelled$"):
        job.run()
    assert time.monotonic() - t0 < 10


def test_program_files_are_known_by_content_and_help_says_importing_runs_code(outcomes, tmp_path, capsys):
    from agent_core import cli
    from agent_core.commands.import_cmd import open_program
    text = outcomes["results"]["text"]
    assert text.returncode == 1 and text.stderr.splitlines() == [
        "stitchcuda show: error: prog.txt: not a StitchCUDA program file (expected JSON starting with '{')"]
    # a JSON file of any name is read as a program file, never imported (its loader says what is wrong)
    (tmp_path / "prog.data").write_text(json.dumps({"format": "stitchcuda-program", "schema_version": 99}))
    with pytest.raises(StitchError, match="written by a newer StitchCUDA"):
        open_program(str(tmp_path / "prog.data"))
    with pytest.raises(SystemExit):
        cli.main(["import", "--help"])
    words = " ".join(capsys.readouterr().out.split())
    assert "Importing a .py executes it" in words and "child process" in words and "--timeout S" in words
    assert "Opening a .json program file never runs code" in words and "default: 120" in words


def test_a_bad_time_limit_is_refused(tmp_path):
    from agent_core.commands.import_cmd import import_source
    (tmp_path / "m.py").write_text("x = 1\n")
    with pytest.raises(ImportFailure, match="positive number of seconds"):
        import_source(str(tmp_path / "m.py"), timeout=0)


def test_a_module_class_target_is_imported_in_the_child_on_the_callers_path(tmp_path, monkeypatch):
    from agent_core.importers.isolated import import_isolated
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "blocks.py").write_text(model("return torch.tanh(x)\n") + "class Quits(Model):\n"
                                   "    def __init__(self):\n        raise SystemExit(2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))   # only this process's path knows the package
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)   # the child sets it itself
    with unchanged(tmp_path):                     # no __pycache__ either
        p = import_isolated("mypkg.blocks:Model")
    assert p.metadata["source"]["target"] == "mypkg.blocks:Model"
    assert [n.op for n in p.nodes.values()] == ["tanh"]
    with pytest.raises(ImportFailure, match=r"^mypkg\.blocks:Quits: the file called sys\.exit\(2\) while importing"):
        import_isolated("mypkg.blocks:Quits")
