"""A max or min over a monotone chain folds the raw value; the chain runs once per row (issue #14).

Whisper's log-mel takes the max of log(clamp(x, 1e-10)) / ln 10 over each clip. Since the chain is
non-decreasing, max_i f(x_i) == f(max_i x_i): the row graph folds x itself and applies clamp, log and
the scale to the row's max alone, so the reduction's pass over the row computes no logf. A
non-increasing chain swaps the state: max_i f(x_i) == f(min_i x_i).

This is exact, not approximate, when every op of the chain, *as the kernel computes it*, is
monotone on the floats it can see and maps NaN to NaN and nothing else to NaN. The reduction returns
one of its elements (max_nan / min_nan never round), so f(max x) is one of the f(x_i), and none is
larger; a NaN anywhere gives NaN both ways (torch's max propagates it). The only freedom left is the
sign of a zero among elements that compare equal, which the reduction order already decides.

Which ops qualify, and why:
  clamp, max_scalar, min_scalar, relu, relu6, hardtanh   max_nan / min_nan: compare and select, exact;
  add_scalar, sub_scalar, rsub_scalar, mul_scalar (c != 0), neg, div_scalar
                 one correctly rounded IEEE operation with a finite constant (round-to-nearest is
                 monotone; a finite constant never makes inf - inf or 0 * inf). div_scalar is the
                 multiply by torch's reciprocal (cuda.div_reciprocal), so its reciprocal must be
                 finite and non-zero;
  sqrt           sqrt.rn, correctly rounded, on values known >= 0;
  log, log2      on values known >= 0: CUDA's logf / log2f (libdevice, no fast math) are not
                 correctly rounded, but they are a straight line of fma.rn / mul.rn / integer ops;
                 tests/ptx_float.py translates NVRTC's own PTX of them to C and checks every
                 non-negative float32 (2^31 inputs) on the CPU: non-decreasing, NaN for NaN; the GPU
                 test checks the device the same way.
  identity, dropout (eval).
Not: exp, exp2, sigmoid, tanh (expf ends in ex2.approx, the SFU, whose rounding is not documented
and cannot be emulated here: its monotonicity is unproven), abs, square (not monotone), log1p, pow.

"Known >= 0" comes from a float32 interval [lo, hi] (or NaN) carried forward through the chain from
what produces its input (abs, square, exp, sigmoid, sqrt give >= 0; anything else is unbounded),
each op mapping the interval's ends with the same float32 operation the kernel does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import Node, Program
from .cuda import div_reciprocal

F32 = np.float32
_INF = F32(np.inf)
# what an op's output is known to lie in (or be NaN), whatever its input: the start of a chain
_RANGE = {"abs": (0.0, math.inf), "square": (0.0, math.inf), "exp": (0.0, math.inf), "exp2": (0.0, math.inf),
          "sigmoid": (0.0, 1.0), "sqrt": (0.0, math.inf), "relu": (0.0, math.inf), "relu6": (0.0, 6.0)}
_NONNEG = ("log", "log2", "sqrt")     # monotone only on values >= 0 (NaN below)


@dataclass
class Hoist:
    base: str                 # the row graph key the reduction folds instead
    nodes: list[Node]         # the chain from base to the reduction's input, applied once per row
    decreasing: bool          # an odd number of non-increasing ops: max <-> min

    def state(self, state: str) -> str:
        return {"max": "min", "min": "max"}[state] if self.decreasing else state

    def describe(self) -> str:
        return ", ".join(n.op for n in self.nodes)


def _finite(v) -> F32 | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    c = F32(v)
    return c if np.isfinite(c) else None


def _bound(v, default):
    """A clamp bound as the kernel's float32 literal; None for a NaN or a non-number."""
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return None
    with np.errstate(all="ignore"):
        return F32(v)


def _clamp(lo, hi):
    """max_nan(x, lo) then min_nan(., hi) on an interval end; None for a bound that is not a number."""
    lo, hi = _bound(lo, -_INF), _bound(hi, _INF)
    if lo is None or hi is None:
        return None
    return lambda x: min(max(x, lo), hi)


def _widened(f):
    """A libm-style function (at most 1 ulp from exact, as CUDA's logf and log2f) on interval ends:
    the double result rounded to float32, then two ulps outward."""
    def lower(x):
        if x == 0:
            return -_INF
        if np.isinf(x):
            return x
        v = F32(f(float(x)))
        return np.nextafter(np.nextafter(v, -_INF), -_INF)

    def upper(x):
        if x == 0:
            return -_INF
        if np.isinf(x):
            return x
        v = F32(f(float(x)))
        return np.nextafter(np.nextafter(v, _INF), _INF)
    return lower, upper


def classify(node: Node):
    """(direction +1 / -1, lower end of the interval map, upper end) of an op the chain may hold, or
    None. The maps take float32 interval ends and return the kernel's own float32 results."""
    op, a = node.op, node.attrs
    up = 1
    if op in ("identity", "dropout"):
        f = lambda x: x            # noqa: E731
    elif op == "clamp":
        f = _clamp(a.get("min"), a.get("max"))
    elif op == "hardtanh":
        f = _clamp(a.get("min_val"), a.get("max_val"))
    elif op == "relu":
        f = _clamp(0.0, None)
    elif op == "relu6":
        f = _clamp(0.0, 6.0)
    elif op == "max_scalar":
        f = _clamp(a.get("value"), None)
    elif op == "min_scalar":
        f = _clamp(None, a.get("value"))
    elif op in ("add_scalar", "sub_scalar", "rsub_scalar", "mul_scalar", "div_scalar"):
        c = _finite(a.get("value"))
        if c is None:
            return None
        if op == "div_scalar":
            c = div_reciprocal(a["value"])
            op = "mul_scalar"
            if not np.isfinite(c):
                return None
        if op == "mul_scalar" and c == 0:
            return None
        f = {"add_scalar": lambda x: x + c, "sub_scalar": lambda x: x - c, "rsub_scalar": lambda x: c - x,
             "mul_scalar": lambda x: x * c}[op]
        up = -1 if op == "rsub_scalar" or (op == "mul_scalar" and c < 0) else 1
    elif op == "neg":
        f, up = (lambda x: -x), -1
    elif op == "sqrt":
        f = lambda x: np.sqrt(x)   # noqa: E731
    elif op in ("log", "log2"):
        lower, upper = _widened(math.log if op == "log" else math.log2)
        return 1, lower, upper
    else:
        return None
    if f is None:
        return None
    return up, f, f


def _bounds(op_class, lo, hi):
    up, f_lo, f_hi = op_class
    with np.errstate(all="ignore"):
        return (F32(f_lo(lo)), F32(f_hi(hi))) if up > 0 else (F32(f_lo(hi)), F32(f_hi(lo)))


def peel(program: Program, defs: dict, key: str) -> Hoist | None:
    """The longest monotone chain that ends at row graph key `key` (a per-element value), whose ops are
    float32 and see only the values their monotonicity holds for; None when there is none."""
    vals, chain = program.values, []
    k = key
    while True:
        d = defs[k]
        if d.node is None or len(d.deps) != 1 or defs[d.deps[0]].space != d.space:
            break
        node = program.nodes[d.node]
        present = [v for v in node.inputs if v is not None]
        if len(present) != 1 or classify(node) is None or \
                any(vals[v].dtype != "float32" for v in (present[0], node.outputs[0])):
            break
        chain.append((k, node))
        k = d.deps[0]
    chain.reverse()
    if not chain:
        return None
    first = defs[k]
    lo, hi = _RANGE.get(program.nodes[first.node].op, (-math.inf, math.inf)) if first.node else (-math.inf, math.inf)
    lo, hi, start = F32(lo), F32(hi), 0
    for i, (_, node) in enumerate(chain):
        if node.op in _NONNEG and not lo >= 0:
            start = i + 1          # not provably monotone here: the chain starts after it
            lo, hi = (F32(0.0), _INF) if node.op == "sqrt" else (-_INF, _INF)
            continue
        lo, hi = _bounds(classify(node), lo, hi)
    chain = chain[start:]
    if not chain:
        return None
    base = defs[chain[0][0]].deps[0]
    nodes = [n for _, n in chain]
    down = sum(1 for n in nodes if classify(n)[0] < 0) % 2 == 1
    return Hoist(base, nodes, down)
