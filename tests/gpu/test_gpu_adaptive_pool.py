"""On the GPU: adaptive_{avg,max}_pool{1,2,3}d kernels to output sizes that divide the input, that do not,
and that are larger than it, with a relu prologue and a tanh epilogue fused, match the reference on 5
random draws (atol = rtol = 1e-4); so do the bundled example's planned regions, global max pooling,
and a channel bias in the epilogue.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_adaptive_pool.py"""
from pathlib import Path

import pytest
import torch

from agent_core.ir import Program
from tests.programs import ADAPTIVE_CASES, fused, pooled

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# the CPU tests' cases, and more channels where the kernel's loops run longer
CASES = ADAPTIVE_CASES + [
    ("adaptive_avg_pool1d", (4, 16, 257), [10]),
    ("adaptive_max_pool1d", (4, 16, 257), [10]),
    ("adaptive_avg_pool2d", (4, 16, 30, 30), [4, 4]),
    ("adaptive_max_pool2d", (4, 16, 30, 30), [4, 4]),
    ("adaptive_max_pool2d", (2, 8, 7, 7), [1, 1]),
]


@pytest.mark.parametrize("op,shape,out", CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)])
def test_adaptive_pool(op, shape, out):
    p, ids = pooled(op, {"output_size": out}, shape)     # relu -> pool -> tanh
    fused(p, ids, op)


def test_adaptive_pool_with_a_channel_bias_epilogue():
    p = Program("bias")
    x = p.add_input("x", (2, 6, 11, 13))
    b = p.add_input("b", (6, 1, 1))
    s = p.add_node("sigmoid", [x.id])
    n = p.add_node("adaptive_avg_pool2d", [s.outputs[0]], {"output_size": [5, 4]})
    a = p.add_node("add", [n.outputs[0], b.id])
    p.mark_output(a.outputs[0])
    fused(p, [s.id, n.id, a.id], "bias")


def test_example_regions():
    from agent_core.importers import import_file
    from agent_core.planner import apply_plan, plan_program
    p = import_file(Path(__file__).resolve().parents[2] / "resources" / "examples" / "adaptive_pool_mixed.py")
    apply_plan(p, plan_program(p))
    regions = [r for r in p.regions if any(p.nodes[n].op.startswith("adaptive") for n in r.nodes)]
    assert len(regions) == 2
    for r in regions:
        fused(p, list(r.nodes), f"k_{r.id}", kind=r.kind)
