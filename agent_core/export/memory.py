"""The memory plan of an exported program: where every value lives.

Program inputs, parameters and outputs live in caller-owned buffers (StitchInputs / StitchParameters /
StitchOutputs). Every other value a launch writes lives in one arena, the caller's workspace: a value
is live from the launch that writes it to the last launch that reads it (the same rule as
analysis.liveness, counted in launches instead of nodes, so values inside a fused region take no
memory), and values whose lifetimes do not overlap share bytes. Offsets come from a greedy
first-fit over values sorted by size, largest first. Kernel scratch (split reductions' partial
states and arrival counters) follows the activations; it is zeroed once and never shared.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Program, Role
from ..ops.registry import DTYPE_BYTES
from .steps import Schedule

ALIGN = 256  # bytes; what cudaMalloc guarantees, and more than a float4 load needs


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass
class Buffer:
    value_id: str
    nbytes: int
    first: int      # launch that writes it
    last: int       # last launch that reads it
    offset: int = -1


@dataclass
class MemoryPlan:
    storage: dict[str, str]            # base value id -> "input" | "parameter" | "output" | "arena"
    arena: dict[str, Buffer]           # base value id -> its place in the arena
    activation_bytes: int              # arena bytes for values
    scratch: list[tuple[str, str, int, int]] = field(default_factory=list)  # (kernel, dtype, elements, offset)
    output_copies: list[tuple[str, str]] = field(default_factory=list)      # (output value, source value)
    unshared_bytes: int = 0            # what the arena's values would take without sharing
    output_owner: dict[str, str] = field(default_factory=dict)  # base value -> the output it is written to

    @property
    def arena_bytes(self) -> int:
        end = self.activation_bytes
        for _, dtype, n, off in self.scratch:
            end = max(end, off + n * DTYPE_BYTES[dtype])
        return align_up(end)


def plan_memory(program: Program, schedule: Schedule) -> MemoryPlan:
    base = schedule.base
    storage: dict[str, str] = {}
    for v in program.values.values():
        if v.role == Role.INPUT:
            storage[v.id] = "input"
        elif v.role in (Role.PARAMETER, Role.CONSTANT):
            storage[v.id] = "parameter"
    copies: list[tuple[str, str]] = []
    owner: dict[str, str] = {}
    for vid in program.outputs:
        b = base(vid)
        if b in storage:  # an input, a parameter or another output's buffer: copied at the end
            copies.append((vid, b))
            continue
        storage[b] = "output"
        owner[b] = vid
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, step in enumerate(schedule.steps):
        for v in step.writes:
            first.setdefault(base(v), i)
            last.setdefault(base(v), i)
        for v in step.reads:
            last[base(v)] = max(last.get(base(v), i), i)
    arena = {b: Buffer(b, program.values[b].nbytes, first[b], last[b]) for b in first if b not in storage}
    for b in arena:
        storage[b] = "arena"
    placed: list[Buffer] = []
    for buf in sorted(arena.values(), key=lambda x: (-x.nbytes, x.first, x.value_id)):
        live = sorted((p for p in placed if p.first <= buf.last and buf.first <= p.last), key=lambda p: p.offset)
        offset = 0
        for p in live:
            if offset + buf.nbytes <= p.offset:
                break
            offset = max(offset, align_up(p.offset + p.nbytes))
        buf.offset = offset
        placed.append(buf)
    activation = align_up(max((b.offset + b.nbytes for b in placed), default=0))
    scratch, off = [], activation
    for step in schedule.steps:
        for dtype, n in (step.kernel.workspace if step.kernel else []):
            scratch.append((step.name, dtype, max(1, n), off))
            off = align_up(off + max(1, n) * DTYPE_BYTES[dtype])
    unshared = sum(align_up(b.nbytes) for b in placed)
    return MemoryPlan(storage, arena, activation, scratch, copies, unshared, owner)
