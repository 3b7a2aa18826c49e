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


def apply_rewritten(stack: QUndoStack, program: Program, rewritten: Program,
                    text: str = "Apply rewrites") -> list[str]:
    """Edit `program` into `rewritten` (a rewrite_program result of a copy of it) as one macro.
    Returns the ids, in `program`, of the nodes the rewrites added."""
    vmap = {vid: vid for vid in rewritten.values if vid in program.values}
    added: list[str] = []
    # new nodes take the places of the ones they replace, in order (rules replace a few nodes by fewer)
    same = {nid for nid in rewritten.nodes if nid in program.nodes and program.nodes[nid].op == rewritten.nodes[nid].op}
    spots = [program.nodes[nid].pos for nid in program.topo_order() if nid not in same and program.nodes[nid].pos]
    with macro(stack, text):
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
        for nid in rewritten.topo_order():
            node = rewritten.nodes[nid]
            if nid in same:
                continue
            pos = node.pos or (spots.pop(0) if spots else None)
            cmd = AddNode(program, node.op, [vmap.get(i) if i else None for i in node.inputs], node.attrs,
                          pos=pos, name=node.name)
            stack.push(cmd)
            added.append(cmd.node_id)
            for mine, theirs in zip(program.nodes[cmd.node_id].outputs, node.outputs):
                vmap[theirs] = mine
        kept = [nid for nid in rewritten.nodes if nid in same]
        for nid in kept:
            node, mine = rewritten.nodes[nid], program.nodes[nid]
            if dict(mine.attrs) != dict(node.attrs):
                stack.push(SetAttrs(program, nid, node.attrs))
            for port, vid in enumerate(node.inputs):
                want = vmap.get(vid) if vid else None
                have = mine.inputs[port] if port < len(mine.inputs) else None
                if want != have:
                    stack.push(SetInput(program, nid, port, want))
        outputs = [vmap[v] for v in rewritten.outputs]
        for vid in list(program.outputs):
            if vid not in outputs:
                stack.push(MarkOutput(program, vid, False))
        for vid in outputs:
            if vid not in program.outputs:
                stack.push(MarkOutput(program, vid, True))
        if program.outputs != outputs and sorted(program.outputs) == sorted(outputs):
            stack.push(_Reorder(program, outputs))
        keep_nodes = set(kept) | set(added)
        for nid in reversed(program.topo_order()):
            if nid not in keep_nodes:
                stack.push(RemoveNode(program, nid))
        for vid, v in list(program.values.items()):
            if v.role in (Role.PARAMETER, Role.CONSTANT) and vid not in rewritten.values \
                    and not program.consumers(vid):
                stack.push(RemoveValue(program, vid))
    return added


class _Reorder(QUndoCommand):
    """Put the outputs back in the rewritten program's return order."""

    def __init__(self, program: Program, order: list[str]):
        super().__init__("Order outputs")
        self.program, self.order, self.old = program, list(order), list(program.outputs)

    def redo(self):
        self.program.outputs[:] = self.order

    def undo(self):
        self.program.outputs[:] = self.old
