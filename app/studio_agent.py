"""The agent in the studio: the region overlay and list, the source view, the profiles and the
decision log, and the runs that fill them (Plan in-process; Optimize in a worker process; a results
folder replayed). One selected region is shared by all of them.

A run never edits the document while it runs: the worker optimizes a saved copy, and only a run that
finished has its regions (with sources and measurements) applied, as one undoable edit. A worker that
crashes, hangs or is cancelled leaves the document exactly as it was.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from PySide6.QtCore import QObject, QRunnable, Qt, QThreadPool, Signal
from PySide6.QtWidgets import QFileDialog, QProgressBar, QSizePolicy

from agent_core.agent.progress import RegionProgress
from agent_core.errors import StitchError
from agent_core.text import plural
from graph_editor.live_regions import LiveRegionOverlay
from graph_editor.region_commands import RegionEditCommand
from graph_editor.region_item import RegionOverlay
from graph_editor.region_list import RegionList
from profiler_view.panel import ProfilePanel

from .decision_log import DecisionLog
from .results import read_results
from .source_view import SourceView
from .worker_client import WorkerClient
from .writer_dock import WriterDock


class _ExportRelay(QObject):
    done = Signal(str, object)   # output folder, (program name, ExportResult) or the exception


class _ExportJob(QRunnable):
    """Rebuilds the program from its JSON snapshot and exports it, off the GUI thread. The snapshot is
    taken on the GUI thread, so edits made meanwhile (and the plan the export adds to a program without
    regions) never reach the document."""

    def __init__(self, snapshot: dict, outdir: str, relay: _ExportRelay, protect=()):
        super().__init__()
        self.snapshot, self.outdir, self.relay, self.protect = snapshot, outdir, relay, protect

    def run(self):
        from agent_core.export import export_program
        from agent_core.project_file import program_from_json
        try:
            program = program_from_json(self.snapshot)
            # written beside outdir and moved there when complete; the dialog has no --force
            result = (program.name, export_program(program, self.outdir, protect=self.protect, hint=None))
        except Exception as e:  # shown in the status bar; a bug in the exporter included
            result = e if isinstance(e, (StitchError, OSError)) else StitchError(f"{type(e).__name__}: {e}")
        self.relay.done.emit(self.outdir, result)


class StudioAgent(QObject):
    exported = Signal(str, bool)   # an export finished: output folder, success
    rewrites_checked = Signal()    # Agent > Rewrites' check ended (its dialog is open, or the status says why)

    def __init__(self, window):
        super().__init__(window)
        w = self.window = window
        self.overlay: RegionOverlay | None = None
        self.live: LiveRegionOverlay | None = None   # hulls of the run in progress
        self.current: str | None = None
        self.compile_errors: dict[str, str] = {}
        self.run_dir: str | None = None
        self.run_document = None          # the document the running (or last) Optimize started from
        self.stopped_run = False          # the running worker was stopped by New or Open
        self.rewrite_check = None        # the running or last RewriteCheck
        self.rewrite_dialog = None
        self.rewrite_progress = None
        # what Agent > Optimize passes the worker (tests add --no-tune and friends for speed)
        self.worker_args: tuple[str, ...] = ("--no-rewrite",)
        self.progress = RegionProgress()   # regions done of those planned, and the time left
        self.source = SourceView()
        self.profiles = ProfilePanel()
        self.regions = RegionList()
        self.log = DecisionLog()
        self.writer = WriterDock()
        self.writer_dialog = None         # Settings > Kernel Writer…, while open
        self.precision_dialog = None      # Agent > Precision and Tolerance…, while open
        from . import writer_settings
        self._writer, notes = writer_settings.load(w.settings)   # the endpoint as last saved
        w.notices.extend(notes)   # shown in the decision log, with the other start-up repairs
        self.asking: str | None = None    # the region the running worker asks the model about
        self.worker = WorkerClient(self)
        w.source_dock.setWidget(self.source)
        # the region title above the source may be clipped rather than widen the dock: its full text would
        # hold the source dock at 650 px and squeeze the profile plots (their titles were cut off)
        self.source.title.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.source.title.setMinimumWidth(120)
        w.profile_dock.setWidget(self.profiles)
        # source beside the profiles (the editor had them tabbed): both in view while the agent runs.
        # Rearranged before any new dock is tabified: moving a dock later leaves a stray tab bar behind.
        w.removeDockWidget(w.profile_dock)
        w.addDockWidget(Qt.BottomDockWidgetArea, w.profile_dock)
        w.profile_dock.show()
        w.splitDockWidget(w.source_dock, w.profile_dock, Qt.Horizontal)
        self.regions_dock = w.add_dock("Regions", "RegionsDock", self.regions, Qt.RightDockWidgetArea)
        w.splitDockWidget(w.inspector_dock, self.regions_dock, Qt.Vertical)
        self.log_dock = w.add_dock("Decision log", "DecisionLogDock", self.log, Qt.BottomDockWidgetArea)
        w.tabifyDockWidget(w.source_dock, self.log_dock)
        # the conversation beside the source (the wide side, with the profiles): the kernel and the
        # proposal's diff can be read together
        self.writer_dock = w.add_dock("Kernel writer", "WriterDock", self.writer, Qt.BottomDockWidgetArea)
        w.tabifyDockWidget(w.profile_dock, self.writer_dock)
        w.profile_dock.raise_()
        w.source_dock.raise_()
        w.resizeDocks([w.source_dock, w.profile_dock], [440, 1060], Qt.Horizontal)
        w.resizeDocks([w.source_dock], [360], Qt.Vertical)
        w.resizeDocks([w.inspector_dock, self.regions_dock], [300, 200], Qt.Vertical)
        self.source.trials_for = lambda rid: self.profiles.data.tuning.get(rid, [])
        self.regions.selected_nodes = lambda: w.scene.selected_node_ids() if w.scene else []
        self.regions.region_selected.connect(self.select_region)
        self.regions.collapse_requested.connect(self.collapse_region)
        self.regions.message.connect(lambda text, err: w.status(text, error=err))
        self.profiles.region_clicked.connect(self.select_region)
        self.log.entry_clicked.connect(self._log_clicked)
        self.writer.show_source.connect(self._show_proposal)
        self.regions.tree.setContextMenuPolicy(Qt.CustomContextMenu)
        self.regions.tree.customContextMenuRequested.connect(
            lambda pos: self.region_menu(pos).exec(self.regions.tree.viewport().mapToGlobal(pos)))
        self.worker.event.connect(self._live_event)
        self.worker.bad_line.connect(self._bad_line)
        self.worker.finished.connect(self._run_finished)
        self._exporter = QThreadPool(self)
        self._exporter.setMaxThreadCount(1)
        self._export_relay = _ExportRelay(self)
        self._export_relay.done.connect(self._export_done)
        self._actions()
        self.bar = QProgressBar()
        self.bar.setMaximumWidth(160)
        self.bar.setMaximumHeight(14)
        self.bar.setTextVisible(True)
        self.bar.hide()
        w.statusBar().addPermanentWidget(self.bar)
        w.document_set.connect(self.document_set)
        self.writer.set_notice(self._writer_notice())
        self.document_set()

    def _actions(self) -> None:
        w = self.window
        A = w.add_action
        self.act = {
            "plan": A("&Plan regions", self.plan, "Ctrl+Shift+P", None,
                      "Run the fusion planner (fast, no GPU): regions appear on the canvas"),
            "rewrite": A("&Rewrites…", self.rewrite, "Ctrl+Shift+R", None,
                         "Show the algebraic rewrites the agent would make, before and after; apply them as one undo step"),
            "optimize": A("&Optimize", self.optimize, "F5", None,
                          "Generate, compile, verify and time CUDA for the regions in a worker process"),
            "cancel": A("&Cancel Optimize", self.cancel, "Shift+F5", None, "Stop the running worker"),
            "precision": A("Precision and &Tolerance…", self.precision_settings, None, None,
                           "The tolerance results are verified within, and the lower precisions (TF32, fp16, "
                           "bf16) matmuls and convolutions may run in; saved with the program"),
            # Ctrl+Shift+M(odel): no other action has it, nor has Qt's standard keys
            "ask_model": A("Ask the &Model for the Selected Region", self.ask_model, "Ctrl+Shift+M", None,
                           "Let the kernel writer's model propose CUDA for the selected region; it is kept only "
                           "if it passes every check and is faster than ours"),
            "writer_settings": A("&Kernel Writer…", self.writer_settings, None, None,
                                 "The model endpoint that proposes kernels: URL, model, rounds, token caps, API key"),
            "open_results": A("Open &results…", self.open_results_dialog, "Ctrl+Shift+O", None,
                              "Open a folder written by stitchcuda optimize (program, events, profile)"),
            "export": A("E&xport CUDA project…", self.export_dialog, "Ctrl+E", None,
                        "Write the program as a standalone CUDA project (kernels, CMake, driver) into an empty folder"),
        }
        self._running(False)
        m = w.add_menu("agent", "&Agent")
        for k in ("plan", "rewrite", "optimize", "cancel", None, "precision", "ask_model"):
            m.addSeparator() if k is None else m.addAction(self.act[k])
        w.add_menu("settings", "&Settings").addAction(self.act["writer_settings"])
        file_menu = w.menu("file")
        file_menu.insertAction(w.act["import"], self.act["open_results"])
        file_menu.insertAction(w.act["quit"], self.act["export"])
        file_menu.insertSeparator(w.act["quit"])
        for d in (self.regions_dock, self.log_dock, self.writer_dock):
            w.menu("view").addAction(d.toggleViewAction())
        w.toolbar.addSeparator()
        for k in ("plan", "optimize", "cancel"):
            w.toolbar.addAction(self.act[k])

    def layout_restored(self, state: bytes) -> None:
        """A dock layout saved before the Kernel writer dock existed put it beside the profiles, squeezed:
        it goes in their tab instead."""
        if self.writer_dock.objectName().encode("utf-16-be") not in state:
            self.window.tabifyDockWidget(self.window.profile_dock, self.writer_dock)
            self.window.profile_dock.raise_()

    def _running(self, on: bool) -> None:
        """Optimize and Cancel Optimize follow the worker; the greyed-out one says why."""
        w = self.window
        w.set_enabled(self.act["optimize"], not on, "Optimize is running: Shift+F5 (Cancel Optimize) stops it")
        w.set_enabled(self.act["cancel"], on, "Nothing to cancel: Optimize (F5) is not running")
        self._update_ask()

    def _update_ask(self) -> None:
        """Ask the Model is greyed out with the reason while it cannot run."""
        why = self.ask_blocker()
        self.window.set_enabled(self.act["ask_model"], why is None, why or "")

    def ask_blocker(self) -> str | None:
        """Why Ask the Model cannot run now, or None."""
        from .writer_settings import NO_ENDPOINT
        if not self.writer_settings_now().enabled:
            return NO_ENDPOINT
        if self.worker.running:
            return "A run is going: Shift+F5 (Cancel) stops it"
        if self.current is None:
            return "Select a region first (on the canvas or in the Regions list)"
        return None

    # document and selection ------------------------------------------------------------------------
    def document_set(self) -> None:
        """A new document (File > New, Open, Open results, a restored copy): every dock forgets the old
        program and its run (regions, source, profiles and summary, decision log), then shows what the
        new file holds: its regions, and its last profile or else its planned regions' estimates. A run
        still going on the old document is stopped (its results name the old program's nodes)."""
        w = self.window
        if self.precision_dialog is not None:    # it edits the old document's program
            self.precision_dialog.close()
            self.precision_dialog = None
        if self.worker.running:
            self.stopped_run = True   # what it still prints, and its end, no longer concern the docks
            self.worker.cancel()
        self._end_live()
        if self.overlay is not None:
            self.overlay.detach()
            self.overlay.deleteLater()
        self.overlay = RegionOverlay(w.scene, self)
        self.overlay.region_clicked.connect(self.select_region)
        program = w.document.program
        self.regions.set_document(program, w.document.stack)
        self.source.set_program(program)
        self.current = None
        self.compile_errors.clear()
        if getattr(self, "_watched", None) is not None:
            self._watched.unsubscribe(self._program_event)
        self._watched = program
        self._watched.subscribe(self._program_event)
        self.log.clear()
        self.writer.clear()
        for line in w.notices:   # start-up files set aside: not part of any run, kept in the log
            self.log.note(line)
        self.profiles.reset()
        self._show_saved_profile(program)

    def _show_saved_profile(self, program) -> None:
        """The profile a program file keeps from its last run, else its regions' planner estimates."""
        from agent_core.regions import active_regions
        regions = active_regions(program)
        if isinstance(program.profile, dict) and program.profile:
            try:
                self.profiles.load_profile(program.profile, program.regions)
                return
            except (TypeError, ValueError, KeyError, AttributeError) as e:   # the file's free-form part
                self.profiles.reset()
                self.log.note(f"the saved profile of {program.name} could not be shown ({type(e).__name__}: "
                              f"{e}); its regions' estimates are shown instead")
        if any(r.est_before_ms is not None for r in regions):
            self.profiles.show_estimates(regions)

    def _program_event(self, event: str, payload: dict) -> None:
        if event == "regions_changed" and self.current is not None:
            if not any(r.id == self.current for r in self.window.document.program.regions):
                self.select_region(None)
            else:
                self.source.refresh()

    def select_region(self, region_id: str | None) -> None:
        """Select a region everywhere: its hull, its row, its source."""
        self.current = region_id
        if self.overlay is not None:
            self.overlay.select(region_id)
            item = self.overlay.items.get(region_id)
            if item is not None and item.isVisible():
                self.window.view.ensureVisible(item, 40, 40)
        self.regions.select(region_id)
        self.source.show_region(region_id)
        self._update_ask()
        if region_id in self.compile_errors:
            self.source.show_compile_error(self.compile_errors[region_id])
        self.window.source_dock.raise_()
        if region_id:
            self.window.status(f"Region {region_id} selected")

    def collapse_region(self, region_id: str) -> None:
        from agent_core.regions import get_region
        r = get_region(self.window.document.program, region_id)
        g = self.window.scene.collapse(r.nodes, name=f"{r.id} {r.kind.replace('_', ' ')}")
        if g is not None:
            self.window.status(f"Collapsed region {r.id} into one node (double-click it to expand)")

    def _log_clicked(self, e: dict) -> None:
        if e.get("region"):
            self.select_region(e["region"])
        elif e.get("event") == "rewrite":
            nodes = [n for n in (e.get("nodes") or [e.get("node")]) if n in self.window.scene.nodes]
            if nodes:     # the node it fired at, or (applied from the studio) the nodes it put there
                self.window.scene.select_nodes(nodes)
                self.window.view.fit_selection()

    # plan (in-process) -------------------------------------------------------------------------------
    def plan(self) -> None:
        from .problems import refuse_if_invalid
        if not self.window.document.program.nodes:
            self.window.status("Nothing to plan: the program is empty", error=True)
            return
        if refuse_if_invalid(self.window, "Plan"):
            return
        self.regions.plan()
        p = getattr(self.regions, "last_plan", None)
        if p is not None:
            self.profiles.reset()
            self.profiles.data.plan = {"unfused_ms": p.estimate.unfused_ms, "planned_ms": p.estimate.planned_ms,
                                       "floor_ms": p.estimate.floor_ms}
            self.profiles.show_estimates(p.active)
            self.log.note(f"planned {plural(len(p.active), 'region')}, {plural(p.kernels, 'kernel')} in {p.seconds * 1e3:.0f} ms", "info")
            for r in p.active:
                self.log.add({"event": "region-proposed", "region": r.id, "kind": r.kind, "nodes": r.nodes,
                              "reason": r.reason})

    # rewrites (checked on the CPU reference, in a child process) ----------------------------------
    def rewrite(self) -> None:
        """Agent > Rewrites: check the rewrites in a child process while a progress dialog offers
        Cancel; the before/after dialog (self.rewrite_dialog) opens when the check ends, or the status
        bar says why not. `rewrites_checked` is emitted either way."""
        from PySide6.QtWidgets import QProgressDialog

        from .rewrite_dialog import RewriteCheck, too_big_reason
        w = self.window
        program = w.document.program
        if self.rewrite_check is not None and self.rewrite_check.running:
            w.status("The rewrites are already being checked (Cancel in the progress dialog stops it)", error=True)
            return
        if not program.nodes:
            w.status("Nothing to rewrite: the program is empty", error=True)
            return
        why = too_big_reason(program)
        if why and w.ask("confirm", "Check the rewrites anyway?", f"{why[0].upper()}{why[1:]}. Check anyway? "
                         "(The editor stays usable, and Cancel stops the check.)") != "yes":
            w.status(f"Rewrites not checked: {why}")
            return
        try:
            check = self.rewrite_check = RewriteCheck(program, check_anyway=bool(why), parent=self)
        except (StitchError, OSError) as e:
            w.status(f"Rewrites could not be checked: {e}", error=True)
            return
        busy = self.rewrite_progress = QProgressDialog("Checking the rewrites on the reference…", "Cancel", 0, 0, w)
        busy.setWindowTitle("Rewrites")
        busy.setValue(0)            # at its minimum, so the 300 ms below replaces Qt's 4 s show delay
        busy.setMinimumDuration(300)
        busy.canceled.connect(check.cancel)
        signature = _structure(program)

        def ended():
            busy.canceled.disconnect(check.cancel)
            busy.reset()
            self.rewrites_checked.emit()
        check.ready.connect(lambda preview: (self._show_rewrites(preview, signature), ended()))
        check.failed.connect(lambda message: (w.status(message, error="cancelled" not in message), ended()))
        w.status("Checking the rewrites…")

    def _show_rewrites(self, preview, signature) -> None:
        from .rewrite_dialog import RewriteDialog
        w = self.window
        if preview.program is not w.document.program:
            w.status("The document changed while the rewrites were checked: open Rewrites again", error=True)
            return
        if not preview.fired:
            refused = f" ({len(preview.refused)} refused by their check)" if preview.refused else ""
            w.status(preview.summary + refused)
            return
        dlg = self.rewrite_dialog = RewriteDialog(preview, w)
        dlg.apply_requested.connect(lambda: self._apply_rewrites(preview, signature))
        dlg.show()
        w.status(preview.summary)

    def _apply_rewrites(self, preview, signature) -> None:
        from graph_editor.rewrite_commands import apply_rewritten
        w = self.window
        doc = w.document
        if doc.program is not preview.program or _structure(doc.program) != signature:
            w.status("The program changed since the rewrites were checked: open Rewrites again", error=True)
            return
        n, before = len(preview.fired), len(doc.program.nodes)
        added = apply_rewritten(doc.stack, doc.program, preview.rewritten,
                                text=f"Apply {plural(n, 'rewrite')}")
        for e in preview.fired:
            self.log.add({"event": "rewrite", "rule": e["rule"], "message": e["message"], "kept": True,
                          "node": e.get("node"), "nodes": added})
        w.scene.select_nodes(added)
        w.status(f"Applied {plural(n, 'rewrite')}: {plural(before, 'op')} became {len(doc.program.nodes)} "
                 "(Ctrl+Z undoes)")

    # the kernel writer (a model proposes a region's kernel; docs/WRITER.md) ------------------------
    def writer_settings_now(self):
        """The endpoint as last saved (Settings > Kernel Writer…)."""
        return self._writer

    def _writer_notice(self) -> str:
        ws = self._writer
        if not ws.enabled:
            return "No model endpoint is set: Settings > Kernel Writer… turns the kernel writer on."
        return f"{ws.model} at {ws.url}. {ws.notice()}"

    def precision_settings(self) -> None:
        """Agent > Precision and Tolerance…: the program's own (not modal; Save is one undo step)."""
        from .precision_dialog import PrecisionDialog
        if self.precision_dialog is not None and self.precision_dialog.isVisible():
            self.precision_dialog.raise_()
            self.precision_dialog.activateWindow()
            return
        w = self.window
        try:
            dlg = PrecisionDialog(w.document.program, w.document.stack, w)
        except StitchError as exc:     # a project file's malformed setting: say so, keep the program
            w.status(f"Precision and Tolerance: {exc}", error=True)
            return
        self.precision_dialog = dlg
        dlg.saved.connect(w.status)
        dlg.show()

    def writer_settings(self) -> None:
        """Settings > Kernel Writer…: the endpoint dialog (not modal: the studio stays usable)."""
        from .writer_settings import WriterSettingsDialog
        if self.writer_dialog is not None and self.writer_dialog.isVisible():
            self.writer_dialog.raise_()
            self.writer_dialog.activateWindow()
            return
        dlg = self.writer_dialog = WriterSettingsDialog(self.window.settings, self.window)
        dlg.saved.connect(self._writer_saved)
        dlg.show()
        self.window.status("Kernel writer: set the model endpoint (no URL keeps the writer off)")

    def _writer_saved(self, ws) -> None:
        self._writer = ws
        self.writer.secrets = {ws.key} if ws.key else set()
        self.writer.set_notice(self._writer_notice())
        self._update_ask()
        self.window.status(f"Kernel writer: {ws.model} at {ws.host()}" if ws.enabled else "Kernel writer: off")

    def _bar_text(self, text: str) -> None:
        """The progress bar's text, with the bar as wide as the text needs ("2/9 regions, about 40 s left"
        wraps and clips in the 160 px it starts with)."""
        self.bar.setFormat(text)
        self.bar.setFixedWidth(max(160, self.bar.fontMetrics().horizontalAdvance(text) + 24))

    def region_menu(self, pos) -> "QMenu":
        """The Regions list's right-click menu at viewport `pos`: the row under it is selected first."""
        from PySide6.QtWidgets import QMenu
        item = self.regions.tree.itemAt(pos)
        if item is not None and not item.isSelected():
            self.regions.tree.setCurrentItem(item)
        menu = QMenu(self.regions.tree)
        menu.addAction(self.act["ask_model"])
        return menu

    def ask_model(self) -> bool:
        """Agent > Ask the Model for the Selected Region: the worker runs the agent on a saved copy of the
        program with the writer on for that one region, its conversation streaming into the Kernel
        writer dock; Cancel (Shift+F5) stops it, and the document changes only when it finished."""
        w = self.window
        why = self.ask_blocker()
        if why:
            w.status(f"Ask the model: {why}", error=True)
            return False
        ws, rid = self._writer, self.current
        self.writer.secrets = {ws.key} if ws.key else set()
        self.writer.begin(rid, self._writer_notice())
        self.writer_dock.show()
        self.writer_dock.raise_()
        if not self._start_worker("Ask the model", [*self.worker_args, *ws.worker_args(rid)], ws.worker_env()):
            return False
        self.asking = rid
        w.status(f"Asking {ws.model} for region {rid}…")
        return True

    def _show_proposal(self, title: str, source: str, note: str) -> None:
        self.source.show_text(title, source, note)
        self.window.source_dock.show()
        self.window.source_dock.raise_()

    # optimize (worker process) ---------------------------------------------------------------------
    def optimize(self) -> bool:
        """Start the worker on a saved copy of the program, with `worker_args` (--no-rewrite: the results
        must name the document's own nodes to be applied to it)."""
        return self._start_worker("Optimize", self.worker_args)

    def _start_worker(self, what: str, args, env=None) -> bool:
        from agent_core.project_file import save_program

        from .problems import refuse_if_invalid
        w = self.window
        if not self.worker.running and refuse_if_invalid(w, what):
            return False
        if self.worker.running:
            w.status(f"{self.worker.what} is already running (Shift+F5 cancels it)", error=True)
            return False
        program = w.document.program
        if not program.nodes:
            w.status("Nothing to optimize: the program is empty", error=True)
            return False
        self._cleanup()
        self.run_dir = tempfile.mkdtemp(prefix="stitchcuda-run-")
        path = os.path.join(self.run_dir, "program.json")
        try:
            save_program(program, path)
        except (StitchError, OSError) as e:
            w.status(f"Could not hand the program to the worker: {e}", error=True)
            return False
        self.run_document = w.document
        self.profiles.reset()
        self.log.clear()
        self.compile_errors.clear()
        self.progress = RegionProgress()   # regions done of those planned, and the time left
        self.log.note(f"{what} started on {program.name} ({plural(len(program.nodes), 'node')})", "info")
        self.asking = None
        self.worker.start(path, ["-o", os.path.join(self.run_dir, "out"), *args], env=env, what=what)
        self._start_live()
        self._running(True)
        self.bar.setRange(0, 0)   # busy until the plan says how many regions there are
        self.bar.show()
        w.status(f"{'Optimizing' if what == 'Optimize' else what}: starting the worker…")
        return True

    def cancel(self) -> None:
        if self.worker.running:
            self.worker.cancel()

    def _start_live(self) -> None:
        """Hulls grow on the canvas as the worker proposes regions; the document's own regions are
        dimmed meanwhile (the finished run replaces them)."""
        self._end_live()
        self.live = LiveRegionOverlay(self.window.scene, self)
        for item in self.overlay.items.values():
            item.setOpacity(0.3)

    def _end_live(self) -> None:
        if self.live is not None:
            self.live.detach()
            self.live.deleteLater()
            self.live = None
        for item in (self.overlay.items.values() if self.overlay is not None else ()):
            item.setOpacity(1.0)

    def on_event(self, e: dict, redraw: bool = True) -> None:
        """One event, live or replayed: the log, the plots, the progress and compile errors, the writer's
        conversation (its streamed text and whole replies only in the Kernel writer dock)."""
        k = e.get("event")
        if isinstance(k, str) and k.startswith("writer-"):
            self.writer.apply(e)
            if k in ("writer-delta", "writer-reply"):
                return
        self.log.add(e)
        if self.live is not None:
            self.live.apply(e)
        if redraw:
            self.profiles.apply(e)
        else:
            self.profiles.data.apply(e)
        k, rid = e.get("event"), e.get("region")
        self.progress.apply(e)
        reason = e.get("reason") or ""
        if k == "fallback" and rid and reason.startswith("compile failed"):
            self.compile_errors[rid] = reason
            if rid == self.current:
                self.source.show_compile_error(reason)
        if self.worker.running:
            n, d = self.progress.regions, self.progress.done
            if n:
                self.bar.setRange(0, n)
                self.bar.setValue(min(d, n))
                self._bar_text(self.progress.text())
            step = f"{k} {rid}" if rid else k
            what = "Optimizing" if self.worker.what == "Optimize" else self.worker.what
            self.window.status(f"{what}: {step}" + (f" ({self.progress.text()})" if n else ""))

    def _live_event(self, e: dict) -> None:
        if not self.stopped_run:   # not the last lines of a run that New or Open stopped
            self.on_event(e)

    def _bad_line(self, message: str) -> None:
        if not self.stopped_run:
            self.log.note(message)

    def _run_finished(self, status: str, message: str) -> None:
        w = self.window
        self._running(False)
        self.bar.hide()
        if self.stopped_run:
            # stopped by New or Open (document_set): the docks already show the new document
            self.stopped_run = False
            w.status("Optimize of the previous document was stopped: another document is open")
            self._cleanup()
            return
        self._end_live()
        self.profiles.finish()   # a cancelled or crashed run has no done event to end the live plots
        self.log.note(message, "info" if status in ("done", "no-gpu") else "warning")
        if status not in ("done", "no-gpu"):
            w.status(f"{self.worker.what}: {message}", error=True)
            self._cleanup()
            return
        out = os.path.join(self.run_dir, "out")
        try:
            res = read_results(out, need_events=False)
            applied = self._apply_results(res)
        except (StitchError, OSError) as e:
            w.status(f"Optimize finished but its results could not be read: {e}", error=True)
            self._cleanup()
            return
        note = " (no GPU: kernels generated and compiled, not timed)" if status == "no-gpu" else ""
        w.status(f"{self.worker.what} finished: {plural(applied, 'region')}{note}")
        self._cleanup()

    def _apply_results(self, res) -> int:
        """Put the run's regions on the document (one undoable edit) if the document is still the one
        the run started from and the regions name its nodes."""
        from agent_core.regions import check_program_regions, replace_regions
        doc = self.window.document
        if doc is not self.run_document:
            raise StitchError("the document was replaced while Optimize ran; its results were not applied")
        program = doc.program
        unknown = sorted({n for r in res.program.regions for n in r.nodes if n not in program.nodes})
        if unknown:
            raise StitchError(f"the results name nodes the program no longer has ({', '.join(unknown[:5])})")
        old = list(program.regions)
        program.regions = res.program.regions
        problems = check_program_regions(program)
        program.regions = old
        if problems:
            raise StitchError(f"the results do not fit the program as it is now: {problems[0]}")
        edit = replace_regions(program, [r for r in res.program.regions], label="Optimize results")
        doc.stack.push(RegionEditCommand(program, edit))
        if res.profile:
            self.profiles.load_profile(res.profile, program.regions)
        return len(res.program.regions)

    def _cleanup(self) -> None:
        if self.run_dir and not self.worker.running:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None

    def shutdown(self) -> None:
        if self.worker.running:
            self.worker.cancel()
            self.worker.wait(3000)
        if self.rewrite_check is not None:
            self.rewrite_check.cancel()
        self._exporter.waitForDone(30000)   # an export writes its folder to the end
        self._cleanup()

    # export (worker thread) ------------------------------------------------------------------------
    def export_dialog(self) -> bool:
        w = self.window
        if not w.document.program.nodes:
            w.status("Nothing to export: the program is empty", error=True)
            return False
        folder = w.ask("folder", "Export CUDA project into an empty folder", "")
        if not folder or not os.path.isabs(folder):   # the dialog answers an absolute path or "" (cancelled)
            return False
        return self.export(folder)

    def export(self, folder: str) -> bool:
        """Export the document's program into `folder` (empty or new) on a worker thread; `exported`
        when done. The document is never changed, whatever the outcome."""
        from agent_core.output_dir import check_target, input_paths
        from agent_core.project_file import program_to_json
        w = self.window
        if not self.act["export"].isEnabled():
            w.status("An export is already running", error=True)
            return False
        protect = input_paths(w.document.path) if w.document.path else []
        try:   # the export checks again; this refuses before the snapshot and the thread
            check_target(folder, "export", protect=protect, hint=None)
        except StitchError as e:
            w.status(f"Export refused: {e}", error=True)
            return False
        try:
            snapshot = program_to_json(w.document.program)
        except (StitchError, OSError) as e:
            w.status(f"Export refused: {e}", error=True)
            return False
        self.window.set_enabled(self.act["export"], False, "An export is being written: wait for it to finish")
        self.bar.setRange(0, 0)
        self._bar_text("exporting")
        self.bar.show()
        w.status(f"Exporting {w.document.program.name} to {folder}…")
        self._exporter.start(_ExportJob(snapshot, folder, self._export_relay, protect))
        return True

    def _export_done(self, folder: str, result) -> None:
        w = self.window
        self.window.set_enabled(self.act["export"], True)
        if not self.worker.running:
            self.bar.hide()
        if isinstance(result, BaseException):
            # the exporter's messages are one line; keep the status bar to one in any case
            w.status(f"Export refused: {str(result).splitlines()[0] if str(result) else type(result).__name__}",
                     error=True)
            self.exported.emit(folder, False)
            return
        name, res = result
        kernels = sum(1 for s in res.schedule.steps if s.kind == "kernel")
        gemms = sum(1 for s in res.schedule.steps if s.kind == "gemm")
        warn = f"; {res.warnings[0]}" if res.warnings else ""
        w.status(f"Exported {name} to {folder}: {plural(len(res.schedule.steps), 'launch')} ({plural(kernels, 'kernel')}, "
                 f"{plural(gemms, 'cuBLAS call')}), {plural(len(res.files), 'file')}{warn}")
        self.exported.emit(folder, True)

    # results folders -------------------------------------------------------------------------------
    def open_results_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.window, "Open results (a folder stitchcuda optimize wrote)",
                                                  self.window.last_dir())
        if folder:
            self.open_results(folder)

    def open_results(self, folder: str) -> bool:
        """Open a run's folder: its program (with regions and sources) becomes the document, its events
        replay into the log and plots, its profile fills them."""
        from .document import Document
        w = self.window
        if not w.may_discard():
            return False
        try:
            res = read_results(folder)
        except (StitchError, OSError) as e:
            w.status(f"Could not open results: {e}", error=True)
            w.ask("error", "Could not open results", f"{folder}\n\n{e}")
            return False
        w.show_document(Document(res.program, os.path.join(folder, "program.json")), layout_sync=True)
        self.replay(res.events)
        for b in res.bad:
            self.log.note(f"events.jsonl {b.error}")
        if res.profile:
            self.profiles.load_profile(res.profile, res.program.regions)
        w.status(f"Opened results of {res.program.name}: {plural(len(res.program.regions), 'region')}, "
                 f"{plural(len(res.events), 'event')}")
        return True

    def replay(self, events) -> None:
        """A recorded run, all at once: the same handling as live events, the plots drawn once."""
        self.profiles.reset()
        self.log.clear()
        self.log.setUpdatesEnabled(False)
        for e in events:
            self.on_event(e, redraw=False)
        self.log.setUpdatesEnabled(True)
        self.profiles.redraw()


def _structure(program) -> tuple:
    """What a rewrite preview depends on: every node's op, inputs and attributes, and the outputs."""
    return (tuple((nid, n.op, tuple(n.inputs), repr(sorted(n.attrs.items()))) for nid, n in program.nodes.items()),
            tuple(program.outputs))
