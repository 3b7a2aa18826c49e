"""Apply the agent's rewrites to the document as one undo step.

`agent_core.rewrites.rewrite_program` returns a rewritten copy; here the document's program is walked
to that copy through the ordinary model commands (new parameters, new nodes, rewired ports, changed
attributes, outputs, removed nodes), so undo and redo go through the same code as any edit and the
canvas follows from the model's events.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtGui import QUndoCommand, QUndoStack

from agent_core.ir import Program, Role

from .commands import AddInput, AddNode, MarkOutput, RemoveNode, RemoveValue, SetAttrs, SetInput, macro


class SetData(QUndoCommand):
    """Give a parameter the values the rewrites were checked with (it had none: the reference drew
    them). Folded parameters were computed from those values, so they must stay the same."""

    def __init__(self, program: Program, value_id: str, data):
        super().__init__(f"Store values of {program.values[value_id].name}")
        self.program, self.value_id, self.data = program, value_id, np.array(data, copy=True)
        self.old = program.data.get(value_id)

    def redo(self):
        self.program.data[self.value_id] = self.data

    def undo(self):
        if self.old is None:
            self.program.data.pop(self.value_id, None)
        else:
            self.program.data[self.value_id] = self.old


def kept_nodes(program: Program, rewritten: Program) -> set[str]:
    """The nodes the rewrites left in place: the same id with the same op in both programs."""
    return {nid for nid, n in rewritten.nodes.items() if nid in program.nodes and program.nodes[nid].op == n.op}


def apply_rewritten(stack: QUndoStack, program: Program, rewritten: Program,
                    text: str = "Apply rewrites") -> list[str]:
    """Edit `program` into `rewritten` (a rewrite_program result of a copy of it) as one macro.
    Returns the ids, in `program`, of the nodes the rewrites added."""
    same = kept_nodes(program, rewritten)
    vmap = {vid: vid for vid in rewritten.values if vid in program.values}   # rewritten value -> program's
    with macro(stack, text):
        _add_parameters(stack, program, rewritten, vmap)
        added = _add_nodes(stack, program, rewritten, same, vmap)
        for nid in same:
            _rewire(stack, program, rewritten.nodes[nid], vmap)
        _set_outputs(stack, program, [vmap[v] for v in rewritten.outputs])
        keep = same | set(added)
        for nid in reversed(program.topo_order()):
            if nid not in keep:
                stack.push(RemoveNode(program, nid))
        for vid, v in list(program.values.items()):
            if v.role in (Role.PARAMETER, Role.CONSTANT) and vid not in rewritten.values \
                    and not program.consumers(vid):
                stack.push(RemoveValue(program, vid))
    return added


def _add_parameters(stack, program: Program, rewritten: Program, vmap: dict) -> None:
    """Folded parameters (same ids), and the drawn values of parameters the rewrites were checked with."""
    for vid, v in rewritten.values.items():
        if v.role not in (Role.PARAMETER, Role.CONSTANT):
            continue
        if vid not in program.values:
            cmd = AddInput(program, v.name, v.shape, v.dtype, role=v.role, data=rewritten.data.get(vid))
            cmd.value_id = vid
            stack.push(cmd)
            vmap[vid] = vid
        elif vid in rewritten.data and vid not in program.data:
            stack.push(SetData(program, vid, rewritten.data[vid]))


def _add_nodes(stack, program: Program, rewritten: Program, same: set[str], vmap: dict) -> list[str]:
    """The rewrites' new nodes, in dependency order; each takes the place of a node it replaces (in
    order: rules replace a few nodes by fewer)."""
    spots = [program.nodes[nid].pos for nid in program.topo_order() if nid not in same and program.nodes[nid].pos]
    added = []
    for nid in rewritten.topo_order():
        if nid in same:
            continue
        node = rewritten.nodes[nid]
        cmd = AddNode(program, node.op, [vmap.get(i) if i else None for i in node.inputs], node.attrs,
                      pos=node.pos or (spots.pop(0) if spots else None), name=node.name)
        stack.push(cmd)
        added.append(cmd.node_id)
        for mine, theirs in zip(program.nodes[cmd.node_id].outputs, node.outputs):
            vmap[theirs] = mine
    return added


def _rewire(stack, program: Program, node, vmap: dict) -> None:
    """A kept node takes the rewritten program's attributes and inputs."""
    mine = program.nodes[node.id]
    if dict(mine.attrs) != dict(node.attrs):
        stack.push(SetAttrs(program, node.id, node.attrs))
    for port, vid in enumerate(node.inputs):
        want = vmap.get(vid) if vid else None
        if want != (mine.inputs[port] if port < len(mine.inputs) else None):
            stack.push(SetInput(program, node.id, port, want))


def _set_outputs(stack, program: Program, outputs: list[str]) -> None:
    for vid in list(program.outputs):
        if vid not in outputs:
            stack.push(MarkOutput(program, vid, False))
    for vid in outputs:
        if vid not in program.outputs:
            stack.push(MarkOutput(program, vid, True))
    if program.outputs != outputs and sorted(program.outputs) == sorted(outputs):
        stack.push(_Reorder(program, outputs))


class _Reorder(QUndoCommand):
    """Put the outputs back in the rewritten program's return order."""

    def __init__(self, program: Program, order: list[str]):
        super().__init__("Order outputs")
        self.program, self.order, self.old = program, list(order), list(program.outputs)

    def redo(self):
        self.program.outputs[:] = self.order

    def undo(self):
        self.program.outputs[:] = self.old
