"""Layered (Sugiyama) layout, left to right, on plain data: no Qt, so it runs in a worker thread.

Why our own: grandalf's SugiyamaLayout takes tens of seconds at 5,000 nodes (see
docs/benchmarks/editor.md); this one does the same four steps in linear-ish time:
longest-path layering, dummy nodes on long edges, barycentre ordering sweeps, and a coordinate pass
that pulls each node towards its neighbours' centres while keeping the layer packed.
"""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

LAYER_GAP = 70.0   # horizontal space between layers (edges need room to curve)
NODE_GAP = 28.0    # vertical space between nodes of a layer
SWEEPS = 4         # barycentre down+up sweep pairs; more changes little on real programs


@dataclass
class LayoutInput:
    """nodes: ids in a stable order; sizes: id -> (width, height); edges: (source id, target id)."""
    nodes: list[str]
    sizes: dict[str, tuple[float, float]]
    edges: list[tuple[str, str]]


class LayoutCancelled(Exception):
    pass


def layered_layout(data: LayoutInput, cancelled=lambda: False) -> dict[str, tuple[float, float]]:
    """Top-left positions for every node. `cancelled()` is polled between phases."""
    if not data.nodes:
        return {}
    layer = _layers(data)
    if cancelled():
        raise LayoutCancelled
    order, succ, pred, is_dummy = _with_dummies(data, layer)
    _order_layers(order, succ, pred)
    if cancelled():
        raise LayoutCancelled
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


def _coordinates(data: LayoutInput, order, succ, pred, is_dummy) -> dict[str, tuple[float, float]]:
    size = lambda n: (0.0, 12.0) if n in is_dummy else data.sizes.get(n, (160.0, 60.0))  # noqa: E731
    xs, x = [], 0.0
    for lay in order:
        xs.append(x)
        x += max((size(n)[0] for n in lay), default=0.0) + LAYER_GAP
    # packed start: each layer stacked and centred on y = 0
    cy: dict[str, float] = {}
    for lay in order:
        total = sum(size(n)[1] for n in lay) + NODE_GAP * max(0, len(lay) - 1)
        y = -total / 2
        for n in lay:
            h = size(n)[1]
            cy[n] = y + h / 2
            y += h + NODE_GAP
    # relaxation: move towards neighbours' centres, then undo overlaps keeping the layer's order
    for rnd in range(4):
        sweep = order[1:] if rnd % 2 == 0 else list(reversed(order[:-1]))
        nbrs = pred if rnd % 2 == 0 else succ
        for lay in sweep:
            want = []
            for n in lay:
                ns = nbrs[n] or (succ[n] if nbrs is pred else pred[n])
                want.append(sum(cy[m] for m in ns) / len(ns) if ns else cy[n])
            _place(lay, want, size, cy)
    pos = {}
    for li, lay in enumerate(order):
        for n in lay:
            if n in is_dummy:
                continue
            w, h = size(n)
            pos[n] = (xs[li], cy[n] - h / 2)
    return pos


def _place(lay: list[str], want: list[float], size, cy: dict[str, float]) -> None:
    """Put each node as near its wanted centre as the order and the gaps allow (forward pass pushes
    down, backward pass pulls back up, the average of the two balances the layer)."""
    n = len(lay)
    if not n:
        return
    if n == 1:
        cy[lay[0]] = want[0]
        return
    half = [size(m)[1] / 2 for m in lay]
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
    for m, y in zip(lay, mid):
        cy[m] = y


def grandalf_layout(data: LayoutInput) -> dict[str, tuple[float, float]]:
    """The same job done by grandalf's SugiyamaLayout (used only by tools/bench_editor.py to compare)."""
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    class _View:
        def __init__(self, w, h):
            # grandalf lays out top to bottom; swap axes so layers run left to right like ours
            self.w, self.h = h, w
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
            pos[v.data] = (y - w / 2, x - h / 2)
    return pos
