"""`stitchcuda show prog.json`: what a program holds and how much work it does, by a simple count.

Bytes are counted op by op (each node reads its inputs once and writes its outputs once, as unfused
kernels would), next to the least any implementation must move (program inputs, parameters and
outputs once); the gap is what fusion can win.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING

from .import_cmd import _count, _fmt_bytes, import_warnings, open_program

if TYPE_CHECKING:   # torch loads when a program does, not when the CLI parses its arguments
    from ..ir import Program

HELP = "summarise a program: nodes by category, parameters, bytes, FLOPs"
COPY_BANDWIDTH = 4.2e12  # bytes/s, measured read + write on the H200 (DESIGN.md)


def add_arguments(parser) -> None:
    parser.add_argument("program", help="a program file (.json), a KernelBench .py file or module:Class")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def summarize(program: Program) -> dict:
    """Everything `show` prints, as plain data."""
    from ..ops import CATEGORIES
    by_cat: Counter = Counter()
    ops: Counter = Counter()
    flops = moved = 0
    uncounted = []
    for nid, n in program.nodes.items():
        ops[n.op] += 1
        try:
            by_cat[n.opdef.category] += 1
            if n.error:
                raise ValueError(n.error)
            flops += program.node_flops(nid)
            moved += program.node_bytes(nid)
        except Exception:  # an unknown op or a broken node is listed, not counted
            uncounted.append(n.name)
    params = program.parameters()
    ins = program.input_specs()
    outs = [program.values[v] for v in program.outputs if v in program.values]
    least = sum(v.nbytes for v in ins) + sum(v.nbytes for v in params) + sum(v.nbytes for v in outs)
    diags = program.validate()

    def tensor(v):
        return {"id": v.id, "name": v.name, "shape": list(v.shape), "dtype": v.dtype, "bytes": v.nbytes}
    return {
        "name": program.name,
        "nodes": len(program.nodes),
        "categories": {c: by_cat[c] for c in CATEGORIES if by_cat[c]},
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "inputs": [tensor(v) for v in ins],
        "outputs": [tensor(v) for v in outs],
        "parameters": [{**tensor(v), "role": v.role.value, "stored": v.id in program.data} for v in params],
        "parameter_bytes": sum(v.nbytes for v in params),
        "flops": flops,
        "bytes_op_by_op": moved,
        "bytes_least": least,
        "memory_floor_us": least / COPY_BANDWIDTH * 1e6,
        "uncounted_nodes": uncounted,
        "regions": [_region(program, r) for r in program.regions],
        "errors": [d.message for d in diags if d.severity == "error"],
        "warnings": [d.message for d in diags if d.severity != "error"] + import_warnings(program),
    }


def _region(program: Program, r) -> dict:
    d = r.to_dict() if hasattr(r, "to_dict") else dict(r)
    names = [program.nodes[n].name if n in program.nodes else n for n in d.get("nodes", [])]
    return {"id": d.get("id"), "kind": d.get("kind"), "status": d.get("status"), "nodes": names,
            "reason": d.get("reason", "")}


def format_summary(s: dict, max_params: int = 12) -> str:
    def spec(t):
        return f"{t['dtype']}[{', '.join(map(str, t['shape']))}]"
    lines = [f"program {s['name']}: {s['nodes']} nodes"
             + (f", {_count(len(s['regions']), 'region')}" if s["regions"] else "")]
    if s["categories"]:
        lines.append("  by category: " + ", ".join(f"{c} {k}" for c, k in s["categories"].items()))
        lines.append("  ops: " + ", ".join(f"{o} x{k}" if k > 1 else o for o, k in s["ops"].items()))
    for key in ("inputs", "outputs"):
        lines.append(f"{key}:" + ("" if s[key] else " none"))
        lines += [f"  {t['name']}: {spec(t)}" for t in s[key]]
    lines.append(f"parameters: {len(s['parameters'])}, {_fmt_bytes(s['parameter_bytes'])}")
    for t in s["parameters"][:max_params]:
        note = "" if t["stored"] else " (no data: drawn at random)"
        kind = "" if t["role"] == "parameter" else f" ({t['role']})"
        lines.append(f"  {t['name']}: {spec(t)}{kind}{note}")
    if len(s["parameters"]) > max_params:
        lines.append(f"  ... and {len(s['parameters']) - max_params} more")
    lines.append(f"work: {s['flops']:,} FLOPs; {_fmt_bytes(s['bytes_op_by_op'])} moved op by op, "
                 f"at least {_fmt_bytes(s['bytes_least'])} "
                 f"({s['memory_floor_us']:.2f} us at 4.2 TB/s)")
    if s["regions"]:
        lines.append("regions:")
        lines += [f"  {r['id']} {r['kind']} ({r['status']}): {', '.join(r['nodes'])}" for r in s["regions"]]
    if s["uncounted_nodes"]:
        lines.append(f"  not counted (errors): {', '.join(s['uncounted_nodes'])}")
    lines += [f"error: {m}" for m in s["errors"]]
    lines += [f"warning: {m}" for m in s["warnings"]]
    if not s["errors"]:
        k = len(s["warnings"])
        lines.append("valid" + (f" ({k} warning{'s' if k > 1 else ''})" if k else ""))
    return "\n".join(lines)


def run(args) -> int:
    s = summarize(open_program(args.program))
    print(json.dumps(s, indent=1) if args.json else format_summary(s))
    return 0
