"""The rewrite engine: propose, check numerically, keep or drop, and log why.

A rule looks at one node and may return a Rewrite: a short explanation and a `build` function that adds
the replacement nodes (and folded parameters) to the program and says which old values they replace.
Nothing existing is touched until the replacement has been computed on random draws through the
reference interpreter and matched the values it replaces; then the uses are redirected and whatever
became dead is removed. A rewrite that does not match is undone and logged as refused.
"""
from __future__ import annotations

from collections import ChainMap

import numpy as np
import torch

from ..errors import StitchError
from ..ir import Program
from ..reference import parameter_tensors, random_inputs, run_node, run_reference
from .edits import Rewrite, RewriteResult, clone_program, param_array, remove_dead, replace_uses
from .rules import DEFAULT_RULES, FOLD_DEVICE, LATE_RULES


def materialize_parameters(program: Program) -> None:
    """Give every parameter without data the values the reference would draw for it, so folding
    rewrites can compute with them and new parameters do not shift later draws."""
    missing = [v.id for v in program.parameters() if v.id not in program.data]
    if not missing:
        return
    drawn = parameter_tensors(program)
    for vid in missing:
        program.data[vid] = drawn[vid].cpu().numpy()


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
    if a.dtype not in (torch.float32, torch.float64):    # half types: their differences in float32
        a, b = a.float(), b.float()
    finite = torch.isfinite(b)
    if not torch.equal(finite, torch.isfinite(a)):
        return "infinite or NaN values appear in different places"
    if not bool(finite.all()):
        if not finite.any():
            return None
        a, b = a[finite], b[finite]
    # in the values' own precision: a float32 difference is exact to 2^-24 of the larger value, far
    # inside any tolerance judged here (and a float64 copy of a large value costs seconds on a CPU)
    mag = b.abs()
    scale = max(1.0, float(mag.max()))
    err = (a - b).abs_()
    over = err > mag.mul_(rtol).add_(atol * scale)
    if bool(over.any()):
        return f"max abs error {float(err.max()):.3g} (tolerance {atol * scale:.3g} + {rtol} x |value|)"
    return None


CHECK_DRAWS = 2      # random draws each rewrite is checked on; the checker holds every value of each


class Checker:
    """Holds the reference values of every value on a few random draws; checks a replacement by
    computing only the new nodes from the values they read."""

    def __init__(self, program: Program, draws: int = CHECK_DRAWS, seed: int = 0, device: str = "cpu"):
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
def rewrite_program(program: Program, rules=None, *, check: bool = True, draws: int = CHECK_DRAWS,
                    max_rounds: int = 8, device: str = "cpu", late=None) -> RewriteResult:
    """Apply the rules to a copy of `program` until none fires, then the `late` ones (default: rules.
    LATE_RULES, or none when `rules` is given); the original is left untouched.

    Regions a user accepted, drew, locked or rejected are the user's decisions: no rule fires on their
    nodes, and they are carried over (proposals are dropped: the planner makes them again)."""
    late = (LATE_RULES if rules is None else []) if late is None else late
    rules = DEFAULT_RULES if rules is None else rules
    prog = clone_program(program)
    users = [r for r in prog.regions if r.status != "proposed"]
    protected = {n for r in users for n in r.nodes}
    prog.regions = []
    materialize_parameters(prog)
    result = RewriteResult(prog)
    checker = Checker(prog, draws, device=device) if check else None
    refused_once: set[tuple[str, str]] = set()
    fold_on = FOLD_DEVICE.set(device)    # constants fold where the reference they must match runs
    for stage in (rules, late):
        _run_rules(prog, stage, protected, checker, result, refused_once, max_rounds)
    FOLD_DEVICE.reset(fold_on)
    dead = [nid for nid in remove_dead(prog)]
    for nid in dead:
        result.fired.append({"rule": "dead_code", "node": nid,
                             "message": f"removed {nid}: its result is never used"})
    for r in users:   # a neighbour's rewrite may still have replaced one of their nodes
        gone = [n for n in r.nodes if n not in prog.nodes]
        if gone:
            result.refused.append({"rule": "user_region", "node": gone[0],
                                   "message": f"region {r.id} ({r.status}) dropped: a rewrite replaced {gone[0]}"})
        else:
            prog.regions.append(r)
    return result


def _run_rules(prog, rules, protected, checker, result, refused_once, max_rounds) -> None:
    """Apply `rules` node by node, in rounds, until none fires (or max_rounds)."""
    for _ in range(max_rounds):
        fired = False
        for nid in prog.topo_order():
            if nid not in prog.nodes or nid in protected:
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
            return


def _apply(prog: Program, rw: Rewrite, checker: Checker | None, result: RewriteResult) -> bool:
    at = prog.nodes[rw.node_id].name if rw.node_id in prog.nodes else None   # gone after: an earlier
    before_nodes = set(prog.nodes)                                            # rewrite's node, unnamed in both
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
    result.fired.append({"rule": rw.rule, "node": rw.node_id, "node_name": at, "message": rw.why})
    return True


def _rollback(prog: Program, nodes: set, values: set) -> None:
    for nid in [n for n in prog.topo_order() if n not in nodes][::-1]:
        prog.remove_node(nid)
    for vid in [v for v in prog.values if v not in values]:
        prog.values.pop(vid, None)
        prog.data.pop(vid, None)
        if vid in prog.inputs:
            prog.inputs.remove(vid)
