"""Running a program region by region through the reference interpreter.

This is how a plan is proven schedulable: regions run in a topological order of the region graph, each
one only sees the values computed by earlier regions (or inside itself), and only the values used
outside a region leave it. A missing value means the plan has a cycle or a region depends on itself.
"""
from __future__ import annotations

import networkx as nx
import torch

from ..errors import CycleError, ProgramError
from ..ir import Program
from ..reference import bind_inputs, parameter_tensors, run_node


def region_groups(program: Program, regions=None) -> list[list[str]]:
    """Active regions' node lists plus one group per node outside every region."""
    regions = program.regions if regions is None else regions
    groups = [list(r.nodes) for r in regions if getattr(r, "status", "proposed") != "rejected"]
    covered = {n for g in groups for n in g}
    order = program.topo_order()
    groups += [[n] for n in order if n not in covered]
    return groups


def region_order(program: Program, groups: list[list[str]]) -> list[int]:
    """Indices of `groups` in an order where every group runs after the groups it reads from."""
    owner = {n: i for i, g in enumerate(groups) for n in g}
    q = nx.DiGraph()
    q.add_nodes_from(range(len(groups)))
    for a, b in program.graph().edges:
        if owner[a] != owner[b]:
            q.add_edge(owner[a], owner[b])
    try:
        return list(nx.lexicographical_topological_sort(q))
    except nx.NetworkXUnfeasible:
        cyc = nx.find_cycle(q)
        raise CycleError("the regions form a cycle: " + " -> ".join(
            f"[{', '.join(groups[i][:3])}]" for i, _ in cyc)) from None


def run_by_region(program: Program, inputs, regions=None) -> dict[str, torch.Tensor]:
    """Outputs by name, computed one region at a time."""
    groups = region_groups(program, regions)
    bound = bind_inputs(program, inputs)
    device = next((str(t.device) for t in bound.values()), "cpu")
    env = dict(parameter_tensors(program, device))
    env.update(bound)
    order = program.topo_order()
    idx = {n: i for i, n in enumerate(order)}
    outputs = set(program.outputs)
    with torch.no_grad():
        for gi in region_order(program, groups):
            members = set(groups[gi])
            local: dict = {}
            for nid in sorted(members, key=idx.__getitem__):
                node = program.nodes[nid]
                for v in node.inputs:
                    if v is None or v in local:
                        continue
                    if v not in env:
                        raise ProgramError(f"region [{', '.join(groups[gi][:4])}] reads {v} before it is "
                                           "computed")
                    local[v] = env[v]
                run_node(program, nid, local)
            for nid in members:
                for v in program.nodes[nid].outputs:
                    if v in outputs or any(c not in members for c, _ in program.consumers(v)):
                        env[v] = local[v]
    return {program.values[v].name: env[v] for v in program.outputs}
