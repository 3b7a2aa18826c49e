"""argmax / argmin and the p-norms inside the row kernel, cats of per-row values written by it, and
int64 layout kernels (issue #14: never more kernels than Inductor). Each kernel is generated, compiled
with NVRTC for sm_90, and run under the CPU emulator (agent_core.writer.emulate: every block and
thread, buffers fenced by canaries) against torch: ties, NaN, signed zeros, keepdim, argmax beside a
softmax in one kernel, norms p in {1, 2, inf, 3, ...}, an int64 cat. The GPU runs the same at real
sizes: tests/gpu/test_gpu_rowgraph_argmax_norm.py."""
import math
import shutil

import numpy as np
import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from agent_core.reference import run_reference

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulator needs g++")
GUARD = 64


def emulated(p, nodes, inputs, params=None):
    """(kernel, {output value: (kernel's array, torch's array)}) for the region `nodes` of `p`."""
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import CANARY, guarded, payload
    ks = generate_kernel(p, nodes, name="k", params=params)
    ck = compile_kernel(ks, arch="sm_90")
    assert ck.spill_stores == 0, ck.summary()
    env = run_reference(p, inputs, keep=True)
    bufs = [guarded(env[v].numpy(), GUARD) for v in ks.inputs]
    bufs += [guarded(np.full(p.values[v].shape, 7, env[v].numpy().dtype), GUARD) for v in ks.outputs]
    bufs += [guarded(np.zeros(n, np.float32 if dt == "float32" else np.int32), GUARD) for dt, n in ks.workspace]
    (res,) = CpuExecutor().run(ks, [bufs], guard=GUARD)
    assert all((b[:GUARD] == CANARY).all() and (b[-GUARD:] == CANARY).all() for b in res), "wrote outside a buffer"
    out = {}
    for j, v in enumerate(ks.outputs):
        want = env[v].numpy()
        out[p.values[v].name] = (payload(res[len(ks.inputs) + j], GUARD, want.dtype, want.shape).copy(), want)
    return ks, out


def assert_matches(out, atol=1e-5):
    for name, (got, want) in out.items():
        if got.dtype == np.float32:
            assert np.allclose(got, want, atol=atol, rtol=atol, equal_nan=True), (name, got, want)
        else:
            assert got.dtype == want.dtype and np.array_equal(got, want), (name, got, want)


def crafted(shape, seed=0):
    """Normal draws rounded to integers (many ties), with NaNs, signed zeros and infinities placed."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g).round()
    flat = t.view(-1, shape[-1])
    if flat.shape[0] >= 4:
        flat[0, 1] = flat[0, shape[-1] - 1] = float("nan")    # two NaNs: the first wins, argmax and argmin
        flat[1] = 0.0
        flat[1, 1::2] = -0.0                                   # -0.0 == 0.0: the first index wins
        flat[2] = -math.inf                                    # every element the worst
        flat[3, -1] = math.inf
    return t


def _arg_program(shape, dim, keepdim):
    p = Program("args")
    x = p.add_input("x", shape)
    ids = [p.add_node(op, [x.id], {"dim": dim, "keepdim": keepdim}).id for op in ("argmax", "argmin")]
    for n in ids:
        p.mark_output(p.nodes[n].outputs[0])
    return p, ids


@pytest.mark.parametrize("shape,dim,keepdim,schedule", [
    ((6, 9), -1, False, "warp"), ((5, 1000), 1, True, "warp"), ((4, 4100), -1, False, "block"),
    ((3, 40, 37), 1, True, "column"), ((9, 7), 0, False, "column"), ((6, 20), None, False, "warp"),
    ((4, 3, 5), None, True, "warp")])
def test_argmax_and_argmin_follow_torchs_ties_and_nans(shape, dim, keepdim, schedule):
    p, ids = _arg_program(shape, dim, keepdim)
    ks, out = emulated(p, ids, {"x": crafted(shape)})
    assert ks.kind == "row_reduction" and ks.params["schedule"] == schedule, ks.params
    assert ks.params["reductions"] == 2 and ks.params["rounds"] == 1       # one pass, one all-reduce
    assert_matches(out)


@pytest.mark.parametrize("shape,dim,keepdim", [((), None, False), ((1,), 0, True), ((5, 1, 3), 1, False),
                                                ((7, 1), -1, True), ((7, 1), None, False)])
def test_a_scalar_and_rows_of_one_element_are_rows_too(shape, dim, keepdim):
    """argmax / argmin of a scalar (one row of one element) and over a dim of size 1 (every index
    0, NaN or not): the same row kernel, equal to torch."""
    p, ids = _arg_program(shape, dim, keepdim)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    if x.numel() > 2:
        x.view(-1)[1] = float("nan")
    ks, out = emulated(p, ids, {"x": x})
    assert ks.kind == "row_reduction", ks.kind
    assert_matches(out)


def test_a_streamed_row_keeps_the_first_of_equal_values():
    """A row longer than the registers hold: each thread walks its share in order, partial candidates
    combine in a tree; the answer is still the first occurrence."""
    shape = (2, 40000)
    t = torch.zeros(shape)
    t[0, 39999] = t[0, 777] = t[0, 20001] = 3.0
    t[1, 5] = t[1, 31000] = -2.0
    p, ids = _arg_program(shape, -1, False)
    ks, out = emulated(p, ids, {"x": t})
    assert ks.params["schedule"] == "stream"
    assert out["argmax"][0].tolist() == [777, 0] and out["argmin"][0].tolist() == [0, 5]
    assert_matches(out)


def test_argmax_and_softmax_share_one_kernel():
    """max(softmax) with its index (a router's top-1) beside the softmax: one kernel, the argmax
    folded in the same round as the max."""
    p = Program("top1")
    x = p.add_input("x", (37, 64))
    sm = p.add_node("softmax", [x.id], {"dim": -1})
    mx = p.add_node("max", [sm.outputs[0]], {"dim": [-1], "keepdim": True})
    am = p.add_node("argmax", [sm.outputs[0]], {"dim": -1, "keepdim": True})
    for n in (sm, mx, am):
        p.mark_output(n.outputs[0])
    ks, out = emulated(p, [sm.id, mx.id, am.id], {"x": crafted((37, 64), 3)})
    assert ks.params["reductions"] == 3
    assert "Round3 { St_max s0; St_argmax s1; }" in ks.source.replace("struct ", "")
    assert_matches(out)


def _router(tokens, experts):
    """Mixtral's top-2 router after the gate (benchmarks/blocks/router_top2_mixtral.py)."""
    p = Program("router")
    x = p.add_input("x", (tokens, experts))
    neg = p.add_parameter("neg1", np.array(-1.0, np.float32), constant=True)
    sm = p.add_node("softmax", [x.id], {"dim": -1})
    m1 = p.add_node("max", [sm.outputs[0]], {"dim": [-1], "keepdim": True})
    a1 = p.add_node("argmax", [sm.outputs[0]], {"dim": -1, "keepdim": True})
    eq = p.add_node("eq", [sm.outputs[0], m1.outputs[0]])
    rest = p.add_node("where", [eq.outputs[0], neg.id, sm.outputs[0]])
    m2 = p.add_node("max", [rest.outputs[0]], {"dim": [-1], "keepdim": True})
    a2 = p.add_node("argmax", [rest.outputs[0]], {"dim": -1, "keepdim": True})
    w = p.add_node("cat", [m1.outputs[0], m2.outputs[0]], {"dim": -1})
    i = p.add_node("cat", [a1.outputs[0], a2.outputs[0]], {"dim": -1})
    p.mark_output(w.outputs[0])
    p.mark_output(i.outputs[0])
    return p, [sm.id, m1.id, a1.id, eq.id, rest.id, m2.id, a2.id, w.id, i.id]


def test_the_routers_top2_and_both_cats_are_one_kernel():
    """Two rounds of max + argmax after the softmax, and the two cats (float weights, int64 experts)
    stored by the row kernel, each piece at its place in the row."""
    p, nodes = _router(64, 8)
    ks, out = emulated(p, nodes, {"x": torch.randn(64, 8, generator=torch.Generator().manual_seed(5))})
    assert ks.kind == "row_reduction" and ks.params["reductions"] == 5
    assert "long long* __restrict__ cat_1" in ks.source and "cat_1[row * 2 + 1] = " in ks.source
    assert_matches(out)


def test_a_cat_of_per_element_values_after_a_reduction_is_still_refused():
    from agent_core.codegen import can_lower
    p = Program("bad")
    x = p.add_input("x", (4, 8))
    sm = p.add_node("softmax", [x.id], {"dim": -1})
    c = p.add_node("cat", [sm.outputs[0], sm.outputs[0]], {"dim": -1})
    p.mark_output(c.outputs[0])
    assert "layout op after" in (can_lower(p, [sm.id, c.id]) or "")
    mx = p.add_node("max", [x.id], {"dim": [-1], "keepdim": True})       # the row graph says the same
    p.mark_output(mx.outputs[0])
    assert "cat of per-row values along the reduced dims only" in (can_lower(p, [sm.id, mx.id, c.id]) or "")


@pytest.mark.parametrize("p_norm", [2.0, 1.0, math.inf, 3.0, -math.inf, 0.0, 0.5])
@pytest.mark.parametrize("shape,dims,keepdim", [((6, 48), [1], True), ((4, 10, 6), [1], False),
                                                ((3, 5000), [-1], False), ((2, 3, 8), [1, 2], True)])
def test_norms_match_torch(p_norm, shape, dims, keepdim):
    p = Program("norm")
    x = p.add_input("x", shape)
    n = p.add_node("norm", [x.id], {"dim": dims, "keepdim": keepdim, "p": p_norm})
    p.mark_output(n.outputs[0])
    t = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    t.view(-1)[0] = 0.0
    ks, out = emulated(p, [n.id], {"x": t})
    assert ks.kind == "row_reduction"
    assert_matches(out, atol=1e-4)


def test_f_normalize_written_out_is_one_row_kernel():
    """x / max(norm(x, keepdim), eps) (the minilm block after its pooling): one kernel."""
    p = Program("normalize")
    x = p.add_input("x", (4, 48))
    n = p.add_node("norm", [x.id], {"dim": [1], "keepdim": True, "p": 2.0})
    m = p.add_node("max_scalar", [n.outputs[0]], {"value": 1e-12})
    e = p.add_node("expand", [m.outputs[0]], {"size": [4, 48]})
    d = p.add_node("div", [x.id, e.outputs[0]])
    p.mark_output(d.outputs[0])
    ks, out = emulated(p, [n.id, m.id, e.id, d.id], {"x": torch.randn(4, 48)})
    assert "sqrtf(" in ks.source
    assert_matches(out)


@pytest.mark.parametrize("p_norm", [2.0, 1.0, math.inf])
def test_the_normalize_op_over_a_middle_dim(p_norm):
    p = Program("normalize_op")
    x = p.add_input("x", (4, 48, 3))
    n = p.add_node("normalize", [x.id], {"dim": 1, "p": p_norm, "eps": 1e-12})
    p.mark_output(n.outputs[0])
    ks, out = emulated(p, [n.id], {"x": torch.randn(4, 48, 3)})
    assert ks.params["schedule"] == "column"
    assert_matches(out)


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
@pytest.mark.parametrize("sa,sb,dim", [((64, 1), (64, 1), -1), ((8, 4), (8, 12), 1), ((3, 5, 2), (3, 5, 2), 0)])
def test_integer_cats_are_layout_kernels_in_their_own_type(dtype, sa, sb, dim):
    p = Program("icat")
    a = p.add_input("a", sa, dtype)
    b = p.add_input("b", sb, dtype)
    c = p.add_node("cat", [a.id, b.id], {"dim": dim})
    p.mark_output(c.outputs[0])
    g = torch.Generator().manual_seed(4)
    draw = (lambda s: torch.randint(-2 ** 40, 2 ** 40, s, generator=g)) if dtype == "int64" else \
        (lambda s: torch.randint(0, 2, s, generator=g).to(getattr(torch, dtype)))
    ks, out = emulated(p, [c.id], {"a": draw(sa), "b": draw(sb)})
    ctype = {"int64": "long long", "int32": "int", "bool": "bool"}[dtype]
    assert ks.kind == "layout" and f"{ctype}* __restrict__ cat" in ks.source
    assert_matches(out)


def test_an_int64_stack_permute_flip_and_strided_slice():
    p = Program("imoves")
    a = p.add_input("a", (6, 8), "int64")
    b = p.add_input("b", (6, 8), "int64")
    s = p.add_node("stack", [a.id, b.id], {"dim": 1})
    t = p.add_node("permute", [s.outputs[0]], {"dims": [2, 0, 1]})
    f = p.add_node("flip", [t.outputs[0]], {"dims": [0]})
    sl = p.add_node("slice", [f.outputs[0]], {"dim": 0, "start": 1, "end": 7, "step": 2})
    p.mark_output(sl.outputs[0])
    g = torch.Generator().manual_seed(6)
    ks, out = emulated(p, [s.id, t.id, f.id, sl.id], {"a": torch.randint(-2 ** 40, 2 ** 40, (6, 8), generator=g),
                                                      "b": torch.randint(0, 9, (6, 8), generator=g)})
    assert_matches(out)
