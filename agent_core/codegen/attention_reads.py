"""q, k, v and the mask of the fused attention kernel read in place when a view packs two dims into one
batch dim (nn.MultiheadAttention's [T, B * heads, D] over its in-projection's [T, B, 3 * E] output,
after a transpose): no single stride walks the packed dim, but split finer (B * heads as B x heads) every
operand is one strided view again. The kernel decomposes its batch index over whatever batch dims the
spec gives it, and writes its output row-major over them, so a finer batch leaves the output as it is.

views.py keeps such a read as a stack: a view over the buffer, and on top a view over the lower one's
row-major index. compose() folds the two into one view where each top dim walks one "digit" of the
lower shape without carrying into the next; split() says how a top dim must be cut for that.
"""
from __future__ import annotations

import math

from . import views as V


def strided_reads(batch: tuple, layouts: dict) -> tuple[tuple, dict]:
    """(batch dims, Layouts) for the operands (name -> Layout whose batch dims broadcast to `batch`,
    then rows and columns): as given when none is kept as two views or they cannot be made one; else
    the batch split finer and each operand, expanded to it, recomposed as one view."""
    if not any(_two_layers(lay) for lay in layouts.values()):
        return batch, layouts
    given, layouts = layouts, {w: _full(lay, batch) for w, lay in layouts.items()}
    stacks = {w: _two_layers(lay) for w, lay in layouts.items()}
    cuts: list[set] = [{1, n} for n in batch]      # per batch dim: the inner products its pieces end at
    for w, pair in stacks.items():
        if pair is None:
            continue
        bottom, top = pair
        for d, (n, s) in enumerate(zip(top.shape, top.strides)):
            pieces = split(n, s, bottom.shape)
            if pieces is None or (d >= len(batch) and len(pieces) > 1):
                return batch, given          # a row or column dim no one stride walks: not ours to fix
            if d < len(batch):
                inner = 1
                for p in reversed(pieces):
                    inner *= p
                    cuts[d].add(inner)
    fine = []
    for n, cut in zip(batch, cuts):
        chain = sorted(cut)
        if any(b % a for a, b in zip(chain, chain[1:])):
            return batch, given              # two operands cut one dim in ways that do not nest
        fine += [b // a for a, b in zip(chain, chain[1:])][::-1]      # outer first
    fine = tuple(f for f in fine if f > 1) or (1,)
    out = {}
    for w, lay in layouts.items():
        shaped = V.reshape(lay, fine + tuple(lay.shape[-2:]))
        read = shaped.single
        layers = read.stack.layers if read is not None else ()
        if len(layers) == 2:
            one = compose(*layers)
            if one is None:
                return batch, given
            shaped = V.Layout(shaped.shape, (V.Read(read.source, V.ViewStack((one,))),))
        out[w] = shaped
    return fine, out


def _full(lay: V.Layout, batch: tuple) -> V.Layout:
    while len(lay.shape) < len(batch) + 2:
        lay = V.unsqueeze(lay, 0)
    return V.expand(lay, batch + tuple(lay.shape[-2:]))


def _two_layers(lay: V.Layout):
    """(bottom, top) of a plain read kept as two unmasked views; None for one view or anything else."""
    read = lay.single
    if read is None or len(read.stack.layers) != 2:
        return None
    bottom, top = read.stack.layers
    if not all(isinstance(v, V.View) and v.mask is None for v in (bottom, top)):
        return None
    return bottom, top


def _suffix(shape) -> list[int]:
    """Row-major strides of shape (the place value of each digit)."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def _digit(step: int, shape, place) -> int | None:
    """The finest dim of `shape` whose place value divides step with the quotient inside it."""
    for k in reversed(range(len(shape))):
        if shape[k] > 1 and step % place[k] == 0 and step // place[k] < shape[k]:
            return k
    return None


def split(n: int, step: int, shape) -> list[int] | None:
    """How a top dim of n elements stepping `step` through the row-major index of `shape` is cut into
    pieces (outer first) that each walk one dim of shape; None when it cannot be."""
    if n == 1 or step == 0:
        return [n]
    place, pieces = _suffix(shape), []
    while n > 1:
        k = _digit(step, shape, place)
        if k is None:
            return None
        q = step // place[k]
        fits = (shape[k] - 1) // q + 1
        if n <= fits:
            pieces.insert(0, n)
            return pieces
        if n % fits or q * fits != shape[k]:
            return None                     # the walk carries into the next dim mid-way
        pieces.insert(0, fits)
        n, step = n // fits, step * fits
    return pieces


def compose(bottom: V.View, top: V.View) -> V.View | None:
    """One view equal to `top` read over `bottom`'s row-major index, or None when none is."""
    place = _suffix(bottom.shape)
    digits = [(top.offset // p) % s for p, s in zip(place, bottom.shape)]
    if top.offset >= math.prod(bottom.shape):
        return None
    used = list(digits)
    strides = []
    for n, s in zip(top.shape, top.strides):
        if n == 1 or s == 0:
            strides.append(0)
            continue
        k = _digit(s, bottom.shape, place)
        if k is None:
            return None
        q = s // place[k]
        used[k] += q * (n - 1)
        strides.append(q * bottom.strides[k])
    if any(u >= size for u, size in zip(used, bottom.shape)):
        return None                         # the dims together carry into the next digit
    offset = bottom.offset + sum(d * st for d, st in zip(digits, bottom.strides))
    return V.View.create(top.shape, strides, offset)
