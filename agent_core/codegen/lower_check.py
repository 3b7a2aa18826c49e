"""can_lower: would generate_kernel write one kernel for this group of nodes? (the backend's answer to
the planner's "may these fuse", as Inductor's scheduler asks its backend `can_fuse_vertical`).

The answer comes from the generators themselves, never from a list kept beside them: the group is
copied into a small standalone program (its external inputs become program inputs, the values it must
write become program outputs) and generated there, without compiling. Nodes and values in the copy
carry placeholder names, so the verdict depends only on the group's structure (ops, attributes,
shapes, dtypes, internal edges, which values leave it) and is cached on that; a refusal is re-rendered
with the caller's own names. A planner that asks about thousands of similar groups (the same block
repeated) pays for one generation per distinct structure. The generated kernel's schedule is kept
beside the verdict (lowered_schedule), so the planner describes the kernel codegen writes, not its own
guess of it.
"""
from __future__ import annotations

import json
import re

from ..ir import Node, Program, Role, Value
from .kernel import CodegenError

_CACHE: dict[tuple, tuple[str | None, dict | None]] = {}
_CACHE_LIMIT = 20_000          # distinct group structures kept; cleared when reached
_TOKEN = re.compile(r"@([NV])(\d+)@")


def can_lower(program: Program, node_ids, kind: str | None = None, *, outputs=None) -> str | None:
    """None when generate_kernel(program, node_ids, kind=kind) writes a kernel for these nodes, else
    the generator's one-line reason (naming the caller's nodes and values).

    outputs: the values of the group that are used outside it or returned (the caller often knows
    them already); worked out from the program when not given. A group that starts with a matmul or
    convolution is asked about its epilogue kernel, as generate_kernel does."""
    why, _ = _lowered(program, node_ids, kind, outputs)
    return why


def lowered_schedule(program: Program, node_ids, kind: str | None = None, *, outputs=None) -> dict | None:
    """The default schedule of the kernel generate_kernel writes for these nodes: {"schedule": the
    generator's schedule name (a row kernel's warp, block, stream, cluster, split_row, column,
    split_column), and the row kernel's "row_reads" (times each row is read), "cluster" (CTAs per
    row), "held" (the row kept in registers), "guarded" (inputs loaded only where a where takes them),
    "guarded_rows" (inputs not loaded in rows whose results are discarded: rowguard.py) and
    "staged_windows" (contiguous windows folded through shared memory: reduce_window.py)}; None when
    it writes none."""
    why, sched = _lowered(program, node_ids, kind, outputs)
    return None if why is not None else sched


def _lowered(program: Program, node_ids, kind, outputs) -> tuple[str | None, dict | None]:
    ids = list(dict.fromkeys(node_ids))
    missing = [n for n in ids if n not in program.nodes]
    if not ids or missing:
        return ("the group has no nodes" if not ids else
                f"the group names node '{missing[0]}', which the program does not have"), None
    sub, key, names = _extract(program, ids, kind, outputs)
    if key in _CACHE:
        why, sched = _CACHE[key]
    else:
        why, sched = _verdict(sub, ids, kind)
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = why, sched
    def named(text: str) -> str:      # the extracted group's placeholder names back to the program's
        return _TOKEN.sub(lambda m: names[m.group(1)][int(m.group(2))], text)
    if why is None:
        return None, {**sched, "guarded": [named(n) for n in sched["guarded"]],
                      "guarded_rows": [named(n) for n in sched["guarded_rows"]]}
    return named(why), None


def _verdict(sub: Program, ids: list[str], kind: str | None) -> tuple[str | None, dict | None]:
    from . import _generate       # the dispatch itself, so the answer is the generator's own
    try:
        ks = _generate(sub, ids, name="can_lower", kind=kind, params=None)
    except CodegenError as exc:
        return (str(exc).strip().splitlines()[0] if str(exc).strip() else "the generator refused the group"), None
    except Exception as exc:      # a generator bug: the group would not generate either
        text = str(exc).strip().splitlines()
        return f"the generator failed ({type(exc).__name__}: {text[0] if text else 'no message'})", None
    p = ks.params or {}
    return None, {"schedule": p.get("schedule"), "row_reads": p.get("row_reads"), "cluster": p.get("cluster"),
                  "held": p.get("cached"), "guarded": p.get("guarded", []), "guarded_rows": p.get("guarded_rows", []),
                  "staged_windows": p.get("staged_windows", 0)}


def _escaping(program: Program, ids: list[str]) -> set[str]:
    members = set(ids)
    produced = {v for n in ids for v in program.nodes[n].outputs}
    out = {v for v in produced if v in program.outputs}
    for n in program.nodes.values():
        if n.id not in members:
            out.update(v for v in n.inputs if v in produced)
    return out


def _extract(program: Program, ids: list[str], kind, outputs):
    """(standalone copy of the group with placeholder names, its structure key, token -> real name)."""
    escaping = set(outputs) if outputs is not None else _escaping(program, ids)
    sub = Program("can_lower")
    order = {n: i for i, n in enumerate(ids)}
    node_names, value_names = [], []
    local: dict[str, int] = {}          # value id -> its placeholder number
    parts: list = [kind]
    vals = program.values

    def value_token(vid: str) -> str:
        k = local.get(vid)
        if k is None:
            k = local[vid] = len(value_names)
            value_names.append(vals[vid].name)
        return f"@V{k}@"

    for nid in ids:
        node = program.nodes[nid]
        ins = []
        for vid in node.inputs:
            if vid is None:
                ins.append(None)
                continue
            v = vals[vid]
            if v.producer in order:     # made inside the group: named by its producer's position
                ins.append(("n", order[v.producer], program.nodes[v.producer].outputs.index(vid)))
                continue
            if vid not in sub.values:   # read from outside: a program input of the copy
                role = v.role if v.role in (Role.PARAMETER, Role.CONSTANT) else Role.INPUT
                sub.values[vid] = Value(vid, value_token(vid), tuple(v.shape), v.dtype, role, None, v.init)
                if role == Role.INPUT:
                    sub.inputs.append(vid)
            ins.append(("x", local[vid], tuple(v.shape), v.dtype))
        outs = []
        for vid in node.outputs:
            v = vals[vid]
            if vid not in sub.values:
                sub.values[vid] = Value(vid, value_token(vid), tuple(v.shape), v.dtype, Role.INTERMEDIATE, nid, v.init)
            esc = vid in escaping
            if esc:
                sub.outputs.append(vid)
                sub.values[vid].role = Role.OUTPUT
            outs.append((tuple(v.shape), v.dtype, esc))
        sub.nodes[nid] = Node(nid, node.op, list(node.inputs), list(node.outputs), dict(node.attrs),
                              name=f"@N{len(node_names)}@")
        node_names.append(node.name)
        parts.append((node.op, json.dumps(node.attrs, sort_keys=True, default=repr), tuple(ins), tuple(outs)))
    return sub, tuple(parts), {"N": node_names, "V": value_names}
