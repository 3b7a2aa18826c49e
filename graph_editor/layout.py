"""Hierarchical layered (Sugiyama) layout, top to bottom, on plain data: no Qt, so it runs in a
worker thread.

A model imported from PyTorch knows which nn.Module each node came from (LayoutInput.groups: node ->
the chain of module boxes around it, outermost first). Each box is laid out as a unit, its children
being its own nodes and its child boxes, and then placed as one block in its parent's layout: a ResNet
reads as stages of blocks. A collapsed group (LayoutInput.units) is one block of its item's size, its
members stacked under it. A box much taller than wide wraps its layers into side-by-side columns
(about as many as make it screen-shaped), so a deep chain still fits a screen; the scene routes the
edges from one column's foot to the next column's head through the gutter between them.

Every box has a title band above its children. Its height is title_band() of the whole layout's
extent: tall enough that a title drawn at screen size fits in it when the program is fitted to a
screen. The band changes the extent, so the layout runs again until the band stays the same (two or
three passes; the band is quantised).

Why our own: grandalf's SugiyamaLayout takes tens of seconds at 5,000 nodes (see
docs/benchmarks/editor.md); this one does the same four steps in linear-ish time per box:
longest-path layering, dummy nodes on long edges, barycentre ordering sweeps, and a coordinate pass
that pulls each node towards its neighbours' centres while keeping the layer packed.
"""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

LAYER_GAP = 56.0   # vertical space between layers (edges need room to curve)
NODE_GAP = 36.0    # horizontal space between the items of a layer
COLUMN_GAP = 90.0  # between the columns of a wrapped box
BOX_PAD = 14.0     # a module box's margin around its children ...
BOX_TITLE = 30.0   # ... and the least height of the band at its top that holds its title
WRAP_ASPECT = 2.2  # a box taller than this many times its width wraps into columns ...
WRAP_MIN_H = 2400.0  # ... once it is taller than this (short chains stay one column) ...
COLUMN_ASPECT = 0.5   # ... into as many columns as make it about this high per unit of width
FIT_VIEW = (860.0, 500.0)  # a little under the canvas of a 1600 x 1000 window: "fitted to a screen"
BAND_PX = 24.0     # screen pixels of a title band at that fit (a 13 px title on its plate)
BAND_STEP = 12.0   # band heights are multiples of this, so the passes settle
TERMINAL_PREFIX = "\0in:"   # layout ids of program-input terminals (graph_editor.scene adds them)
SWEEPS = 4         # barycentre down+up sweep pairs; more changes little on real programs
DEFAULT_SIZE = (160.0, 60.0)


@dataclass
class LayoutInput:
    """nodes: ids in a stable order; sizes: id -> (width, height); edges: (source id, target id).
    groups: node id -> module boxes around it, outermost first (absent: top level).
    units: key -> member ids laid out as one block of sizes[key] (a collapsed group)."""
    nodes: list[str]
    sizes: dict[str, tuple[float, float]]
    edges: list[tuple[str, str]]
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    units: dict[str, list[str]] = field(default_factory=dict)


class LayoutCancelled(Exception):
    pass


def layered_layout(data: LayoutInput, cancelled=lambda: False) -> dict[str, tuple[float, float]]:
    """Top-left positions for every node. `cancelled()` is polled between boxes."""
    return hierarchical_layout(data, cancelled)[0]


def hierarchical_layout(data: LayoutInput, cancelled=lambda: False):
    """(node positions, module box rects path -> (x, y, w, h)), all top-left in scene units."""
    if not data.nodes:
        return {}, {}
    unit_of = {m: key for key, ms in data.units.items() for m in ms}
    items = []          # what is laid out: plain nodes and collapsed units
    seen = set()
    for n in data.nodes:
        k = unit_of.get(n, n)
        if k not in seen:
            seen.add(k)
            items.append(k)
    chain = {}
    for key, ms in data.units.items():  # a unit lives in the deepest box all its members share
        chains = [data.groups.get(m, ()) for m in ms]
        common = chains[0] if chains else ()
        for c in chains[1:]:
            i = 0
            while i < min(len(common), len(c)) and common[i] == c[i]:
                i += 1
            common = common[:i]
        chain[key] = common
    for n in items:
        if n not in chain:
            chain[n] = tuple(data.groups.get(n, ()))
    size = {n: data.sizes.get(n, DEFAULT_SIZE) for n in items}
    # each edge belongs to the deepest box holding both ends: there it joins two of its children
    per_box: dict[tuple, list] = defaultdict(list)
    for a, b in data.edges:
        a, b = unit_of.get(a, a), unit_of.get(b, b)
        if a == b or a not in chain or b not in chain:
            continue
        ca, cb = chain[a], chain[b]
        i = 0
        while i < min(len(ca), len(cb)) and ca[i] == cb[i]:
            i += 1
        box = ca[:i]
        child_a = ("box", ca[: i + 1]) if len(ca) > i else a
        child_b = ("box", cb[: i + 1]) if len(cb) > i else b
        if child_a != child_b:
            per_box[box].append((child_a, child_b))
    children: dict[tuple, list] = defaultdict(list)
    listed = set()
    for n in items:  # every box on the chain lists its child box once, in first-seen order
        c = chain[n]
        for d in range(len(c)):
            key = ("box", c[: d + 1])
            if key not in listed:
                listed.add(key)
                children[c[:d]].append(key)
        children[c].append(n)
    band, out, boxes = BOX_TITLE, {}, {}
    for _ in range(6):
        out, boxes = _lay_boxes(data, children, size, per_box, band, cancelled)
        again = title_band(*_extent(data, out, size, unit_of)) if boxes else band
        if again <= band:
            break
        band = again
    return out, boxes


def title_band(width: float, height: float) -> float:
    """The height of every module box's title band for a program whose nodes span width x height:
    BAND_PX on screen when the program is fitted to FIT_VIEW (as GraphView.fit_all does, with a
    40 px margin), and never less than BOX_TITLE."""
    zoom = min(1.0, FIT_VIEW[0] / (width + 80.0), FIT_VIEW[1] / (height + 80.0))
    steps = -(-BAND_PX / max(zoom, 1e-3) // BAND_STEP)   # ceiling division
    return max(BOX_TITLE, steps * BAND_STEP)


def _extent(data: LayoutInput, out: dict, size: dict, unit_of: dict) -> tuple[float, float]:
    """Width and height spanned by the laid-out nodes and collapsed groups (not the terminals): what
    the scene measures again to size its bands (module_boxes.ModuleBoxes.refresh)."""
    left = top = float("inf")
    right = bottom = float("-inf")
    for n, (x, y) in out.items():
        if n.startswith(TERMINAL_PREFIX):
            continue
        key = unit_of.get(n)
        w, h = size[key] if key is not None else data.sizes.get(n, DEFAULT_SIZE)
        if key is not None:   # a unit's members are stacked on its centre: measure the unit's item
            mw, mh = data.sizes.get(n, DEFAULT_SIZE)
            x, y = x + mw / 2 - w / 2, y + mh / 2 - h / 2
        left, top = min(left, x), min(top, y)
        right, bottom = max(right, x + w), max(bottom, y + h)
    return (right - left, bottom - top) if right > left else (0.0, 0.0)


def _lay_boxes(data, children, size, per_box, band, cancelled):
    """One pass of the hierarchical layout with title bands `band` high."""
    rel: dict = {}     # box -> {child: (x, y)} relative to the box's top-left
    box_size: dict = {}

    def lay(box: tuple) -> tuple[float, float]:
        kids = children[box]
        sizes = {}
        for k in kids:
            sizes[k] = lay(k[1]) if isinstance(k, tuple) else size[k]
        if cancelled():
            raise LayoutCancelled
        pos, (w, h) = _flat(kids, sizes, per_box.get(box, []))
        if box:
            pos = {k: (x + BOX_PAD, y + band) for k, (x, y) in pos.items()}
            w, h = w + 2 * BOX_PAD, h + band + BOX_PAD
        rel[box] = pos
        box_size[box] = (w, h)
        return w, h

    lay(())
    out: dict[str, tuple[float, float]] = {}
    boxes: dict[str, tuple[float, float, float, float]] = {}

    def place(box: tuple, ox: float, oy: float) -> None:
        for k, (x, y) in rel[box].items():
            if isinstance(k, tuple):
                w, h = box_size[k[1]]
                boxes[k[1][-1]] = (ox + x, oy + y, w, h)
                place(k[1], ox + x, oy + y)
            elif k in data.units:
                w, h = size[k]
                cx, cy = ox + x + w / 2, oy + y + h / 2
                for m in data.units[k]:  # stacked under the group's item, centred on it
                    mw, mh = data.sizes.get(m, DEFAULT_SIZE)
                    out[m] = (cx - mw / 2, cy - mh / 2)
            else:
                out[k] = (ox + x, oy + y)

    place((), 0.0, 0.0)
    return out, boxes


def _flat(nodes: list, sizes: dict, edges: list) -> tuple[dict, tuple[float, float]]:
    """One box's children laid out top to bottom: positions relative to (0, 0) and the total size."""
    if not nodes:
        return {}, (0.0, 0.0)
    data = LayoutInput(nodes, sizes, edges)
    layer = _layers(data)
    order, succ, pred, is_dummy = _with_dummies(data, layer)
    _order_layers(order, succ, pred)
    return _coordinates(data, order, succ, pred, is_dummy)


def _layers(data: LayoutInput) -> dict[str, int]:
    """Longest-path layering from the sources; then sources move right next to their first consumer
    (an input or a lone constant should sit beside what reads it, not at the far left)."""
    succ: dict[str, list[str]] = defaultdict(list)
    indeg = {n: 0 for n in data.nodes}
    for a, b in data.edges:
        if a in indeg and b in indeg and a != b:
            succ[a].append(b)
            indeg[b] += 1
    layer = {n: 0 for n in data.nodes}
    queue = deque(n for n in data.nodes if indeg[n] == 0)
    seen = 0
    while queue:
        n = queue.popleft()
        seen += 1
        for m in succ[n]:
            layer[m] = max(layer[m], layer[n] + 1)
            indeg[m] -= 1
            if indeg[m] == 0:
                queue.append(m)
    if seen < len(data.nodes):
        # a cycle (an invalid program mid-edit): its nodes keep their partial layers
        pass
    has_pred = {b for a, b in data.edges if a != b}
    for n in data.nodes:
        if n not in has_pred and succ[n]:
            layer[n] = max(layer[n], min(layer[m] for m in succ[n]) - 1)
    return layer


def _with_dummies(data: LayoutInput, layer: dict[str, int]):
    """Per-layer node lists with a dummy node on every layer a long edge crosses."""
    succ: dict[str, list[str]] = defaultdict(list)
    pred: dict[str, list[str]] = defaultdict(list)
    is_dummy: set[str] = set()
    nlayers = max(layer.values()) + 1
    order: list[list[str]] = [[] for _ in range(nlayers)]
    for n in data.nodes:
        order[layer[n]].append(n)
    k = 0
    for a, b in data.edges:
        if a not in layer or b not in layer or a == b:
            continue
        la, lb = layer[a], layer[b]
        if lb <= la:  # only on cycles; draw it backwards without dummies
            continue
        prev = a
        for lay in range(la + 1, lb):
            k += 1
            d = f"\0d{k}"
            is_dummy.add(d)
            order[lay].append(d)
            succ[prev].append(d)
            pred[d].append(prev)
            prev = d
        succ[prev].append(b)
        pred[b].append(prev)
    return order, succ, pred, is_dummy


def _order_layers(order: list[list[str]], succ, pred) -> None:
    """Barycentre heuristic: sort each layer by the mean index of its neighbours in the layer just
    swept, alternating downwards (predecessors) and upwards (successors)."""
    # initial order: depth-first from the first layer so chains start together
    index: dict[str, float] = {}
    for lay in order:
        for i, n in enumerate(lay):
            index[n] = i
    for lay in order[1:]:
        lay.sort(key=lambda n: min((index[p] for p in pred[n]), default=index[n]))
        for i, n in enumerate(lay):
            index[n] = i
    busy = [lay for lay in order if len(lay) > 1]
    if not busy:
        return
    for _ in range(SWEEPS):
        before = [list(lay) for lay in busy]
        for lay in order[1:]:
            _sort_by(lay, pred, index)
        for lay in reversed(order[:-1]):
            _sort_by(lay, succ, index)
        if all(a == b for a, b in zip(before, busy)):
            break  # converged


def _sort_by(lay: list[str], nbrs, index: dict[str, float]) -> None:
    if len(lay) < 2:  # most layers of a real program hold one node: nothing to order
        return
    keys = {}
    for n in lay:
        ns = nbrs[n]
        keys[n] = sum(index[m] for m in ns) / len(ns) if ns else index[n]
    lay.sort(key=keys.__getitem__)
    for i, n in enumerate(lay):
        index[n] = i


def _coordinates(data: LayoutInput, order, succ, pred, is_dummy):
    """Layers stacked downwards; within a layer items packed left to right near their neighbours;
    a tall result wrapped into columns at layer boundaries."""
    size = lambda n: (12.0, 0.0) if n in is_dummy else data.sizes.get(n, DEFAULT_SIZE)  # noqa: E731
    width = lambda n: size(n)[0]  # noqa: E731
    cx: dict = {}
    for lay in order:  # packed start: each layer side by side, centred on x = 0
        total = sum(width(n) for n in lay) + NODE_GAP * max(0, len(lay) - 1)
        x = -total / 2
        for n in lay:
            cx[n] = x + width(n) / 2
            x += width(n) + NODE_GAP
    # relaxation: move towards neighbours' centres, then undo overlaps keeping the layer's order
    for rnd in range(4):
        sweep = order[1:] if rnd % 2 == 0 else list(reversed(order[:-1]))
        nbrs = pred if rnd % 2 == 0 else succ
        for lay in sweep:
            want = []
            for n in lay:
                ns = nbrs[n] or (succ[n] if nbrs is pred else pred[n])
                want.append(sum(cx[m] for m in ns) / len(ns) if ns else cx[n])
            _place(lay, want, width, cx)
    heights = [max((size(n)[1] for n in lay), default=0.0) for lay in order]
    spans = [(min((cx[n] - width(n) / 2 for n in lay), default=0.0),
              max((cx[n] + width(n) / 2 for n in lay), default=0.0)) for lay in order]
    total_h = sum(heights) + LAYER_GAP * max(0, len(order) - 1)
    total_w = max(r for _, r in spans) - min(l for l, _ in spans)
    columns = _columns(heights, total_h, total_w)
    pos, x0, right, bottom = {}, 0.0, 0.0, 0.0
    for first, last in columns:
        left = min(spans[i][0] for i in range(first, last))
        shift = x0 - left
        y = 0.0
        for li in range(first, last):
            for n in order[li]:
                if n not in is_dummy:
                    w, h = size(n)
                    pos[n] = (cx[n] - w / 2 + shift, y + (heights[li] - h) / 2)
            y += heights[li] + LAYER_GAP
        col_right = max(spans[i][1] for i in range(first, last)) + shift
        right, bottom = max(right, col_right), max(bottom, y - LAYER_GAP)
        x0 = col_right + COLUMN_GAP
    return pos, (right, bottom)


def _columns(heights: list[float], total_h: float, total_w: float) -> list[tuple[int, int]]:
    """Layer ranges [first, last) per column: one, unless the box is far taller than wide; then
    enough columns (k of them: total_h / k high, about k * (total_w + COLUMN_GAP) wide) that it is
    COLUMN_ASPECT as high as wide, screen-shaped."""
    n = len(heights)
    if total_h < WRAP_MIN_H or total_h < WRAP_ASPECT * max(total_w, 1.0) or n < 4:
        return [(0, n)]
    k = max(2, round((total_h / (COLUMN_ASPECT * (max(total_w, 1.0) + COLUMN_GAP))) ** 0.5))
    target = total_h / k
    cols, first, y = [], 0, 0.0
    for i, h in enumerate(heights):
        if y > 0 and y + h / 2 > target and len(cols) < k - 1:
            cols.append((first, i))
            first, y = i, 0.0
        y += h + LAYER_GAP
    cols.append((first, n))
    return cols


def _place(lay: list[str], want: list[float], extent, cx: dict) -> None:
    """Put each item as near its wanted centre as the order and the gaps allow (forward pass pushes
    right, backward pass pulls back left, the average of the two balances the layer)."""
    n = len(lay)
    if not n:
        return
    if n == 1:
        cx[lay[0]] = want[0]
        return
    half = [extent(m) / 2 for m in lay]
    down = list(want)
    for i in range(1, n):
        lo = down[i - 1] + half[i - 1] + NODE_GAP + half[i]
        if down[i] < lo:
            down[i] = lo
    up = list(want)
    for i in range(n - 2, -1, -1):
        hi = up[i + 1] - half[i + 1] - NODE_GAP - half[i]
        if up[i] > hi:
            up[i] = hi
    mid = [(a + b) / 2 for a, b in zip(down, up)]
    for i in range(1, n):  # the average may overlap again: one last forward fix
        lo = mid[i - 1] + half[i - 1] + NODE_GAP + half[i]
        if mid[i] < lo:
            mid[i] = lo
    for m, x in zip(lay, mid):
        cx[m] = x


def grandalf_layout(data: LayoutInput) -> dict[str, tuple[float, float]]:
    """The same job done by grandalf's SugiyamaLayout (used only by tools/bench_editor.py to compare)."""
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    class _View:
        def __init__(self, w, h):
            self.w, self.h = w, h
            self.xy = (0.0, 0.0)

    verts = {n: Vertex(n) for n in data.nodes}
    for n, v in verts.items():
        w, h = data.sizes.get(n, (160.0, 60.0))
        v.view = _View(w, h)
    edges = [Edge(verts[a], verts[b]) for a, b in data.edges if a in verts and b in verts and a != b]
    g = Graph(list(verts.values()), edges)
    pos = {}
    for comp in g.C:
        sug = SugiyamaLayout(comp)
        sug.init_all()
        sug.draw(2)
        for v in comp.sV:
            x, y = v.view.xy
            w, h = data.sizes.get(v.data, (160.0, 60.0))
            pos[v.data] = (x - w / 2, y - h / 2)
    return pos
