"""Auto-layout off the GUI thread: a QRunnable computes positions from a plain-data snapshot and posts
them back with a queued signal; the result is applied as one undo step, or dropped if the program
changed meanwhile or a newer layout was started (cancellation)."""
from __future__ import annotations

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

from . import commands as C
from .layout import LayoutCancelled, LayoutInput, layered_layout


class _Relay(QObject):
    done = Signal(int, object)      # generation, {id: (x, y)}
    failed = Signal(int, str)


class _Job(QRunnable):
    def __init__(self, gen: int, data: LayoutInput, relay: _Relay, is_current):
        super().__init__()
        self.gen, self.data, self.relay, self.is_current = gen, data, relay, is_current

    def run(self):
        try:
            pos = layered_layout(self.data, cancelled=lambda: not self.is_current(self.gen))
        except LayoutCancelled:
            return
        except Exception as e:  # a layout bug must not kill the worker thread silently
            self.relay.failed.emit(self.gen, f"auto-layout failed: {type(e).__name__}: {e}")
            return
        self.relay.done.emit(self.gen, pos)


class LayoutRunner(QObject):
    """Starts layouts for a scene; `finished(n)` after positions were applied, `failed(msg)` else."""
    finished = Signal(int)
    failed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(1)
        self._gen = 0
        self._relay = _Relay(self)
        self._relay.done.connect(self._apply)
        self._relay.failed.connect(lambda gen, msg: gen == self._gen and self.failed.emit(msg))
        self._pending = None

    def start(self, scene, node_ids=None, undoable: bool = True) -> None:
        """Lay out all nodes (or node_ids, placed where their old bounding box began)."""
        self.cancel()
        self._gen += 1
        data = scene.layout_input(node_ids)
        self._pending = (scene, node_ids, undoable, scene.program_changed)
        scene.program_changed.connect(self.cancel)
        self.pool.start(_Job(self._gen, data, self._relay, lambda g: g == self._gen))

    def cancel(self) -> None:
        """Drop the running layout (the program changed, or a new one starts)."""
        if self._pending is not None:
            try:
                self._pending[3].disconnect(self.cancel)
            except (RuntimeError, TypeError):
                pass
            self._pending = None
            self._gen += 1

    def busy(self) -> bool:
        return self._pending is not None

    def wait(self, msecs: int = 60000) -> None:
        """Block until the job is done and its result is applied (screenshots, tests)."""
        from PySide6.QtCore import QCoreApplication
        self.pool.waitForDone(msecs)
        QCoreApplication.processEvents()

    def _apply(self, gen: int, pos: dict) -> None:
        if gen != self._gen or self._pending is None:
            return
        scene, node_ids, undoable, sig = self._pending
        self.cancel()
        moves = {k: v for k, v in pos.items() if k in scene.program.nodes}
        if node_ids is not None and moves:
            # keep a partial layout where the selection was
            xs = [scene.program.nodes[k].pos or (0.0, 0.0) for k in moves]
            ox, oy = min(p[0] for p in xs), min(p[1] for p in xs)
            nx, ny = min(p[0] for p in moves.values()), min(p[1] for p in moves.values())
            moves = {k: (x - nx + ox, y - ny + oy) for k, (x, y) in moves.items()}
        apply_positions(scene, moves, undoable)
        self.finished.emit(len(moves))


def apply_positions(scene, moves: dict, undoable: bool = True) -> None:
    """Set many node positions: one undo step, or directly (a file being opened is not an edit)."""
    scene._positioning = True  # terminals are placed once at the end, not after every node
    try:
        if undoable:
            scene.stack.push(C.MoveNodes(scene.program, moves, "Auto layout"))
        else:
            for nid, p in moves.items():
                scene.program.set_pos(nid, p)
    finally:
        scene._positioning = False
    scene.place_groups()
    scene._place_terminals()
    scene.fit_scene_rect()
