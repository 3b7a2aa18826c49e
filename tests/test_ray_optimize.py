"""`optimize --ray local --cpu` on a real local Ray cluster (two CPUs here): each region's tuning
variants are generated and compiled by a Ray task, and the result is the run without --ray.

A worker is killed while it runs a region's trials: Ray names the task's process `ray::trials:<region>`
(cluster/ray_tune.py), so a thread of the test watches /proc for it and kills it the moment it shows.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.programs import SIXTEEN_SOFTMAXES, interrupt_at

pytest.importorskip("ray")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = '''"""Three independent regions: a softmax, a layer norm and a GELU chain, each on its own input."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b, c):
        return torch.softmax(a, dim=1), nn.functional.layer_norm(b, (96,)), nn.functional.gelu(c) * 2.0 + 1.0


def get_inputs():
    return [torch.randn(48, 160), torch.randn(64, 96), torch.randn(32, 200)]


def get_init_inputs():
    return []
'''


def _optimize(spec, out, cache, *extra, env=None):
    cmd = [sys.executable, "-m", "agent_core.cli", "optimize", spec, "-o", str(out), "--cpu", "--no-baselines",
           *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "STITCHCUDA_CACHE": str(cache), **(env or {})})


@pytest.fixture(scope="module")
def without_ray(tmp_path_factory):
    """The program file and the run without --ray (its own fresh kernel cache), made once."""
    folder = tmp_path_factory.mktemp("ray_optimize")
    spec = folder / "three.py"
    spec.write_text(PROGRAM)
    proc = _optimize(str(spec), folder / "local", folder / "cache-local")
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout
    return str(spec), folder / "local", folder / "cache-local"


def _regions(out):
    prog = json.loads((out / "program.json").read_text())
    return {r["id"]: r for r in prog["regions"]}


def _kernels(out):
    return {p.name: p.read_text() for p in (out / "kernels").glob("*.cu")}


def _events(out):
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def _cache(cache):
    return sorted(p.name for p in (cache / "kernels").iterdir())


def _trials_logs(out):
    """region -> its 'N tuning variant(s) compiled on HOST (pid P...)' log event."""
    return {e["region"]: e for e in _events(out) if e["event"] == "log" and "tuning variant(s) compiled on" in
            e["message"]}


def test_optimize_over_a_local_cluster_compiles_what_the_run_without_ray_does(without_ray, tmp_path):
    spec, local, local_cache = without_ray
    out, cache = tmp_path / "ray", tmp_path / "cache-ray"
    proc = _optimize(spec, out, tmp_path / "driver-cache", "--ray", "local", "--kernel-cache", str(cache))
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout
    assert _kernels(out) == _kernels(local) and len(_kernels(out)) == 3
    ours, theirs = _regions(out), _regions(local)
    assert list(ours) == list(theirs) == ["r1", "r2", "r3"]
    for rid, r in ours.items():
        assert (r["kind"], r["nodes"], r["source"]) == (theirs[rid]["kind"], theirs[rid]["nodes"], theirs[rid]["source"])
        assert r["schedule"]["agent"] == theirs[rid]["schedule"]["agent"]
        assert "tuning variant(s) compiled" in r["schedule"]["agent"]["reason"]
    # the workers compiled every variant into the cache they were given, exactly the kernels of the
    # run without --ray; the driver compiled its defaults there too (--kernel-cache), nothing elsewhere
    assert _cache(cache) == _cache(local_cache)
    assert not (tmp_path / "driver-cache").exists()
    logs = _trials_logs(out)
    assert sorted(logs) == ["r1", "r2", "r3"]
    assert all(e["pid"] != proc.pid and e["attempts"] == 1 for e in logs.values())   # a worker, not the driver
    assert "sent to the cluster" in stdout


class _Killer(threading.Thread):
    """Kills the worker running `ray::trials:<region>` each time a new one shows, `times` per region."""

    def __init__(self, times: dict):
        super().__init__(daemon=True)
        self.times, self.killed, self.stop = dict(times), {r: [] for r in times}, threading.Event()

    def run(self):
        while not self.stop.is_set() and any(len(self.killed[r]) < n for r, n in self.times.items()):
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        title = f.read().split(b"\0")[0].decode(errors="replace").strip()
                except OSError:
                    continue
                rid = title[len("ray::trials:"):] if title.startswith("ray::trials:") else None
                if rid in self.times and len(self.killed[rid]) < self.times[rid] and int(pid) not in self.killed[rid]:
                    os.kill(int(pid), signal.SIGKILL)
                    self.killed[rid].append(int(pid))
            time.sleep(0.002)


def test_a_killed_worker_costs_only_its_regions_trials_retried_once(without_ray, tmp_path):
    spec, local, _ = without_ray
    out, cache = tmp_path / "ray", tmp_path / "cache-ray"
    killer = _Killer({"r1": 1, "r3": 2})     # r1's first attempt dies; r3's retry dies too
    killer.start()
    proc = _optimize(spec, out, cache, "--ray", "local", "--kernel-cache", str(cache))
    try:
        stdout, _ = proc.communicate(timeout=300)
    finally:
        killer.stop.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    assert proc.returncode == 0, stdout
    assert len(killer.killed["r1"]) == 1 and len(killer.killed["r3"]) == 2, (killer.killed, stdout)
    logs = _trials_logs(out)
    assert logs["r1"]["attempts"] == 2 and "WorkerCrashedError" in logs["r1"]["message"]
    assert logs["r2"]["attempts"] == 1 and "r3" not in logs
    ours, theirs = _regions(out), _regions(local)
    assert _kernels(out) == _kernels(local)                        # the default kernels are the same
    for rid in ("r1", "r2"):
        assert ours[rid]["schedule"]["agent"]["reason"] == theirs[rid]["schedule"]["agent"]["reason"]
    reason = ours["r3"]["schedule"]["agent"]["reason"]
    assert reason.startswith("compiled for sm_90; not verified or timed (no GPU); its tuning variants were not "
                             "compiled: the worker died on both attempts (the worker on ")
    assert ours["r3"]["schedule"]["agent"]["status"] == "compiled" and ours["r3"]["source"] == theirs["r3"]["source"]
    assert "r3: its tuning variants were not compiled: the worker died on both attempts" in stdout
    assert "r1: the worker on" in stdout and "its trials run again" in stdout


def test_ctrl_c_cancels_the_trials_and_leaves_no_output(tmp_path):
    spec, out = tmp_path / "many.py", tmp_path / "ray"
    spec.write_text(SIXTEEN_SOFTMAXES)
    proc = _optimize(str(spec), out, tmp_path / "cache", "--ray", "local")
    seen, rest = interrupt_at(proc, "sent to the cluster")      # the trials' tasks are submitted: Ctrl+C now
    assert proc.returncode == 130, seen + rest
    assert "stitchcuda: interrupted" in rest
    assert not out.exists()                           # the folder is written only by a run that finished
