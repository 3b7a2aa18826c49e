"""Permute / transpose kernels: the generated index arithmetic (gather and 32x32 tiles) moves every
element where numpy's transpose puts it, and the kernels compile to sm_90 with prologue and epilogue.
Strided slices: the kernel's source(o) reads the element torch's slicing keeps; they compile alone and
with a prologue and epilogue."""
import re

import numpy as np
import pytest

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.codegen.layout import simplify
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from tests.programs import SLICE_BOUNDS_CASES, SLICE_CASES, pooled, sliced


def _consts(src):
    env = {}
    for line in src.splitlines():
        if line.startswith("constexpr index_t"):
            for part in line[len("constexpr index_t"):].split(";")[0].split(","):
                k, v = part.split("=")
                env[k.strip()] = int(v)
    return env


def _fn(src, name):
    m = re.search(rf"index_t {name}\(index_t \w\) {{ return (.*?); }}", src)
    return m.group(1).replace("/", "//")


def _mapping(ks):
    """out flat index -> in flat index, by evaluating the kernel's own expressions."""
    src, env = ks.source, _consts(ks.source)
    n = env["kNumel"]
    got = np.full(n, -1)
    if not ks.params["tiled"]:
        expr = _fn(src, "source")
        for o in range(n):
            got[o] = eval(expr, {}, {**env, "o": o})  # noqa: S307 (our generated expression)
        return got
    bi, bo = _fn(src, "batch_in"), _fn(src, "batch_out")
    nb = n // (env["kA"] * env["kB"])
    for q in range(nb):
        ib0, ob0 = eval(bi, {}, {**env, "q": q}), eval(bo, {}, {**env, "q": q})  # noqa: S307
        for ib in range(env["kB"]):
            for ia in range(env["kA"]):
                got[ob0 + ia * env["kOutStrideA"] + ib] = ib0 + ib * env["kInStrideB"] + ia
    return got


CASES = [((2, 3, 4), [0, 2, 1]), ((5, 7), [1, 0]), ((2, 3, 4, 5), [3, 0, 1, 2]), ((2, 3, 4, 5), [1, 0, 2, 3]),
         ((4, 1, 6, 33), [0, 3, 2, 1]), ((3, 40, 70), [2, 1, 0]), ((2, 3, 4, 5), [0, 1, 2, 3])]


@pytest.mark.parametrize("shape,perm", CASES)
def test_index_arithmetic_matches_numpy(shape, perm):
    p = Program("perm")
    x = p.add_input("x", shape)
    t = p.add_node("permute", [x.id], {"dims": perm})
    p.mark_output(t.outputs[0])
    ks = generate_kernel(p, [t.id], name="perm")
    assert ks.kind == "layout"
    want = np.arange(int(np.prod(shape))).reshape(shape).transpose(perm).reshape(-1)
    assert list(_mapping(ks)) == list(want)


def test_simplify_merges_neighbours():
    assert simplify([2, 3, 4, 5], [0, 1, 3, 2]) == ([6, 4, 5], [0, 2, 1])
    assert simplify([4, 1, 5], [0, 2, 1]) == ([20], [0])


def test_transpose_with_prologue_and_epilogue_compiles():
    p = Program("t")
    x = p.add_input("x", (8, 33, 65))
    s = p.add_input("s", (65,))
    a = p.add_node("mul", [x.id, s.id])
    t = p.add_node("transpose", [a.outputs[0]], {"dim0": 1, "dim1": 2})
    b = p.add_input("b", (65, 1))
    e = p.add_node("add", [t.outputs[0], b.id])
    r = p.add_node("relu", [e.outputs[0]])
    p.mark_output(r.outputs[0])
    ks = generate_kernel(p, [a.id, t.id, e.id, r.id], name="t_epi")
    assert ks.params["tiled"] and ks.block == (32, 8, 1)
    assert "tile[kTile][kTile + 1]" in ks.source
    compile_kernel(ks, arch="sm_90")
    q = Program("g")
    y = q.add_input("y", (4, 5, 6))
    u = q.add_node("permute", [y.id], {"dims": [1, 0, 2]})
    q.mark_output(u.outputs[0])
    ks = generate_kernel(q, [u.id], name="gather")
    assert not ks.params["tiled"]
    compile_kernel(ks, arch="sm_90")


POOL_CASES = [
    ("max_pool2d", {"kernel_size": [3], "stride": [2], "padding": [1]}, (2, 3, 9, 10)),
    ("avg_pool2d", {"kernel_size": [3], "stride": [2], "padding": [1], "ceil_mode": True,
                    "count_include_pad": False}, (2, 3, 9, 10)),
    ("max_pool1d", {"kernel_size": [2]}, (2, 3, 9)),
    ("avg_pool3d", {"kernel_size": [2]}, (1, 2, 5, 6, 7)),
    ("max_pool3d", {"kernel_size": [3], "dilation": [2], "padding": [1]}, (1, 2, 9, 9, 9)),
    ("avg_pool2d", {"kernel_size": [2], "divisor_override": 3}, (2, 3, 8, 8)),
]


@pytest.mark.parametrize("op,attrs,shape", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pooling_with_prologue_and_epilogue_compiles(op, attrs, shape):
    p, ids = pooled(op, attrs, shape)
    ks = generate_kernel(p, ids, name=op)
    assert ks.kind == "pooling" and "point(" in ks.source and "store_point(pooled" in ks.source
    compile_kernel(ks, arch="sm_90")


# --- strided slices ------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dim,start,end,step", SLICE_CASES + SLICE_BOUNDS_CASES)
def test_strided_slice_index_arithmetic_matches_torch(shape, dim, start, end, step):
    """The kernel's own source(o) expression, evaluated for every output element, reads the element
    torch's slicing keeps (negative and out-of-range bounds too)."""
    import torch
    p, ids = sliced(shape, dim, start, end, step)
    ks = generate_kernel(p, ids, name="sl")
    assert ks.kind == "strided_slice" and ks.params["step"] == step
    env, expr = _consts(ks.source), _fn(ks.source, "source")
    got = np.array([eval(expr, {}, {**env, "o": o}) for o in range(env["kNumel"])])  # noqa: S307
    d = dim % len(shape)
    want = torch.arange(int(np.prod(shape))).reshape(shape)[(slice(None),) * d + (slice(start, end, step),)]
    assert got.tolist() == want.reshape(-1).tolist()


@pytest.mark.parametrize("shape,dim,start,end,step", SLICE_CASES)
@pytest.mark.parametrize("around", [False, True], ids=["alone", "pro_epi"])
def test_strided_slice_compiles(shape, dim, start, end, step, around):
    p, ids = sliced(shape, dim, start, end, step, around)
    ks = generate_kernel(p, ids, name="strided")
    assert ks.kind == "strided_slice" and "__restrict__" in ks.source and "// Fused ops:" in ks.source
    assert f"kStep = {step}" in ks.source
    if around:
        assert "point(" in ks.source and "store_point(" in ks.source and len(ks.inputs) == 3  # x, b0, b
    compile_kernel(ks, arch="sm_90")


def test_strided_slice_region_with_a_transpose_is_refused():
    p, ids = sliced((4, 9, 6), 1, 0, None, 2)
    t = p.add_node("transpose", [p.outputs[0]], {"dim0": 1, "dim1": 2})
    with pytest.raises(CodegenError, match="one slice with a step"):
        generate_kernel(p, ids + [t.id], name="mixed")
