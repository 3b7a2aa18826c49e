"""A document: one Program, the file it came from, and its undo stack (whose clean state is 'saved')."""
from __future__ import annotations

import os

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoStack

from agent_core.errors import FileFormatError, ImportFailure, StitchError
from agent_core.ir import Program

IMPORTABLE = (".py",)


class Document(QObject):
    changed = Signal()   # dirty state or path changed (the window title follows)

    def __init__(self, program: Program | None = None, path: str | None = None, dirty: bool = False):
        super().__init__()
        self.program = program if program is not None else Program("untitled")
        self.path = path
        self.stack = QUndoStack(self)
        self.stack.setUndoLimit(500)
        self._dirty_without_edit = dirty  # an import or a restored recovery is unsaved before any edit
        self.stack.cleanChanged.connect(lambda _: self.changed.emit())

    @property
    def dirty(self) -> bool:
        return self._dirty_without_edit or not self.stack.isClean()

    @property
    def title(self) -> str:
        return os.path.basename(self.path) if self.path else f"{self.program.name} (unsaved)"

    def mark_clean(self) -> None:
        self._dirty_without_edit = False
        self.stack.setClean()
        self.changed.emit()

    def save(self, path: str | None = None) -> None:
        from agent_core.project_file import save_program
        target = path or self.path
        if not target:
            raise FileFormatError("choose a file name first (File ▸ Save As)")
        save_program(self.program, target)
        self.path = target
        self.mark_clean()


def read(path: str) -> tuple[Program, str | None]:
    """The program in a project file (.json) or a PyTorch / KernelBench module (.py, imported), and
    the path it will save to (None for an import). Raises StitchError or OSError with the cause.
    Touches no Qt object, so it may run on a worker thread."""
    if not os.path.exists(path):
        raise FileFormatError(f"{path}: no such file")
    if path.endswith(IMPORTABLE):
        try:
            from agent_core.importers import import_file
        except ImportError as e:
            raise ImportFailure(f"the PyTorch importer is not available: {e}") from None
        return import_file(path), None
    from agent_core.project_file import load_program
    try:
        return load_program(path), path
    except StitchError:
        raise
    except (UnicodeDecodeError, ValueError) as e:
        raise FileFormatError(f"{path}: {e}") from None


def document_for(program: Program, saved_path: str | None) -> Document:
    """An import is unsaved until saved; a project file opens clean."""
    return Document(program, saved_path, dirty=saved_path is None)


def load(path: str) -> Document:
    """read() and wrap the program in a Document (on the GUI thread)."""
    return document_for(*read(path))
