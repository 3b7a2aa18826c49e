"""The step list of an end-to-end program: regions that run as one generated kernel, and every other
node run through its torch implementation (library calls included), in a topological order of the
steps, with the arena slots of the values kernels write.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.cost import is_view
from ..analysis.liveness import lifetimes
from ..ir import Program
from ..planner.execute import region_order
from .arena import ArenaPlan
from .library_memory import plan_library_memory


@dataclass
class Step:
    kind: str                       # "kernel" (generated, maybe after library nodes) or "torch" (one node)
    nodes: list[str]                # in topological order
    region: str | None = None
    kernel: object | None = None    # codegen.KernelSource of a kernel step
    loaded: object | None = None    # runtime.launch.LoadedKernel (GPU only)
    library_nodes: list[str] = field(default_factory=list)
    view: bool = False              # a torch step that only relabels memory (no kernel runs)

    @property
    def writes(self) -> list[str]:
        return list(self.kernel.outputs) if self.kind == "kernel" else []

    def label(self, program: Program) -> str:
        if self.kind == "kernel":
            return f"{self.kernel.name} ({self.kernel.kind}" + (", after " + ", ".join(
                program.nodes[n].op for n in self.library_nodes) if self.library_nodes else "") + ")"
        n = program.nodes[self.nodes[0]]
        return f"{n.name} ({n.op}, torch)"


def plan_steps(program: Program, fused: dict[str, tuple[list[str], object]],
               memory_budget: int | None = None) -> tuple[list[Step], ArenaPlan]:
    """fused: region id -> (its node ids, its KernelSource). Returns the steps in execution order and
    the arena plan of the values the kernels write, the library calls' outputs and split temporaries
    (library_memory; its decisions in plan.memory, within memory_budget bytes or eager's estimate)."""
    order_all = program.topo_order()
    pos = {n: i for i, n in enumerate(order_all)}
    steps: list[Step] = []
    covered: set[str] = set()
    for rid, (nodes, ks) in fused.items():
        nodes = sorted(nodes, key=pos.__getitem__)
        steps.append(Step("kernel", nodes, region=rid, kernel=ks, library_nodes=list(ks.library_nodes)))
        covered.update(nodes)
    for n in order_all:
        if n not in covered:
            steps.append(Step("torch", [n], view=is_view(program, n)))
    idx = region_order(program, [s.nodes for s in steps])
    steps = [steps[i] for i in idx]
    node_order = [n for s in steps for n in s.nodes]
    step_of = {n: i for i, s in enumerate(steps) for n in s.nodes}
    life = lifetimes(program, node_order)
    n_nodes = len(node_order)
    # a view of a kernel output extends the kernel output's lifetime (folded by lifetimes())
    values = {}
    for s in steps:
        for v in s.writes:
            lt = life.get(v)
            start = step_of[program.producer(v).id]
            end = len(steps) if lt is None or lt.end >= n_nodes else step_of[node_order[lt.end]]
            values[v] = (program.values[v].nbytes, start, max(start, end))
    memory = plan_library_memory(program, steps, values, memory_budget)
    memory.arena.memory = memory
    return steps, memory.arena
