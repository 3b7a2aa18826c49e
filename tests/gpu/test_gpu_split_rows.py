"""On the GPU: the split row schedule (codegen/rowsplit.py) at real sizes against torch, atol = rtol =
1e-5, and two launches give the same bits (the last block resets the workspace; the combines run in
a fixed order). Whisper's 64 clips of 240,000, 8 rows of a million, ragged lengths (scalar loads, a
short last chunk), whole chunks of -inf in a softmax, a whole-tensor sum beside the rows, a chain of
two reductions (three phases), and the tuner's split factors; each held (the chunk in registers, one
phase, every block of a row waiting for the others) and streamed in phases.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_split_rows.py
"""
import pytest
import torch

from agent_core.agent.tune import tune_space
from agent_core.codegen import generate_kernel
from agent_core.reference import run_reference
from tests.programs import row_stats
from tests.test_codegen_split_rows import FORMS, centred_variance, kl_total, log_mel, masked_front, row_op

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

H200 = {"sm_count": 132}
CASES = {
    "log_mel 64 x 240000": (lambda: log_mel((64, 80, 3000)), torch.exp),
    "softmax 8 x 1e6": (lambda: row_op("softmax", (8, 1_000_000)), None),
    "layer_norm 8 x 1e6": (lambda: row_op("layer_norm", (8, 1_000_000)), None),
    "mean max min 8 x 1e6": (lambda: row_stats((8, 1_000_000)), None),
    "log_softmax ragged 7 x 1000003": (lambda: row_op("log_softmax", (7, 1_000_003)), None),
    "chained reductions ragged 5 x 999999": (lambda: centred_variance((5, 999_999)), None),
    "softmax -inf chunks 64 x 128256": (lambda: row_op("softmax", (64, 128_256)), masked_front),
    "softmax 256 x 65536 (dino)": (lambda: row_op("softmax", (256, 65_536)), None),
    "total beside rows 16 x 100003": (lambda: kl_total((16, 100_003)), None),
}


def check(program, ids, prep, params, launches=3):
    from agent_core.runtime.launch import load_kernel
    ks = generate_kernel(program, ids, name="split_row", params=params)
    assert ks.params["schedule"] == "split_row", ks.schedule
    g = torch.Generator().manual_seed(0)
    ins = {v: torch.randn(program.values[v].shape, generator=g) for v in ks.inputs}
    if prep is not None:
        ins = {v: prep(t) for v, t in ins.items()}
    want = run_reference(program, [ins[v] for v in program.inputs], keep=True)
    k = load_kernel(ks, program)
    dev = [ins[v].cuda() for v in ks.inputs]
    runs = [[t.cpu() for t in k(dev)] for _ in range(launches)]
    for v, got in zip(ks.outputs, runs[0]):
        torch.testing.assert_close(got, want[v].reshape(got.shape), atol=1e-5, rtol=1e-5, equal_nan=True,
                                   msg=lambda m: f"{program.values[v].name} ({ks.schedule}): {m}")
    for again in runs[1:]:
        for a, b in zip(runs[0], again):
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), f"two launches differ ({ks.schedule})"
    return ks


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", CASES)
def test_gpu_split_rows_match_torch_and_repeat_exactly(case, form):
    build, prep = CASES[case]
    program, ids = build()
    check(program, ids, prep, {**H200, **FORMS[form]})


def test_gpu_split_factors_the_tuner_tries():
    program, ids = log_mel((64, 80, 3000))
    ks = generate_kernel(program, ids, name="split_row", params=H200)
    for cand in tune_space(ks, sm_count=132):
        if cand.get("split", 2) > 1:
            check(program, ids, torch.exp, cand, launches=2)


@pytest.mark.parametrize("split", [2, 3, 100])
def test_gpu_split_counts_the_rule_would_not_pick(split):
    """Odd chunk counts on a ragged row: the last chunk short, every chunk boundary inside a float4 run
    avoided (scalar loads); 100 chunks held, 2 and 3 streamed."""
    program, ids = row_op("softmax", (3, 300_007))
    check(program, ids, None, {**H200, "split": split}, launches=2)
