"""The per-node cost model and roofline estimates.

A node run alone reads each distinct input once and writes its outputs; its time on the roofline is one
launch plus the larger of its memory time (bytes / bandwidth) and compute time (FLOPs / peak). A group
of nodes run as one kernel reads only what comes from outside and writes only what is used outside (or
is a program output): that difference is what fusion buys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from ..ir import Program, Role
from ..ops import DTYPE_BYTES
from .gpu import H200, GPUProfile

# Layout ops that only relabel a contiguous buffer: no kernel, no traffic. (Categories cannot tell a
# reshape from a transpose, so this one property is a list of names.)
VIEW_OPS = frozenset({"reshape", "view", "flatten", "unflatten", "squeeze", "unsqueeze", "contiguous",
                      "identity", "dropout", "detach", "clone_view"})


# layout ops torch returns as strided views of their input: alone, eager torch runs them for free
TORCH_VIEWS = frozenset({"slice", "select", "split", "chunk", "unbind", "permute", "transpose", "expand"})
_LIBRARY = ("matmul", "convolution")


def library_reads_as_view(program: Program, node_id: str) -> bool:
    """A one-output slice, select, permute, transpose or expand whose result only library calls read
    (through views, never a program output): torch makes it a strided view and cuBLAS / cuDNN read
    that as it is (a row slice of an LSTM's output into its classifier: a leading dimension), or copy it
    themselves as a generated copy would, so it runs through torch and no kernel of ours copies it."""
    n = program.nodes[node_id]
    if n.op not in TORCH_VIEWS or len(n.outputs) != 1:
        return False
    outputs, todo, seen = set(program.outputs), [n.outputs[0]], set()
    while todo:
        v = todo.pop()
        if v in outputs:
            return False
        readers = program.consumers(v)
        if not readers:
            return False
        for nid, _ in readers:
            if nid in seen:
                continue
            seen.add(nid)
            if is_view(program, nid):
                todo.append(program.nodes[nid].outputs[0])
            elif program.nodes[nid].opdef.category not in _LIBRARY:
                return False
    return True


def is_view(program: Program, node_id: str) -> bool:
    """True when the node only relabels its input (same elements, same order)."""
    n = program.nodes[node_id]
    if n.op not in VIEW_OPS or not n.inputs or n.inputs[0] is None or len(n.outputs) != 1:
        return False
    src, out = program.values[n.inputs[0]], program.values[n.outputs[0]]
    return src.spec.numel == out.spec.numel and src.dtype == out.dtype


@dataclass(frozen=True)
class NodeCost:
    node_id: str
    bytes_read: int
    bytes_written: int
    flops: int
    view: bool = False

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (arithmetic intensity)."""
        return self.flops / self.bytes if self.bytes else 0.0

    def time_ms(self, gpu: GPUProfile = H200, graph: bool = True) -> float:
        if self.view:
            return 0.0
        return roofline_ms(self.bytes, self.flops, 1, gpu, graph)

    def bound(self, gpu: GPUProfile = H200) -> str:
        """'memory' or 'compute': which roof limits this node (launches aside)."""
        return "compute" if self.flops / gpu.flops_per_ms > self.bytes / gpu.bytes_per_ms else "memory"


def roofline_ms(nbytes: float, flops: float, launches: int = 1, gpu: GPUProfile = H200,
                graph: bool = True) -> float:
    return launches * gpu.launch_ms(graph) + max(nbytes / gpu.bytes_per_ms, flops / gpu.flops_per_ms)


def node_cost(program: Program, node_id: str) -> NodeCost:
    n = program.nodes[node_id]
    if is_view(program, node_id):
        return NodeCost(node_id, 0, 0, 0, view=True)
    read = sum(_nbytes(program.values[v]) for v in dict.fromkeys(x for x in n.inputs if x is not None))
    written = sum(_nbytes(program.values[v]) for v in n.outputs)
    try:
        flops = program.node_flops(node_id)
    except Exception:  # an op without a FLOP rule still has a memory cost
        flops = 0
    return NodeCost(node_id, read, written, flops)


def _nbytes(v) -> int:
    return math.prod(v.shape) * DTYPE_BYTES[v.dtype]


def program_costs(program: Program) -> dict[str, NodeCost]:
    return {nid: node_cost(program, nid) for nid in program.nodes}


@dataclass
class GroupTraffic:
    """What a set of nodes run as one kernel moves: external reads, escaping writes, and the bytes of
    intermediates that stay on chip."""
    bytes_read: int
    bytes_written: int
    bytes_kept: int
    kept_values: list[str]
    flops: int
    views_only: bool

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


def group_traffic(program: Program, nodes: Iterable[str], consumers: dict[str, list[str]] | None = None,
                  costs: dict[str, NodeCost] | None = None) -> GroupTraffic:
    """Traffic of `nodes` fused into one kernel. consumers maps value id -> consumer node ids (pass it
    in when calling this many times)."""
    members = set(nodes)
    outputs = set(program.outputs)
    read_vals: dict[str, int] = {}
    written = kept = flops = 0
    kept_values = []
    views_only = True
    for nid in members:
        n = program.nodes[nid]
        c = costs[nid] if costs is not None else node_cost(program, nid)
        flops += c.flops
        views_only = views_only and c.view
        for v in n.inputs:
            if v is None or v in read_vals:
                continue
            val = program.values[v]
            if val.producer not in members:
                read_vals[v] = val.nbytes
        for v in n.outputs:
            users = consumers[v] if consumers is not None else [c for c, _ in program.consumers(v)]
            nb = program.values[v].nbytes
            if v in outputs or any(u not in members for u in users):
                written += nb
            elif users:
                kept += nb
                kept_values.append(v)
    if views_only:
        return GroupTraffic(0, 0, 0, [], 0, True)
    return GroupTraffic(sum(read_vals.values()), written, kept, kept_values, flops, False)


def value_consumers(program: Program) -> dict[str, list[str]]:
    """value id -> ids of the nodes that read it (each node once)."""
    out: dict[str, list[str]] = {v: [] for v in program.values}
    for n in program.nodes.values():
        for v in dict.fromkeys(x for x in n.inputs if x is not None):
            out.setdefault(v, []).append(n.id)
    return out


@dataclass
class ProgramEstimate:
    """Whole-program estimates in ms: every node its own kernel, the planned regions, and the floor
    (program inputs, parameters and outputs moved once, or all FLOPs at peak, with no launches: matmuls
    and convolutions at split TF32's rate, the fp32-accurate tensor-core form our tile GEMM runs, the
    rest at fp32's)."""
    unfused_ms: float
    planned_ms: float | None
    floor_ms: float
    unfused_eager_ms: float
    kernels_unfused: int
    kernels_planned: int | None
    bytes_unfused: int
    bytes_planned: int | None
    bytes_floor: int
    flops: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def floor_bytes(program: Program) -> int:
    read = sum(v.nbytes for v in program.values.values()
               if v.role in (Role.INPUT, Role.PARAMETER, Role.CONSTANT)
               and any(v.id in n.inputs for n in program.nodes.values()))
    return read + sum(program.values[v].nbytes for v in dict.fromkeys(program.outputs))


def estimate_program(program: Program, regions=None, gpu: GPUProfile = H200,
                     graph: bool = True, costs: dict[str, NodeCost] | None = None) -> ProgramEstimate:
    """Roofline estimates; `regions` (lists of node ids, or Region objects) gives the planned figure."""
    costs = costs if costs is not None else program_costs(program)
    kernels = [c for c in costs.values() if not c.view]
    unfused = sum(c.time_ms(gpu, graph) for c in kernels)
    eager = sum(c.time_ms(gpu, False) for c in kernels)
    total_flops = sum(c.flops for c in costs.values())
    tensor_flops = sum(c.flops for nid, c in costs.items()
                       if program.nodes[nid].opdef.category in ("matmul", "convolution"))
    fb = floor_bytes(program)
    floor = max(fb / gpu.bytes_per_ms, tensor_flops / gpu.split_tf32_flops_per_ms
                + (total_flops - tensor_flops) / gpu.flops_per_ms)
    planned = bytes_planned = k_planned = None
    if regions is not None:
        cons = value_consumers(program)
        groups = [list(getattr(r, "nodes", r)) for r in regions]
        covered = {n for g in groups for n in g}
        groups += [[n] for n in program.nodes if n not in covered]
        planned, bytes_planned, k_planned = 0.0, 0, 0
        for g in groups:
            t = group_traffic(program, g, cons, costs)
            if t.views_only:
                continue
            k_planned += 1
            bytes_planned += t.bytes
            planned += roofline_ms(t.bytes, t.flops, 1, gpu, graph)
    return ProgramEstimate(unfused, planned, floor, eager, len(kernels), k_planned,
                           sum(c.bytes for c in kernels), bytes_planned, fb, total_flops)


def fmt_bytes(n: float) -> str:
    """Human-sized bytes: 512 B, 3.1 KB, 64 MB, 1.2 GB (decimal units, as bandwidth is quoted)."""
    n = float(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v >= 10 else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_ms(ms: float) -> str:
    if ms >= 1:
        return f"{ms:.2f} ms"
    if ms >= 0.01:
        return f"{ms:.3f} ms"
    return f"{ms * 1000:.1f} us"
