"""Module groups of an imported model, as plain data (no Qt): which boxes each node sits in, their
titles, and which of them a big program opens collapsed.

A box is drawn for an nn.Module path that holds at least MIN_BOX nodes and has sub-modules of its
own (a BasicBlock, a ResNet stage, a transformer layer); a leaf such as a Linear that became two
nodes, or a two-node downsample, gets no box of its own. The paths come from the importer (agent_core.importers.module_paths).
"""
from __future__ import annotations

from collections import Counter

from agent_core.importers.module_paths import module_tree

MIN_BOX = 3
COLLAPSE_OVER = 150   # a program with more nodes opens with its most repeated blocks collapsed


def _ancestors(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def module_boxes(program) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """(node id -> the boxed module paths around it, outermost first; path -> title)."""
    paths, classes = module_tree(program)
    if not paths:
        return {}, {}
    count: Counter = Counter()
    has_child: set[str] = set()
    for p in paths.values():
        anc = _ancestors(p)
        count.update(anc)
        for a in anc[:-1]:
            has_child.add(a)
    boxed = {a for a, c in count.items() if c >= MIN_BOX and a in has_child}
    chains = {}
    for nid, p in paths.items():
        c = tuple(a for a in _ancestors(p) if a in boxed)
        if c:
            chains[nid] = c
    titles = {a: f"{a} · {classes[a]}" if a in classes else a for a in boxed}
    return chains, titles


def default_collapsed(program) -> list[dict]:
    """For a program over COLLAPSE_OVER nodes: one collapsed group per instance of its most repeated
    module class (ResNet's Bottlenecks, a transformer's layers); deeper paths win a tie."""
    if len(program.nodes) <= COLLAPSE_OVER:
        return []
    chains, titles = module_boxes(program)
    if not chains:
        return []
    _, classes = module_tree(program)
    members: dict[str, list[str]] = {}
    for nid in program.nodes:
        for path in chains.get(nid, ()):
            members.setdefault(path, []).append(nid)
    by_class: Counter = Counter(classes.get(p, "") for p in members if len(members[p]) >= 3)
    by_class.pop("", None)
    if not by_class:
        return []
    depth = {c: max(p.count(".") for p in members if classes.get(p) == c) for c in by_class}
    best = max(by_class, key=lambda c: (by_class[c], depth[c]))
    if by_class[best] < 2:
        return []
    return [{"name": titles[p], "nodes": members[p]} for p in members
            if classes.get(p) == best and len(members[p]) >= 3]


def apply_default_collapse(program) -> None:
    """Collapse the repeated blocks of a big imported program the first time it is shown (a program
    that has an editor state of its own keeps it). Not an edit: opening a file changes nothing."""
    editor = program.metadata.get("editor")
    if isinstance(editor, dict) and "collapsed" in editor:
        return
    groups = default_collapsed(program)
    if groups:
        program.metadata.setdefault("editor", {})["collapsed"] = groups


def with_modules(program, data):
    """`data` (a LayoutInput of program's nodes) with the module boxes around each node and the
    collapsed groups as units of their item's size, so the layout places them as blocks."""
    from .style import GROUP_SIZE
    apply_default_collapse(program)
    chains, _ = module_boxes(program)
    present = set(data.nodes)
    data.groups = {n: chains[n] for n in data.nodes if n in chains}
    editor = program.metadata.get("editor")
    for i, g in enumerate(editor.get("collapsed", []) if isinstance(editor, dict) else []):
        members = [m for m in g.get("nodes", []) if m in program.nodes]
        if members and all(m in present for m in members):
            key = f"\0group{i}"
            data.units[key] = members
            data.sizes[key] = GROUP_SIZE
    return data
