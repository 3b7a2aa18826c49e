"""One truth for the planner and the generator: every region the planner proposes generates.

The planner asks codegen (`codegen.can_lower`) before each merge. Here every bundled example (as
imported, and after the rewrites that write losses and attention out as the ops they are) and every
program of tests/programs.py is planned; each active region must be what it says it is
(schedule["runs"]): a generated kernel or a library call plus its epilogue kernel generates and
compiles with NVRTC for sm_90, a node said to run through torch has no generator, a library call is
one matmul / convolution, an alias is views only. Zero "proposed but not generated".

The estimate costs the kernel that runs: a matmul epilogue region is the cuBLAS call plus the epilogue
kernel that reads its output back, and its launch count and estimate match the export's schedule.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent_core.analysis.cost import is_view, library_reads_as_view, program_costs
from agent_core.analysis.gpu import H200
from agent_core.codegen import CodegenError, can_lower, generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.export.steps import build_schedule
from agent_core.importers import import_file
from agent_core.ir import Program
from agent_core.planner import apply_plan, plan_program
from agent_core.regions import draw_region
from agent_core.rewrites import rewrite_program

import programs as P

EXAMPLES = sorted(p for p in (Path(__file__).resolve().parent.parent / "resources" / "examples").glob("*.py")
                  if not p.name.startswith("_"))
GENERATED = ("kernel", "library+kernel")


@pytest.fixture(scope="module")
def planned():
    """[(label, program with its plan applied, plan)] for every example, as imported and rewritten."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = []
    try:
        for path in EXAMPLES:
            prog = import_file(path)
            for label, p in ((path.stem, prog), (f"{path.stem} (rewritten)", rewrite_program(prog, check=False).program)):
                plan = plan_program(p)
                apply_plan(p, plan)
                out.append((label, p, plan))
    finally:
        torch.set_num_threads(before)
    return out


def _test_programs() -> list[tuple[str, Program]]:
    """Every program builder of tests/programs.py, over the cases the codegen tests use."""
    progs = []
    for op, attrs in [("softmax", {"dim": -1}), ("log_softmax", {"dim": 1}), ("layer_norm", {}), ("rms_norm", {}),
                      ("logsumexp", {"dim": [1]}), ("sum", {"dim": [1]}), ("mean", {"dim": [0]}),
                      ("max", {"dim": [1], "keepdim": True}), ("var", {"dim": [1]}), ("std", {"dim": [1]})]:
        for shape in [(64, 1000), (8, 40000)]:
            progs.append((f"stitched {op} {shape}", P.stitched(op, attrs, shape)[0]))
    progs.append(("stitched softmax without prologue", P.stitched("softmax", {"dim": -1}, (33, 7), prologue=False)[0]))
    for op, attrs in [("max_pool2d", {"kernel_size": [3], "stride": [2], "padding": [1]}),
                      ("avg_pool2d", {"kernel_size": [2]})]:
        progs.append((f"pooled {op}", P.pooled(op, attrs, (2, 3, 17, 17))[0]))
    for op, shape, size in P.ADAPTIVE_CASES:
        progs.append((f"pooled {op} {shape}", P.pooled(op, {"output_size": size}, shape)[0]))
    for op in ("argmax", "argmin"):
        progs.append((op, P.arg_program(op, (64, 1000), 1)[0]))
    for op in ("cumsum", "cumprod"):
        progs.append((op, P.scan_program(op, (64, 1000), 1)[0]))
    for reduction in ("none", "sum", "mean"):
        progs.append((f"nll {reduction}", P.nll_program((32, 10), reduction, weight=True)[0]))
    for case in P.SLICE_CASES + P.SLICE_BOUNDS_CASES:
        for around in (False, True):
            progs.append((f"slice {case} around={around}", P.sliced(*case, around=around)[0]))
    return progs


@pytest.fixture(scope="module")
def planned_test_programs():
    out = []
    for label, p in _test_programs():
        plan = plan_program(p)      # a builder's program the planner refuses would raise here
        apply_plan(p, plan)
        out.append((label, p, plan))
    return out


def _check_region(label, p, r, kernels):
    """The region is what schedule["runs"] says; a generated one is added to `kernels`."""
    runs = r.schedule["runs"]
    real = [n for n in r.nodes if not is_view(p, n)]
    where = f"{label}: region {r.id} ({r.kind}, {[p.nodes[n].op for n in r.nodes]}, runs {runs})"
    if runs == "alias":
        assert not real, where
        return
    if runs == "library":
        assert len(real) == 1 and p.nodes[real[0]].opdef.category in ("matmul", "convolution"), where
        return
    if runs == "strided_view":          # torch's view, which only library calls read
        assert len(real) == 1 and library_reads_as_view(p, real[0]) and r.schedule["launches"] == 0, where
        return
    try:
        ks = generate_kernel(p, r.nodes, name=f"r_{len(kernels)}", kind=r.kind)
    except CodegenError as exc:
        assert runs == "torch", f"{where}: proposed but not generated: {exc}"
        assert len(real) == 1 and "runs through torch" in r.reason, where
        return
    assert runs in GENERATED, f"{where}: said to run through torch, yet it generates"
    assert bool(ks.library_nodes) == (runs == "library+kernel"), where
    assert r.schedule["launches"] == 1 + len(ks.library_nodes), where
    kernels.append(ks)


def _check_all(planned_programs):
    kernels, counts = [], {}
    for label, p, plan in planned_programs:
        for r in plan.active:
            counts[r.schedule["runs"]] = counts.get(r.schedule["runs"], 0) + 1
            _check_region(label, p, r, kernels)
        assert plan.kernels == sum(r.schedule["launches"] for r in plan.active)
    return kernels, counts


def _compile_sample(kernels):
    """Compile one kernel of each generator, schedule and library split (every kernel of the examples
    is compiled with nvcc by tests/test_codegen_clean.py; a cold NVRTC run of all of them here would
    cost minutes on a shared CI machine)."""
    sample = {}
    for ks in kernels:
        sample.setdefault((ks.kind, ks.schedule, bool(ks.library_nodes)), ks)
    for ks in sample.values():
        compile_kernel(ks, arch="sm_90")     # CompileError names the region and the line
    return len(sample)


def test_every_proposed_example_region_generates_and_compiles(planned):
    kernels, counts = _check_all(planned)
    # the examples hold every kind of region: most generate, a few are library calls or views
    assert counts["kernel"] > 80 and counts["library+kernel"] > 20 and counts["library"] > 10, counts
    assert _compile_sample(kernels) > 20


def test_every_proposed_test_program_region_generates_and_compiles(planned_test_programs):
    kernels, counts = _check_all(planned_test_programs)
    assert counts.get("kernel", 0) >= len(planned_test_programs), counts
    assert _compile_sample(kernels) > 10


def _softmax_written_out(rows=4096, cols=1000):
    p = Program("softmax_written_out")
    x = p.add_input("x", (rows, cols))
    m = p.add_node("max", [x.id], {"dim": [1], "keepdim": True})
    sub = p.add_node("sub", [x.id, m.outputs[0]])
    e = p.add_node("exp", [sub.outputs[0]])
    s = p.add_node("sum", [e.outputs[0]], {"dim": [1], "keepdim": True})
    d = p.add_node("div", [e.outputs[0], s.outputs[0]])
    p.mark_output(d.outputs[0])
    return p, [m.id, sub.id, e.id, s.id, d.id]


def test_written_out_softmax_is_not_proposed_as_a_region_codegen_refuses():
    p, ids = _softmax_written_out()
    whole = can_lower(p, ids, "reduction")
    plan = plan_program(p)
    kernels = []
    for r in plan.active:
        _check_region("softmax", p, r, kernels)
        assert r.schedule["runs"] == "kernel"
    assert len(kernels) == len(plan.active)
    if whole is None:       # once the generator stitches two reductions, the plan is one kernel
        assert len(plan.active) == 1
        return
    # the generator refuses two reductions in one kernel: the plan keeps them apart and says why
    assert len(plan.active) == 2
    assert all(len({ids[0], ids[3]} & set(r.nodes)) == 1 for r in plan.active)
    for r in plan.active:
        assert "Not fused with" in r.reason and "the generator has no kernel for them together" in r.reason
        assert whole in r.reason       # the generator's own words, naming the two reductions
    assert "max (max), sum (sum)" in whole or ("max" in whole and "sum" in whole)
    # each region's estimate is for its own kernel: the two of them do not claim the fused saving
    assert plan.estimate.planned_ms == pytest.approx(sum(r.est_after_ms for r in plan.active))
    assert plan.kernels == 2


def _roofline(bytes_moved, flops, gpu=H200):
    return gpu.launch_ms(True) + max(bytes_moved / gpu.bytes_per_ms, flops / gpu.flops_per_ms)


def _linear_program(epilogue):
    p = Program("linear_epilogue")
    x = p.add_input("x", (512, 1024))
    w = p.add_parameter("w", shape=(2048, 1024))
    b = p.add_parameter("b", shape=(2048,))
    lin = p.add_node("linear", [x.id, w.id])
    v = p.add_node("add", [lin.outputs[0], b.id]).outputs[0]
    for op, attrs in epilogue:
        v = p.add_node(op, [v], attrs).outputs[0]
    p.mark_output(v)
    return p, lin.id


def test_a_softmax_wider_than_the_tile_gemm_holds_gets_its_own_row_kernel():
    """Rows of 2048 are more than a CTA of the tile GEMM normalises in its accumulators: with the
    softmax the region would run as cuBLAS's fp32 + an epilogue kernel, slower than the tile GEMM
    without it, so the planner leaves the softmax (and the scale after it) to a row kernel and says why."""
    p, lin = _linear_program([("softmax", {"dim": -1}), ("mul_scalar", {"value": 2.0})])
    plan = plan_program(p)
    (gemm,) = [r for r in plan.active if lin in r.nodes]
    assert sorted(p.nodes[n].op for n in gemm.nodes) == ["add", "linear"]
    (rows,) = [r for r in plan.active if r is not gemm]
    assert sorted(p.nodes[n].op for n in rows.nodes) == ["mul_scalar", "softmax"] and rows.kind == "reduction"
    refused = [e["message"] for e in plan.log if e["action"] == "refused"]
    assert any(m.startswith("the tile GEMM would not take them together (softmax (softmax) normalises rows "
                            "of 2048") for m in refused), refused


@pytest.mark.parametrize("epilogue", [[("gelu", {})], [("relu", {}), ("mul_scalar", {"value": 2.0})]],
                         ids=["bias_gelu", "bias_relu_scale"])
def test_matmul_epilogue_estimate_and_launches_match_the_export_schedule(epilogue):
    p, lin = _linear_program(epilogue)
    plan = plan_program(p)
    (r,) = [r for r in plan.active if lin in r.nodes]
    assert r.kind == "matmul_epilogue" and r.schedule["runs"] == "library+kernel"
    assert r.reason.startswith("cuBLAS + epilogue kernel (2 launches)")
    assert "saves" in r.reason and f"saves {len(r.nodes) - 2} launch" in r.reason
    apply_plan(p, plan)
    steps = [s for s in build_schedule(p).steps if s.region_id == r.id]
    assert [s.kind for s in steps] == ["gemm", "kernel"] and r.schedule["launches"] == len(steps)
    assert plan.kernels == len(build_schedule(p).steps)
    # the estimate is the export's two launches on the same roofline: cuBLAS reads x and w and writes
    # its output; the epilogue kernel reads that output back (plus the bias) and writes the result
    costs = program_costs(p)
    vbytes = {v: p.values[v].nbytes for v in p.values}
    gemm, kernel = steps
    gemm_ms = _roofline(sum(vbytes[v] for v in gemm.reads + gemm.writes), costs[lin].flops)
    assert p.nodes[lin].outputs[0] in kernel.kernel.inputs
    epi_flops = sum(costs[n].flops for n in kernel.node_ids)
    kernel_ms = _roofline(kernel.kernel.bytes_moved, epi_flops)
    forms = r.schedule["forms_est_ms"]
    assert forms["library+kernel"] == pytest.approx(gemm_ms + kernel_ms, rel=1e-3)
    # the region costs the faster of the forms the agent times: this compute-bound GEMM as the tile
    # GEMM, its FLOPs at the split TF32 rate (the epilogue's few FLOPs besides), the output stored once
    tile_ms = _roofline(0, costs[lin].flops * H200.fp32_tflops / H200.split_tf32_tflops)
    assert forms["gemm-3xtf32"] == pytest.approx(tile_ms, rel=1e-2) and tile_ms < gemm_ms
    assert r.est_after_ms == pytest.approx(min(gemm_ms + kernel_ms, forms["gemm-3xtf32"]), rel=1e-3)
    assert kernel.kernel.bytes_moved == sum(vbytes[v] for v in kernel.reads + kernel.writes)


def test_an_epilogue_split_from_its_compute_bound_matmul_costs_its_round_trip():
    """Fused, the epilogue runs before the tile GEMM's only store; split off by the user, the matmul alone
    is the tile GEMM writing its output and the epilogue a kernel reading it back: the plan costs that."""
    p, lin = _linear_program([("relu", {})])
    plan = plan_program(p)
    (r,) = plan.active
    add_relu = [n for n in r.nodes if n != lin]
    q, lin_q = _linear_program([("relu", {})])
    draw_region(q, [lin_q])          # the user's split: the call alone, the epilogue alone
    draw_region(q, add_relu)
    split = plan_program(q)
    out = p.values[p.nodes[lin].outputs[0]].nbytes
    assert r.est_after_ms == pytest.approx(r.schedule["forms_est_ms"]["gemm-3xtf32"], rel=1e-6)
    # the split pays the output's round trip (written, read back, the result written) and a launch
    round_trip = H200.launch_ms(True) + 2 * out / H200.bytes_per_ms
    assert sum(x.est_after_ms for x in split.active) == pytest.approx(r.est_after_ms + round_trip, rel=0.05)
    assert split.estimate.planned_ms > plan.estimate.planned_ms


def test_a_library_call_with_views_after_it_runs_as_planned_not_as_a_refused_kernel():
    """The planner keeps a bmm and the reshape of its output as one library region (Mamba2's chunked
    scan, ShuffleNet's channel shuffle): the agent runs it as the library call, with no kernel to
    generate, instead of failing to generate a kernel for the reshape (a fallback at 18ac8e7)."""
    import io

    from agent_core.agent import EventEmitter, optimize
    from agent_core.importers import import_nn_module

    class BmmReshape(torch.nn.Module):
        def forward(self, a, b, c):
            return torch.matmul(torch.bmm(a, b).reshape(4, 64 * 32), c)
    torch.manual_seed(0)
    p = import_nn_module(BmmReshape(), [torch.randn(4, 64, 16), torch.randn(4, 16, 32), torch.randn(2048, 8)])
    res = optimize(p, device="cpu", emit=EventEmitter(io.StringIO()))
    first = res.outcomes[0]
    ops = [res.program.nodes[n].op for r in res.program.regions if r.id == first.region for n in r.nodes]
    assert ops == ["bmm", "reshape"]
    assert first.status == "library" and "views around it only relabel memory" in first.reason, first.reason
    assert not [o for o in res.outcomes if o.status == "fallback"]
