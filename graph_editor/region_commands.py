"""Undo commands for region edits: agent_core.regions does the edit (checking it is legal) and
returns a RegionEdit; the command replays it (the model's snapshots) on undo and redo."""
from __future__ import annotations

from PySide6.QtGui import QUndoCommand, QUndoStack

from agent_core.errors import StitchError
from agent_core.regions import RegionEdit, redo_edit, undo_edit


class RegionEditCommand(QUndoCommand):
    def __init__(self, program, edit: RegionEdit):
        super().__init__(edit.label)
        self.program, self.edit = program, edit
        self._done = True   # the edit already happened when it was checked; the first redo is a no-op

    def redo(self):
        if self._done:
            self._done = False
            return
        redo_edit(self.program, self.edit)

    def undo(self):
        undo_edit(self.program, self.edit)


def push_region_edit(stack: QUndoStack, program, fn, *args, **kw):
    """Run the region edit fn(program, *args) and push it; (result, None) or (None, the refusal).
    fn returns a RegionEdit or (result, RegionEdit)."""
    try:
        out = fn(program, *args, **kw)
    except StitchError as e:
        return None, str(e)
    result, edit = (out if isinstance(out, tuple) else (out, out))
    stack.push(RegionEditCommand(program, edit))
    return result, None
