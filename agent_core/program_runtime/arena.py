"""One memory arena for the intermediates of an end-to-end program.

Every value a generated kernel writes gets a slot (an offset into one byte buffer) for the steps
between the one that writes it and the last one that reads it, views of it included (lifetimes from
agent_core.analysis.liveness, mapped from nodes to steps). Slots whose lifetimes overlap never share
bytes; the others reuse memory. Placement is greedy: largest first, lowest free offset.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ALIGN = 256   # what cudaMalloc guarantees; the float4 paths need 16


@dataclass(frozen=True)
class Slot:
    value_id: str
    offset: int
    nbytes: int
    start: int   # first step that writes it
    end: int     # last step that reads it (inclusive; n_steps for program outputs)

    def overlaps_in_time(self, other: "Slot") -> bool:
        return self.start <= other.end and other.start <= self.end

    def overlaps_in_memory(self, other: "Slot") -> bool:
        return self.offset < other.offset + other.nbytes and other.offset < self.offset + self.nbytes


@dataclass
class ArenaPlan:
    slots: dict[str, Slot] = field(default_factory=dict)
    total_bytes: int = 0
    memory: object = field(default=None, repr=False, compare=False)    # library_memory.LibraryMemory: what the slots hold, and the split-TF32 decisions

    @property
    def naive_bytes(self) -> int:
        """What one buffer per value would take (the reuse the plan buys is the difference)."""
        return sum(_round_up(s.nbytes) for s in self.slots.values())

    def to_dict(self) -> dict:
        out = {"total_bytes": self.total_bytes, "naive_bytes": self.naive_bytes,
               "slots": {v: {"offset": s.offset, "nbytes": s.nbytes, "start": s.start, "end": s.end}
                         for v, s in self.slots.items()}}
        if self.memory is not None:
            out["memory"] = self.memory.to_dict()
        return out


def _round_up(n: int, align: int = ALIGN) -> int:
    return max(align, (n + align - 1) // align * align)


def plan_arena(values: dict[str, tuple[int, int, int]], align: int = ALIGN) -> ArenaPlan:
    """values: value id -> (nbytes, first step, last step). Returns offsets with no two values that are
    live at the same step sharing a byte."""
    plan = ArenaPlan()
    placed: list[Slot] = []
    order = sorted(values.items(), key=lambda kv: (-kv[1][0], kv[1][1], kv[0]))
    for vid, (nbytes, start, end) in order:
        if end < start:
            raise ValueError(f"value {vid}: lifetime ends (step {end}) before it starts (step {start})")
        size = _round_up(nbytes, align)
        probe = Slot(vid, 0, size, start, end)
        busy = sorted((s.offset, s.offset + _round_up(s.nbytes, align)) for s in placed if s.overlaps_in_time(probe))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        slot = Slot(vid, offset, nbytes, start, end)
        placed.append(slot)
        plan.slots[vid] = slot
        plan.total_bytes = max(plan.total_bytes, offset + size)
    return plan


def check_arena(plan: ArenaPlan) -> list[str]:
    """Pairs of values that are live together and share memory (empty when the plan is sound)."""
    bad = []
    slots = list(plan.slots.values())
    for i, a in enumerate(slots):
        for b in slots[i + 1:]:
            if a.overlaps_in_time(b) and a.overlaps_in_memory(b):
                bad.append(f"{a.value_id} [{a.start}, {a.end}] and {b.value_id} [{b.start}, {b.end}] share "
                           f"bytes {max(a.offset, b.offset)}..")
    return bad
