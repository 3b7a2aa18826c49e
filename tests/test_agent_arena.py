"""The end-to-end program's step list and memory arena, checked on the CPU.

A fake launcher computes each kernel step's region with torch and writes it into its arena views, so
the step order, the slot lifetimes and the memory reuse are exercised exactly as on the GPU.
"""
import pytest
import torch

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.ir import Program
from agent_core.planner import apply_plan, plan_program
from agent_core.program_runtime import check_arena, plan_arena, plan_steps
from agent_core.program_runtime.executable import ProgramExecutable
from agent_core.reference import run_node


def test_plan_arena_reuses_memory_of_dead_values():
    # a chain: each value dies when the next is written, so two slots suffice
    values = {f"v{i}": (1000, i, i + 1) for i in range(6)}
    plan = plan_arena(values)
    assert check_arena(plan) == []
    assert plan.total_bytes == 2 * 1024 < plan.naive_bytes == 6 * 1024
    assert all(s.offset % 256 == 0 for s in plan.slots.values())


def test_plan_arena_never_overlaps_live_values_random():
    import random
    rng = random.Random(7)
    for _ in range(50):
        values = {}
        for i in range(rng.randint(1, 30)):
            s = rng.randint(0, 20)
            values[f"v{i}"] = (rng.choice([4, 100, 4096, 10000]), s, s + rng.randint(0, 6))
        plan = plan_arena(values)
        assert check_arena(plan) == []
        # never more than one buffer per value, never less than the peak of live bytes
        peak = max(sum(-(-n // 256) * 256 for n, a, b in values.values() if a <= t <= b) for t in range(30))
        assert peak <= plan.total_bytes <= plan.naive_bytes


def test_plan_arena_refuses_inverted_lifetime():
    with pytest.raises(ValueError, match="ends .* before it starts"):
        plan_arena({"v": (4, 3, 1)})


def _chain_program():
    p = Program("chain")
    x = p.add_input("x", [8, 64]).id
    w = p.add_parameter("w", shape=[64, 64]).id
    h = x
    for i in range(4):
        h = p.add_node("matmul", [h, w]).outputs[0]
        h = p.add_node("relu", [h]).outputs[0]
        h = p.add_node("mul", [h, h]).outputs[0]
        h = p.add_node("tanh", [h]).outputs[0]
    t = p.add_node("transpose", [h], {"dim0": 0, "dim1": 1}).outputs[0]
    out = p.add_node("sigmoid", [t]).outputs[0]
    p.mark_output(out)
    return p


class FakeExecutable(ProgramExecutable):
    """Kernel steps run their nodes through torch on the CPU and write the arena views."""

    def _launch(self, torch_mod, step, env):
        local = dict(env)
        for nid in step.nodes:
            run_node(self.program, nid, local)
        for v in step.kernel.outputs:
            self.views[v].copy_(local[v].reshape(self.views[v].shape))
            env[v] = self.views[v]


def _fused(program):
    apply_plan(program, plan_program(program))
    fused = {}
    for r in program.regions:
        try:
            ks = generate_kernel(program, r.nodes, name=f"k_{r.id}", kind=r.kind)
        except CodegenError:
            continue
        fused[r.id] = (list(r.nodes), ks, None)
    return fused


def test_steps_run_in_dependency_order_and_arena_reuses_memory():
    p = _chain_program()
    fused = _fused(p)
    assert len(fused) >= 4
    steps, arena = plan_steps(p, {r: (n, ks) for r, (n, ks, _) in fused.items()})
    done = set(p.inputs) | {v.id for v in p.parameters()}
    for s in steps:
        for nid in s.nodes:
            ins = [v for v in p.nodes[nid].inputs if v]
            produced_here = {o for n in s.nodes for o in p.nodes[n].outputs}
            assert all(v in done or v in produced_here for v in ins), s.label(p)
        done |= {o for n in s.nodes for o in p.nodes[n].outputs}
    assert check_arena(arena) == []
    assert arena.total_bytes < arena.naive_bytes          # dead kernel outputs gave their memory back
    assert sum(1 for s in steps if s.kind == "kernel") == len(fused)


def test_fake_executable_matches_the_reference_with_memory_reuse():
    p = _chain_program()
    exe = FakeExecutable(p, _fused(p), graph=False, device="cpu")
    res = exe.verify(draws=3)
    assert res.ok, res.reason
    s = exe.summary()
    assert s["generated_kernels"] >= 4 and not s["cuda_graph"]
    assert s["arena_bytes"] < s["arena_naive_bytes"]


def test_torch_view_of_an_arena_value_is_copied_before_its_slot_is_reused():
    # transpose (run through torch) returns a view into the arena; later kernels reuse that slot
    p = Program("alias")
    x = p.add_input("x", [16, 32]).id
    a = p.add_node("relu", [x]).outputs[0]
    t = p.add_node("transpose", [a], {"dim0": 0, "dim1": 1}).outputs[0]
    b = p.add_node("neg", [t]).outputs[0]
    c = p.add_node("exp", [b]).outputs[0]
    d = p.add_node("sin", [c]).outputs[0]
    p.mark_output(t)
    p.mark_output(d)
    fused = {}
    for rid, nodes in (("ra", [p.producer(a).id]), ("rb", [p.producer(b).id]), ("rc", [p.producer(c).id]),
                       ("rd", [p.producer(d).id])):
        fused[rid] = (nodes, generate_kernel(p, nodes, name=f"k_{rid}"), None)
    exe = FakeExecutable(p, fused, graph=False, device="cpu")
    res = exe.verify(draws=2)
    assert res.ok, res.reason
    assert check_arena(exe.arena_plan) == []


def test_executable_without_kernels_runs_every_node_through_torch():
    p = _chain_program()
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")
    # the arena holds only the matmuls' outputs (torch's out=), whose lifetimes never overlap: one slot
    assert exe.kernel_steps == 0 and exe.arena_plan.total_bytes == 8 * 64 * 4
    assert set(exe.arena_plan.memory.kinds.values()) == {"library output"}
    assert exe.verify(draws=2).ok
    x = torch.randn(8, 64)
    out = exe(x)
    assert out[0].shape == (64, 8)
