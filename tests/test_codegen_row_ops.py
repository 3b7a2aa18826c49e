"""Row reductions (the row graph, rowkernel.py): each op and each schedule (warp, block, stream; float4
and scalar loads) renders with its prologue and epilogue and compiles to sm_90; structures it cannot
stitch are refused."""
import pytest

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from tests.programs import column_reduction, residual, stitched

ROW_OPS = [
    ("softmax", {"dim": -1}), ("log_softmax", {"dim": -1}), ("logsumexp", {"dim": [-1]}),
    ("sum", {"dim": [-1]}), ("mean", {"dim": [-1], "keepdim": True}), ("max", {"dim": [-1]}),
    ("min", {"dim": [-1]}), ("var", {"dim": [-1]}), ("std", {"dim": [-1], "correction": 0}),
    ("layer_norm", {"normalized_shape": [None]}), ("rms_norm", {"normalized_shape": [None], "eps": 1e-6}),
    ("prod", {"dim": -1}),
]


@pytest.mark.parametrize("op,attrs", ROW_OPS, ids=[o for o, _ in ROW_OPS])
def test_every_row_op_compiles(op, attrs):
    p, ids = stitched(op, attrs, (6, 200), epilogue="gelu")
    ks = generate_kernel(p, ids, name=f"{op}_rows")
    assert ks.kind == "row_reduction" and ks.params["schedule"] == "warp"
    assert f"1 reductions ({op})" in ks.source and "gelu" in ks.source
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0, c.summary()


@pytest.mark.parametrize("cols,schedule,vec", [
    (7, "warp", 1), (1, "warp", 1), (1000, "warp", 4), (1025, "block", 1), (16384, "block", 4),
    (16385, "stream", 1), (40000, "stream", 4),
])
def test_schedules_by_row_length(cols, schedule, vec):
    ops = [("softmax", {"dim": -1})]
    if cols in (1025, 40000):  # Welford's state through the block and online reductions too
        ops.append(("layer_norm", {"normalized_shape": [None]}))
    for op, attrs in ops:
        p, ids = stitched(op, attrs, (3, cols), epilogue="gelu")
        ks = generate_kernel(p, ids, name=f"{op}_{cols}")
        assert ks.params["schedule"] == schedule and ks.params["vector_width"] == vec, ks.params
        assert ks.block[0] <= 1024 and ks.block[0] % 32 == 0
        c = compile_kernel(ks, arch="sm_90")
        assert c.spill_stores == 0, c.summary()


def test_bare_reduction_and_multi_dim_layer_norm():
    p = Program("ln")
    x = p.add_input("x", (2, 3, 4, 5))
    n = p.add_node("layer_norm", [x.id], {"normalized_shape": [4, 5]})
    p.mark_output(n.outputs[0])
    ks = generate_kernel(p, [n.id], name="ln")
    assert "[6, 20, 1]: 6 rows of 20" in ks.source
    compile_kernel(ks, arch="sm_90")
    q = Program("total")
    y = q.add_input("y", (3, 7))
    s = q.add_node("sum", [y.id], {"dim": None})
    q.mark_output(s.outputs[0])
    ks = generate_kernel(q, [s.id], name="total")
    assert "[1, 21, 1]: 1 rows of 21" in ks.source
    compile_kernel(ks, arch="sm_90")


COLUMN_CASES = [
    ("softmax", {"dim": 1}, (4, 6, 5, 7)), ("log_softmax", {"dim": 0}, (33, 10)),
    ("sum", {"dim": [0]}, (100, 33)), ("mean", {"dim": [0, 1]}, (3, 50, 9)),
    ("var", {"dim": [1], "keepdim": True}, (2, 40, 3)), ("logsumexp", {"dim": [1]}, (5, 17, 65)),
    ("max", {"dim": [1]}, (2, 9, 31)),
]


@pytest.mark.parametrize("op,attrs,shape", COLUMN_CASES, ids=[c[0] for c in COLUMN_CASES])
def test_column_reductions_are_the_row_graphs_column_tiles(op, attrs, shape):
    """A reduction over dims followed by kept ones: column tiles, the prologue's value that leaves the
    region (relu) stored as well."""
    p, ids = column_reduction(op, attrs, shape, keep_relu=True)
    ks = generate_kernel(p, ids, name=f"col_{op}")
    assert ks.params["schedule"] in ("column", "split_column") and ks.block[0] == 32
    assert "column tiles of 32 positions" in ks.schedule
    assert set(ks.outputs) == set(p.outputs)
    compile_kernel(ks, arch="sm_90")


def test_refusals():
    p = Program("scattered")
    x = p.add_input("x", (4, 8, 3))
    n = p.add_node("sum", [x.id], {"dim": [0, 2]})
    p.mark_output(n.outputs[0])
    with pytest.raises(CodegenError, match="not neighbours"):
        generate_kernel(p, [n.id], name="scattered")
    q = Program("two")        # chained reductions over the same rows are one kernel (codegen/rowkernel.py)
    y = q.add_input("y", (4, 8))
    a = q.add_node("softmax", [y.id])
    b = q.add_node("log_softmax", [a.outputs[0]])
    q.mark_output(b.outputs[0])
    ks = generate_kernel(q, [a.id, b.id], name="two")
    assert ks.source.count("__global__") == 1
    r = Program("other_rows")  # reductions over different rows are not
    z = r.add_input("z", (4, 8))
    c = r.add_node("softmax", [z.id], {"dim": 0})
    d = r.add_node("log_softmax", [c.outputs[0]], {"dim": 1})
    r.mark_output(d.outputs[0])
    with pytest.raises(CodegenError, match="reduce different rows"):
        generate_kernel(r, [c.id, d.id], name="other_rows")


def test_few_long_rows_split_across_blocks():
    p = Program("split")
    x = p.add_input("x", (3, 1 << 20))
    n = p.add_node("logsumexp", [x.id], {"dim": [-1]})
    p.mark_output(n.outputs[0])
    ks = generate_kernel(p, [n.id], name="split")
    assert ks.params["schedule"] == "split_row" and ks.params["split"] > 1
    assert ks.grid[0] == 3 * ks.params["split"] * ks.params["phases"]
    compile_kernel(ks, arch="sm_90")
    many = Program("many")
    y = many.add_input("y", (1000, 1 << 15))
    m = many.add_node("sum", [y.id], {"dim": [-1]})
    many.mark_output(m.outputs[0])
    assert generate_kernel(many, [m.id], name="many").params["schedule"] == "stream"


@pytest.mark.parametrize("shape,op,attrs", [
    ((8, 1000), "layer_norm", {"normalized_shape": [1000]}), ((3, 40000), "layer_norm", {"normalized_shape": [40000]}),
    ((2, 1 << 20), "sum", {"dim": [-1]}),
])
def test_prologue_value_used_outside_is_written_in_pass_one(shape, op, attrs):
    """The residual stream: h = x + b feeds layer_norm and is also returned, from the same kernel."""
    # two rows of 2^20 would take the split-row schedule (tests/test_codegen_split_rows.py covers its
    # outputs); here one block streams each
    params = {"split": 1} if shape == (2, 1 << 20) else None
    p, ids = residual(shape, op, attrs)
    ks = generate_kernel(p, ids, name="residual", params=params)
    assert set(ks.outputs) == set(p.outputs) and ks.source.count("__global__") == 1
    compile_kernel(ks, arch="sm_90")


@pytest.mark.parametrize("shape", [(4, 6, 5, 7), (2, 3, 40, 40)], ids=["small", "pooled_rows"])
def test_a_pooled_value_squeezed_on_its_way_out_is_stored_by_the_row_kernel(shape):
    """gelu -> global average pool -> two reshapes ([N, C, 1, 1] -> [N, C, 1] -> [N, C]), the ResNet /
    EfficientNet head: the relabels move no element, so the row kernel stores the pooled values where it
    would have and the planner needs no alias region after it; equal to torch under the CPU emulator."""
    import shutil
    from types import SimpleNamespace

    import torch

    from agent_core.reference import run_reference
    from tests.test_codegen_column_tiles import _emulate_region
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    p = Program("head")
    x = p.add_input("x", shape)
    g = p.add_node("gelu", [x.id], {"approximate": "none"})
    pool = p.add_node("adaptive_avg_pool2d", [g.outputs[0]], {"output_size": [1, 1]})
    r1 = p.add_node("reshape", [pool.outputs[0]], {"shape": [shape[0], shape[1], 1]})
    r2 = p.add_node("reshape", [r1.outputs[0]], {"shape": [shape[0], shape[1]]})
    p.mark_output(r2.outputs[0])
    ids = [g.id, pool.id, r1.id, r2.id]
    ks = generate_kernel(p, ids, name="head")
    assert ks.kind == "row_reduction" and ks.outputs == [r2.outputs[0]]
    compile_kernel(ks, arch="sm_90")
    ins = [torch.randn(shape, generator=torch.Generator().manual_seed(0))]
    env = run_reference(p, ins, keep=True)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env, ks=ks)
    torch.testing.assert_close(outs[r2.outputs[0]], env[r2.outputs[0]], atol=1e-5, rtol=1e-5)
