"""The step list of an end-to-end program: regions that run as one generated kernel, and every other
node run through its torch implementation (library calls included), in a topological order of the
steps, with its memory plan (memory_plan: the predicted peak and the split-TF32 decisions).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.cost import is_view, library_reads_as_view
from ..ir import Program
from ..planner.execute import region_order
from .memory_plan import MemoryPlan, plan_memory


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

    def events(self, program: Program) -> list[tuple[list[str], list[str]]]:
        """(values read, values written) of each thing the step runs, in order: its library calls,
        then its kernel; a torch step's one node. Values inside a kernel are in none of them."""
        out = []
        for nid in self.library_nodes if self.kind == "kernel" else self.nodes:
            node = program.nodes[nid]
            out.append(([v for v in node.inputs if v], [v for v in node.outputs if v]))
        if self.kind == "kernel":
            out.append((list(self.kernel.inputs), list(self.kernel.outputs)))
        return out

    def label(self, program: Program) -> str:
        if self.kind == "kernel":
            return f"{self.kernel.name} ({self.kernel.kind}" + (", after " + ", ".join(
                program.nodes[n].op for n in self.library_nodes) if self.library_nodes else "") + ")"
        n = program.nodes[self.nodes[0]]
        return f"{n.name} ({n.op}, torch)"


def plan_steps(program: Program, fused: dict[str, tuple[list[str], object]],
               memory_budget: int | None = None) -> tuple[list[Step], MemoryPlan]:
    """fused: region id -> (its node ids, its KernelSource). Returns the steps in execution order and
    their memory plan (within memory_budget bytes, or the program's, or eager's estimated peak)."""
    pos = {n: i for i, n in enumerate(program.topo_order())}
    kernels = [Step("kernel", sorted(nodes, key=pos.__getitem__), region=rid, kernel=ks,
                    library_nodes=list(ks.library_nodes)) for rid, (nodes, ks) in fused.items()]
    steps = _with_torch_steps(program, kernels)
    return steps, plan_memory(program, steps, memory_budget)


def _with_torch_steps(program: Program, kernels: list[Step]) -> list[Step]:
    """The kernel steps and one torch step per node they leave out, in a topological order of steps."""
    covered = {n for s in kernels for n in s.nodes}
    steps = kernels + [Step("torch", [n], view=is_view(program, n) or library_reads_as_view(program, n))
                       for n in program.topo_order() if n not in covered]
    return [steps[i] for i in region_order(program, [s.nodes for s in steps])]


def planned_steps(program: Program, regions) -> list[Step]:
    """The steps the planned regions would make if every one were kept as a kernel (before any is
    generated: a region's kernel reads its inputs and writes its outputs, after its library call), for
    memory decisions made before codegen. A region codegen would refuse runs its nodes through torch."""
    from types import SimpleNamespace

    from ..codegen import CodegenError, region_kind, split_library
    from ..codegen.region_io import region_io
    kernels = []
    for r in regions:
        if len(r.nodes) < 2:
            continue
        try:
            io = region_io(program, r.nodes)
            lib = split_library(program, io)[0]
            rest = [n for n in io.nodes if n not in lib]
            kind = region_kind(program, region_io(program, rest))   # pointwise or not, as codegen will see it
        except CodegenError:
            continue
        kernel = SimpleNamespace(inputs=list(io.inputs), outputs=list(io.outputs), library_nodes=lib, kind=kind)
        kernels.append(Step("kernel", list(io.nodes), region=r.id, kernel=kernel, library_nodes=lib))
    return _with_torch_steps(program, kernels)
