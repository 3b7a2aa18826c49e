"""Undo commands. Each one changes only the Program through its public methods; the scene redraws
from the events those methods emit, so undo can never leave the canvas out of step with the model.

A user gesture that makes several changes is one `macro(stack, text)` block (always closed, even
when a step raises).
"""
from __future__ import annotations

import copy
from contextlib import contextmanager

from PySide6.QtGui import QUndoCommand, QUndoStack

import numpy as np

from agent_core.ir import DEFAULT_PARAMETER_INIT, Program, Role
from agent_core.ops import get_op

SOURCE_ROLES = {"input": Role.INPUT, "parameter": Role.PARAMETER, "constant": Role.CONSTANT}
DEFAULT_INPUT_SHAPE = (8, 16)      # a fresh input until the user types its shape in the inspector
DEFAULT_PARAMETER_SHAPE = (16,)    # where the port does not say what it expects


@contextmanager
def macro(stack: QUndoStack, text: str):
    stack.beginMacro(text)
    try:
        yield
    finally:
        stack.endMacro()


class AddNode(QUndoCommand):
    def __init__(self, program: Program, op: str, inputs=(), attrs=None, pos=None, name=None):
        super().__init__(f"Add {op}")
        inputs = list(inputs)
        # required ports start unconnected (None), so can_connect probes a half-wired node as such
        lo = get_op(op).arity()[0]
        inputs += [None] * (lo - len(inputs))
        self.program, self.op, self.inputs, self.attrs = program, op, inputs, dict(attrs or {})
        self.pos, self.name = pos, name
        self.node_id: str | None = None
        self._record = None

    def redo(self):
        if self._record is not None:
            self.program.restore_node(self._record)
            return
        node = self.program.add_node(self.op, self.inputs, self.attrs, name=self.name, pos=self.pos,
                                     strict=False)
        self.node_id = node.id

    def undo(self):
        self._record = self.program.remove_node(self.node_id)


class RemoveNode(QUndoCommand):
    """Remove a node; its consumers' ports become unconnected (and are reconnected on undo)."""

    def __init__(self, program: Program, node_id: str):
        super().__init__(f"Delete {program.nodes[node_id].name}")
        self.program, self.node_id = program, node_id
        self._record = None

    def redo(self):
        self._record = self.program.remove_node(self.node_id)

    def undo(self):
        self.program.restore_node(self._record)


class AddInput(QUndoCommand):
    """A program input, parameter or constant (a value without a producer)."""

    def __init__(self, program: Program, name: str, shape, dtype="float32", role=Role.INPUT, data=None,
                 init=None):
        super().__init__(f"Add {role.value} {name}")
        self.program, self.name, self.shape, self.dtype = program, name, tuple(shape), dtype
        self.role, self.data, self.init = role, data, init
        self.value_id: str | None = None

    def redo(self):
        p = self.program
        if self.role == Role.INPUT:
            v = p.add_input(self.name, self.shape, self.dtype, init=self.init, value_id=self.value_id)
        else:
            v = p.add_parameter(self.name, self.data, shape=None if self.data is not None else self.shape,
                                dtype=self.dtype, constant=self.role == Role.CONSTANT, value_id=self.value_id,
                                init=self.init)
        self.value_id = v.id

    def undo(self):
        self.program.remove_value(self.value_id)


class RemoveValue(QUndoCommand):
    """Remove an input or parameter; undo puts it back at its place in the call order, with its
    data and its consumers."""

    def __init__(self, program: Program, value_id: str):
        v = program.values[value_id]
        super().__init__(f"Delete {v.role.value} {v.name}")
        self.program, self.value_id = program, value_id
        self.value = v
        self.data = program.data.get(value_id)
        self.index = program.inputs.index(value_id) if value_id in program.inputs else None
        self.uses = program.consumers(value_id)

    def redo(self):
        self.uses = self.program.consumers(self.value_id)
        self.program.remove_value(self.value_id)

    def undo(self):
        p, v = self.program, self.value
        if v.role == Role.INPUT:
            p.add_input(v.name, v.shape, v.dtype, init=v.init, value_id=v.id)
            if self.index is not None:  # add_input appends; the call order is part of the program
                p.inputs.remove(v.id)
                p.inputs.insert(self.index, v.id)
        else:
            p.add_parameter(v.name, self.data, shape=None if self.data is not None else v.shape,
                            dtype=v.dtype, constant=v.role == Role.CONSTANT, value_id=v.id,
                            init=v.init if v.role == Role.PARAMETER else None)
        for nid, port in self.uses:
            p.set_input(nid, port, v.id)


class EditSource(QUndoCommand):
    """Shape, dtype, init or data of an input, parameter or constant (Program.set_source checks
    them; a refused edit raises before the command is pushed, see `push_edit_source`)."""

    def __init__(self, program: Program, value_id: str, changes: dict, text: str):
        super().__init__(text)
        self.program, self.value_id, self.changes = program, value_id, dict(changes)
        self.old: dict | None = None
        self.new: dict | None = None

    def redo(self):
        if self.new is not None:
            self.program.restore_source(self.value_id, self.new)
            return
        self.old = self.program.set_source(self.value_id, **self.changes)
        self.new = self.program.source_state(self.value_id)

    def undo(self):
        self.program.restore_source(self.value_id, self.old)


def add_source(stack: QUndoStack, program: Program, kind: str, connect_to: tuple[str, int] | None = None,
               shape=None) -> tuple[str, str | None]:
    """A new program input, parameter or constant ("input" / "parameter" / "constant"), optionally
    feeding input port `connect_to` = (node id, port): one undo step. Fed into a port it is named
    after it and takes the shape the op expects there when that is known (linear's weight: [out, in]);
    a constant starts as the scalar 1.0. Returns (value id, why the connection was refused or None)."""
    from .port_shapes import expected_shape
    role = SOURCE_ROLES[kind]
    node = program.nodes[connect_to[0]] if connect_to else None
    port_name = node.opdef.port_name(connect_to[1]).rstrip("?") if node else None
    if node is not None and shape is None:
        shape = expected_shape(program, *connect_to)
    data = init = None
    if role == Role.INPUT:
        name, shape = port_name or "x", tuple(shape or DEFAULT_INPUT_SHAPE)
    elif role == Role.PARAMETER:
        name, shape = (f"{node.name}.{port_name}" if node else "w"), tuple(shape or DEFAULT_PARAMETER_SHAPE)
        init = dict(DEFAULT_PARAMETER_INIT)
    else:
        name, shape, data = (f"{node.name}.{port_name}" if node else "c"), (), np.array(1.0, np.float32)
    reason = None
    with macro(stack, f"Add {kind} {name}"):
        cmd = AddInput(program, name, shape, "float32", role, data=data, init=init)
        stack.push(cmd)
        if connect_to is not None:
            reason = program.can_connect(cmd.value_id, *connect_to)
            if reason is None:
                stack.push(SetInput(program, connect_to[0], connect_to[1], cmd.value_id))
    return cmd.value_id, reason


def push_edit_source(stack: QUndoStack, program: Program, value_id: str, changes: dict, text: str) -> None:
    """Check the edit on the model first (raising its one-line reason), then push it as one step:
    a refused edit leaves neither the program nor the undo history changed."""
    state = program.source_state(value_id)
    program.set_source(value_id, **changes)       # raises before anything changed if it is refused
    program.restore_source(value_id, state)
    stack.push(EditSource(program, value_id, changes, text))


class SetInput(QUndoCommand):
    """Connect (or disconnect, value_id=None) one input port. The caller checked can_connect."""

    def __init__(self, program: Program, node_id: str, port: int, value_id: str | None):
        node = program.nodes[node_id]
        verb = "Connect" if value_id else "Disconnect"
        super().__init__(f"{verb} {node.name}.{node.opdef.port_name(port)}")
        self.program, self.node_id, self.port, self.value_id = program, node_id, port, value_id
        self.old = node.inputs[port] if port < len(node.inputs) else None

    def redo(self):
        self.program.set_input(self.node_id, self.port, self.value_id)

    def undo(self):
        self.program.set_input(self.node_id, self.port, self.old)


class SetAttrs(QUndoCommand):
    def __init__(self, program: Program, node_id: str, attrs: dict):
        node = program.nodes[node_id]
        super().__init__(f"Edit {node.name}: " + ", ".join(f"{k}" for k in attrs))
        self.program, self.node_id, self.attrs = program, node_id, dict(attrs)
        self.old: dict | None = None

    def redo(self):
        self.old = self.program.set_attrs(self.node_id, self.attrs)

    def undo(self):
        self.program.set_attrs(self.node_id, self.old)


class Rename(QUndoCommand):
    def __init__(self, program: Program, ident: str, name: str):
        obj = program.nodes.get(ident) or program.values[ident]
        super().__init__(f"Rename {obj.name} to {name}")
        self.program, self.ident, self.name, self.old = program, ident, name, obj.name

    def redo(self):
        self.program.rename(self.ident, self.name)

    def undo(self):
        self.program.rename(self.ident, self.old)


class MarkOutput(QUndoCommand):
    def __init__(self, program: Program, value_id: str, is_output: bool):
        name = program.values[value_id].name
        super().__init__(f"{'Mark' if is_output else 'Unmark'} {name} as output")
        self.program, self.value_id, self.is_output = program, value_id, is_output
        self.index = program.outputs.index(value_id) if value_id in program.outputs else None

    def redo(self):
        self.program.mark_output(self.value_id, self.is_output)

    def undo(self):
        self.program.mark_output(self.value_id, not self.is_output)
        if not self.is_output and self.index is not None:  # back to its place in the return order
            self.program.outputs.remove(self.value_id)
            self.program.outputs.insert(self.index, self.value_id)


class MoveNodes(QUndoCommand):
    """Positions of many nodes in one step (a drag of the selection, or an auto-layout)."""

    def __init__(self, program: Program, moves: dict[str, tuple], text: str = "Move"):
        super().__init__(text)
        self.program = program
        self.new = {k: (float(v[0]), float(v[1])) for k, v in moves.items()}
        self.old = {k: program.nodes[k].pos for k in self.new}

    def redo(self):
        for nid, pos in self.new.items():
            if nid in self.program.nodes:
                self.program.set_pos(nid, pos)

    def undo(self):
        for nid, pos in self.old.items():
            if nid in self.program.nodes:
                self.program.set_pos(nid, pos)


class SetCollapsed(QUndoCommand):
    """Collapse or expand node groups: replaces program.metadata["editor"]["collapsed"] (a list of
    {"name", "nodes"}). The scene rebuilds its group items from the "groups_changed" event."""

    def __init__(self, program: Program, groups: list[dict], text: str):
        super().__init__(text)
        self.program = program
        self.new = _copy_groups(groups)
        self.old = _copy_groups(program.metadata.get("editor", {}).get("collapsed", []))

    def _set(self, groups: list[dict]) -> None:
        self.program.metadata.setdefault("editor", {})["collapsed"] = _copy_groups(groups)
        self.program._emit("groups_changed")  # metadata has no setter of its own that would announce it

    def redo(self):
        self._set(self.new)

    def undo(self):
        self._set(self.old)


def _copy_groups(groups) -> list[dict]:
    return [{"name": g.get("name", "group"), "nodes": list(g.get("nodes", []))} for g in groups]


class SetMetadata(QUndoCommand):
    """Set program.metadata entries, None removing one (the program's tolerance and the precisions it
    allows: app/precision_dialog.py). Nothing on the canvas shows them, so no event is needed."""

    def __init__(self, program: Program, changes: dict, text: str):
        super().__init__(text)
        self.program = program
        self.new = copy.deepcopy(changes)
        self.old = {k: copy.deepcopy(program.metadata.get(k)) for k in changes}

    def _set(self, values: dict) -> None:
        for key, value in values.items():
            if value is None:
                self.program.metadata.pop(key, None)
            else:
                self.program.metadata[key] = copy.deepcopy(value)

    def redo(self):
        self._set(self.new)

    def undo(self):
        self._set(self.old)
