"""On the GPU: the row schedules as tuned (softmax keeping exp(x - max) in registers, float4 epilogue
operands and weights, the online schedule's vectors in flight) and every tuning variant of them
match the reference on 5 draws (atol = rtol = 1e-4), at shapes with ragged tails and broadcast masks.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu"""
import pytest
import torch

from agent_core.agent.tune import tune_space
from agent_core.codegen import generate_kernel
from agent_core.ir import Program
from tests.programs import fused, stitched, rms_written_out
from tools.bench_rows import build

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def every_variant(p, ids, name):
    ks = generate_kernel(p, ids, name=name)
    for params in [None, *tune_space(ks, limit=10)]:
        fused(p, ids, name, params=params)


@pytest.mark.parametrize("shape", [(2, 3, 64, 1024), (1, 4, 36, 2048), (2, 2, 12, 52), (3, 1, 7, 7)])
def test_masked_softmax_and_its_variants(shape):
    p, ids, _ = build("softmax", shape, "causal", device="cpu")
    every_variant(p, ids, f"masked_softmax_{shape[-1]}")


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("cols", [128, 1000, 4096, 16384, 16388, 40001, 40000])
def test_row_ops_and_their_variants(op, cols):
    p, ids = stitched(op, {"dim": -1} if "softmax" in op else {}, (5, cols), epilogue="gelu")
    every_variant(p, ids, f"{op}_{cols}")


def test_softmax_whose_epilogue_reads_its_input():
    """softmax(x) * x: the epilogue needs x itself, so the exps are not kept in its place."""
    p = Program("softmax_times_x")
    x = p.add_input("x", (64, 1024))
    s = p.add_node("softmax", [x.id], {"dim": -1})
    m = p.add_node("mul", [s.outputs[0], x.id])
    p.mark_output(m.outputs[0])
    every_variant(p, [s.id, m.id], "softmax_times_x")


@pytest.mark.parametrize("cols", [128, 4096, 60000])
def test_rms_norm_written_out_with_weight(cols):
    """x * rsqrt(mean(x^2) + eps) * weight: the epilogue reads x and the weight as float4."""
    p, ids = rms_written_out((33, cols))
    every_variant(p, ids, f"rms_written_out_{cols}")


def test_per_sample_max_broadcast_back_few_long_rows():
    """log_mel's shape: a max over each sample's [80, 3000], broadcast back (online, 64 rows)."""
    p = Program("log_mel")
    x = p.add_input("x", (64, 80, 3000))
    a = p.add_node("abs", [x.id])
    lg = p.add_node("log", [a.outputs[0]])
    pk = p.add_node("max", [lg.outputs[0]], {"dim": [1, 2], "keepdim": True})
    fl = p.add_node("sub_scalar", [pk.outputs[0]], {"value": 8.0})
    mx = p.add_node("maximum", [lg.outputs[0], fl.outputs[0]])
    p.mark_output(mx.outputs[0])
    every_variant(p, [a.id, lg.id, pk.id, fl.id, mx.id], "log_mel")
