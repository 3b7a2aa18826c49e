"""complex64 tensors as float32 pairs: a complex value of shape S is held as a real value of shape
S + [2] (real, imaginary), the layout torch.view_as_real gives it. LLaMA's reference rotary embedding
(view_as_complex of q and k, times the complex frequencies, view_as_real) then imports as slices,
multiplications, a subtraction, an addition and a stack: library ops that fuse into one kernel, not
opaque torch calls around complex values no kernel computes.

A view_as_complex is converted so only when every complex value that flows from it is consumed by an
op below (`PAIR_OPS`) and leaves the complex domain through view_as_real or abs; otherwise it stays
opaque. An op of `PAIR_OPS` reading a complex value that is not a pair (from an opaque op) is refused,
and so is any library op reading a complex value (graph.py): it runs through torch, as an opaque op.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .aten_map import Unmapped

COMPLEX_DTYPES = (torch.complex64,)


def is_complex(n) -> bool:
    val = n.meta.get("val") if isinstance(n, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


def _pair(cx, x) -> str:
    if not isinstance(x, fx.Node) or not is_complex(x):
        raise Unmapped("a complex op of a value that is not complex")
    vid = cx.env.get(x)
    if vid not in cx.pairs:
        raise Unmapped(f"{x.name} is a complex value held by torch (an opaque op), not a pair")
    return vid


def _part(cx, pair: str, k: int) -> str:
    """The real (k = 0) or imaginary (k = 1) part of a pair, shape S."""
    shape = list(cx.spec(pair).shape)
    piece = cx.emit("slice", [pair], {"dim": len(shape) - 1, "start": k, "end": k + 1, "step": 1})
    return cx.emit("reshape", [piece], {"shape": shape[:-1]})


def _join(cx, re: str, im: str) -> str:
    """A pair from its parts (broadcast to one shape first)."""
    parts = []
    for v in (re, im):
        shape = list(cx.spec(v).shape)
        parts.append(cx.emit("reshape", [v], {"shape": shape + [1]}))
    if cx.spec(parts[0]).shape != cx.spec(parts[1]).shape:
        raise Unmapped("the parts of a complex product have different shapes")
    return cx.emit("cat", parts, {"dim": len(cx.spec(parts[0]).shape) - 1})


def _view_as_complex(cx, n, a):
    x = a["self"]
    spec = cx.spec(x)
    if spec.dtype != "float32" or not spec.shape or spec.shape[-1] != 2:
        raise Unmapped("view_as_complex of a tensor that is not float32 pairs")
    return cx.alias(x)


def _view_as_real(cx, n, a):
    return _pair(cx, a["self"])


def _viewed(cx, n, a):
    """A reshape-like op of a complex value: the same on the pairs, the pair dim kept last."""
    pair = _pair(cx, a["self"])
    return cx.emit("reshape", [pair], {"shape": list(cx.meta_shape(n)) + [2]})


def _expand(cx, n, a):
    pair = _pair(cx, a["self"])
    return cx.emit("expand", [pair], {"size": list(cx.meta_shape(n)) + [2]})


def _mul(cx, n, a):
    """(a + bi)(c + di) = (ac - bd) + (ad + bc)i; a real factor scales both parts."""
    x, y = a["self"], a["other"]
    if not (isinstance(x, fx.Node) and is_complex(x)):
        x, y = y, x
    px = _pair(cx, x)
    if isinstance(y, fx.Node) and is_complex(y):
        py = _pair(cx, y)
        xr, xi, yr, yi = _part(cx, px, 0), _part(cx, px, 1), _part(cx, py, 0), _part(cx, py, 1)
        re = cx.emit("sub", [cx.emit("mul", [xr, yr]), cx.emit("mul", [xi, yi])])
        im = cx.emit("add", [cx.emit("mul", [xr, yi]), cx.emit("mul", [xi, yr])])
        return _join(cx, re, im)
    if isinstance(y, fx.Node):
        if cx.spec(y).dtype != "float32":
            raise Unmapped("a complex value times a tensor that is not float32")
        shape = list(cx.spec(y).shape)
        return cx.emit("mul", [px, cx.emit("reshape", [y], {"shape": shape + [1]})])
    if isinstance(y, complex):
        raise Unmapped("a complex value times a complex number")
    return cx.emit("mul_scalar", [px], {"value": float(y)})


def _add_sub(cx, n, a):
    """Complex sums part by part (both operands complex)."""
    x, y = a["self"], a["other"]
    if not all(isinstance(v, fx.Node) and is_complex(v) for v in (x, y)) or float(a.get("alpha", 1)) != 1:
        raise Unmapped("a complex sum of a value that is not complex")
    op = "add" if str(n.target).startswith("aten.add") else "sub"
    return cx.emit(op, [_pair(cx, x), _pair(cx, y)])


def _clone(cx, n, a):
    return _pair(cx, a["self"])


def _abs(cx, n, a):
    """|a + bi| = hypot(a, b), as torch computes it (no overflow of a * a)."""
    pair = _pair(cx, a["self"])
    return cx.emit("hypot", [_part(cx, pair, 0), _part(cx, pair, 1)])


PAIR_OPS = {
    "view_as_complex.default": _view_as_complex,
    "view_as_real.default": _view_as_real,
    "view.default": _viewed, "_unsafe_view.default": _viewed, "reshape.default": _viewed,
    "unsqueeze.default": _viewed, "squeeze.dim": _viewed, "squeeze.default": _viewed,
    "expand.default": _expand,
    "mul.Tensor": _mul, "mul.Scalar": _mul,
    "add.Tensor": _add_sub, "sub.Tensor": _add_sub,
    "clone.default": _clone, "alias.default": _clone,
    "abs.default": _abs,
}
REAL_RESULTS = ("view_as_real.default", "abs.default")     # the ops that leave the complex domain


def _name(n: fx.Node) -> str:
    parts = str(n.target).split(".")
    return ".".join(parts[1:]) if parts[0] == "aten" else str(n.target)


def handles(cx, n: fx.Node) -> bool:
    """Whether n is converted on pairs: a view_as_complex whose complex values all stay within
    PAIR_OPS up to a view_as_real, or an op reading or making a complex pair."""
    name = _name(n)
    if name == "view_as_complex.default":
        return _stays_paired(n)
    reads = [x for x in n.all_input_nodes if is_complex(x)]
    return bool(reads) and all(cx.env.get(x) in cx.pairs for x in reads) and name in PAIR_OPS


def _stays_paired(start: fx.Node) -> bool:
    todo, seen = [start], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for u in n.users:
            if u.op == "output" or _name(u) not in PAIR_OPS:
                return False
            if is_complex(u):
                todo.append(u)
            elif _name(u) not in REAL_RESULTS:
                return False
    return True


def convert(cx, n: fx.Node, bound: dict) -> str:
    """n's value: a pair for a complex result (checked against torch's shape with the pair dim),
    else the real tensor view_as_real gives."""
    vid = PAIR_OPS[_name(n)](cx, n, bound)
    val = n.meta["val"]
    want = tuple(val.shape) + ((2,) if val.is_complex() else ())
    if tuple(cx.spec(vid).shape) != want:
        raise Unmapped(f"the pairs have shape {list(cx.spec(vid).shape)}, torch {list(want)}")
    if val.is_complex():
        if val.dtype not in COMPLEX_DTYPES:
            raise Unmapped(f"{val.dtype} (complex64 only)")
        cx.pairs.add(vid)
    return vid
