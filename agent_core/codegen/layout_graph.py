"""Layout graphs: regions whose non-pointwise ops are layout ops with views (slice with any step,
select, the pieces of chunk / split / unbind, cat / stack of several values, pad, flip, roll, repeat,
diag, the reshape family, permute / transpose, expand, gather / index_select / embedding), with
pointwise ops anywhere between them: RoPE's slice -> neg -> cat -> mul -> add, SwiGLU's chunk -> silu
-> mul, a ViT's cat of a class token, BERT's embedding + position.

One kernel, one thread per run of 4 output elements (a grid of them all; float4 loads where every read allows
it, else 4 scalar gathers and one 4-lane store; one element per thread when the count is not a
multiple of 4). Each value
the outputs need becomes a function of its own flat index, a lambda `name_at(i)`, in topological order:
- a region input is a load, name[i];
- a pointwise op is its expression over its inputs read at their broadcast index (a broadcast is an
  expand view, so it renders as any other view does);
- a layout op reads its inputs through their views (codegen/views.py): the index expression under each
  read's validity condition, a cat taking the first input whose mask holds (a chain of ?: selects, no
  test on the last one), a pad its fill value where no read is valid. Where a warp's lanes straddle a
  cat's arms (RoPE's halves), every arm is read first at its offset clamped into its source and the
  select picks one (views.render_layout_arms): the arms' loads are in flight together, not in turn.
A gather's index is loaded from an integer region input inside the index expression and tested
before it is used: out of range (torch raises) reads nothing and gives NaN, which verification rejects.
Nothing between the ops is written to memory. A value read at several indices (RoPE reads q three
times) is recomputed at each; for pointwise ops that costs arithmetic, not traffic.

Vectorised: when the outputs' element count is a multiple of 4 and every region input is only ever
read at offsets that move with the output index in aligned runs of 4 (an innermost stride of 1, all
other strides, offsets and mask bounds multiples of 4), each thread computes 4 neighbouring outputs:
the lambdas take the run's first index and return float4, loads and stores are 16 bytes.

The same lambdas are a row kernel's prologue (ViewPrologue, below): layout ops before a softmax or a
norm (cat -> add -> layer_norm, embedding -> add -> layer_norm, permute -> softmax) are read through
their views while the row kernel (rowkernel.py) loads the row, and never go to memory between.
"""
from __future__ import annotations

import math
import re

from ..ir import Program
from ..ops.common import broadcasts_to
from . import views as V
from .cuda import (MAX_GRID_X, VEC4, VEC4_STRUCTS, Names, c_type, header, index_type, kernel_name, kernel_source,
                   render_pointwise)
from .kernel import CodegenError, KernelSource
from .pointwise import is_elementwise
from .pooling import pooled_here, window_code
from .reduce_window import WINDOW_UNROLL, reduce_lambda, reduced_block, staged_lambda, window_reductions
from .region_io import RegionIO, region_io

# layout ops read through views; the indirect ones load an index from an integer region input
INDIRECT_OPS = {"gather": 1, "index_select": 1, "embedding": 0}     # op -> port of its index tensor
GRAPH_OPS = ("reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose", "expand",
             "repeat", "cat", "stack", "slice", "select", "split", "chunk", "unbind", "pad", "contiguous",
             "flip", "roll", "diag", "diagonal", "tril", "triu", *INDIRECT_OPS)
INDEX_TYPES = {"int64": "long long", "int32": "int"}
# the ops that only relabel elements: a region of these and pointwise ops stays a pointwise / row kernel
RELABEL_OPS = ("reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "contiguous", "expand")
VEC = 4


def is_layout_graph(program: Program, io: RegionIO) -> bool:
    """Every non-pointwise op of the region is a layout op with a view, and one of them moves elements,
    or relabels values so that the pointwise generator, which indexes every input in the output's
    shape, cannot (the segment sum's x[..., :, None] - x[..., None, :], an add then a reshape)."""
    ops = [program.nodes[n].op for n in io.nodes
           if program.nodes[n].op in GRAPH_OPS or not is_elementwise(program.nodes[n])]
    if not ops or not all(op in GRAPH_OPS for op in ops):
        return False
    return any(op not in RELABEL_OPS for op in ops) or _relabel_breaks_broadcast(program, io)


def _relabel_breaks_broadcast(program: Program, io: RegionIO) -> bool:
    """Pointwise work between relabels whose operands no longer broadcast to the output's shape, or
    relabels that repeat elements."""
    vals, nodes = program.values, program.nodes
    pointwise = [nodes[n] for n in io.nodes if is_elementwise(nodes[n]) and nodes[n].op not in RELABEL_OPS]
    if not io.outputs or not io.inputs:
        return False
    if not pointwise:    # relabels alone copy only where a reshape lays out an expand's repeats (a nearest upsample)
        return max(math.prod(vals[v].shape) for v in io.outputs) > max(math.prod(vals[v].shape) for v in io.inputs)
    space = vals[io.outputs[0]].shape
    seen = [v for v in io.inputs] + [v for n in pointwise for v in [*n.inputs, *n.outputs] if v]
    return any(not broadcasts_to(vals[v].shape, space) for v in seen)


def _needed(program: Program, io: RegionIO) -> set:
    """Values the outputs depend on (only these are rendered)."""
    need, todo = set(), list(io.outputs)
    while todo:
        v = todo.pop()
        if v in need:
            continue
        need.add(v)
        if v in io.produced:
            todo += [u for u in program.nodes[program.values[v].producer].inputs if u]
    return need


def _broadcast(shape, space) -> V.Layout:
    """The Layout of a value of `shape` read at each index of `space` (numpy broadcasting)."""
    lay = V.Layout.of("b", shape)
    return lay if tuple(shape) == tuple(space) else V.expand(lay, list(space))


def index_inputs(program: Program, io: RegionIO, kind: str) -> set:
    """The integer region inputs that gather / index_select / embedding read their indices from."""
    out = set()
    for n in io.nodes:
        node = program.nodes[n]
        if node.op in INDIRECT_OPS:
            v = node.inputs[INDIRECT_OPS[node.op]]
            if v not in io.inputs:
                raise CodegenError(f"{node.name} ({node.op}) reads indices computed inside the region; a {kind} "
                                   f"kernel loads them from an input tensor: split the region before it",
                                   node_id=n)
            if program.values[v].dtype not in INDEX_TYPES:
                raise CodegenError(f"{node.name} ({node.op}): indices '{program.values[v].name}' are "
                                   f"{program.values[v].dtype}; int64 or int32 are read", node_id=n)
            out.add(v)
    for n in io.nodes:      # an index tensor feeds nothing but the index ports
        node = program.nodes[n]
        for port, v in enumerate(node.inputs):
            if v in out and not (node.op in INDIRECT_OPS and port == INDIRECT_OPS[node.op]):
                raise CodegenError(f"{node.name} ({node.op}) reads the indices '{program.values[v].name}' as "
                                   f"values; split the region", node_id=n)
    return out


def _check(program: Program, io: RegionIO, kind: str, indices: set, any_dtype: bool = False,
           one_space: bool = True) -> int:
    """The outputs' element count; with `one_space` (a layout kernel: one flat index for all outputs)
    every output must have it, while a row kernel's prologue reads each output at its own index. Either
    may pool (a max/avg or adaptive pool, not a global average, as a lambda over its window)."""
    vals, nodes = program.values, program.nodes
    for n in io.nodes:
        node = nodes[n]
        if node.op in GRAPH_OPS or _walks_window(program, node):
            continue
        if not is_elementwise(node):
            raise CodegenError(f"{node.name} ({node.op}) is not a layout op with a view nor pointwise; a {kind} "
                               f"region holds only those; split the region", node_id=n)
        if node.op == "batch_norm":
            raise CodegenError(f"{node.name} (batch_norm) reads per-channel parameters that a {kind} region "
                               f"does not broadcast; split the region before it", node_id=n)
    for v in [*io.inputs, *io.outputs]:     # any kernel dtype, each in its own C type (float64, halves: no)
        c_type(vals[v].dtype, f"'{vals[v].name}'")
    numel = math.prod(vals[io.outputs[0]].shape)
    if numel == 0:
        raise CodegenError(f"output '{vals[io.outputs[0]].name}' is empty; there is nothing to launch")
    for v in io.outputs if one_space else []:
        if math.prod(vals[v].shape) != numel:
            raise CodegenError(f"output '{vals[v].name}' {vals[v].spec} is not the size of "
                               f"'{vals[io.outputs[0]].name}' {vals[io.outputs[0]].spec}; split the region there")
    return numel


class _Graph:
    """Each needed value as a Layout over the region's inputs (for the vector check) and as a lambda.
    A pooling window has no view: its reads are not listed, and its value is only ever a lambda
    (`windows`; no float4 form, tiles or staging)."""

    def __init__(self, program: Program, io: RegionIO, kind: str, indices: set):
        self.program, self.io, self.kind, self.indices = program, io, kind, indices
        self.need = _needed(program, io)
        self.windows = [n for n in io.nodes if _walks_window(program, program.nodes[n])
                        and program.nodes[n].outputs[0] in self.need]
        self.window_unroll = WINDOW_UNROLL     # a reduction window's loads in flight (reduce_window.py)
        self.staged: dict[str, tuple[str, str]] = {}   # window node -> (its tile, the block's first window)

    def layouts(self, node):
        """(input value ids, output Layouts over them) of a layout node."""
        ins = [v for v in node.inputs if v]
        try:
            outs = V.apply_op(node.op, node.attrs, [V.Layout.of(v, self.program.values[v].shape) for v in ins])
        except V.ViewError as exc:
            raise CodegenError(f"{node.name}: {exc}", node_id=node.id) from None
        return ins, outs

    def reads(self):
        """(value read, Read through which it is read, at the index space of the reader) of every edge."""
        vals = self.program.values
        for nid in self.io.nodes:
            node = self.program.nodes[nid]
            if not any(v in self.need for v in node.outputs):
                continue
            if nid in self.windows:
                continue
            if node.op in GRAPH_OPS:
                _, outs = self.layouts(node)
                for v, lay in zip(node.outputs, outs):
                    if v in self.need:
                        for r in lay.reads:
                            if r.source is not None:
                                yield r.source, r
                            for layer in r.stack.layers:     # the index a gather loads
                                if isinstance(layer, V.Indirect):
                                    yield layer.index.source, layer.index
            else:
                space = vals[node.outputs[0]].shape
                for v in node.inputs:
                    if v:
                        r = _broadcast(vals[v].shape, space).reads[0]
                        yield v, V.Read(v, r.stack)


def _vector_ok(g: _Graph, numel: int) -> bool:
    """Runs of 4 outputs read runs of 4 aligned, neighbouring elements everywhere: every read of
    every value, composed down to the region's inputs, keeps the run together (see the module doc)."""
    if numel % VEC or g.windows:
        return False
    vals = g.program.values
    for v in g.need:
        if math.prod(vals[v].shape) % VEC:
            return False
    for _, r in g.reads():
        for layer in r.stack.layers:
            if not isinstance(layer, V.View):
                return False
            m = layer.merged()
            if not m.shape:
                return False
            if m.shape[-1] % VEC or m.strides[-1] not in (1,) or m.offset % VEC \
                    or any(st % VEC for st in m.strides[:-1]):
                return False
            if m.mask and (m.mask[-1][0] % VEC or m.mask[-1][1] % VEC):
                return False
        # a stacked read unravels the flat offset again: the run stays together when the lower view's
        # innermost extent is a multiple of 4 too (checked above for each layer)
    return True


def _lanes4(dtype: str, exprs) -> str:
    """Four values of `dtype` as one value of its 4-lane type."""
    t = VEC4[dtype]
    return f"make_float4({', '.join(exprs)})" if t == "float4" else f"{t}{{{', '.join(exprs)}}}"


def _pack_ok(g: _Graph, numel: int) -> bool:
    """Runs of 4 outputs can be stored as one 4-lane access though their reads are gathered apart."""
    vals = g.program.values
    return numel % VEC == 0 and all(vals[v].dtype in VEC4 for v in g.io.outputs)


INLINE_MAX_CHARS = 2000   # one output element's composed text; past it the kernel keeps its lambdas


def _inline(g: _Graph, arg: dict, v: str, idx: V.Expr, memo: dict, regs: dict | None = None,
            loads: dict | None = None, sure: bool = True) -> str:
    """The C expression of value v at flat index idx (an Expr with bounds over the loop's variables),
    composed through every view and pointwise op down to the region's loads. The index algebra then
    simplifies across the ops (views.py's div / mod rules: (4 * o + k) / 4 is o) where a chain of
    lambdas divides a flat index again at each one. A pointwise value read twice is written twice
    (the compiler shares the common subexpression); its text stays under INLINE_MAX_CHARS.
    `loads` collects every input load as (input, index) -> whether some path reaches it `sure`ly,
    under no test of a pad's or cat arm's bounds (a where's arms count: torch computes both);
    `regs` (from _hoisted_loads) maps loads to the registers that hold them."""
    key = (v, idx, sure)
    if key in memo:
        return memo[key]
    program, io = g.program, g.io
    vals = program.values
    if v in io.inputs:
        if loads is not None:
            loads[(v, _key(idx))] = loads.get((v, _key(idx)), False) or sure
        if regs and (v, _key(idx)) in regs:
            text = regs[(v, _key(idx))]
        else:
            text = f"{arg[v]}[{V.render_expr(idx, names=arg)}]"
    else:
        node = program.nodes[vals[v].producer]
        if node.id in g.windows:
            raise _TooLong(v)
        if node.op in GRAPH_OPS:
            _, outs = g.layouts(node)
            lay = outs[list(node.outputs).index(v)]
            arms = [tests for tests in (V.locate(r.stack, idx)[1] for r in lay.reads) if tests is not V.FALSE]
            plain = sure and bool(arms) and not arms[0]
            text = V.render_layout(lay, idx, names=arg,
                                   load_at=lambda src, off: _inline(g, arg, src, off, memo, regs, loads, plain))
        else:
            args = []
            for u in node.inputs:
                if u:
                    off, _ = V.locate(_broadcast(vals[u].shape, vals[v].shape).reads[0].stack, idx)
                    args.append(f"({_inline(g, arg, u, off, memo, regs, loads, sure)})")
            text = render_pointwise(node, args)
    if vals[v].dtype != "float32":      # as a lambda returning the value's own C type would convert
        text = f"(({c_type(vals[v].dtype, vals[v].name)})({text}))"
    if len(text) > INLINE_MAX_CHARS:
        raise _TooLong(v)
    memo[key] = text
    return text


class _TooLong(Exception):
    """A composed expression past INLINE_MAX_CHARS, or one through a pooling window (a loop, not an
    expression): the kernel keeps its lambdas."""


def _packed_lanes(g: _Graph, arg: dict, runs: int, names: Names) -> tuple[dict, list] | None:
    """Each output's 4 lanes of run o, lane k composed at index 4 * o + k, and the registers their
    loads go to first; None when some lane's text is too long to inline. See _hoisted_loads."""
    o = V.Var("o", 0, max(runs - 1, 0))
    idx = [V.add(V.mul(o, VEC), V.Num(k)) for k in range(VEC)]
    try:
        loads: dict = {}
        collecting: dict = {}         # its own memo: these texts hold no registers
        for v in g.io.outputs:
            for i in idx:
                _inline(g, arg, v, i, collecting, loads=loads)
        regs, decls = _hoisted_loads(g, arg, loads, names)
        memo: dict = {}
        return {v: [_inline(g, arg, v, i, memo, regs) for i in idx] for v in g.io.outputs}, decls
    except _TooLong:
        return None


def _key(e: V.Expr):
    """An index expression up to the order of its terms."""
    return (frozenset(e.terms), e.const) if isinstance(e, V.Sum) else e


def _split4(e: V.Expr):
    """(base, k) with e = base + k, base a multiple of 4 (every term's coefficient and the constant)
    and non-negative, 0 <= k < 4; None otherwise."""
    if isinstance(e, V.Num):
        return (V.Num(e.v - e.v % VEC), e.v % VEC) if e.v >= 0 else None
    if not isinstance(e, V.Sum) or any(c % VEC for _, c in e.terms):
        return None
    k = e.const % VEC
    base = V._sum(list(e.terms), e.const - k)
    return (base, k) if base.lo >= 0 else None


def _hoisted_loads(g: _Graph, arg: dict, loads: dict, names: Names) -> tuple[dict, list]:
    """Registers loaded ahead of a run's stores, and which loads they serve ((input, index) -> text).
    Only loads every run makes are hoisted (no pad's or cat arm's test on their path: a register
    loads for every run, so a cat's arms in registers would read every arm for every output), and
    only where the index bounds keep the load inside the input for every run.
    - 4 aligned neighbours of an input that the lanes load (a contiguous operand beside a transposed or
      broadcast one, which keeps the run from the float4 schedule): one 4-lane load, a quarter of the
      load instructions.
    - any other: a scalar register. Left in place, a load in a where's arm is a branch around it;
      hoisted, the where is a select, and every load of the run is in flight before the first is
      used (48_Mamba2's masked decay: 1.6 TB/s with its loads in the arms)."""
    vals = g.program.values
    regs: dict = {}
    groups: dict = {}
    decls: list = []
    for (v, key), sure in loads.items():
        if v in g.indices or not sure:
            continue
        e = V._sum(list(key[0]), key[1]) if isinstance(key, tuple) else key
        n = math.prod(vals[v].shape)
        split = _split4(e) if vals[v].dtype in VEC4 else None
        if split and split[0].hi + VEC <= n and \
                all(loads.get((v, _key(V.add(split[0], V.Num(j))))) for j in range(VEC)):
            base, k = split
            if (v, _key(base)) not in groups:
                reg = groups[(v, _key(base))] = names.new(f"{vals[v].name}4")
                t = VEC4[vals[v].dtype]
                decls.append(f"    const {t} {reg} = reinterpret_cast<const {t}*>({arg[v]})"
                             f"[{V.render_expr(V.div(base, VEC), names=arg)}];")
            regs[(v, key)] = f"{groups[(v, _key(base))]}.{'xyzw'[k]}"
        elif 0 <= e.lo and e.hi < n:
            reg = names.new(vals[v].name)
            decls.append(f"    const {c_type(vals[v].dtype, vals[v].name)} {reg} = {arg[v]}[{V.render_expr(e, names=arg)}];")
            regs[(v, key)] = reg
    return regs, decls


def _lambdas(g: _Graph, arg: dict, names: Names, vec: bool, suffix: str = "_at",
             select: bool = False) -> tuple[list[str], dict]:
    """One lambda per value the outputs need, of its flat index (a run's start when vec). select: a
    cat's (stack's) arms are all read, clamped, before its select (views.render_layout_arms)."""
    program, io = g.program, g.io
    vals, nodes = program.values, program.nodes
    fn: dict[str, str] = {}

    def own_type(v):     # each lambda returns its value's own C type (a row kernel's int mask), or
        return VEC4[vals[v].dtype] if vec else c_type(vals[v].dtype, vals[v].name)   # its 4-lane type

    lines = []
    for v in io.inputs:
        if v not in g.need or v in g.indices:    # indices are loaded inside the views' index expressions
            continue
        fn[v] = names.new(vals[v].name + suffix)
        load = f"reinterpret_cast<const {own_type(v)}*>({arg[v]})[i / 4]" if vec else f"{arg[v]}[i]"
        lines.append(f"  auto {fn[v]} = [&](index_t i) -> {own_type(v)} {{ return {load}; }};  // input {vals[v].spec}")

    def call(src, idx):
        return f"{fn[src]}({idx})"

    for nid in io.nodes:
        node = nodes[nid]
        if not any(v in g.need for v in node.outputs):
            continue
        note = f"{node.name}: {node.op}" + (f"({', '.join(f'{k}={a}' for k, a in node.attrs.items())})"
                                          if node.attrs else "")
        if nid in g.windows:
            if nid in g.staged:
                lines += staged_lambda(program, node, fn, names, note, suffix, *g.staged[nid])
            elif pooled_here(program, node):
                lines += _window_lambda(g, node, fn, names, note, suffix)
            else:
                lines += reduce_lambda(program, node, fn, names, note, suffix, g.window_unroll)
            continue
        if node.op in GRAPH_OPS:
            _, outs = g.layouts(node)
            for v, lay in zip(node.outputs, outs):
                if v not in g.need:
                    continue
                fn[v] = names.new(vals[v].name + suffix)
                # a constant (a pad's fill, the NaN where no read is valid) is four lanes of it in float4
                widen = (lambda lit, v=v: _lanes4(vals[v].dtype, [lit] * 4)) if vec else None
                arms = None
                if select and node.op in ("cat", "stack"):
                    ln = Names()
                    ln.taken.update(names.taken | {"i"})
                    arms = V.render_layout_arms(lay, "i", lambda src: math.prod(vals[src].shape), own_type(v),
                                                lambda: ln.new("arm"), names=arg, load=call, literal=widen,
                                                step=VEC if vec else 1)
                lets, expr = arms or ([], V.render_layout(lay, "i", names=arg, load=call, literal=widen))
                lines.append(f"  // {note} -> {vals[v].spec}, read through its view"
                             + (", every arm read before the select" if lets else ""))
                lines.append(f"  auto {fn[v]} = [&](index_t i) -> {own_type(v)} {{ {' '.join(lets + [''])}"
                             f"return {expr}; }};")
            continue
        out = vals[node.outputs[0]]
        ln = Names()
        ln.taken.update(names.taken | {"i"})      # locals never shadow a kernel argument or a lambda
        body, args = [], []
        for u in node.inputs:
            if not u:
                continue
            local = ln.new(vals[u].name)
            idx, _ = V.render_read(_broadcast(vals[u].shape, out.shape).reads[0].stack, "i")
            body.append(f"const {own_type(u)} {local} = {fn[u]}({idx});")
            args.append(local)
        fn[out.id] = names.new(out.name + suffix)
        if vec:
            expr = _lanes4(out.dtype, [render_pointwise(node, [f"{a}.{c}" for a in args]) for c in "xyzw"])
        else:
            expr = render_pointwise(node, args)
        rtype = own_type(out.id)
        lines.append(f"  // {note} -> {out.spec}")
        lines.append(f"  auto {fn[out.id]} = [&](index_t i) -> {rtype} {{ {' '.join(body)} return {expr}; }};")
    return lines, fn


def _walks_window(program: Program, node) -> bool:
    """A pooling window, or a reduction a row kernel's prologue computes as one (reduce_window.py: the
    graph holds one only where view_prologue_nodes put it, before another reduction over its result)."""
    return pooled_here(program, node) or reduced_block(program, node) is not None


def _window_lambda(g: _Graph, node, fn: dict, names: Names, note: str, suffix: str) -> list[str]:
    """A pooling window as a lambda of the pooled value's flat index: its loop over the window calls
    the input's lambda at each element (pointwise ops before the pool are evaluated where the window
    reads them; nothing between goes to memory). Its constants are its own, declared inside it."""
    vals = g.program.values
    x, y = vals[node.inputs[0]], vals[node.outputs[0]]
    if x.dtype != "float32":
        raise CodegenError(f"{node.name} ({node.op}) pools {x.dtype}; a row kernel's prologue pools float32",
                           node_id=node.id)
    consts, body, window = window_code(node, x.shape, y.shape, "i", lambda idx: f"{fn[x.id]}({idx})")
    fn[y.id] = names.new(y.name + suffix)
    return [f"  // {note} -> {y.spec}: {window.describe}",
            f"  auto {fn[y.id]} = [&](index_t i) -> float {{",
            *(f"    {ln}" for ln in consts + body),
            "    return pooled;",
            "  };"]


def graph_source(g, name: str, consts, body, arg, sched: str, notes, marked=(), tag: str = "") -> tuple[str, list]:
    """The kernel file of a layout-graph schedule and the graph's layout ops: the header (the ops, the
    inputs, `tag` after those in `marked`, the outputs, `notes`, the schedule) and one pointer per
    region input and output."""
    program, io = g.program, g.io
    vals, nodes = program.values, program.nodes
    layout_nodes = [nodes[n] for n in io.nodes if nodes[n].op in GRAPH_OPS]
    head = header(program, f"Region {name}: layout graph ({', '.join(n.op for n in layout_nodes)}) with "
                           f"{len(io.nodes) - len(layout_nodes)} pointwise op(s) -> {vals[io.outputs[0]].spec}",
                  io.nodes, [
                      "Inputs:  " + ", ".join(f"{vals[v].name} {vals[v].spec}" + (tag if v in marked else "")
                                              for v in io.inputs),
                      "Outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.outputs),
                      *notes,
                      f"Schedule: {sched}.",
                  ])
    cparams = [f"const {c_type(vals[v].dtype, vals[v].name)}* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"{c_type(vals[v].dtype, vals[v].name)}* __restrict__ {arg[v]}" for v in io.outputs]
    text = "\n".join(body)
    structs = [VEC4_STRUCTS[t] + "\n" for t in VEC4_STRUCTS if re.search(rf"\b{t}\b", text)]
    return kernel_source(head, consts, structs, kernel_name(name), cparams, body), layout_nodes


def generate_layout_graph(program: Program, io: RegionIO, name: str, params: dict | None, kind: str) -> KernelSource:
    vals = program.values
    what = kind.replace("_", "-")
    indices = index_inputs(program, io, what)
    numel = _check(program, io, what, indices)
    g = _Graph(program, io, what, indices)
    for v in g.need:       # pointwise ops may compute bool (a comparison feeding a where)
        c_type(vals[v].dtype, vals[v].name)
    from .layout_tiled import generate_tiled, plan_tiles
    # the shared-memory tiles and staged registers hold floats; other dtypes take the gather below
    floats = all(vals[v].dtype == "float32" for v in g.need)
    # an input read uncoalesced goes through tiles; a pooling window is only ever its lambda
    tiles = plan_tiles(g, params) if floats and not g.windows else None
    if tiles is not None:
        return generate_tiled(g, tiles, name, params, kind, numel)
    # runs of 4 in each value's own 4-lane type (float4, int4, vec4_i64, ...)
    vec = bool((params or {}).get("vector", True)) and _vector_ok(g, numel)
    from .layout_staged import generate_staged, staged_inputs
    staged = [] if vec or not floats or g.windows else staged_inputs(g, numel, params)   # read at the output's index
    if staged:
        return generate_staged(g, staged, name, params, kind, numel)
    # otherwise each thread still stores a run of 4 outputs in one access, computing the 4 from scalar
    # gathers: a warp's k-th loads stay as coalesced as one output per thread, and each thread has 4
    # independent loads in flight instead of 1 (the grid-stride loop holds too few bytes in flight)
    # (a window's output stays one per thread, as the pooling kernel runs it: 4 windows of a pool of a
    # pool unrolled in one thread spilled)
    pack = not vec and not g.windows and bool((params or {}).get("pack", True)) and _pack_ok(g, numel)
    names = Names()
    names.taken.update(("o", "o0", "u", "i", "stride", "kNumel", "kBlock", "kRuns", "kUnroll"))
    arg = {v: names.new(vals[v].name) for v in io.inputs + io.outputs}
    block = int((params or {}).get("block", 256))
    work = numel // VEC if vec or pack else numel
    unroll = int((params or {}).get("unroll", 1))
    # a grid that covers every run, so the loop below runs once per thread (or `unroll` steps): blocks
    # come and go while others load (H100, SwiGLU's gate over 4096 x 22016: 192 -> 182 us against the
    # 8 blocks per SM of a grid-stride loop; GPT-NeoX's partial RoPE: 112 -> 108 us)
    grid = max(1, min(math.ceil(work / (block * unroll)), MAX_GRID_X))
    index_t = index_type(max([numel] + [math.prod(vals[v].shape) for v in io.inputs]))
    consts = [f"typedef {index_t} index_t;", f"constexpr index_t kNumel = {numel};  // output elements"]
    if vec or pack:
        consts.append(f"constexpr index_t kRuns = {work};  // runs of 4 neighbouring output elements")
    limit = "kRuns" if vec or pack else "kNumel"

    def store4(v, value):
        return f"    reinterpret_cast<{VEC4[vals[v].dtype]}*>({arg[v]})[o] = {value};"
    # a packed run's lanes composed down to their loads need no lambdas; the other forms call them
    packed = _packed_lanes(g, arg, work, names) if pack else None
    # a cat whose arms a warp straddles reads them all before its select unless the tuner says not
    # (H100, L2 flushed: GPT-NeoX's partial RoPE 0.108 -> 0.097 ms, LLaMA's 0.0973 -> 0.0964)
    straddles = _straddles(g, VEC if vec or pack else 1)
    select = bool((params or {}).get("select", straddles)) and not packed
    lines, fn = ([], {}) if packed else _lambdas(g, arg, names, vec, select=select)
    if packed:
        lanes, hoisted = packed
        stores = hoisted + [store4(v, _lanes4(vals[v].dtype, lanes[v])) for v in io.outputs]
    elif pack:
        stores = [store4(v, _lanes4(vals[v].dtype, [f"{fn[v]}(o * 4 + {k})" for k in range(VEC)]))
                  for v in io.outputs]
    elif vec:
        stores = [store4(v, f"{fn[v]}(o * 4)") for v in io.outputs]
    else:
        stores = [f"    {arg[v]}[o] = {fn[v]}(o);" for v in io.outputs]
    # several outputs one after another over the grid (the first blocks write the first output, the
    # later ones the next), not side by side in every thread: each output's run is written as its own
    # kernel would write it, from one input's run at a time (a tuning variant)
    in_turn = bool((params or {}).get("in_turn")) and len(io.outputs) > 1 and not packed
    if in_turn:
        grid = max(1, min(math.ceil(work * len(io.outputs) / (block * unroll)), MAX_GRID_X))
        consts.append(f"constexpr int kOutputs = {len(io.outputs)};  // written in turn, kRuns each")
        limit = f"kOutputs * {limit}"
        per_run = "kRuns" if vec or pack else "kNumel"
        stores = ["    const int part = (int)(w / " + per_run + ");",
                  f"    const index_t o = w - (index_t)part * {per_run};",
                  *[f"    {'if' if j == 0 else 'else if'} (part == {j}) {{ {st.strip()} }}" for j, st in enumerate(stores)]]
        names.taken.update(("w", "part", "kOutputs"))
    consts.append(f"constexpr int kBlock = {block};")
    body = ["  // each value the outputs need, as a function of its own flat index (run start when float4)",
            *lines,
            "  const index_t stride = (index_t)gridDim.x * blockDim.x;",
            *_grid_stride(limit, unroll, stores, "w" if in_turn else "o")]
    n_reads = sum(1 for _ in g.reads())
    per_thread = "run of 4" if vec else "run of 4 (4 scalar reads, one 4-lane store)" if pack else "element"
    sched = (f"{'float4 ' if vec else ''}gather over a graph of views, one output {per_thread} per thread, "
             f"{block} threads x {grid} blocks")
    source, layout_nodes = graph_source(
        g, name, consts, body, arg, sched,
        ["Every output element is computed from the region's inputs, read through the views of the layout "
         "ops; nothing in between goes to memory."])
    # each input is read at most once per element of each read of it, never more than all of it
    uses = {}
    for v, _ in g.reads():
        uses[v] = uses.get(v, 0) + 1
    read = sum(min(vals[v].nbytes, uses.get(v, 1) * numel * (vals[v].nbytes // max(1, math.prod(vals[v].shape))))
               for v in io.inputs if v in g.need)
    return KernelSource(
        name=kernel_name(name), kind=kind, source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=(block, 1, 1), schedule=sched,
        params={"tiled": False, "graph": True, "vector": VEC if vec else 1, "pack": pack, "reads": n_reads,
                "unroll": unroll, "in_turn": in_turn, "outputs": len(io.outputs), "select": select,
                "straddles": straddles,
                "grid": grid, "block": block, "chain": [n.op for n in layout_nodes]},
        align=16 if vec or pack else 4,
        bytes_moved=read + sum(vals[v].nbytes for v in io.outputs),
        flops=sum(program.node_flops(n) for n in io.nodes))


def _straddles(g: _Graph, per_lane: int) -> bool:
    """Some cat (stack) of the graph has an arm shorter than a warp's span of output elements, so a warp's
    lanes take different arms (RoPE's halves of a head): the branch between arms then runs each arm's
    loads in turn, where the select form (views.render_layout_arms) issues them all at once."""
    vals = g.program.values
    for nid in g.io.nodes:
        node = g.program.nodes[nid]
        if node.op not in ("cat", "stack") or not any(v in g.need for v in node.outputs):
            continue
        out = vals[node.outputs[0]].shape
        d = int(node.attrs.get("dim", 0)) % len(out)
        inner = math.prod(out[d + 1:])
        pieces = [1] * len(node.inputs) if node.op == "stack" else [vals[u].shape[d] for u in node.inputs if u]
        if any(0 < n * inner < 32 * per_lane for n in pieces):
            return True
    return False


def _grid_stride(limit: str, unroll: int, stores: list, o: str = "o") -> list:
    """The grid-stride loop over `o` < limit around the stores. With unroll > 1, `unroll` steps at a
    time while all of them are inside, as straight-line code (no bounds test between them), so each
    thread has every step's loads in flight at once; the steps left over after that, one at a time."""
    first = "(index_t)blockIdx.x * blockDim.x + threadIdx.x"
    if unroll <= 1:
        return [f"  for (index_t {o} = {first}; {o} < {limit}; {o} += stride) {{", *stores, "  }"]
    return [f"  constexpr int kUnroll = {unroll};  // grid-stride steps per iteration",
            f"  index_t o0 = {first};",
            f"  for (; o0 < {limit} - (kUnroll - 1) * stride; o0 += kUnroll * stride) {{",
            "#pragma unroll",
            "    for (int u = 0; u < kUnroll; ++u) {",
            f"      const index_t {o} = o0 + u * stride;",
            *("  " + line for line in stores),
            "    }",
            "  }",
            f"  for (index_t {o} = o0; {o} < {limit}; {o} += stride) {{", *stores, "  }"]


def tune_variants(params: dict) -> list[dict]:
    """The plain gather's alternatives: one element per thread (the packed run's 4 index computations
    may cost more than its loads in flight gain), two grid-stride steps at a time (48_Mamba2's X
    permuted two ways: 0.63 -> 0.50 ms on the H200; its masked decay 3% slower, a one-element gather
    2x slower with 4), and bigger or smaller blocks."""
    if params.get("tiled") is not False or params.get("staged") or not params.get("graph"):
        return []
    out = [{"pack": False}] if params.get("pack") else []
    if params.get("straddles") and not params.get("pack"):
        out.append({"select": not params.get("select")})     # RoPE's halves: arms read at once, or branched
    if params.get("outputs", 1) > 1 and not params.get("in_turn") and not params.get("pack"):
        out.append({"in_turn": True})        # q's and k's rotations one after the other
    if params.get("pack") or params.get("vector") == VEC:
        out.append({"unroll": 2})
    return out + [{"block": 512}, {"block": 128}]


# --- layout ops in the prologue of a row kernel ---------------------------------------------------

def moves_elements(program: Program, nodes) -> bool:
    """Some node is a layout op with a view that moves elements (not a reshape-like relabel)."""
    return any(program.nodes[n].op in GRAPH_OPS and program.nodes[n].op not in RELABEL_OPS for n in nodes)


def is_layout_op(node) -> bool:
    return node.op in GRAPH_OPS and not is_elementwise(node)


def _windowed(program: Program, io: RegionIO, windows) -> set[str]:
    """The outputs computed through a pooling window: each element walks its window, so a row kernel
    holds them rather than calling their lambda again in every pass."""
    inside, out = set(io.nodes), set()
    for v in io.outputs:
        todo, seen = [v], set()
        while todo:
            nid = program.values[todo.pop()].producer
            if nid in windows:
                out.add(v)
                break
            if nid in inside and nid not in seen:
                seen.add(nid)
                todo += [u for u in program.nodes[nid].inputs if u]
    return out


class ViewPrologue:
    """The prologue of a row kernel (layout, pooling and pointwise ops before its reductions) read
    through views and windows: each value the row kernel needs from it (the reductions' input,
    prologue values that leave the region) is a lambda of its flat index, declared at the top of the
    kernel body, so the row kernel loads it at (row, col) as it would load a tensor. `scalar[v]`
    returns one element, `vector[v]` (when every read keeps aligned runs of 4, as for a layout-graph
    kernel) the float4 run starting at a multiple of 4; `windowed`: the values computed through a
    pooling window (`folded`: through a reduction's window). `staged` window reductions (contiguous
    windows, reduce_window.staged_window) read their results from a tile of the block's windows that
    the row kernel fills first: `staged[node] = (the window input's lambda, tile, first window)`."""

    def __init__(self, program: Program, nodes, arg: dict, names: Names, window_unroll: int = WINDOW_UNROLL,
                 staged=frozenset()):
        io = region_io(program, nodes)
        self.program, self.nodes, self.io = program, list(io.nodes), io
        self.indices = index_inputs(program, io, "row-kernel prologue")
        # any kernel dtype: the row kernel declares its arguments in their own C types, and the scalar
        # lambdas return them (float4 lambdas only where every value is float32)
        numel = _check(program, io, "row-kernel prologue", self.indices, any_dtype=True, one_space=False)
        for v in io.inputs:
            c_type(program.values[v].dtype, f"'{program.values[v].name}'")
        g = _Graph(program, io, "row-kernel prologue", self.indices)
        g.window_unroll = self.window_unroll = window_unroll
        first = names.new("window_first") if staged else None
        g.staged = {n: (names.new(program.values[program.nodes[n].outputs[0]].name + "_tile"), first)
                    for n in g.windows if n in staged}
        lines, fn = _lambdas(g, arg, names, False)
        self.staged = {n: (fn[program.nodes[n].inputs[0]], *g.staged[n]) for n in g.staged}
        self.scalar = {v: fn[v] for v in io.outputs}
        self.vector = {}
        # float4 lambdas for the float32 values the row kernel loads, from the part of the prologue
        # they need (logits reshaped beside their int64 labels, read per row); values inside it may be
        # of any 4-lane type (an int64 attention mask cast per lane)
        f32 = [v for v in io.outputs if program.values[v].dtype == "float32"]
        vg = g if len(f32) == len(io.outputs) else _sub_graph(program, io, f32) if f32 else None
        if vg is not None and _vector_ok(vg, numel):
            vlines, vfn = _lambdas(vg, arg, names, True, "_at4")
            lines += vlines
            self.vector = {v: vfn[v] for v in f32}
        self._lines = lines
        self.windowed = _windowed(program, io, g.windows)
        # those computed through a reduction's window (reduce_window.py): the row kernel's launch follows them
        self.folded = _windowed(program, io, [n for n in g.windows if not pooled_here(program, program.nodes[n])])
        self.extent = max((math.prod(program.values[v].shape) for v in io.inputs), default=0)
        self._g, self._arg = g, arg

    def at(self, v: str, idx: V.Expr) -> str | None:
        """Value v at flat index idx (an Expr over the kernel's variables) composed down to its loads
        (_inline), so a (row, column) index simplifies through the views; None when too long."""
        try:
            return _inline(self._g, self._arg, v, idx, {})
        except _TooLong:
            return None

    def declarations(self, body: list[str], structs: bool = True) -> list[str]:
        """The lambda lines the kernel body calls, directly or through other lambdas (each with the
        comment above it), so an unused one is never declared. With `structs`, the 4-lane structs
        they use (an int64 mask's vec4_i64) are defined first, at function scope, for a kernel that
        emits its structs before it sees these lines."""
        text = "\n".join(body)
        entries, pending, open_ = [], [], False     # (name, comment lines, the lambda's own lines)
        for ln in self._lines:
            m = re.match(r"\s*auto (\w+) = \[&\]", ln)
            if open_:               # a window's lambda spans lines up to its closing "};"
                entries[-1][2].append(ln)
                open_ = ln.strip() != "};"
            elif m:
                entries.append((m.group(1), pending, [ln]))
                pending, open_ = [], ln.rstrip().endswith("{")
            else:
                pending.append(ln)
        keep = []
        for name, comments, own in reversed(entries):     # a lambda only calls those declared before it
            if re.search(rf"\b{name}\b", text):
                keep.append(comments + own)
                text += "\n" + "\n".join(own)
        lines = [ln for lns in reversed(keep) for ln in lns]
        text = "\n".join(lines)
        local = [f"  {VEC4_STRUCTS[t]}" for t in VEC4_STRUCTS if structs and re.search(rf"\b{t}\b", text)]
        return local + lines


def _sub_graph(program: Program, io: RegionIO, outputs) -> _Graph:
    """The graph of the prologue's nodes that `outputs` need."""
    nodes, members, keep = program.nodes, set(io.nodes), set()
    todo = [program.values[v].producer for v in outputs]
    while todo:
        n = todo.pop()
        if n in members and n not in keep:
            keep.add(n)
            todo += [program.values[v].producer for v in nodes[n].inputs if v]
    sub = region_io(program, [n for n in io.nodes if n in keep])
    return _Graph(program, sub, "row-kernel prologue", index_inputs(program, sub, "row-kernel prologue"))


def view_prologue_nodes(program: Program, io: RegionIO) -> list[str]:
    """The layout ops and pooling windows of a row region before its reductions (and reductions
    whose results another one reads as its elements: reduce_window.py) and everything before them in
    it: the part a ViewPrologue renders (empty when the region has none). A layout op after a
    reduction is the row graph's to take (a gather of each row's label, a relabel of per-row values)
    or refuse; a pool after one is refused."""
    nodes = program.nodes
    members = set(io.nodes)
    windows = {n for n in io.nodes if pooled_here(program, nodes[n])} | window_reductions(program, io)
    after: set[str] = set()          # reductions and what reads them, directly or not
    for n in io.nodes:
        if not (is_elementwise(nodes[n]) or is_layout_op(nodes[n]) or n in windows) or \
                any(v and program.values[v].producer in after for v in nodes[n].inputs):
            after.add(n)
    front: set[str] = set()
    todo = [n for n in io.nodes if (is_layout_op(nodes[n]) or n in windows) and n not in after]
    while todo:
        n = todo.pop()
        if n in front:
            continue
        front.add(n)
        todo += [program.values[v].producer for v in nodes[n].inputs
                 if v and program.values[v].producer in members]
    return [n for n in io.nodes if n in front]
