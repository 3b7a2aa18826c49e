"""Our fused attention kernel on the GPU: both precision forms, every mask kind, ragged lengths, head
dims 32..256, GQA and a transposed-view query, relu and sigmoid scores, against a float64 reference
(abs + rel <= 1e-4, the agent's tolerance). The worst errors are printed (-s) and written to
$ATTENTION_ERRORS when set."""
from __future__ import annotations

import json
import os

import pytest

from agent_core.codegen import generate_kernel
from agent_core.codegen.attention_cases import Case, attention_program, reference, reference_inputs

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

CASES = [Case(2, 3, 1, 7, 32), Case(1, 2, 7, 1, 64, mask="bool"), Case(2, 2, 127, 129, 64, mask="causal"),
         Case(1, 2, 129, 127, 80, mask="float"), Case(1, 2, 1000, 1000, 128, mask="causal"),
         Case(1, 2, 1000, 333, 128, mask="padding"), Case(2, 4, 129, 200, 256, mask="bool"),
         Case(1, 8, 127, 300, 128, kv_heads=2, q_view=True), Case(2, 4, 65, 77, 64, Ev=40, kv_heads=1, mask="float"),
         Case(1, 2, 300, 1000, 256, mask="causal"), Case(1, 1, 7, 1000, 16, Ev=256, mask="padding"),
         # ReLU attention (relu(scores) @ v, unnormalised): level 3's causal shape scaled down, and masks
         Case(2, 4, 1024, 1024, 64, mask="causal", score="relu"), Case(1, 2, 129, 200, 128, mask="bool", score="relu"),
         Case(1, 8, 127, 300, 64, kv_heads=2, q_view=True, mask="float", score="relu"),
         Case(2, 4, 513, 700, 128, mask="causal", score="sigmoid")]
ERRORS: list[dict] = []


def _run(case: Case, form: str):
    from agent_core.runtime.launch import load_kernel
    prog, nodes = attention_program(case)
    ks = generate_kernel(prog, nodes, name=f"att_{form}", params={"form": form})
    loaded = load_kernel(ks, prog)
    ins = reference_inputs(case, prog, ks.inputs, device="cuda")
    out = loaded(ins)[0]
    named = {prog.values[v].name: t for v, t in zip(ks.inputs, ins)}
    ref = reference(case, {k: t.cpu() for k, t in named.items()}, dtype=torch.float64)
    return out.cpu().double(), ref


@pytest.mark.parametrize("form", ["3xtf32", "fp32"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label())
def test_matches_float64(case, form):
    got, ref = _run(case, form)
    assert got.shape == ref.shape
    assert torch.isfinite(got).all(), "NaN or inf in the output"
    err = (got - ref).abs()
    worst = float(err.max())
    excess = float((err - 1e-4 * ref.abs()).max())
    ERRORS.append({"case": case.label(), "form": form, "max_abs_err": worst, "excess": excess})
    print(f"{case.label()} {form}: max abs err {worst:.3g}")
    if os.environ.get("ATTENTION_ERRORS"):
        with open(os.environ["ATTENTION_ERRORS"], "a") as f:
            f.write(json.dumps(ERRORS[-1]) + "\n")
    assert excess <= 1e-4, f"error {worst:.3g} beyond 1e-4 abs + rel"


def test_fully_masked_rows_are_zero():
    case = Case(1, 2, 33, 70, 64, mask="bool")
    for form in ("3xtf32", "fp32"):
        got, ref = _run(case, form)
        assert float(got[..., 1, :].abs().max()) == 0.0 and float(ref[..., 1, :].abs().max()) == 0.0
