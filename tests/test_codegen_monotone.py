"""codegen/monotone.py: a max or min over a monotone chain folds the chain's input, and the chain runs
once per row on the result (Whisper's log-mel: max of log(clamp(x)) / ln 10 computes no logf in its
reduction pass). Exact only if every op of the chain is monotone *as the GPU computes it*: CUDA's logf
and log2f are checked over every non-negative float32 from NVRTC's own PTX (tests/ptx_float.py), and
which chains are hoisted, with which state, is checked op by op."""
import shutil

import numpy as np
import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.ir import Program
from agent_core.reference import run_reference
from tests.ptx_float import Untranslatable, check_monotone, nvrtc_ptx, translate

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@needs_gxx
def test_cuda_logf_and_log2f_never_decrease_over_every_nonnegative_float(tmp_path):
    got = check_monotone(["logf", "log2f"], tmp_path)
    for fn, r in got.items():
        assert r["drops"] == 0 and r["nans"] == 0 and r["nan_to_nan"], (fn, r)
        assert r["worst_ulp"] < 2, (fn, r["worst_ulp"])       # the translation is the real function
        assert r["zero"] == r["negzero"] == -np.inf and r["inf"] == np.inf


def test_expf_is_not_reproducible_so_never_trusted():
    """expf ends in the SFU's ex2.approx, whose rounding is undocumented: not translatable."""
    with pytest.raises(Untranslatable):
        translate(nvrtc_ptx("expf"))


def chain_then_max(chain, shape=(6, 5000), reduce="max"):
    """max (or min) over the last dim of chain(x), beside a sum of x over the same rows (two
    reductions: the row graph's kernel)."""
    p = Program("chain")
    x = p.add_input("x", shape)
    h = x.id
    for op, attrs in chain:
        h = p.add_node(op, [h], attrs).outputs[0]
    m = p.add_node(reduce, [h], {"dim": [-1], "keepdim": False})
    s = p.add_node("sum", [x.id], {"dim": [-1], "keepdim": False})
    p.mark_output(m.outputs[0])
    p.mark_output(s.outputs[0])
    return p, [n for n in p.topo_order()]


CLAMP = ("clamp", {"min": 1e-10, "max": None})
HOISTS = {
    "log-mel": ([CLAMP, ("log", {}), ("div_scalar", {"value": 2.302585092994046})], "max", "max of 'x'",
                "clamp, log, div_scalar"),
    "negated": ([("neg", {}), ("add_scalar", {"value": 3.0})], "max", "min of 'x'", "neg, add_scalar"),
    "negative scale": ([("mul_scalar", {"value": -2.0})], "min", "max of 'x'", "mul_scalar"),
    "sqrt of abs": ([("abs", {}), ("sqrt", {}), ("relu", {})], "max", "max of 'abs'", "sqrt, relu"),
    # log of an unbounded value may see negatives (NaN): only what follows it is hoisted
    "log of anything": ([("log", {}), ("mul_scalar", {"value": 0.5})], "max", "max of 'log'", "mul_scalar"),
}


@pytest.mark.parametrize("case", HOISTS)
def test_a_monotone_chain_is_applied_once_per_row(case):
    chain, reduce, folds, ops = HOISTS[case]
    p, ids = chain_then_max(chain, reduce=reduce)
    ks = generate_kernel(p, ids, name="hoist")
    (hoisted,) = ks.params["hoisted"]
    assert f"folds {folds}, then {ops}" in hoisted, hoisted
    assert "Monotone chain:" in ks.source


NOT_HOISTED = {
    "exp": [("exp", {})],                   # the SFU's rounding: unproven
    "sigmoid": [("sigmoid", {})],
    "square": [("square", {})],             # not monotone
    "times zero": [("mul_scalar", {"value": 0.0})],
}


@pytest.mark.parametrize("case", NOT_HOISTED)
def test_a_chain_that_is_not_provably_monotone_is_folded_per_element(case):
    p, ids = chain_then_max(NOT_HOISTED[case])
    ks = generate_kernel(p, ids, name="kept")
    assert ks.params["hoisted"] == [] and "Monotone chain" not in ks.source


def test_the_tuner_parameter_turns_it_off():
    p, ids = chain_then_max(HOISTS["log-mel"][0])
    assert generate_kernel(p, ids, name="off", params={"hoist_monotone": False}).params["hoisted"] == []


@needs_gxx
def test_hoisted_and_per_element_kernels_agree_bit_for_bit_with_nans_and_zeros():
    """Under the CPU emulator, on inputs with NaNs, zeros, negatives, denormals and infinities, the
    hoisted kernel gives the same bits as the one that folds per element, and matches torch."""
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import guarded, payload
    p, ids = chain_then_max(HOISTS["log-mel"][0], shape=(8, 700))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 700, generator=g).exp()
    x[0, 5] = float("nan")
    x[1, :] = 0.0
    x[2, ::3] = -1.0
    x[3, 7] = 1e-42
    x[4, 9] = float("inf")
    x[5] = -x[5]
    ref = run_reference(p, [x], keep=True)
    got = {}
    for hoist in (True, False):
        ks = generate_kernel(p, ids, name="emu", params={"hoist_monotone": hoist})
        outs = [p.values[v] for v in ks.outputs]
        call = [guarded(x.numpy(), 16)] + [guarded(np.zeros(o.shape, np.float32), 16) for o in outs]
        (res,) = CpuExecutor().run(ks, [call], guard=16, timeout_s=120)
        got[hoist] = {v: torch.from_numpy(payload(res[1 + i], 16, np.float32, o.shape).copy())
                      for i, (v, o) in enumerate(zip(ks.outputs, outs))}
    for v, t in got[True].items():
        assert torch.equal(t.nan_to_num(), got[False][v].nan_to_num()), v
        assert torch.equal(t.isnan(), got[False][v].isnan()), v
        assert torch.allclose(t, ref[v], rtol=1e-5, atol=1e-5, equal_nan=True), v
