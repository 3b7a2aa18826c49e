"""A reduction's pointwise tail goes to the kernel that consumes it (planner/tails.py): the reduction's
kernel writes its small statistics, not the full tensor the tail computes from them."""

from agent_core.ir import Program
from agent_core.planner import plan_program
from tests import planned


def test_standardisation_over_one_axis_is_computed_inside_the_softmax_over_the_other():
    plan, p = planned.plan(planned.block("standardize_softmax_dino_teacher"))
    kinds = [sorted(p.nodes[n].op for n in r["nodes"]) for r in plan["regions"]]
    assert kinds == [["mean", "std"], ["add_scalar", "div", "div_scalar", "softmax", "sub"]], kinds
    moved = [e for e in plan["log"] if e["action"] == "moved"]
    assert len(moved) == 1 and "computed in the consumer's kernel" in moved[0]["message"]


def _column_stats_then_row_softmax(centred_twice: bool):
    """x [256, 4096]: column mean (and variance), x standardised over the columns, softmax over rows.
    With `centred_twice` the variance is taken of the centred x, so the centred tensor feeds both the
    statistics and the tail."""
    p = Program()
    x = p.add_input("x", (256, 4096))
    mean = p.add_node("mean", [x.id], {"dim": [0], "keepdim": True})
    c = p.add_node("sub", [x.id, mean.outputs[0]])
    if centred_twice:
        sq = p.add_node("mul", [c.outputs[0], c.outputs[0]])
        var = p.add_node("mean", [sq.outputs[0]], {"dim": [0], "keepdim": True})
    else:
        var = p.add_node("var", [x.id], {"dim": [0], "keepdim": True, "correction": 0})
    eps = p.add_node("add_scalar", [var.outputs[0]], {"value": 1e-5})
    rs = p.add_node("rsqrt", [eps.outputs[0]])
    y = p.add_node("mul", [c.outputs[0], rs.outputs[0]])
    s = p.add_node("softmax", [y.outputs[0]], {"dim": -1})
    p.mark_output(s.outputs[0])
    return p, {"sub": c.id, "softmax": s.id, "mul": y.id}


def _region_of(plan, nid):
    return next(r for r in plan.active if nid in r.nodes)


def test_the_tail_moves_and_the_plan_costs_less_than_writing_the_standardised_tensor():
    p, ids = _column_stats_then_row_softmax(centred_twice=False)
    plan = plan_program(p)
    soft = _region_of(plan, ids["softmax"])
    assert ids["sub"] in soft.nodes and ids["mul"] in soft.nodes
    assert [e for e in plan.log if e["action"] == "moved"]
    # the statistics' region writes two [1, 4096] vectors, not the 4 MB standardised tensor
    stats = [r for r in plan.active if r is not soft]
    assert len(stats) == 1 and all(p.nodes[n].op in ("mean", "var", "add_scalar", "rsqrt") for n in stats[0].nodes)


def test_a_tail_that_would_make_the_reduction_write_a_full_tensor_stays():
    """The centred x feeds the variance as well: moving the tail would leave the statistics' kernel
    writing the centred tensor for it, which saves nothing."""
    p, ids = _column_stats_then_row_softmax(centred_twice=True)
    plan = plan_program(p)
    assert not [e for e in plan.log if e["action"] == "moved"]
    assert _region_of(plan, ids["sub"]) is not _region_of(plan, ids["softmax"])
