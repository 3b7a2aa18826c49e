"""On the GPU: strided-slice kernels (x[start:end:step] along one dim) match torch's slicing on 5 random
draws, alone and with a pointwise prologue and epilogue, for steps 2 and 3 along the last and a middle
dim, odd sizes, negative and out-of-range bounds.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_layout_slice.py"""
import pytest
import torch

from agent_core.ir import Program
from agent_core.runtime import build_region

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = [((3, 10, 7), 1, 1, 9, 3), ((4, 9), 1, 0, None, 2), ((5, 13), -1, 2, None, 3), ((7, 11, 5), 1, 0, 11, 2),
         ((2, 3, 17), 2, 1, 16, 2), ((9,), 0, 0, None, 2), ((15, 4), 0, 3, 14, 3), ((2, 5, 7, 3), 2, 1, None, 3),
         ((4, 240, 16), 1, 100, 200, 2), ((6, 10), 1, -7, -1, 2), ((6, 10), 1, 3, 99, 4),
         ((64, 1025), 1, 1, None, 2), ((3, 4097, 3), 1, 0, None, 3)]


def _program(shape, dim, start, end, step, around):
    p = Program("slice")
    v = p.add_input("x", shape).id
    ids = []
    if around:
        b0 = p.add_input("b0", shape[-1:])
        a = p.add_node("add", [v, b0.id])
        g = p.add_node("gelu", [a.outputs[0]])
        ids += [a.id, g.id]
        v = g.outputs[0]
    t = p.add_node("slice", [v], {"dim": dim, "start": start, "end": end, "step": step})
    ids.append(t.id)
    v = t.outputs[0]
    if around:
        b = p.add_input("b", p.values[v].shape[-1:])
        e = p.add_node("mul", [v, b.id])
        r = p.add_node("relu", [e.outputs[0]])
        ids += [e.id, r.id]
        v = r.outputs[0]
    p.mark_output(v)
    return p, ids


@pytest.mark.parametrize("around", [False, True], ids=["alone", "pro_epi"])
@pytest.mark.parametrize("shape,dim,start,end,step", CASES)
def test_strided_slice_matches_torch(shape, dim, start, end, step, around):
    p, ids = _program(shape, dim, start, end, step, around)
    r = build_region(p, ids, name=f"slice_step{step}")
    assert r.kernel.kind == "strided_slice"
    assert r.fused, r.fallback_reason
    assert r.verify.ok and r.verify.draws == 5, r.verify
