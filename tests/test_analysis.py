"""Analysis: cost model, roofline estimates, lifetimes and peak memory."""
import pytest

from agent_core.analysis import (
    H200, GPUProfile, analyze, critical_path, estimate_program, lifetimes, node_cost, peak_memory,
    roofline_ms, topological_order,
)
from agent_core.ir import Program


def mlp():
    p = Program()
    x = p.add_input("x", (1024, 1024))
    w = p.add_parameter("w", shape=(1024, 1024))
    lin = p.add_node("linear", [x.id, w.id])
    g = p.add_node("gelu", [lin.outputs[0]])
    r = p.add_node("reshape", [g.outputs[0]], {"shape": [1024 * 1024]})
    s = p.add_node("tanh", [r.outputs[0]])
    p.mark_output(s.outputs[0])
    return p, lin, g, r, s


def test_node_cost_bytes_flops_intensity():
    p, lin, g, r, s = mlp()
    c = node_cost(p, lin.id)
    mb4 = 1024 * 1024 * 4
    assert (c.bytes_read, c.bytes_written) == (2 * mb4, mb4)
    assert c.flops == 2 * 1024 ** 3
    assert c.intensity == pytest.approx(c.flops / (3 * mb4))
    assert c.bound(H200) == "compute"
    assert node_cost(p, g.id).bound(H200) == "memory"
    v = node_cost(p, r.id)
    assert v.view and v.bytes == 0 and v.time_ms() == 0.0


def test_roofline_uses_the_profile():
    # 4.2 GB at 4.2 TB/s is 1 ms, plus one 0.5 us graph launch (6 us from Python)
    assert roofline_ms(4.2e9, 0, 1, H200, graph=True) == pytest.approx(1.0005)
    assert roofline_ms(4.2e9, 0, 1, H200, graph=False) == pytest.approx(1.006)
    assert roofline_ms(0, 51e9, 0, H200) == pytest.approx(1.0)
    slow = GPUProfile(name="half", bandwidth_gbs=2100.0)
    assert roofline_ms(4.2e9, 0, 0, slow) == pytest.approx(2.0)
    assert GPUProfile.from_dict(slow.to_dict()) == slow


def test_program_estimate_unfused_planned_floor():
    p, lin, g, r, s = mlp()
    est = estimate_program(p, regions=[[lin.id, g.id, r.id, s.id]])
    assert est.kernels_unfused == 3 and est.kernels_planned == 1
    assert est.floor_ms <= est.planned_ms < est.unfused_ms
    assert est.bytes_planned == est.bytes_floor  # one kernel: reads x and w, writes the output


def test_lifetimes_and_peak_memory_follow_the_schedule():
    p = Program()
    x = p.add_input("x", (1000,))            # 4 KB each
    a = p.add_node("relu", [x.id])
    b = p.add_node("exp", [x.id])
    c = p.add_node("add", [a.outputs[0], b.outputs[0]])
    d = p.add_node("neg", [c.outputs[0]])
    p.mark_output(d.outputs[0])
    lt = lifetimes(p)
    assert (lt[x.id].start, lt[x.id].end) == (-1, 1)
    assert (lt[a.outputs[0]].start, lt[a.outputs[0]].end) == (0, 2)
    assert lt[d.outputs[0]].end == 4
    peak, step = peak_memory(p)
    assert peak == 3 * 4000 and step in (1, 2)   # x, a, b live together (or a, b, c)
    with pytest.raises(ValueError, match="every node once"):
        lifetimes(p, [a.id])


def test_views_share_their_buffer():
    p, lin, g, r, s = mlp()
    lt = lifetimes(p)
    assert r.outputs[0] not in lt and lt[g.outputs[0]].end == 3   # the reshape extends gelu's buffer


def test_order_critical_path_and_summary():
    p, lin, g, r, s = mlp()
    assert topological_order(p) == [lin.id, g.id, r.id, s.id]
    w = {lin.id: 3.0, g.id: 1.0, r.id: 0.0, s.id: 1.0}
    assert critical_path(p, w) == (5.0, [lin.id, g.id, r.id, s.id])
    a = analyze(p)
    assert a["nodes"] == 4 and a["by_category"]["matmul"] == 1 and a["floor_ms"] <= a["unfused_ms"]


def test_the_floor_counts_matmul_flops_at_split_tf32s_rate():
    """A compute-bound matmul's floor is its FLOPs at the fp32-accurate tensor-core rate the tile GEMM
    runs (not fp32's, which the tile GEMM beats: a plan would sit below its own floor); the pointwise
    op after it counts at fp32's."""
    p = Program("gemm")
    a, b = p.add_input("a", (4096, 4096)), p.add_input("b", (4096, 4096))
    m = p.add_node("matmul", [a.id, b.id])
    p.mark_output(p.add_node("relu", [m.outputs[0]]).outputs[0])
    est = estimate_program(p)
    mm = p.node_flops(m.id)
    assert est.floor_ms == pytest.approx(mm / H200.split_tf32_flops_per_ms + (est.flops - mm) / H200.flops_per_ms)
    assert est.floor_ms < mm / H200.flops_per_ms
