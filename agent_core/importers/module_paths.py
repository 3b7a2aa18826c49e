"""Which nn.Module each imported node came from, so the editor can group a model by its modules.

torch.export records, per FX node, the stack of modules the call ran inside
(node.meta["nn_module_stack"]: key -> (qualified path, class)). note_module() stores the innermost
path for every program node an FX node became, and each path's class name, in
program.metadata["modules"] (plain JSON, so it survives saving):

    {"nodes": {node id: "layer1.0.conv1"}, "classes": {"layer1.0.conv1": "Conv2d", "layer1.0": "BasicBlock"}}

module_tree() reads it back for a program whose nodes may since have been edited.
"""
from __future__ import annotations

import re

_CALL_SUFFIX = re.compile(r"@\d+$")   # a module called twice: "layer1@1" is still layer1


def _class_name(cls) -> str:
    name = cls if isinstance(cls, str) else getattr(cls, "__qualname__", None) or str(cls)
    return name.rsplit(".", 1)[-1].strip("'>")


def note_module(program, fx_node) -> None:
    """Give every program node made since the last call the module path of `fx_node`."""
    meta = program.metadata.setdefault("modules", {"nodes": {}, "classes": {}})
    nodes, classes = meta["nodes"], meta["classes"]
    new = []
    for nid in reversed(program.nodes):   # insertion order: this FX node's nodes are the unrecorded tail
        if nid in nodes:
            break
        new.append(nid)
    stack = list((fx_node.meta.get("nn_module_stack") or {}).values())
    path = ""
    for entry in stack:
        try:
            p, cls = entry
        except (TypeError, ValueError):
            continue
        p = ".".join(_CALL_SUFFIX.sub("", part) for part in str(p).split("."))
        if p:
            classes.setdefault(p, _class_name(cls))
            path = p
    for nid in new:
        nodes[nid] = path


def module_tree(program) -> tuple[dict[str, str], dict[str, str]]:
    """(node id -> innermost module path, path -> class name) for the program's current nodes;
    empty for a program that was not imported from a module."""
    meta = program.metadata.get("modules")
    if not isinstance(meta, dict):
        return {}, {}
    nodes, classes = meta.get("nodes"), meta.get("classes")
    if not isinstance(nodes, dict):
        return {}, {}
    paths = {nid: p for nid, p in nodes.items() if nid in program.nodes and isinstance(p, str)}
    return paths, {k: v for k, v in (classes or {}).items() if isinstance(k, str) and isinstance(v, str)}
