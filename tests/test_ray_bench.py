"""`bench --ray` on a real local Ray cluster (CPU only): every CLI run below starts its own with
`--ray local` (two CPUs here, so two problems at a time), as a user's would.

The problems that must misbehave are KernelBench-style .py files whose top level runs in the import
child of the Ray worker that runs the problem: they write that worker's PID (their parent's) to a file
and wait, so the test can kill the worker mid-task, or they wait for a go file, so the driver can be
stopped while they are in flight. The others are small program files, quick to plan and compile.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBLEM = '''"""A test problem run by tests/test_ray_bench.py ({mode})."""
import glob
import os
import time

import torch
import torch.nn as nn

ANNOUNCE, MODE, GO = {announce!r}, {mode!r}, {go!r}


def _wait():
    parent = os.getppid()
    for _ in range(1200):           # a minute at most; leave at once when our worker is gone
        if os.getppid() != parent or (GO and os.path.exists(GO)):
            return
        time.sleep(0.05)


if MODE == "slow":
    _wait()
else:
    n = len([p for p in glob.glob(ANNOUNCE + ".*") if not p.endswith(".tmp")])
    if MODE == "always" or n == 0:          # "once": only the first attempt waits to be killed
        with open(f"{{ANNOUNCE}}.{{n + 1}}.tmp", "w") as f:
            f.write(str(os.getppid()))
        os.replace(f"{{ANNOUNCE}}.{{n + 1}}.tmp", f"{{ANNOUNCE}}.{{n + 1}}")
        _wait()


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(8, 32)]


def get_init_inputs():
    return []
'''


def _problem(folder, name, mode, announce="", go=""):
    path = os.path.join(folder, name + ".py")
    with open(path, "w") as f:
        f.write(PROBLEM.format(mode=mode, announce=announce, go=go))
    return path


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """Six small program files (pointwise and row reductions), saved once for the module."""
    import torch

    from agent_core.importers import import_nn_module
    from agent_core.project_file import save_program
    folder = tmp_path_factory.mktemp("programs")
    mods = {"relu": torch.nn.ReLU(), "tanh": torch.nn.Tanh(), "softmax": torch.nn.Softmax(dim=1),
            "sigmoid": torch.nn.Sigmoid(), "gelu": torch.nn.GELU(), "log_softmax": torch.nn.LogSoftmax(dim=1)}
    out = []
    for name, m in mods.items():
        path = str(folder / f"{name}.json")
        save_program(import_nn_module(m, [torch.randn(8, 64)], name=name), path)
        out.append(path)
    return out


def _bench(*args):
    return [sys.executable, "-m", "agent_core.cli", "bench", *args, "--cpu", "--no-tune", "--ray", "local"]


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def _wait_for(what, seconds=180.0):      # Ray start-up on 2 busy cores
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"waited {seconds:.0f} s in vain")


def _appears(path: str):
    return lambda: path if os.path.exists(path) else None


def _stop(proc) -> None:
    """A driver a failed test leaves running is stopped as Ctrl+C would, so its cluster goes with it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _kill_worker(announce: str) -> int:
    pid = int(open(announce).read())
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode()
    assert "ray" in cmdline, cmdline              # the Ray worker, not the driver or the raylet
    os.kill(pid, signal.SIGKILL)
    return pid


def test_bench_over_a_local_cluster_streams_rows_and_survives_killed_workers(programs, tmp_path):
    announce = str(tmp_path / "worker.pid")
    once = _problem(str(tmp_path), "killed_once", "once", announce + "-once")
    always = _problem(str(tmp_path), "killed_always", "always", announce + "-always")
    out, events, cache = tmp_path / "rows.jsonl", tmp_path / "events.jsonl", tmp_path / "kernels"
    files = programs + [once, always]
    proc = subprocess.Popen(_bench(*files, "--json", str(out), "--events", str(events), "--kernel-cache", str(cache)),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        killed = [_kill_worker(_wait_for(_appears(announce + "-once.1")))]
        for attempt in (1, 2):      # the retry of killed_always dies too
            killed.append(_kill_worker(_wait_for(_appears(f"{announce}-always.{attempt}"))))
        stdout, _ = proc.communicate(timeout=150)
    finally:
        _stop(proc)
    assert proc.returncode == 0, stdout
    assert len(set(killed)) == 3                   # three different worker processes
    rows = _rows(out)
    assert sorted(r["problem"] for r in rows) == sorted(os.path.splitext(os.path.basename(f))[0] for f in files)
    by = {r["problem"]: r for r in rows}
    for r in rows:
        assert r["host"] == socket.gethostname() and r["ray"] is True and r["file"] in files
    for f in programs:
        r = by[os.path.splitext(os.path.basename(f))[0]]
        assert r["ok"] and r["compiled"] >= 1 and r.get("gpu_name") is None and "attempts" not in r
    assert by["killed_once"]["ok"] and by["killed_once"]["attempts"] == 2
    assert "died" in by["killed_once"]["retried_after"] and "WorkerCrashedError" in by["killed_once"]["retried_after"]
    assert not by["killed_always"]["ok"] and by["killed_always"]["attempts"] == 2
    assert by["killed_always"]["error"].startswith("the worker died on both attempts")
    assert list(cache.glob("kernels/*.cubin"))      # the workers compiled into the cache they were given
    progress = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "bench-progress"]
    assert [e["done"] for e in progress] == list(range(1, 9))
    assert progress[-1]["total"] == 8 and progress[-1]["failed"] == 1
    assert "killed_always" in stdout and "FAILED" in stdout


def test_ctrl_c_stops_the_driver_between_lines_and_resume_runs_only_the_rest(programs, tmp_path):
    go = str(tmp_path / "go")
    slow = [_problem(str(tmp_path), f"slow_{k}", "slow", go=go) for k in (1, 2)]
    fast = programs[:2]
    out = tmp_path / "rows.jsonl"
    proc = subprocess.Popen(_bench(*fast, *slow, "--json", str(out)), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 2)
        time.sleep(1.0)                               # the slow problems are in flight now
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        _stop(proc)
    assert proc.returncode == 0, stdout
    assert "interrupted after 2 of 4 problems" in stdout
    assert sorted(r["problem"] for r in _rows(out)) == sorted(os.path.basename(f)[:-5] for f in fast)
    with open(out, "a") as f:
        f.write('{"problem": "half a li')                # as a driver killed mid-write would leave it
    open(go, "w").close()
    done = subprocess.run(_bench(*fast, *slow, "--json", str(out), "--resume"), cwd=ROOT, capture_output=True,
                          text=True, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resume: 2 of 4 problems already in" in done.stdout and "running the other 2" in done.stdout
    rows = _rows(out)                                   # every line whole again: the half line was cut
    assert sorted(r["problem"] for r in rows) == sorted([os.path.basename(f)[:-5] for f in fast] + ["slow_1", "slow_2"])
    assert all(r["ok"] for r in rows)
    ran = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert len(ran) == 2 and all("slow_" in line for line in ran)


def test_without_ray_the_flag_names_the_install_command(programs, tmp_path):
    # A folder holding a ray.py that fails to import, first on PYTHONPATH, hides the installed Ray.
    (tmp_path / "ray.py").write_text("raise ImportError('hidden by tests/test_ray_bench.py')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    proc = subprocess.run(_bench(programs[0], "--json", str(tmp_path / "rows.jsonl")), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "pip install '.[cluster]'" in proc.stderr and "hidden by tests" in proc.stderr
    assert not (tmp_path / "rows.jsonl").exists()      # nothing ran
