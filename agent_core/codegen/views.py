"""Views: every layout op as an index expression and a validity mask, so that it folds into the loads
of the kernel that reads through it (the idea of tinygrad's View / ShapeTracker, written afresh).

* `View`: shape, strides (0 for a broadcast dim, negative for a flipped one), offset, and an optional
  mask (one valid range per dim; outside it the element is not read).
* `ViewStack`: views applied one over the other, bottom (the buffer) first, where one view cannot hold
  the result (a reshape of a permuted or masked view): the flat index of a view is unravelled into
  the shape of the view under it. An `Indirect` layer is a gather: one coordinate is a load of
  another tensor (gather, index_select, embedding).
* `Read`: one tensor (or a constant) through a stack. `Layout`: what a chain of layout ops makes of
  its inputs, as reads tried in order, the first valid one giving the element: a pad is the input
  masked then its fill value; a cat is each input padded into its place; roll and the reflect /
  replicate / circular pads are cats of slices of one input.

`apply_op(op, attrs, layouts)` builds the Layout of any layout op of the op library (plus `unfold`)
from its inputs' Layouts; `render_layout` / `render_read` render the result as a CUDA C (or Python)
expression over output index variables, simplified: stride-0 and size-1 terms dropped, constants
folded, contiguous dims merged, div/mod pairs recombined. triu / tril are a `Triangle` layer: a
validity test on (row, col) with a diagonal offset, 0 where it fails, so a triangular mask folds into
the kernel that reads it. `where` and `masked_fill` are pointwise ops over the values, not views. docs/CODEGEN.md ("Views") explains how to add an op.
Pure Python: no torch, no Qt.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from .kernel import CodegenError


class ViewError(CodegenError):
    """A layout op, or an attribute of one, that this module cannot express as a view."""


BIG = 1 << 62  # bounds of a loaded value (an index read from a tensor): unknown


# --- index expressions ---------------------------------------------------------------------------
class Expr:
    """An integer expression with interval bounds [lo, hi] (used to simplify)."""
    lo: int
    hi: int


@dataclass(frozen=True)
class Num(Expr):
    v: int

    @property
    def lo(self):
        return self.v

    @property
    def hi(self):
        return self.v


@dataclass(frozen=True)
class Var(Expr):
    name: str
    lo: int
    hi: int


@dataclass(frozen=True)
class Load(Expr):
    """An element of tensor `buf` (an index stored in it)."""
    buf: str
    index: Expr
    lo: int = -BIG
    hi: int = BIG


@dataclass(frozen=True)
class Div(Expr):
    a: Expr
    c: int

    @cached_property
    def lo(self):
        return self.a.lo // self.c

    @cached_property
    def hi(self):
        return self.a.hi // self.c


@dataclass(frozen=True)
class Mod(Expr):
    a: Expr
    c: int

    @cached_property
    def lo(self):
        return 0 if self.a.lo >= 0 else 1 - self.c    # C's % keeps the dividend's sign

    @cached_property
    def hi(self):
        return min(self.c - 1, self.a.hi) if self.a.lo >= 0 else self.c - 1


@dataclass(frozen=True)
class Sum(Expr):
    terms: tuple      # ((expr, coefficient), ...), no Num and no Sum inside
    const: int

    @cached_property
    def lo(self):
        return self.const + sum(k * (e.lo if k > 0 else e.hi) for e, k in self.terms)

    @cached_property
    def hi(self):
        return self.const + sum(k * (e.hi if k > 0 else e.lo) for e, k in self.terms)


def _linear(x: Expr, k: int = 1):
    """x * k as (terms, const)."""
    if isinstance(x, Num):
        return [], x.v * k
    if isinstance(x, Sum):
        return [(e, c * k) for e, c in x.terms], x.const * k
    return [(x, k)], 0


def _sum(terms, const: int) -> Expr:
    """The normal form of sum(e * k) + const: like terms combined, zero terms dropped, each
    x / c * c + x % c pair recombined into x (a coordinate unravelled and flattened again)."""
    acc: dict = {}
    for e, k in terms:
        for e2, k2 in _linear(e, k)[0]:
            acc[e2] = acc.get(e2, 0) + k2
        const += _linear(e, k)[1]
    acc = {e: k for e, k in acc.items() if k}
    changed = True
    while changed:
        changed = False
        for e, k in list(acc.items()):
            if isinstance(e, Mod):
                d = div(e.a, e.c)
                if acc.get(d) == k * e.c:
                    del acc[e], acc[d]
                    inner, c0 = _linear(e.a, k)
                    const += c0
                    for e2, k2 in inner:
                        acc[e2] = acc.get(e2, 0) + k2
                    acc = {x: v for x, v in acc.items() if v}
                    changed = True
                    break
    if not acc:
        return Num(const)
    if len(acc) == 1 and not const and next(iter(acc.values())) == 1:
        return next(iter(acc))
    return Sum(tuple(acc.items()), const)


def add(*xs: Expr) -> Expr:
    return _sum([(x, 1) for x in xs], 0)


def mul(x: Expr, k: int) -> Expr:
    return _sum([(x, k)], 0)


def _common_factor(x: Expr, c: int):
    """(g, y, rest) with x = g * y + rest, g > 1 dividing c, y >= 0 and 0 <= rest < g: then x / c is
    y / (c / g) and x % c is g * (y % (c / g)) + rest. The terms whose coefficient g divides form y;
    the others and the constant's remainder must stay below g (a run's 4 * o + k with g = 4, a row's
    768 * row + col with col < 768 and g = 768). None when no divisor of c splits x so."""
    if not isinstance(x, Sum) or x.lo < 0:
        return None
    for g in sorted({math.gcd(c, k) for _, k in x.terms if k > 1}, reverse=True):
        if g <= 1:
            continue
        rest = _sum([(e, k) for e, k in x.terms if k % g], x.const % g)
        if rest.lo < 0 or rest.hi >= g:
            continue
        y = _sum([(e, k // g) for e, k in x.terms if k % g == 0], x.const // g)
        if y.lo >= 0:
            return g, y, rest
    return None


def div(x: Expr, c: int) -> Expr:
    """x / c (c > 0), exact for x >= 0 (where C's truncation and floor division agree)."""
    if c == 1:
        return x
    if isinstance(x, Num):
        return Num(x.v // c)
    if 0 <= x.lo and x.hi < c:
        return Num(0)
    if isinstance(x, Div):
        return div(x.a, x.c * c)
    common = _common_factor(x, c)
    if common:                       # (g * y + rest) / (g * c') = y / c' for 0 <= rest < g
        g, y, _ = common
        return div(y, c // g)
    if isinstance(x, Sum) and x.lo >= 0:
        q = [(e, k // c) for e, k in x.terms if k % c == 0]
        r = [(e, k) for e, k in x.terms if k % c]
        qc, rc = divmod(x.const, c)
        rest = _sum(r, rc)
        if (q or qc) and rest.lo >= 0:
            return add(_sum(q, qc), div(rest, c)) if rest.hi >= c else _sum(q, qc)
    return Div(x, c)


def mod(x: Expr, c: int) -> Expr:
    """x % c (c > 0), exact for x >= 0."""
    if c == 1:
        return Num(0)
    if isinstance(x, Num):
        return Num(x.v % c)
    if 0 <= x.lo and x.hi < c:
        return x
    if isinstance(x, Mod) and x.c % c == 0 and x.a.lo >= 0:
        return mod(x.a, c)
    common = _common_factor(x, c)
    if common:                       # (g * y + rest) % (g * c') = g * (y % c') + rest for 0 <= rest < g
        g, y, rest = common
        return add(mul(mod(y, c // g), g), rest)
    if isinstance(x, Sum) and x.lo >= 0:
        r = [(e, k) for e, k in x.terms if k % c]
        if len(r) < len(x.terms) or x.const % c != x.const:
            rest = _sum(r, x.const % c)
            if rest.lo >= 0:
                return mod(rest, c)
    return Mod(x, c)


# --- validity: lo <= e < hi tests ----------------------------------------------------------------
FALSE = None  # a condition that never holds


def _test(e: Expr, lo: int, hi: int):
    """The tests (e, lo, hi) meaning lo <= e < hi, simplified; [] when always true, FALSE if never."""
    if isinstance(e, Sum) and e.const:
        e, lo, hi = _sum(e.terms, 0), lo - e.const, hi - e.const
    if isinstance(e, Sum) and len(e.terms) == 1:
        t, k = e.terms[0]
        if k > 0:
            e, lo, hi = t, -(-lo // k), -(-hi // k)
        else:
            m = -k
            e, lo, hi = t, (-hi) // m + 1, (-lo) // m + 1
    if e.hi < lo or e.lo >= hi or lo >= hi:
        return FALSE
    return [] if (e.lo >= lo and e.hi < hi) else [(e, lo, hi)]


def _and(tests, more):
    if tests is FALSE or more is FALSE:
        return FALSE
    return tests + [t for t in more if t not in tests]


# --- views ---------------------------------------------------------------------------------------
def contiguous_strides(shape) -> tuple:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc if s != 1 else 0)
        acc *= s
    return tuple(reversed(out))


def _chunks(shape, strides, mask):
    """Neighbouring dims merged where one index step of the outer equals a full run of the inner
    (and the inner is unmasked): (size, stride, mask range) per chunk, size-1 dims dropped."""
    out: list = []
    for s, st, m in zip(shape, strides, mask or [(0, s) for s in shape]):
        if s == 1:
            if m[0] >= m[1]:
                return None                       # an empty mask: nothing is valid
            continue
        if out and out[-1][1] == st * s and m == (0, s):
            ps, pst, pm = out[-1]
            out[-1] = (ps * s, st, (pm[0] * s, pm[1] * s))
        else:
            out.append((s, st, m))
    return out


@dataclass(frozen=True)
class View:
    shape: tuple
    strides: tuple
    offset: int = 0
    mask: tuple | None = None    # ((lo, hi), ...) valid range per dim; None: everything valid

    @staticmethod
    def create(shape, strides=None, offset: int = 0, mask=None) -> "View":
        shape = tuple(int(s) for s in shape)
        strides = contiguous_strides(shape) if strides is None else tuple(
            0 if s == 1 else int(st) for s, st in zip(shape, strides))
        if mask is not None:
            mask = tuple((max(0, min(lo, s)), max(0, min(hi, s))) for (lo, hi), s in zip(mask, shape))
            if any(lo >= hi for lo, hi in mask):
                mask = tuple((0, 0) for _ in shape)
            elif all(m == (0, s) for m, s in zip(mask, shape)):
                mask = None
        return View(shape, strides, offset, mask)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def contiguous(self) -> bool:
        return self.offset == 0 and self.mask is None and self.strides == contiguous_strides(self.shape)

    @property
    def empty(self) -> bool:
        return self.mask is not None and any(lo >= hi for lo, hi in self.mask)

    def _m(self):
        return self.mask or tuple((0, s) for s in self.shape)

    # the layout ops on one view
    def permute(self, order) -> "View":
        m = None if self.mask is None else tuple(self.mask[d] for d in order)
        return View.create([self.shape[d] for d in order], [self.strides[d] for d in order], self.offset, m)

    def expand(self, shape) -> "View":
        m = self._m()
        mask = [m[d] if s == self.shape[d] else ((0, s) if m[d][1] > m[d][0] else (0, 0))
                for d, s in enumerate(shape)]
        strides = [st if s == self.shape[d] else 0 for d, (s, st) in enumerate(zip(shape, self.strides))]
        return View.create(shape, strides, self.offset, mask)

    def shrink(self, bounds) -> "View":
        off = self.offset + sum(b * st for (b, _), st in zip(bounds, self.strides))
        mask = [(max(lo, b) - b, min(hi, e) - b) for (lo, hi), (b, e) in zip(self._m(), bounds)]
        return View.create([e - b for b, e in bounds], self.strides, off, mask)

    def flip(self, d: int) -> "View":
        n, st = self.shape[d], self.strides[d]
        strides = list(self.strides)
        strides[d] = -st
        m = list(self._m())
        m[d] = (n - m[d][1], n - m[d][0])
        return View.create(self.shape, strides, self.offset + (n - 1) * st, m)

    def step(self, d: int, k: int) -> "View":
        """Every k-th element along d (k > 0), starting at 0."""
        shape, strides, m = list(self.shape), list(self.strides), list(self._m())
        shape[d], strides[d] = -(-shape[d] // k), strides[d] * k
        m[d] = (-(-m[d][0] // k), -(-m[d][1] // k))
        return View.create(shape, strides, self.offset, m)

    def pad(self, d: int, lo: int, hi: int) -> "View":
        shape, m = list(self.shape), list(self._m())
        shape[d] += lo + hi
        m[d] = (m[d][0] + lo, m[d][1] + lo)
        return View.create(shape, self.strides, self.offset - lo * self.strides[d], m)

    def extend(self, d: int, lo: int, hi: int) -> "View":
        """pad without a mask along d: the index runs on past the ends. Only for the last arm of a
        cat, which is read where no earlier arm is valid."""
        shape = list(self.shape)
        shape[d] += lo + hi
        m = None if self.mask is None else [(0, s) if i == d else r for i, (r, s) in enumerate(zip(self.mask, shape))]
        return View.create(shape, self.strides, self.offset - lo * self.strides[d], m)

    def diagonal(self, d1: int, d2: int, k: int) -> "View":
        """torch.diagonal(offset=k, dim1=d1, dim2=d2) of an unmasked view."""
        s1, s2 = self.shape[d1], self.shape[d2]
        n = max(0, min(s1, s2 - k) if k >= 0 else min(s1 + k, s2))
        off = self.offset + (k * self.strides[d2] if k >= 0 else -k * self.strides[d1])
        keep = [d for d in range(len(self.shape)) if d not in (d1, d2)]
        return View.create([self.shape[d] for d in keep] + [n],
                           [self.strides[d] for d in keep] + [self.strides[d1] + self.strides[d2]], off)

    def unfold(self, d: int, size: int, step: int) -> "View":
        """Tensor.unfold(d, size, step) of an unmasked view: windows along d, a new last dim."""
        shape, strides = list(self.shape), list(self.strides)
        st = strides[d]
        shape[d], strides[d] = (shape[d] - size) // step + 1, st * step
        return View.create(shape + [size], strides + [st], self.offset)

    def reshape(self, new_shape) -> "View | None":
        """The same elements in new_shape as one view, or None when one view cannot hold it (the
        caller then stacks a contiguous view on top)."""
        new_shape = tuple(new_shape)
        if self.contiguous or self.numel == 0:
            return View.create(new_shape)
        if self.empty:
            return View.create(new_shape, [0] * len(new_shape), 0, [(0, 0)] * len(new_shape))
        chunks = _chunks(self.shape, self.strides, self._m())
        strides, mask, c, rem = [], [], 0, None   # rem: elements left of the current chunk
        for ns in new_shape:
            if ns == 1:
                strides.append(0)
                mask.append((0, 1))
                continue
            first = rem is None
            if first:
                if c == len(chunks):
                    return None
                size, st, (a, b) = chunks[c]
                c, rem = c + 1, size
            if rem % ns:
                return None               # the new dim straddles two chunks that are not contiguous
            inner = rem // ns
            if first and (a, b) != (0, size):
                if a % inner or b % inner:
                    return None           # a masked range that is no box in the new dims
                mask.append((a // inner, b // inner))
            else:
                mask.append((0, ns))
            strides.append(st * inner)
            rem = inner if inner > 1 else None
        if rem is not None or c != len(chunks):
            return None
        return View.create(new_shape, strides, self.offset, mask)

    def merged(self) -> "View":
        """The same flat-index -> offset map over fewer dims (size-1 dropped, contiguous ones merged)."""
        if self.empty:
            return self
        chunks = _chunks(self.shape, self.strides, self._m()) or [(1, 0, (0, 1))]
        return View.create([s for s, _, _ in chunks], [st for _, st, _ in chunks], self.offset,
                           [m for _, _, m in chunks])

    def locate(self, coords):
        """(offset expression, validity tests) at the coordinate expressions `coords`."""
        tests = []
        for (lo, hi), s, c in zip(self._m(), self.shape, coords):
            if (lo, hi) != (0, s):
                tests = _and(tests, _test(c, lo, hi))
        if self.empty:
            tests = FALSE
        return _sum([(c, st) for c, st in zip(coords, self.strides) if st], self.offset), tests


@dataclass(frozen=True)
class Indirect:
    """A gather layer: coordinates in `shape` pick an element of a contiguous `in_shape`; in-dim k
    takes output coordinate dims[k], or (dims[k] == -1) the value `index` reads at the output
    coordinates `index_coords`. An index outside [0, in_shape[k]) makes the element invalid."""
    shape: tuple
    in_shape: tuple
    dims: tuple
    index: "Read"
    index_coords: tuple

    def locate(self, coords):
        ioff, tests = _locate(self.index.stack, [coords[i] for i in self.index_coords])
        picked = Load(self.index.source, ioff)
        strides = contiguous_strides(self.in_shape)
        terms = []
        for k, d in enumerate(self.dims):
            c = picked if d == -1 else coords[d]
            if d == -1:
                tests = _and(tests, [(picked, 0, self.in_shape[k])])
            terms.append((c, strides[k] if self.in_shape[k] != 1 else 0))
        return _sum([(c, st) for c, st in terms if st], 0), tests


@dataclass(frozen=True)
class Triangle:
    """tril / triu as a validity test on (row, col), the last two dims of a contiguous `shape`: the
    element is read where col - row <= k (lower) or col - row >= k (upper), and elsewhere the read is
    invalid, so the layout's next read (tril's fill of 0) gives it. The coordinates pass through
    unchanged (offset: the flat index in `shape`), so any view over it composes as over a gather."""
    shape: tuple
    k: int
    lower: bool

    def locate(self, coords):
        strides = contiguous_strides(self.shape)
        off = _sum([(c, st) for c, st in zip(coords, strides) if st], 0)
        diff = add(coords[-1], mul(coords[-2], -1))
        return off, (_test(diff, -BIG, self.k + 1) if self.lower else _test(diff, self.k, BIG))


def unravel(flat: Expr, shape) -> list:
    out, inner = [], 1
    for s in reversed(shape):
        out.append(mod(div(flat, inner), s))
        inner *= s
    return list(reversed(out))


def _locate(stack: "ViewStack", coords):
    """(offset, tests) of a stack at top coordinates `coords`."""
    layers = stack.layers
    off, tests = layers[-1].locate(coords)
    for layer in reversed(layers[:-1]):
        if tests is FALSE:
            return off, FALSE
        lay = layer.merged() if isinstance(layer, View) else layer
        off, more = lay.locate(unravel(off, lay.shape))
        tests = _and(tests, more)
    return off, tests


@dataclass(frozen=True)
class ViewStack:
    layers: tuple     # View / Indirect / Triangle, bottom (the buffer) first

    @staticmethod
    def of(shape) -> "ViewStack":
        return ViewStack((View.create(shape),))

    @property
    def shape(self) -> tuple:
        return self.layers[-1].shape

    def _push(self, view: View) -> "ViewStack":
        """view on top (contiguous layers below it are dropped by _simplify_stack)."""
        return _simplify_stack(ViewStack(self.layers + (view,)))

    def _top(self, plain: bool = False) -> tuple:
        """The top view to transform; plain: unmasked (a contiguous view is stacked first if needed)."""
        top = self.layers[-1]
        if isinstance(top, View) and not (plain and top.mask is not None):
            return top, self.layers[:-1]
        return View.create(top.shape), self.layers

    def reshape(self, shape) -> "ViewStack":
        top, below = self._top()
        v = top.reshape(shape)
        if v is not None:
            return ViewStack(below + (v,)) if below else ViewStack((v,))
        return ViewStack(below + (top,))._push(View.create(shape))

    def gather(self, layer: Indirect) -> "ViewStack":
        return _simplify_stack(ViewStack(self.layers + (layer,)))

    @property
    def always_valid(self) -> bool:
        return all(isinstance(v, View) and v.mask is None for v in self.layers)


def _simplify_stack(stack: ViewStack) -> ViewStack:
    """Drop contiguous layers under the top one (they map a flat index to itself)."""
    below = tuple(v for v in stack.layers[:-1] if not (isinstance(v, View) and v.contiguous))
    return ViewStack(below + stack.layers[-1:])


# --- reads and layouts ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Read:
    source: str | None     # tensor name, or None: the constant `value`
    stack: ViewStack
    value: float = 0.0

    def map(self, fn) -> "Read":
        return Read(self.source, _simplify_stack(fn(self.stack)), self.value)


@dataclass(frozen=True)
class Layout:
    shape: tuple
    reads: tuple      # tried in order; the first valid read gives the element

    @staticmethod
    def of(name: str, shape) -> "Layout":
        return Layout(tuple(shape), (Read(name, ViewStack.of(shape)),))

    def map(self, fn) -> "Layout":
        reads = []
        for r in self.reads:
            r = r.map(fn)
            if isinstance(r.stack.layers[-1], View) and r.stack.layers[-1].empty:
                continue                      # masked away entirely
            reads.append(r)
            if r.stack.always_valid:
                break                         # nothing after it is ever read
        shape = reads[0].stack.shape if reads else fn(ViewStack.of(self.shape)).shape
        return Layout(tuple(shape), tuple(reads))

    @property
    def sources(self) -> list:
        out = []
        for r in self.reads:
            for name in [r.source] + [v.index.source for v in r.stack.layers if isinstance(v, Indirect)]:
                if name is not None and name not in out:
                    out.append(name)
        return out

    @property
    def single(self) -> "Read | None":
        """The one read of a layout that is a plain view of one tensor (no fill, no choice)."""
        return self.reads[0] if len(self.reads) == 1 and self.reads[0].source is not None else None


def _stack_op(name):
    def op(stack: ViewStack, *args, plain=False):
        top, below = stack._top(plain)
        return ViewStack(below + (getattr(top, name)(*args),))
    return op


_permute, _expand, _shrink, _flip, _step, _pad, _extend = (
    _stack_op(n) for n in ("permute", "expand", "shrink", "flip", "step", "pad", "extend"))


def _norm(d: int, rank: int, op: str) -> int:
    if not -max(rank, 1) <= d < max(rank, 1):
        raise ViewError(f"{op}: dim {d} is out of range for rank {rank}")
    return d % max(rank, 1)


def _resolve(shape, target, op: str) -> tuple:
    numel, target = math.prod(shape), [int(t) for t in target]
    if target.count(-1) == 1:
        known = math.prod(t for t in target if t != -1)
        if known == 0 or numel % known:
            raise ViewError(f"{op}: cannot reshape {list(shape)} into {target}")
        target[target.index(-1)] = numel // known
    if math.prod(target) != numel or any(t < 0 for t in target):
        raise ViewError(f"{op}: cannot reshape {list(shape)} into {target}")
    return tuple(target)


def reshape(x: Layout, shape) -> Layout:
    shape = _resolve(x.shape, shape, "reshape")
    return x.map(lambda s: s.reshape(shape))


def permute(x: Layout, dims) -> Layout:
    order = [_norm(d, len(x.shape), "permute") for d in dims]
    if sorted(order) != list(range(len(x.shape))):
        raise ViewError(f"permute: dims {list(dims)} are not a permutation of {len(x.shape)} dims")
    return x.map(lambda s: _permute(s, order))


def transpose(x: Layout, d0: int, d1: int) -> Layout:
    order = list(range(len(x.shape)))
    if order:
        a, b = _norm(d0, len(order), "transpose"), _norm(d1, len(order), "transpose")
        order[a], order[b] = order[b], order[a]
    return permute(x, order)


def unsqueeze(x: Layout, d: int) -> Layout:
    d = d % (len(x.shape) + 1)
    return reshape(x, x.shape[:d] + (1,) + x.shape[d:])


def squeeze(x: Layout, dims=None) -> Layout:
    dims = range(len(x.shape)) if dims is None else {_norm(d, len(x.shape), "squeeze") for d in dims}
    return reshape(x, [s for d, s in enumerate(x.shape) if not (d in dims and s == 1)])


def flatten(x: Layout, start: int = 0, end: int = -1) -> Layout:
    if not x.shape:
        return reshape(x, (1,))
    s, e = _norm(start, len(x.shape), "flatten"), _norm(end, len(x.shape), "flatten")
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def unflatten(x: Layout, d: int, sizes) -> Layout:
    d = _norm(d, len(x.shape), "unflatten")
    return reshape(x, x.shape[:d] + _resolve((x.shape[d],), sizes, "unflatten") + x.shape[d + 1:])


def expand(x: Layout, size) -> Layout:
    size = list(size)
    lead = len(size) - len(x.shape)
    if lead < 0:
        raise ViewError(f"expand: size {size} has fewer dims than {list(x.shape)}")
    x = reshape(x, (1,) * lead + x.shape)
    size = [x.shape[i] if s == -1 else int(s) for i, s in enumerate(size)]
    if any(a != b and a != 1 for a, b in zip(x.shape, size)):
        raise ViewError(f"expand: {list(x.shape)} cannot be expanded to {size}")
    return x.map(lambda s: _expand(s, size))


def repeat(x: Layout, reps) -> Layout:
    reps = [int(r) for r in reps]
    x = reshape(x, (1,) * (len(reps) - len(x.shape)) + x.shape)
    inter = [v for s in x.shape for v in (1, s)]
    x = reshape(x, inter)
    x = expand(x, [v for r, s in zip(reps, x.shape[1::2]) for v in (r, s)])
    return reshape(x, [r * s for r, s in zip(reps, x.shape[1::2])])


def shrink(x: Layout, d: int, b: int, e: int) -> Layout:
    bounds = [(0, s) for s in x.shape]
    bounds[d] = (b, e)
    return x.map(lambda s: _shrink(s, bounds))


def slice_(x: Layout, d: int, start=None, end=None, step: int = 1) -> Layout:
    d = _norm(d, len(x.shape), "slice")
    if step < 1:
        raise ViewError(f"slice: step must be positive, got {step}")
    r = range(x.shape[d])[slice(start, end, step)]
    first, n = (r.start, len(r)) if len(r) else (0, 0)
    x = shrink(x, d, first, first + (n - 1) * step + 1 if n else first)
    return x.map(lambda s: _step(s, d, step)) if step > 1 and n else x


def select(x: Layout, d: int, index: int) -> Layout:
    d = _norm(d, len(x.shape), "select")
    n = x.shape[d]
    if not -n <= index < n:
        raise ViewError(f"select: index {index} is out of range for dim {d} of size {n}")
    i = index % n
    x = shrink(x, d, i, i + 1)
    return reshape(x, x.shape[:d] + x.shape[d + 1:])


def flip(x: Layout, dims) -> Layout:
    for d in dims:
        d = _norm(d, len(x.shape), "flip")
        x = x.map(lambda s, d=d: _flip(s, d))
    return x


def constant(value: float, shape) -> Layout:
    """A constant everywhere in `shape` (the fill of a pad)."""
    return Layout(tuple(shape), (Read(None, ViewStack((View.create(shape, [0] * len(shape)),)), float(value)),))


def pad_constant(x: Layout, d: int, lo: int, hi: int) -> Layout:
    """x padded along d by lo and hi positions where no read is valid (the caller adds the fill)."""
    if lo < 0 or hi < 0:
        x = shrink(x, d, max(0, -lo), x.shape[d] - max(0, -hi))
        lo, hi = max(lo, 0), max(hi, 0)
    return x.map(lambda s: _pad(s, d, lo, hi)) if lo or hi else x


def cat(xs, d: int) -> Layout:
    rank = len(xs[0].shape)
    d = _norm(d, rank, "cat")
    total = sum(x.shape[d] for x in xs)
    reads, pos = [], 0
    last = max((k for k, x in enumerate(xs) if x.shape[d]), default=-1)
    for k, x in enumerate(xs):
        n = x.shape[d]
        if n:
            placed = pad_constant(x, d, pos, total - pos - n).reads
            if k == last and x.reads[-1].stack.always_valid:
                # the last arm is read wherever no earlier one is valid: no test needed
                placed = placed[:-1] + (x.reads[-1].map(lambda s: _extend(s, d, pos, total - pos - n)),)
            reads += placed
        pos += n
    shape = list(xs[0].shape)
    shape[d] = total
    return Layout(tuple(shape), tuple(reads))


def stack(xs, d: int) -> Layout:
    d = d % (len(xs[0].shape) + 1)
    return cat([unsqueeze(x, d) for x in xs], d)


def pad(x: Layout, pads, mode: str = "constant", value: float = 0.0) -> Layout:
    """F.pad: (left, right) pairs, last dim first; negative pads crop first (as torch)."""
    if len(pads) % 2 or len(pads) // 2 > len(x.shape):
        raise ViewError(f"pad: {list(pads)} must hold (left, right) pairs for at most {len(x.shape)} dims")
    rank = len(x.shape)
    for i in range(len(pads) // 2):
        d, lo, hi = rank - 1 - i, pads[2 * i], pads[2 * i + 1]
        if mode == "constant":
            x = pad_constant(x, d, lo, hi)
            continue
        x = pad_constant(x, d, min(lo, 0), min(hi, 0))          # crop
        lo, hi, n = max(lo, 0), max(hi, 0), x.shape[d]
        if mode == "reflect":
            if lo >= n or hi >= n:
                raise ViewError(f"pad: reflect padding {lo}, {hi} must be smaller than dim {d} of size {n}")
            left, right = flip(slice_(x, d, 1, lo + 1), [d]), flip(slice_(x, d, n - 1 - hi, n - 1), [d])
        elif mode == "replicate":
            left, right = slice_(x, d, 0, 1), slice_(x, d, n - 1, n)
            left, right = (expand(v, [k if j == d else -1 for j in range(rank)]) for v, k in ((left, lo), (right, hi)))
        elif mode == "circular":
            if lo > n or hi > n:
                raise ViewError(f"pad: circular padding {lo}, {hi} is larger than dim {d} of size {n}")
            left, right = slice_(x, d, n - lo, n), slice_(x, d, 0, hi)
        else:
            raise ViewError(f"pad: mode {mode!r} has no view (constant, reflect, replicate, circular)")
        x = cat([p for p, k in ((left, lo), (x, 1), (right, hi)) if k], d)
    if mode == "constant":
        x = Layout(x.shape, x.reads + constant(value, x.shape).reads) if not _covers(x) else x
    return x


def _covers(x: Layout) -> bool:
    return any(r.stack.always_valid for r in x.reads)


def roll(x: Layout, shifts, dims=None) -> Layout:
    if not dims:
        shape = x.shape
        return reshape(roll(flatten(x), [shifts[0]], [0]), shape)
    for s, d in zip(shifts, dims):
        d = _norm(d, len(x.shape), "roll")
        n = x.shape[d]
        s = s % n if n else 0
        if s:
            x = cat([slice_(x, d, n - s, n), slice_(x, d, 0, n - s)], d)
    return x


def _plain(stack: ViewStack, fn) -> ViewStack:
    """fn applied to the top view, unmasked (a contiguous view is stacked over a masked one)."""
    top, below = stack._top(plain=True)
    return ViewStack(below + (fn(top),))


def triangle(x: Layout, k: int = 0, lower: bool = True) -> Layout:
    """tril (lower) / triu of the last two dims with diagonal offset k: each read of x under the
    triangle's test, then 0 where it fails."""
    if len(x.shape) < 2:
        raise ViewError(f"{'tril' if lower else 'triu'}: needs at least 2 dims, got {list(x.shape)}")
    tri = Triangle(tuple(x.shape), int(k), lower)
    reads = tuple(Read(r.source, ViewStack(r.stack.layers + (tri,)), r.value) for r in x.reads)
    return Layout(x.shape, reads + constant(0.0, x.shape).reads)


def diagonal(x: Layout, k: int = 0, d1: int = 0, d2: int = 1) -> Layout:
    return x.map(lambda s: _plain(s, lambda v: v.diagonal(d1, d2, k)))


def diag(x: Layout, k: int = 0) -> Layout:
    """torch.diag: a matrix's k-th diagonal, or a vector as the k-th diagonal of a zero matrix
    (the vector padded and re-viewed so that its elements fall n + 1 apart)."""
    if len(x.shape) == 2:
        return diagonal(x, k)
    if len(x.shape) != 1:
        raise ViewError(f"diag: input must be a vector or a matrix, got {list(x.shape)}")
    n_in = x.shape[0]
    n = n_in + abs(k)
    y = flatten(pad_constant(reshape(x, (n_in, 1)), 1, 0, n))
    left = k if k >= 0 else -k * n
    y = pad_constant(y, 0, left, n * n - n_in * (n + 1) - left)
    y = reshape(y, (n, n))
    return Layout(y.shape, y.reads + constant(0.0, y.shape).reads)


def unfold(x: Layout, d: int, size: int, step: int) -> Layout:
    d = _norm(d, len(x.shape), "unfold")
    if size > x.shape[d] or size < 0 or step < 1:
        raise ViewError(f"unfold: size {size} / step {step} do not fit dim {d} of size {x.shape[d]}")
    return x.map(lambda s: _plain(s, lambda v: v.unfold(d, size, step)))


def _indirect(x: Layout, out_shape, dims, idx: Layout, index_coords, op: str) -> Layout:
    r = idx.single
    if r is None:
        raise ViewError(f"{op}: the index must be one tensor read through a view (not a pad or a cat)")
    layer = Indirect(tuple(out_shape), tuple(x.shape), tuple(dims), r, tuple(index_coords))
    return Layout(tuple(out_shape), tuple(Read(q.source, q.stack.gather(layer), q.value) for q in x.reads))


def index_select(x: Layout, d: int, idx: Layout) -> Layout:
    d = _norm(d, len(x.shape), "index_select")
    idx = reshape(idx, (math.prod(idx.shape),))
    out = x.shape[:d] + idx.shape + x.shape[d + 1:]
    return _indirect(x, out, [-1 if k == d else k for k in range(len(x.shape))], idx, [d], "index_select")


def gather(x: Layout, d: int, idx: Layout) -> Layout:
    d = _norm(d, len(x.shape), "gather")
    return _indirect(x, idx.shape, [-1 if k == d else k for k in range(len(x.shape))], idx,
                     range(len(idx.shape)), "gather")


def embedding(idx: Layout, weight: Layout) -> Layout:
    r = len(idx.shape)
    return _indirect(weight, idx.shape + weight.shape[1:], [-1, r], idx, range(r), "embedding")


def _split_sizes(size: int, spec) -> list:
    if len(spec) == 1:
        return [min(spec[0], size - i) for i in range(0, size, spec[0])] or [0]
    return list(spec)


def _pieces(x: Layout, d: int, sizes) -> list:
    out, pos = [], 0
    for n in sizes:
        out.append(slice_(x, d, pos, pos + n))
        pos += n
    return out


def _chunk(x: Layout, chunks: int, d: int) -> list:
    d = _norm(d, len(x.shape), "chunk")
    size = x.shape[d]
    step = -(-size // chunks) if size else 0
    return _pieces(x, d, _split_sizes(size, [step]) if step else [0] * chunks)


# op -> (input Layouts, attrs) -> output Layouts. Every layout op of the op library that a consumer
# can read through; `unfold` is Tensor.unfold, for when the library has it.
VIEW_OPS = {
    "reshape": lambda xs, a: [reshape(xs[0], a["shape"])],
    "flatten": lambda xs, a: [flatten(xs[0], a.get("start_dim", 0), a.get("end_dim", -1))],
    "unflatten": lambda xs, a: [unflatten(xs[0], a["dim"], a["sizes"])],
    "squeeze": lambda xs, a: [squeeze(xs[0], a.get("dim"))],
    "unsqueeze": lambda xs, a: [unsqueeze(xs[0], a["dim"])],
    "permute": lambda xs, a: [permute(xs[0], a["dims"])],
    "transpose": lambda xs, a: [transpose(xs[0], a["dim0"], a["dim1"])],
    "expand": lambda xs, a: [expand(xs[0], a["size"])],
    "repeat": lambda xs, a: [repeat(xs[0], a["repeats"])],
    "cat": lambda xs, a: [cat(xs, a.get("dim", 0))],
    "stack": lambda xs, a: [stack(xs, a.get("dim", 0))],
    "slice": lambda xs, a: [slice_(xs[0], a.get("dim", 0), a.get("start"), a.get("end"), a.get("step", 1))],
    "select": lambda xs, a: [select(xs[0], a["dim"], a["index"])],
    "split": lambda xs, a: _pieces(xs[0], _norm(a.get("dim", 0), len(xs[0].shape), "split"),
                                   _split_sizes(xs[0].shape[_norm(a.get("dim", 0), len(xs[0].shape), "split")],
                                                a["split_size_or_sections"])),
    "chunk": lambda xs, a: _chunk(xs[0], a["chunks"], a.get("dim", 0)),
    "unbind": lambda xs, a: [select(xs[0], a.get("dim", 0), i)
                             for i in range(xs[0].shape[_norm(a.get("dim", 0), len(xs[0].shape), "unbind")])],
    "pad": lambda xs, a: [pad(xs[0], a["pad"], a.get("mode", "constant"), a.get("value", 0.0))],
    "contiguous": lambda xs, a: [xs[0]],
    "flip": lambda xs, a: [flip(xs[0], a["dims"])],
    "roll": lambda xs, a: [roll(xs[0], a["shifts"], a.get("dims"))],
    "diag": lambda xs, a: [diag(xs[0], a.get("diagonal", 0))],
    "diagonal": lambda xs, a: [diagonal(xs[0], a.get("offset", 0), _norm(a.get("dim1", 0), len(xs[0].shape), "diagonal"),
                                        _norm(a.get("dim2", 1), len(xs[0].shape), "diagonal"))],
    "tril": lambda xs, a: [triangle(xs[0], a.get("diagonal", 0), True)],
    "triu": lambda xs, a: [triangle(xs[0], a.get("diagonal", 0), False)],
    "unfold": lambda xs, a: [unfold(xs[0], a["dimension"], a["size"], a["step"])],
    "index_select": lambda xs, a: [index_select(xs[0], a["dim"], xs[1])],
    "gather": lambda xs, a: [gather(xs[0], a["dim"], xs[1])],
    "embedding": lambda xs, a: [embedding(xs[0], xs[1])],
}


def apply_op(op: str, attrs: dict, inputs) -> list:
    """The output Layouts of layout op `op` over its inputs' Layouts."""
    fn = VIEW_OPS.get(op)
    if fn is None:
        raise ViewError(f"{op} is not a layout op with a view (where / masked_fill are pointwise over "
                        f"the values)")
    return fn(list(inputs), dict(attrs))


# --- rendering -----------------------------------------------------------------------------------
def _out_coords(stack: ViewStack, idx):
    """Top coordinates for output index variable(s) idx, and the stack to use (a flat index is
    unravelled over the top view with its contiguous dims merged)."""
    top = stack.layers[-1]
    if isinstance(idx, (str, Expr)):     # a flat index: a variable's name, or an expression with bounds
        numel = math.prod(top.shape)
        flat = Var(idx, 0, max(numel - 1, 0)) if isinstance(idx, str) else idx
        if isinstance(top, View):
            top = top.merged()
            return ViewStack(stack.layers[:-1] + (top,)), unravel(flat, top.shape)
        return stack, unravel(flat, top.shape)
    return stack, [Var(n, 0, max(s - 1, 0)) for n, s in zip(idx, top.shape)]


def locate(stack: ViewStack, idx):
    """(offset Expr, tests) of a stack at output index variable(s) idx (tests FALSE: never valid)."""
    stack, coords = _out_coords(stack, idx)
    return _locate(stack, coords)


_PREC = {"add": 1, "mul": 2, "atom": 3}


def render_expr(e: Expr, lang: str = "cuda", names=None) -> str:
    """C (lang "cuda") or Python text of an index expression; `names` maps tensor names of loads."""
    names = names or {}
    dv = "/" if lang == "cuda" else "//"

    def r(x, need):
        if isinstance(x, Num):
            return str(x.v) if x.v >= 0 or need <= 1 else f"({x.v})"
        if isinstance(x, Var):
            return x.name
        if isinstance(x, Load):
            return f"{names.get(x.buf, x.buf)}[{r(x.index, 0)}]"
        if isinstance(x, (Div, Mod)):
            text = f"{r(x.a, 2)} {dv if isinstance(x, Div) else '%'} {x.c}"
            return text if need <= 2 else f"({text})"
        terms = [("-" if k < 0 else "+", r(t, 1) if abs(k) == 1 else f"{r(t, 2)} * {abs(k)}") for t, k in x.terms]
        pos, neg = [p for p in terms if p[0] == "+"], [p for p in terms if p[0] == "-"]
        c = [("-" if x.const < 0 else "+", str(abs(x.const)))] if x.const else []
        # positive terms first, so that a flipped index reads `9 - o`, not `-o + 9`
        parts = pos + neg + c if pos or x.const < 0 else c + neg
        text = ("-" if parts[0][0] == "-" else "") + parts[0][1] + "".join(f" {s} {t}" for s, t in parts[1:])
        return text if need <= 1 else f"({text})"
    return r(e, 0)


def render_tests(tests, lang: str = "cuda", names=None) -> str | None:
    """The condition text; None when always true, 'false' / 'False' when never."""
    if tests is FALSE:
        return "false" if lang == "cuda" else "False"
    parts = []
    for e, lo, hi in tests:
        t = render_expr(e, lang, names)
        if e.lo < lo:
            parts.append(f"{t} >= {lo}")
        if e.hi >= hi:
            parts.append(f"{t} < {hi}")
    return (" && " if lang == "cuda" else " and ").join(parts) or None


def render_read(stack: ViewStack, idx, lang: str = "cuda", names=None) -> tuple:
    """(index text, condition text or None) of one read at output index variable(s) idx: a flat
    index name ("o") or one name per output dim."""
    off, tests = locate(stack, idx)
    return render_expr(off, lang, names), render_tests(tests, lang, names)


def _literal(v: float, lang: str) -> str:
    if lang == "cuda":
        from .cuda import float_literal
        return float_literal(v)
    return repr(float(v)) if math.isfinite(v) else f"float('{v}')"


def render_layout_arms(layout: Layout, idx, extent, ctype: str, local, names=None, load=None, fill=math.nan,
                       literal=None, step: int = 1) -> tuple[list[str], str] | None:
    """render_layout's element with every arm read before the select: (statements, expression). Each
    arm under a test loads at its offset clamped into its source (extent(source) elements, `step` a
    run), so a lane whose element another arm gives reads a valid neighbour and drops it, and the
    select has no branch: a warp whose lanes straddle a cat's arms (RoPE's halves) issues every arm's
    loads at once instead of one arm after the other. local() names each arm's C local of `ctype`.
    None where an arm reads through a gather (its index load itself could be out of range)."""
    if any(isinstance(layer, Indirect) for r in layout.reads for layer in r.stack.layers):
        return None
    names = names or {}
    load = load or (lambda src, i: f"{names.get(src, src)}[{i}]")
    lit = (lambda v: literal(_literal(v, "cuda"))) if literal else (lambda v: _literal(v, "cuda"))
    found = []
    for r in layout.reads:
        off, tests = locate(r.stack, idx)
        if tests is FALSE:
            continue
        found.append((render_tests(tests, "cuda", names), r, off))
        if found[-1][0] is None:
            break
    lets, arms = [], []
    for cond, r, off in found:
        if r.source is None:
            value = lit(r.value)
        elif len(found) == 1:
            value = load(r.source, render_expr(off, "cuda", names))
        else:      # the last arm too: it has no test only because every earlier arm's failed
            at = (f"min(max((index_t)({render_expr(off, 'cuda', names)}), (index_t)0), "
                  f"(index_t){extent(r.source) - step})")
            value = local()
            lets.append(f"const {ctype} {value} = {load(r.source, at)};")
        arms.append((cond, value))
    if not arms or arms[-1][0] is not None:
        arms.append((None, lit(fill)))
    text = arms[-1][1]
    for cond, value in reversed(arms[:-1]):
        text = f"({cond}) ? {value} : {text}"
    return lets, text


def render_layout(layout: Layout, idx, lang: str = "cuda", names=None, load=None, fill=math.nan,
                  literal=None, load_at=None) -> str:
    """The element of `layout` at output index variable(s) idx (or a flat index Expr) as one
    expression: each read's load under its condition, tried in order, `fill` where none is valid (an
    index out of range). load(source, index_text) renders a load (default `name[index]`), or
    load_at(source, offset Expr) from the offset itself; literal(text) wraps a constant's literal (a
    float4 kernel makes four lanes of it)."""
    names = names or {}
    load = load or (lambda src, i: f"{names.get(src, src)}[{i}]")
    lit = (lambda v: literal(_literal(v, lang))) if literal else (lambda v: _literal(v, lang))
    arms = []
    for r in layout.reads:
        off, tests = locate(r.stack, idx)
        if tests is FALSE:
            continue
        value = lit(r.value) if r.source is None else load_at(r.source, off) if load_at else \
            load(r.source, render_expr(off, lang, names))
        cond = render_tests(tests, lang, names)
        arms.append((cond, value))
        if cond is None:
            break
    if not arms or arms[-1][0] is not None:
        arms.append((None, lit(fill)))
    text = arms[-1][1]
    for cond, value in reversed(arms[:-1]):
        text = f"({cond}) ? {value} : {text}" if lang == "cuda" else f"({value} if {cond} else {text})"
    return text
