"""On the GPU: the lower precisions a program allows (runtime/low_precision.py). Each form's worst
error against float64 is printed beside fp32's; the agent keeps one only within the program's
tolerance, and the whole program then verifies within it and replays as one CUDA graph.

PYTHONPATH=. python3 -m pytest -m gpu -s tests/gpu/test_low_precision_gpu.py
"""
import io

import numpy as np
import pytest
import torch

from agent_core.agent import EventEmitter, optimize, read_events
from agent_core.ir import Program
from agent_core.reference import parameter_tensors, run_node
from agent_core.runtime import low_precision as lp

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _linear(m=1024, k=4096, n=4096):
    rng = np.random.default_rng(0)
    bound = 1 / k ** 0.5
    p = Program("wide_linear")
    x = p.add_input("x", [m, k])
    w = p.add_parameter("w", rng.uniform(-bound, bound, (n, k)).astype(np.float32))
    b = p.add_parameter("b", rng.uniform(-bound, bound, (n,)).astype(np.float32))
    h = p.add_node("linear", [x.id, w.id, b.id])
    r = p.add_node("relu", [h.outputs[0]])
    p.mark_output(r.outputs[0])
    p.metadata["memory_budget_bytes"] = 1 << 34
    return p, h


@pytest.mark.parametrize("form,bound", [("tf32", 2e-3), ("fp16", 2e-3), ("bf16", 2e-2)])
def test_each_form_is_within_its_precision_of_float64(form, bound):
    p, h = _linear()
    env = dict(parameter_tensors(p, "cuda"))
    env[p.inputs[0]] = torch.randn(1024, 4096, device="cuda")
    exact = h.opdef.reference([env[v].double() for v in h.inputs], h.attrs)
    fp32, low = dict(env), dict(env)
    run_node(p, h.id, fp32)
    lp.run_low_precision(p, h.id, low, form)
    scale = float(exact.abs().max())
    err = float((low[h.outputs[0]].double() - exact).abs().max()) / scale
    err32 = float((fp32[h.outputs[0]].double() - exact).abs().max()) / scale
    print(f"{form}: worst error {err:.2e} of the largest output (fp32's {err32:.2e})")
    assert low[h.outputs[0]].dtype == torch.float32 and err32 < err < bound
    assert not torch.backends.cuda.matmul.allow_tf32       # TF32 off again after the call


def test_the_agent_keeps_an_allowed_form_only_within_the_tolerance():
    for tol, allowed in ((None, False), (5e-2, True)):
        p, h = _linear()
        p.metadata["allow_precision"] = ["tf32", "bf16"]
        if tol:
            p.metadata["tolerance"] = {"atol": tol, "rtol": tol}
        buf = io.StringIO()
        res = optimize(p, emit=EventEmitter(buf), tune=False, baselines=False, draws=5, trials=10)
        prec = [e for e in read_events(buf.getvalue().splitlines()) if e["event"] == "precision"]
        assert len(prec) == 1 and "tf32_ms" in prec[0] and "bf16_ms" in prec[0], prec
        print(f"tolerance {tol or 1e-4}: " + ", ".join(f"{k} {v:.3f}" for k, v in prec[0].items() if k.endswith("_ms"))
              + f"; chosen {prec[0]['chosen']}")
        assert (prec[0]["chosen"] in lp.FORMS) == allowed, prec
        e2e = res.profile["end_to_end"]
        assert e2e["correct"] and e2e["cuda_graph"], e2e


def test_the_tile_gemms_one_product_form_verifies_within_a_loose_tolerance():
    from agent_core.profile.timing import time_gpu
    from agent_core.runtime import build_region
    p, h = _linear(m=2048, k=2048, n=2048)
    p.metadata.update(allow_precision=["tf32"], tolerance={"atol": 1e-2, "rtol": 1e-2})
    nodes = list(p.nodes)
    env = {**parameter_tensors(p, "cuda"), p.inputs[0]: torch.randn(2048, 2048, device="cuda")}
    ms = {}
    for key, extra in (("3xtf32", {}), ("tf32", {"tf32": True})):
        r = build_region(p, nodes, name=f"tile_{key}", params={"form": "gemm-3xtf32", **extra})
        assert r.fused and r.verify.ok, r.fallback_reason
        assert ("mma_3xtf32(" in r.kernel.source.split("__global__")[1]) is not bool(extra)
        ins = [env[v] for v in r.inputs]
        ms[key] = time_gpu(lambda: r(ins)).median_ms
    # timed for the record (performance is the bench's to judge, not a test's)
    print(f"tile GEMM 2048^3 + relu: 3xTF32 {ms['3xtf32']:.3f} ms, one TF32 product {ms['tf32']:.3f} ms")


@pytest.mark.parametrize("label", ["causal_d64", "padding_d128"])
def test_the_attention_kernels_one_product_form_is_within_tf32s_rounding(label):
    from agent_core.codegen import generate_kernel
    from agent_core.codegen.attention_cases import Case, attention_program, reference, reference_inputs
    from agent_core.runtime.launch import load_kernel
    case = {"causal_d64": Case(2, 4, 1024, 1024, 64, mask="causal"),
            "padding_d128": Case(1, 2, 1000, 333, 128, mask="padding")}[label]
    prog, nodes = attention_program(case)
    ks = generate_kernel(prog, nodes, name="att_tf32", params={"form": "3xtf32", "tf32": True})
    ins = reference_inputs(case, prog, ks.inputs, device="cuda")
    got = load_kernel(ks, prog)(ins)[0].cpu().double()
    named = {prog.values[v].name: t.cpu() for v, t in zip(ks.inputs, ins)}
    err = float((got - reference(case, named, dtype=torch.float64)).abs().max())
    print(f"attention {label}, one TF32 product: max abs err {err:.3g}")
    assert 1e-6 < err < 1e-2
