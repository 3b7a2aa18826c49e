"""Module boxes on the canvas: a framed, titled box around the nodes of each nn.Module of an imported
model (graph_editor.modules says which), nested as the modules are, drawn under regions, edges and
nodes. Double-clicking a box collapses that module into one item (an undo step, groups.py).

Each box's frame is the union of its members' bodies (or their collapsed group's item) and its
child boxes, grown by the layout's own margins, so after an auto-layout the frames are exactly the
boxes the layout placed, and they follow nodes the user drags.

Zoomed out, a title in the box's top band would be a few pixels high: a ModuleTitle item
(ItemIgnoresTransformations, so it is drawn at screen size above everything) shows it instead
while the box is wide enough on screen to hold it.
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPen
from PySide6.QtWidgets import QGraphicsItem

from .layout import BOX_PAD, BOX_TITLE
from .modules import apply_default_collapse, module_boxes

BOX_Z = -20.0          # under region frames (-10), edges and nodes
TITLE_Z = 5.0          # the screen-size titles: above the overview item (2)
TITLE_PX = 12          # screen pixels of a zoomed-out title
SCREEN_TITLE_BELOW = 0.7   # below this zoom the band title is too small: the screen-size one shows


class ModuleBoxItem(QGraphicsItem):
    kind = "module"

    def __init__(self, boxes: "ModuleBoxes", path: str, title: str, leaf: bool):
        super().__init__()
        self.boxes, self.path, self.title, self.leaf = boxes, path, title, leaf
        self.members: list[str] = []
        self.rect = QRectF()
        self.setZValue(BOX_Z)
        self.setAcceptedMouseButtons(Qt.LeftButton)
        self.label = ModuleTitle(self)

    def set_rect(self, rect: QRectF) -> None:
        if rect != self.rect:
            self.prepareGeometryChange()
            self.rect = QRectF(rect)
            self.label.follow()

    def boundingRect(self) -> QRectF:
        return self.rect.adjusted(-1, -1, 1, 1)

    def title_rect(self) -> QRectF:
        return QRectF(self.rect.left(), self.rect.top(), self.rect.width(), BOX_TITLE)

    def tooltip_text(self) -> str:
        return f"{self.title}: {len(self.members)} nodes; double-click the title to collapse"

    def paint(self, p, option, widget=None) -> None:
        st = self.boxes.scene.style
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        fill = QColor(st.group_body)
        fill.setAlpha(150)
        pen = QPen(st.node_border, 1.2)
        pen.setCosmetic(True)
        p.setPen(pen)
        p.setBrush(fill)
        p.drawRoundedRect(self.rect, 8, 8)
        if lod < SCREEN_TITLE_BELOW:
            return      # the ModuleTitle item draws it at screen size
        band = self.title_rect().adjusted(10, 0, -10, 0)
        fm = QFontMetricsF(st.font_bold)
        path = fm.elidedText(self.path, Qt.ElideMiddle, band.width())
        p.setFont(st.font_bold)
        p.setPen(st.text)
        p.drawText(band, Qt.AlignLeft | Qt.AlignVCenter, path)
        rest = band.width() - fm.horizontalAdvance(path) - 10
        cls = self.title[len(self.path) + 3:]
        if cls and rest > 30:
            p.setFont(st.font)
            p.setPen(st.text_muted)
            p.drawText(band.adjusted(fm.horizontalAdvance(path) + 10, 0, 0, 0), Qt.AlignLeft | Qt.AlignVCenter,
                       QFontMetricsF(st.font).elidedText(cls, Qt.ElideRight, rest))

    def mouseDoubleClickEvent(self, ev):
        if self.title_rect().contains(ev.pos()) or self.boxes.zoom() < SCREEN_TITLE_BELOW:
            ev.accept()
            self.boxes.scene.collapse(self.members, name=self.title)
        else:
            ev.ignore()


class ModuleTitle(QGraphicsItem):
    """A zoomed-out box title at screen size: a box with sub-boxes has it over its top edge, a box
    of nodes only has it in its middle (where no sub-box title can collide with it)."""

    def __init__(self, box: ModuleBoxItem):
        super().__init__()
        self.box = box
        self.setFlag(QGraphicsItem.ItemIgnoresTransformations)
        self.setAcceptedMouseButtons(Qt.NoButton)
        self.setZValue(TITLE_Z)
        self._font = QFont(box.boxes.scene.style.font_bold)
        self._font.setPixelSize(TITLE_PX)
        self._fm = QFontMetricsF(self._font)
        self.setVisible(False)

    def follow(self) -> None:
        r = self.box.rect
        self.setPos(QPointF(r.left(), r.top()) if not self.box.leaf else r.center())

    def text_rect(self, zoom: float) -> QRectF | None:
        """Where the title goes, in screen pixels from pos(); None when the box is too small."""
        w = self.box.rect.width() * zoom - 8
        text_w = self._fm.horizontalAdvance(self.box.path) + 10
        h = TITLE_PX + 6
        if self.box.rect.height() * zoom < h + 4:
            return None
        if not self.box.leaf:   # over the top edge: it may run past a narrow box into the gap
            return QRectF(4, -h / 2, text_w, h)
        if w < min(text_w, 44):
            return None
        w = min(w, text_w)
        return QRectF(-w / 2, -h / 2, w, h)

    def boundingRect(self) -> QRectF:
        return QRectF(-600, -20, 1200, 40)

    def paint(self, p, option, widget=None) -> None:
        zoom = self.box.boxes.zoom()
        r = self.text_rect(zoom) if zoom < SCREEN_TITLE_BELOW else None
        if r is None:
            return
        st = self.box.boxes.scene.style
        plate = QColor(st.background)
        plate.setAlpha(225)
        p.setPen(QPen(st.node_border, 1))
        p.setBrush(plate)
        p.drawRoundedRect(r, 4, 4)
        p.setFont(self._font)
        p.setPen(st.text)
        p.drawText(r.adjusted(5, 0, -5, 0), Qt.AlignCenter,
                   self._fm.elidedText(self.box.path, Qt.ElideMiddle, r.width() - 10))


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
        has_kids = {p for p in parents.values() if p}
        for path in list(self.items):
            if path not in members:
                item = self.items.pop(path)
                for it in (item, item.label):
                    self.scene.removeItem(it)
                    self.scene.overlays.remove(it)
        for path, ms in members.items():
            item = self.items.get(path)
            if item is None:
                item = self.items[path] = ModuleBoxItem(self, path, titles[path], path not in has_kids)
                for it, z in ((item, BOX_Z), (item.label, TITLE_Z)):
                    self.scene.add_overlay(it)    # kept across scene rebuilds, like region frames
                    it.setZValue(z)
            item.members = ms
        # deepest first, so a parent's frame can take in its children's
        self._order = sorted(members, key=lambda p: -p.count("."))
        self._parents = parents
        self._structure = True

    def refresh(self) -> None:
        if self._structure is None:
            self._rebuild_structure()
        self._dirty = False
        sc = self.scene
        rects: dict[str, QRectF] = {}
        collapsed_whole = {tuple(g.members) for g in sc.groups}
        zoom_low = self.zoom() < SCREEN_TITLE_BELOW
        for path in self._order:
            item = self.items[path]
            if tuple(item.members) in collapsed_whole:    # its collapsed item stands for it
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
            frame = r.adjusted(-BOX_PAD, -BOX_TITLE, BOX_PAD, BOX_PAD)
            item.set_rect(frame)
            item.setVisible(True)
            item.label.setVisible(zoom_low)
            parent = self._parents.get(path)
            if parent:
                rects[parent] = rects.get(parent, QRectF()).united(frame) if parent in rects else QRectF(frame)

    def zoom_changed(self) -> None:
        """The view zoomed: screen-size titles show only while the band titles are too small."""
        low = self.zoom() < SCREEN_TITLE_BELOW
        for item in self.items.values():
            item.label.setVisible(low and item.isVisible())
            item.label.update()
