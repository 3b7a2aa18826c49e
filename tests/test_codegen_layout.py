"""Layout kernels (chains of layout ops through codegen/views.py): the generated index arithmetic
(gather, 32x32 tiles, conditional reads of pads and rolls) moves every element where numpy / torch puts
it, and the kernels compile to sm_90 with prologue and epilogue. Strided slices: the kernel's source(o)
reads the element torch's slicing keeps; they compile alone and with a prologue and epilogue."""
import math
import re

import numpy as np
import pytest

from agent_core.codegen import CodegenError, generate_kernel
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


def _permuted(shape, perm):
    p = Program("perm")
    x = p.add_input("x", shape)
    t = p.add_node("permute", [x.id], {"dims": perm})
    p.mark_output(t.outputs[0])
    return generate_kernel(p, [t.id], name="perm")


def test_neighbour_dims_merge_into_one_view():
    """dims 0 and 1 stay neighbours: a [6, 5, 4] view; a permutation that only moves a size-1 dim
    is a contiguous copy, source(o) = o."""
    ks = _permuted((2, 3, 4, 5), [0, 1, 3, 2])
    assert "As one view: shape [6, 5, 4], strides [20, 1, 5], offset 0" in ks.source and ks.params["tiled"]
    ks = _permuted((4, 1, 5), [0, 2, 1])
    assert "return o; }" in ks.source and not ks.params["tiled"]


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
    assert ks.kind == "strided_slice" and ks.params["chain"] == ["slice"]
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
    assert f"step={step})" in ks.source      # the header's layout chain
    if around:
        assert "point(" in ks.source and "store_point(" in ks.source and len(ks.inputs) == 3  # x, b0, b
    compile_kernel(ks, arch="sm_90")


# --- chains of layout ops -------------------------------------------------------------------------
def _read_values(ks, x):
    """What each output element of a gather kernel reads from input x (the prologue left out):
    the kernel's own source(o) or source_value(o, ...) expression, evaluated with C's semantics."""
    from tests.test_views import eval_c, parse_c
    src, env = ks.source, _consts(ks.source)
    flat = x.reshape(-1).tolist()
    m = re.search(r"index_t source\(index_t o\) { return (.*?); }", src)
    if m:
        e = parse_c(m.group(1))
        return [flat[eval_c(e, {**env, "o": o})] for o in range(env["kNumel"])]
    m = re.search(r"float source_value\(index_t o, const float\* __restrict__ (\w+)\) { return (.*?); }", src)
    e = parse_c(m.group(2).replace("point(", "("))
    return [eval_c(e, {**env, "o": o, m.group(1): flat}) for o in range(env["kNumel"])]


def _chain(shape, steps, epilogue=True):
    """x -> each (op, attrs) of steps -> (add b, relu if epilogue): the program and region ids."""
    p = Program("chain")
    v = p.add_input("x", shape).id
    ids = []
    for op, attrs in steps:
        n = p.add_node(op, [v], attrs)
        ids.append(n.id)
        v = n.outputs[0]
    if epilogue:
        b = p.add_input("b", p.values[v].shape[-1:])
        a = p.add_node("add", [v, b.id])
        r = p.add_node("relu", [a.outputs[0]])
        ids += [a.id, r.id]
        v = r.outputs[0]
    p.mark_output(v)
    return p, ids


CHAINS = [
    ((4, 9, 6), [("slice", {"dim": 1, "start": 0, "end": None, "step": 2}),
                 ("transpose", {"dim0": 1, "dim1": 2})], "strided_slice"),
    ((8, 40, 36), [("permute", {"dims": [0, 2, 1]}), ("slice", {"dim": 1, "start": 3, "end": -1, "step": 1})],
     "layout"),
    ((6, 70, 33), [("permute", {"dims": [2, 0, 1]}), ("slice", {"dim": 2, "start": 1, "end": None, "step": 3})],
     "strided_slice"),
    ((5, 7, 3), [("transpose", {"dim0": 0, "dim1": 2}), ("flip", {"dims": [1]}), ("reshape", {"shape": [3, -1]})],
     "layout"),
    ((3, 4, 5), [("permute", {"dims": [1, 2, 0]}),
                 ("pad", {"pad": [1, 2, 0, 1], "mode": "constant", "value": -0.5})], "layout"),
    ((3, 5, 4), [("transpose", {"dim0": 1, "dim1": 2}), ("roll", {"shifts": [2], "dims": [2]}),
                 ("select", {"dim": 0, "index": -1})], "layout"),
    ((6, 8), [("slice", {"dim": 1, "start": 1, "end": None, "step": 2}), ("unsqueeze", {"dim": 0}),
              ("permute", {"dims": [2, 1, 0]})], "strided_slice"),
]


def _torch_chain(x, steps):
    from agent_core.ops.registry import get_op
    for op, attrs in steps:
        d = get_op(op)
        x = d.reference([x], d.normalize_attrs(attrs))
    return x


@pytest.mark.parametrize("shape,steps,kind", CHAINS, ids=[f"{k}-{'-'.join(s[0] for s in c[1])}" for k, c in enumerate(CHAINS)])
def test_chain_reads_what_torch_reads(shape, steps, kind):
    """A chain of layout ops is one kernel; each output element reads the element torch's ops put
    there (pads their fill value), through the generated expression or the tiled transpose."""
    import torch
    p, ids = _chain(shape, steps, epilogue=False)
    ks = generate_kernel(p, ids, name="chain")
    assert ks.kind == kind and ks.params["chain"] == [op for op, _ in steps]
    x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    want = _torch_chain(x, steps).reshape(-1).tolist()
    if ks.params["tiled"]:
        got = x.reshape(-1)[torch.tensor(_mapping(ks))].tolist()
    else:
        got = _read_values(ks, x)
    assert got == want
    p, ids = _chain(shape, steps)
    ks = generate_kernel(p, ids, name="chain_epi")
    assert ks.kind == kind and "store_point(" in ks.source
    compile_kernel(ks, arch="sm_90")


def test_a_tiled_chain_keeps_the_slice_offset_in_its_batches():
    """permute then a contiguous slice: the innermost output dim is strided, so tiles; the slice's
    start is part of batch_in."""
    p, ids = _chain((8, 40, 36), CHAINS[1][1], epilogue=False)
    ks = generate_kernel(p, ids, name="tiled_chain")
    assert ks.params["tiled"] and "tile[kTile][kTile + 1]" in ks.source
    assert re.search(r"batch_in\(index_t q\) { return q \* 1440 \+ 3; }", ks.source), ks.source


def test_a_fork_of_layout_ops_is_a_graph_whose_outputs_share_one_size():
    """Layout ops off one path become a layout graph (tests/test_codegen_views_gen.py): one kernel
    when every output has the same size, refused naming the output otherwise."""
    p = Program("fork")
    x = p.add_input("x", (4, 6))
    t = p.add_node("transpose", [x.id], {"dim0": 0, "dim1": 1})
    f = p.add_node("flip", [t.outputs[0]], {"dims": [0]})
    s = p.add_node("slice", [t.outputs[0]], {"dim": 0, "start": 0, "end": None, "step": 2})
    p.mark_output(f.outputs[0])
    p.mark_output(s.outputs[0])
    with pytest.raises(CodegenError, match=r"output 'slice' float32\[3, 4\] is not the size of 'flip'.*split the region"):
        generate_kernel(p, [t.id, f.id, s.id], name="fork")
    r = p.add_node("roll", [t.outputs[0]], {"shifts": [1], "dims": [1]})
    p.mark_output(s.outputs[0], False)
    p.mark_output(r.outputs[0])
    ks = generate_kernel(p, [t.id, f.id, r.id], name="fork")
    assert ks.params["graph"] and ks.params["chain"] == ["transpose", "flip", "roll"]
    q = Program("sum")
    y = q.add_input("y", (4, 6))
    u = q.add_node("transpose", [y.id], {"dim0": 0, "dim1": 1})
    r = q.add_node("sum", [u.outputs[0]], {"dim": [1]})
    q.mark_output(r.outputs[0])
    with pytest.raises(CodegenError, match=r"sum \(sum\)|one chain of layout ops"):
        generate_kernel(q, [u.id, r.id], name="mixed", kind="layout")


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulator needs g++")
@pytest.mark.parametrize("params", [{}, {"in_turn": True}, {"in_turn": True, "unroll": 2},
                                    {"in_turn": True, "vector": False, "pack": False}])
def test_outputs_written_in_turn_match_outputs_written_side_by_side(params):
    """GPT-NeoX's partial rotary embedding of q and k (two outputs): with `in_turn` (a tuning variant) the
    first half of the grid writes q's rotation and the second k's, each thread one output's run, not
    both; emulated on the CPU, every form equals torch."""
    import torch

    from tests import planned
    from tests.test_codegen_column_tiles import _emulate_region
    from agent_core.agent.tune import tune_space
    from agent_core.reference import run_reference
    _, p = planned.plan(planned.block("rope_partial_gptneox_pythia"))
    [r] = [r for r in p.regions if r.schedule.get("runs") == "kernel"]
    ks = generate_kernel(p, r.nodes, name="rope", params=params or None)
    assert ks.params["in_turn"] == bool(params.get("in_turn")) and ks.params["outputs"] == 2
    if not params:
        assert {"in_turn": True} in [{k: v for k, v in o.items() if k != "sm_count"} for o in tune_space(ks)]
    g = torch.Generator().manual_seed(3)
    ins = [torch.randn(p.values[v].shape, generator=g) for v in p.inputs]
    env = run_reference(p, ins, keep=True)
    _, outs = _emulate_region(p, r, env, params=params or None)
    for v, got in outs.items():
        torch.testing.assert_close(got, env[v], rtol=0, atol=1e-6)
