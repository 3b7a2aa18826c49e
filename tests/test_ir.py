"""The program model: building, editing, inference and validation with precise messages."""
import pytest

from agent_core.errors import CycleError, ProgramError, ShapeError
from agent_core.ir import Program, Role
from agent_core.reference import random_inputs, run_reference


def chain():
    p = Program("chain")
    x = p.add_input("x", (4, 6))
    b = p.add_input("b", (6,))
    add = p.add_node("add", [x.id, b.id])
    act = p.add_node("gelu", [add.outputs[0]])
    p.mark_output(act.outputs[0])
    return p, x, b, add, act


def codes(p):
    return {d.code for d in p.validate()}


def test_build_infers_shapes_and_runs():
    p, x, b, add, act = chain()
    assert p.values[act.outputs[0]].shape == (4, 6)
    assert p.values[act.outputs[0]].role == Role.OUTPUT
    assert p.validate() == []
    out = run_reference(p, random_inputs(p))
    assert tuple(out["gelu"].shape) == (4, 6)


def test_ids_are_stable_across_removal_and_restore():
    p, x, b, add, act = chain()
    record = p.remove_node(add.id)
    assert add.id not in p.nodes and p.nodes[act.id].inputs == [None]
    assert "dangling-input" in codes(p)
    p.restore_node(record)
    assert p.nodes[act.id].inputs == [add.outputs[0]]
    assert p.validate() == []
    n = p.add_node("relu", [act.outputs[0]])
    assert n.id not in (add.id, act.id) and n.outputs[0] not in (add.outputs[0], act.outputs[0])


def test_unknown_op_suggests_close_names():
    p = Program()
    x = p.add_input("x", (3,))
    with pytest.raises(ProgramError, match="unknown op 'gleu'.*gelu"):
        p.add_node("gleu", [x.id])


def test_shape_mismatch_names_both_shapes():
    p = Program()
    x, y = p.add_input("x", (4, 6)), p.add_input("y", (5,))
    with pytest.raises(ShapeError, match=r"\[4, 6\] and \[5\] do not broadcast"):
        p.add_node("add", [x.id, y.id])


def test_wrong_arity_and_attribute_errors():
    p = Program()
    x = p.add_input("x", (4,))
    with pytest.raises(ProgramError, match="takes 2 inputs"):
        p.add_node("add", [x.id])
    with pytest.raises(ProgramError, match="negative_slope must be a number"):
        p.add_node("leaky_relu", [x.id], {"negative_slope": "a lot"})
    with pytest.raises(ProgramError, match="has no attribute slope"):
        p.add_node("leaky_relu", [x.id], {"slope": 0.1})


def test_connection_that_makes_a_cycle_is_refused_with_reason():
    p, x, b, add, act = chain()
    reason = p.can_connect(act.outputs[0], add.id, 1)
    assert "cycle" in reason and "add" in reason
    with pytest.raises(CycleError):
        p.connect(act.outputs[0], add.id, 1)
    assert p.nodes[add.id].inputs[1] == b.id  # unchanged


def test_connection_with_bad_shape_is_refused_and_model_unchanged():
    p, x, b, add, act = chain()
    z = p.add_input("z", (7,))
    reason = p.can_connect(z.id, add.id, 1)
    assert "do not broadcast" in reason
    assert p.nodes[add.id].inputs[1] == b.id


def test_cycle_is_reported_by_validate_and_topo_order():
    p, x, b, add, act = chain()
    p.set_input(add.id, 1, act.outputs[0])  # low-level rewiring skips the check
    assert "cycle" in codes(p)
    with pytest.raises(CycleError, match="cycle: "):
        p.topo_order()


def test_unused_output_is_a_warning_and_edits_reinfer_downstream():
    p, x, b, add, act = chain()
    extra = p.add_node("relu", [x.id])
    diags = p.validate()
    assert [d.code for d in diags] == ["unused-output"] and diags[0].severity == "warning"
    p.remove_node(extra.id)
    p.set_attrs(act.id, {"approximate": "tanh"})
    assert p.nodes[act.id].attrs["approximate"] == "tanh"


def test_editing_an_input_shape_marks_downstream_errors_without_raising():
    p, x, b, add, act = chain()
    nb = p.add_input("b2", (5,))
    p.set_input(add.id, 1, nb.id)
    assert "do not broadcast" in p.nodes[add.id].error
    assert "shape" in codes(p)


def test_subscribers_see_edits():
    p, x, b, add, act = chain()
    seen = []
    p.subscribe(lambda ev, payload: seen.append(ev))
    n = p.add_node("relu", [act.outputs[0]])
    p.set_pos(n.id, (10, 20))
    p.remove_node(n.id)
    assert seen[:3] == ["node_added", "node_moved", "node_removed"]


def test_networkx_view_has_value_edges():
    p, x, b, add, act = chain()
    g = p.graph()
    assert g.has_edge(add.id, act.id) and g.edges[add.id, act.id]["value"] == add.outputs[0]


def test_changing_split_count_resizes_outputs():
    p = Program()
    x = p.add_input("x", (6, 4))
    n = p.add_node("chunk", [x.id], {"chunks": 3, "dim": 0})
    assert len(n.outputs) == 3
    p.mark_output(n.outputs[0])
    p.set_attrs(n.id, {"chunks": 2})
    assert len(n.outputs) == 2 and all(p.values[v].shape == (3, 4) for v in n.outputs)
    p.set_attrs(n.id, {"chunks": 6})
    assert len(n.outputs) == 6 and all(p.values[v].shape == (1, 4) for v in n.outputs)
    assert not [d for d in p.validate() if d.severity == "error"]


def test_first_connection_to_a_fresh_node_is_allowed():
    p = Program()
    x, y = p.add_input("x", (4,)), p.add_input("y", (4,))
    n = p.add_node("add", [], strict=False)
    assert p.can_connect(x.id, n.id, 0) is None
    p.connect(x.id, n.id, 0)
    p.connect(y.id, n.id, 1)
    assert p.nodes[n.id].error is None and p.values[n.outputs[0]].shape == (4,)


def test_removing_a_member_drops_its_region_and_undo_restores_it():
    p, x, b, add, act = chain()
    p.regions.append({"id": "r1", "nodes": [add.id, act.id]})
    events = []
    p.subscribe(lambda ev, payload: events.append(ev))
    record = p.remove_node(act.id)
    assert p.regions == [] and "regions_changed" in events
    p.restore_node(record)
    assert p.regions == [{"id": "r1", "nodes": [add.id, act.id]}]


def test_broadcast_matches_torch():
    import torch
    from agent_core.ops.common import broadcast
    for shapes in [((4, 1, 3), (5, 1)), ((), (2, 3)), ((1,), (7,)), ((2, 1), (1, 3), (3,))]:
        assert broadcast(*shapes) == tuple(torch.broadcast_shapes(*shapes))
    with pytest.raises(ShapeError):
        broadcast((2, 3), (4, 3))


# inputs, parameters and constants edited in place (what the studio's inspector does) -------------------
def linear_program():
    import numpy as np
    p = Program("lin")
    x = p.add_input("x", (4, 8))
    w = p.add_parameter("w", shape=(16, 8), init={"kind": "normal", "std": 0.5})
    c = p.add_parameter("c", np.array(2.0, np.float32), constant=True)
    lin = p.add_node("linear", [x.id, w.id])
    out = p.add_node("mul", [lin.outputs[0], c.id])
    p.mark_output(out.outputs[0])
    return p, x, w, c, lin


def test_parameter_init_draws_its_data_the_same_way_every_time():
    import numpy as np
    p, x, w, c, lin = linear_program()
    assert w.init == {"kind": "normal", "mean": 0.0, "std": 0.5}
    assert p.data[w.id].shape == (16, 8) and p.data[w.id].dtype == np.float32
    assert 0.3 < p.data[w.id].std() < 0.7
    again = Program("again")
    again.add_parameter("w", shape=(16, 8), init=w.init, value_id=w.id)
    assert np.array_equal(again.data[w.id], p.data[w.id])   # seeded by the value id
    for kind, check in (("zeros", lambda a: not a.any()), ("ones", lambda a: (a == 1).all()),
                        ("uniform", lambda a: a.min() >= -2 and a.max() <= -1)):
        init = {"kind": kind, **({"low": -2, "high": -1} if kind == "uniform" else {})}
        old = p.set_source(w.id, init=init)
        assert check(p.data[w.id]) and p.values[w.id].init["kind"] == kind
        p.restore_source(w.id, old)
        assert p.values[w.id].init == w.init


def test_set_source_reshapes_and_reinfers_readers_and_restore_puts_back_exactly():
    import numpy as np
    p, x, w, c, lin = linear_program()
    seen = []
    p.subscribe(lambda e, payload: seen.append(e))
    state = p.source_state(w.id)
    old = p.set_source(w.id, shape=(32, 8))
    assert p.values[lin.outputs[0]].shape == (4, 32) and p.data[w.id].shape == (32, 8)
    assert "value_changed" in seen
    p.restore_source(w.id, old)
    assert p.values[lin.outputs[0]].shape == (4, 16)
    after = p.source_state(w.id)
    assert after["shape"] == state["shape"] and np.array_equal(after["data"], state["data"])
    # an input's new shape flows downstream; a mismatch is the reader's error, not a refusal
    p.set_source(x.id, shape=(4, 9))
    assert p.nodes[lin.id].error and "9" in p.nodes[lin.id].error
    p.set_source(x.id, shape=(4, 8), dtype="float64")
    assert p.values[x.id].dtype == "float64"
    # a constant takes typed data; its shape follows it
    p.set_source(c.id, data=[[1, 2], [3, 4]])
    assert p.values[c.id].shape == (2, 2) and p.data[c.id].dtype == np.float32


@pytest.mark.parametrize("target,changes,words", [
    ("x", {"shape": (0, 8)}, "at least 1"),
    ("x", {"shape": (4, 2.5)}, "whole number"),
    ("x", {"shape": [1] * 9}, "more than the 8"),
    ("x", {"dtype": "float8"}, "unknown dtype"),
    ("x", {"data": [1.0]}, "takes no data"),
    ("w", {"init": {"kind": "gaussian"}}, "init kind must be one of"),
    ("w", {"init": {"kind": "normal", "std": -1}}, "std must not be negative"),
    ("w", {"init": {"kind": "uniform", "low": 1, "high": 0}}, "below high"),
    ("w", {"init": {"kind": "zeros", "low": 1}}, "takes no numbers"),
    ("w", {"init": {"kind": "normal", "mean": float("inf")}}, "finite number"),
    ("w", {"dtype": "bfloat16"}, "holds data"),
    ("w", {"shape": (1 << 14, 1 << 14)}, "too large to draw"),
    ("c", {"shape": (3,)}, "takes its shape from its value"),
    ("c", {"init": {"kind": "ones"}}, "only inputs and parameters take an init"),
    ("c", {"data": [[1], [2, 3]]}, "different lengths"),
    ("c", {"data": "abc"}, "number or nested lists"),
    ("c", {"data": [1.0, float("nan")]}, "inf or nan"),
    ("lin_out", {"shape": (2,)}, "is computed by"),
])
def test_set_source_refuses_with_one_line_and_changes_nothing(target, changes, words):
    from agent_core.project_file import program_to_json
    p, x, w, c, lin = linear_program()
    vid = {"x": x.id, "w": w.id, "c": c.id, "lin_out": lin.outputs[0]}[target]
    before = program_to_json(p)
    with pytest.raises(ProgramError) as err:
        p.set_source(vid, **changes)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert program_to_json(p) == before


def test_any_shape_is_either_taken_exactly_or_refused_leaving_the_program_as_it_was():
    from hypothesis import given, settings, strategies as st

    from agent_core.project_file import program_to_json

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.one_of(st.integers(-3, 40), st.floats(allow_nan=True), st.booleans(), st.text(max_size=2)),
                    max_size=10))
    def check(dims):
        p, x, w, c, lin = linear_program()
        before = program_to_json(p)
        try:
            p.set_source(w.id, shape=dims)
        except ProgramError:
            assert program_to_json(p) == before
            return
        assert list(p.values[w.id].shape) == dims and p.data[w.id].shape == tuple(dims)
        assert all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)
    check()


def test_an_open_optional_port_left_by_undo_is_no_port():
    p, x, w, c, lin = linear_program()
    b = p.add_parameter("b", shape=(16,), init={"kind": "zeros"})
    p.connect(b.id, lin.id, 2)
    assert len(p.nodes[lin.id].inputs) == 3
    p.set_input(lin.id, 2, None)
    assert p.nodes[lin.id].inputs == [x.id, w.id]


def test_region_io_is_remembered_per_structure_and_sees_every_edit():
    """codegen.region_io is memoized per program structure (it is asked per region, per tuning variant):
    an edit anywhere, even a direct assignment to node.inputs, or a new program output, is seen."""
    from agent_core.codegen import region_io
    p = Program("chain")
    x = p.add_input("x", (4, 8)).id
    a = p.add_node("relu", [x])
    b = p.add_node("neg", [a.outputs[0]])
    c = p.add_node("exp", [b.outputs[0]])
    p.mark_output(c.outputs[0])
    first = region_io(p, [a.id, b.id])
    assert first.outputs == [b.outputs[0]] and first.inputs == [x]
    first.outputs.append("scribbled")                 # a caller's copy: the memo is not changed
    assert region_io(p, [a.id, b.id]).outputs == [b.outputs[0]]
    p.mark_output(a.outputs[0])                       # relu's result now leaves the region too
    assert region_io(p, [a.id, b.id]).outputs == [a.outputs[0], b.outputs[0]]
    assert region_io(p, [b.id]).outputs == [b.outputs[0]]
    c.inputs[0] = a.outputs[0]                        # exp now reads relu directly: neg's result is unused
    from agent_core.codegen import CodegenError
    with pytest.raises(CodegenError, match="never used"):
        region_io(p, [b.id])
    assert [n for n, _ in p.consumers(a.outputs[0])] == [b.id, c.id]


def test_a_frozen_span_reads_the_structure_once_and_refuses_edits_made_inside_it():
    p = Program("chain")
    x = p.add_input("x", (4, 8)).id
    a = p.add_node("relu", [x])
    b = p.add_node("neg", [a.outputs[0]])
    p.mark_output(b.outputs[0])
    calls = []
    real = p._structure
    p._structure = lambda: calls.append(1) or real()          # count how often the structure is read
    with p.frozen():
        for _ in range(5):
            assert p.topo_order() == [a.id, b.id] and p.consumers(a.outputs[0]) == [(b.id, 0)]
    assert len(calls) == 2                                    # entering and leaving, not per question
    with pytest.raises(ProgramError, match="edited inside a frozen span"):
        with p.frozen():
            b.inputs[0] = x                                   # an edit the span promised not to make
    assert p.consumers(x) == [(a.id, 0), (b.id, 0)]           # read afresh once the span is over
