"""The canvas view: pan, zoom (wheel, keys), fit, rubber-band selection, and the minimap in a corner.

Large programs stay smooth because the view repaints only what changed (MinimalViewportUpdate for
editing; BoundingRectViewportUpdate while many items move at once), items cache their painting, and
items draw less when zoomed out (see node_item.LOD_*).
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QPainter, QPen, QPixmap
from PySide6.QtWidgets import QGraphicsView, QWidget

ZOOM_MIN, ZOOM_MAX, ZOOM_STEP = 0.03, 3.0, 1.18


class GraphView(QGraphicsView):
    quick_search_at = Signal(QPointF)   # scene position where Tab was pressed
    zoom_changed = Signal(float)

    def __init__(self, scene=None, parent=None):
        super().__init__(parent)
        self.setRenderHints(QPainter.Antialiasing | QPainter.TextAntialiasing)
        self.setViewportUpdateMode(QGraphicsView.MinimalViewportUpdate)
        self.setOptimizationFlags(QGraphicsView.DontSavePainterState | QGraphicsView.DontAdjustForAntialiasing)
        self.setCacheMode(QGraphicsView.CacheBackground)
        self.setDragMode(QGraphicsView.RubberBandDrag)
        self.setTransformationAnchor(QGraphicsView.AnchorUnderMouse)
        self.setResizeAnchor(QGraphicsView.AnchorViewCenter)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setFocusPolicy(Qt.StrongFocus)
        self.setAcceptDrops(True)
        self._pan_from: QPointF | None = None
        self.minimap = Minimap(self)
        if scene is not None:
            self.set_scene(scene)

    def _minimap_update(self) -> None:
        """The minimap shows only while part of the program is out of view."""
        sc = self.scene()
        if sc is None:
            return
        vis = self.mapToScene(self.viewport().rect()).boundingRect()
        self.minimap.setVisible(not vis.contains(sc.content_rect()))
        self.minimap.update()

    def set_scene(self, scene) -> None:
        self.setScene(scene)
        self.resetCachedContent()
        self.minimap.watch(scene)
        self._grow_scene_rect()

    def _grow_scene_rect(self) -> None:
        """A scene rect with room around the items, so panning is not clamped at the graph's edge."""
        sc = self.scene()
        if sc is not None:
            sc.fit_scene_rect()

    # zoom --------------------------------------------------------------------------------------
    def zoom(self) -> float:
        return self.transform().m11()

    def zoom_by(self, factor: float) -> None:
        z = self.zoom()
        factor = max(ZOOM_MIN / z, min(ZOOM_MAX / z, factor))
        self.scale(factor, factor)
        self._detail_for_zoom()
        self._minimap_update()

    def _detail_for_zoom(self) -> None:
        from .node_item import LOD_TEXT
        self.zoom_changed.emit(self.zoom())
        if self.scene() is not None:
            self.scene().set_low_detail(self.zoom() < LOD_TEXT)
            modules = getattr(self.scene(), "modules", None)
            if modules is not None:
                modules.zoom_changed()

    def fit_rect(self, rect: QRectF) -> None:
        if rect.isNull() or rect.isEmpty():
            return
        self._grow_scene_rect()
        self.fitInView(rect.adjusted(-40, -40, 40, 40), Qt.KeepAspectRatio)
        if self.zoom() > 1.0:  # fitting one small node should not blow it up
            self.resetTransform()
            self.centerOn(rect.center())
        self._detail_for_zoom()
        self._minimap_update()

    def fit_all(self) -> None:
        sc = self.scene()
        if sc is not None:
            self.fit_rect(sc.content_rect())

    def show_program(self, min_zoom: float = 0.6) -> None:
        """The opening view: the whole program if it fits at a readable zoom, else its beginning
        (inputs on the left) at that zoom."""
        sc = self.scene()
        if sc is None:
            return
        r = sc.content_rect()
        vp = self.viewport().rect()
        fit = min(vp.width() / max(1.0, r.width() + 80), vp.height() / max(1.0, r.height() + 80))
        if fit >= min_zoom:
            self.fit_all()
            return
        # decided before any zoom is applied, so a big program never passes through the overview
        # mode (switching all items there and back costs more than opening it)
        self.resetTransform()
        self.zoom_by(min_zoom)
        vis = self.mapToScene(self.viewport().rect()).boundingRect()
        self.centerOn(QPointF(r.left() - 30 + vis.width() / 2, r.center().y()))
        self._minimap_update()

    def fit_selection(self) -> None:
        sc = self.scene()
        if sc is None:
            return
        rect = QRectF()
        for item in sc.selectedItems():
            rect = rect.united(item.sceneBoundingRect())
        if rect.isNull():
            self.fit_all()
        else:
            self.fit_rect(rect)

    def wheelEvent(self, event):
        if event.modifiers() & Qt.ShiftModifier:  # shift+wheel pans sideways
            self.pan(event.angleDelta().y(), 0)
            return
        steps = event.angleDelta().y() / 120.0
        if steps:
            self.zoom_by(ZOOM_STEP ** steps)

    def pan(self, dx: float, dy: float) -> None:
        h, v = self.horizontalScrollBar(), self.verticalScrollBar()
        h.setValue(h.value() - int(dx))
        v.setValue(v.value() - int(dy))
        self._minimap_update()

    # keys and mouse ------------------------------------------------------------------------------
    def keyPressEvent(self, event):
        key = event.key()
        if key in (Qt.Key_Plus, Qt.Key_Equal):
            self.zoom_by(ZOOM_STEP)
        elif key == Qt.Key_Minus:
            self.zoom_by(1 / ZOOM_STEP)
        elif key == Qt.Key_Tab:
            pos = self.mapFromGlobal(self.cursor().pos())
            if not self.viewport().rect().contains(pos):
                pos = self.viewport().rect().center()
            self.quick_search_at.emit(self.mapToScene(pos))
        elif key in (Qt.Key_Left, Qt.Key_Right, Qt.Key_Up, Qt.Key_Down) and not self.scene().selectedItems():
            d = 60
            self.pan({Qt.Key_Left: d, Qt.Key_Right: -d}.get(key, 0), {Qt.Key_Up: d, Qt.Key_Down: -d}.get(key, 0))
        else:
            super().keyPressEvent(event)

    def focusNextPrevChild(self, next_):
        return False  # Tab opens the quick search instead of moving focus

    def mousePressEvent(self, event):
        if event.button() == Qt.MiddleButton or (event.button() == Qt.LeftButton
                                                 and event.modifiers() & Qt.AltModifier):
            self._pan_from = event.position()
            self.setCursor(Qt.ClosedHandCursor)
            event.accept()
            return
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event):
        if self._pan_from is not None:
            d = event.position() - self._pan_from
            self._pan_from = event.position()
            self.pan(d.x(), d.y())
            event.accept()
            return
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event):
        if self._pan_from is not None:
            self._pan_from = None
            self.unsetCursor()
            event.accept()
            return
        super().mouseReleaseEvent(event)

    def resizeEvent(self, event):
        super().resizeEvent(event)
        self.minimap.place()

    def scrollContentsBy(self, dx, dy):
        super().scrollContentsBy(dx, dy)
        self._minimap_update()

    # palette drops -------------------------------------------------------------------------------
    def dragEnterEvent(self, event):
        if event.mimeData().hasFormat("application/x-stitchcuda-op"):
            event.acceptProposedAction()
        else:
            super().dragEnterEvent(event)

    dragMoveEvent = dragEnterEvent

    def dropEvent(self, event):
        md = event.mimeData()
        if md.hasFormat("application/x-stitchcuda-op"):
            op = bytes(md.data("application/x-stitchcuda-op")).decode()
            self.scene().add_node(op, self.mapToScene(event.position().toPoint()))
            event.acceptProposedAction()
        else:
            super().dropEvent(event)


class Minimap(QWidget):
    """The whole program in miniature with the visible area outlined; click or drag to move there.

    It paints node rectangles into a pixmap rebuilt at most every 300 ms after an edit, so a large
    program costs one blit per frame (it overlaps the canvas, so it repaints with it)."""

    W, H = 200, 140

    def __init__(self, view: GraphView):
        super().__init__(view)
        self.view = view
        self.setFixedSize(self.W, self.H)
        self.setCursor(Qt.PointingHandCursor)
        self._pixmap: QPixmap | None = None
        self._content = QRectF()
        self._timer = QTimer(self, singleShot=True, interval=300, timeout=self._collect)
        self._scene = None
        self.place()

    def watch(self, scene) -> None:
        if self._scene is not None:
            try:
                self._scene.program_changed.disconnect(self._timer.start)
            except (RuntimeError, TypeError):
                pass
        self._scene = scene
        scene.program_changed.connect(self._timer.start)
        self._pixmap = None
        self._content = QRectF()
        self._timer.start()  # drawn just after the program is shown, not while it opens

    def place(self) -> None:
        vp = self.view.viewport().geometry()
        self.move(vp.right() - self.W - 10, vp.bottom() - self.H - 10)
        self.raise_()

    def _collect(self) -> None:
        """Render the program's boxes once into a pixmap; paintEvent only blits it."""
        sc = self._scene
        if sc is None:
            return
        rects = [item.sceneBoundingRect() for item in
                 list(sc.nodes.values()) + list(sc.terminals.values()) + sc.groups if item.isVisible()]
        b = QRectF()
        for r in rects:
            b = b.united(r)
        self._content = b.adjusted(-50, -50, 50, 50)
        st = sc.style
        pm = QPixmap(self.W, self.H)
        pm.fill(st.minimap_bg)
        p = QPainter(pm)
        p.setPen(QPen(st.node_border, 1))
        p.drawRect(QRectF(0, 0, self.W - 1, self.H - 1))
        t = self._transform()
        if t is not None:
            s, ox, oy = t
            p.setPen(Qt.NoPen)
            p.setBrush(st.text_muted)
            p.drawRects([QRectF(r.left() * s + ox, r.top() * s + oy, max(1.5, r.width() * s),
                                max(1.5, r.height() * s)) for r in rects])
        p.end()
        self._pixmap = pm
        self.update()

    def refresh(self) -> None:
        self._collect()

    def _visible(self) -> QRectF:
        return self.view.mapToScene(self.view.viewport().rect()).boundingRect()

    def _transform(self):
        b = self._content
        if b.isEmpty():
            return None
        s = min((self.W - 8) / b.width(), (self.H - 8) / b.height())
        ox = (self.W - b.width() * s) / 2 - b.left() * s
        oy = (self.H - b.height() * s) / 2 - b.top() * s
        return s, ox, oy

    def paintEvent(self, event):
        # the painter ends on every path, an exception included: a painter left active on a widget
        # that is later destroyed crashes Qt ("Cannot destroy paint device that is being painted")
        with QPainter(self) as p:
            if self._pixmap is not None:
                p.drawPixmap(0, 0, self._pixmap)
            t = self._transform()
            if t is None or self._scene is None:
                return
            s, ox, oy = t
            vis = self._visible()
            box = QRectF(vis.left() * s + ox, vis.top() * s + oy, vis.width() * s, vis.height() * s)
            p.setBrush(Qt.NoBrush)
            p.setPen(QPen(self._scene.style.accent, 1.5))
            p.drawRect(box.intersected(QRectF(1, 1, self.W - 2, self.H - 2)))

    def mousePressEvent(self, event):
        self._go(event.position())

    def mouseMoveEvent(self, event):
        if event.buttons() & Qt.LeftButton:
            self._go(event.position())

    def _go(self, pt) -> None:
        t = self._transform()
        if t is None:
            return
        s, ox, oy = t
        self.view.centerOn(QPointF((pt.x() - ox) / s, (pt.y() - oy) / s))
        self.update()
