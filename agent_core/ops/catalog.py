"""The op library as a table: name, category, ports, attributes, aliases, doc.

`python -m agent_core.ops.catalog` prints the Markdown table that docs/OPS.md carries;
`--write FILE` replaces FILE's generated part with it; `--check FILE` exits 1 when that part is stale.
"""
from __future__ import annotations

import json
import sys

from .registry import CATEGORIES, REQUIRED, Attr, OpDef, aliases_of, all_ops

BEGIN = "<!-- BEGIN GENERATED: python -m agent_core.ops.catalog -->"
END = "<!-- END GENERATED -->"


def _attr(a: Attr) -> str:
    if a.default is REQUIRED:
        text = f"{a.name}: {a.kind}"
    else:
        text = f"{a.name}={json.dumps(a.default)}"
    if a.choices:
        text += " (" + "/".join(map(str, a.choices)) + ")"
    return text


def _row(op: OpDef) -> str:
    ports = ", ".join(op.inputs)
    outs = "" if op.outputs == ("out",) else (" -> 0, 1, ..." if op.outputs == ("0",)
                                             else " -> " + ", ".join(op.outputs))
    attrs = "; ".join(_attr(a) for a in op.attrs) or "-"
    aliases = ", ".join(sorted(aliases_of(op.name))) or "-"
    doc = op.doc or (f"`{op.cuda}`" if isinstance(op.cuda, str) else "")
    doc = doc.replace("|", "\\|")
    return f"| `{op.name}` | {ports}{outs} | {attrs} | {aliases} | {doc} |"


def markdown() -> str:
    ops = all_ops()
    lines = [BEGIN, "", f"{len(ops)} ops.", ""]
    for cat in CATEGORIES:
        members = [o for o in ops if o.category == cat]
        if not members:
            continue
        lines += [f"### {cat} ({len(members)})", "", "| op | inputs | attributes | aliases | what it computes |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [_row(o) for o in members]
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    table = markdown()
    if argv[:1] == ["--write"]:
        text = open(argv[1], encoding="utf-8").read()
        if BEGIN not in text or END not in text:
            print(f"{argv[1]}: no generated part (the {BEGIN} / {END} markers) to replace", file=sys.stderr)
            return 1
        head, rest = text.split(BEGIN, 1)
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(head + table + rest.split(END, 1)[1])
        return 0
    if argv[:1] == ["--check"]:
        text = open(argv[1], encoding="utf-8").read()
        if table not in text:
            print(f"{argv[1]}: the op table is stale; regenerate it with python -m agent_core.ops.catalog",
                  file=sys.stderr)
            return 1
        return 0
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
