"""Dependencies between nodes through networkx: order, ancestry, and what reaches what."""
from __future__ import annotations

import networkx as nx

from ..ir import Program


def dependency_graph(program: Program) -> nx.DiGraph:
    """Node-level DAG, an edge producer -> consumer for each value read (edge attribute 'value')."""
    return program.graph()


def topological_order(program: Program) -> list[str]:
    """Deterministic topological order (lowest id first among ready nodes); CycleError on a cycle."""
    return program.topo_order()


def upstream(program: Program, node_id: str) -> set[str]:
    return nx.ancestors(program.graph(), node_id)


def downstream(program: Program, node_id: str) -> set[str]:
    return nx.descendants(program.graph(), node_id)


def critical_path(program: Program, weight: dict[str, float]) -> tuple[float, list[str]]:
    """The longest chain of dependent nodes by weight (e.g. estimated ms): no schedule beats it on
    one stream with unlimited parallelism inside kernels."""
    g = program.graph()
    best: dict[str, tuple[float, str | None]] = {}
    for nid in program.topo_order():
        prev = max(((best[p][0], p) for p in g.predecessors(nid)), default=(0.0, None))
        best[nid] = (prev[0] + weight.get(nid, 0.0), prev[1])
    if not best:
        return 0.0, []
    end = max(best, key=lambda k: best[k][0])
    path, cur = [], end
    while cur is not None:
        path.append(cur)
        cur = best[cur][1]
    return best[end][0], path[::-1]
