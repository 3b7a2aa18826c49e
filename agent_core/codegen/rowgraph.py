"""A small row-level IR for regions that hold several reductions over the same rows (issue #14).

The region's reductions all reduce the same dims of the same shape, seen as [outer, L, inner]: R =
outer * inner rows of L elements. Every value of the region then lives in one of two spaces:

  E  per element: one per (row, column), the reductions' input shape;
  R  per row: one scalar per row (a reduction's result, a pointwise op of such results);
  T  once: a reduction over every element of the rows (KL's batchmean sum after its softmaxes), and
     pointwise ops of such totals. Each row folds its share into the total's state like any step;
     the kernel's last block combines every row's state (codegen/last_block.py). Nothing per row or
     per element reads a T value (that would need every row first).

Pointwise ops over E values may read R values (broadcast along the row); an R value never reads an E
value except through a reduction. Each reduction becomes *steps*: a step folds one E value into a
statistics state of rowstates.STATES (max, sum, Welford, online max-sum-exp, ...) and gives R values
(its state's fields); the op's output is then an E value (softmax, layer_norm: row-preserving) or an
R value (mean, logsumexp) computed from those fields with the reductions' op table (`rowstates.row_op`).

A step's *round* counts the all-reduces that must finish before it can fold: steps of one round fold
in the same pass over the row and share one all-reduce (their states in one struct). With
`two_stage` (the row is held on chip, re-reading it is free) softmax-like states split into the row
max, then the sum of exp(x - max), and Welford into the mean, then the squared deviations: the exact
two-pass numerics. Without it (the row is streamed from memory for every round) they
stay one online state, so a round costs one read of the row.

Definitions are kept in creation order, which is a topological order; a renderer emits only what the
outputs need (`RowGraph.needed`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..ir import Program
from ..ops.common import broadcasts_to
from .cuda import Names, c_type, float_literal, render_pointwise
from .kernel import CodegenError
from .layout_graph import is_layout_op
from .monotone import peel
from .pointwise import is_elementwise, render_chain
from .region_io import RegionIO
from .rowops import NOT_FLOAT, STATES, field_ctype, graph_op
from .rowpick import after_rows, nll, nll_op
from .rowscan import SCAN_OPS, lower_scan, reads_a_scan, scan_op

E, R, T = "E", "R", "T"
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


@dataclass
class Def:
    key: str                 # the C name of the value
    space: str               # E or R
    ctype: str
    expr: str | None         # C expression; None for region inputs (the renderer loads them)
    deps: list[str]          # keys it reads
    round: int               # all-reduces that must finish before it can be computed
    vid: str | None = None   # the program value it is, if any
    note: str = ""
    node: str | None = None  # the pointwise node that computes it (monotone.peel reads its op)
    # a per-row value read from an input at a per-row index (rowpick.py): (the index's key, "row": the
    # element at that column of the row, or "class": that element of a [C] vector)
    gather: tuple[str, str] | None = None
    # value = shift[0] - shift[1], an E value less a per-row one (log_softmax: x - lse), so a sum of it
    # along the row is sum(shift[0]) - kColsF * shift[1], folded in shift[0]'s pass (`_linear_sum`)
    shift: tuple[str, str] | None = None
    # a running value along the row (rowscan.py): (op, the E key scanned, its C names: run, prefix, carry)
    scan: tuple | None = None
    softmax_of: str | None = None   # a streamed softmax's output: the E key of its input (_softmax_dot)
    # where / masked_fill: (the condition's key, the key taken where it holds, the key taken elsewhere;
    # None for masked_fill's scalar), so a load only one arm reads is skipped where it is not taken
    # (rowguard.py)
    select: tuple[str, str | None, str] | None = None


@dataclass
class Step:
    state: str               # a key of rowstates.STATES
    arg: str                 # the E key folded into it
    round: int
    slot: int                # its place in the round's struct (s0, s1, ...)
    fields: list[str]        # the R keys it gives, one per state field
    node: str                # the reduction it belongs to
    total: int | None = None  # a whole-tensor reduction's place in the Totals struct (t0, t1, ...)
    per_row: bool = False     # a total of a per-row value: each row folds that one value (arg is an R key)
    arg2: str | None = None   # the second E key a paired state folds (rowops.PAIRED: softdot's y)

    @property
    def args(self) -> list[str]:
        return [self.arg] if self.arg2 is None else [self.arg, self.arg2]


@dataclass
class RowGraph:
    full: tuple[int, ...]    # the reductions' input shape (the E space)
    dims: list[int]          # the reduced dims (neighbours)
    outer: int
    cols: int
    inner: int
    defs: dict[str, Def] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    inputs: dict[tuple[str, str], str] = field(default_factory=dict)   # (value, space) -> key
    outputs: dict[str, str] = field(default_factory=dict)              # value -> key
    round_vars: dict[int, str] = field(default_factory=dict)           # round -> C name of its state
    reductions: list[str] = field(default_factory=list)
    totals: list[str] = field(default_factory=list)                   # the whole-tensor reductions
    row_totals: list[Step] = field(default_factory=list)   # totals of per-row values (not in any round)
    row_cats: dict = field(default_factory=dict)     # output -> (piece keys, row_cat.RowCat): stored per row
    # per-row inputs broadcast over some rows (a bias over channels of [N, C] rows): their shape
    # aligned to the rows' own shape (`kept`), read at the row's offset through it
    row_views: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # group_norm's rows: every input's shape in the [N, G, C / G, *S] frame (its loads are indexed so)
    framed: dict[str, tuple[int, ...]] = field(default_factory=dict)
    hoisted: list[str] = field(default_factory=list)  # "max of x -> min of mel, then neg, log": monotone.peel
    picked: dict[tuple[str, str], str] = field(default_factory=dict)   # (E key, label key) -> its value there
    scans: list[str] = field(default_factory=list)      # E keys of the running values (rowscan.py)
    row_out_views: dict = field(default_factory=dict)   # per-row output -> layout_store.OutputView it is stored through

    @property
    def rows(self) -> int:
        return self.outer * self.inner

    @property
    def rounds(self) -> int:
        return max((s.round for s in self.steps), default=0)

    def needed(self) -> set[str]:
        """Keys the outputs and the steps need (every reduction of the region folds, used or not)."""
        need: set[str] = set()
        todo = list(self.outputs.values()) + [k for keys, _ in self.row_cats.values() for k in keys] + \
            [k for s in self.steps + self.row_totals for k in s.args] + [self.defs[k].scan[1] for k in self.scans]
        while todo:
            k = todo.pop()
            if k not in need:
                need.add(k)
                todo += self.defs[k].deps
        return need

    def closure(self, keys, space: str, need: set[str], known: frozenset[str] = frozenset()) -> list[Def]:
        """Definitions of `space` that `keys` need (themselves included), in creation order; a `known`
        key (a value kept from an earlier pass) is included without what it was computed from."""
        seen: set[str] = set()
        todo = list(keys)
        while todo:
            k = todo.pop()
            if k in seen:
                continue
            seen.add(k)
            if self.defs[k].space == space and k not in known:
                todo += self.defs[k].deps
        return [d for d in self.defs.values() if d.key in seen and d.space == space and d.key in need]

    def prologue_values(self, need: set[str]) -> list[str]:
        """The per-element values computed from the row's inputs alone (before any all-reduce, no
        running value) that a later pass reads: a step's argument, an output, an operand of a value
        computed after a reduction. A kernel holding the row computes these once and keeps them,
        rather than keeping its inputs and computing them again in every pass (a masked score, a sum
        of gathered embeddings)."""
        early: set[str] = set()
        for d in self.defs.values():      # creation order is a topological order
            if d.key in need and d.space == E and d.round == 0 and d.scan is None and \
                    all(k in early or (self.defs[k].space == R and self.defs[k].round == 0) for k in d.deps):
                early.add(d.key)
        read = {k for s in self.steps for k in s.args} | {self.defs[k].scan[1] for k in self.scans} | \
            set(self.outputs.values())
        read |= {k for d in self.defs.values() if d.key in need and d.key not in early and d.space == E
                 for k in d.deps}
        return [k for k in self.defs if k in early and k in read]


def _strip(shape) -> tuple:
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def _aligned(shape, rank: int) -> tuple:
    """`shape` right-aligned to `rank` dims, as torch broadcasts it: leading 1s added, or dropped
    (broadcasts_to has checked that the dropped ones are 1)."""
    shape = tuple(shape)
    return (1,) * (rank - len(shape)) + shape[max(0, len(shape) - rank):]


def group_frame(program: Program, node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the input's shape [N, C, *S], the same as [N, G, C / G, *S]) of a group_norm / instance_norm:
    its (sample, group) rows are the neighbouring dims 2.. there, and a per-channel weight [C] is the
    view [G, C / G, 1..] of that frame."""
    shape = tuple(program.values[node.inputs[0]].shape)
    groups = node.attrs["num_groups"] if node.op == "group_norm" else shape[1]
    return shape, (shape[0], groups, shape[1] // groups, *shape[2:])


def _name(node) -> str:
    return node.name if node.name == node.op else f"{node.name} ({node.op})"


def lower(program: Program, io: RegionIO, names: Names, two_stage: bool, hoist: bool = True,
          computed: frozenset = frozenset()) -> RowGraph:
    """The row graph of a region whose reductions share their rows; CodegenError names what does not fit.
    With `hoist`, a max or min of a monotone chain folds the chain's input and applies the chain to
    the row's result (codegen/monotone.py). `computed`: inputs a layout prologue computes per element
    (read per element, never per row)."""
    vals, nodes = program.values, program.nodes
    reds = [n for n in io.nodes if not is_elementwise(nodes[n]) and not is_layout_op(nodes[n])]
    if not reds:
        raise CodegenError("the region holds no reduction")
    ops = {}
    params: set[str] = set()
    frame = None          # group_norm's [N, C, *S] seen as [N, G, C / G, *S]: its rows are neighbours there
    for nid in reds:
        if nodes[nid].op == "nll_loss":       # the label's element of each row (rowpick.py)
            ops[nid] = nll_op(program, nid)
            continue
        if nodes[nid].op in SCAN_OPS:         # a running value along the rows (rowscan.py)
            ops[nid] = scan_op(program, nid)
            continue
        state, preamble, expr, preserving, dims, row_len, fold, ctype = graph_op(program, nid)
        if row_len is not None:
            if len(reds) > 1:
                raise CodegenError(f"{_name(nodes[nid])} reduces (sample, group) rows; a kernel of several "
                                   f"reductions shares rows of neighbouring dims only", node_id=nid)
            frame = group_frame(program, nodes[nid])
            dims = list(range(2, len(frame[1])))
            # its weight and bias are per channel: [C] is [G, C / G, 1..] of the frame, not broadcast
            params = {v for v in nodes[nid].inputs[1:] if v is not None}
            if any(v in n.inputs for n in (nodes[m] for m in io.nodes if m != nid) for v in params):
                raise CodegenError(f"the weight or bias of {_name(nodes[nid])} is also read by another op of the "
                                   f"region; split the region", node_id=nid)
        ops[nid] = (state, preamble, expr, preserving, list(dims), fold, ctype)

    def shp(vid) -> tuple[int, ...]:
        """A value's shape in the rows' frame: group_norm's channel dim split into (group, channel)."""
        shape = tuple(vals[vid].shape)
        if frame is None:
            return shape
        orig, framed = frame
        if vid in params:
            return (1, *framed[1:3]) + (1,) * (len(orig) - 2)
        if not broadcasts_to(shape, orig):
            return shape
        pad = _aligned(shape, len(orig))
        return pad[:1] + (framed[1:3] if pad[1] == orig[1] else (1, 1)) + pad[2:]
    # whole-tensor reductions beside reductions over rows: each row folds its share (space T)
    totals = [n for n in reds if ops[n][4] == list(range(len(shp(nodes[n].inputs[0]))))
              and nodes[n].op != "nll_loss" and nodes[n].op not in SCAN_OPS]
    rowwise = [n for n in reds if n not in totals]
    if not rowwise:
        rowwise, totals = reds, []
    first = nodes[rowwise[0]]
    full = shp(first.inputs[0]) or (1,)        # a scalar: one row of one element
    dims = ops[rowwise[0]][4]
    rows_n = math.prod(full[:dims[0]]) * math.prod(full[dims[-1] + 1:])
    for nid in totals:      # over every element of the rows, or over one value per row (a loss per sample)
        if math.prod(vals[nodes[nid].inputs[0]].shape) not in (math.prod(full), rows_n):
            raise CodegenError(f"{_name(nodes[nid])} reduces every element of '{vals[nodes[nid].inputs[0]].name}', "
                               f"which is neither the size of the rows {list(full)} nor one value per row",
                               node_id=nid)
    for nid in rowwise[1:]:
        shape = shp(nodes[nid].inputs[0]) or (1,)
        if (shape, ops[nid][4]) != (full, dims):
            raise CodegenError(f"{_name(first)} and {_name(nodes[nid])} reduce different rows (dims {dims} of "
                               f"{list(full)} vs dims {ops[nid][4]} of {list(shape)}); one kernel shares "
                               f"one set of rows", node_id=nid)
    outer, cols, inner = math.prod(full[:dims[0]]), math.prod(full[d] for d in dims), math.prod(full[dims[-1] + 1:])
    if outer * cols * inner == 0:
        raise CodegenError("the region reduces an empty tensor; there is nothing to launch")
    g = RowGraph(full, dims, outer, cols, inner, reductions=reds, totals=totals)
    if frame is not None:
        g.framed = {v: shp(v) for v in io.inputs}
    numel, rows = math.prod(full), outer * inner
    keep = tuple(1 if d in dims else s for d, s in enumerate(full))           # a per-row value, keepdim
    kept = tuple(s for d, s in enumerate(full) if d not in dims)              # the same without them

    def space_of(vid) -> str:
        """E or R; a value smaller than the rows that broadcasts to them is computed per row when it is
        the same along each row (a scale computed from a parameter), else per element (a mask over the
        heads of [batch, heads, query, key] rows), but never written out (every row would write it)."""
        v, shape = vals[vid], shp(vid)
        n = math.prod(shape)
        if n == numel and _strip(shape) == _strip(full):
            return E
        if n == rows and _strip(shape) in (_strip(keep), _strip(kept)):
            return R
        if vid not in io.outputs and broadcasts_to(shape, keep):
            return R
        if vid not in io.outputs and broadcasts_to(shape, full):
            return E
        raise CodegenError(f"'{v.name}' {list(v.shape)} is neither the rows {list(full)} nor one value per "
                           f"row of them; split the region there")

    def row_view(v, reader) -> tuple[int, ...]:
        """A per-row input's shape in the rows' own coordinates (`kept`), aligned as torch aligns it
        with what `reader` computes: rows kept as [.., 1, ..] (keepdim) or without the reduced dims."""
        out, shape = shp(reader.outputs[0]), shp(v.id)
        if (broadcasts_to(out, keep) or out == full) and broadcasts_to(shape, keep):
            return tuple(s for d, s in enumerate(_aligned(shape, len(full))) if d not in dims)
        if broadcasts_to(out, kept) and broadcasts_to(shape, kept):
            return _aligned(shape, len(kept))
        raise CodegenError(f"{_name(reader)} reads '{v.name}' {list(v.shape)} per row, which broadcasts over "
                           f"neither the rows {list(keep)} nor {list(kept)}", node_id=reader.id)

    def add(d: Def) -> str:
        g.defs[d.key] = d
        return d.key

    def rnd(keys) -> int:
        return max((g.defs[k].round for k in keys), default=0)

    def expr_def(key, space, expr, note="", ctype="float", vid=None, share=False) -> str:
        """A new definition; with `share`, an identical one already there is returned instead (the
        caller then uses the returned key)."""
        if share:
            same = next((d.key for d in g.defs.values() if (d.space, d.ctype, d.expr) == (space, ctype, expr)
                         and d.expr is not None), None)
            if same is not None:
                return same
        deps = [w for w in dict.fromkeys(_IDENT.findall(expr)) if w in g.defs]
        return add(Def(key, space, ctype, expr, deps, rnd(deps), vid, note))

    env: dict[str, str] = {}          # produced value -> key
    along: set[str] = set()           # per-row values expanded along the rows to the E shape

    def read(vid, space: str, reader) -> str:
        """The key of `vid` as `reader` (a node computing in `space`) reads it."""
        v = vals[vid]
        if vid in env:
            k = env[vid]
            have = g.defs[k].space
            if (have == T) != (space == T):
                raise CodegenError(f"{_name(reader)} reads '{v.name}', "
                                   + ("a reduction over every row, per row or per element; that needs every row "
                                      "first: split the region after it" if have == T else
                                      "a per-row or per-element value, with a total; split the region there"),
                                   node_id=reader.id)
            if have == R and space == E and vid not in along and not broadcasts_to(shp(vid), keep):
                raise CodegenError(f"{_name(reader)} broadcasts the per-row value '{v.name}' {list(v.shape)} "
                                   f"across the rows of {list(full)}, not along them; split the region",
                                   node_id=reader.id)
            if have == E and space == R:
                raise CodegenError(f"{_name(reader)} mixes per-element and per-row values; split the region",
                                   node_id=reader.id)
            return k
        n = math.prod(v.shape)
        if space == E and n not in (1, numel) and vid not in computed and vid not in params and \
                broadcasts_to(shp(vid), keep):
            # the same along each row (a conv's per-channel bias before a spatial mean): read once per
            # row, not at every element through a broadcast offset (an int64 divide per element)
            return read(vid, R, reader)
        if space == R and n != 1 and (n != rows or _strip(shp(vid)) not in (_strip(keep), _strip(kept))):
            view = row_view(v, reader)           # every reader must align it with the rows the same way
            if g.row_views.setdefault(vid, view) != view:
                raise CodegenError(f"{_name(reader)} reads '{v.name}' {list(v.shape)} aligned with the rows as "
                                   f"{list(view)}, another op as {list(g.row_views[vid])}; split the region",
                                   node_id=reader.id)
        if (vid, space) not in g.inputs:
            if space == T and n != 1:
                raise CodegenError(f"{_name(reader)} combines a total with '{v.name}' {list(v.shape)}; split the "
                                   f"region there", node_id=reader.id)
            key = names.new(v.name)
            g.inputs[(vid, space)] = add(Def(key, space, c_type(v.dtype, f"'{v.name}'"), None, [], 0, vid))
        return g.inputs[(vid, space)]

    for nid in io.nodes:
        node = nodes[nid]
        if node.op == "nll_loss":
            nll(g, program, node, read, expr_def, names, env)
            continue
        if node.op in SCAN_OPS:
            lower_scan(g, program, node, read, names, env)
            g.scans.append(env[node.outputs[0]])
            continue
        if is_layout_op(node) and node.op != "expand":      # after the reductions (rowpick.after_rows)
            after_rows(g, program, node, read, names, env, reds)
            continue
        if nid in ops:
            _reduction(g, program, node, ops[nid], read, expr_def, names, two_stage and nid not in totals, env,
                       total=nid in totals, hoist=hoist)
            continue
        out = node.outputs[0]
        total_in = [v for v in node.inputs if v and v in env and g.defs[env[v]].space == T]
        if total_in and math.prod(vals[out].shape) != 1:
            raise CodegenError(f"{_name(node)} reads '{vals[total_in[0]].name}', a reduction over every row, per row "
                               f"or per element; that needs every row first: split the region after it", node_id=nid)
        if total_in:
            space = T
        else:
            space = space_of(out)
        local = {v: read(v, space, node) for v in node.inputs if v is not None}
        if node.op == "expand":
            src = vals[node.inputs[0]]
            if g.defs[local[node.inputs[0]]].space == R and space == E:
                if _aligned(shp(src.id), len(full)) != keep:
                    raise CodegenError(f"{_name(node)} broadcasts the per-row value '{src.name}' {list(src.shape)} "
                                       f"across the rows of {list(full)}, not along them; split the region",
                                       node_id=nid)
                along.add(out)         # checked here: readers take it per element
            env[out] = local[node.inputs[0]]
            continue
        lines = render_chain(program, [nid], local, names, indent="")
        key = local[out]
        expr = lines[0].split(" = ", 1)[1].rsplit(";  //", 1)[0]
        # what the expression reads (full_like reads its input's shape only)
        read_here = set(_IDENT.findall(expr))
        deps = [k for k in dict.fromkeys(local[v] for v in node.inputs if v is not None) if k in read_here]
        add(Def(key, space, c_type(vals[out].dtype, f"'{vals[out].name}'"), expr, deps, rnd(deps), out,
                lines[0].rsplit("//", 1)[1].strip(), nid, select=_select(node, local)))
        env[out] = key
    for vid in io.outputs:
        g.outputs[vid] = env[vid]
    return g


def _select(node, local: dict) -> tuple | None:
    """A where's or masked_fill's (condition, taken where it holds, taken elsewhere) keys (Def.select)."""
    if node.op == "where":
        cond, a, b = node.inputs
        return local[cond], local[a], local[b]
    if node.op == "masked_fill":
        x, mask = node.inputs
        return local[mask], None, local[x]
    return None


def _reduction(g: RowGraph, program, node, op, read, expr_def, names: Names, two_stage: bool, env,
               total: bool = False, hoist: bool = True) -> None:
    """Steps, fields and the output of one reduction: its op-table template (rowstates.row_op) with `st.<field>` read from
    this reduction's fields and its locals (inv_sum, rstd, ...) renamed after it. A total folds each
    row into one online state (no two-stage split: those stages are per row); its fields and output
    are T values read from the combined `totals` struct, over kNumelF elements instead of kColsF.
    A max or min whose input is a monotone chain (monotone.peel) folds the chain's input instead, in
    the swapped state for a non-increasing chain, and its field `m` is the chain applied to that
    fold's result: exact, and the per-element work of the chain leaves the reduction's pass."""
    vals = program.values
    state, preamble, expr, preserving, _, fold, ctype = op
    out_dtype = "int64" if state in NOT_FLOAT else "float32"
    for vid, want in [(node.inputs[0], vals[node.inputs[0]].dtype if state == "isum" else "float32"),
                      (node.outputs[0], out_dtype)]:
        if vals[vid].dtype != want:
            raise CodegenError(f"{_name(node)} reduces '{vals[vid].name}' of dtype {vals[vid].dtype}; a row "
                               f"kernel accumulates float32, or int64 for a sum", node_id=node.id)
    src = node.inputs[0]
    if total and (g.defs[env[src]].space == R if src in env else math.prod(vals[src].shape) == g.rows != math.prod(g.full)):
        _row_total(g, program, node, op, read(src, R, node), names, env)
        return
    x = read(src, E, node)
    if g.defs[x].space != E:
        raise CodegenError(f"{_name(node)} reduces a per-row value", node_id=node.id)
    if reads_a_scan(g, x):
        raise CodegenError(f"{_name(node)} reduces a running value, which the row kernel computes in its last "
                           f"pass only; split the region after the scan", node_id=node.id)
    if total and state in NOT_FLOAT:
        raise CodegenError(f"{_name(node)} over every element beside reductions over rows: its index or integer "
                           f"sum does not travel through the float workspace; split the region before it",
                           node_id=node.id)
    base = names.new(vals[node.outputs[0]].name)
    fkey = {f: names.new(f"{base}_{f}") for f in STATES[state][0]}
    # a norm folds a transform of its input (|x|, |x|^p); the op's expression still reads x itself
    folded = x if fold is None else expr_def(names.new(f"{base}_term"), E, _substitute(fold, {}, {}, x, {}),
                                             f"{node.op} term", share=True)
    chain = peel(program, g.defs, x) if hoist and fold is None and state in ("max", "min") else None
    if chain is not None:
        src = vals[g.defs[chain.base].vid].name if g.defs[chain.base].vid else chain.base
        g.hoisted.append(f"{node.op} of '{vals[node.inputs[0]].name}' folds {chain.state(state)} of '{src}', "
                         f"then {chain.describe()}")
        folded, state = chain.base, chain.state(state)

    def m_from(raw: str, space: str) -> None:
        """The field m as the chain of the hoisted fold's result `raw` (one value per row or total)."""
        cur = raw
        for i, n in enumerate(chain.nodes):
            key = fkey["m"] if i == len(chain.nodes) - 1 else names.new(f"{base}_{n.op}")
            cur = expr_def(key, space, render_pointwise(n, [cur], program), f"{n.op} of the {state}: once per "
                           f"{'row' if space == R else 'total'}, not per element (monotone chain)")

    def step(st: str, arg: str, keys: list[str], total: bool = False, share: bool = True,
             arg2: str | None = None) -> list[str]:
        """Fold `arg` (and a paired state's `arg2`) into a state `st`; its fields' keys. The same fold of
        the same value by another reduction of the region (softmax and log_softmax of one row) is
        shared: its keys come back."""
        if share and not total:
            same = next((s for s in g.steps if (s.state, s.arg, s.arg2, s.total) == (st, arg, arg2, None)), None)
            if same is not None:
                return same.fields
        r = max(g.defs[k].round for k in (arg, arg2) if k) + 1
        slot = sum(1 for s in g.steps if s.round == r)
        var = g.round_vars.setdefault(r, names.new(f"round{r}"))
        of = vals[node.inputs[0]].name if chain is None else vals[g.defs[arg].vid].name if g.defs[arg].vid else arg
        for f, k in zip(STATES[st][0], keys):
            g.defs[k] = Def(k, R, field_ctype(st, f), f"{var}.s{slot}.{f}", [], r, None,
                            f"{st} of {of}" + ("" if chain is None else f", before {chain.describe()}"))
        g.steps.append(Step(st, arg, r, slot, keys, node.id, arg2=arg2))
        return keys

    soft = _softmax_dot(g, program, x, expr_def, names) \
        if state == "sum" and fold is None and chain is None and not two_stage else None
    if soft is not None:
        # sum(softmax(t) * (a - b)) = sum(exp(t - m) * a) / sum(exp(t - m)) - b: one online state in t's
        # pass, not a second read of the row after t's statistics (KL divergence, soft-label cross entropy)
        t, a, row_terms = soft
        m, s_sum, w = step("softdot", t, [names.new(f"{base}_{f}") for f in ("m", "s", "w")], arg2=a)
        _subsume_maxsumexp(g, g.steps[-1])
        per_row = f"({m} == INFINITY ? NAN : {w} / {s_sum}{row_terms})"
        note = f"sum of {vals[node.inputs[0]].name} along the row: a softmax-weighted sum, one pass"
        if total:       # every row's share, summed over the rows
            q = expr_def(names.new(f"{base}_row"), R, per_row, note)
            keys = row_total(g, "sum", q, node.id, names, f"'{vals[node.inputs[0]].name}' per row")
            env[node.outputs[0]] = expr_def(base, T, keys["s"] + (" / kNumelF" if node.op == "mean" else ""),
                                            node.op, vid=node.outputs[0])
        else:
            env[node.outputs[0]] = expr_def(base, R, per_row + (" / kColsF" if node.op == "mean" else ""),
                                            note, vid=node.outputs[0])
        return
    if total:
        t = total_count(g)
        step(state, folded, [names.new(f"{base}_row_{f}") for f in STATES[state][0]], total=True)
        g.steps[-1].total = t
        for f in STATES[state][0]:
            k = fkey[f] if chain is None else names.new(f"{base}_raw_{f}")
            g.defs[k] = Def(k, T, "float", f"totals.t{t}.{f}", [], 0, None, f"{state} of {vals[node.inputs[0]].name}"
                            f"{'' if chain is None else ' before ' + chain.describe()}, every row")
        if chain is not None:
            m_from(k, T)
        if preamble.strip() or "[col]" in expr:
            raise CodegenError(f"{_name(node)} over every element needs a per-row preamble; split the region "
                               f"before it", node_id=node.id)
        env[node.outputs[0]] = expr_def(base, T, _substitute(expr, fkey, {}, x, {}).replace("kColsF", "kNumelF"),
                                        node.op, vid=node.outputs[0])
        return
    local: dict[str, str] = {}
    if two_stage and state == "maxsumexp":     # the row max, then the sum of exp(x - max)
        fkey["m"], = step("max", x, [fkey["m"]])
        e = expr_def(names.new(f"{base}_exp"), E, f"expf({x} - {fkey['m']})", share=True)
        fkey["s"], = step("sum", e, [fkey["s"]])
        # softmax's output is that same exp(x - max) times 1 / sum: one def, so a row held in registers
        # computes the exp once (rowkernel keeps it between the passes) rather than again per pass
        expr = expr.replace("expf(xe - st.m)", "xexp")
        local["xexp"] = e
    elif two_stage and state == "welford":     # the mean, then the squared deviations from it
        # not shared with another sum of x (a mean beside the norm): with one mean the compiler sees
        # that x - mean here is the output's x - mean and keeps every held deviation live across the
        # all-reduce instead of computing it again (DINO's column statistics: spills at 32 registers)
        total, = step("sum", x, [names.new(f"{base}_sum")], share=False)
        expr_def(fkey["mean"], R, f"{total} / kColsF", "mean")
        dev = expr_def(names.new(f"{base}_dev"), E, f"{x} - {fkey['mean']}")
        fkey["m2"], = step("sumsq", dev, [fkey["m2"]])
        expr_def(fkey["n"], R, "kColsF")
    elif chain is not None:
        raw, = step(state, folded, [names.new(f"{base}_raw_m")])
        m_from(raw, R)
    elif state == "sum" and fold is None and (lin := _linear_sum(g, program, x, expr_def, names)):
        # sum((e - r) * w) as sum(e * w) - r * sum(w), in e's pass rather than a pass after r (a streamed
        # row is read once less, a held one saves an all-reduce)
        e, r, w = lin
        se, = step("sum", e, [names.new(f"{base}_of_{e}")])
        sw = step("sum", w, [names.new(f"{base}_of_{w}")])[0] if w else "kColsF"
        expr_def(fkey["s"], R, f"{se} - {r} * {sw}", f"sum of {vals[node.inputs[0]].name}, as sums of its "
                 f"parts (one pass)")
    else:
        fkey.update(zip(STATES[state][0], step(state, folded, [fkey[f] for f in STATES[state][0]])))

    for ln in filter(None, (s.strip() for s in preamble.split(";"))):
        m = re.fullmatch(r"const float (\w+) = (.*)", ln)
        local[m.group(1)] = names.new(f"{base}_{m.group(1)}")
        expr_def(local[m.group(1)], R, _substitute(m.group(2), fkey, local, x, {}), m.group(1))
    ports = {}
    for port, vid in zip(node.opdef.port_names[1:], node.inputs[1:]):
        if vid is None:
            continue
        if vid in env:
            raise CodegenError(f"the {port} of {_name(node)} is computed inside the region; only inputs and "
                               f"parameters are supported there", node_id=node.id)
        ports[port.upper()] = read(vid, E, node)
    out = node.outputs[0]
    env[out] = expr_def(base, E if preserving else R, _substitute(expr, fkey, local, x, ports), node.op,
                        ctype=ctype, vid=out)
    if node.op == "log_softmax":     # x - lse: a sum of it along the row needs no pass after lse
        lse = expr_def(names.new(f"{base}_lse"), R, f"{fkey['m']} + {local['log_sum']}", "log-sum-exp")
        g.defs[env[out]].shift = (x, lse)
    if node.op == "softmax" and not two_stage:      # a weighted sum of it can fold in x's pass
        g.defs[env[out]].softmax_of = x


LOG_FLT_MIN = -87.33654475125263    # log of float32's smallest normal: where a softmax underflows


def _softmax_dot(g: RowGraph, program, x: str, expr_def, names: Names):
    """(t, a, row terms) when the E value x is softmax(t) * v with v = a + (per-row values) and t, a
    computed before any reduction: then sum(x) along the row is the softdot state's w / s plus the row
    terms (softmax sums to 1). v is read through adds, subs and negations of log_softmax (x - lse),
    first-pass E values and per-row values; a log_softmax of t itself clamped at or below log(FLT_MIN)
    counts as unclamped: where the clamp acts, softmax(t) is below FLT_MIN and the term underflows
    either way. None otherwise."""
    d = g.defs[x]
    node = program.nodes[d.node] if d.node else None
    if node is None or node.op != "mul" or len(d.deps) != 2:
        return None
    for p_key, v_key in (d.deps, d.deps[::-1]):
        t = g.defs[p_key].softmax_of
        if t is None or g.defs[t].round != 0:
            continue
        terms = _linear_terms(g, program, v_key, t, 1)
        if terms is None:
            continue
        elem, row = terms
        if not elem:
            continue             # a per-row v: sum(p) * v, nothing to gain
        a = elem[0][1] if elem == [(1, elem[0][1])] else expr_def(
            names.new(f"{x}_weighted"), E, " ".join(f"{'+' if k > 0 else '-'} {key}" for k, key in elem).lstrip("+ "),
            "the per-element part of a softmax-weighted sum", share=True)
        return t, a, "".join(f" {'+' if k > 0 else '-'} {key}" for k, key in row)
    return None


def _subsume_maxsumexp(g: RowGraph, soft: Step) -> None:
    """A softdot's m and s are the online softmax state of its x: an existing maxsumexp step of the same
    x in the same round (the softmax's own) reads them instead of folding exp(x - m) again."""
    same = next((s for s in g.steps if s.state == "maxsumexp" and s.arg == soft.arg and s.round == soft.round
                 and s.total is None), None)
    if same is None:
        return
    var = g.round_vars[same.round]
    g.steps.remove(same)
    for s in g.steps:
        if s.round == same.round and s.slot > same.slot:
            s.slot -= 1
            for f, k in zip(STATES[s.state][0], s.fields):
                g.defs[k].expr = f"{var}.s{s.slot}.{f}"
    for f, k in zip(STATES["maxsumexp"][0], same.fields):
        g.defs[k].expr = f"{var}.s{soft.slot}.{f}"


def _linear_terms(g: RowGraph, program, key: str, t: str, sign: int):
    """v (the value at `key`, times sign) as ([(sign, first-pass E key)], [(sign, R key)]), or None."""
    d = g.defs[key]
    if d.space == R:
        return [], [(sign, key)]
    if d.shift is not None and g.defs[d.shift[0]].round == 0:
        return [(sign, d.shift[0])], [(-sign, d.shift[1])]
    node = program.nodes[d.node] if d.node else None
    op = node.op if node is not None else None
    if op in ("add", "sub") and len(d.deps) == 2 and len(node.inputs) == 2:
        first = _linear_terms(g, program, d.deps[0], t, sign)
        second = _linear_terms(g, program, d.deps[1], t, sign if op == "add" else -sign)
        if first is None or second is None or d.deps[0] == d.deps[1]:
            return None
        return first[0] + second[0], first[1] + second[1]
    if op == "neg" and len(d.deps) == 1:
        return _linear_terms(g, program, d.deps[0], t, -sign)
    if op == "max_scalar" and len(d.deps) == 1 and float(node.attrs["value"]) <= LOG_FLT_MIN:
        inner = g.defs[d.deps[0]]
        if inner.shift is not None and inner.shift[0] == t:
            return _linear_terms(g, program, d.deps[0], t, sign)
    if d.round == 0 and d.scan is None:
        return [(sign, key)], []
    return None


def _linear_sum(g: RowGraph, program, x: str, expr_def, names: Names):
    """(e, r, w) when the E value x is e - r or (e - r) * w with r per row and w an operand of the
    first pass (a class weight): then sum(x) = sum(e * w) - r * sum(w) (w None: kColsF * r). None
    otherwise, or when nothing is gained (e itself needs r's round)."""
    d = g.defs[x]
    if d.shift is not None:
        e, r = d.shift
        return (e, r, None) if g.defs[e].round < g.defs[x].round else None
    node = program.nodes[d.node] if d.node else None
    if node is None or node.op != "mul" or len(d.deps) != 2:
        return None
    for a, w in (d.deps, d.deps[::-1]):
        shift, wd = g.defs[a].shift, g.defs[w]
        if shift and wd.space == E and wd.shift is None and wd.round <= g.defs[shift[0]].round < g.defs[x].round:
            e = expr_def(names.new(f"{shift[0]}_times_{w}"), E, f"{shift[0]} * {w}", "a term of a linear sum",
                         share=True)
            return e, shift[1], w
    return None


def total_count(g: RowGraph) -> int:
    """The place of the next total in the Totals struct."""
    return sum(1 for s in g.steps if s.total is not None) + len(g.row_totals)


def row_total(g: RowGraph, state: str, arg: str, node_id: str, names: Names, note: str) -> dict[str, str]:
    """Fold the per-row value `arg` of every row into one total (each row's share is that one value);
    its fields' T keys."""
    t = total_count(g)
    keys = {f: names.new(f"{arg}_total_{f}") for f in STATES[state][0]}
    g.row_totals.append(Step(state, arg, g.defs[arg].round, -1, list(keys.values()), node_id, total=t, per_row=True))
    for f, k in keys.items():
        g.defs[k] = Def(k, T, "float", f"totals.t{t}.{f}", [], 0, None, f"{state} of {note}, every row")
    return keys


def _row_total(g: RowGraph, program, node, op, x: str, names: Names, env) -> None:
    """A reduction over every row of a per-row value (the sum or mean of a loss per sample)."""
    state, preamble, expr = op[:3]
    if state in NOT_FLOAT or preamble.strip() or "[col]" in expr:
        raise CodegenError(f"{_name(node)} over every row of a per-row value is generated for float sums, "
                           f"means, max and min only; split the region before it", node_id=node.id)
    fkey = row_total(g, state, x, node.id, names, f"'{program.values[node.inputs[0]].name}'")
    base = names.new(program.values[node.outputs[0]].name)
    g.defs[base] = Def(base, T, "float", _substitute(expr, fkey, {}, x, {}).replace("kColsF", float_literal(g.rows)),
                       list(fkey.values()), 0, node.outputs[0], node.op)
    env[node.outputs[0]] = base


_TEMPLATE_WORD = re.compile(r"\bst\.(\w+)|\b([A-Z]+)\[col\]|\b(\w+)\b")


def _substitute(expr: str, fkey, local, x, ports) -> str:
    """An op-table template (rowstates.row_op) in this graph's names, in one pass (so a key never gets renamed twice):
    st.<field> -> the field's key, WEIGHT[col] -> the port's E key, xe -> x, a preamble local -> its key."""
    def word(m):
        if m.group(1):
            return fkey[m.group(1)]
        if m.group(2):
            return ports[m.group(2)]
        w = m.group(3)
        return x if w == "xe" else local.get(w, w)
    return _TEMPLATE_WORD.sub(word, expr)
