"""The agent's own time on whole models (issue 17): kernels that differ only in names compile once,
compiles run ahead of the loop in parallel, and neither changes a region, a kernel or a verdict.

Counted work, not timed: compiles per distinct kernel (the cache's cubins, the compile events), the
kernels the loop writes against those generated directly from the plan."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent_core import canonical_source
from agent_core.agent.tune import tune_space
from agent_core.canonical_source import canonical_form
from agent_core.codegen import generate_kernel
from agent_core.compiler import CompileError, compile_kernel, compile_source, prefetch
from agent_core.ir import Program
from agent_core.project_file import load_program, save_program

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = 5


def mlp(blocks=BLOCKS, width=64, batch=32) -> Program:
    """blocks x (matmul -> bias add -> relu), equal shapes: a model's repeated block."""
    rng = np.random.default_rng(0)
    p = Program("repeated_mlp")
    h = p.add_input("x", (batch, width)).id
    for i in range(blocks):
        w = p.add_parameter(f"layer{i}.weight", rng.standard_normal((width, width)).astype(np.float32)).id
        b = p.add_parameter(f"layer{i}.bias", rng.standard_normal((width,)).astype(np.float32)).id
        mm = p.add_node("matmul", [h, w]).outputs[0]
        add = p.add_node("add", [mm, b]).outputs[0]
        h = p.add_node("relu", [add]).outputs[0]
    p.mark_output(h)
    return p


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kernels"


def _optimize(tmp_path, program, cache, *extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "prog.json"
    save_program(program, src)
    out = tmp_path / "out"
    env = dict(os.environ, STITCHCUDA_CACHE=str(cache.parent))
    proc = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize", str(src), "-o", str(out), "--cpu",
                           "--no-baselines", "--tune-trials", "3", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines() if ln.strip()]
    return out, events


def test_repeated_blocks_compile_once_and_keep_their_own_kernels(tmp_path, fresh_cache):
    out, events = _optimize(tmp_path, mlp(), fresh_cache)
    compiles = [e for e in events if e["event"] == "compile"]
    assert len(compiles) == BLOCKS                      # one per region, each reported
    assert sum(not e["cached"] for e in compiles) == 1  # ... compiled once, the others reuse it
    prog = load_program(out / "program.json")
    regions = [r for r in prog.regions if r.schedule["agent"]["status"] == "compiled"]
    assert len(regions) == BLOCKS
    # each region keeps the kernel generated for it from the plan: its own name, its own values' names
    for r in regions:
        ag = r.schedule["agent"]
        ks = generate_kernel(prog, r.nodes, name=ag["kernel"], kind=r.kind)
        assert (out / ag["source_path"]).read_text() == ks.source == r.source
        assert ag["kernel"] in ks.source
    assert len({(out / r.schedule["agent"]["source_path"]).read_text() for r in regions}) == BLOCKS
    # the default kernel and its tuning variants: one cubin per distinct source, however many blocks
    # share them (a variant that changes only the launch, the pointwise covering grid, reuses its source)
    variants = {int(re.search(r"(\d+) tuning variant", r.schedule["agent"]["reason"]).group(1)) for r in regions}
    assert len(variants) == 1
    r = regions[0]
    ks = generate_kernel(prog, r.nodes, name=r.schedule["agent"]["kernel"], kind=r.kind)
    sources = {canonical_form(k.source, k.name).text for k in
               [ks] + [generate_kernel(prog, r.nodes, name=ks.name, kind=r.kind, params=v)
                       for v in tune_space(ks)[:variants.pop()]]}
    assert len(list(fresh_cache.glob("*.cubin"))) == len(sources)


def test_more_blocks_add_no_compiles(tmp_path, fresh_cache):
    _optimize(tmp_path / "a", mlp(blocks=2), fresh_cache)
    before = set(fresh_cache.glob("*.cubin"))
    _, events = _optimize(tmp_path / "b", mlp(blocks=7), fresh_cache)
    assert set(fresh_cache.glob("*.cubin")) == before      # the on-disk cache is shared across programs
    assert all(e["cached"] for e in events if e["event"] == "compile")


def test_canonical_form_ignores_names_and_comments_only():
    p = mlp(blocks=2)
    regions = [[n.id for n in p.nodes.values()][i:i + 3] for i in (0, 3)]
    k0 = generate_kernel(p, regions[0][1:], name="model_r1")
    k1 = generate_kernel(p, regions[1][1:], name="model_r7")
    assert k0.source != k1.source
    c0, c1 = canonical_form(k0.source, k0.name), canonical_form(k1.source, k1.name)
    assert c0.text == c1.text and c0.symbol == c1.symbol
    assert "model_r1" not in c0.text and "//" not in c0.text
    other = mlp(blocks=2, width=128)
    k2 = generate_kernel(other, [n.id for n in other.nodes.values()][1:3], name="model_r1")
    assert canonical_form(k2.source, k2.name).text != c0.text      # a shape is not a name


def test_members_and_builtins_keep_their_names():
    src = ('extern "C" __global__ void kx(float* __restrict__ y) {\n  float x = threadIdx.x;\n'
           '  float s = x * warpSize;\n  y[threadIdx.x] = __expf(s) + rsqrtf(x);\n}\n')
    c = canonical_form(src, "kx")
    for kept in ("threadIdx.x", "warpSize", "__expf(", "rsqrtf("):
        assert kept in c.text
    assert "kx" not in c.text and c.symbol == "_c0"


def test_a_wrongly_renamed_builtin_compiles_as_written(fresh_cache, monkeypatch):
    """The declaration finder is a heuristic: when it renames a name the source does not declare,
    the canonical compile fails and the source is compiled as written (and loads by its own name)."""
    src = 'extern "C" __global__ void kx(float* __restrict__ y) {\n  y[threadIdx.x] = __expf(1.0f);\n}\n'
    real = canonical_source.canonical_form

    def misfire(source, entry):
        form = real(source, entry)
        return canonical_source.CanonicalSource(form.text.replace("__expf", "_c9"), form.symbol, form.renamed + 1)
    monkeypatch.setattr(canonical_source, "canonical_form", misfire)
    c = compile_source(src, "kx", arch="sm_90", canonical=True)
    assert c.entry == "kx" and not c.cached and c.registers is not None


def test_errors_quote_the_source_as_written(fresh_cache):
    bad = ('// a comment line\nextern "C" __global__ void bad_region(float* __restrict__ y) {\n'
           '  y[0] = undefined_thing + 1.0f;\n}\n')
    with pytest.raises(CompileError) as info:
        compile_source(bad, "bad_region", arch="sm_90", canonical=True)
    assert info.value.line == 3 and "bad_region" in str(info.value) and "undefined_thing" in str(info.value)


def test_prefetch_compiles_each_distinct_kernel_once(fresh_cache):
    p = mlp(blocks=4)
    ids = [n.id for n in p.nodes.values()]
    kernels = [generate_kernel(p, ids[i + 1:i + 3], name=f"m_r{i}") for i in range(0, 12, 3)]
    assert prefetch(kernels, arch="sm_90") == 1
    assert prefetch(kernels, arch="sm_90") == 0              # already running or cached
    results = [compile_kernel(k, arch="sm_90") for k in kernels]
    assert [r.cached for r in results] == [False, True, True, True]
    assert len({r.key for r in results}) == 1 and {r.name for r in results} == {k.name for k in kernels}
    assert len(list(fresh_cache.glob("*.cubin"))) == 1


def test_topological_order_follows_direct_edits():
    """The order is cached against the program's structure, which is read afresh on every call: an
    edit that bypasses the API (node.inputs assigned directly, as rewrites do) is seen."""
    p = Program("edits")
    x = p.add_input("x", (4, 4)).id
    a = p.add_node("relu", [x])
    b = p.add_node("tanh", [x])
    p.mark_output(a.outputs[0])
    p.mark_output(b.outputs[0])
    assert p.topo_order() == [a.id, b.id] and p.topo_order() == [a.id, b.id]
    a.inputs[0] = b.outputs[0]
    assert p.topo_order() == [b.id, a.id]
    assert p.consumers(b.outputs[0]) == [(a.id, 0)] and p.consumers(x) == [(b.id, 0)]
