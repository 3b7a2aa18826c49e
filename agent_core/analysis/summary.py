"""One summary of a program for the agent's 'perceive' step and the CLI."""
from __future__ import annotations

from ..ir import Program
from .cost import estimate_program, program_costs
from .gpu import H200, GPUProfile
from .liveness import parameter_bytes, peak_memory


def analyze(program: Program, gpu: GPUProfile = H200) -> dict:
    """Counts, bytes, FLOPs, peak memory of the default schedule and the roofline estimates."""
    order = program.topo_order()
    costs = program_costs(program)
    est = estimate_program(program, gpu=gpu)
    peak, at = peak_memory(program, order)
    by_cat: dict[str, int] = {}
    for n in program.nodes.values():
        by_cat[n.opdef.category] = by_cat.get(n.opdef.category, 0) + 1
    mem_bound = sum(1 for c in costs.values() if not c.view and c.bound(gpu) == "memory")
    return {
        "nodes": len(program.nodes), "by_category": by_cat, "flops": est.flops,
        "bytes_unfused": est.bytes_unfused, "bytes_floor": est.bytes_floor,
        "parameter_bytes": parameter_bytes(program), "peak_activation_bytes": peak,
        "peak_step": at, "memory_bound_nodes": mem_bound,
        "unfused_ms": est.unfused_ms, "unfused_eager_ms": est.unfused_eager_ms, "floor_ms": est.floor_ms,
        "gpu": gpu.name,
    }
