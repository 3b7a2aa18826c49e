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
COLLAPSE_OVER = 150   # a program with more nodes opens with its repeated blocks collapsed ...
SHOWN_AT_MOST = 400   # ... at the deepest level that leaves no more than this many items shown


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
    """For a program over COLLAPSE_OVER nodes: one collapsed group per instance of a repeated module
    class (ResNet's Bottlenecks, a transformer's decoder layers): the deepest class whose collapse
    leaves at most SHOWN_AT_MOST items on the canvas, else the one that leaves the fewest (a
    transformer's attention blocks alone would leave most of each layer open)."""
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
    of_class: dict[str, list[str]] = {}
    for path, ms in members.items():
        if classes.get(path) and len(ms) >= 3:
            of_class.setdefault(classes[path], []).append(path)
    shown, depth = {}, {}
    for cls, paths in of_class.items():
        outer = [p for p in paths if not any(p.startswith(q + ".") for q in paths)]   # not nested in itself
        if len(outer) >= 2:
            of_class[cls] = outer
            shown[cls] = len(program.nodes) - sum(len(members[p]) for p in outer) + len(outer)
            depth[cls] = max(p.count(".") for p in outer)
    if not shown:
        return []
    fits = [c for c in shown if shown[c] <= SHOWN_AT_MOST]
    best = max(fits, key=lambda c: (depth[c], -shown[c])) if fits else min(shown, key=shown.get)
    return [{"name": titles[p], "nodes": members[p]} for p in of_class[best]]


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
    # a box inside a collapsed group is not drawn (ModuleBoxes.refresh): no room is made for it
    inside = hidden_boxes(data.groups, data.units.values())
    if inside:
        data.groups = {n: tuple(p for p in c if p not in inside) for n, c in data.groups.items()}
    return data


def hidden_boxes(chains: dict, groups) -> set[str]:
    """The module paths (of chains: node -> paths) whose nodes all sit in one collapsed group."""
    members: dict[str, set] = {}
    for n, c in chains.items():
        for path in c:
            members.setdefault(path, set()).add(n)
    out = set()
    for g in groups:
        g = set(g)
        for n in g:
            for path in chains.get(n, ()):
                if path not in out and members[path] <= g:
                    out.add(path)
    return out
