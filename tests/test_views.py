"""Views (agent_core/codegen/views.py): every layout op of the op library, and random chains of 2-4 of
them, rendered as an index expression with a validity condition, read exactly the element torch puts
there. Inputs are torch.arange (plus an offset per input), so each value names its own source element;
masked elements must equal the pad value. Both renderings are checked: the Python one by eval, the
CUDA one by a small C-semantics evaluator (truncating division, short-circuit &&, ?:) that also fails
on any load outside its buffer, and every case's CUDA expression compiles with NVRTC for sm_90."""
from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_core.codegen import views as V
from agent_core.codegen.views import Layout, ViewError, apply_op, render_layout, render_read
from agent_core.ops.registry import get_op

PAD = -7.5
OFFSET = 1000.0          # input k holds arange(numel) + k * OFFSET


# --- a small evaluator of the CUDA rendering, with C's integer semantics ---------------------------
_TOKEN = re.compile(r"\s*(?:(\d+\.\d*(?:e[-+]?\d+)?f|\d+)|([A-Za-z_]\w*)|(&&|\|\||>=|<=|==|!=|[-+*/%<>?:()\[\],]))")
_BINARY = {"||": 2, "&&": 3, "==": 4, "!=": 4, "<": 5, "<=": 5, ">": 5, ">=": 5, "+": 6, "-": 6,
           "*": 7, "/": 7, "%": 7}


def _tokens(text):
    pos, out = 0, []
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        assert m, f"cannot read C at {text[pos:]!r}"
        num, ident, op = m.groups()
        out.append(("num", float(num[:-1]) if num.endswith("f") else int(num)) if num else
                   ("id", ident) if ident else ("op", op))
        pos = m.end()
    return out


def parse_c(text):
    toks, i = _tokens(text), [0]

    def peek():
        return toks[i[0]] if i[0] < len(toks) else ("end", None)

    def take(want=None):
        t = peek()
        assert want is None or t == ("op", want), f"expected {want} at {t} in {text}"
        i[0] += 1
        return t

    def atom():
        kind, v = take()
        if (kind, v) == ("op", "(") and peek() == ("id", "index_t"):     # a cast to the index type
            take()
            take(")")
            e = atom()
        elif (kind, v) == ("op", "("):
            e = expr(0)
            take(")")
        elif kind == "id" and v in ("min", "max") and peek() == ("op", "("):
            take()
            a = expr(0)
            take(",")
            e = (v, a, expr(0))
            take(")")
        elif (kind, v) == ("op", "-"):
            e = ("neg", atom())
        elif kind in ("num", "id"):
            e = (kind, v)
        else:
            raise AssertionError(f"unexpected {v} in {text}")
        while peek() == ("op", "["):
            take()
            e = ("load", e, expr(0))
            take("]")
        return e

    def expr(min_prec):
        left = atom()
        while True:
            kind, v = peek()
            if kind == "op" and v == "?" and min_prec <= 1:
                take()
                a = expr(1)
                take(":")
                left = ("?", left, a, expr(1))
            elif kind == "op" and v in _BINARY and _BINARY[v] >= max(min_prec, 2):
                take()
                left = (v, left, expr(_BINARY[v] + 1))
            else:
                return left
    e = expr(0)
    assert peek()[0] == "end", f"trailing text in {text}"
    return e


def _cdiv(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return a / b
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def eval_c(e, env):
    kind = e[0]
    if kind == "num":
        return e[1]
    if kind == "id":
        return {"NAN": math.nan, "INFINITY": math.inf, "true": 1, "false": 0}.get(e[1], env.get(e[1]))
    if kind == "neg":
        return -eval_c(e[1], env)
    if kind == "load":
        buf, k = env[e[1][1]], eval_c(e[2], env)
        assert isinstance(k, int) and 0 <= k < len(buf), f"load {e[1][1]}[{k}] outside its {len(buf)} elements"
        return buf[k]
    if kind == "?":
        return eval_c(e[2], env) if eval_c(e[1], env) else eval_c(e[3], env)
    if kind == "&&":
        return int(bool(eval_c(e[1], env)) and bool(eval_c(e[2], env)))
    if kind == "||":
        return int(bool(eval_c(e[1], env)) or bool(eval_c(e[2], env)))
    a, b = eval_c(e[1], env), eval_c(e[2], env)
    if kind == "/":
        return _cdiv(a, b)
    if kind == "%":
        return a - b * _cdiv(a, b)
    return {"+": a + b, "-": a - b, "*": a * b, "<": int(a < b), "<=": int(a <= b), ">": int(a > b),
            ">=": int(a >= b), "==": int(a == b), "!=": int(a != b), "min": min(a, b), "max": max(a, b)}[kind]


def test_c_evaluator_truncates_like_c_and_catches_bad_loads():
    assert eval_c(parse_c("-7 / 2"), {}) == -3 and eval_c(parse_c("-7 % 2"), {}) == -1
    assert eval_c(parse_c("(1 < 2) ? x[1] : x[9]"), {"x": [5, 6]}) == 6
    assert eval_c(parse_c("x[min(max((index_t)(0 - 3), (index_t)0), (index_t)1)]"), {"x": [5, 6]}) == 5
    with pytest.raises(AssertionError, match="outside"):
        eval_c(parse_c("x[2]"), {"x": [5, 6]})


# --- checking a layout against torch -------------------------------------------------------------
def _inputs(specs):
    """specs: shapes (float inputs) or ("index", shape, high) -> (tensors, names, Layouts)."""
    tensors, names, layouts = [], [], []
    for k, s in enumerate(specs):
        if isinstance(s, tuple) and s and s[0] == "index":
            g = torch.Generator().manual_seed(k)
            t = torch.randint(0, s[2], s[1], generator=g)
            name = f"i{k}"
        else:
            t = torch.arange(math.prod(s), dtype=torch.float32).reshape(s) + k * OFFSET
            name = "xyzwuv"[k]
        tensors.append(t)
        names.append(name)
        layouts.append(Layout.of(name, t.shape))
    return tensors, names, layouts


def check(layout: Layout, want: torch.Tensor, buffers: dict):
    """The layout's Python and CUDA renderings give torch's result at every output element."""
    assert layout.shape == tuple(want.shape)
    want = want.reshape(-1).tolist()
    env = {k: v.reshape(-1).tolist() for k, v in buffers.items()}
    py = render_layout(layout, "o", lang="python")
    c = parse_c(render_layout(layout, "o", lang="cuda"))
    code = compile(py, "<view>", "eval")
    for o, w in enumerate(want):
        got_py = eval(code, {}, {**env, "o": o})  # noqa: S307 (our own rendering)
        got_c = eval_c(c, {**env, "o": o})
        assert got_py == w and got_c == w, (o, got_py, got_c, w, py)


def _ref(op):
    if op == "unfold":
        return lambda t, a: t[0].unfold(a["dimension"], a["size"], a["step"])
    opdef = get_op(op)
    return lambda t, a: opdef.reference(t, opdef.normalize_attrs(a))


def run_case(op, specs, attrs):
    tensors, names, layouts = _inputs(specs)
    outs = apply_op(op, attrs, layouts)
    want = _ref(op)(tensors, attrs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(outs) == len(want)
    for lay, w in zip(outs, want):
        check(lay, w, dict(zip(names, tensors)))
    return outs, names, tensors


SL = {"dim": 0, "start": None, "end": None, "step": 1}
CASES = [
    ("reshape", [(2, 3, 4)], {"shape": [4, -1]}),
    ("flatten", [(2, 3, 4, 5)], {"start_dim": 1, "end_dim": 2}),
    ("flatten", [()], {"start_dim": 0, "end_dim": -1}),
    ("unflatten", [(2, 12)], {"dim": 1, "sizes": [3, -1]}),
    ("squeeze", [(2, 1, 3, 1)], {"dim": [1, 2]}),
    ("squeeze", [(1, 3, 1)], {"dim": None}),
    ("unsqueeze", [(2, 3)], {"dim": -1}),
    ("permute", [(2, 3, 4)], {"dims": [2, 0, 1]}),
    ("transpose", [(2, 3, 4)], {"dim0": 0, "dim1": -1}),
    ("expand", [(3, 1)], {"size": [2, -1, 4]}),
    ("repeat", [(2, 3)], {"repeats": [2, 1, 2]}),
    ("cat", [(2, 3), (2, 1), (2, 4)], {"dim": 1}),
    ("cat", [(2, 3), (1, 3)], {"dim": -2}),
    ("stack", [(2, 3), (2, 3)], {"dim": 1}),
    ("slice", [(4, 10)], {**SL, "dim": 1, "start": 1, "end": -2, "step": 3}),
    ("slice", [(4, 10)], {**SL, "dim": 1, "start": -7, "end": 99, "step": 2}),
    ("slice", [(5, 3)], {**SL, "start": 1, "end": 4}),
    ("select", [(3, 4, 5)], {"dim": 1, "index": -1}),
    ("split", [(7, 2)], {"split_size_or_sections": [3], "dim": 0}),
    ("split", [(2, 7)], {"split_size_or_sections": [1, 4, 2], "dim": 1}),
    ("chunk", [(2, 7)], {"chunks": 3, "dim": 1}),
    ("unbind", [(3, 2)], {"dim": 1}),
    ("pad", [(2, 3, 4)], {"pad": [1, 2, 0, -1], "mode": "constant", "value": PAD}),
    ("pad", [(2, 3, 4)], {"pad": [2, 1], "mode": "reflect", "value": 0.0}),
    ("pad", [(3, 4)], {"pad": [-1, 2], "mode": "reflect", "value": 0.0}),
    ("pad", [(2, 3, 4)], {"pad": [3, 1], "mode": "replicate", "value": 0.0}),
    ("pad", [(2, 3, 4, 5)], {"pad": [1, 2, 2, 0], "mode": "replicate", "value": 0.0}),
    ("pad", [(2, 3, 4)], {"pad": [4, 2], "mode": "circular", "value": 0.0}),
    ("pad", [(3, 4)], {"pad": [-1, 2], "mode": "circular", "value": 0.0}),
    ("contiguous", [(2, 3)], {}),
    ("flip", [(2, 3, 4)], {"dims": [0, 2]}),
    ("roll", [(3, 4)], {"shifts": [1, -1], "dims": [0, 1]}),
    ("roll", [(3, 4)], {"shifts": [5], "dims": None}),
    ("diag", [(4,)], {"diagonal": 0}),
    ("diag", [(3,)], {"diagonal": 2}),
    ("diag", [(3,)], {"diagonal": -1}),
    ("diag", [(3, 5)], {"diagonal": 1}),
    ("diag", [(4, 3)], {"diagonal": -2}),
    ("diagonal", [(2, 4, 5)], {"offset": 1, "dim1": 1, "dim2": 2}),
    ("diagonal", [(3, 2, 4, 3)], {"offset": -1, "dim1": -1, "dim2": 0}),
    ("tril", [(4, 5)], {"diagonal": 0}),
    ("tril", [(2, 5, 3)], {"diagonal": -1}),
    ("triu", [(3, 4, 4)], {"diagonal": 1}),
    ("triu", [(5, 3)], {"diagonal": -2}),
    ("unfold", [(2, 7)], {"dimension": 1, "size": 3, "step": 2}),
    ("index_select", [(3, 5), ("index", (4,), 5)], {"dim": 1}),
    ("index_select", [(3, 5), ("index", (), 3)], {"dim": 0}),
    ("gather", [(3, 5), ("index", (3, 2), 5)], {"dim": 1}),
    ("gather", [(4, 3), ("index", (2, 3), 4)], {"dim": 0}),
    ("embedding", [("index", (2, 3), 10), (10, 4)], {}),
]


@pytest.mark.parametrize("op,specs,attrs", CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)])
def test_each_layout_op_reads_what_torch_reads(op, specs, attrs):
    run_case(op, specs, attrs)


def test_every_view_op_of_the_library_has_a_case():
    from agent_core.ops.registry import all_ops
    library = {o.name for o in all_ops() if o.category == "layout"}
    covered = {c[0] for c in CASES}
    # triu / tril are a Triangle layer: a validity test on (row, col), 0 where it fails
    assert library - covered == set()
    assert covered - library == {"unfold"}      # Tensor.unfold, for when the library has it


def test_where_and_masked_fill_are_not_views():
    x = Layout.of("x", (2, 3))
    for op in ("where", "masked_fill"):
        with pytest.raises(ViewError, match="pointwise"):
            apply_op(op, {}, [x])


def test_chained_pads_keep_each_fill_value():
    tensors, names, (x,) = _inputs([(2, 3)])
    inner = apply_op("pad", {"pad": [1, 1], "mode": "constant", "value": 0.5}, [x])[0]
    outer = apply_op("pad", {"pad": [1, 0, 2, 1], "mode": "constant", "value": PAD}, [inner])[0]
    import torch.nn.functional as F
    want = F.pad(F.pad(tensors[0], [1, 1], value=0.5), [1, 0, 2, 1], value=PAD)
    check(outer, want, dict(zip(names, tensors)))


def test_refusals_name_the_op():
    x = Layout.of("x", (2, 3))
    with pytest.raises(ViewError, match="permute"):
        apply_op("permute", {"dims": [0, 0]}, [x])
    with pytest.raises(ViewError, match="reshape"):
        apply_op("reshape", {"shape": [4, -1]}, [x])
    with pytest.raises(ViewError, match="select: index 3"):
        apply_op("select", {"dim": 0, "index": 3}, [x])
    cat = apply_op("cat", {"dim": 0}, [Layout.of("i", (2,)), Layout.of("j", (3,))])[0]
    with pytest.raises(ViewError, match="index must be one tensor"):
        apply_op("index_select", {"dim": 1}, [x, cat])


# --- the expressions are as simple as they should be ----------------------------------------------
def _expr(layout, idx="o"):
    (r,) = layout.reads
    return render_read(r.stack, idx)


def test_permute_of_a_contiguous_tensor_is_one_term_per_dim():
    x = Layout.of("x", (2, 3, 4))
    assert _expr(V.permute(x, [0, 2, 1])) == ("o / 12 * 12 + o / 3 % 4 + o % 3 * 4", None)
    assert _expr(V.permute(x, [0, 2, 1]), ["i", "j", "k"]) == ("i * 12 + j + k * 4", None)


def test_broadcast_drops_stride_zero_terms():
    assert _expr(V.expand(Layout.of("b", (4, 1)), [3, 4, 5])) == ("o / 5 % 4", None)
    assert _expr(V.expand(Layout.of("b", (1, 4)), [6, 4])) == ("o % 4", None)
    assert _expr(V.expand(Layout.of("b", (1, 1)), [6, 4])) == ("0", None)


def test_contiguous_dims_merge_and_div_mod_pairs_recombine():
    x = Layout.of("x", (2, 3, 4, 5))
    # dims 0 and 1 stay neighbours: one term for both
    assert _expr(V.permute(x, [0, 1, 3, 2])) == ("o / 20 * 20 + o / 4 % 5 + o % 4 * 5", None)
    # a contiguous slice of the outer dim is an offset; reshape of a contiguous view is free
    assert _expr(V.slice_(Layout.of("x", (4, 3, 4)), 0, 1)) == ("o + 12", None)
    assert _expr(V.reshape(V.permute(Layout.of("x", (6, 4)), [1, 0]), [2, 2, 6])) == ("o / 6 + o % 6 * 4", None)
    # a permute undone by the inverse permute is the identity
    assert _expr(V.permute(V.permute(x, [2, 0, 3, 1]), [1, 3, 0, 2])) == ("o", None)
    # a flip is a subtraction, a pad a range test
    assert _expr(V.flip(Layout.of("x", (10,)), [0])) == ("9 - o", None)
    pad = V.pad(Layout.of("x", (3, 4)), [1, 2], "constant", 0.0)
    assert render_layout(pad, "o") == "(o % 7 >= 1 && o % 7 < 5) ? x[o / 7 * 4 + o % 7 - 1] : 0.0f"


def test_cat_tests_only_the_arms_before_the_last():
    a, b = Layout.of("a", (2, 3)), Layout.of("b", (2, 5))
    assert render_layout(V.cat([a, b], 1), "o") == "(o % 8 < 3) ? a[o / 8 * 3 + o % 8] : b[o / 8 * 5 + o % 8 - 3]"
    assert render_layout(V.cat([a, b], 1), "o", lang="python") == \
        "(a[o // 8 * 3 + o % 8] if o % 8 < 3 else b[o // 8 * 5 + o % 8 - 3])"


def test_gather_loads_the_index():
    emb = V.embedding(Layout.of("ids", (2, 3)), Layout.of("w", (10, 4)))
    assert render_layout(emb, "o") == "(ids[o / 4] >= 0 && ids[o / 4] < 10) ? w[ids[o / 4] * 4 + o % 4] : NAN"


# --- random chains -------------------------------------------------------------------------------
def _factor(draw, n):
    """A random shape with n elements (sizes >= 1), one entry maybe -1."""
    out = []
    while n > 1:
        divs = [d for d in range(2, n + 1) if n % d == 0]
        d = draw(st.sampled_from(divs))
        out.append(d)
        n //= d
    out = draw(st.permutations(out)) if out else out
    out = list(out)
    for _ in range(draw(st.integers(0, 2))):
        out.insert(draw(st.integers(0, len(out))), 1)
    if out and draw(st.booleans()):
        out[draw(st.integers(0, len(out) - 1))] = -1
    return out


def _step(draw, shape, fresh):
    """One random layout op valid for `shape`: (op, attrs, extra input specs, output index)."""
    r = len(shape)
    ops = ["reshape", "permute", "transpose", "expand", "slice", "select", "flip", "pad", "roll",
           "squeeze", "unsqueeze", "flatten", "unflatten", "repeat", "cat", "stack", "split", "unfold",
           "index_select", "gather", "pad_mode"]
    if r in (1, 2):
        ops.append("diag")
    if r == 2:
        ops.append("embedding")
    op = draw(st.sampled_from(ops if r else ["reshape", "unsqueeze", "expand", "flatten"]))
    dim = (lambda: draw(st.integers(-r, r - 1))) if r else (lambda: 0)
    n = math.prod(shape)
    if op == "reshape":
        return op, {"shape": _factor(draw, n)}, [], 0
    if op == "permute":
        return op, {"dims": list(draw(st.permutations(range(r))))}, [], 0
    if op == "transpose":
        return op, {"dim0": dim(), "dim1": dim()}, [], 0
    if op == "expand":
        size = [draw(st.integers(1, 3)) if s == 1 else draw(st.sampled_from([s, -1])) for s in shape]
        lead = draw(st.integers(0 if r else 1, 1))
        return op, {"size": [draw(st.integers(1, 2))] * lead + size}, [], 0
    if op == "slice":
        d = dim()
        m = shape[d]
        start = draw(st.one_of(st.none(), st.integers(-m - 1, m - 1)))
        end = draw(st.one_of(st.none(), st.integers(-m, m + 1)))
        step = draw(st.integers(1, 3))
        if not len(range(m)[slice(start, end, step)]):
            start, end = None, None
        return op, {"dim": d, "start": start, "end": end, "step": step}, [], 0
    if op == "select":
        d = dim()
        return op, {"dim": d, "index": draw(st.integers(-shape[d], shape[d] - 1))}, [], 0
    if op == "flip":
        dims = draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
        return op, {"dims": dims}, [], 0
    if op == "pad":
        pads = []
        for i in range(draw(st.integers(1, r))):
            s = shape[r - 1 - i]
            lo = draw(st.integers(max(-1, 1 - s), 2))
            pads += [lo, draw(st.integers(max(-1, 1 - s - lo), 2))]
        return op, {"pad": pads, "mode": "constant", "value": PAD}, [], 0
    if op == "pad_mode":
        mode = draw(st.sampled_from(["reflect", "replicate", "circular"]))
        if r not in (2, 3) or (mode == "reflect" and shape[-1] < 2):
            return "flip", {"dims": [0]}, [], 0
        top = {"reflect": shape[-1] - 1, "replicate": 3, "circular": shape[-1]}[mode]
        return "pad", {"pad": [draw(st.integers(0, top)), draw(st.integers(0, top))], "mode": mode,
                       "value": 0.0}, [], 0
    if op == "roll":
        if draw(st.booleans()):
            return op, {"shifts": [draw(st.integers(-5, 5))], "dims": None}, [], 0
        dims = draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r))
        return op, {"shifts": [draw(st.integers(-5, 5)) for _ in dims], "dims": dims}, [], 0
    if op == "squeeze":
        return op, {"dim": draw(st.one_of(st.none(), st.lists(st.integers(0, r - 1), max_size=r, unique=True)))}, [], 0
    if op == "unsqueeze":
        return op, {"dim": draw(st.integers(-r - 1, r))}, [], 0
    if op == "flatten":
        if not r:
            return op, {"start_dim": 0, "end_dim": -1}, [], 0
        a, b = sorted([draw(st.integers(0, r - 1)), draw(st.integers(0, r - 1))])
        return op, {"start_dim": a, "end_dim": b}, [], 0
    if op == "unflatten":
        d = dim()
        return op, {"dim": d, "sizes": _factor(draw, shape[d]) or [1]}, [], 0
    if op == "repeat":
        return op, {"repeats": [draw(st.integers(1, 2)) for _ in range(r + draw(st.integers(0, 1)))]}, [], 0
    if op in ("cat", "stack"):
        d = dim() if op == "cat" else draw(st.integers(-r - 1, r))
        other = list(shape)
        if op == "cat":
            other[d] = draw(st.integers(1, 3))
        return op, {"dim": d}, [tuple(other)], 0
    if op == "split":
        d = dim()
        size = draw(st.integers(1, max(1, shape[d])))
        pieces = -(-shape[d] // size)
        return op, {"split_size_or_sections": [size], "dim": d}, [], draw(st.integers(0, pieces - 1))
    if op == "unfold":
        d = dim()
        return op, {"dimension": d, "size": draw(st.integers(1, shape[d])), "step": draw(st.integers(1, 2))}, [], 0
    if op == "index_select":
        d = dim()
        return op, {"dim": d}, [("index", (draw(st.integers(1, 4)),), shape[d])], 0
    if op == "gather":
        d = dim()
        ishape = tuple(draw(st.integers(1, 4)) if k == d % r else draw(st.integers(1, s)) for k, s in enumerate(shape))
        return op, {"dim": d}, [("index", ishape, shape[d])], 0
    if op == "diag":
        return op, {"diagonal": draw(st.integers(-2, 2))}, [], 0
    if op == "embedding":
        return op, {}, [("index", (draw(st.integers(1, 3)),), shape[0])], 0
    raise AssertionError(op)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_chains_read_what_torch_reads(data):
    draw = data.draw
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=4)))
    base = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    buffers, cur, lay, steps = {"x": base}, base, Layout.of("x", shape), []
    for k in range(draw(st.integers(2, 4))):
        op, attrs, extra, pick = _step(draw, tuple(cur.shape), k)
        ts, ls = [cur], [lay]
        for j, spec in enumerate(extra):
            name = f"b{k}_{j}"
            if spec[0] == "index":
                g = torch.Generator().manual_seed(k * 7 + j)
                t = torch.randint(0, spec[2], spec[1], generator=g)
            else:
                t = torch.arange(math.prod(spec), dtype=torch.float32).reshape(spec) + (k + 1) * OFFSET
            buffers[name] = t
            ts.append(t)
            ls.append(Layout.of(name, spec[1] if spec[0] == "index" else spec))
        if op == "embedding":
            ts, ls = ts[::-1], ls[::-1]
        steps.append((op, attrs))
        want = _ref(op)(ts, attrs)
        cur = (list(want) if isinstance(want, (tuple, list)) else [want])[pick]
        lay = apply_op(op, attrs, ls)[pick]
        if not 0 < cur.numel() <= 400:
            break
    note = f"steps: {steps}"
    if cur.numel():
        try:
            check(lay, cur, buffers)
        except AssertionError as exc:
            raise AssertionError(f"{note}: {exc}") from None


# --- every case's CUDA expression compiles with NVRTC -----------------------------------------------
def test_every_case_compiles_for_sm90():
    from agent_core.compiler import compile_source
    kernels = []
    for k, (op, specs, attrs) in enumerate(CASES):
        tensors, names, layouts = _inputs(specs)
        for j, lay in enumerate(apply_op(op, attrs, layouts)):
            params = [f"const {'long long' if t.dtype == torch.int64 else 'float'}* __restrict__ {n}"
                      for n, t in zip(names, tensors) if n in lay.sources]
            n = max(1, math.prod(lay.shape))
            kernels.append(
                f'extern "C" __global__ void case_{k}_{j}({", ".join(params + ["float* __restrict__ out"])}) {{\n'
                f"  const int o = blockIdx.x * blockDim.x + threadIdx.x;\n"
                f"  if (o < {n}) out[o] = {render_layout(lay, 'o')};\n}}\n")
    src = "#define NAN __int_as_float(0x7fffffff)\n" + "\n".join(kernels)
    log = compile_source(src, "views_cases", arch="sm_90").log
    assert "warning" not in log, log


def test_division_and_remainder_by_a_common_factor_hold_for_every_value():
    """views.div / mod split x = g * y + rest (g dividing the divisor and y's coefficients, 0 <= rest
    < g) and divide y alone; checked against integer arithmetic for every value of the variables of
    random sums (a row's 768 * row + col, a run's 4 * o + k, and what falls outside the rule)."""
    import itertools
    import random
    rng = random.Random(7)
    simplified = 0
    for _ in range(300):
        nv = rng.randint(1, 3)
        vs = [V.Var(f"v{j}", 0, rng.randint(0, 12)) for j in range(nv)]
        coefs = [rng.choice([1, 2, 3, 4, 6, 8, 12, 24]) for _ in vs]
        const = rng.randint(0, 30)
        x = V.add(*[V.mul(v, k) for v, k in zip(vs, coefs)], V.Num(const))
        c = rng.choice([2, 3, 4, 6, 8, 12, 24, 48, 96])
        d, m = V.div(x, c), V.mod(x, c)
        text = parse_c(V.render_expr(d)), parse_c(V.render_expr(m))
        simplified += V.render_expr(d).count("/") < V.render_expr(x).count("/") + 1
        for vals in itertools.product(*[range(v.hi + 1) for v in vs]):
            env = {v.name: a for v, a in zip(vs, vals)}
            want = sum(k * a for k, a in zip(coefs, vals)) + const
            assert (eval_c(text[0], env), eval_c(text[1], env)) == (want // c, want % c), (V.render_expr(x), c, env)
    assert simplified > 50       # the rule fires, not only the identities
