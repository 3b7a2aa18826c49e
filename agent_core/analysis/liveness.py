"""Value lifetimes and the peak memory of a schedule (an order of nodes).

A value is live from the step that produces it (program inputs from step 0) to the last step that reads
it; program outputs stay live to the end. Parameters are resident for the whole run and are counted
apart. Views (reshape and friends) alias their input, so they extend its lifetime instead of adding bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..ir import Program, Role
from .cost import is_view


@dataclass(frozen=True)
class Lifetime:
    value_id: str
    start: int   # step that produces it (-1: before the first step, a program input)
    end: int     # last step that reads it (len(order): a program output)
    nbytes: int


def buffers(program: Program, order: Sequence[str], shares: Mapping[str, str] | None = None) -> dict[str, str]:
    """Value -> the value whose buffer it lives in, for the values that live in another's: views, and
    what `shares` maps (eager's relu_ result, a kernel output written over a dying input)."""
    shares = shares or {}
    alias: dict[str, str] = {}
    for nid in order:
        n = program.nodes[nid]
        if is_view(program, nid):
            src = n.inputs[0]
            alias[n.outputs[0]] = alias.get(src, src)
        for v in n.outputs:
            if v in shares:
                alias[v] = alias.get(shares[v], shares[v])
    return alias


def lifetimes(program: Program, order: Sequence[str] | None = None,
              shares: Mapping[str, str] | None = None) -> dict[str, Lifetime]:
    """Lifetimes of the values that occupy activation memory (not parameters or constants), with views
    folded into the buffer they alias, and so is each value `shares` maps to the input whose buffer it
    is written over (eager's relu_, a kernel's output over an input that dies with it)."""
    order = list(order) if order is not None else program.topo_order()
    step = {nid: i for i, nid in enumerate(order)}
    if len(step) != len(program.nodes) or set(step) != set(program.nodes):
        missing = sorted(set(program.nodes) - set(step))
        raise ValueError(f"the schedule must list every node once; missing {', '.join(missing[:5])}")
    alias = buffers(program, order, shares)
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    for vid in program.inputs:
        start[vid] = end[vid] = -1
    for i, nid in enumerate(order):
        n = program.nodes[nid]
        for v in n.outputs:
            b = alias.get(v, v)
            start.setdefault(b, i)
            end[b] = max(end.get(b, i), i)
        for v in n.inputs:
            if v is None:
                continue
            b = alias.get(v, v)
            if program.values[b].role in (Role.PARAMETER, Role.CONSTANT):
                continue
            start.setdefault(b, i)
            end[b] = max(end.get(b, i), i)
    for v in program.outputs:
        b = alias.get(v, v)
        end[b] = len(order)
    return {b: Lifetime(b, start[b], end[b], program.values[b].nbytes) for b in start}


def peak_memory(program: Program, order: Sequence[str] | None = None) -> tuple[int, int]:
    """(peak bytes of live activations, the step where it is reached) for the schedule."""
    lt = lifetimes(program, order)
    n = len(program.nodes)
    delta = [0] * (n + 3)
    for life in lt.values():
        delta[life.start + 1] += life.nbytes
        delta[life.end + 2] -= life.nbytes
    peak = live = 0
    at = -1
    for i in range(n + 2):
        live += delta[i]
        if live > peak:
            peak, at = live, i - 1
    return peak, at


def parameter_bytes(program: Program) -> int:
    return sum(v.nbytes for v in program.values.values() if v.role in (Role.PARAMETER, Role.CONSTANT))
