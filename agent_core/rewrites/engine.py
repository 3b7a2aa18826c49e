"""The rewrite engine: propose, check numerically, keep or drop, and log why.

A rule looks at one node and may return a Rewrite: a short explanation and a `build` function that adds
the replacement nodes (and folded parameters) to the program and says which old values they replace.
Nothing existing is touched until the replacement has been computed on random draws through the
reference interpreter and matched the values it replaces; then the uses are redirected and whatever
became dead is removed. A rewrite that does not match is undone and logged as refused.
"""
from __future__ import annotations

import copy
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..errors import ProgramError, StitchError
from ..ir import Program, Role
from ..ops.common import norm_dims
from ..reference import parameter_tensors, random_inputs, run_node, run_reference


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


def materialize_parameters(program: Program) -> None:
    """Give every parameter without data the values the reference would draw for it, so folding
    rewrites can compute with them and new parameters do not shift later draws."""
    missing = [v.id for v in program.parameters() if v.id not in program.data]
    if not missing:
        return
    drawn = parameter_tensors(program)
    for vid in missing:
        program.data[vid] = drawn[vid].cpu().numpy()


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


def _used_values(program: Program) -> set[str]:
    return {v for n in program.nodes.values() for v in n.inputs if v} | set(program.outputs)


# --- numerical check ----------------------------------------------------------------------------
def close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-4) -> str | None:
    """Why `a` (rewritten) does not match `b` (original), or None. atol scales with b's magnitude, so a
    product of large terms is judged relative to its size."""
    if tuple(a.shape) != tuple(b.shape):
        return f"shape {list(a.shape)} instead of {list(b.shape)}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} instead of {b.dtype}"
    if not a.is_floating_point():
        return None if torch.equal(a, b) else "integer values differ"
    a64, b64 = a.double(), b.double()
    finite = torch.isfinite(b64)
    if not torch.equal(finite, torch.isfinite(a64)):
        return "infinite or NaN values appear in different places"
    if not finite.any():
        return None
    scale = max(1.0, float(b64[finite].abs().max()))
    err = (a64[finite] - b64[finite]).abs()
    bound = atol * scale + rtol * b64[finite].abs()
    if bool((err > bound).any()):
        return f"max abs error {float(err.max()):.3g} (tolerance {atol * scale:.3g} + {rtol} x |value|)"
    return None


class Checker:
    """Holds the reference values of every value on a few random draws; checks a replacement by
    computing only the new nodes from the values they read."""

    def __init__(self, program: Program, draws: int = 2, seed: int = 0, device: str = "cpu"):
        self.envs: list[dict] = []
        self.device = device
        params = parameter_tensors(program, device)
        for k in range(draws):
            inputs = random_inputs(program, seed=seed + k, device=device)
            self.envs.append(run_reference(program, inputs, params=dict(params), keep=True))

    def check(self, program: Program, new_nodes: list[str], replaced: dict[str, str]) -> str | None:
        staged = []
        for env in self.envs:
            local: dict = {}
            view = ChainMap(local, env)
            for nid in new_nodes:
                for v in program.nodes[nid].inputs:
                    if v is not None and v not in view:
                        arr = param_array(program, v)
                        if arr is None:
                            return f"the replacement reads {v}, which has no reference value"
                        local[v] = torch.from_numpy(np.ascontiguousarray(arr)).to(self.device)
                with torch.no_grad():
                    run_node(program, nid, view)
            for old, new in replaced.items():
                if new not in view:   # the replacement is a folded parameter, not a node
                    arr = param_array(program, new)
                    if arr is None:
                        return f"the replacement {new} has no value"
                    local[new] = torch.from_numpy(np.ascontiguousarray(arr)).to(self.device)
                got = view[new]
                why = close(got, env[old])
                if why:
                    return f"{program.values[old].name}: {why}"
            staged.append((env, local))
        for env, local in staged:
            env.update(local)
        return None


# --- the driver ---------------------------------------------------------------------------------
def rewrite_program(program: Program, rules=None, *, check: bool = True, draws: int = 2,
                    max_rounds: int = 8, device: str = "cpu") -> RewriteResult:
    """Apply the rules to a copy of `program` until none fires; the original is left untouched."""
    from .rules import DEFAULT_RULES
    rules = DEFAULT_RULES if rules is None else rules
    prog = clone_program(program)
    prog.regions = []
    materialize_parameters(prog)
    result = RewriteResult(prog)
    checker = Checker(prog, draws, device=device) if check else None
    refused_once: set[tuple[str, str]] = set()
    for _ in range(max_rounds):
        fired = False
        for nid in prog.topo_order():
            if nid not in prog.nodes:
                continue
            for rule in rules:
                if nid not in prog.nodes or (rule.__name__, nid) in refused_once:
                    continue
                try:
                    rw = rule(prog, nid)
                except (StitchError, ValueError, KeyError, IndexError) as e:
                    result.refused.append({"rule": rule.__name__, "node": nid,
                                           "message": f"the rule failed to match: {e}"})
                    refused_once.add((rule.__name__, nid))
                    continue
                if rw is None:
                    continue
                rw.node_id = rw.node_id or nid
                if _apply(prog, rw, checker, result):
                    fired = True
                else:
                    refused_once.add((rule.__name__, nid))
        if not fired:
            break
    dead = [nid for nid in remove_dead(prog)]
    for nid in dead:
        result.fired.append({"rule": "dead_code", "node": nid,
                             "message": f"removed {nid}: its result is never used"})
    return result


def _apply(prog: Program, rw: Rewrite, checker: Checker | None, result: RewriteResult) -> bool:
    before_nodes = set(prog.nodes)
    before_values = set(prog.values)
    try:
        replaced = rw.build(prog)
    except StitchError as e:
        _rollback(prog, before_nodes, before_values)
        result.refused.append({"rule": rw.rule, "node": rw.node_id, "message": rw.why,
                               "error": f"could not build the replacement: {e}"})
        return False
    new_nodes = [n for n in prog.topo_order() if n not in before_nodes]
    if checker is not None:
        try:
            why = checker.check(prog, new_nodes, replaced)
        except (StitchError, RuntimeError, ValueError, TypeError) as e:
            why = f"the replacement failed to run: {e}"
        if why:
            _rollback(prog, before_nodes, before_values)
            result.refused.append({"rule": rw.rule, "node": rw.node_id, "message": rw.why,
                                   "error": f"numerical check failed: {why}"})
            return False
    old_names = {n: (prog.nodes[n].op, prog.nodes[n].name) for n in before_nodes}
    for old, new in replaced.items():
        out_name = prog.values[old].name if old in prog.outputs else None
        producer = prog.values[old].producer
        replace_uses(prog, old, new)
        if producer:
            remove_dead(prog, [producer])
        if out_name and new in prog.values and prog.values[new].name != out_name:
            if not any(v.name == out_name for v in prog.values.values()):
                prog.values[new].name = out_name
    # a rebuilt node takes the name of the node it replaced (conv1 stays conv1, not conv1_1)
    freed = {}
    for nid, (op, name) in old_names.items():
        if nid not in prog.nodes:
            freed.setdefault(op, []).append(name)
    for nid in new_nodes:
        n = prog.nodes.get(nid)
        if n is not None and freed.get(n.op):
            name = freed[n.op].pop(0)
            if not any(m.name == name for m in prog.nodes.values()):
                n.name = name
    result.fired.append({"rule": rw.rule, "node": rw.node_id, "message": rw.why})
    return True


def _rollback(prog: Program, nodes: set, values: set) -> None:
    for nid in [n for n in prog.topo_order() if n not in nodes][::-1]:
        prog.remove_node(nid)
    for vid in [v for v in prog.values if v not in values]:
        prog.values.pop(vid, None)
        prog.data.pop(vid, None)
        if vid in prog.inputs:
            prog.inputs.remove(vid)


def add_param(program: Program, name: str, arr: np.ndarray, like: str | None = None) -> str:
    """A new parameter holding `arr` (in the dtype of value `like`, float32 by default)."""
    dtype = program.values[like].dtype if like else "float32"
    arr = np.ascontiguousarray(arr.astype(np.dtype(dtype) if dtype != "bfloat16" else np.float32))
    return program.add_parameter(name, arr).id


def fail(msg: str):
    raise ProgramError(msg)
