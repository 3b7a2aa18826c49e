"""On the GPU: every generated region kind, across shapes and odd sizes, matches the reference on
5 random draws (atol = rtol = 1e-4); a wrong kernel is never used; launches are zero copy.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu
(needs only torch, cupy, numpy, networkx and pytest)."""
import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.ir import Program
from agent_core.ops import REQUIRED, all_ops
from agent_core.reference import run_reference
from agent_core.runtime import build_region
from agent_core.runtime import region as region_mod
from agent_core.runtime.launch import load_kernel
from tests.programs import column_reduction, fused, pooled, residual, stitched

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]



def sample_attrs(op):
    """Values for an op's required attributes (and a clamp with both ends)."""
    if op.name == "clamp":
        return {"min": -0.5, "max": 0.5}
    return {a.name: 1.5 if a.name == "value" else 0.25 for a in op.attrs if a.default is REQUIRED}


# --- pointwise ---------------------------------------------------------------------------------
POINTWISE = [op for op in all_ops() if op.category == "pointwise"]


@pytest.mark.parametrize("op", POINTWISE, ids=lambda o: o.name)
def test_each_pointwise_op(op):
    p = Program(op.name)
    ins = [p.add_input(port, (3, 5, 7) if k == 0 else (5, 1)).id for k, port in enumerate(op.port_names)]
    n = p.add_node(op.name, ins, sample_attrs(op))
    p.mark_output(n.outputs[0])
    fused(p, [n.id], f"r_{op.name}")


@pytest.mark.parametrize("shape,bshape", [
    ((1,), (1,)), ((7,), ()), ((1023,), (1023,)), ((3, 4097), (4097,)), ((2, 3, 33, 33), (3, 1, 1)),
    ((64, 1, 7), (5, 1)), ((4, 256, 256), (256, 1)), ((1 << 20,), (1,)), ((8, 64), (64,)),
    ((2, 3, 32, 32), (3, 1, 1)), ((5, 6, 8), (5, 1, 8)),
])
def test_pointwise_chain_shapes(shape, bshape):
    p = Program("chain")
    x = p.add_input("x", shape)
    b = p.add_input("b", bshape)
    a = p.add_node("add", [x.id, b.id])
    g = p.add_node("gelu", [a.outputs[0]])
    m = p.add_node("mul_scalar", [g.outputs[0]], {"value": 0.5})
    c = p.add_node("hardtanh", [m.outputs[0]], {"min_val": -0.1, "max_val": 0.3})
    p.mark_output(c.outputs[0])
    fused(p, [a.id, g.id, m.id, c.id], "chain")


def test_multiple_and_bool_outputs_and_where():
    p = Program("multi")
    x = p.add_input("x", (5, 9))
    y = p.add_input("y", (9,))
    r = p.add_node("relu", [x.id])
    gt = p.add_node("gt", [r.outputs[0], y.id])
    w = p.add_node("where", [gt.outputs[0], r.outputs[0], y.id])
    p.mark_output(gt.outputs[0])
    p.mark_output(w.outputs[0])
    p.mark_output(r.outputs[0])
    run = fused(p, [r.id, gt.id, w.id], "multi")
    assert len(run.outputs) == 3


def test_outputs_written_in_place_and_misaligned_inputs():
    p = Program("inplace")
    x = p.add_input("x", (1001,))
    n = p.add_node("sigmoid", [x.id])
    p.mark_output(n.outputs[0])
    k = load_kernel(generate_kernel(p, [n.id], name="inplace"), p)
    base = torch.randn(1002, device="cuda")
    xin = base[1:]                       # 4 bytes past an aligned address: no float4 loads there
    out = torch.empty(1001, device="cuda")
    ptr = out.data_ptr()
    (res,) = k([xin], [out])
    torch.cuda.synchronize()
    assert res.data_ptr() == ptr
    assert torch.allclose(out, torch.sigmoid(xin), atol=1e-6)
    assert k.registers > 0 and k.local_bytes == 0


# --- row reductions ----------------------------------------------------------------------------
ROW_OPS = [
    ("softmax", {"dim": -1}), ("log_softmax", {"dim": -1}), ("logsumexp", {"dim": [-1]}),
    ("sum", {"dim": [-1]}), ("mean", {"dim": [-1], "keepdim": True}), ("max", {"dim": [-1]}),
    ("min", {"dim": [-1]}), ("var", {"dim": [-1]}), ("std", {"dim": [-1], "correction": 0}),
    ("layer_norm", {}), ("rms_norm", {"eps": 1e-6}),
]


@pytest.mark.parametrize("cols", [1, 7, 100, 1000, 1025, 4096, 16384, 16385, 40000])
@pytest.mark.parametrize("op,attrs", ROW_OPS, ids=[o for o, _ in ROW_OPS])
def test_row_ops_across_schedules(op, attrs, cols):
    rows = 3 if cols > 4096 else 37
    p, ids = stitched(op, attrs, (rows, cols))
    fused(p, ids, f"{op}_{cols}")


@pytest.mark.parametrize("cols", [1, 7, 1000, 4096, 16385])
def test_prod_across_schedules(cols):
    """Products of values near 1, so neither the reference nor any summation order over- or
    underflows (a product of thousands of normal draws would, in order-dependent ways)."""
    p = Program("prod")
    x = p.add_input("x", (3 if cols > 4096 else 37, cols), init={"kind": "uniform", "low": 0.999, "high": 1.001})
    n = p.add_node("prod", [x.id], {"dim": -1})
    p.mark_output(n.outputs[0])
    fused(p, [n.id], f"prod_{cols}")


def test_bare_and_multi_dim_reductions():
    p = Program("ln")
    x = p.add_input("x", (2, 3, 8, 5))
    n = p.add_node("layer_norm", [x.id], {"normalized_shape": [8, 5]})
    p.mark_output(n.outputs[0])
    fused(p, [n.id], "ln4d")
    q = Program("total")
    y = q.add_input("y", (33, 65))
    s = q.add_node("sum", [y.id], {"dim": None})
    q.mark_output(s.outputs[0])
    fused(q, [s.id], "total")
    r = Program("residual")
    z = r.add_input("z", (9, 300))
    sm = r.add_node("softmax", [z.id])
    ad = r.add_node("add", [sm.outputs[0], z.id])   # the epilogue reads the row input again
    r.mark_output(ad.outputs[0])
    fused(r, [sm.id, ad.id], "residual")


def test_wrong_kernel_falls_back_with_reason(monkeypatch):
    p, ids = stitched("softmax", {"dim": -1}, (17, 300))
    real = region_mod.generate_kernel

    def sabotaged(*a, **kw):
        ks = real(*a, **kw)
        ks.source = ks.source.replace("* inv_sum", "* inv_sum * 1.01f")
        return ks

    monkeypatch.setattr(region_mod, "generate_kernel", sabotaged)
    r = build_region(p, ids, name="sabotaged")
    assert not r.fused and "verification failed" in r.fallback_reason
    assert r.log[-1]["event"] == "fallback"
    x = torch.randn(17, 300, device="cuda")
    s = torch.randn(300, device="cuda")
    (y,) = r([x, s])
    assert torch.allclose(y, torch.tanh(torch.softmax(x * s, -1)), atol=1e-5)


@pytest.mark.parametrize("tpr,cols", [(4, 100), (16, 1000), (64, 1000), (256, 1000), (512, 9999)])
def test_tuned_threads_per_row(tpr, cols):
    for op, attrs in (("softmax", {"dim": -1}), ("layer_norm", {})):
        p, ids = stitched(op, attrs, (37, cols))
        r = fused(p, ids, f"{op}_tpr{tpr}", params={"threads_per_row": tpr})
        assert r.kernel.params["threads_per_row"] == tpr


COLUMN_CASES = [
    ("softmax", {"dim": 1}, (4, 6, 5, 7)), ("log_softmax", {"dim": 0}, (33, 10)),
    ("sum", {"dim": [0]}, (1000, 33)), ("mean", {"dim": [0, 1]}, (3, 50, 9)),
    ("var", {"dim": [1], "keepdim": True}, (2, 40, 3)), ("logsumexp", {"dim": [1]}, (5, 17, 65)),
    ("max", {"dim": [1]}, (2, 9, 31)), ("softmax", {"dim": 0}, (3, 1)), ("min", {"dim": [1]}, (1, 5000, 2)),
    ("softmax", {"dim": 1}, (2, 128, 33)), ("log_softmax", {"dim": 1}, (2, 129, 33)),
]


@pytest.mark.parametrize("op,attrs,shape", COLUMN_CASES, ids=[f"{c[0]}{list(c[2])}" for c in COLUMN_CASES])
def test_column_reductions(op, attrs, shape):
    p, ids = column_reduction(op, attrs, shape)
    fused(p, ids, f"col_{op}")


STITCH_KINDS = ["linear_bias_relu", "linear_layer_norm", "conv_bn_relu", "expand_chain", "rms_norm_manual",
                "group_norm", "instance_norm", "global_avg_pool"]


@pytest.mark.parametrize("kind", STITCH_KINDS)
def test_stitched_patterns(kind):
    """Library call + generated epilogue, batch_norm/expand in chains, group norms, broadcast-back."""
    from tests.test_codegen_stitching import build  # the same programs the CPU tests compile
    p, ids = build(kind)
    r = fused(p, ids, kind)
    assert bool(r.kernel.library_nodes) == kind.startswith(("linear", "conv"))


@pytest.mark.parametrize("groups,shape", [(8, (4, 64, 32, 32)), (1, (3, 5, 7)), (4, (2, 8, 129))])
def test_group_norm_shapes(groups, shape):
    p = Program("gn")
    x = p.add_input("x", shape)
    w = p.add_parameter("w", shape=(shape[1],))
    b = p.add_parameter("b", shape=(shape[1],))
    n = p.add_node("group_norm", [x.id, w.id, b.id], {"num_groups": groups})
    p.mark_output(n.outputs[0])
    fused(p, [n.id], "gn")


@pytest.mark.parametrize("op,attrs", [("sum", {"dim": [-1]}), ("logsumexp", {"dim": [-1]}),
                                      ("var", {"dim": [-1]}), ("max", {"dim": None})])
def test_split_rows_for_few_long_rows(op, attrs):
    """Few rows of 2^20 reduced away: several blocks per row, the last one combines (and the
    kernel runs twice, so the arrival counters must have been reset)."""
    p = Program("split")
    x = p.add_input("x", (3, 1 << 20) if attrs["dim"] else (1 << 21,))
    r = p.add_node("relu", [x.id])
    n = p.add_node(op, [r.outputs[0]], attrs)
    p.mark_output(n.outputs[0])
    run = fused(p, [r.id, n.id], f"split_{op}")
    assert run.kernel.params["schedule"] == "split" and run.kernel.workspace


@pytest.mark.parametrize("shape,perm", [((2, 3, 4), [0, 2, 1]), ((65, 129), [1, 0]), ((2, 3, 4, 5), [3, 0, 1, 2]),
                                        ((2, 3, 4, 5), [1, 0, 2, 3]), ((4, 1, 6, 33), [0, 3, 2, 1]),
                                        ((16, 256, 512), [0, 2, 1])])
def test_permute(shape, perm):
    p = Program("perm")
    x = p.add_input("x", shape)
    a = p.add_node("sigmoid", [x.id])
    t = p.add_node("permute", [a.outputs[0]], {"dims": perm})
    e = p.add_node("mul_scalar", [t.outputs[0]], {"value": 3.0})
    p.mark_output(e.outputs[0])
    fused(p, [a.id, t.id, e.id], "perm")


POOL_CASES = [
    ("max_pool2d", {"kernel_size": [3], "stride": [2], "padding": [1]}, (2, 3, 9, 10)),
    ("max_pool2d", {"kernel_size": [2], "ceil_mode": True}, (2, 3, 9, 11)),
    ("avg_pool2d", {"kernel_size": [3], "stride": [2], "padding": [1], "ceil_mode": True,
                    "count_include_pad": False}, (2, 3, 9, 10)),
    ("avg_pool2d", {"kernel_size": [3], "stride": [2], "padding": [1]}, (2, 3, 9, 10)),
    ("max_pool1d", {"kernel_size": [2]}, (2, 3, 9)),
    ("avg_pool1d", {"kernel_size": [3], "padding": [1]}, (2, 3, 10)),
    ("avg_pool3d", {"kernel_size": [2]}, (1, 2, 5, 6, 7)),
    ("max_pool3d", {"kernel_size": [3], "dilation": [2], "padding": [1]}, (1, 2, 9, 9, 9)),
    ("avg_pool2d", {"kernel_size": [2], "divisor_override": 3}, (2, 3, 8, 8)),
]


@pytest.mark.parametrize("op,attrs,shape", POOL_CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(POOL_CASES)])
def test_pooling(op, attrs, shape):
    p, ids = pooled(op, attrs, shape)
    fused(p, ids, op)


@pytest.mark.parametrize("shape,op,attrs", [
    ((8, 1000), "layer_norm", {"normalized_shape": [1000]}), ((3, 40000), "layer_norm", {"normalized_shape": [40000]}),
    ((4, 6, 35), "softmax", {"dim": 1}), ((4, 300, 35), "softmax", {"dim": 1}), ((2, 1 << 20), "sum", {"dim": [-1]}),
])
def test_prologue_value_used_outside(shape, op, attrs):
    p, ids = residual(shape, op, attrs)
    fused(p, ids, "residual")


@pytest.mark.parametrize("op,attrs", [("relu", {}), ("relu6", {}), ("hardtanh", {}), ("clamp", {"min": -0.5, "max": 0.5}),
                                      ("max_scalar", {"value": 0.25}), ("elu", {}), ("hardsigmoid", {})])
def test_nan_passes_through_clamping_ops_like_torch(op, attrs):
    """torch keeps NaN through relu, clamp and the like; fmaxf / fminf would turn it into the bound."""
    p = Program(op)
    x = p.add_input("x", (4, 257))
    n = p.add_node(op, [x.id], attrs)
    p.mark_output(n.outputs[0])
    r = fused(p, [n.id], f"nan_{op}")
    t = torch.randn(4, 257)
    t[:, ::7] = float("nan")
    (got,) = r([t.cuda()])
    (want,) = run_reference(p, {"x": t}).values()
    assert torch.equal(torch.isnan(got.cpu()), torch.isnan(want))


@pytest.mark.parametrize("op", ["max", "min"])
def test_row_max_min_keep_nan_like_torch(op):
    p = Program(op)
    x = p.add_input("x", (8, 3000))
    n = p.add_node(op, [x.id], {"dim": [1]})
    p.mark_output(n.outputs[0])
    r = fused(p, [n.id], f"nan_row_{op}")
    t = torch.randn(8, 3000)
    t[2, 1234] = float("nan")
    t[5, 0] = float("nan")
    (got,) = r([t.cuda()])
    want = getattr(torch, "amax" if op == "max" else "amin")(t, dim=1)
    assert torch.equal(torch.isnan(got.cpu()), torch.isnan(want)) and torch.isnan(got.cpu()).sum() == 2


@pytest.mark.parametrize("value", [3.0, 2.302585092994046, 7.1, -0.3, 1e-30])
def test_torch_divides_by_a_number_as_our_reciprocal_multiply(value):
    """codegen.cuda.div_reciprocal's premise: torch's CUDA x / number is x * float32(1 / number), the
    reciprocal in double rounded once (ln 10 tells it from 1 / float32(number))."""
    from agent_core.codegen.cuda import div_reciprocal
    xs = torch.randn(1 << 20, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 1e3
    assert torch.equal(xs / value, xs * float(div_reciprocal(value)))
