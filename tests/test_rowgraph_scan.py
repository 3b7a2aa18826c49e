"""cumsum / cumprod in the row graph (rowscan.py): the running value is computed in the kernel's last
pass, chunk by chunk with every lane of the row in step, so pointwise ops before it (a mask), layout
ops read through views (a flip, a narrow), reductions before it (a softmax) and layout ops written
through views after it (the flip back) are one kernel with it: KernelBench's masked and reverse
cumsum plan as one kernel each instead of two or three.

CPU: generated, compiled with NVRTC for sm_90, run on the CPU emulator (every thread of every block)
against torch; the scan accumulates in double, so each output is the correctly rounded running value.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.codegen.region_io import region_io
from agent_core.codegen.rowkernel import generate_multi_reduction
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from agent_core.reference import run_reference
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx


def masked(shape, op="cumsum"):
    """cumsum(x * mask) (KernelBench level 1, 93), or cumprod, along the last dim."""
    p = Program("masked")
    x = p.add_input("x", shape)
    m = p.add_input("mask", shape, "bool")
    mul = p.add_node("mul", [x.id, m.id])
    c = p.add_node(op, [mul.outputs[0]], {"dim": -1})
    p.mark_output(c.outputs[0])
    return p, [mul.id, c.id]


def reverse(shape):
    """cumsum(x.flip(1), 1).flip(1) (KernelBench level 1, 91)."""
    p = Program("reverse")
    x = p.add_input("x", shape)
    f1 = p.add_node("flip", [x.id], {"dims": [1]})
    c = p.add_node("cumsum", [f1.outputs[0]], {"dim": 1})
    f2 = p.add_node("flip", [c.outputs[0]], {"dims": [1]})
    p.mark_output(f2.outputs[0])
    return p, [f1.id, c.id, f2.id]


def softmax_then_cumsum(shape):
    """The running probability mass of each row (top-p sampling's cumulative sum), and its exp."""
    p = Program("cdf")
    x = p.add_input("x", shape)
    sm = p.add_node("softmax", [x.id], {"dim": -1})
    c = p.add_node("cumsum", [sm.outputs[0]], {"dim": -1})
    e = p.add_node("exp", [c.outputs[0]])
    p.mark_output(sm.outputs[0])
    p.mark_output(e.outputs[0])
    return p, [sm.id, c.id, e.id]


def _inputs(p, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(p.values[v].shape, generator=g) + 0.5 if p.values[v].dtype == "float32" else
            torch.rand(p.values[v].shape, generator=g) < 0.5 for v in p.inputs]


def _emulated(p, ids, ks):
    compile_kernel(ks, arch="sm_90")
    env = run_reference(p, _inputs(p), keep=True)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env, ks=ks)
    for v, got in outs.items():
        torch.testing.assert_close(got, env[v], atol=1e-6, rtol=1e-6)
    return outs


@needs_gxx
@pytest.mark.parametrize("shape,op,schedule", [
    ((13, 100), "cumsum", "warp"), ((7, 37), "cumprod", "warp"),          # float4 / scalar lanes
    ((3, 3000), "cumsum", "block"), ((3, 2999), "cumprod", "block"),      # several warps per row
    ((2, 20000), "cumsum", "stream"), ((2, 20001), "cumsum", "stream"),   # chunks loaded as they are scanned
], ids=["warp", "warp_odd_cumprod", "block", "block_odd_cumprod", "stream", "stream_odd"])
def test_a_masked_scan_is_one_row_kernel_equal_to_torch(shape, op, schedule):
    p, ids = masked(shape, op)
    ks = generate_multi_reduction(p, region_io(p, ids), "scan")
    assert ks.params["schedule"] == schedule and "double" in ks.source
    _emulated(p, ids, ks)


@needs_gxx
@pytest.mark.parametrize("shape", [(5, 300), (2, 40000)], ids=["held", "streamed"])
def test_a_running_sum_of_a_softmax_folds_first_then_scans(shape):
    p, ids = softmax_then_cumsum(shape)
    ks = generate_multi_reduction(p, region_io(p, ids), "cdf")
    assert ks.params["reductions"] == 2
    _emulated(p, ids, ks)


@needs_gxx
def test_a_scan_of_a_permuted_value_is_gathered_and_spills_nothing():
    """Mamba2's segment sums: A [b, l, h] permuted to [b, h, l] and scanned along l, with exp of the
    running sum and a second output. The scan's double runs once spilled to local memory under ptxas
    (runs held across the store's branch, and a staged tile of the permute beside them): the
    lanes' values are now worked out before the branch and a scan's prologue is gathered."""
    p = Program("segsum")
    a = p.add_input("A", (4, 64, 8))
    t = p.add_node("permute", [a.id], {"dims": [0, 2, 1]})
    c = p.add_node("cumsum", [t.outputs[0]], {"dim": -1})
    e = p.add_node("exp", [c.outputs[0]])
    p.mark_output(c.outputs[0])
    p.mark_output(e.outputs[0])
    ids = [t.id, c.id, e.id]
    ks = generate_multi_reduction(p, region_io(p, ids), "segsum")
    assert ks.params["staged"] is False and len(ks.inputs) == 1
    assert compile_kernel(ks, arch="sm_90").spill_stores == 0
    _emulated(p, ids, ks)


@needs_gxx
def test_a_reverse_scan_reads_and_writes_through_the_flips():
    """The dispatch hands the three ops to the row graph (scan.py takes one node): the first flip is
    read through its view, the second written through its inverse."""
    p, ids = reverse((6, 50))
    ks = generate_kernel(p, ids, name="reverse")
    assert ks.kind == "row_reduction" and len(ks.inputs) == 1 and len(ks.outputs) == 1
    _emulated(p, ids, ks)


def test_what_the_row_graph_does_not_scan_is_refused_with_the_reason():
    # a reduction of a running value: the scan exists in the last pass only
    p = Program("sum_of_cumsum")
    x = p.add_input("x", (4, 64))
    c = p.add_node("cumsum", [x.id], {"dim": -1})
    s = p.add_node("sum", [c.outputs[0]], {"dim": [-1], "keepdim": False})
    p.mark_output(s.outputs[0])
    with pytest.raises(CodegenError, match="reduces a running value"):
        generate_multi_reduction(p, region_io(p, [c.id, s.id]), "x")
    # a per-row value read at a label: the running value exists in the last pass only
    q = Program("picked")
    y = q.add_input("y", (4, 64))
    t = q.add_input("t", (4,), "int64")
    c = q.add_node("cumsum", [y.id], {"dim": -1})
    n = q.add_node("nll_loss", [c.outputs[0], t.id], {"reduction": "none", "ignore_index": -100})
    q.mark_output(n.outputs[0])
    with pytest.raises(CodegenError, match="running value"):
        generate_multi_reduction(q, region_io(q, [c.id, n.id]), "x")


def strided(shape, op="cumsum"):
    """tanh(cumsum(relu(x), 1)) along a middle dim: the rows are columns of the tensor."""
    p = Program("strided")
    x = p.add_input("x", shape)
    r = p.add_node("relu", [x.id])
    c = p.add_node(op, [r.outputs[0]], {"dim": 1})
    t = p.add_node("tanh", [c.outputs[0]])
    p.mark_output(t.outputs[0])
    return p, [r.id, c.id, t.id]


@needs_gxx
@pytest.mark.parametrize("shape,op", [((4, 64, 8), "cumsum"), ((3, 37, 40), "cumprod"), ((2, 3000, 33), "cumsum"),
                                      ((5, 17, 3, 7), "cumsum")],
                         ids=["held", "held_cumprod", "streamed", "inner_of_two_dims"])
def test_a_scan_along_a_middle_dim_runs_down_the_columns_of_a_tile(shape, op):
    """Column tiles: 32 neighbouring positions per block, the thread rows take a chunk's elements in
    order and scan them through shared memory; the lone cumsum is the row graph's as well."""
    p, ids = strided(shape, op)
    ks = generate_multi_reduction(p, region_io(p, ids), "strided")
    assert ks.params["schedule"] == "column"
    _emulated(p, ids, ks)
    assert generate_kernel(p, [ids[1]], name="alone").params["schedule"] == "column"


def test_the_planner_groups_the_masked_and_the_reverse_scans_into_one_kernel():
    from agent_core.planner import plan_program
    for build in (masked, reverse):
        p, ids = build((64, 4096))
        plan = plan_program(p)
        kernels = [r for r in plan.active if r.schedule.get("runs") == "kernel"]
        assert len(kernels) == 1 and set(kernels[0].nodes) == set(ids), [r.nodes for r in plan.active]
