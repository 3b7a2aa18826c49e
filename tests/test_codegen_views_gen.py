"""Layout graphs (agent_core/codegen/layout_graph.py): regions of layout ops with views (slice with any
step, chunk / split pieces, cat / stack of several values, pad, flip, roll, select, repeat, expand)
with pointwise ops between them are one generated kernel.

The kernel's own text is run on the CPU: each `auto name_at = [&](index_t i) ...` lambda of the
scalar kernel is parsed (tests/test_views.py's C evaluator, truncating division, ?:) and evaluated
lazily per index, with every call and load bounds-checked against the size of what it reads; the
stored outputs equal the torch reference exactly (integer-valued inputs, exact in float32). The
float4 kernel reads the same index expressions at each run's first element: that every run of 4
outputs reads runs of 4 neighbouring, aligned input elements is checked by tracing the scalar
kernel's loads. Each case compiles with NVRTC for sm_90 in both forms. The RoPE and SwiGLU blocks of
benchmarks/blocks/ are one region that can_lower accepts and that generates."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
import torch

from agent_core.codegen import CodegenError, can_lower, generate_kernel
from agent_core.codegen.layout_graph import generate_layout_graph
from agent_core.codegen.region_io import region_io
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from agent_core.reference import parameter_tensors, run_reference
from tests.test_views import eval_c, parse_c

BLOCKS = Path(__file__).resolve().parent.parent / "benchmarks" / "blocks"


# --- programs --------------------------------------------------------------------------------------
def _node(p, op, ins, attrs=None):
    return p.add_node(op, [v if isinstance(v, str) else v.id for v in ins], attrs or {})


def rope(shape, act="neg"):
    """q * cos + cat(-q[..., h:], q[..., :h]) * sin, as benchmarks/blocks/rope_qk_llama7b.py."""
    p = Program("rope")
    d = shape[-1]
    q = p.add_input("q", shape)
    cos, sin = p.add_input("cos", shape[-2:]), p.add_input("sin", shape[-2:])
    hi = _node(p, "slice", [q], {"dim": -1, "start": d // 2, "end": d, "step": 1})
    n = _node(p, act, [hi.outputs[0]])
    lo = _node(p, "slice", [q], {"dim": -1, "start": 0, "end": d // 2, "step": 1})
    c = _node(p, "cat", [n.outputs[0], lo.outputs[0]], {"dim": -1})
    m1 = _node(p, "mul", [q, cos])
    m2 = _node(p, "mul", [c.outputs[0], sin])
    out = _node(p, "add", [m1.outputs[0], m2.outputs[0]])
    p.mark_output(out.outputs[0])
    return p


def swiglu(shape, act="silu"):
    """chunk(x, 2, -1) -> act(a) * b (SwiGLU's gate)."""
    p = Program("swiglu")
    x = p.add_input("x", shape)
    ch = _node(p, "chunk", [x], {"chunks": 2, "dim": -1})
    a = _node(p, act, [ch.outputs[0]])
    m = _node(p, "mul", [a.outputs[0], ch.outputs[1]])
    p.mark_output(m.outputs[0])
    return p


def class_token(b, n, d):
    """cat(cls.expand(b, 1, d), x, dim=1) + pos (ViT's class token and position embedding)."""
    p = Program("cls")
    cls, x, pos = p.add_input("cls", (1, 1, d)), p.add_input("x", (b, n, d)), p.add_input("pos", (1, n + 1, d))
    e = _node(p, "expand", [cls], {"size": [b, 1, d]})
    c = _node(p, "cat", [e.outputs[0], x], {"dim": 1})
    a = _node(p, "add", [c.outputs[0], pos])
    p.mark_output(a.outputs[0])
    return p


def stacked(shape):
    """stack([a, b * c, c], dim=1) - b[:, None] ; three region inputs joined, then broadcast."""
    p = Program("stack")
    a, b, c = (p.add_input(k, shape) for k in "abc")
    m = _node(p, "mul", [b, c])
    s = _node(p, "stack", [a, m.outputs[0], c], {"dim": 1})
    u = _node(p, "unsqueeze", [b], {"dim": 1})
    out = _node(p, "sub", [s.outputs[0], u.outputs[0]])
    p.mark_output(out.outputs[0])
    return p


def padded(shape):
    """flip(pad(-x, (1, 2), value 0.5) ** 2, dim 0) + y: a fill value, a flip, a pointwise op between."""
    p = Program("pad")
    x = p.add_input("x", shape)
    n = _node(p, "neg", [x])
    pd = _node(p, "pad", [n.outputs[0]], {"pad": [1, 2], "mode": "constant", "value": 0.5})
    sq = _node(p, "mul", [pd.outputs[0], pd.outputs[0]])
    f = _node(p, "flip", [sq.outputs[0]], {"dims": [0]})
    y = p.add_input("y", p.values[f.outputs[0]].shape)
    out = _node(p, "add", [f.outputs[0], y])
    p.mark_output(out.outputs[0])
    return p


def rolled(shape):
    """roll(x * x, 3, dim 1) + roll(x, -2, dim 0): x read at two indices."""
    p = Program("roll")
    x = p.add_input("x", shape)
    sq = _node(p, "mul", [x, x])
    r = _node(p, "roll", [sq.outputs[0]], {"shifts": [3], "dims": [1]})
    r2 = _node(p, "roll", [x], {"shifts": [-2], "dims": [0]})
    out = _node(p, "add", [r.outputs[0], r2.outputs[0]])
    p.mark_output(out.outputs[0])
    return p


def shifted(shape, dim=1):
    """logits[:, :-1] - labels[:, 1:] (cross entropy's shifted slices, along `dim`), two outputs: it
    and its negation."""
    p = Program("shift")
    x, y = p.add_input("logits", shape), p.add_input("labels", shape)
    a = _node(p, "slice", [x], {"dim": dim, "start": 0, "end": -1, "step": 1})
    b = _node(p, "slice", [y], {"dim": dim, "start": 1, "end": None, "step": 1})
    d = _node(p, "sub", [a.outputs[0], b.outputs[0]])
    n = _node(p, "neg", [d.outputs[0]])
    p.mark_output(d.outputs[0])
    p.mark_output(n.outputs[0])
    return p


def split_back(shape):
    """split(x, [2, 3, rest], dim -1) joined back in reverse order, the middle piece doubled."""
    p = Program("split")
    x = p.add_input("x", shape)
    sp = _node(p, "split", [x], {"split_size_or_sections": [2, 3, shape[-1] - 5], "dim": -1})
    m = _node(p, "add", [sp.outputs[1], sp.outputs[1]])
    c = _node(p, "cat", [sp.outputs[2], m.outputs[0], sp.outputs[0]], {"dim": -1})
    p.mark_output(c.outputs[0])
    return p


def interleaved(shape):
    """x[:, 0::2] * x[:, 1::2] + select(x, 1, 0)[:, None]: strided slices, a select, broadcasting."""
    p = Program("interleave")
    x = p.add_input("x", shape)
    ev = _node(p, "slice", [x], {"dim": 1, "start": 0, "end": None, "step": 2})
    od = _node(p, "slice", [x], {"dim": 1, "start": 1, "end": None, "step": 2})
    m = _node(p, "mul", [ev.outputs[0], od.outputs[0]])
    s = _node(p, "select", [x], {"dim": 1, "index": 0})
    u = _node(p, "unsqueeze", [s.outputs[0]], {"dim": 1})
    out = _node(p, "add", [m.outputs[0], u.outputs[0]])
    p.mark_output(out.outputs[0])
    return p


def repeated(shape):
    """repeat(x, (1, 2)) * cat([y, -y], dim 1)."""
    p = Program("repeat")
    x, y = p.add_input("x", shape), p.add_input("y", shape)
    r = _node(p, "repeat", [x], {"repeats": [1, 2]})
    n = _node(p, "neg", [y])
    c = _node(p, "cat", [y, n.outputs[0]], {"dim": 1})
    out = _node(p, "mul", [r.outputs[0], c.outputs[0]])
    p.mark_output(out.outputs[0])
    return p


def _indices(p, name, shape, high):
    return p.add_input(name, shape, dtype="int64", init={"kind": "randint", "low": 0, "high": high})


def embedded(b, n, vocab, d):
    """embedding(ids, table) + pos (BERT's token and position embeddings)."""
    p = Program("embed")
    ids, w, pos = _indices(p, "ids", (b, n), vocab), p.add_input("table", (vocab, d)), p.add_input("pos", (n, d))
    e = _node(p, "embedding", [ids, w])
    out = _node(p, "add", [e.outputs[0], pos])
    p.mark_output(out.outputs[0])
    return p


def gathered(shape, k):
    """-gather(x, 1, index[rows, k])."""
    p = Program("gather")
    x, idx = p.add_input("x", shape), _indices(p, "index", (shape[0], k), shape[1])
    g = _node(p, "gather", [x, idx], {"dim": 1})
    out = _node(p, "neg", [g.outputs[0]])
    p.mark_output(out.outputs[0])
    return p


def selected(shape, k):
    """index_select(x, 0, index[k]) - x[:k]."""
    p = Program("select_rows")
    x, idx = p.add_input("x", shape), _indices(p, "index", (k,), shape[0])
    g = _node(p, "index_select", [x, idx], {"dim": 0})
    s = _node(p, "slice", [x], {"dim": 0, "start": 0, "end": k, "step": 1})
    out = _node(p, "sub", [g.outputs[0], s.outputs[0]])
    p.mark_output(out.outputs[0])
    return p


# (label, builder, args, kind, vectorised); the CPU evaluator reads neg/add/sub/mul only, so the
# activations here are pointwise ops it can evaluate (the GPU tests use silu)
CASES = [
    ("rope", rope, ((2, 3, 4, 16),), "layout", True),
    ("rope-odd", rope, ((3, 5, 7, 10),), "layout", False),
    ("swiglu", swiglu, ((6, 16), "neg"), "layout", True),
    ("swiglu-odd", swiglu, ((5, 14), "neg"), "layout", False),
    ("class-token", class_token, (2, 5, 8), "layout", True),
    ("class-token-odd", class_token, (3, 4, 7), "layout", False),
    ("stack", stacked, ((4, 8),), "layout", True),
    ("stack-odd", stacked, ((4, 7),), "layout", False),
    ("pad-flip", padded, ((5, 7),), "layout", False),
    ("roll", rolled, ((3, 11),), "layout", False),
    ("shifted", shifted, ((4, 9),), "layout", False),
    ("shifted-rows", shifted, ((5, 8), 0), "layout", True),
    ("split-back", split_back, ((3, 9),), "layout", False),
    ("interleave", interleaved, ((3, 10),), "strided_slice", False),
    ("repeat", repeated, ((3, 8),), "layout", True),
    ("embedding", embedded, (2, 5, 10, 8), "layout", False),
    ("gather", gathered, ((3, 7), 4), "layout", False),
    ("index-select", selected, ((6, 5), 4), "layout", False),
]


# --- running the generated kernel's text on the CPU --------------------------------------------------
_LAMBDA = re.compile(r"^\s*auto (\w+) = \[&\]\(index_t i\) -> \w+ \{ (.*) \};(?:\s*// input (.*))?$")
_SPEC = re.compile(r"-> \w+\[([\d, ]*)\]")
_CALL = re.compile(r"\b(\w+_at)\(")


def _brackets(text: str) -> str:
    """name_at(expr) -> name_at[expr], so that the evaluator reads a call as a checked load."""
    out, depth = [], []
    i = 0
    while i < len(text):
        m = _CALL.match(text, i) if (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if m:
            out.append(m.group(1) + "[")
            depth.append("]")
            i = m.end()
            continue
        ch = text[i]
        if ch == "(":
            depth.append(")")
        elif ch == ")":
            ch = depth.pop()
        out.append(ch)
        i += 1
    return "".join(out)


class _Lambda:
    """One value of the kernel: len() its element count, [i] its element (evaluated on demand)."""

    def __init__(self, numel, stmts, ret, env, trace=None):
        self.numel, self.stmts, self.ret, self.env, self.trace = numel, stmts, ret, env, trace

    def __len__(self):
        return self.numel

    def __getitem__(self, i):
        local = {**self.env, "i": i}
        for name, e in self.stmts:
            local[name] = eval_c(e, local)
        return eval_c(self.ret, local)


class _Buffer(list):
    """A kernel argument's elements; records each index loaded when traced."""

    def __init__(self, name, data, trace):
        super().__init__(data)
        self.name, self.trace = name, trace

    def __getitem__(self, k):
        if self.trace is not None:
            self.trace.append((self.name, k))
        return list.__getitem__(self, k)


def _spec_numel(text):
    return math.prod(int(s) for s in text.split(",") if s.strip())


def _args(ks):
    sig = re.search(r"\w+\((const \w[\w ]*\* __restrict__ .*?)\) \{", ks.source).group(1)
    return [a.split()[-1] for a in sig.split(", ")]


def _env(ks, ins, trace=None):
    """The scalar kernel's arguments and lambdas, ready to be indexed (loads recorded in trace)."""
    args = _args(ks)
    env = {name: _Buffer(name, ins[vid].reshape(-1).tolist(), trace) for name, vid in zip(args, ks.inputs)}
    lines = ks.source.splitlines()
    for k, line in enumerate(lines):
        m = _LAMBDA.match(line)
        if not m:
            continue
        name, body, input_spec = m.groups()
        spec = re.match(r"\w+\[([\d, ]*)\]", input_spec) if input_spec else _SPEC.search(lines[k - 1])
        parts = [s.strip() for s in _brackets(body).split(";") if s.strip()]
        assert parts[-1].startswith("return "), line
        stmts = [(s.split(" = ", 1)[0].split()[-1], parse_c(s.split(" = ", 1)[1])) for s in parts[:-1]]
        env[name] = _Lambda(_spec_numel(spec.group(1)), stmts, parse_c(parts[-1][len("return "):]), env)
    return env


def _lanes(text: str) -> list[str]:
    """The top-level comma-separated arguments of a call's argument text."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([" and 1 or 0
        depth -= ch in ")]" and 1 or 0
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()]


def _stores(ks, env):
    """[(output value id, element -> its value)] of the kernel's loop: one element per thread
    (name[o] = fn(o)), or a packed run of 4 whose lane k is element 4 * o + k (each lane's own text,
    composed down to the loads, or a lambda called at o * 4 + k)."""
    # a packed run's registers, loaded before its stores: lane c of a 4-lane one is element
    # 4 * group + c of its input, a scalar one an element; every run loads them all, whatever the
    # lanes' tests, so each run checks that every register's elements lie inside its input
    regs = [(reg, buf, f"({idx}) * 4", 4) for reg, buf, idx in
            re.findall(r"    const \w+ (\w+) = reinterpret_cast<const \w+\*>\((\w+)\)\[(.*)\];", ks.source)]
    regs += [(reg, buf, f"({idx})", 1) for reg, buf, idx in
             re.findall(r"    const \w+ (\w+) = (\w+)\[(.*)\];", ks.source)]
    first = [parse_c(at) for _, _, at, _ in regs]

    def unregistered(text):
        """A lane's text with each register read as the load it holds."""
        text = text.replace("(bool)", "")     # a comparison's 0 / 1 as a where's condition
        for reg, buf, at, n in regs:
            text = re.sub(rf"\b{reg}\.([xyzw])", lambda m: f"{buf}[{at} + {'xyzw'.index(m.group(1))}]", text) \
                if n == 4 else re.sub(rf"\b{reg}\b", f"{buf}[{at}]", text)
        return text

    def lane(e, lanes):
        run = {**env, "o": e // 4}
        for (_, buf, _, n), at in zip(regs, first):
            k = eval_c(at, run)
            assert 0 <= k and k + n <= len(env[buf]), f"a register load of {buf} at {k} outside it"
        return eval_c(lanes[e % 4], run)

    out = []
    for name, vid in zip(_args(ks)[len(ks.inputs):], ks.outputs):
        m = re.search(rf"    {name}\[o\] = (\w+)\(o\);", ks.source)
        packed = re.search(rf"    reinterpret_cast<\w+\*>\({name}\)\[o\] = \w+[({{](.*)[)}}];", ks.source)
        assert m or packed, f"no store of {name} in\n{ks.source}"
        if m:
            out.append((vid, lambda e, fn=m.group(1): env[fn][e]))
            continue
        lanes = [parse_c(_brackets(unregistered(t))) for t in _lanes(packed.group(1))]
        assert len(lanes) == 4, packed.group(0)
        out.append((vid, lambda e, lanes=lanes: lane(e, lanes)))
    return out


def emulate(ks, ins):
    """Run the kernel's text: {output value id: list of its elements}."""
    env = _env(ks, ins)
    numel, runs = (re.search(rf"constexpr index_t {k} = (\d+);", ks.source) for k in ("kNumel", "kRuns"))
    kn = int(numel.group(1)) if numel else 4 * int(runs.group(1))
    return {vid: [at(o) for o in range(kn)] for vid, at in _stores(ks, env)}


def _inputs(program, seed=0):
    """Integer-valued inputs (every sum and product stays exact in float32), and the parameters."""
    g = torch.Generator().manual_seed(seed)
    ins = {}
    for v in program.inputs:
        val = program.values[v]
        ins[v] = torch.randint(val.init["low"], val.init["high"], val.shape, generator=g) if val.dtype == "int64" \
            else torch.randint(-8, 9, val.shape, generator=g).float()
    return {**parameter_tensors(program, "cpu"), **ins}


def test_an_index_out_of_range_reads_nothing_and_gives_nan():
    """torch raises on it; the kernel tests the loaded index before it reads: NaN, which verification
    rejects, and no load outside any tensor (the evaluator checks every one)."""
    p = embedded(2, 3, 10, 4)
    ks = generate_kernel(p, list(p.nodes), name="oob")
    ins = _inputs(p)
    ids = next(v for v in p.inputs if p.values[v].dtype == "int64")
    ins[ids] = torch.tensor([[0, 10, 3], [-1, 9, 2]])
    got = next(iter(emulate(ks, ins).values()))
    bad = {1, 3}            # flat token positions of 10 and -1
    for o, x in enumerate(got):
        assert math.isnan(x) == (o // 4 in bad), (o, x)


@pytest.mark.parametrize("shape", [(2, 8, 12), (3, 5, 8)], ids=["aligned", "odd-rows"])
def test_a_packed_run_loads_into_registers_before_its_stores(shape):
    """where(x > m, x, m) for m = y.transpose(1, 2) * pos (a max): the transposed read keeps the run from the float4
    schedule, but each run's 4 lanes read 4 aligned neighbours of x and of pos: one 4-lane register
    each, while y is 4 scalar registers; the where's arms are registers too, so the store is a
    select with no load (and no branch) in it. The text computes torch's result and every register
    lies inside its input at every run (the emulator checks each)."""
    b, n, d = shape
    p = Program("packed")
    x, y, pos = p.add_input("x", (b, n, d)), p.add_input("y", (b, d, n)), p.add_input("pos", (n, d))
    t = _node(p, "transpose", [y], {"dim0": 1, "dim1": 2})
    m = _node(p, "mul", [t.outputs[0], pos])
    c = _node(p, "gt", [x, m.outputs[0]])
    out = _node(p, "where", [c.outputs[0], x, m.outputs[0]])
    p.mark_output(out.outputs[0])
    ks = generate_layout_graph(p, region_io(p, list(p.nodes)), "packed", {"tiled": False}, "layout")
    assert ks.params["pack"] and ks.params["vector"] == 1, ks.source
    wide = re.findall(r"const float4 \w+ = reinterpret_cast<const float4\*>\((\w+)\)", ks.source)
    scalar = re.findall(r"const float \w+ = (\w+)\[", ks.source)
    assert sorted(wide) == ["pos", "x"] and scalar == ["y"] * 4, ks.source
    store = next(line for line in ks.source.splitlines() if "make_float4(" in line)
    assert not re.search(r"\b(x|y|pos)\[", store), store
    ins = _inputs(p)
    want = run_reference(p, [ins[v] for v in p.inputs], keep=True)
    got = emulate(ks, ins)
    assert got[ks.outputs[0]] == want[ks.outputs[0]].reshape(-1).tolist()
    compile_kernel(ks, arch="sm_90")


def test_a_load_under_a_cat_arms_test_stays_in_its_arm():
    """cat([a, b], -1), 4 wide each, read in scalar runs: each lane is in a or in b by its run, so
    its loads stay under the arm's test, neither a scalar nor a 4-lane register (a register would
    read both arms for every run: twice the traffic)."""
    p = Program("cat_arms")
    a, b = p.add_input("a", (4, 4)), p.add_input("b", (4, 4))
    out = _node(p, "cat", [a, b], {"dim": -1})
    p.mark_output(out.outputs[0])
    ks = generate_layout_graph(p, region_io(p, list(p.nodes)), "cat", {"vector": False, "tiled": False, "staged": False}, "layout")
    assert ks.params["pack"], ks.source
    body = ks.source[ks.source.index('extern "C"'):]      # the kernel itself, not the shared helpers
    assert not re.search(r"const (float|float4) \w+ = ", body), body
    ins = _inputs(p)
    want = run_reference(p, [ins[v] for v in p.inputs], keep=True)
    assert emulate(ks, ins)[ks.outputs[0]] == want[ks.outputs[0]].reshape(-1).tolist()


def _build(builder, args):
    p = builder(*args)
    return p, list(p.nodes)


@pytest.mark.parametrize("pack", [True, False], ids=["packed-runs", "one-per-thread"])
@pytest.mark.parametrize("label,builder,args,kind,vec", CASES, ids=[c[0] for c in CASES])
def test_the_kernel_computes_what_torch_computes(label, builder, args, kind, vec, pack):
    p, ids = _build(builder, args)
    ks = generate_kernel(p, ids, name=label.replace("-", "_"), params={"vector": False, "pack": pack})
    assert ks.kind == kind and ks.params["graph"] and ks.params["vector"] == 1
    numel = math.prod(p.values[ks.outputs[0]].shape)
    assert ks.params.get("pack", False) == (pack and numel % 4 == 0 and not ks.params.get("staged")), ks.source
    ins = _inputs(p)
    want = run_reference(p, [ins[v] for v in p.inputs], keep=True)
    got = emulate(ks, ins)
    for vid in ks.outputs:
        assert got[vid] == want[vid].reshape(-1).tolist(), (label, p.values[vid].name)


@pytest.mark.parametrize("label,builder,args,kind,vec", CASES, ids=[c[0] for c in CASES])
def test_float4_runs_read_aligned_neighbours(label, builder, args, kind, vec):
    """float4 exactly where every run of 4 outputs loads 4 neighbouring elements starting at a
    multiple of 4 from each input (traced through the scalar kernel), and its source loads float4."""
    p, ids = _build(builder, args)
    ks = generate_kernel(p, ids, name="vec")
    assert (ks.params["vector"] == 4) == vec, ks.source
    scalar = generate_kernel(p, ids, name="vec", params={"vector": False})
    ins = _inputs(p)
    numel = math.prod(p.values[ks.outputs[0]].shape)
    trace = []
    env = _env(scalar, ins, trace)
    stores = _stores(scalar, env)
    aligned = numel % 4 == 0
    for run in range(numel // 4 if aligned else 0):
        loads = []
        for j in range(4):
            trace.clear()
            for _, fn in stores:
                fn(run * 4 + j)
            loads.append(sorted(set(trace)))
        base = loads[0]
        aligned = all(k % 4 == 0 for _, k in base) and \
            all(loads[j] == sorted({(n, k + j) for n, k in base}) for j in range(1, 4))
        if not aligned:
            break
    assert aligned == vec, f"{label}: float4 {'chosen' if vec else 'refused'}, yet runs read " \
                           f"{'scattered' if vec else 'aligned neighbouring'} elements"
    if vec:
        assert "reinterpret_cast<float4*>" in ks.source and "make_float4" in ks.source
        assert ks.align == 16
    compile_kernel(ks, arch="sm_90")
    compile_kernel(scalar, arch="sm_90")




# --- the blocks: RoPE (slice / neg / cat / mul / add) and SwiGLU (chunk / silu / mul) -----------------
@pytest.fixture(scope="module")
def blocks():
    """The RoPE and SwiGLU blocks as imported (small sizes, as the CPU tests of the blocks use)."""
    from agent_core.importers import import_file
    before = os.environ.get("STITCHCUDA_BLOCKS_SMALL")
    os.environ["STITCHCUDA_BLOCKS_SMALL"] = "1"
    try:
        return {name: import_file(BLOCKS / f"{name}.py") for name in ("rope_qk_llama7b", "swiglu_gate_llama7b")}
    finally:
        if before is None:
            del os.environ["STITCHCUDA_BLOCKS_SMALL"]
        else:
            os.environ["STITCHCUDA_BLOCKS_SMALL"] = before


@pytest.mark.parametrize("block,ops", [("rope_qk_llama7b", {"slice", "neg", "cat", "mul", "add"}),
                                       ("swiglu_gate_llama7b", {"slice", "silu", "mul"})])
def test_a_block_is_one_generated_region(blocks, block, ops):
    """Every node of the block in one group: the backend accepts it (the planner's question) and it
    generates as one float4 layout-graph kernel that compiles for sm_90."""
    p = blocks[block]
    ids = list(p.nodes)
    assert {p.nodes[n].op for n in ids} == ops
    assert can_lower(p, ids) is None
    ks = generate_kernel(p, ids, name=block)
    assert ks.kind == "layout" and ks.params["graph"] and ks.params["vector"] == 4
    assert sorted(ks.outputs) == sorted(p.outputs) and "torch" not in ks.schedule
    compile_kernel(ks, arch="sm_90")
    ins = _inputs(p, seed=3)
    scalar = generate_kernel(p, ids, name=block, params={"vector": False})
    if block.startswith("rope"):      # neg / mul / add only: the CPU evaluator runs it
        want = run_reference(p, [ins[v] for v in p.inputs], keep=True)
        got = emulate(scalar, ins)
        for v in scalar.outputs:     # cos / sin are not integers: float32 rounding against double
            assert got[v] == pytest.approx(want[v].reshape(-1).tolist(), abs=1e-5)


@pytest.mark.parametrize("op", ["slice", "cat", "pad", "flip"])
def test_a_layout_op_alone_generates(op):
    """The layout ops the planner leaves alone (each its own region) generate instead of running
    through torch."""
    p = Program(op)
    x = p.add_input("x", (6, 10))
    ins = {"slice": [x.id], "cat": [x.id, x.id], "pad": [x.id], "flip": [x.id]}[op]
    attrs = {"slice": {"dim": 1, "start": 2, "end": 9, "step": 1}, "cat": {"dim": 0},
             "pad": {"pad": [1, 1, 2, 0]}, "flip": {"dims": [1]}}[op]
    n = p.add_node(op, ins, attrs)
    p.mark_output(n.outputs[0])
    assert can_lower(p, [n.id]) is None
    compile_kernel(generate_kernel(p, [n.id], name=op), arch="sm_90")


def test_refusals_name_the_node_and_what_to_do():
    p = Program("refuse")
    x = p.add_input("x", (4, 8))
    s = _node(p, "slice", [x], {"dim": 1, "start": 0, "end": 4, "step": 1})
    m = _node(p, "sum", [s.outputs[0]], {"dim": [1]})
    p.mark_output(m.outputs[0])
    with pytest.raises(CodegenError, match=r"sum"):
        generate_kernel(p, [s.id, m.id], name="mixed", kind="layout")
    q = Program("wide")       # integers move in their own type; float64 would change the precision
    y = q.add_input("y", (4, 8), dtype="float64")
    c = _node(q, "cat", [y, y], {"dim": 0})
    q.mark_output(c.outputs[0])
    with pytest.raises(CodegenError, match=r"'y'.*float64"):
        generate_kernel(q, [c.id], name="doubles")


# --- random graphs -----------------------------------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402



@st.composite
def layout_graphs(draw):
    """A program of 3-7 random steps over two [a, b] inputs: slices (any step), flips, rolls, pads,
    transposes, negations, elementwise sums / products of two values of one shape and cats of two
    values along a dim where their other dims agree. Its last value is the output."""
    p = Program("random")
    a, b = draw(st.integers(1, 6)), draw(st.integers(2, 9))
    pool = [p.add_input("x", (a, b)).id, p.add_input("y", (a, b)).id]
    for _ in range(draw(st.integers(3, 7))):
        v = draw(st.sampled_from(pool))
        shape = p.values[v].shape
        d = draw(st.integers(0, len(shape) - 1))
        kind = draw(st.sampled_from(["slice", "flip", "roll", "pad", "transpose", "neg", "binary", "cat"]))
        if kind == "slice":
            n = shape[d]
            start, step = draw(st.integers(0, n - 1)), draw(st.integers(1, 3))
            node = _node(p, "slice", [v], {"dim": d, "start": start, "end": draw(st.integers(start + 1, n)),
                                           "step": step})
        elif kind == "flip":
            node = _node(p, "flip", [v], {"dims": [d]})
        elif kind == "roll":
            node = _node(p, "roll", [v], {"shifts": [draw(st.integers(-4, 4))], "dims": [d]})
        elif kind == "pad":
            node = _node(p, "pad", [v], {"pad": [draw(st.integers(0, 2)), draw(st.integers(0, 2))],
                                         "mode": "constant", "value": -3.0})
        elif kind == "transpose":
            node = _node(p, "transpose", [v], {"dim0": 0, "dim1": 1})
        elif kind == "neg":
            node = _node(p, "neg", [v])
        else:
            if kind == "binary":
                others = [u for u in pool if p.values[u].shape == shape]
            else:
                others = [u for u in pool if all(s == t for k, (s, t) in enumerate(zip(p.values[u].shape, shape))
                                                 if k != d)]
            u = draw(st.sampled_from(others))
            node = _node(p, draw(st.sampled_from(["add", "mul", "sub"])), [v, u]) if kind == "binary" else \
                _node(p, "cat", [u, v], {"dim": d})
        pool.append(node.outputs[0])
    p.mark_output(pool[-1])
    return p


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout_graphs())
def test_random_layout_graphs_compute_what_torch_computes(p):
    """Any graph of these ops generates (as a layout graph) and its kernel's own text, evaluated,
    gives torch's result at every element, reading nothing outside any tensor."""
    io = region_io(p, list(p.nodes))
    # the one-thread-per-output gather; the tiled and staged schedules have their own host runs
    # (tests/test_codegen_layout_tiled.py)
    ks = generate_layout_graph(p, io, "random", {"vector": False, "tiled": False, "staged": False}, "layout")
    ins = _inputs(p)
    want = run_reference(p, [ins[v] for v in p.inputs], keep=True)
    got = emulate(ks, ins)
    for vid in ks.outputs:
        assert got[vid] == want[vid].reshape(-1).tolist(), ks.source


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="needs nvcc")
def test_nvcc_compiles_layout_graphs_without_warnings(tmp_path):
    """The lambdas, float4 casts and 64-bit index loads compile with nvcc, warnings on, to nothing."""
    import subprocess

    from tests.test_codegen_indexed import NVCC_FLAGS
    for k, p in enumerate([rope((2, 3, 4, 16)), embedded(2, 5, 10, 8)]):
        ks = generate_kernel(p, list(p.nodes), name=f"nvcc_{k}")
        cu = tmp_path / f"k{k}.cu"
        cu.write_text(ks.source)
        r = subprocess.run(["nvcc", *NVCC_FLAGS, str(cu), "-o", str(cu.with_suffix(".o"))],
                           capture_output=True, text=True)
        log = (r.stdout + r.stderr).strip()
        assert r.returncode == 0 and "warning" not in log, f"{ks.name}:\n{log}"


@pytest.mark.parametrize("label,builder,args,kind,vec", [c for c in CASES if c[0] in ("rope", "embedding", "stack")],
                         ids=["rope", "embedding", "stack"])
def test_a_run_too_long_to_compose_keeps_its_lambdas(label, builder, args, kind, vec, monkeypatch):
    """Past INLINE_MAX_CHARS a packed run's lanes call the values' lambdas at o * 4 + k instead of
    composing them; the elements are the same."""
    from agent_core.codegen import layout_graph
    p, ids = _build(builder, args)
    inline = generate_kernel(p, ids, name="inline", params={"vector": False})
    monkeypatch.setattr(layout_graph, "INLINE_MAX_CHARS", 10)
    called = generate_kernel(p, ids, name="called", params={"vector": False})
    assert inline.params["pack"] and called.params["pack"]
    assert "auto " not in inline.source and "(o * 4 + 1)" in called.source
    ins = _inputs(p)
    assert emulate(inline, ins) == emulate(called, ins)
    compile_kernel(called, arch="sm_90")


def _swiglu(tokens, width, silu=True):
    """silu(gate) * up of a merged projection split in two (benchmarks/blocks/swiglu_gate_llama7b.py);
    gate * up without silu (the text emulator has no expf)."""
    p = Program("swiglu")
    x = p.add_input("gate_up", (tokens, 2 * width))
    gate = _node(p, "slice", [x], {"dim": 1, "start": 0, "end": width, "step": 1})
    up = _node(p, "slice", [x], {"dim": 1, "start": width, "end": 2 * width, "step": 1})
    g = _node(p, "silu", [gate.outputs[0]]).outputs[0] if silu else gate.outputs[0]
    out = _node(p, "mul", [g, up.outputs[0]])
    p.mark_output(out.outputs[0])
    return p


@pytest.mark.parametrize("unroll", [1, 2])
def test_the_gather_launches_a_block_per_block_of_runs(unroll):
    """The gather launches a block per `block x unroll` runs, not 8 per SM looping over the rest (H100:
    SwiGLU's gate 192 -> 182 us), the last partial block included; the text still computes torch's
    result."""
    p = _swiglu(5, 44, silu=False)        # 55 runs of 4: not a multiple of the block
    # the runs as 4 scalar reads and a 4-lane store: the form the text emulator reads (float4 is the same loop)
    ks = generate_layout_graph(p, region_io(p, list(p.nodes)), "swiglu",
                               {"tiled": False, "vector": False, "unroll": unroll, "block": 32}, "layout")
    runs = int(re.search(r"constexpr index_t kRuns = (\d+);", ks.source).group(1))
    assert runs == 55 and ks.params["pack"]
    assert ks.grid == (math.ceil(runs / (32 * unroll)), 1, 1) and ks.block == (32, 1, 1)
    ins = _inputs(p)
    want = run_reference(p, [ins[v] for v in p.inputs], keep=True)
    assert emulate(ks, ins)[ks.outputs[0]] == want[ks.outputs[0]].reshape(-1).tolist()
    big = _swiglu(4096, 11008)
    ks = generate_layout_graph(big, region_io(big, list(big.nodes)), "swiglu", {"tiled": False}, "layout")
    assert ks.params["vector"] == 4 and ks.grid == (4096 * 11008 // 4 // 256, 1, 1)
    compile_kernel(ks, arch="sm_90")
