"""The end-to-end program's step list and its memory, checked on the CPU.

A fake launcher computes each kernel step's region with torch and writes it into the output the
executable allocates for it, so the step order, the release of every value after its last reader and
the memory plan are exercised as on the GPU.
"""
import weakref

import pytest
import torch

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.ir import Program
from agent_core.planner import apply_plan, plan_program
from agent_core.program_runtime import eager_peak_estimate, plan_steps
from agent_core.program_runtime import executable
from agent_core.program_runtime.executable import ProgramExecutable
from agent_core.reference import run_node


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


class TorchKernel:
    """A kernel step's region computed by torch on the CPU, into the outputs the executable allocates."""

    def __init__(self, program, ks):
        self.program, self.kernel = program, ks

    def __call__(self, ins, outs):
        env = dict(zip(self.kernel.inputs, ins))
        for nid in self.kernel.node_ids:
            run_node(self.program, nid, env)
        for v, o in zip(self.kernel.outputs, outs):
            o.copy_(env[v].reshape(o.shape))


@pytest.fixture
def torch_kernels(monkeypatch):
    """Kernels launch as TorchKernel; returns, per launch, how many earlier kernel outputs are alive."""
    made, alive = [], []

    def launch(loaded, ins, outs):
        alive.append(sum(1 for r in made if r() is not None))
        loaded(ins, outs)
        made.extend(weakref.ref(o) for o in outs)
    monkeypatch.setattr(executable, "raw_launch", launch)
    return alive


class FakeExecutable(ProgramExecutable):
    """`seen` records, before each step, the intermediates the run still holds."""

    def _launch(self, torch_mod, step, env, release):
        self._note(env)
        super()._launch(torch_mod, step, env, release)

    def _run_library(self, nid, env):
        if not any(nid in s.library_nodes for s in self.steps):
            self._note(env)
        super()._run_library(nid, env)

    def _note(self, env):
        held = {v for v in env if self.program.values[v].producer is not None}
        self.__dict__.setdefault("seen", []).append(held)


def _fused(program):
    apply_plan(program, plan_program(program))
    fused = {}
    for r in program.regions:
        try:
            ks = generate_kernel(program, r.nodes, name=f"k_{r.id}", kind=r.kind)
        except CodegenError:
            continue
        fused[r.id] = (list(r.nodes), ks, TorchKernel(program, ks))
    return fused


def test_steps_run_in_dependency_order_and_the_plan_counts_only_what_exists():
    p = _chain_program()
    fused = _fused(p)
    assert len(fused) >= 4
    steps, memory = plan_steps(p, {r: (n, ks) for r, (n, ks, _) in fused.items()})
    done = set(p.inputs) | {v.id for v in p.parameters()}
    for s in steps:
        for nid in s.nodes:
            ins = [v for v in p.nodes[nid].inputs if v]
            produced_here = {o for n in s.nodes for o in p.nodes[n].outputs}
            assert all(v in done or v in produced_here for v in ins), s.label(p)
        done |= {o for n in s.nodes for o in p.nodes[n].outputs}
    assert sum(1 for s in steps if s.kind == "kernel") == len(fused)
    # values inside a kernel never exist, and a library call's input goes as soon as it has run: two
    # values at a time, as in eager (each matmul's input and output)
    assert memory.predicted_peak_bytes == 2 * 8 * 64 * 4 == eager_peak_estimate(p), memory.to_dict()


def test_every_intermediate_is_released_after_its_last_reader(torch_kernels):
    p = _chain_program()
    exe = FakeExecutable(p, _fused(p), graph=False, device="cpu")
    res = exe.verify(draws=3)
    assert res.ok, res.reason
    s = exe.summary()
    assert s["generated_kernels"] >= 4 and not s["cuda_graph"]
    readers = {}
    for i, step in enumerate(exe.steps):
        for nid in step.nodes:
            for v in p.nodes[nid].inputs:
                if v:
                    readers[v] = i
    runs = [exe.seen[k:k + len(exe.steps)] for k in range(0, len(exe.seen), len(exe.steps))]
    assert len(runs) == 3
    for held in runs:
        for i, vids in enumerate(held):
            for v in vids - set(p.outputs):
                assert readers.get(v, -1) >= i, f"{p.values[v].name} held at step {i} after its last reader"
    assert max(len(h) for h in runs[0]) <= 2     # a chain: the value being read, maybe one more
    # each kernel's output is read only by the next step's matmul, and freed before that step's kernel
    n = exe.kernel_steps
    assert torch_kernels[:n] == [0] * n, torch_kernels      # later runs: the returned output of the last


def test_a_torch_view_of_a_kernel_output_keeps_its_memory_alive(torch_kernels):
    # transpose (run through torch) returns a view of a kernel's output, which the program returns
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
        ks = generate_kernel(p, nodes, name=f"k_{rid}")
        fused[rid] = (nodes, ks, TorchKernel(p, ks))
    exe = FakeExecutable(p, fused, graph=False, device="cpu")
    res = exe.verify(draws=2)
    assert res.ok, res.reason


def test_executable_without_kernels_runs_every_node_through_torch():
    p = _chain_program()
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")
    assert exe.kernel_steps == 0
    # every node through torch: the plan's peak is eager's, estimated the same way
    assert exe.memory.predicted_peak_bytes == eager_peak_estimate(p)
    assert exe.verify(draws=2).ok
    x = torch.randn(8, 64)
    out = exe(x)
    assert out[0].shape == (64, 8)


def test_a_slice_only_a_library_call_reads_runs_as_a_strided_view_with_no_kernel():
    # an LSTM-style last step into a classifier: out[:, -1, :] -> linear. torch slices without a copy
    # and cuBLAS reads the rows through their stride, so neither the plan nor the run copies it
    from agent_core.agent.region_kinds import without_kernel
    p = Program("last_step")
    x = p.add_input("x", [4, 16, 32]).id
    w = p.add_parameter("w", shape=[8, 32]).id
    last = p.add_node("select", [x], {"dim": 1, "index": -1}).outputs[0]
    out = p.add_node("linear", [last, w]).outputs[0]
    p.mark_output(out)
    plan = plan_program(p)
    (sliced,) = [r for r in plan.regions if "select" in [p.nodes[n].op for n in r.nodes]]
    assert sliced.schedule["runs"] == "strided_view" and sliced.schedule["launches"] == 0
    assert "strided view" in sliced.reason and plan.kernels == 1          # the linear alone
    apply_plan(p, plan)
    assert without_kernel(p, sliced.nodes)[0] == "strided_view"
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")
    assert exe.launches == 1 and exe.verify(draws=2).ok
    assert exe.memory.predicted_peak_bytes == 512            # the linear's output (one 512-byte block); the slice holds none
    # read by a generated kernel instead (a relu), it is copied as before
    q = Program("last_step_relu")
    x = q.add_input("x", [4, 16, 32]).id
    last = q.add_node("select", [x], {"dim": 1, "index": -1}).outputs[0]
    q.mark_output(q.add_node("relu", [last]).outputs[0])
    assert all(r.schedule["runs"] != "strided_view" for r in plan_program(q).regions)
