"""A document: one Program, the file it came from, and its undo stack (whose clean state is 'saved')."""
from __future__ import annotations

import os
import threading

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoStack

from agent_core.errors import FileFormatError, StitchError
from agent_core.ir import Program


class Document(QObject):
    changed = Signal()   # dirty state or path changed (the window title follows)
    edited = Signal()    # the undo stack moved: an edit, an undo or a redo

    def __init__(self, program: Program | None = None, path: str | None = None, dirty: bool = False):
        super().__init__()
        self.program = program if program is not None else Program("untitled")
        self.path = path
        self.stack = QUndoStack(self)
        self.stack.setUndoLimit(500)
        self._dirty_without_edit = dirty  # an import or a restored recovery is unsaved before any edit
        # through methods of the document, not lambdas: a stack emits as it is destroyed, and only a
        # receiver's own connections are cut before its children (the stack) go
        self.stack.cleanChanged.connect(self._clean_changed)
        self.stack.indexChanged.connect(self._moved)

    def _clean_changed(self, _clean: bool) -> None:
        self.changed.emit()

    def _moved(self, _index: int) -> None:
        self.edited.emit()

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


class Reader:
    """One open of a file, cancellable from another thread: a project file is parsed here (it never
    runs code); a .py is imported in a child process (agent_core.importers.isolated), so a file that
    loops, exits or crashes ends that process, never the studio. Touches no Qt object."""

    def __init__(self, path: str):
        self.path = path
        self._import = None
        self._cancelled = False
        self._lock = threading.Lock()

    def read(self) -> tuple[Program, str | None]:
        """The program and the path it will save to (None for an import). Raises StitchError (an
        ImportCancelled after cancel()) or OSError with the cause."""
        path = self.path
        if not os.path.exists(path):
            raise FileFormatError(f"{path}: no such file")
        from agent_core.commands.import_cmd import is_python_source, read_program_file
        if is_python_source(path):
            from agent_core.importers.isolated import IsolatedImport
            job = IsolatedImport(path)   # the default limit, 120 s; File > Cancel opening stops it sooner
            with self._lock:  # a cancel() that came first still stops it
                self._import = job
                if self._cancelled:
                    job.cancel()
            return job.run(), None
        try:
            return read_program_file(path), path
        except StitchError:
            raise
        except (UnicodeDecodeError, ValueError) as e:
            raise FileFormatError(f"{path}: {e}") from None

    def cancel(self) -> None:
        """Stop an import under way (its child process is killed); a project file read just finishes."""
        with self._lock:
            self._cancelled = True
            job = self._import
        if job is not None:
            job.cancel()


def read(path: str) -> tuple[Program, str | None]:
    """Reader(path).read(): the program in a project file or an imported .py, and its save path."""
    return Reader(path).read()


def document_for(program: Program, saved_path: str | None) -> Document:
    """An import is unsaved until saved; a project file opens clean."""
    return Document(program, saved_path, dirty=saved_path is None)


def load(path: str) -> Document:
    """read() and wrap the program in a Document (on the GUI thread)."""
    return document_for(*read(path))
