"""GPU: exported projects build with CMake, pass their ctest, give the same outputs through the Python
binding, and are timed against the in-process program (printed; run with -s to see them).

    PYTHONPATH=. python3 -m pytest -m gpu -s tests/gpu/test_export_gpu.py
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("nvcc") is None, reason="needs cmake and nvcc"),
]

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "resources" / "examples"
# cuBLAS with bias and epilogues; slices, batched GEMMs and layout kernels; one generated kernel alone;
# a split reduction whose arrival counters must be left zeroed for the next call and graph replay
GPU_EXAMPLES = ("mlp_block", "transformer_block", "softmax_rows", "long_rows_mean")
TIMED_RUNS = 200
WARMUP_RUNS = 10


def _helpers():
    spec = importlib.util.spec_from_file_location("export_build_helpers", ROOT / "tests" / "test_export.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _binding(outdir: Path, tag: str):
    spec = importlib.util.spec_from_file_location(f"stitch_program_{tag}", outdir / "python" / "stitch_program.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _read(outdir: Path, entry: dict) -> np.ndarray:
    return np.fromfile(outdir / entry["file"], dtype=np.dtype(entry["dtype"]).newbyteorder("<")).reshape(entry["shape"])


def _time_ms(fn) -> float:
    for _ in range(WARMUP_RUNS):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(TIMED_RUNS):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / TIMED_RUNS


def _in_process(program, inputs_by_name):
    """The program run in this process: each region's verified kernel (or its torch fallback), in
    region order, launched from Python: what `stitchcuda optimize` measures without a CUDA graph."""
    from agent_core.planner.execute import region_groups, region_order
    from agent_core.reference import parameter_tensors
    from agent_core.runtime import build_region
    groups = region_groups(program)
    runners = [build_region(program, groups[i], name=f"inproc_{i}", verify=False)
               for i in region_order(program, groups)]
    params = parameter_tensors(program, "cuda")
    feeds = {vid: inputs_by_name[program.values[vid].name] for vid in program.inputs}

    def run():
        env = dict(params)
        env.update(feeds)
        for r in runners:
            r.run_env(env)
        return [env[v] for v in program.outputs]
    return run, runners


def _in_process_graph_ms(program) -> float:
    """The program as `stitchcuda optimize` runs it (no rewrites and default launch parameters, like the
    export), its CUDA graph replayed back to back and timed like the export's driver."""
    from agent_core.agent import optimize
    result = optimize(program, tune=False, rewrite=False, baselines=False, time_regions=False, draws=2, trials=5)
    assert result.profile["end_to_end"]["correct"]
    exe = result.executable
    return _time_ms(exe.replay)


def _program(name: str):
    if name == "long_rows_mean":
        from agent_core.ir import Program
        p = Program(name)
        x = p.add_input("x", (2, 300000))
        p.mark_output(p.add_node("mean", [x.id], {"dim": [1]}).outputs[0])
        return p
    from agent_core.importers import import_file
    return import_file(str(EXAMPLES / f"{name}.py"))


@pytest.mark.parametrize("name", GPU_EXAMPLES)
def test_export_builds_passes_ctest_and_matches_through_the_binding(name, tmp_path):
    from agent_core.export import export_program

    helpers = _helpers()
    program = _program(name)
    res = export_program(program, tmp_path / name)
    cublas = helpers.cublas_cmake_args(tmp_path)
    assert cublas is not None or not res.schedule.uses_cublas, "cuBLAS headers not found"
    seconds = helpers.build_export(res.outdir, cublas if res.schedule.uses_cublas else [], jobs=16)
    build = res.outdir / "build"
    ctest = subprocess.run(["ctest", "--output-on-failure"], cwd=build, capture_output=True, text=True)
    assert ctest.returncode == 0, ctest.stdout[-4000:] + ctest.stderr[-2000:]

    driver_ms = {}
    for mode, extra in (("stream", []), ("graph", ["--graph"])):
        r = subprocess.run([str(build / "stitch_driver"), str(res.outdir / "data"), "--runs", str(TIMED_RUNS), *extra],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "MISMATCH" not in r.stdout
        driver_ms[mode] = float(re.search(r"time: ([0-9.]+) ms per run", r.stdout).group(1))

    manifest = json.loads((res.outdir / "manifest.json").read_text())
    inputs = [torch.from_numpy(_read(res.outdir, e).copy()).cuda() for e in manifest["inputs"]]
    model = _binding(res.outdir, name).StitchProgram()
    got = model(*inputs)
    got = list(got) if isinstance(got, tuple) else [got]
    for t, e in zip(got, manifest["outputs"]):
        want = torch.from_numpy(_read(res.outdir, e).copy())
        torch.testing.assert_close(t.cpu(), want, atol=1e-4, rtol=1e-4)

    run, runners = _in_process(program, {e["name"]: t for e, t in zip(manifest["inputs"], inputs)})
    mine = run()
    for a, b in zip(got, mine):
        torch.testing.assert_close(a, b.reshape(a.shape), atol=1e-4, rtol=1e-4)
    binding_ms = _time_ms(lambda: model(*inputs))
    again = model(*inputs)  # after hundreds of calls (split reductions reset their counters)
    again = list(again) if isinstance(again, tuple) else [again]
    for a, b in zip(again, got):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    inproc_ms = _time_ms(run)
    fused = sum(r.fused for r in runners)
    graph_ms = _in_process_graph_ms(program)
    print(f"\n{name}: built in {seconds:.0f} s; {len(res.schedule.steps)} launches; "
          f"export driver {driver_ms['stream']:.4f} ms (stream), {driver_ms['graph']:.4f} ms (CUDA graph); "
          f"export via the binding {binding_ms:.4f} ms; in-process program ({fused}/{len(runners)} regions "
          f"fused, Python launches) {inproc_ms:.4f} ms, as optimize runs it (one CUDA graph) {graph_ms:.4f} ms")
    # both replayed as a CUDA graph and timed the same way: the export may not be more than 10% slower
    # (or 1 us, below which launch jitter dominates). It may be faster: on the H200 (2026-11-30) it was,
    # by 10-27% (mlp_block 27.0 us against 36.8 us). Not yet profiled; one difference is that the
    # in-process graph reaches cuBLAS through torch, where the export calls it directly.
    assert driver_ms["graph"] <= graph_ms + max(0.10 * graph_ms, 0.001), (driver_ms, graph_ms)


def test_every_example_export_passes_its_ctest(tmp_path):
    """All bundled examples exported, built as one CMake tree, and every export's ctest run on the GPU:
    each driver checks its outputs (stream launches and CUDA graph) against the saved reference."""
    import os

    from agent_core.export import export_program
    from agent_core.importers import import_file
    helpers = _helpers()
    names = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    for name in names:
        export_program(import_file(str(EXAMPLES / f"{name}.py")), tmp_path / name)
    top = helpers.one_tree(tmp_path / "all", {n: tmp_path / n for n in names})
    helpers.build_export(top, helpers.cublas_cmake_args(tmp_path) or [], jobs=os.cpu_count() or 8)
    r = subprocess.run(["ctest", "--output-on-failure", "-j", "4"], cwd=top / "build", capture_output=True, text=True)
    print("\n" + r.stdout[-1500:])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert f"100% tests passed out of {2 * len(names)}" in r.stdout  # stream and graph, per example
