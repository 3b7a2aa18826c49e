"""What a rewrite is and the program edits the rules and the engine share.

A rule builds its replacement with these helpers; the engine (engine.py) checks it and redirects the
uses. Rules, the lowering and the linear reductions import this module, never the engine, so the
package's imports run one way: engine -> rules -> lowering / linear_reduce -> edits.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..ir import Program, Role
from ..ops.common import norm_dims


@dataclass
class Rewrite:
    rule: str
    why: str                                  # one plain sentence, specific (names, shapes, numbers)
    build: Callable[[Program], dict]          # adds nodes; returns {old value id: new value id}
    node_id: str = ""                         # the node the rule matched


@dataclass
class RewriteResult:
    program: Program
    fired: list[dict] = field(default_factory=list)     # {"rule", "node", "message"}
    refused: list[dict] = field(default_factory=list)   # {"rule", "node", "message", "error"}

    @property
    def rules_fired(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.fired:
            out[e["rule"]] = out.get(e["rule"], 0) + 1
        return out


def clone_program(program: Program) -> Program:
    """A deep copy that shares no listeners (edits to it must not reach the editor)."""
    listeners = program._listeners
    program._listeners = []
    try:
        twin = copy.deepcopy(program)
    finally:
        program._listeners = listeners
    return twin


def param_array(program: Program, value_id: str | None) -> np.ndarray | None:
    """The data of a parameter or constant value, or None when the value is computed or an input."""
    if value_id is None:
        return None
    v = program.values[value_id]
    if v.role not in (Role.PARAMETER, Role.CONSTANT):
        return None
    return program.data.get(value_id)


def node_label(program: Program, nid: str) -> str:
    """How messages name a node: "name (op)", or the op alone when the node is named after it."""
    n = program.nodes[nid]
    return f"{n.name} ({n.op})" if n.name != n.op else n.op


def producer(program: Program, value_id: str | None):
    """The node that computes value_id, or None for an input, parameter or constant."""
    p = program.values[value_id].producer if value_id else None
    return program.nodes.get(p) if p else None


def transposed_matrix(program: Program, value_id: str | None) -> str | None:
    """w where value_id is the matrix w with its two dims swapped (w.t(), w.T, w.transpose(0, 1): a
    permute [1, 0] or a transpose of a 2-D value); else None."""
    t = producer(program, value_id)
    if t is None or not t.inputs or t.inputs[0] is None or len(program.values[t.inputs[0]].shape) != 2:
        return None
    swaps = (t.op == "permute" and [int(d) % 2 for d in t.attrs.get("dims", ())] == [1, 0]) or \
        (t.op == "transpose" and {int(t.attrs.get("dim0", 0)) % 2, int(t.attrs.get("dim1", 1)) % 2} == {0, 1})
    return t.inputs[0] if swaps else None


def reduced_dims(node, rank: int) -> list[int]:
    """The dims a reduction node reduces, sorted and non-negative (all of them when dim is None)."""
    dim = node.attrs.get("dim")
    return norm_dims([dim] if isinstance(dim, int) else dim, rank)


def single_use(program: Program, value_id: str) -> bool:
    """Read by exactly one node (once or more) and not a program output."""
    if value_id in program.outputs:
        return False
    users = {c for c, _ in program.consumers(value_id)}
    return len(users) == 1


# --- redirecting and cleaning up --------------------------------------------------------------
def replace_uses(program: Program, old: str, new: str) -> None:
    """Every reader of `old` (and the program's output list) reads `new` instead."""
    for cid, port in program.consumers(old):
        program.nodes[cid].inputs[port] = new
    if old in program.outputs:
        idx = program.outputs.index(old)
        if new in program.outputs:
            program.outputs.pop(idx)
        else:
            program.outputs[idx] = new
            if program.values[new].producer:
                program.values[new].role = Role.OUTPUT


def remove_dead(program: Program, candidates=None) -> list[str]:
    """Remove nodes none of whose outputs are read or returned, starting from `candidates` (default:
    every node) and following their inputs upstream; parameters left unread go too. Returns the
    removed node ids."""
    work = list(program.nodes if candidates is None else candidates)
    removed = []
    while work:
        nid = work.pop()
        n = program.nodes.get(nid)
        if n is None or any(v in program.outputs or program.consumers(v) for v in n.outputs):
            continue
        ups = [program.values[v].producer for v in n.inputs if v and program.values[v].producer]
        params = [v for v in n.inputs
                  if v and program.values[v].role in (Role.PARAMETER, Role.CONSTANT)]
        program.remove_node(nid)
        removed.append(nid)
        work.extend(ups)
        for p in dict.fromkeys(params):
            if p in program.values and not program.consumers(p):
                program.remove_value(p)
    return removed


def add_param(program: Program, name: str, arr: np.ndarray, like: str | None = None) -> str:
    """A new parameter holding `arr` (in the dtype of value `like`, float32 by default)."""
    dtype = program.values[like].dtype if like else "float32"
    arr = np.ascontiguousarray(arr.astype(np.dtype(dtype) if dtype != "bfloat16" else np.float32))
    return program.add_parameter(name, arr).id
