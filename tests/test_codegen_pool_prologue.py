"""Windowed poolings before a reduction are the row kernel's prologue: each pooled element is computed
from its window where the row reads it, so pool -> log-sum-exp (level 2's 43), pool -> pool -> sum
(78) or pool -> global average (8) is one kernel and the pooled map never goes to memory; a pool of a
pool (6) is one layout-graph kernel of the same window lambdas. The kernels match torch in the CPU
emulator; the planner proposes the pool and the reduction as one region, says so, and still refuses
a pool after a reduction."""
import pytest
import torch

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.ir import Program
from agent_core.planner import plan_program
from tests.pool_prologue_cases import CASES, MP3, chain
from tests.programs import emulated


@pytest.mark.parametrize("name", sorted(CASES))
def test_pools_before_a_reduction_make_one_row_kernel_that_matches_torch(name):
    p, ids, shape = chain(name)
    ks = generate_kernel(p, ids, name=name)
    assert ks.kind == "row_reduction"
    windows = [p.nodes[n].op for n in ids if "pool" in p.nodes[n].op and "adaptive_avg" not in p.nodes[n].op]
    for op in windows:          # each window a lambda of the pooled element's index, none written
        assert f"auto {op}_at" in ks.source or f"auto {op}_1_at" in ks.source, ks.source
    got, want = emulated(p, ks, [torch.randn(*shape)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_window_propagates_nan_and_skips_the_padding_like_torch():
    p, ids, shape = chain("padded_ceil_pool_softmax")
    x = torch.randn(*shape)
    x[0, 1, 3, 5] = float("nan")
    ks = generate_kernel(p, ids, name="nan_window")
    got, want = emulated(p, ks, [x])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.isnan(got).any()


def test_the_plan_stitches_the_pools_into_the_reduction_and_says_why():
    p, ids, _ = chain("pool_pool_channel_sum")
    regions = plan_program(p).active
    assert len(regions) == 1 and set(regions[0].nodes) == set(ids), [r.nodes for r in regions]
    r = regions[0]
    assert r.kind == "reduction"
    assert "pooled from its window as it is read (max_pool3d): the pooled map never goes to memory" in r.reason


def test_a_pool_after_a_reduction_stays_its_own_kernel():
    p = Program("softmax_pool")
    x = p.add_input("x", [2, 4, 8, 8, 8])
    s = p.add_node("softmax", [x.id], {"dim": 1})
    m = p.add_node("max_pool3d", [s.outputs[0]], MP3)
    p.mark_output(m.outputs[0])
    plan = plan_program(p)
    assert [sorted(r.nodes) for r in plan.active] == [[s.id], [m.id]]
    assert {"action": "refused", "nodes": [s.id, m.id],
            "message": "max_pool3d's kernel takes pointwise ops and views only, not softmax"} in plan.log, plan.log
    with pytest.raises(CodegenError, match="a row kernel pools only before its reductions: split the region"):
        generate_kernel(p, [s.id, m.id], name="softmax_pool")


def test_whole_windows_are_straight_line_loads_and_a_padded_window_keeps_its_bounds():
    """65's 4x4 average over 382 columns: every window inside the input, so no bounds per element
    (a runtime-bounded loop per pooled element kept its loads from being issued together: the fused
    kernel ran 3.6 ms where the pool and the sum apart took 1.96); a padded window still tests them."""
    p, ids, _ = chain("avg_pool_sigmoid_sum")
    src = generate_kernel(p, ids, name="whole").source
    assert "for (int kh = 0; kh < kKH; ++kh)" in src and "acc / (float)(kKH * kKW)" in src, src
    assert "min(" not in src.split("auto avg_pool2d_at")[1].split("};")[0]
    p, ids, _ = chain("padded_ceil_pool_softmax")
    src = generate_kernel(p, ids, name="padded").source
    assert "if (iw < 0 || iw >= kInW) continue;" in src and "if (ih < 0 || ih >= kInH) continue;" in src


@pytest.mark.parametrize("ops", [
    [("max_pool3d", MP3), ("relu", {}), ("max_pool3d", {**MP3, "kernel_size": [1, 2, 2], "stride": [1, 2, 2]}),
     ("flatten", {"start_dim": 1, "end_dim": -1})],                       # level 2's 6: a pool of a pool
    [("max_pool3d", MP3), ("max_pool3d", MP3)],
], ids=["pool_relu_pool_flatten", "pool_pool"])
def test_a_pool_of_a_pool_is_one_kernel_of_window_lambdas_that_matches_torch(ops):
    p, ids, shape = chain("pools", ([2, 6, 9, 10, 12], ops))
    ks = generate_kernel(p, ids, name="pools")
    assert ks.kind == "pooling" and ks.source.count("auto max_pool3d") == 2, ks.source
    got, want = emulated(p, ks, [torch.randn(*shape)])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_two_pools_of_one_input_added_are_one_kernel_that_matches_torch():
    p = Program("two_pools")
    x = p.add_input("x", [2, 3, 10, 12])
    a = p.add_node("max_pool2d", [x.id], {"kernel_size": [2]})
    b = p.add_node("avg_pool2d", [x.id], {"kernel_size": [2]})
    s = p.add_node("add", [a.outputs[0], b.outputs[0]])
    p.mark_output(s.outputs[0])
    ks = generate_kernel(p, [a.id, b.id, s.id], name="two_pools")
    got, want = emulated(p, ks, [torch.randn(2, 3, 10, 12)])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["tanh_pool_group_norm", "relu_pool_lse_relu"])
def test_a_row_held_in_registers_pools_each_element_once(name):
    """A row kernel that holds its row computes each pooled element once, before its first pass: level
    2's 11 (tanh -> 2x2 max pool -> group norm) called the window's lambda in each of its three passes
    (12 tanh and 12 loads per element) and ran 0.375 ms where the pool and the norm apart took 0.236."""
    p, ids, shape = chain(name)
    ks = generate_kernel(p, ids, name=name)
    assert ks.kind == "row_reduction" and "row in registers" in ks.source, ks.source
    pool = next(p.nodes[n] for n in ids if "pool" in p.nodes[n].op)
    call = f"{p.values[pool.outputs[0]].name}_at("
    passes = ks.source.split("// round 1:")[1]
    assert call not in passes and call in ks.source.split("// round 1:")[0].split("kept in registers")[1], ks.source
    got, want = emulated(p, ks, [torch.randn(*shape)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
