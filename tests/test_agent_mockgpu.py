"""The loop's GPU path (verify, time, tune, decide, end-to-end program, baselines) run on the CPU:
kernels are compiled for real (sm_90) but launched by a fake that evaluates their nodes with torch,
and timing counts torch op calls, so every decision the loop makes on a GPU is exercised in CI."""
import io

import pytest
import torch

import agent_core.agent.loop as loop
import agent_core.profile.baselines as baselines
import agent_core.profile.hardware as hardware
import agent_core.profile.timing as timing
import agent_core.program_runtime as program_runtime
import agent_core.runtime.launch as launch
import agent_core.runtime.split_tf32 as split_mod
from agent_core.agent import EventEmitter, optimize, read_events
from agent_core.commands import bench
from agent_core.ir import Program
from agent_core.reference import run_node

SABOTAGED = set()
EXACT = set()       # kernels (by name) that compute in float64, then round to float32
SLOWED = set()      # kernels (by name or params["form"]) whose launch costs as much as 100 torch ops
CALLS = {"n": 0}


class FakeLoaded:
    def __init__(self, ks, program, compiled=None):
        self.kernel, self.program, self.compiled = ks, program, compiled
        self.specs = [(tuple(program.values[v].shape), "float32") for v in ks.outputs]

    def __call__(self, ins, outs=None):
        exact = any(tag in self.kernel.name for tag in EXACT)
        env = dict(zip(self.kernel.inputs, [t.double() if exact and t.is_floating_point() else t for t in ins]))
        for nid in self.kernel.node_ids:
            run_node(self.program, nid, env)
        res = [env[v].float() if exact else env[v] for v in self.kernel.outputs]
        if any(tag in self.kernel.name for tag in SABOTAGED):
            res = [r + 1e-2 for r in res]
        if any(tag in f"{self.kernel.name} {(self.kernel.params or {}).get('form')}" for tag in SLOWED):
            CALLS["n"] += 100
        if outs is not None:
            for o, r in zip(outs, res):
                o.copy_(r.reshape(o.shape))
            return list(outs)
        return res

    def bind(self, ins, outs):
        return lambda: self(ins, outs)

    def attribution(self):
        return {"registers": 16, "local_bytes": 0, "shared_bytes": 0, "spill_stores": 0, "spill_loads": 0}

    def _workspace(self, torch_mod):
        return []


def fake_time_gpu(fn, *, trials=20, warmup=3, flush=True, stream=None):
    """1 us plus 10 us per torch op the function runs through the runtime (fused kernels are free)."""
    before = CALLS["n"]
    fn()
    ms = 0.001 + 0.01 * (CALLS["n"] - before)
    return timing.summarize([ms] * trials)




@pytest.fixture
def mock_gpu(monkeypatch):
    from agent_core.program_runtime.executable import ProgramExecutable

    real_run_node = split_mod.run_node

    def counting_run_node(*a, **k):
        CALLS["n"] += 1
        return real_run_node(*a, **k)
    monkeypatch.setattr(loop, "TENSOR_DEVICE", "cpu")
    monkeypatch.setattr(hardware, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(hardware, "hardware_snapshot", lambda: {"name": "fake", "sm_count": 132,
                                                                 "copy_bandwidth_gbs": 4000.0})
    monkeypatch.setattr(launch, "load_kernel", lambda ks, program, c=None: FakeLoaded(ks, program, c))
    monkeypatch.setattr(timing, "time_gpu", fake_time_gpu)
    monkeypatch.setattr(timing, "time_in_graph", lambda fn, **kw: (fake_time_gpu(fn, **kw), "graph"))
    from agent_core.program_runtime import executable
    monkeypatch.setattr(executable, "raw_launch", lambda lk, ins, outs: lk(ins, outs))
    monkeypatch.setattr(split_mod, "run_node", counting_run_node)   # regions and torch steps run nodes here
    monkeypatch.setattr(program_runtime, "build_executable",
                        lambda prog, fused, graph=True, device="cpu": ProgramExecutable(prog, fused, graph=False,
                                                                                       device="cpu"))
    monkeypatch.setattr(baselines, "measure_baselines", lambda fn, inputs, **kw: {
        "eager": {"ok": True, "ms": 0.5},
        "compile_default": {"ok": True, "ms": 0.25, "compile_s": 3.0, "inductor_kernels": {"generated": 1, "extern": 3}},
        "compile_reduce-overhead": {"ok": False, "error": "RuntimeError: no"}})
    SABOTAGED.clear()
    SLOWED.clear()
    EXACT.clear()
    yield


def _mlp():
    p = Program("mlp")
    h = p.add_input("x", [16, 32]).id
    for i, width in enumerate((48, 40, 8)):
        w = p.add_parameter(f"w{i}", shape=[width, p.values[h].shape[1]]).id
        b = p.add_parameter(f"b{i}", shape=[width]).id
        h = p.add_node("linear", [h, w, b]).outputs[0]
        h = p.add_node("relu" if i < 2 else "tanh", [h]).outputs[0]
    h = p.add_node("softmax", [h], {"dim": -1}).outputs[0]
    p.mark_output(h)
    p.metadata["memory_budget_bytes"] = 1 << 40     # room for every split form (test_memory_plan has the budget)
    return p


def _optimize(prog, tmp_path, **kw):
    buf = io.StringIO()
    res = optimize(prog, out_dir=tmp_path, emit=EventEmitter(buf), tune_trials=2, baseline_fn=(None, []), **kw)
    return res, list(read_events(buf.getvalue().splitlines()))


def test_gpu_path_verifies_tunes_keeps_faster_kernels_and_builds_the_program(mock_gpu, tmp_path):
    res, events = _optimize(_mlp(), tmp_path)
    kinds = [e["event"] for e in events]
    assert res.gpu and res.status == "done" and kinds[-1] == "done"
    fused = [o for o in res.outcomes if o.status == "fused"]
    assert fused and all(o.fused_ms < o.unfused_ms and "faster" in o.reason for o in fused)
    assert any(e["event"] == "verify" and e["scope"] == "region" and e["ok"] and e["draws"] == 5 for e in events)
    steps = [e for e in events if e["event"] == "tune-step"]
    assert steps and {"trial", "params", "ok", "ms"} <= set(steps[0])
    e2e = res.profile["end_to_end"]
    assert e2e["correct"] and e2e["generated_kernels"] == len(fused)
    assert any(e["event"] == "verify" and e["scope"] == "program" and e["ok"] for e in events)
    assert res.profile["speedup_vs_eager"] == pytest.approx(0.5 / e2e["ms"])
    assert res.profile["speedup_vs_compile"] == pytest.approx(0.25 / e2e["ms"])
    rec = bench.record_from_result("mlp.py", res, 1.0)
    assert rec["correct"] and rec["kernels"] == len(fused) and rec["compile_best_ms"] == 0.25
    assert rec["compile_errors"] == {"reduce-overhead": "RuntimeError: no"}
    assert rec["inductor_kernels"] == {"default": {"generated": 1, "extern": 3}} and rec["inductor_fewest_kernels"] == 4
    assert rec["more_kernels_than_inductor"] == (e2e["launches"] > 4)
    assert rec["best_baseline"] == "compile_default" and rec["speedup_best"] == pytest.approx(0.25 / e2e["ms"])
    # library epilogues: a linear with its activation after it became one kernel after cuBLAS
    assert any("linear" in str(e.get("library_nodes")) or e.get("library_nodes") for e in events
               if e["event"] == "codegen")


def test_wrong_kernel_falls_back_with_its_reason_and_the_program_stays_correct(mock_gpu, tmp_path):
    SABOTAGED.add("_r")     # every generated kernel is off by 1e-2
    res, events = _optimize(_mlp(), tmp_path)
    assert not [o for o in res.outcomes if o.status == "fused"]
    fb = [e for e in events if e["event"] == "fallback"]
    assert fb and all("verification failed" in e["reason"] and "differs by" in e["reason"] for e in fb)
    assert res.profile["end_to_end"]["correct"] and res.profile["end_to_end"]["generated_kernels"] == 0
    for r in res.program.regions:
        a = r.schedule["agent"]
        assert a["status"] in ("fallback", "library", "view") and a["reason"]


def test_region_timing_off_keeps_verified_kernels(mock_gpu, tmp_path):
    res, events = _optimize(_mlp(), tmp_path, time_regions=False, baselines=False, tune=False)
    fused = [o for o in res.outcomes if o.status == "fused"]
    assert fused and all("not timed" in o.reason for o in fused)
    assert not any(e["event"] == "tune-step" for e in events)
    assert "baselines" not in res.profile and res.profile["end_to_end"]["correct"]


def test_device_inputs_follow_the_init_hints():
    from agent_core.agent.refcache import device_inputs
    p = Program("hints")
    p.add_input("a", [64, 8])
    p.add_input("u", [1000], init={"kind": "uniform", "low": 2.0, "high": 3.0})
    p.add_input("pos", [1000], init={"kind": "positive"})
    p.add_input("sm", [4, 10], init={"kind": "softmax"})
    p.add_input("i", [50], dtype="int64", init={"kind": "randint", "low": 0, "high": 5})
    d = device_inputs(p, 3, "cpu")
    assert d["a"].shape == (64, 8) and d["a"].dtype == torch.float32
    assert 2.0 <= float(d["u"].min()) and float(d["u"].max()) <= 3.0
    assert float(d["pos"].min()) >= 0.1
    assert torch.allclose(d["sm"].sum(-1), torch.ones(4))
    assert d["i"].dtype == torch.int64 and 0 <= int(d["i"].min()) and int(d["i"].max()) < 5
    assert torch.equal(device_inputs(p, 3, "cpu")["a"], d["a"])     # a seed gives the same draw


def _bn_program():
    p = Program("bn")
    x = p.add_input("x", [4, 3, 8, 8]).id
    w = p.add_parameter("w", shape=[5, 3, 3, 3]).id
    y = p.add_node("conv2d", [x, w]).outputs[0]
    import numpy as np
    rng = np.random.default_rng(0)
    stats = [p.add_parameter(n, data=(rng.random(5) + 0.5 if n == "var" else rng.standard_normal(5)).astype("float32")).id
             for n in ("mean", "var", "g", "b")]
    y = p.add_node("batch_norm", [y, *stats]).outputs[0]
    p.mark_output(p.add_node("relu", [y]).outputs[0])
    return p


def test_large_programs_check_their_rewrites_on_the_gpu(mock_gpu, tmp_path, monkeypatch):
    import agent_core.rewrites as rewrites
    seen = []
    real = rewrites.rewrite_program

    def spy(program, **kw):
        seen.append(kw.get("device"))
        return real(program, **kw)
    monkeypatch.setattr(rewrites, "rewrite_program", spy)
    monkeypatch.setattr(loop, "REWRITE_MAX_FLOPS", 0)
    monkeypatch.setattr(loop, "TENSOR_DEVICE", "cpu")   # stands for "cuda" in this CPU test
    res, events = _optimize(_bn_program(), tmp_path, tune=False, baselines=False)
    rw = [e for e in events if e["event"] == "rewrite" and e["kept"]]
    assert rw and all(e["checked_on"] == "cpu" for e in rw) and seen == ["cpu"]
    assert res.profile["end_to_end"]["correct"]
    assert not any(n.op == "batch_norm" for n in res.program.nodes.values())   # folded into the conv


def test_large_programs_without_a_gpu_are_not_rewritten(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "REWRITE_MAX_FLOPS", 0)
    buf = io.StringIO()
    res = optimize(_bn_program(), device="cpu", emit=EventEmitter(buf))
    events = list(read_events(buf.getvalue().splitlines()))
    assert not any(e["event"] == "rewrite" for e in events)
    assert any("rewrites skipped" in e.get("message", "") for e in events if e["event"] == "log")
    assert any(n.op == "batch_norm" for n in res.program.nodes.values())
    assert res.profile["rewrites_skipped"].startswith("too big to check on the CPU (")


def test_rewrites_whose_check_does_not_fit_the_gpu_are_skipped_and_the_profile_says_why(mock_gpu, tmp_path,
                                                                                         monkeypatch):
    """Under bench --jobs the other problems may hold the GPU memory a large program's rewrite check
    needs: the program is planned as written, and the profile says why (bench reruns it alone)."""
    from agent_core import rewrites
    from agent_core.memory_check import DoesNotFit

    def crowded(program, **kw):
        raise DoesNotFit("bn", "its tensors", 33 << 30, 20 << 30)
    monkeypatch.setattr(rewrites, "rewrite_program", crowded)
    monkeypatch.setattr(loop, "REWRITE_MAX_FLOPS", 0)
    res, events = _optimize(_bn_program(), tmp_path, tune=False, baselines=False)
    assert res.profile["rewrites_skipped"].startswith("DoesNotFit: ")
    assert any(n.op == "batch_norm" for n in res.program.nodes.values())       # planned as written
    assert res.profile["end_to_end"]["correct"]


def test_a_rewrite_the_end_to_end_check_rejects_is_undone(mock_gpu, tmp_path, monkeypatch):
    """A rewrite its own check let through (its tolerance is looser than the end-to-end one) but
    whose program disagrees with the original: the run starts over without rewrites, says why, and
    ends correct."""
    import agent_core.rewrites as rewrites
    from agent_core.rewrites import RewriteResult, clone_program
    calls = []

    def bogus(program, **kw):
        calls.append(1)
        twin = clone_program(program)
        last = next(n for n in twin.nodes.values() if n.op == "tanh")
        twin.nodes[last.id].op = "relu"          # a "rewrite" that changes the result
        return RewriteResult(twin, fired=[{"rule": "bogus", "node": last.id, "message": "tanh -> relu"}])
    monkeypatch.setattr(rewrites, "rewrite_program", bogus)
    res, events = _optimize(_mlp(), tmp_path, tune=False, baselines=False)
    assert calls == [1]                                               # the second pass does not rewrite
    errors = [e["message"] for e in events if e["event"] == "error"]
    assert any("does not match the original" in m and "without rewrites" in m for m in errors)
    assert res.profile["end_to_end"]["correct"]
    assert any(n.op == "tanh" for n in res.program.nodes.values())
    assert [e["event"] for e in events].count("done") == 1


def _fp32_looks_slow(monkeypatch):
    """The precision step times fp32 as five torch calls and split TF32 as none (fake timing)."""
    import agent_core.agent.precision as precision

    def slow_run_node(*a, **k):
        CALLS["n"] += 5
        return run_node(*a, **k)
    monkeypatch.setattr(precision, "run_node", slow_run_node)


def test_split_tf32_is_chosen_where_faster_and_the_program_runs_and_verifies_with_it(mock_gpu, tmp_path, monkeypatch):
    _fp32_looks_slow(monkeypatch)
    ran = []
    real = split_mod.run_split_tf32
    monkeypatch.setattr(split_mod, "run_split_tf32", lambda p, nid, env, *a: ran.append(nid) or real(p, nid, env, *a))
    res, events = _optimize(_mlp(), tmp_path)
    linears = [n.id for n in res.program.nodes.values() if n.op == "linear"]
    chosen = [e for e in events if e["event"] == "precision"]
    assert sorted(e["node"] for e in chosen) == sorted(linears)
    assert all(e["chosen"] == "3xtf32" and "faster than plain fp32" in e["reason"] for e in chosen)
    assert res.program.metadata["library_precision"] == {n: "3xtf32" for n in linears}
    gains = res.program.metadata["library_precision_gain_ms"]     # what the memory plan weighs per-call splits by
    assert set(gains) == set(linears) and all(g > 0 for g in gains.values())
    assert set(ran) == set(linears)                     # regions and the end-to-end program ran the split form
    fused = [o for o in res.outcomes if o.status == "fused" and "linear runs as split TF32" in o.reason]
    assert len(fused) == 3                              # each kept kernel says how its library call runs
    assert res.profile["end_to_end"]["correct"]
    rec = bench.record_from_result("mlp.py", res, 1.0)
    assert rec["split_tf32_nodes"] == 3 and rec["library_calls"] == {n: "3xtf32" for n in linears}
    plan = rec["memory_plan"]
    assert plan["run_as_fp32"] == [] and plan["predicted_peak_bytes"] <= plan["budget_bytes"]
    from agent_core.project_file import load_program
    assert load_program(tmp_path / "program.json").metadata["library_precision"] == {n: "3xtf32" for n in linears}


def _off_by_a_bit(monkeypatch):
    """split TF32 right at the precision step's random draw, wrong in the program."""
    import agent_core.agent.precision as precision
    real = split_mod.run_split_tf32

    def wrong(p, nid, env, *args):
        real(p, nid, env, *args)
        env[p.nodes[nid].outputs[0]] = env[p.nodes[nid].outputs[0]] + 1e-2
    monkeypatch.setattr(split_mod, "run_split_tf32", wrong)       # the built program's calls
    monkeypatch.setattr(precision, "run_split_tf32", real)


def test_split_forms_that_do_not_fit_eagers_memory_are_not_timed_and_run_in_fp32(mock_gpu, tmp_path, monkeypatch):
    _fp32_looks_slow(monkeypatch)
    timed = []
    import agent_core.agent.precision as precision
    real = precision.run_split_tf32
    monkeypatch.setattr(precision, "run_split_tf32", lambda p, nid, env, *a: timed.append(nid) or real(p, nid, env, *a))
    prog = _mlp()
    del prog.metadata["memory_budget_bytes"]        # the default: eager's peak, estimated
    res, events = _optimize(prog, tmp_path)
    linears = sorted(n.id for n in res.program.nodes.values() if n.op == "linear")
    prec = [e for e in events if e["event"] == "precision" and "tile GEMM" not in e["reason"]]
    assert sorted(e["node"] for e in prec) == linears and all(e["chosen"] == "fp32" for e in prec)
    assert all("not timed, their parts being more than the memory budget leaves at this call" in e["reason"]
               and "3xtf32" in e["reason"] for e in prec)
    assert timed == [] and "tf32x3_ms" not in prec[0]                 # no time spent on forms that cannot run
    assert res.program.metadata["library_precision"] == {}      # the regions were tuned against fp32 calls
    # ... so the tile GEMM, which splits in registers and keeps no parts in memory, won them here
    tile = [e for e in events if e["event"] == "precision" and "keeps our tile GEMM" in e["reason"]]
    assert tile and all(e["node"] in linears for e in tile)
    rec = bench.record_from_result("mlp.py", res, 1.0)
    assert rec["library_calls"] == {} and rec["memory_plan"]["run_as_fp32"] == []
    assert rec["memory_plan"]["predicted_peak_bytes"] <= rec["memory_plan"]["budget_bytes"]
    assert res.profile["end_to_end"]["correct"]


def test_a_region_that_fails_with_split_tf32_keeps_its_kernel_with_the_call_in_fp32(mock_gpu, tmp_path, monkeypatch):
    _fp32_looks_slow(monkeypatch)
    _off_by_a_bit(monkeypatch)
    res, events = _optimize(_mlp(), tmp_path, tune=False)
    back = [e for e in events if e["event"] == "precision" and "failed verification with split TF32" in e["reason"]]
    assert len(back) == 3 and all(e["chosen"] == "fp32" for e in back)
    heads = {e["region"] for e in events if e["event"] == "codegen" and e.get("library_nodes")}
    assert len(heads) == 3 and all(o.status == "fused" for o in res.outcomes if o.region in heads)
    assert res.profile["end_to_end"]["correct"] and res.profile["library_precision"] == {}


def test_a_program_that_fails_verification_with_split_tf32_runs_in_fp32_with_the_reason(mock_gpu, tmp_path, monkeypatch):
    _fp32_looks_slow(monkeypatch)
    _off_by_a_bit(monkeypatch)
    p = Program("lone_linear")      # a linear alone is a library region: only the end-to-end check sees it
    x = p.add_input("x", [16, 32]).id
    w = p.add_parameter("w", shape=[24, 32]).id
    p.mark_output(p.add_node("linear", [x, w]).outputs[0])
    p.metadata["memory_budget_bytes"] = 1 << 40     # room for the split weight: the program runs it split
    res, events = _optimize(p, tmp_path, tune=False)
    assert res.profile["end_to_end"]["correct"]
    assert res.program.metadata["library_precision"] == {} == res.profile["library_precision"]
    assert "library_precision_fallback" in res.profile
    assert bench.record_from_result("lone.py", res, 1.0)["library_precision_fallback"]
    assert any(e["event"] == "error" and "split-TF32" in e["message"] for e in events)


def test_a_kernel_that_breaks_only_the_whole_program_is_found_and_the_others_are_kept(mock_gpu, tmp_path):
    """Every region verifies alone, but one kernel is wrong inside the end-to-end program (as when a
    region's random draws miss what the program feeds it): bisection blames that region alone, the
    other kernels stay, and the program is correct."""
    res, _ = _optimize(_mlp(), tmp_path / "clean")
    fused = [o for o in res.outcomes if o.status == "fused"]
    assert len(fused) >= 2
    bad = fused[-1].kernel
    build = program_runtime.build_executable

    def sabotaged(prog, kept, graph=True, device="cpu"):
        exe = build(prog, kept, graph=graph, device=device)
        launch_step = exe._launch

        def wrong(torch_mod, step, env, release):
            launch_step(torch_mod, step, env, release)
            if step.kernel.name == bad:
                for v in step.kernel.outputs:
                    env[v].add_(1e-2)
        exe._launch = wrong
        return exe
    program_runtime.build_executable = sabotaged     # the fixture's monkeypatch restores the original
    res, events = _optimize(_mlp(), tmp_path / "sabotaged")
    after = {o.kernel: o for o in res.outcomes}
    assert after[bad].status == "fallback" and after[bad].reason.startswith("the whole program failed verification with it")
    assert {o.kernel for o in res.outcomes if o.status == "fused"} == {o.kernel for o in fused[:-1]}
    e2e = res.profile["end_to_end"]
    assert e2e["correct"] and e2e["generated_kernels"] == len(fused) - 1
    checks = [e for e in events if e["event"] == "verify" and e["scope"] == "program"]
    assert not checks[0]["ok"] and checks[-1]["ok"] and len(checks) <= 2 + 2 * len(fused)


def _conv_then_softmax():
    """conv2d (16 -> 32 channels, compute-bound) alone before a softmax over its channels."""
    p = Program("convs")
    x = p.add_input("x", [2, 16, 10, 10]).id
    w = p.add_parameter("w", shape=[32, 16, 3, 3]).id
    y = p.add_node("conv2d", [x, w], {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1})
    p.mark_output(p.add_node("softmax", [y.outputs[0]], {"dim": 1}).outputs[0])
    return p


@pytest.mark.parametrize("slower", [False, True], ids=["kept", "slower_than_cudnn"])
def test_a_convolution_alone_runs_as_our_implicit_gemm_only_where_it_beats_cudnn(mock_gpu, tmp_path, slower):
    prog = _conv_then_softmax()
    conv = next(n for n in prog.nodes.values() if n.op == "conv2d")
    if slower:
        SLOWED.add("_r1")
    res, events = _optimize(prog, tmp_path)
    (out,) = [o for o in res.outcomes if conv.id in next(r.nodes for r in res.program.regions if r.id == o.region)]
    codegen = [e for e in events if e["event"] == "codegen" and e.get("region") == out.region]
    assert codegen and codegen[0]["kind"] == "gemm" and "implicit-GEMM convolution" in codegen[0]["schedule"]
    if slower:
        assert out.status == "library" and "was correct but slower" in out.reason, out.reason
    else:
        assert out.status == "fused" and "runs as our implicit GEMM" in out.reason and "instead of cuDNN's" in out.reason
        assert any(e["event"] == "precision" and e.get("chosen") == "gemm-3xtf32" for e in events)
    assert res.profile["end_to_end"]["correct"]


@pytest.mark.parametrize("slower", [False, True], ids=["kept", "slower_than_cudnn"])
def test_a_transposed_convolution_alone_runs_as_our_direct_convolution_only_where_it_beats_cudnn(
        mock_gpu, tmp_path, slower):
    """conv_transpose3d (stride 2) alone before a softmax over its channels: its region's kernel is the
    direct convolution, phase by phase, timed against the cuDNN call; kept where faster (the library
    choices for the node dropped), else the call stays and the reason gives both times."""
    from tests.test_conv_direct_form import _transposed_alone
    prog, nid = _transposed_alone(8)
    if slower:
        SLOWED.add("conv-direct")
    res, events = _optimize(prog, tmp_path)
    (out,) = [o for o in res.outcomes if nid in next(r.nodes for r in res.program.regions if r.id == o.region)]
    codegen = [e for e in events if e["event"] == "codegen" and e.get("region") == out.region]
    assert codegen and codegen[0]["kind"] == "convolution" and "4 phase(s)" in codegen[0]["schedule"]
    if slower:
        assert out.status == "library" and "via torch: our direct convolution (fp32 FFMA" in out.reason, out.reason
        assert "was correct but slower" in out.reason, out.reason
    else:
        assert out.status == "fused", out.reason
        assert "runs as our direct convolution (fp32 FFMA, one thread per 4 consecutive output positions" in out.reason, out.reason
        assert "instead of cuDNN's" in out.reason, out.reason
        assert any(e["event"] == "precision" and e.get("chosen") == "conv-direct" for e in events)
    assert res.profile["end_to_end"]["correct"]


def _conv_relu_double():
    """conv2d (8 -> 24 channels, 3x3) -> relu -> * 2."""
    p = Program("conv_epi")
    x = p.add_input("x", [2, 8, 12, 12]).id
    w = p.add_parameter("w", shape=[24, 8, 3, 3]).id
    y = p.add_node("conv2d", [x, w], {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1})
    r = p.add_node("relu", [y.outputs[0]])
    p.mark_output(p.add_node("mul_scalar", [r.outputs[0]], {"value": 2.0}).outputs[0])
    return p


def test_a_convolution_and_its_epilogue_keep_the_implicit_gemm_where_it_beats_cudnn_and_the_epilogue(
        mock_gpu, tmp_path):
    """conv -> relu -> * 2: the tuner tries the implicit GEMM against cuDNN + the epilogue kernel (the
    fake charges the cuDNN call) and keeps it, and the program verifies with it."""
    p = _conv_relu_double()
    res, events = _optimize(p, tmp_path)
    (out,) = [o for o in res.outcomes if o.status == "fused"]
    trials = [e for e in events if e["event"] == "tune-step" and e.get("region") == out.region]
    assert trials[0]["params"].get("form") != "gemm-3xtf32"                 # the default: cuDNN + epilogue
    assert any(t["params"].get("form") == "gemm-3xtf32" and t["ok"] for t in trials[1:])
    assert "runs as our tile GEMM" in out.reason and "the library form + epilogue kernel" in out.reason, out.reason
    assert res.profile["end_to_end"]["correct"]


def test_a_thin_convolution_and_its_epilogue_keep_the_direct_convolution_where_it_beats_the_other_forms(
        mock_gpu, tmp_path):
    """conv (8 channels, 3x3: 72 products an output) -> relu -> * 2, with the tile GEMM made slow: the
    tuner times the direct convolution too, keeps it, says so against both other forms, drops the
    convolution's library choices, and the program verifies with it."""
    p = _conv_relu_double()
    SLOWED.add("gemm-3xtf32")
    res, events = _optimize(p, tmp_path)
    (out,) = [o for o in res.outcomes if o.status == "fused"]
    trials = [e for e in events if e["event"] == "tune-step" and e.get("region") == out.region]
    assert [t["params"].get("form") for t in trials[:3]] == [None, "gemm-3xtf32", "conv-direct"], trials
    assert "runs as our direct convolution with the epilogue fused" in out.reason, out.reason
    assert "the tile GEMM with the epilogue fused was slower" in out.reason, out.reason
    assert any(e["event"] == "precision" and e.get("chosen") == "conv-direct" for e in events)
    assert res.profile["end_to_end"]["correct"]


def test_a_kernel_more_accurate_than_torchs_fp32_on_a_cancelling_sum_is_kept(mock_gpu, tmp_path):
    """sum(1e4 x + z) - sum(1e4 x) over rows of 65536: torch's fp32 is off by about 0.5 against the float64
    value, so a kernel that computes it exactly misses the fp32 reference by as much. Its region and the
    whole program pass on the float64 second opinion (verify.compare_exact) instead of falling back."""
    from tests.programs import cancelling_sum
    EXACT.add("_r")
    res, events = _optimize(cancelling_sum(), tmp_path)
    fused = [o for o in res.outcomes if o.status == "fused"]
    assert fused, [(o.status, o.reason) for o in res.outcomes]
    assert res.profile["end_to_end"]["correct"], res.profile["end_to_end"]


def test_a_linear_alone_with_its_output_reshaped_runs_as_the_tile_gemm(mock_gpu, tmp_path):
    """linear (compute-bound) -> reshape alone, as level 2's 55 has it: the view is in the linear's
    region, the region's kernel is the tile GEMM writing the reshaped value (kept: the fake charges
    cuBLAS's call), and the reason names the linear. It used to stay cuBLAS's."""
    p = Program("linear_view")
    x = p.add_input("x", [394, 512]).id
    w = p.add_parameter("w", shape=[1536, 512]).id
    y = p.add_node("linear", [x, w]).outputs[0]
    p.mark_output(p.add_node("reshape", [y], {"shape": [2, 197, 1536]}).outputs[0])
    res, events = _optimize(p, tmp_path)
    (out,) = [o for o in res.outcomes if o.status == "fused"]
    assert "; linear (linear) runs as our tile GEMM" in out.reason and "instead of cuBLAS's" in out.reason, out.reason
    assert res.profile["end_to_end"]["correct"]
