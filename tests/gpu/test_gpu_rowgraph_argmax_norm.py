"""On the GPU, at real sizes: argmax / argmin beside a softmax in one row kernel, the MoE router's
top-2 with both cats (float weights, int64 experts) in one kernel, the p-norms and normalize, and
int64 / int32 / bool layout kernels, each verified on 5 random draws (atol = rtol = 1e-4; indices
and integers exactly), and the indices equal to torch's on crafted ties, NaNs and signed zeros.
(The CPU runs the same kernels under emulation at small sizes: tests/test_rowgraph_argmax_norm.py.)

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_rowgraph_argmax_norm.py"""
import math

import pytest
import torch

from agent_core.ir import Program
from tests.gpu.test_gpu_indexed import crafted
from tests.programs import fused
from tests.test_rowgraph_argmax_norm import _arg_program, _router

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("shape,dim,keepdim", [((8192, 8), -1, True), ((4096, 32000), -1, False),
                                               ((64, 1000, 40), 1, True), ((16, 300000), 1, False),
                                               ((512, 4096), None, False)])
def test_argmax_and_argmin_in_one_kernel_equal_torch(shape, dim, keepdim):
    p, ids = _arg_program(shape, dim, keepdim)
    r = fused(p, ids, "args")
    for seed in range(3):
        x = crafted(shape, seed).cuda()
        got = r([x])
        for op, g in zip(("argmax", "argmin"), got):
            want = (torch.argmax if op == "argmax" else torch.argmin)(x, dim=dim, keepdim=keepdim)
            assert torch.equal(g.reshape(want.shape), want), op


def test_argmax_beside_softmax_one_kernel():
    p = Program("top1")
    x = p.add_input("x", (8192, 4096))
    sm = p.add_node("softmax", [x.id], {"dim": -1})
    am = p.add_node("argmax", [sm.outputs[0]], {"dim": -1, "keepdim": True})
    for n in (sm, am):
        p.mark_output(n.outputs[0])
    r = fused(p, [sm.id, am.id], "top1")
    assert r.kernel.params["reductions"] == 2


def test_the_router_top2_of_mixtral_is_one_kernel():
    p, nodes = _router(8192, 8)
    r = fused(p, nodes, "router")
    assert r.kernel.params["reductions"] == 5


@pytest.mark.parametrize("p_norm", [2.0, 1.0, math.inf, 3.0])
@pytest.mark.parametrize("shape,dims,keepdim", [((256, 384), [1], True), ((64, 8192), [-1], False),
                                                ((32, 256, 384), [1], False)])
def test_norms(p_norm, shape, dims, keepdim):
    p = Program("norm")
    x = p.add_input("x", shape)
    n = p.add_node("norm", [x.id], {"dim": dims, "keepdim": keepdim, "p": p_norm})
    p.mark_output(n.outputs[0])
    fused(p, [n.id], "norm")


def test_normalize_written_out_is_one_kernel():
    p = Program("normalize")
    x = p.add_input("x", (256, 384))
    n = p.add_node("norm", [x.id], {"dim": [1], "keepdim": True, "p": 2.0})
    m = p.add_node("max_scalar", [n.outputs[0]], {"value": 1e-12})
    e = p.add_node("expand", [m.outputs[0]], {"size": [256, 384]})
    d = p.add_node("div", [x.id, e.outputs[0]])
    p.mark_output(d.outputs[0])
    fused(p, [n.id, m.id, e.id, d.id], "normalize")


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
@pytest.mark.parametrize("sa,sb,dim", [((8192, 1), (8192, 1), -1), ((1024, 64), (1024, 192), 1)])
def test_integer_cats(dtype, sa, sb, dim):
    p = Program("icat")
    a = p.add_input("a", sa, dtype, init={"kind": "randint", "low": -1000, "high": 1000} if dtype != "bool" else None)
    b = p.add_input("b", sb, dtype)
    c = p.add_node("cat", [a.id, b.id], {"dim": dim})
    p.mark_output(c.outputs[0])
    fused(p, [c.id], "icat")
