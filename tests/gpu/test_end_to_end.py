"""On the GPU: every example program end to end (generated kernels, library calls and torch ops in
one stream, one CUDA graph, intermediates released after their last readers) matches the reference
on 5 random draws; the 6-layer MLP runs as one CUDA graph; the worker streams valid events; timing, hardware snapshot and baselines work.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_end_to_end.py
"""
import glob
import io
import json
import os
import subprocess
import sys

import pytest
import torch

from agent_core.agent import EventEmitter, optimize, read_events
from agent_core.importers import import_file

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "resources", "examples", "*.py")))
GIANT_BYTES = 1 << 30          # inputs + parameters + outputs above this are skipped (time, not size)
RESULTS: dict[str, object] = {}


def _size(program) -> int:
    return sum(program.values[v].nbytes for v in set(program.inputs) | set(program.outputs)) + \
        sum(v.nbytes for v in program.parameters())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: os.path.basename(p)[:-3])
def test_example_end_to_end(path):
    prog = import_file(path)
    if _size(prog) > GIANT_BYTES:
        pytest.skip(f"{_size(prog) / 2**30:.1f} GiB of inputs, parameters and outputs")
    buf = io.StringIO()
    res = optimize(prog, emit=EventEmitter(buf), tune=False, time_regions=False, baselines=False, draws=5, trials=5)
    RESULTS[os.path.basename(path)] = res
    e2e = res.profile["end_to_end"]
    events = list(read_events(buf.getvalue().splitlines()))
    assert events[-1]["event"] == "done" and events[-1]["status"] == "done"
    assert e2e["correct"], e2e["verify"]["reason"]
    assert e2e["verify"]["draws"] == 5
    if e2e["graph_error"] is None:
        assert e2e["cuda_graph"]
    assert e2e["generated_kernels"] == sum(1 for o in res.outcomes if o.status == "fused")


def test_every_generated_kernel_of_the_examples_verified():
    """Listed after the end-to-end runs: a kernel that compiled but failed its check is a codegen bug
    (the program stays correct because it fell back, so the test above cannot see it)."""
    if not RESULTS:
        pytest.skip("no example ran")
    bad = [f"{name} {o.region}: {o.reason}" for name, res in RESULTS.items() for o in res.outcomes
           if o.status == "fallback" and o.reason.startswith(("verification failed", "load failed"))]
    assert not bad, "\n".join(bad)
    if len(RESULTS) < len(EXAMPLES) // 2:   # pytest-xdist spread the examples over other processes
        pytest.skip(f"only {len(RESULTS)} of {len(EXAMPLES)} examples ran in this process")
    assert sum(len(res.fused) for res in RESULTS.values()) >= 20


def test_mlp6_runs_as_one_cuda_graph():
    prog = import_file(os.path.join(ROOT, "resources", "examples", "mlp6_tiny.py"))
    res = optimize(prog, tune=True, tune_trials=2, baselines=True, compile_modes=(), draws=5)
    e2e = res.profile["end_to_end"]
    assert e2e["correct"] and e2e["cuda_graph"], e2e.get("graph_error")
    eager = res.profile["baselines"]["eager"]["ms"]
    print(f"mlp6_tiny: {e2e['ms'] * 1e3:.1f} us as one CUDA graph ({e2e['launches']} launches) vs "
          f"{eager * 1e3:.1f} us eager: {eager / e2e['ms']:.2f}x")


def test_the_graph_reuses_released_memory_and_stays_correct():
    prog = import_file(os.path.join(ROOT, "resources", "examples", "transformer_block.py"))
    res = optimize(prog, tune=False, time_regions=False, baselines=False)
    exe = res.executable
    assert res.profile["end_to_end"]["correct"]
    from agent_core.profile.peak_memory import fused_of, ours_peak
    from agent_core.program_runtime.memory_plan import eager_peak_estimate
    ours = ours_peak(res.program, fused_of(exe), graph=True)
    everything = sum(v.nbytes for v in res.program.values.values() if v.producer is not None)
    assert ours["bytes"] < everything            # released values' memory was reused
    assert ours["bytes"] <= eager_peak_estimate(res.program) + (32 << 20), ours
    # replaying twice on new inputs gives new, correct results (nothing stale in reused memory)
    assert exe.verify(draws=2, seed=10).ok


MLP_SOURCE = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(768, 2304), nn.Linear(2304, 768)
    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))
def get_inputs():
    return [torch.randn(32, 512, 768)]
def get_init_inputs():
    return []
"""


def test_the_graph_owns_its_cublas_workspace_when_torch_compile_clears_them(tmp_path):
    """torch.compile's CUDA graphs (reduce-overhead) clear cuBLAS's workspaces before and after they
    record; our graph's matmuls must not be left writing to that freed memory (it faulted on the H200
    in 43_MinGPTCausalAttention's and 44_MiniGPTBlock's GPT-sized linears), nor into the tensors that
    take it over."""
    path = tmp_path / "gpt_mlp.py"
    path.write_text(MLP_SOURCE)
    res = optimize(import_file(str(path)), tune=False, time_regions=False, baselines=False)
    exe = res.executable
    assert res.profile["end_to_end"]["correct"] and exe.graph is not None
    torch._C._cuda_clearCublasWorkspaces()        # what torch.compile's CUDA graphs do
    torch.cuda.empty_cache()
    sentinel = torch.full((64 << 20,), 7.0, device="cuda")     # takes over memory freed above
    assert exe.verify(draws=3, seed=11).ok
    torch.cuda.synchronize()
    assert bool((sentinel == 7.0).all())


def test_worker_streams_valid_events():
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "agent_core.cli", "worker",
                        os.path.join(ROOT, "resources", "examples", "softmax_rows.py"),
                        "--tune-trials", "2", "--no-compile-baselines"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    events = list(read_events(p.stdout.splitlines()))
    kinds = {e["event"] for e in events}
    assert {"plan", "region-proposed", "codegen", "compile", "verify", "tune-step", "profile", "done"} <= kinds
    assert events[-1]["event"] == "done" and events[-1]["status"] == "done"
    assert any(e["event"] == "profile" and e["scope"] == "baseline" and e["baseline"] == "eager" for e in events)


def test_hardware_snapshot_and_timing():
    from agent_core.profile.hardware import hardware_snapshot
    from agent_core.profile.timing import time_gpu
    snap = hardware_snapshot()
    assert snap["sm_count"] > 0 and snap["l2_bytes"] > 0 and snap["copy_bandwidth_gbs"] > 100
    json.dumps(snap)
    x = torch.randn(1 << 24, device="cuda")
    t = time_gpu(lambda: x.mul_(1.0), trials=20)
    assert t.trials == 20 and 0 < t.min_ms <= t.median_ms <= t.max_ms


def test_baselines_are_guarded():
    from agent_core.profile.baselines import measure_baselines
    x = torch.randn(64, 64, device="cuda")

    def broken(t):
        raise RuntimeError("this baseline cannot run")
    out = measure_baselines(broken, [x], compile_modes=("default",), trials=3)
    assert not out["eager"]["ok"] and "cannot run" in out["eager"]["error"]
    assert not out["compile_default"]["ok"]
    ok = measure_baselines(lambda t: torch.relu(t) * 2, [x], compile_modes=("default",), trials=5)
    assert ok["eager"]["ok"] and ok["eager"]["ms"] > 0
    assert ok["compile_default"]["ok"] or ok["compile_default"]["error"]
