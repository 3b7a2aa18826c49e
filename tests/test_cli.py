"""The stitchcuda command line, end to end: import, show, run, studio, and one-line errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from agent_core import cli
from agent_core.ir import Program
from agent_core.project_file import load_program, program_to_json, save_program
from agent_core.reference import random_inputs, run_reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "resources", "examples")


def mlp(tmp_path, name="mlp.json") -> tuple[Program, str]:
    """x[8,16] -> add(bias) -> gelu -> mul(scale) -> sum over dim 1, with a sidecar-sized table."""
    p = Program("tiny_mlp")
    x = p.add_input("x", (8, 16))
    b = p.add_parameter("bias", np.linspace(-1, 1, 16, dtype=np.float32))
    s = p.add_parameter("scale", np.full((8, 16), 0.5, np.float32))
    t = p.add_parameter("table", np.ones((70, 70), np.float32))  # > 4096 elements: sidecar
    a = p.add_node("add", [x.id, b.id])
    g = p.add_node("gelu", [a.outputs[0]], {"approximate": "tanh"})
    m = p.add_node("mul", [g.outputs[0], s.id])
    p.mark_output(m.outputs[0])
    p.add_node("relu", [t.id])  # an unused output: a validation warning
    path = str(tmp_path / name)
    save_program(p, path)
    return p, path


def call(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"stitchcuda {command}: ")
    return lines[0]


# --- show --------------------------------------------------------------------------------------
def test_show_counts_categories_parameters_bytes_and_flops(tmp_path, capsys):
    p, path = mlp(tmp_path)
    rc, out, err = call(capsys, "show", path)
    assert rc == 0 and not err
    assert "program tiny_mlp: 4 nodes" in out
    assert "by category: pointwise 4" in out
    assert "x: float32[8, 16]" in out and "bias: float32[16]" in out and "table: float32[70, 70]" in out
    assert "parameters: 3, 19.7 KiB" in out  # (16 + 128 + 4900) * 4 bytes
    assert "warning: output 'relu' of relu is never used" in out
    rc, out, _ = call(capsys, "show", path, "--json")
    s = json.loads(out)
    flops = sum(p.node_flops(n) for n in p.nodes)
    moved = sum(p.node_bytes(n) for n in p.nodes)
    assert (s["flops"], s["bytes_op_by_op"]) == (flops, moved) and flops > 0
    assert s["bytes_least"] == (8 * 16 + 16 + 128 + 4900 + 8 * 16) * 4
    assert s["categories"] == {"pointwise": 4} and s["ops"]["gelu"] == 1
    assert s["parameter_bytes"] == (16 + 128 + 4900) * 4 and not s["errors"]


# --- run -----------------------------------------------------------------------------------------
def test_run_prints_shapes_and_checksums_that_match_the_reference(tmp_path, capsys):
    p, path = mlp(tmp_path)
    rc, out, err = call(capsys, "run", path, "--seed", "3", "--device", "cpu", "--json")
    assert rc == 0, err
    res = json.loads(out)
    expect = run_reference(p, random_inputs(p, seed=3))["mul"].double()
    (row,) = res["outputs"]
    assert row["name"] == "mul" and row["shape"] == [8, 16] and row["dtype"] == "float32"
    assert row["sum"] == pytest.approx(expect.sum().item(), rel=1e-12)
    assert row["abs_sum"] == pytest.approx(expect.abs().sum().item(), rel=1e-12)
    assert res["time_ms"] > 0

    rc, out, _ = call(capsys, "run", path, "--seed", "3", "--device", "cpu")
    assert rc == 0 and "mul: float32[8, 16]  sum " in out and "abs-sum" in out and "time:" in out
    assert f"{row['sum']:.9g}" in out
    _, other, _ = call(capsys, "run", path, "--seed", "4", "--device", "cpu")
    assert other.splitlines()[1] != out.splitlines()[1]


def test_run_refuses_an_invalid_program_in_one_line(tmp_path, capsys):
    p = Program("wip")
    x = p.add_input("x", (3,))
    n = p.add_node("add", [x.id, None], strict=False)
    p.mark_output(n.outputs[0])
    save_program(p, tmp_path / "wip.json")
    rc, out, err = call(capsys, "run", str(tmp_path / "wip.json"))
    assert rc == 1 and not out
    assert "input b is not connected" in one_line_error(err, "run")


# --- errors ----------------------------------------------------------------------------------
def test_errors_exit_1_with_one_line_and_traceback_only_with_debug(tmp_path, capsys):
    rc, out, err = call(capsys, "show", str(tmp_path / "missing.json"))
    assert rc == 1 and not out
    assert one_line_error(err, "show") == f"stitchcuda show: error: {tmp_path / 'missing.json'}: no such file"

    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "stitchcuda-program", "schema_version": 1, "nodes": [')
    rc, _, err = call(capsys, "run", str(bad))
    assert rc == 1 and "not valid JSON (the file is truncated)" in one_line_error(err, "run")

    rc, _, err = call(capsys, "--debug", "show", str(bad))
    assert rc == 1 and "Traceback (most recent call last)" in err and "FileFormatError" in err

    rc, _, err = call(capsys, "show", "no_such_thing")
    assert rc == 1 and "neither a .json program, a .py file nor module:Class" in one_line_error(err, "show")


def test_console_command_in_a_subprocess(tmp_path):
    """The real entry point: exit status 1, nothing on stdout, exactly one line on stderr."""
    (tmp_path / "future.json").write_text(json.dumps({"format": "stitchcuda-program", "schema_version": 99}))
    bad = subprocess.run([sys.executable, "-m", "agent_core.cli", "show", str(tmp_path / "future.json")],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert bad.returncode == 1 and not bad.stdout
    assert bad.stderr.count("\n") == 1 and "written by a newer StitchCUDA" in bad.stderr


# --- studio --------------------------------------------------------------------------------------
def test_studio_without_the_editor_prints_a_summary(tmp_path, capsys, monkeypatch):
    from agent_core.commands import studio
    real = studio.importlib.import_module

    def no_app(name, *a):
        if name == "app.main":
            raise ModuleNotFoundError("No module named 'app.main'", name="app.main")
        return real(name, *a)
    monkeypatch.setattr(studio.importlib, "import_module", no_app)
    _, path = mlp(tmp_path)
    rc, out, err = call(capsys, "studio", path, "--screenshot", str(tmp_path / "shot.png"))
    assert rc == 0 and "program tiny_mlp: 4 nodes" in out
    assert "the editor is not available: the editor is not installed (no app.main)" in err
    assert "no screenshot written" in err


def test_studio_without_a_display_prints_a_summary_instead_of_aborting(tmp_path, capsys, monkeypatch):
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setitem(sys.modules, "app.main", types.SimpleNamespace(run_studio=lambda *a, **k: pytest.fail()))
    _, path = mlp(tmp_path)
    rc, out, err = call(capsys, "studio", path)
    assert rc == 0 and "program tiny_mlp: 4 nodes" in out and "there is no display" in err


def test_studio_opens_the_editor_with_file_screenshot_and_theme(tmp_path, capsys, monkeypatch):
    seen = {}

    def run_studio(path, screenshot=None, theme="dark"):
        seen.update(path=path, screenshot=screenshot, theme=theme)
        return 0
    monkeypatch.setitem(sys.modules, "app.main", types.SimpleNamespace(run_studio=run_studio))
    rc, _, _ = call(capsys, "studio", "prog.json", "--screenshot", "out.png", "--theme", "light")
    assert rc == 0 and seen == {"path": "prog.json", "screenshot": "out.png", "theme": "light"}


# --- import (needs agent_core.importers) ---------------------------------------------------------
def _importer():
    mod = pytest.importorskip("agent_core.importers")
    if not hasattr(mod, "import_file"):
        pytest.skip("agent_core.importers.import_file is not there yet")
    return mod


@pytest.mark.parametrize("example", ["softmax_rows.py", "linear_layer.py"])
def test_import_show_run_an_example(tmp_path, capsys, example):
    _importer()
    src = os.path.join(EXAMPLES, example)
    out_path = str(tmp_path / "prog.json")
    rc, out, err = call(capsys, "import", src, "-o", out_path)
    assert rc == 0, err
    assert f"-> {out_path}: 1 node, 1 input" in out
    p = load_program(out_path)
    assert p.nodes and not [d for d in p.validate() if d.severity == "error"]

    rc, out, _ = call(capsys, "show", out_path)
    assert rc == 0 and "by category:" in out and "valid" in out.splitlines()[-1]

    # running the .py directly and running the imported file agree (same seed, same program)
    rc, from_file, err = call(capsys, "run", out_path, "--seed", "1", "--device", "cpu", "--json")
    assert rc == 0, err
    rc, from_py, err = call(capsys, "run", src, "--seed", "1", "--device", "cpu", "--json")
    assert rc == 0, err
    a, b = json.loads(from_file)["outputs"], json.loads(from_py)["outputs"]
    assert [(r["name"], r["shape"], r["sum"]) for r in a] == [(r["name"], r["shape"], r["sum"]) for r in b]


def test_import_default_output_name_and_warnings_on_stderr(tmp_path, capsys, monkeypatch):
    _importer()
    monkeypatch.chdir(tmp_path)
    rc, out, err = call(capsys, "import", os.path.join(EXAMPLES, "softmax_rows.py"))
    assert rc == 0, err
    assert (tmp_path / "softmax_rows.json").is_file()
    p = load_program(tmp_path / "softmax_rows.json")
    assert program_to_json(load_program(tmp_path / "softmax_rows.json")) == program_to_json(p)
    assert all(line.startswith("warning: ") for line in err.splitlines())


def test_import_failure_is_one_line(tmp_path, capsys):
    _importer()
    bad = tmp_path / "broken.py"
    bad.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    rc, out, err = call(capsys, "import", str(bad), "-o", str(tmp_path / "x.json"))
    assert rc == 1 and not (tmp_path / "x.json").exists()
    one_line_error(err, "import")


@pytest.mark.gpu
def test_run_on_the_gpu_matches_the_cpu(tmp_path, capsys):
    assert torch.cuda.is_available()
    _, path = mlp(tmp_path)
    _, cpu, _ = call(capsys, "run", path, "--device", "cpu", "--json")
    rc, gpu, err = call(capsys, "run", path, "--json")
    assert rc == 0, err
    g, c = json.loads(gpu), json.loads(cpu)
    assert g["device"] == "cuda"
    assert g["outputs"][0]["sum"] == pytest.approx(c["outputs"][0]["sum"], rel=1e-4)


def test_show_lists_regions(tmp_path, capsys):
    from agent_core.regions import Region
    p, path = mlp(tmp_path)
    add, gelu = list(p.nodes)[:2]
    p.regions.append(Region("r1", "pointwise", [add, gelu], status="locked", reason="chain"))
    save_program(p, path)
    rc, out, _ = call(capsys, "show", path)
    assert rc == 0 and "4 nodes, 1 region" in out and "  r1 pointwise (locked): add, gelu" in out
    rc, out, _ = call(capsys, "show", path, "--json")
    assert json.loads(out)["regions"] == [{"id": "r1", "kind": "pointwise", "status": "locked",
                                           "nodes": ["add", "gelu"], "reason": "chain"}]


def test_ctrl_c_stops_a_run_started_with_sigint_ignored(tmp_path):
    """An asynchronous job of a non-interactive shell (`cmd &` in a script, `timeout -s INT cmd &`)
    starts with SIGINT ignored; the CLI takes it back, so Ctrl+C still ends the run as interrupted,
    with exit code 130 and no output folder."""
    import signal
    from tests.programs import SIXTEEN_SOFTMAXES, interrupt_at
    spec, out = tmp_path / "many.py", tmp_path / "out"
    spec.write_text(SIXTEEN_SOFTMAXES)
    proc = subprocess.Popen([sys.executable, "-m", "agent_core.cli", "optimize", str(spec), "-o", str(out), "--cpu",
                             "--no-baselines"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "STITCHCUDA_CACHE": str(tmp_path / "cache")},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    seen, rest = interrupt_at(proc, "r1: generated")      # planned, generating the first of 16 regions
    assert proc.returncode == 130 and "stitchcuda: interrupted" in rest, seen + rest
    assert not out.exists()
