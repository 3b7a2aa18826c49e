"""Orthogonal routes for edges that climb to another column of a wrapped layout.

The layout wraps a deep chain into side-by-side columns (layout._columns), so the edge from the foot
of one column to the head of the next runs upwards. Drawn as one curve it would cut across both
columns; instead it leaves its source downwards, runs sideways under the source's module boxes, up
the gutter between the columns (the widest vertical strip between its ends that no item or foreign
box covers), sideways above the target's boxes, and down into its target: only horizontal and
vertical segments. The route is computed from what the scene shows, so it also holds for a program
opened with saved positions, and it follows a user's drags.
"""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF

from .layout import LAYER_GAP

ROUTE_RISE = 200.0        # an edge whose target sits this far above its source crosses columns
ROUTE_DX = 150.0          # a downward edge this far sideways may leave a wrapped box mid-way
REACH = LAYER_GAP / 2     # how far a route runs out of a port before it turns: mid-gap


def may_route(a: QPointF, b: QPointF) -> bool:
    """Whether edge_route could route this edge (it then depends on where the module boxes are)."""
    return b.y() < a.y() - ROUTE_RISE or abs(b.x() - a.x()) > ROUTE_DX


def edge_route(scene, a: QPointF, b: QPointF) -> list[QPointF] | None:
    """The route of the edge from output port `a` to input port `b`; None: the plain curve.
    Only edges that climb more than an item is tall (the rows of an unlaid-out grid do not), or that
    leave a wrapped box from a column's foot above the box's bottom, are routed."""
    if b.y() < a.y() - ROUTE_RISE:
        return _column_route(scene, a, b)
    if may_route(a, b):
        boxes = [it.rect for it in scene.modules.items.values() if it.isVisible()]
        y1 = max([a.y() + REACH] + [r.bottom() + REACH for r in boxes if r.contains(a) and not r.contains(b)])
        if a.y() + REACH + LAYER_GAP < y1 < b.y():   # out under the box first, then across
            return [a, QPointF(a.x(), y1), QPointF(b.x(), y1), b]
    return None


def _column_route(scene, a: QPointF, b: QPointF) -> list[QPointF]:
    """The polyline from output port `a` up to input port `b` through the gutter, ends included."""
    boxes = [it.rect for it in scene.modules.items.values() if it.isVisible()]
    around_a = [r for r in boxes if r.contains(a) and not r.contains(b)]
    around_b = [r for r in boxes if r.contains(b) and not r.contains(a)]
    y1 = max([a.y() + REACH] + [r.bottom() + REACH for r in around_a])
    y2 = min([b.y() - REACH] + [r.top() - REACH for r in around_b])
    x0, x1 = min(a.x(), b.x()), max(a.x(), b.x())
    span = QRectF(x0, y2, max(x1 - x0, 1.0), y1 - y2)
    blocked = []
    for item in scene.items(span):
        kind = getattr(item, "kind", "")
        if kind in ("node", "group", "terminal") and item.isVisible():
            r = item.sceneBoundingRect()
        elif kind == "module" and item.isVisible() and not (item.rect.contains(a) or item.rect.contains(b)):
            r = item.rect
        else:
            continue
        blocked.append((r.left(), r.right()))
    gx = _widest_gap(blocked, x0, x1)
    return [a, QPointF(a.x(), y1), QPointF(gx, y1), QPointF(gx, y2), QPointF(b.x(), y2), b]


def _widest_gap(blocked: list[tuple[float, float]], x0: float, x1: float) -> float:
    """The centre of the widest stretch of [x0, x1] outside every blocked interval; right of them all
    when none is free."""
    best, best_w, at = None, 0.0, x0
    for left, right in sorted(blocked):
        if left > at and min(left, x1) - at > best_w:
            best, best_w = (at + min(left, x1)) / 2, min(left, x1) - at
        at = max(at, right)
    if at < x1 and x1 - at > best_w:
        best = (at + x1) / 2
    if best is None:
        best = max([x1] + [r for _, r in blocked]) + REACH
    return best
