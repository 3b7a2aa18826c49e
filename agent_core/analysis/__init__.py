"""Whole-program analysis: dependencies, lifetimes and peak memory, per-node cost, roofline estimates."""
from .cost import (  # noqa: F401
    VIEW_OPS, GroupTraffic, NodeCost, ProgramEstimate, estimate_program, fmt_bytes, fmt_ms, group_traffic,
    is_view, node_cost, program_costs, roofline_ms, value_consumers,
)
from .deps import critical_path, dependency_graph, downstream, topological_order, upstream  # noqa: F401
from .gpu import H200, GPUProfile  # noqa: F401
from .liveness import Lifetime, lifetimes, parameter_bytes, peak_memory  # noqa: F401
from .summary import analyze  # noqa: F401,E402
