"""The studio's main window: the canvas in the centre; palette, inspector, undo history, generated
source and profiles in docks; menus, toolbar and status bar; files, autosave and settings."""
from __future__ import annotations

import functools
import os
import uuid
from contextlib import nullcontext

from PySide6.QtCore import (QMimeData, QObject, QPoint, QRunnable, QSettings, Qt, QThreadPool,
                            QTimer, Signal)
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QApplication, QDockWidget, QFileDialog, QLabel, QMainWindow, QMenu, QMessageBox,
                               QPushButton, QUndoView, QVBoxLayout, QWidget)

from agent_core.errors import StitchError
from agent_core.gcpause import paused_gc
from agent_core.text import plural
from graph_editor import clipboard
from graph_editor.commands import macro
from graph_editor.edge_item import GroupItem, TerminalItem
from graph_editor.layout import layered_layout
from graph_editor.layout_job import LayoutRunner
from graph_editor.node_item import NodeItem
from graph_editor.palette import PaletteWidget, QuickSearch, ops_accepting
from graph_editor.inspector import Inspector
from graph_editor.scene import GraphScene, program_layout_input
from graph_editor.style import for_theme
from graph_editor.view import GraphView

from . import gui_gc, recovery, settings as stored, theme as themes
from .document import Document, Reader, document_for, load

AUTOSAVE_MS = 30_000
MAX_RECENT = 8
FILE_FILTER = "StitchCUDA programs (*.json);;PyTorch / KernelBench files (*.py);;All files (*)"


class _ReadRelay(QObject):
    done = Signal(object, str, object)   # the job, its path, (program, saved path) or the exception


class _ReadJob(QRunnable):
    """One open on the loader thread. A .py is imported in a child process (app.document.Reader), so
    whatever the file does ends there; cancel() kills that process and the thread is free at once."""

    def __init__(self, path: str, relay: _ReadRelay):
        super().__init__()
        self.setAutoDelete(False)   # the window holds it while it runs, to cancel it
        self.path, self.relay = path, relay
        self.reader = Reader(path)

    def cancel(self) -> None:
        self.reader.cancel()

    def run(self):
        try:
            result = self.reader.read()
        except Exception as e:  # shown to the user with its cause; a bug in an importer included
            result = e if isinstance(e, (StitchError, OSError)) else StitchError(f"{type(e).__name__}: {e}")
        self.relay.done.emit(self, self.path, result)


class MainWindow(QMainWindow):
    opened = Signal(str, bool)   # a background open finished: path, success
    document_set = Signal()      # a new document (and scene) is shown: the agent docks follow

    def __init__(self, theme: str = "dark", restore_settings: bool = True):
        super().__init__()
        gui_gc.hold(self)    # no garbage collection on the pool threads below (gui_gc.py)
        self.destroyed.connect(functools.partial(gui_gc.release_id, id(self), False))   # never closed
        self.theme = theme
        self.session = uuid.uuid4().hex[:8]
        self.settings = QSettings("StitchCUDA", "Studio")
        self.notices: list[str] = []   # start-up files set aside or reset (see notice())
        self.style_ = for_theme(theme)
        self.document: Document | None = None
        self._edits = 0
        self.scene: GraphScene | None = None
        self.layout_runner = LayoutRunner(self)
        self.layout_runner.finished.connect(lambda n: self.status(f"Laid out {plural(n, 'node')}"))
        self.layout_runner.failed.connect(lambda msg: self.status(msg, error=True))
        # prompts go through here so tests (and --screenshot) can answer without a modal dialog
        self.ask = self._ask_dialog

        self.view = GraphView()
        self.view.quick_search_at.connect(lambda pos: self.open_quick_search(pos))
        self.view.zoom_changed.connect(lambda z: self.zoom_label.setText(f"{z * 100:.0f}%"))
        self.setCentralWidget(self.view)
        self.quick = QuickSearch(self)
        self.quick.chosen.connect(self._quick_chosen)
        self._quick_context = None
        self._build_docks()
        self._build_actions()
        self._build_status()
        self.setDockOptions(QMainWindow.AnimatedDocks | QMainWindow.AllowTabbedDocks)
        self.resize(1500, 940)
        self.set_document(Document())
        from .studio_agent import StudioAgent   # regions, source, profiles, decision log, the worker
        self.agent = StudioAgent(self)
        from .bench_follow import BenchFollow     # Agent > Follow Benchmark Run… (bench --events)
        self.bench_follow = BenchFollow(self)
        self._apply_theme(theme)
        if restore_settings:
            self._restore_settings()
        self._autosaved = None
        self._build_loader()
        self.autosave_timer = QTimer(self, interval=AUTOSAVE_MS, timeout=self.autosave)
        self.autosave_timer.start()

    # construction --------------------------------------------------------------------------------
    def add_dock(self, title: str, name: str, widget: QWidget, area) -> QDockWidget:
        """A closable, movable dock holding `widget` (its object name keys the saved layout); View lists
        it once a caller adds d.toggleViewAction() to menu("view")."""
        d = QDockWidget(title, self)
        d.setObjectName(name)
        d.setWidget(widget)
        d.setFeatures(QDockWidget.DockWidgetMovable | QDockWidget.DockWidgetFloatable
                      | QDockWidget.DockWidgetClosable)
        self.addDockWidget(area, d)
        return d

    def _placeholder(self, text: str) -> QWidget:
        w = QWidget()
        lay = QVBoxLayout(w)
        lab = QLabel(text)
        lab.setObjectName("Placeholder")
        lab.setAlignment(Qt.AlignCenter)
        lab.setWordWrap(True)
        lay.addWidget(lab)
        return w

    def _build_docks(self) -> None:
        self.palette = PaletteWidget()
        self.palette.op_activated.connect(lambda op: self.scene and self.scene.add_node(op))
        self.palette_dock = self.add_dock("Ops", "PaletteDock", self.palette, Qt.LeftDockWidgetArea)
        self.inspector = Inspector()
        self.inspector_dock = self.add_dock("Inspector", "InspectorDock", self.inspector, Qt.RightDockWidgetArea)
        self.history = QUndoView()
        self.history.setEmptyLabel("Opened")
        # under the palette: the right column is the inspector's (with the regions), which squeezed
        # between two more docks showed about six lines and cut off its INPUTS section
        self.history_dock = self.add_dock("History", "HistoryDock", self.history, Qt.LeftDockWidgetArea)
        self.splitDockWidget(self.palette_dock, self.history_dock, Qt.Vertical)
        # filled by the agent (next part): the generated CUDA and the live profiles
        self.source_dock = self.add_dock("Generated source", "SourceDock", self._placeholder(
            "No generated source yet.\nIt appears here after Optimize runs: one CUDA kernel per fused region."),
            Qt.BottomDockWidgetArea)
        self.profile_dock = self.add_dock("Profiles", "ProfileDock", self._placeholder(
            "No profile yet.\nKernel times against torch eager and torch.compile appear here after Optimize runs."),
            Qt.BottomDockWidgetArea)
        self.tabifyDockWidget(self.source_dock, self.profile_dock)
        self.source_dock.raise_()
        self.resizeDocks([self.palette_dock, self.inspector_dock], [220, 320], Qt.Horizontal)
        self.resizeDocks([self.palette_dock, self.history_dock], [320, 120], Qt.Vertical)
        self.resizeDocks([self.source_dock], [120], Qt.Vertical)

    def add_action(self, text, slot, shortcut=None, icon=None, tip=None) -> QAction:
        """A window-wide action calling slot() with no arguments (QAction.triggered hands a bool to
        whatever it calls: that once reached optimize() as its argument list). Put it in a menu with
        menu(name).addAction and on the toolbar with toolbar.addAction."""
        a = QAction(text, self)
        if shortcut:
            a.setShortcuts(shortcut if isinstance(shortcut, list) else [QKeySequence(shortcut)])
        if icon:
            a.setData(icon)
        if tip:
            a.setStatusTip(tip)
            a.setToolTip(tip)
        a.setProperty("tip", tip or "")   # what set_enabled(a, True) shows again
        a.triggered.connect(lambda _checked=False: slot())
        self.addAction(a)
        return a

    @staticmethod
    def set_enabled(action: QAction, on: bool, why: str = "") -> None:
        """Enable an action, or grey it out with `why` (what would enable it) as its tooltip and status
        tip: a disabled item always says why."""
        action.setEnabled(on)
        text = (action.property("tip") or "") if on else why
        action.setToolTip(text or action.text().replace("&", ""))
        action.setStatusTip(text)

    def add_menu(self, key: str, title: str) -> QMenu:
        """A menu at the end of the menu bar, found again by menu(key)."""
        self._menus[key] = self.menuBar().addMenu(title)
        return self._menus[key]

    def menu(self, key: str) -> QMenu:
        """The menu bar's menu by key: "file", "edit", "view", "graph" (and "agent" once the agent adds it)."""
        return self._menus[key]

    def _build_actions(self) -> None:
        self._menus: dict[str, QMenu] = {}
        K = QKeySequence
        A = self.add_action
        self.act = {
            "new": A("&New", self.new_document, K.New, "new", "New empty program"),
            "open": A("&Open…", self.open_dialog, K.Open, "open", "Open a program file"),
            "import": A("&Import PyTorch / KernelBench file…", self.import_dialog, "Ctrl+I", "import",
                        "Import a KernelBench .py file (Model, get_inputs, get_init_inputs)"),
            "save": A("&Save", self.save, K.Save, "save", "Save the program"),
            "save_as": A("Save &As…", self.save_as, K.SaveAs),
            "quit": A("&Quit", self.close, K.Quit),
            "cut": A("Cu&t", self.cut, K.Cut),
            "copy": A("&Copy", self.copy, K.Copy),
            "paste": A("&Paste", self.paste, K.Paste),
            "duplicate": A("D&uplicate", self.duplicate, "Ctrl+D"),
            "delete": A("&Delete", self.delete, [K(K.Delete), K("Backspace")], "delete", "Delete the selection"),
            "select_all": A("Select &All", self.select_all, K.SelectAll),
            "add_node": A("&Add node…", lambda: self.open_quick_search(None), None, None,
                          "Search ops to add (Tab on the canvas)"),
            "layout": A("Auto &layout", self.auto_layout, "Ctrl+L", "layout", "Lay out the program (or the selection)"),
            "collapse": A("&Collapse selection", self.collapse, "Ctrl+G", "collapse",
                          "Collapse the selected nodes into one"),
            "expand": A("&Expand group", self.expand, "Ctrl+Shift+G", "expand", "Expand the selected groups"),
            "validate": A("&Validate", self.validate, "F7", None, "Check the program and list its problems"),
            "zoom_in": A("Zoom &in", lambda: self.zoom_by(1.25), K.ZoomIn, "zoom-in"),
            "zoom_out": A("Zoom &out", lambda: self.zoom_by(0.8), K.ZoomOut, "zoom-out"),
            "fit": A("&Fit program", self.fit_all, "F", "fit", "Zoom to fit the whole program (F)"),
            "fit_sel": A("Fit &selection", self.fit_selection, "Shift+F", None, "Zoom to the selected nodes"),
            "theme": A("Toggle &dark / light theme", self.toggle_theme, "Ctrl+Shift+T", "theme"),
        }
        self.act["undo"] = A("&Undo", lambda: self.document.stack.undo(), K.Undo, "undo", "Undo the last edit")
        # the platform's redo keys plus Ctrl+Y and Ctrl+Shift+Z, each once: a key listed twice on one
        # action is an "ambiguous shortcut" and does nothing (Qt's Redo already is Ctrl+Y on some platforms)
        redo_keys = []
        for k in K.keyBindings(K.Redo) + [K("Ctrl+Y"), K("Ctrl+Shift+Z")]:
            if k not in redo_keys:
                redo_keys.append(k)
        self.act["redo"] = A("&Redo", lambda: self.document.stack.redo(), redo_keys, "redo", "Redo the edit undone last")
        for name in ("fit", "delete"):  # single keys act only while the canvas has focus
            self.act[name].setShortcutContext(Qt.WidgetWithChildrenShortcut)
            self.removeAction(self.act[name])
            self.view.addAction(self.act[name])
        m = self.add_menu("file", "&File")
        for k in ("new", "open"):
            m.addAction(self.act[k])
        self.recent_menu = m.addMenu("Open &Recent")
        m.addAction(self.act["import"])
        m.addSeparator()
        m.addAction(self.act["save"])
        m.addAction(self.act["save_as"])
        m.addSeparator()
        m.addAction(self.act["quit"])
        m = self.add_menu("edit", "&Edit")
        for k in ("undo", "redo", None, "cut", "copy", "paste", "duplicate", "delete", None, "select_all"):
            m.addSeparator() if k is None else m.addAction(self.act[k])
        m = self.add_menu("view", "&View")
        for k in ("zoom_in", "zoom_out", "fit", "fit_sel", None, "theme"):
            m.addSeparator() if k is None else m.addAction(self.act[k])
        m.addSeparator()
        for d in (self.palette_dock, self.inspector_dock, self.history_dock, self.source_dock, self.profile_dock):
            m.addAction(d.toggleViewAction())
        m = self.add_menu("graph", "&Graph")
        for k in ("add_node", None, "layout", "collapse", "expand", None, "validate"):
            m.addSeparator() if k is None else m.addAction(self.act[k])
        tb = self.addToolBar("Main")
        tb.setObjectName("MainToolbar")
        tb.setMovable(False)
        for k in ("new", "open", "import", "save", None, "undo", "redo", None, "layout", "fit", "collapse",
                  "expand", None, "zoom_in", "zoom_out", None, "theme"):
            tb.addSeparator() if k is None else tb.addAction(self.act[k])
        self.toolbar = tb

    def _build_status(self) -> None:
        sb = self.statusBar()
        self.status_label = QLabel("Ready")
        self.refusal_label = QLabel("")
        self.refusal_label.setObjectName("Refusal")
        self.count_label = QLabel("")
        self.zoom_label = QLabel("")
        sb.addWidget(self.status_label, 1)
        sb.addWidget(self.refusal_label, 2)
        sb.addPermanentWidget(self.count_label)
        sb.addPermanentWidget(self.zoom_label)
        self._clear_refusal = QTimer(self, singleShot=True, interval=10_000,
                                     timeout=lambda: self.refusal_label.setText(""))

    # theme ---------------------------------------------------------------------------------------
    def _apply_theme(self, name: str) -> None:
        self.theme = name
        app = QApplication.instance()
        themes.apply(app, name)
        for a in self.act.values():
            if a.data():
                a.setIcon(themes.icon(a.data(), name))
        self.style_ = for_theme(name)
        if self.scene is not None:  # canvas colours live in the items: rebuild them in the new style
            self.scene.style = self.style_
            self.scene.setBackgroundBrush(self.style_.background)
            for item in list(self.scene.nodes.values()) + list(self.scene.terminals.values()) + self.scene.groups:
                item.style = self.style_
                item.refresh()
            for e in self.scene.edges.values():
                e.style = self.style_
                e.update()
            self.view.resetCachedContent()
            self.scene.overview.invalidate()
            self.view.minimap.refresh()

    def toggle_theme(self) -> None:
        self._apply_theme("light" if self.theme == "dark" else "dark")
        self.settings.setValue("theme", self.theme)

    # documents ---------------------------------------------------------------------------------------
    def set_document(self, doc: Document) -> None:
        old_scene = self.scene
        if old_scene is not None:
            self.layout_runner.cancel()
            old_scene.detach()
        if self.document is not None:
            recovery.remove(self.document.path, self.session)
        self.document = doc
        doc.edited.connect(self._edited)
        self.scene = GraphScene(doc.program, doc.stack, self.style_, self)
        self.scene.connection_refused.connect(self._refused)
        self.scene.message.connect(self.status)
        self.scene.quick_search_requested.connect(self._quick_from_scene)
        self.scene.selectionChanged.connect(self._selection_changed)
        self.scene.program_changed.connect(self.inspector.model_changed)
        self.scene.program_changed.connect(self._update_counts)
        self.view.set_scene(self.scene)
        if old_scene is not None:
            old_scene.deleteLater()
        self.inspector.set_document(doc.program, doc.stack)
        self.history.setStack(doc.stack)
        self._update_undo()
        doc.changed.connect(self._update_title)
        self._update_title()
        self._update_counts()
        QTimer.singleShot(0, self.view, self.view.show_program)   # dropped if the view is gone by then
        self.view.show_program()
        self.document_set.emit()

    def _update_undo(self) -> None:
        st = self.document.stack
        self.set_enabled(self.act["undo"], st.canUndo(), "Nothing to undo: no edit since the program was opened")
        self.set_enabled(self.act["redo"], st.canRedo(), "Nothing to redo: no edit was undone since the last one")

    def _edited(self) -> None:
        self._edits += 1   # an open in the background asks again only after an edit made meanwhile
        self._update_undo()

    def _update_title(self) -> None:
        d = self.document
        self.setWindowTitle(f"{d.title}[*] — StitchCUDA Studio")
        self.setWindowModified(d.dirty)

    def _update_counts(self) -> None:
        p = self.document.program
        self.count_label.setText(f"{plural(len(p.nodes), 'node')} · {plural(len(p.values), 'value')}")
        self.zoom_label.setText(f"{self.view.zoom() * 100:.0f}%")

    def open_path(self, path: str, layout_sync: bool = False) -> bool:
        """Open (or import) path. On failure the cause is shown and the current document stays."""
        if not self.may_discard():
            return False
        self.status(f"Opening {os.path.basename(path)}…")
        QApplication.setOverrideCursor(Qt.WaitCursor)
        # tens of thousands of new objects: the cyclic GC would rescan the whole heap many times over
        try:
            doc = load(path)
            self.show_document(doc, layout_sync)
        except (StitchError, OSError) as e:
            self.status(f"Could not open {os.path.basename(path)}", error=True)
            self.ask("error", "Could not open the file", f"{path}\n\n{e}")
            return False
        finally:
            QApplication.restoreOverrideCursor()
        if doc.path:
            self._add_recent(doc.path)
        self.status(f"Opened {os.path.basename(path)}: {plural(len(doc.program.nodes), 'node')}")
        return True

    def _build_loader(self) -> None:
        """The loader thread, and File > Cancel opening (Esc, and a Cancel button in the status bar),
        enabled only while an open runs."""
        self._loader = QThreadPool(self)
        self._loader.setMaxThreadCount(1)
        self._load_relay = _ReadRelay(self)
        self._load_relay.done.connect(self._read_done)
        self._reading: _ReadJob | None = None
        act = self.add_action("&Cancel opening", self.cancel_open, "Escape", None, "Stop opening the file (Esc)")
        self.set_enabled(act, False, self._NOT_OPENING)
        self.act["cancel_open"] = act
        menu = self.menu("file")
        after = menu.actions()[menu.actions().index(self.act["import"]) + 1:]
        menu.insertAction(after[0], act) if after else menu.addAction(act)
        self.cancel_open_button = QPushButton("Cancel")
        self.cancel_open_button.setToolTip("Stop opening the file (Esc)")
        self.cancel_open_button.clicked.connect(act.trigger)
        self.cancel_open_button.hide()
        self.statusBar().addPermanentWidget(self.cancel_open_button)

    _NOT_OPENING = "Nothing is being opened: this stops a File > Open or Import under way (Esc)"

    def _loading(self, job: _ReadJob | None) -> None:
        self._reading = job
        self.set_enabled(self.act["cancel_open"], job is not None, self._NOT_OPENING)
        self.cancel_open_button.setVisible(job is not None)

    def open_in_background(self, path: str) -> None:
        """Open or import on a worker thread (an import runs its file in a child process and can take
        seconds); `opened(path, ok)` when done. The window stays usable meanwhile; a second open
        cancels the one under way."""
        if not self.may_discard():
            return
        if self._reading is not None:
            self.cancel_open()
        self.status(f"Opening {os.path.basename(path)}… (Esc cancels)")
        job = _ReadJob(path, self._load_relay)
        job.agreed = (self.document, self._edits)   # what the user agreed to replace (or nothing unsaved)
        self._loading(job)
        self._loader.start(job)

    def cancel_open(self) -> bool:
        """Stop the open under way (an import's child process is killed); the document stays as it was."""
        job = self._reading
        if job is None:
            return False
        self._loading(None)
        job.cancel()
        self.status(f"Cancelled opening {os.path.basename(job.path)}")
        self.opened.emit(job.path, False)
        return True

    def _read_done(self, job: _ReadJob, path: str, result) -> None:
        if job is not self._reading:
            return   # cancelled or replaced by a later open: its result is dropped
        self._loading(None)
        if isinstance(result, BaseException):
            self.status(f"Could not open {os.path.basename(path)}", error=True)
            self.ask("error", "Could not open the file", f"{path}\n\n{result}")
            self.opened.emit(path, False)
            return
        if (self.document, self._edits) != job.agreed and not self.may_discard():
            # an edit (or another document) came while the file was loading: asked again, and refused
            self.opened.emit(path, False)
            return
        doc = document_for(*result)
        self.show_document(doc)
        if doc.path:
            self._add_recent(doc.path)
        self.status(f"Opened {os.path.basename(path)}: {plural(len(doc.program.nodes), 'node')}")
        self.opened.emit(path, True)

    def show_document(self, doc: Document, layout_sync: bool = False) -> None:
        """Show a document read from a file (or a results folder): laid out where it has no positions
        (layout_sync: before this returns, whatever its size), then every dock follows (document_set)."""
        with paused_gc():   # tens of thousands of new objects
            self._layout_if_needed(doc, layout_sync)
            self.set_document(doc)

    def _layout_if_needed(self, doc: Document, sync: bool) -> None:
        """Programs without positions (imports) are laid out before they are shown; loading is not an
        edit, so positions are set directly. Large ones lay out on the worker thread."""
        p = doc.program
        missing = [n for n in p.nodes.values() if n.pos is None]
        if not missing:
            return
        if sync or len(p.nodes) < 300:
            pos = layered_layout(program_layout_input(p))
            for nid, xy in pos.items():
                if nid in p.nodes:
                    p.nodes[nid].pos = (float(xy[0]), float(xy[1]))
        else:
            QTimer.singleShot(0, lambda: self.scene and self.layout_runner.start(self.scene, undoable=False))
            self.layout_runner.finished.connect(self._fit_once)

    def _fit_once(self, _n=0) -> None:
        self.layout_runner.finished.disconnect(self._fit_once)
        self.view.show_program()

    def new_document(self) -> None:
        if self.may_discard():
            self.set_document(Document())
            self.status("New empty program: Tab on the canvas (or right-click) adds an input, a parameter or an op")

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open program", self.last_dir(), FILE_FILTER)
        if path:
            self.open_in_background(path)

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import PyTorch / KernelBench file", self.last_dir(),
                                              "Python files (*.py)")
        if path:
            self.open_in_background(path)

    def save(self) -> bool:
        if not self.document.path:
            return self.save_as()
        return self._save_to(self.document.path)

    def save_as(self, path: str | None = None) -> bool:
        if not path:
            path, _ = QFileDialog.getSaveFileName(self, "Save program", self.last_dir(), FILE_FILTER)
            if not path:
                return False
            if not os.path.splitext(path)[1]:
                path += ".json"
        return self._save_to(path)

    def _save_to(self, path: str) -> bool:
        old = self.document.path
        try:
            self.document.save(path)
        except (StitchError, OSError) as e:
            self.ask("error", "Could not save", f"{path}\n\n{e}")
            return False
        recovery.remove(old, self.session)
        recovery.remove(path, self.session)
        self._add_recent(path)
        self._update_title()
        self.status(f"Saved {path}")
        return True

    def may_discard(self) -> bool:
        """Before replacing or closing a document with unsaved changes: save, discard or cancel."""
        if self.document is None or not self.document.dirty:
            return True
        answer = self.ask("unsaved", "Unsaved changes",
                          f"{self.document.title} has unsaved changes. Save them first?")
        if answer == "save":
            return self.save()
        return answer == "discard"

    def _ask_dialog(self, kind: str, title: str, text: str) -> str:
        if kind == "error":
            QMessageBox.warning(self, title, text)
            return "ok"
        if kind == "unsaved":
            r = QMessageBox.question(self, title, text, QMessageBox.Save | QMessageBox.Discard | QMessageBox.Cancel,
                                     QMessageBox.Save)
            return {QMessageBox.Save: "save", QMessageBox.Discard: "discard"}.get(r, "cancel")
        if kind == "folder":   # the answer is a directory path, "" when cancelled
            return QFileDialog.getExistingDirectory(self, title, self.last_dir())
        if kind == "confirm":
            r = QMessageBox.question(self, title, text, QMessageBox.Yes | QMessageBox.No, QMessageBox.No)
            return "yes" if r == QMessageBox.Yes else "no"
        if kind == "restore":
            r = QMessageBox.question(self, title, text, QMessageBox.Yes | QMessageBox.No, QMessageBox.Yes)
            return "yes" if r == QMessageBox.Yes else "no"
        return "ok"

    # autosave and recovery ------------------------------------------------------------------------
    def autosave(self) -> str | None:
        """Write the recovery copy if the document changed since the last one."""
        d = self.document
        if d is None or not d.dirty:
            return None
        mark = (id(d), d.stack.index(), d.stack.count())
        if mark == self._autosaved:
            return None
        try:
            path = recovery.write(d.program, d.path, self.session)
            self._autosaved = mark
            return path
        except (OSError, StitchError) as e:
            self.status(f"autosave failed: {e}", error=True)
            return None

    def offer_recovery(self) -> bool:
        """After a crash: offer the newest recovery copy that loads; restored documents open unsaved.
        A damaged copy (see recovery.scan; or one whose program does not load) is set aside with a notice."""
        found = recovery.scan()
        for line in found.notices:
            self.notice(line)
        for i, rec in enumerate(found.entries):
            try:
                program, original = recovery.restore(rec["file"])
            except Exception as e:  # whatever is wrong with a copy, it is set aside, never fatal
                why = " ".join(str(e).split())[:200] or type(e).__name__
                self.notice(recovery.set_aside_copy(rec["file"], f"it does not load ({why})"))
                continue
            where = original or "an untitled program"
            also = (f"\n\nDamaged start-up files were set aside or reset: {self.notices[0]}"
                    + (f" (and {len(self.notices) - 1} more in the Decision log)" if len(self.notices) > 1 else "")
                    ) if self.notices else ""
            if self.ask("restore", "Restore unsaved work?",
                        f"StitchCUDA Studio closed without saving changes to {where}. Restore them?{also}") != "yes":
                for r in found.entries[i:]:
                    recovery.discard(r["file"])
                return False
            recovery.discard(rec["file"])
            self.set_document(Document(program, original, dirty=True))
            self.status(f"Restored unsaved work on {where}")
            return True
        return False

    def notice(self, text: str) -> None:
        """A start-up file the studio set aside or reset: one line in the status bar, kept until the
        next problem replaces it, and a row in the Decision log that keeps them all."""
        self.notices.append(text)
        more = f" (and {len(self.notices) - 1} more in the Decision log)" if len(self.notices) > 1 else ""
        self.status(text + more, error=True)
        self._clear_refusal.stop()   # not the usual 10 s: the user may not look at the window at once
        self.agent.log.note(text)

    # settings -----------------------------------------------------------------------------------------
    def _restore_settings(self) -> None:
        """Window geometry, dock layout and recent files; a value of the wrong type or one Qt refuses
        is reset with a notice (settings.py)."""
        for key, what, restore in (("geometry", "window size and position", self.restoreGeometry),
                                   ("windowState", "dock layout", self.restoreState)):
            value, note = stored.byte_array(self.settings, key, what)
            if value is not None and not restore(value):
                note = stored.reject(self.settings, key, what)
            elif value is not None and key == "windowState":
                self.agent.layout_restored(bytes(value))   # docks newer than the saved layout find their place
            if note:
                self.notice(note)
        _, note = stored.recent(self.settings, MAX_RECENT)
        if note:
            self.notice(note)
        self._rebuild_recent()

    def _save_settings(self) -> None:
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("windowState", self.saveState())
        self.settings.setValue("theme", self.theme)

    def _recent(self) -> list[str]:
        return stored.recent(self.settings, MAX_RECENT)[0]

    def _add_recent(self, path: str) -> None:
        path = os.path.abspath(path)
        items = [path] + [p for p in self._recent() if p != path]
        self.settings.setValue("recent", items[:MAX_RECENT])
        self._rebuild_recent()

    def _rebuild_recent(self) -> None:
        self.recent_menu.clear()
        for p in self._recent():
            self.recent_menu.addAction(p, lambda p=p: self.open_in_background(p))
        self.set_enabled(self.recent_menu.menuAction(), bool(self._recent()),
                         "No recent files yet: programs you open or save are listed here")

    def last_dir(self) -> str:
        recent = self._recent()
        return os.path.dirname(recent[0]) if recent else os.getcwd()

    def closeEvent(self, event):
        if not self.may_discard():
            event.ignore()
            return
        self.agent.shutdown()
        self.layout_runner.cancel()
        self.layout_runner.pool.waitForDone(2000)
        self.cancel_open()
        self._loader.waitForDone(2000)
        recovery.remove(self.document.path, self.session)
        self._save_settings()
        self.autosave_timer.stop()
        gui_gc.release_id(id(self))
        event.accept()

    # editing ------------------------------------------------------------------------------------------
    def status(self, text: str, error: bool = False) -> None:
        if error:
            self._refused(text)
        else:
            self.status_label.setText(text)

    def _refused(self, reason: str) -> None:
        self.refusal_label.setText(reason)
        self.refusal_label.setToolTip(reason)
        self._clear_refusal.start()

    def _selection_changed(self) -> None:
        sc = self.scene
        items = sc.selectedItems()
        nodes = [i for i in items if isinstance(i, NodeItem)]
        if len(items) == 1 and nodes:
            self.inspector.show_node(nodes[0].node_id)
        elif len(items) == 1 and isinstance(items[0], TerminalItem):
            self.inspector.show_value(items[0].value_id)
        else:
            self.inspector.show_node(None)
        if len(items) > 1:
            self.status(f"{plural(len(items), 'item')} selected")
        if sc._low_detail:
            sc.overview.update()

    def open_quick_search(self, scene_pos, context=None, ops=None, title="Add node") -> None:
        if scene_pos is None:
            scene_pos = self.view.mapToScene(self.view.viewport().rect().center())
        self._quick_context = (scene_pos, context)
        gp = self.view.viewport().mapToGlobal(self.view.mapFromScene(scene_pos))
        self.quick.open_at(QPoint(gp.x(), gp.y()), ops, title)

    def _quick_from_scene(self, scene_pos, context) -> None:
        if context and context[0] == "out":
            v = self.document.program.values[context[1]]
            self.open_quick_search(scene_pos, context, ops_accepting(v.spec), f"Ops that accept {v.name}")
        elif context and context[0] == "in":
            self.open_quick_search(scene_pos, context, None, "Op that feeds this input")
        else:
            self.open_quick_search(scene_pos)

    def _quick_chosen(self, op: str) -> None:
        if self.scene is None or self._quick_context is None:
            return
        pos, context = self._quick_context
        kw = {}
        if context and context[0] == "out":
            kw["connect_from"] = context[1]
        elif context and context[0] == "in":
            kw["connect_to"] = context[1]
        self.scene.add_node(op, pos, **kw)

    def selected_clip(self) -> dict | None:
        ids = self.scene.selected_node_ids()
        return clipboard.copy_nodes(self.document.program, ids) if ids else None

    def copy(self) -> bool:
        clip = self.selected_clip()
        if clip is None:
            self.status("Nothing selected to copy")
            return False
        text = clipboard.dumps(clip)
        md = QMimeData()
        md.setData(clipboard.MIME, text.encode())
        md.setText(text)  # so it also pastes into a text editor and back
        QApplication.clipboard().setMimeData(md)
        note = f" (data of {', '.join(clip['data_skipped'])} not copied: too large)" if clip["data_skipped"] else ""
        self.status(f"Copied {plural(len(clip['nodes']), 'node')}{note}")
        return True

    def cut(self) -> None:
        if self.copy():
            with macro(self.document.stack, "Cut"):
                self.scene.delete_selection()

    def paste(self) -> list[str]:
        md = QApplication.clipboard().mimeData()
        text = bytes(md.data(clipboard.MIME)).decode() if md.hasFormat(clipboard.MIME) else md.text()
        try:
            clip = clipboard.loads(text)
        except clipboard.ClipError as e:
            self.status(str(e), error=True)
            return []
        return self._paste_clip(clip)

    def _paste_clip(self, clip: dict, at=None) -> list[str]:
        try:
            ids = clipboard.paste(self.document.stack, self.document.program, clip, at=at)
        except StitchError as e:
            self.document.stack.undo()  # the half-made paste macro: nothing stays
            self.status(f"Could not paste: {e}", error=True)
            return []
        self.scene.select_nodes(ids)
        self.status(f"Pasted {plural(len(ids), 'node')}")
        return ids

    def duplicate(self) -> list[str]:
        clip = self.selected_clip()
        if clip is None:
            self.status("Nothing selected to duplicate")
            return []
        return self._paste_clip(clip)

    def delete(self) -> None:
        n = self.scene.delete_selection()
        self.status(f"Deleted {n} items" if n else "Nothing selected to delete")

    def select_all(self) -> None:
        items = [i for i in list(self.scene.nodes.values()) + list(self.scene.terminals.values()) + self.scene.groups
                 if i.isVisible()]
        for item in items:
            item.setSelected(True)
        self.status(f"{plural(len(items), 'item')} selected" if items else "Nothing to select: the program is empty")

    def auto_layout(self) -> None:
        if not self.document.program.nodes:
            self.status("Nothing to lay out: the program is empty")
            return
        ids = self.scene.selected_node_ids()
        self.status(f"Laying out {len(ids) if len(ids) > 1 else len(self.document.program.nodes)} nodes…")
        self.layout_runner.start(self.scene, ids if len(ids) > 1 else None)

    def zoom_by(self, factor: float) -> None:
        before = self.view.zoom()
        self.view.zoom_by(factor)
        if self.view.zoom() == before:
            self.status(f"Zoomed {'in' if factor > 1 else 'out'} as far as it goes ({before * 100:.0f}%)")

    def fit_all(self) -> None:
        if not self.document.program.nodes:
            self.status("Nothing to fit: the program is empty")
            return
        self.view.fit_all()

    def fit_selection(self) -> None:
        if not self.scene.selectedItems():
            self.status("Nothing selected to fit (F fits the whole program)")
            return
        self.view.fit_selection()

    def collapse(self) -> None:
        ids = self.scene.selected_node_ids()
        g = self.scene.collapse(ids)
        if g is not None:
            self.status(f"Collapsed {len(g.members)} nodes into {g.name} (double-click it to expand)")

    def expand(self) -> None:
        groups = [i for i in self.scene.selectedItems() if isinstance(i, GroupItem)]
        if not groups:
            self.status("Select a collapsed group to expand")
            return
        with macro(self.document.stack, f"Expand {len(groups)} groups") if len(groups) > 1 else nullcontext():
            for g in groups:   # one gesture, one undo step
                self.scene.expand(g)

    def validate(self) -> None:
        diags = self.document.program.validate()
        errors = [d for d in diags if d.severity == "error"]
        self.inspector.show_node(None)
        if errors:
            self.status(f"{plural(len(errors), 'error')}: {errors[0].message}", error=True)
            if errors[0].node_id:
                self.scene.select_nodes([errors[0].node_id])
                self.view.fit_selection()
        else:
            self.status(f"The program is valid ({plural(len(diags), 'warning')})")

    def screenshot(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        QApplication.processEvents()
        if not self.grab().save(path):
            raise OSError(f"could not write {path}")

