"""A program's own tolerance (verify.tolerance) and the lower precisions a user allows it
(runtime/low_precision.py, issue 16: "TF32, bf16 or fp16 with fp32 accumulation where the user allows
it, kept only where it verifies at the program's tolerance"): the setting, the verification that reads
it, the forms on the CPU, the chooser (timings given per form, as in test_precision_workspace), the
memory plan's model and the command line as a shell runs it."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import agent_core.agent.precision as precision
from agent_core.errors import ProgramError
from agent_core.ir import Program
from agent_core.project_file import load_program, save_program
from agent_core.reference import parameter_tensors, run_node
from agent_core.runtime import low_precision as lp
from agent_core.runtime.split_tf32 import describe_library_call, run_library_node
from agent_core.verify import tolerance, verify_region
from tests.test_precision_workspace import _choose, _fake_gpu, _linears, _program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _linear(k=256, n=64):
    p = Program("lin")
    x = p.add_input("x", (32, k))
    w = p.add_parameter("w", np.random.default_rng(0).uniform(-1, 1, (n, k)).astype(np.float32) / k ** 0.5)
    y = p.add_node("linear", [x.id, w.id])
    p.mark_output(y.outputs[0])
    return p, y


def test_the_default_tolerance_is_kernelbenchs_and_a_program_may_set_its_own():
    p, _ = _linear()
    assert tolerance(p) == (1e-4, 1e-4)
    p.metadata["tolerance"] = {"atol": 1e-3, "rtol": 2e-3}
    assert tolerance(p) == (1e-3, 2e-3)
    p.metadata["tolerance"] = {"rtol": 1e-2}
    assert tolerance(p) == (1e-4, 1e-2)


@pytest.mark.parametrize("bad", ["1e-3", {"atol": "x"}, {"atol": -1e-3}, {"atol": 0}, {"rtol": 1.5},
                                 {"atol": float("nan")}, {"atol": True}, {"tol": 1e-3}, [1e-3]])
def test_a_malformed_tolerance_is_refused_with_its_name(bad):
    p, _ = _linear()
    p.metadata["tolerance"] = bad
    with pytest.raises(ProgramError, match="tolerance"):
        tolerance(p)


def test_allowed_forms_come_most_accurate_first_and_anything_else_is_refused():
    p, _ = _linear()
    assert lp.allowed(p) == []
    p.metadata["allow_precision"] = ["bf16", "tf32"]
    assert lp.allowed(p) == ["tf32", "bf16"]
    for bad in (["fp8"], "tf32", [None]):
        p.metadata["allow_precision"] = bad
        with pytest.raises(ProgramError, match="allow_precision"):
            lp.allowed(p)


def test_verification_holds_results_to_the_programs_tolerance():
    p, y = _linear()
    params = parameter_tensors(p, "cpu")

    def off_by(rel):
        def run(ins):
            env = {p.inputs[0]: ins[0], **params}
            run_node(p, y.id, env)
            return [env[y.outputs[0]] * (1 + rel)]
        return run
    check = lambda run: verify_region(p, [p.inputs[0]], [y.outputs[0]], run, draws=2, device="cpu")
    loose = check(off_by(3e-3))
    assert not loose.ok and "atol=0.0001, rtol=0.0001" in loose.reason
    p.metadata["tolerance"] = {"atol": 1e-2, "rtol": 1e-2}
    assert check(off_by(3e-3)).ok
    assert not check(off_by(3e-2)).ok


@pytest.mark.parametrize("form,within", [("bf16", 2e-2), ("fp16", 2e-3)])
def test_a_half_precision_form_is_its_precision_and_hands_back_fp32(form, within):
    p, y = _linear()
    env = dict(parameter_tensors(p, "cpu"))
    env[p.inputs[0]] = torch.randn(32, 256)
    fp32, low = dict(env), dict(env)
    run_node(p, y.id, fp32)
    p.metadata["library_precision"] = {y.id: form}
    run_library_node(p, y.id, low)          # as the program runs it
    got, want = low[y.outputs[0]], fp32[y.outputs[0]]
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, rtol=within, atol=within)
    assert not torch.allclose(got, want, rtol=1e-4, atol=1e-4)    # really rounded: outside KernelBench's
    assert form in describe_library_call(p, y.id) and "allowed by the program" in describe_library_call(p, y.id)


def test_lower_precisions_are_timed_only_where_the_program_allows_them(monkeypatch):
    ms = {"fp32": 1.0, "3xtf32": 0.5, "3xtf32-cat": 0.6, "tf32": 0.3, "fp16": 0.2, "bf16": 0.2}
    extra = {k: 0 for k in ms}
    p = _program()
    _fake_gpu(monkeypatch, ms=ms, extra=extra)
    events = _choose(p, room=None)
    assert set(precision.library_precision(p).values()) == {"3xtf32"}
    assert not any("tf32_ms" in e or "bf16_ms" in e for e in events if e.get("event") == "precision")


def test_an_allowed_form_is_kept_only_within_the_tolerance(monkeypatch):
    """bf16 allowed at KernelBench's 1e-4 disagrees with fp32 and is not chosen, with the reason; at a
    tolerance of 2e-2 the faster allowed form is chosen (fp16, as fast and more accurate than bf16)."""
    ms = {"fp32": 1.0, "3xtf32": 0.5, "3xtf32-cat": 0.6, "tf32": 0.3, "fp16": 0.2, "bf16": 0.2}
    extra = {k: 0 for k in ms}
    p = _program()
    p.metadata["allow_precision"] = ["bf16", "fp16"]
    _fake_gpu(monkeypatch, ms=ms, extra=extra)
    events = _choose(p, room=None)
    first = next(e for e in events if e.get("event") == "precision")
    assert first["chosen"] == "3xtf32" and "bf16_ms" in first
    assert "disagreed with fp32 beyond the tolerance (atol 0.0001, rtol 0.0001)" in first["reason"]
    p.metadata["tolerance"] = {"atol": 2e-2, "rtol": 2e-2}
    _choose(p, room=None)
    assert precision.library_precision(p) == {n: "fp16" for n in _linears(p)}


def test_the_memory_plan_counts_the_half_precision_copies():
    from agent_core.program_runtime.memory_plan import call_temp_bytes
    p, y = _linear(k=256, n=64)
    half = (32 * 256 + 64 * 256 + 32 * 64) * 2
    assert call_temp_bytes(p, y.id, "bf16", False) == call_temp_bytes(p, y.id, "fp16", False) == half
    assert call_temp_bytes(p, y.id, "tf32", False) == 0


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "agent_core.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_optimize_keeps_the_tolerance_and_allowed_forms_in_the_program_file(tmp_path):
    p, _ = _linear()
    src = tmp_path / "lin.json"
    save_program(p, str(src))
    out = tmp_path / "out"
    r = _cli("optimize", str(src), "-o", str(out), "--cpu", "--no-baselines", "--tolerance", "1e-3",
             "--allow-precision", "bf16, TF32")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified within atol 0.001, rtol 0.001 (the program's tolerance); lower precisions allowed: tf32, bf16" \
        in r.stdout
    written = load_program(str(out / "program.json"))
    assert tolerance(written) == (1e-3, 1e-3) and lp.allowed(written) == ["tf32", "bf16"]
    assert "tolerance" not in json.loads(src.read_text()).get("metadata", {})     # the input is untouched


@pytest.mark.parametrize("flags,message", [(["--allow-precision", "fp8"], "allow_precision"),
                                           (["--tolerance", "-1"], "tolerance atol"),
                                           (["--fp32-only", "--allow-precision", "tf32"], "--fp32-only")])
def test_a_bad_precision_flag_is_one_clear_error_and_writes_nothing(tmp_path, flags, message):
    p, _ = _linear()
    src = tmp_path / "lin.json"
    save_program(p, str(src))
    r = _cli("optimize", str(src), "-o", str(tmp_path / "out"), "--cpu", "--no-baselines", *flags)
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_bench_sets_a_files_tolerance_aside_and_says_so(tmp_path):
    """bench keeps KernelBench's rules (fp32 at 1e-4) whatever the file says, in its line and its record."""
    p, _ = _linear()
    p.metadata.update(tolerance={"atol": 1e-2, "rtol": 1e-2}, allow_precision=["bf16"])
    src = tmp_path / "lin.json"
    save_program(p, str(src))
    r = _cli("bench", str(src), "--cpu", "--no-compile-baselines", "--json", str(tmp_path / "r.jsonl"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the file's tolerance and allow_precision set aside (fp32 at 1e-4)" in r.stdout
    rec = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert rec["set_aside"] == ["tolerance", "allow_precision"]
