"""Our fused attention kernel on the CPU: every form and head dim compiles through NVRTC to sm_90 (each
mask kind at one head dim per form, in a Latin square, to keep the compiles within budget); the fp32
form runs in the CPU emulator and matches torch's SDPA at 1e-5 (masks, causal, a fully masked row,
GQA, a transposed-view query); the planner makes an SDPA one "attention" region that can_lower takes;
the CLI's optimize --cpu generates and compiles it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent_core.codegen import can_lower, generate_kernel
from agent_core.codegen.attention import attention_supported
from agent_core.codegen.attention_cases import Case, attention_program, reference, reference_inputs
from agent_core.compiler import compile_kernel
from agent_core.ir import Program

torch = pytest.importorskip("torch")
DIMS = (32, 64, 80, 128, 256)
MASKS = (None, "causal", "bool", "float", "gqa")
GUARD = 256


def _case(E: int, mask: str | None) -> Case:
    if mask == "gqa":
        return Case(1, 4, 37, 45, E, kv_heads=2, q_view=True)
    return Case(2, 2, 37, 45, E, mask=mask)


@pytest.mark.parametrize("form", ["3xtf32", "fp32"])
@pytest.mark.parametrize("i", range(len(DIMS)))
def test_compiles_for_sm90(form, i):
    E, mask = DIMS[i], MASKS[(i + (form == "fp32")) % len(MASKS)]
    prog, nodes = attention_program(_case(E, mask))
    ks = generate_kernel(prog, nodes, name=f"att_{form}_{E}", params={"form": form})
    assert ks.kind == "attention" and ks.params["form"] == form
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0, f"{form} E={E} spills"
    if form == "3xtf32":
        assert "mma.sync.aligned.m16n8k8" in ks.source and "cp.async" in ks.source


def test_tuner_variants_compile_without_spills_at_head_dim_128():
    """Every 3xtf32 variant the tuner times at head dim 128 builds for sm_90 with no spill: the launch
    bounds name the blocks per SM that shared memory allows, so the unrolled loops get the registers."""
    from agent_core.codegen.attention import tune_variants
    prog, nodes = attention_program(Case(1, 2, 300, 300, 128, mask="padding"))
    ks = generate_kernel(prog, nodes, name="att_tune", params={"form": "3xtf32"})
    assert ks.params["unroll"] == 0 and not ks.params["q_regs"] and ks.params["min_blocks"] == 2
    assert "__launch_bounds__(128, 2)" in ks.source
    variants = [v for v in tune_variants(ks.params) if v["form"] == "3xtf32"]
    assert {v["block_cols"] for v in variants} >= {16, 32, 64} and {v["warps"] for v in variants} == {2, 4, 8}
    for v in variants:
        c = compile_kernel(generate_kernel(prog, nodes, name="att_tune", params=v), arch="sm_90")
        assert c.spill_stores == 0, (v, c.spill_stores)


def test_q_fragments_live_in_registers_up_to_head_dim_64():
    for E, inside in ((64, True), (80, False)):
        prog, nodes = attention_program(Case(1, 2, 40, 40, E))
        ks = generate_kernel(prog, nodes, name="att_q", params={"form": "3xtf32"})
        assert ks.params["q_regs"] is inside and ("unsigned qh[kEp / 8][4]" in ks.source) is inside
    prog, nodes = attention_program(Case(1, 2, 40, 40, 128))
    from agent_core.codegen.kernel import CodegenError
    with pytest.raises(CodegenError, match="Q in registers"):
        generate_kernel(prog, nodes, name="att_q", params={"form": "3xtf32", "q_regs": True})


def _emulate(case: Case, params=None):
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import guarded, payload
    prog, nodes = attention_program(case)
    ks = generate_kernel(prog, nodes, name="att_emu", params=params or {"form": "fp32"})
    ins = reference_inputs(case, prog, ks.inputs)
    out = prog.values[ks.outputs[0]]
    bufs = [guarded(t.numpy(), GUARD) for t in ins] + [guarded(np.zeros(out.shape, np.float32), GUARD)]
    res = CpuExecutor().run(ks, [bufs], guard=GUARD)
    got = torch.from_numpy(payload(res[0][-1], GUARD, np.float32, tuple(out.shape)).copy())
    named = {prog.values[v].name: t for v, t in zip(ks.inputs, ins)}
    return got, reference(case, named)


@pytest.mark.parametrize("case", [Case(1, 2, 7, 45, 32, Ev=24), Case(2, 1, 37, 45, 32, mask="bool"),
                                  Case(1, 2, 37, 33, 16, mask="float"), Case(1, 2, 40, 33, 16, mask="causal"),
                                  Case(1, 4, 20, 21, 32, Ev=40, kv_heads=2, q_view=True, mask="padding"),
                                  Case(3, 8, 2, 2, 64), Case(2, 3, 3, 5, 16, mask="causal"),
                                  Case(2, 2, 1, 9, 32, mask="padding")],
                         ids=lambda c: c.label())
def test_fp32_form_matches_torch_in_the_emulator(case):
    from agent_core.codegen.attention import attention_spec, default_params
    from agent_core.codegen.region_io import region_io
    prog, nodes = attention_program(case)
    p = default_params(attention_spec(prog, region_io(prog, nodes)), "fp32")
    # tiles no wider than the queries and keys: 2 x 2 for attention over 2 tokens
    pow2 = lambda n: 1 << (n - 1).bit_length()
    assert p["block_rows"] == min(32, pow2(case.L)) and p["block_cols"] == min(32, pow2(case.S))
    got, ref = _emulate(case)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5), float((got - ref).abs().max())
    if case.mask == "bool":          # row 1 has every key masked: zeros, as torch gives
        assert float(got[..., 1, :].abs().max()) == 0.0
    if case.mask == "float":         # row 2 all -inf
        assert float(got[..., 2, :].abs().max()) == 0.0


RELU_CASES = [Case(1, 2, 37, 45, 32, mask="causal", score="relu"), Case(2, 1, 37, 45, 32, mask="bool", score="relu"),
              Case(1, 2, 33, 29, 16, mask="float", score="sigmoid"),
              Case(1, 4, 20, 21, 32, kv_heads=2, q_view=True, mask="padding", score="relu"),
              Case(2, 1, 37, 45, 32, mask="bool", score="sigmoid")]


@pytest.mark.parametrize("form", ["fp32", "3xtf32"])
@pytest.mark.parametrize("case", RELU_CASES + [Case(1, 2, 37, 45, 32, mask="causal")], ids=lambda c: c.label())
def test_each_form_matches_torch_in_the_emulator_relu_scores_too(case, form):
    """ReLU and sigmoid attention (score(scores) @ v, unnormalised; a masked score contributes nothing) in
    both forms, and the softmax in the tensor-core form: its body with plain-C++ tensor-core helpers
    (portable)."""
    got, ref = _emulate(case, {"form": form, "portable": True} if form == "3xtf32" else {"form": form})
    scale = max(1.0, float(ref.abs().max()))
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5 * scale), float((got - ref).abs().max())
    if case.score != "softmax" and case.mask == "bool":   # row 1 has every key masked: zeros
        assert float(got[..., 1, :].abs().max()) == 0.0


def test_relu_attention_compiles_for_sm90_and_says_its_scores():
    prog, nodes = attention_program(RELU_CASES[0])
    ks = generate_kernel(prog, nodes, name="att_relu", params={"form": "3xtf32"})
    assert "relu scores" in ks.schedule and "exp2f" not in ks.source
    assert compile_kernel(ks, arch="sm_90").spill_stores == 0


def test_predicate_reasons():
    prog, nodes = attention_program(Case(1, 2, 8, 8, 300))
    assert "head dim 300" in attention_supported(prog, nodes[-1])
    prog, nodes = attention_program(Case(1, 2, 8, 8, 64, mask="causal"))
    assert attention_supported(prog, nodes[-1]) is None
    assert can_lower(prog, nodes, "attention") is None


def test_planner_makes_one_attention_region():
    from agent_core.planner import plan_program
    p = Program("sdpa")
    q, k, v = (p.add_input(n, (2, 4, 100, 64)) for n in "qkv")
    m = p.add_input("m", (2, 1, 1, 100), dtype="bool")
    n = p.add_node("scaled_dot_product_attention", [q.id, k.id, v.id, m.id])
    y = p.add_node("relu", [n.outputs[0]])
    p.mark_output(y.outputs[0])
    regions = plan_program(p).regions
    att = [r for r in regions if n.id in r.nodes]
    assert len(att) == 1 and att[0].kind == "attention", [(r.kind, r.reason) for r in regions]
    assert att[0].schedule["runs"] == "kernel" and "fused attention kernel" in att[0].reason
    assert can_lower(p, att[0].nodes, att[0].kind) is None


SRC = '''
import torch, torch.nn as nn, torch.nn.functional as F
class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
def get_inputs(): return [torch.randn(1, 2, 50, 64), torch.randn(1, 2, 50, 64), torch.randn(1, 2, 50, 64)]
def get_init_inputs(): return []
'''


def test_cli_optimize_cpu_generates_and_compiles_it(tmp_path: Path):
    src = tmp_path / "att.py"
    src.write_text(SRC)
    prog = tmp_path / "att.json"
    run = lambda *a: subprocess.run([sys.executable, "-m", "agent_core.cli", *a], capture_output=True, text=True,
                                    timeout=300)
    r = run("import", str(src), "-o", str(prog))
    assert r.returncode == 0, r.stderr
    r = run("optimize", str(prog), "--cpu", "--no-tune", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr + r.stdout
    assert "fused attention, 3xTF32 mma.sync" in r.stdout and "compiled for sm_90" in r.stdout, r.stdout
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    assert any(e.get("type", e.get("event")) == "codegen" and e.get("kind") == "attention" for e in events)


def test_one_tf32_product_is_an_attention_form_only_where_the_program_allows_it():
    """params tf32: QK^T and PV as a_hi b_hi alone: within TF32's rounding of torch in the emulator and
    not within 1e-5 (the lo products really dropped); offered to the tuner only once TF32 is allowed."""
    case = Case(1, 2, 37, 45, 32, mask="causal")
    got, ref = _emulate(case, {"form": "3xtf32", "portable": True, "tf32": True})
    assert torch.allclose(got, ref, rtol=1e-2, atol=1e-2)
    assert not torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
    prog, nodes = attention_program(case)
    ks = generate_kernel(prog, nodes, name="att", params={"form": "3xtf32", "tf32": True})
    assert "mma_tf32(sacc[n], ah, bh);" in ks.source and "TF32 mma.sync" in ks.schedule
    assert "mma_3xtf32(" not in ks.source.split("__global__")[1]
    assert generate_kernel(prog, nodes, name="att").alternatives == []
    prog.metadata["allow_precision"] = ["tf32"]
    assert generate_kernel(prog, nodes, name="att").alternatives == [{"form": "3xtf32", "tf32": True}]
