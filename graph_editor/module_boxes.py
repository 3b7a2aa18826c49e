"""Module boxes on the canvas: a framed, titled box around the nodes of each nn.Module of an imported
model (graph_editor.modules says which), nested as the modules are, drawn under regions, edges and
nodes. Double-clicking a box collapses that module into one item (an undo step, groups.py).

Each box's frame is the union of its members' bodies (or their collapsed group's item) and its
child boxes, grown by the layout's own margins, so after an auto-layout the frames are exactly the
boxes the layout placed, and they follow nodes the user drags.

Each box's title sits in the band at its top, above every child: the layout makes the band
(layout.title_band) tall enough that, with the program fitted to a screen, a title drawn at screen
size fits in it. A ModuleTitle item (ItemIgnoresTransformations) draws it at that size at every zoom,
shrinking the font to the band's height on screen and showing nothing below a readable 8 px.
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPen
from PySide6.QtWidgets import QGraphicsItem

from .layout import BOX_PAD, title_band
from .modules import apply_default_collapse, hidden_boxes, module_boxes

BOX_Z = -20.0          # under region frames (-10), edges and nodes
TITLE_Z = 5.0          # the screen-size titles: above the overview item (2)
TITLE_MAX_PX = 13      # a title's font in screen pixels: at most this ...
TITLE_MIN_PX = 8       # ... and at least this, or it is not drawn (no unreadable text)
PLATE_PAD = 6          # the plate behind a title: this much taller than its font


class ModuleBoxItem(QGraphicsItem):
    kind = "module"

    def __init__(self, boxes: "ModuleBoxes", path: str, title: str):
        super().__init__()
        self.boxes, self.path, self.title = boxes, path, title
        self.members: list[str] = []
        self.rect = QRectF()
        self.band = 0.0
        self.setZValue(BOX_Z)
        self.setAcceptedMouseButtons(Qt.LeftButton)
        self.label = ModuleTitle(self)

    def set_rect(self, rect: QRectF, band: float) -> bool:
        """True when the frame changed."""
        if rect == self.rect and band == self.band:
            return False
        self.prepareGeometryChange()
        self.rect, self.band = QRectF(rect), band
        self.label.follow()
        return True

    def boundingRect(self) -> QRectF:
        return self.rect.adjusted(-1, -1, 1, 1)

    def title_rect(self) -> QRectF:
        """The band at the top of the frame, above every child."""
        return QRectF(self.rect.left(), self.rect.top(), self.rect.width(), self.band)

    def title_scene_rect(self) -> QRectF | None:
        """Where the title is drawn at the current zoom, in scene units (None: not drawn)."""
        zoom = self.boxes.zoom()
        r = self.label.text_rect(zoom)
        if r is None:
            return None
        return QRectF(self.rect.left() + r.left() / zoom, self.rect.top() + r.top() / zoom,
                      r.width() / zoom, r.height() / zoom)

    def tooltip_text(self) -> str:
        return f"{self.title}: {len(self.members)} nodes; double-click the title to collapse"

    def paint(self, p, option, widget=None) -> None:
        st = self.boxes.scene.style
        fill = QColor(st.group_body)
        fill.setAlpha(150)
        pen = QPen(st.node_border, 1.2)
        pen.setCosmetic(True)
        p.setPen(pen)
        p.setBrush(fill)
        p.drawRoundedRect(self.rect, 8, 8)

    def mouseDoubleClickEvent(self, ev):
        if self.title_rect().contains(ev.pos()):
            ev.accept()
            self.boxes.scene.collapse(self.members, name=self.title)
        else:
            ev.ignore()


class ModuleTitle(QGraphicsItem):
    """A box's title at screen size, on a plate inside the box's band (top-left, centred in height):
    the module path in bold, its class after it where the box is wide enough on screen."""

    def __init__(self, box: ModuleBoxItem):
        super().__init__()
        self.box = box
        self.setFlag(QGraphicsItem.ItemIgnoresTransformations)
        self.setAcceptedMouseButtons(Qt.NoButton)
        self.setZValue(TITLE_Z)
        self._bounds = QRectF()
        self._fonts: dict[int, tuple] = {}
        self.setVisible(False)

    def follow(self) -> None:
        self.prepareGeometryChange()
        self.setPos(QPointF(self.box.rect.left(), self.box.rect.top()))

    def _font(self, px: int):
        f = self._fonts.get(px)
        if f is None:
            bold = QFont(self.box.boxes.scene.style.font_bold)
            bold.setPixelSize(px)
            plain = QFont(self.box.boxes.scene.style.font)
            plain.setPixelSize(px)
            f = self._fonts[px] = (bold, QFontMetricsF(bold), plain, QFontMetricsF(plain))
        return f

    def font_px(self, zoom: float) -> int:
        """The title's font in screen pixels at `zoom`: what the band holds, and smaller still where
        the box is too narrow on screen for the path; below TITLE_MIN_PX it is not drawn."""
        px = int(min(TITLE_MAX_PX, self.box.band * zoom - 4 - PLATE_PAD))
        room = self.box.rect.width() * zoom - 8
        while px >= TITLE_MIN_PX and self._font(px)[1].horizontalAdvance(self.box.path) + 8 > room:
            px -= 1
        return px

    def text_rect(self, zoom: float) -> QRectF | None:
        """The title's plate in screen pixels from pos(); None when the band or the box is too small
        on screen for a readable title."""
        px = self.font_px(zoom)
        if px < TITLE_MIN_PX:
            return None
        want = self._font(px)[1].horizontalAdvance(self.box.path) + 8
        room = self.box.rect.width() * zoom - 8
        h = px + PLATE_PAD
        return QRectF(4, (self.box.band * zoom - h) / 2, want + self._class_width(px, room - want), h)

    def _class_width(self, px: int, room: float) -> float:
        cls = self.box.title[len(self.box.path) + 3:]
        if not cls:
            return 0.0
        w = self._font(px)[3].horizontalAdvance(cls) + px
        return w if w <= room else 0.0

    def boundingRect(self) -> QRectF:
        return self._bounds

    def refresh_bounds(self, zoom: float) -> None:
        r = self.text_rect(zoom)
        bounds = r.adjusted(-1, -1, 1, 1) if r is not None else QRectF()
        if bounds != self._bounds:   # only then: a change here is a scene change, which refreshes
            self.prepareGeometryChange()
            self._bounds = bounds

    def paint(self, p, option, widget=None) -> None:
        zoom = self.box.boxes.zoom()
        r = self.text_rect(zoom)
        if r is None:
            return
        px = self.font_px(zoom)
        bold, fm, plain, pfm = self._font(px)
        st = self.box.boxes.scene.style
        plate = QColor(st.background)
        plate.setAlpha(225)
        p.setPen(QPen(st.node_border, 1))
        p.setBrush(plate)
        p.drawRoundedRect(r, 4, 4)
        text = r.adjusted(4, 0, -4, 0)
        path = fm.elidedText(self.box.path, Qt.ElideMiddle, text.width())
        p.setFont(bold)
        p.setPen(st.text)
        p.drawText(text, Qt.AlignLeft | Qt.AlignVCenter, path)
        cls = self.box.title[len(self.box.path) + 3:]
        rest = text.adjusted(fm.horizontalAdvance(path) + px / 2, 0, 0, 0)
        if cls and pfm.horizontalAdvance(cls) <= rest.width():
            p.setFont(plain)
            p.setPen(st.text_muted)
            p.drawText(rest, Qt.AlignLeft | Qt.AlignVCenter, cls)


class ModuleBoxes:
    """The module boxes of one GraphScene, kept in step with the program and with dragged nodes."""

    def __init__(self, scene):
        self.scene = scene
        apply_default_collapse(scene.program)
        self.items: dict[str, ModuleBoxItem] = {}
        self._dirty = True
        self._structure = None
        scene.program.subscribe(self._on_event)
        scene.changed.connect(self._scene_changed)

    def zoom(self) -> float:
        views = self.scene.views()
        return views[0].transform().m11() if views else 1.0

    def _on_event(self, event: str, payload: dict) -> None:
        if event in ("node_added", "node_removed", "groups_changed"):
            self._structure = None
        self._dirty = True

    def _scene_changed(self, _rects) -> None:
        grabber = self.scene.mouseGrabberItem()
        if self._dirty or (grabber is not None and getattr(grabber, "kind", "") == "node"):
            self.refresh()

    def boxes(self) -> dict[str, QRectF]:
        """path -> frame in scene coordinates, brought up to date first (tests, screenshots)."""
        self.refresh()
        return {path: QRectF(item.rect) for path, item in self.items.items() if item.isVisible()}

    def _rebuild_structure(self) -> None:
        chains, titles = module_boxes(self.scene.program)
        members: dict[str, list[str]] = {}
        for nid in self.scene.program.nodes:
            for path in chains.get(nid, ()):
                members.setdefault(path, []).append(nid)
        parents = {c[i]: (c[i - 1] if i else None) for c in chains.values() for i in range(len(c))}
        for path in list(self.items):
            if path not in members:
                item = self.items.pop(path)
                for it in (item, item.label):
                    self.scene.removeItem(it)
                    self.scene.overlays.remove(it)
        for path, ms in members.items():
            item = self.items.get(path)
            if item is None:
                item = self.items[path] = ModuleBoxItem(self, path, titles[path])
                for it, z in ((item, BOX_Z), (item.label, TITLE_Z)):
                    self.scene.add_overlay(it)    # kept across scene rebuilds, like region frames
                    it.setZValue(z)
            item.members = ms
        # deepest first, so a parent's frame can take in its children's
        self._order = sorted(members, key=lambda p: -p.count("."))
        self._chains = chains
        self._parents = parents
        self._structure = True

    def refresh(self) -> None:
        if self._structure is None:
            self._rebuild_structure()
        self._dirty = False
        sc = self.scene
        rects: dict[str, QRectF] = {}
        hidden = hidden_boxes(self._chains, [g.members for g in sc.groups])
        band = self.band()
        zoom = self.zoom()
        moved = False
        for path in self._order:
            item = self.items[path]
            if path in hidden:    # inside a collapsed group: its item stands for it
                item.setVisible(False)
                item.label.setVisible(False)
                continue
            r = rects.get(path, QRectF())
            for nid in item.members:
                g = sc.group_of.get(nid)
                it = g if g is not None else sc.nodes.get(nid)
                if it is None:
                    continue
                w, h = it.size()
                r = r.united(QRectF(it.pos().x(), it.pos().y(), w, h))
            if r.isNull():
                item.setVisible(False)
                item.label.setVisible(False)
                continue
            frame = r.adjusted(-BOX_PAD, -band, BOX_PAD, BOX_PAD)
            moved |= item.set_rect(frame, band)
            item.setVisible(True)
            item.label.setVisible(True)
            item.label.refresh_bounds(zoom)
            parent = self._parents.get(path)
            if parent:
                rects[parent] = rects.get(parent, QRectF()).united(frame) if parent in rects else QRectF(frame)
        if moved:
            sc.reroute_edges()

    def band(self) -> float:
        """The title band the layout made room for: layout.title_band of the extent of what is shown
        (visible nodes and collapsed groups, as the layout measured it)."""
        sc = self.scene
        left = top = float("inf")
        right = bottom = float("-inf")
        for it in list(sc.nodes.values()) + sc.groups:
            if it.isVisible():
                w, h = it.size()
                x, y = it.pos().x(), it.pos().y()
                left, top = min(left, x), min(top, y)
                right, bottom = max(right, x + w), max(bottom, y + h)
        return title_band(right - left, bottom - top) if right > left else title_band(0.0, 0.0)

    def zoom_changed(self) -> None:
        """The view zoomed: each title takes the font its band holds on screen now."""
        zoom = self.zoom()
        for item in self.items.values():
            if item.isVisible():
                item.label.refresh_bounds(zoom)
