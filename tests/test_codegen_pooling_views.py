"""A pooling region with views of its output (squeeze, reshape: the same elements in the same order):
the kernel writes the view's output at the pooled element's flat index, matching torch in the CPU
emulator; the plan says the region is generated (level 2's 55: linear -> unsqueeze -> max_pool1d ->
squeeze ran its pooling through torch). With a view that another op reads (a pointwise op, or the
pool itself) the pooling kernel refuses the region and it is a layout graph of window lambdas."""
import pytest
import torch

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.ir import Program
from agent_core.planner import plan_program
from tests.programs import emulated


def _pool_then(views_after, *, op_after_view=False, view_before=False):
    p = Program("pool_views")
    x = p.add_input("x", [3, 1, 20])
    ids = []
    src = x.id
    if view_before:
        v = p.add_node("reshape", [src], {"shape": [3, 1, 20]})
        ids.append(v.id)
        src = v.outputs[0]
    r = p.add_node("relu", [src])
    pool = p.add_node("max_pool1d", [r.outputs[0]], {"kernel_size": [2], "stride": [2], "padding": [0],
                                                     "dilation": [1], "ceil_mode": False})
    t = p.add_node("tanh", [pool.outputs[0]])
    ids += [r.id, pool.id, t.id]
    y = t.outputs[0]
    for op, attrs in views_after:
        n = p.add_node(op, [y], attrs)
        ids.append(n.id)
        y = n.outputs[0]
    if op_after_view:
        n = p.add_node("neg", [y])
        ids.append(n.id)
        y = n.outputs[0]
    p.mark_output(y)
    return p, ids


@pytest.mark.parametrize("views", [[("squeeze", {"dim": [1]})],
                                   [("squeeze", {"dim": [1]}), ("reshape", {"shape": [30]})]])
def test_a_pool_writes_its_views_output_and_matches_torch(views):
    p, ids = _pool_then(views)
    ks = generate_kernel(p, ids, name="pool_views")
    assert ks.kind == "pooling"
    assert list(p.values[ks.outputs[0]].shape) == ([3, 10] if len(views) == 1 else [30])
    got, want = emulated(p, ks, [torch.randn(3, 1, 20)])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_the_plan_says_a_pool_with_a_view_after_it_is_generated():
    p, _ = _pool_then([("squeeze", {"dim": [1]})])
    plan = plan_program(p)
    pooled = [r for r in plan.regions if any(p.nodes[n].op == "max_pool1d" for n in r.nodes)]
    assert len(pooled) == 1 and pooled[0].schedule["runs"] == "kernel", pooled[0].schedule
    assert "runs as its own generated kernel" in pooled[0].reason or "pooling kernel" in pooled[0].reason, \
        pooled[0].reason


@pytest.mark.parametrize("kw", [{"op_after_view": True}, {"view_before": True}])
def test_a_view_read_by_another_op_or_before_the_pool_makes_a_layout_graph_that_matches_torch(kw):
    """The pooling kernel writes only views of its output; with a view another op reads, or one before
    the pool, the region is a layout graph of window lambdas (codegen/layout_graph.py)."""
    p, ids = _pool_then([("squeeze", {"dim": [1]})], **kw)
    with pytest.raises(CodegenError, match="holds one max/avg or adaptive pool, pointwise ops around it and "
                                           "views of its outputs"):
        from agent_core.codegen.pooling import generate_pooling
        from agent_core.codegen import region_io
        generate_pooling(p, region_io(p, ids), "pool_views")
    ks = generate_kernel(p, ids, name="pool_views")
    assert ks.kind == "pooling" and "auto max_pool1d_at" in ks.source      # the layout graph's pooling form
    got, want = emulated(p, ks, [torch.randn(3, 1, 20)])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
