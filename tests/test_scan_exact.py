"""cumsum / cumprod kernels give the reference's bits (logcumsumexp's match it), and that is what a
chunked scan needs end to end.

The cause of KernelBench level-3 48/49 (Mamba2) failing end to end on the H200 while every region
verified alone: the scan kernel summed in float32 in its own association order (2 ulps off a
correctly rounded running sum), and the program takes exp of differences of those running sums and
adds terms up to 1e15 that cancel, so the output moved by 36x the tolerance. The scan now accumulates
in double and rounds each output once, and the reference scans float inputs in double on every device
(torch does on the CPU; on the GPU it scans in float32). Here, under the CPU emulator (g++, every
block and thread): each schedule gives exactly the reference's bits; the chunked scan (tests/
ssd_program.py) imported, rewritten and planned, with its scan kernels in place of torch's, verifies
end to end at atol = rtol = 1e-4, and the same kernels summing in float32 (the old form) do not.
GPU side: tests/gpu/test_gpu_segment_sum.py."""
import shutil

import numpy as np
import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.importers import import_nn_module
from agent_core.planner import apply_plan, plan_program
from agent_core.reference import parameter_tensors, run_node, run_reference
from agent_core.rewrites import rewrite_program
from agent_core.verify import compare
from tests.programs import scan_program
from tests.ssd_program import ChunkedScan, example_inputs

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def emulate(ks, env, program):
    """The kernel run once by the CPU emulator on env's tensors: its outputs, by value id."""
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import guarded, payload
    guard = 16
    call = [guarded(env[v].contiguous().numpy(), guard) for v in ks.inputs]
    call += [guarded(np.full(program.values[v].shape, 7, np.float32), guard) for v in ks.outputs]
    call += [guarded(np.zeros(n, np.float32 if dt == "float32" else np.uint32), guard) for dt, n in ks.workspace]
    res = CpuExecutor().run(ks, [call], guard=guard, timeout_s=120)[0]
    return {v: torch.from_numpy(payload(res[len(ks.inputs) + i], guard, np.float32,
                                        program.values[v].shape).copy()) for i, v in enumerate(ks.outputs)}


# warp (float4 and scalar), block, column: the row kernel's scan schedules
SCHEDULES = [((40, 64), -1, "warp"), ((6, 333), 1, "warp"), ((3, 5000), 1, "block"), ((3, 40, 64), 1, "column")]


@needs_gxx
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("shape,dim,schedule", SCHEDULES, ids=[s[2] + "-" + "x".join(map(str, s[0])) for s in SCHEDULES])
def test_scan_kernel_gives_the_reference_bits(op, shape, dim, schedule):
    p, nid = scan_program(op, shape, dim)
    ks = generate_kernel(p, [nid], name=f"exact_{op}")
    assert ks.params["schedule"] == schedule
    g = torch.Generator().manual_seed(3)
    # cumsum: large running sums with small steps (the last bits matter); cumprod: factors near 1
    x = (torch.randn(shape, generator=g) * 3 + 0.5) if op == "cumsum" else (1 + 0.05 * torch.randn(shape, generator=g))
    want = run_reference(p, [x])[p.values[p.outputs[0]].name]
    assert torch.equal(want, getattr(torch, op)(x.double(), dim=dim).float())   # the correctly rounded scan
    got = emulate(ks, {p.inputs[0]: x}, p)[p.outputs[0]]
    assert torch.equal(got, want), (got.double() - want.double()).abs().max()


@needs_gxx
@pytest.mark.parametrize("shape,dim,schedule", SCHEDULES, ids=[s[2] + "-" + "x".join(map(str, s[0])) for s in SCHEDULES])
def test_logcumsumexp_kernel_matches_torch_with_infinities_and_nan(shape, dim, schedule):
    """logcumsumexp scans with the log-sum-exp combine (rowscan.scan_lse, in double): every schedule
    matches torch's double scan rounded once, through -inf runs (a row starting with them, one all
    -inf), two +inf in a row and a NaN that poisons the rest of its row."""
    import torch.nn as nn
    p, nid = scan_program("logcumsumexp", shape, dim)
    ks = generate_kernel(p, [nid], name="exact_lcse")
    assert ks.params["schedule"] == schedule and "scan_lse" in ks.source
    g = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=g) * 4
    rows = x.movedim(dim, -1)            # a view: writes land in x
    rows[0, ..., :3] = float("-inf")
    rows[1, ...] = float("-inf")
    rows[2, ..., 5] = float("nan")
    rows[0, ..., 4:6] = float("inf")
    want = run_reference(p, [x])[p.values[p.outputs[0]].name]
    torch.testing.assert_close(want, torch.logcumsumexp(x.double(), dim=dim).float(), rtol=0, atol=0, equal_nan=True)
    got = emulate(ks, {p.inputs[0]: x}, p)[p.outputs[0]]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)

    class Lcse(nn.Module):
        def forward(self, t):
            return torch.logcumsumexp(t * 2, dim=dim)
    assert "logcumsumexp" in {n.op for n in import_nn_module(Lcse(), [x]).nodes.values()}


def _planned_scan(b, T, h, p, n, chunk):
    model = ChunkedScan(chunk)
    program = import_nn_module(model, example_inputs(b, T, h, p, n), name="chunked_scan")
    rr = rewrite_program(program)
    prog = rr.program
    plan = plan_program(prog)
    apply_plan(prog, plan)
    return model, program, prog, plan


def _end_to_end(prog, plan, inputs, kernels):
    """The program's outputs with the given regions' kernels (emulated) in place of their nodes."""
    from agent_core.program_runtime.steps import plan_steps
    steps, _ = plan_steps(prog, kernels)
    env = dict(parameter_tensors(prog))
    env.update(zip(prog.inputs, inputs))
    for s in steps:
        if s.kind == "kernel":
            env.update(emulate(s.kernel, env, prog))
        else:
            run_node(prog, s.nodes[0], env)
    return env[prog.outputs[0]]


@needs_gxx
def test_chunked_scan_verifies_end_to_end_with_its_scan_kernels():
    # KernelBench's chunk of 64 and sequence of 128; fewer batches, heads and channels
    model, program, prog, plan = _planned_scan(2, 128, 8, 16, 4, 64)
    scans = {}
    for r in plan.active:
        if any(prog.nodes[nid].op == "cumsum" for nid in r.nodes):
            ks = generate_kernel(prog, r.nodes, name=f"ssd_{r.id}")
            # the row graph's scan, alone or with its neighbours fused
            assert ks.kind == "row_reduction" and "_carry" in ks.source, ks.kind
            scans[r.id] = (r.nodes, ks)
    assert len(scans) >= 2, [prog.nodes[n].op for r in plan.active for n in r.nodes]
    inputs = example_inputs(2, 128, 8, 16, 4, seed=1)
    want = run_reference(program, inputs)
    (name, w), = want.items()
    with torch.no_grad():
        assert compare(program, program.outputs[0], model(*inputs), w)[0]    # the reference is torch
    assert w.abs().max() > 1e11     # the ill-conditioned regime: huge terms that cancel
    got = _end_to_end(prog, plan, inputs, scans)
    ok, max_abs, excess, why = compare(program, program.outputs[0], got, w)
    assert ok and max_abs == 0.0, why
    # the old form, float32 running sums in the kernel's own order: the same kernels fail end to end
    single = {rid: (nodes, _float_scan(ks)) for rid, (nodes, ks) in scans.items()}
    ok32, _, excess32, why32 = compare(program, program.outputs[0], _end_to_end(prog, plan, inputs, single), w)
    assert not ok32 and excess32 > 2, (excess32, why32)


def _float_scan(ks):
    import copy
    k = copy.copy(ks)
    k.source = ks.source.replace("double ", "float ").replace("(double)", "(float)")
    assert k.source != ks.source
    return k

