"""nll_loss in the row graph: the label's element of each row, picked as a per-row value.

A class loss's rows are the (sample, position) pairs of logits [N, C, d...] ([N, C], or one row of
[C]); nll_loss reduces the class dim like any reduction of the graph, but instead of folding the row it
reads one element of it: the one at the row's label t. `pick` turns a per-element value into that
per-row value by evaluating its definition at column t: a region input becomes a load at (row, t)
(a `gather` def, guarded: a label outside [0, C) reads nothing and gives NaN, where torch raises),
a value computed per row stays what it is, and a pointwise op is the same op over its picked
operands. So nll_loss of log_softmax(x) is x[t] - lse: one load per row beside the pass that folds
the row's log-sum-exp, never the log-probabilities per element.

Per row: loss = t == ignore_index ? 0 : -w[t] * value[t], weight = t == ignore_index ? 0 : w[t] (w = 1
without a class weight). reduction "none" is the per-row loss; "sum" and "mean" are totals over every
row (rowgraph.row_total): sum(loss), and sum(loss) / sum(weight) for the mean (NaN when every label is
ignored, as torch).
"""
from __future__ import annotations

import re

from ..ir import Program
from .kernel import CodegenError

_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
LABEL_DTYPES = ("int64", "int32")


def nll_op(program: Program, nid: str):
    """The row graph's view of an nll_loss: (state, preamble, expression, preserves rows, reduced
    dims, fold, C type), of which only the dims matter: the class dim, 1 ([N, C, d...]) or 0 ([C])."""
    shape = program.values[program.nodes[nid].inputs[0]].shape
    return None, "", "", False, [0 if len(shape) == 1 else 1], None, "float"


def nll(g, program: Program, node, read, expr_def, names, env) -> None:
    """The nll_loss `node` as per-row values (and totals for sum and mean); CodegenError says what
    does not fit."""
    from .rowgraph import E, R, T, row_total
    vals = program.values
    x, t = node.inputs[:2]
    w = node.inputs[2] if len(node.inputs) > 2 else None
    name = node.name if node.name == node.op else f"{node.name} ({node.op})"
    if vals[x].dtype != "float32" or vals[t].dtype not in LABEL_DTYPES:
        raise CodegenError(f"{name} takes {vals[x].spec} log-probabilities and labels {vals[t].spec}; the row "
                           f"kernel reads float32 values and one int64 or int32 label per row", node_id=node.id)
    if w is not None and w in env:
        raise CodegenError(f"{name} has a class weight computed inside the region; only an input or parameter "
                           f"is read at the label", node_id=node.id)
    src = read(x, E, node)
    label = read(t, R, node)
    if g.defs[src].space != E or g.defs[label].space != R:
        raise CodegenError(f"{name} reads '{vals[x].name}' {list(vals[x].shape)} and labels '{vals[t].name}' "
                           f"{list(vals[t].shape)}, not the rows {list(g.full)} and one label per row",
                           node_id=node.id)
    base = names.new(vals[node.outputs[0]].name)
    value = pick(g, src, label, names, vals)
    # the class weight's element at the label: one load per row however many losses read it
    weight = "1.0f" if w is None else g.picked.get((w, label)) or _gather(g, w, w, label, "class", names, vals)
    ii = f"{int(node.attrs['ignore_index'])}LL"
    # the loss as a select on whether the label counts, so a row whose label is ignored is not read
    # (rowguard.py: its fold's results reach nothing else)
    counts = expr_def(names.new(f"{base}_counts"), R, f"({label} != {ii})", "the label is not ignored", ctype="bool")
    taken = expr_def(names.new(f"{base}_taken"), R, f"-({weight} * {value})", "the label's loss")
    loss = expr_def(names.new(f"{base}_loss"), R, f"({counts} ? {taken} : 0.0f)", "the label's loss (0 where ignored)",
                    vid=node.outputs[0] if node.attrs["reduction"] == "none" else None)
    g.defs[loss].select = (counts, taken, None)
    reduction = node.attrs["reduction"]
    if reduction == "none":
        env[node.outputs[0]] = loss
        return
    total = row_total(g, "sum", loss, node.id, names, f"{name}'s losses")["s"]
    if reduction == "mean":
        wt = expr_def(names.new(f"{base}_weight"), R, f"({counts} ? {weight} : 0.0f)",
                      "the label's weight (0 where ignored)")
        denom = row_total(g, "sum", wt, node.id, names, f"{name}'s weights")["s"]
        total = expr_def(base, T, f"{total} / {denom}", "mean over the weights of the labels not ignored")
    env[node.outputs[0]] = total
    g.defs[total].vid = node.outputs[0]


def after_rows(g, program: Program, node, read, names, env, reductions) -> None:
    """A layout op after the reductions: a gather along the rows of one index per row
    (`log_softmax(x).gather(-1, tokens[..., None])`) is a pick; a relabel of per-row values
    (reshape, squeeze, ...) is the same values in the same order. Anything else is refused."""
    from .layout_graph import RELABEL_OPS
    from .rowgraph import E, R
    vals = program.values
    name = node.name if node.name == node.op else f"{node.name} ({node.op})"
    src, out = node.inputs[0], node.outputs[0]
    if node.op == "gather" and len(node.inputs) == 2:
        index = node.inputs[1]
        keep = tuple(1 if d in g.dims else s for d, s in enumerate(g.full))
        dim = node.attrs["dim"] % max(1, len(vals[src].shape))
        if g.dims == [dim] and tuple(vals[src].shape) == g.full and tuple(vals[index].shape) == keep \
                and vals[index].dtype in LABEL_DTYPES:
            x, t = read(src, E, node), read(index, R, node)
            if g.defs[x].space == E and g.defs[t].space == R:
                env[out] = pick(g, x, t, names, vals)
                g.defs[env[out]].vid = out
                return
    elif node.op in RELABEL_OPS and src in env and g.defs[env[src]].space == R:
        env[out] = env[src]          # a per-row value's flat order is the rows' order
        return
    red = program.nodes[reductions[0]]
    raise CodegenError(f"{name} is a layout op after {red.name} ({red.op}); a row kernel reads layout ops "
                       f"before its reductions, gathers one element of each row and relabels per-row values: "
                       f"split the region there", node_id=node.id)


def pick(g, key: str, label: str, names, vals) -> str:
    """The per-row value of the per-element value `key` at column `label` of each row."""
    from .rowgraph import E, R, Def

    def at(k: str) -> str:
        d = g.defs[k]
        if d.space != E:
            return k            # the same along the row
        if (k, label) in g.picked:
            return g.picked[(k, label)]
        if d.scan is not None:
            raise CodegenError(f"{d.note} would be read at the label; a running value exists in the last pass "
                               f"only: split the region after the scan")
        if d.expr is None:      # a region input: one load at (row, label)
            if d.ctype != "float":
                raise CodegenError(f"'{vals[d.vid].name}' ({vals[d.vid].dtype}) would be read at the label; "
                                   f"the row kernel picks float32 values only")
            return _gather(g, k, d.vid, label, "row", names, vals)
        if re.search(r"\b[ci]\b", d.expr):
            raise CodegenError(f"{d.note or k} depends on the element's position along the row; it is not "
                               f"picked at the label")
        subs = {dep: at(dep) for dep in d.deps}      # a pointwise op: the same op of its picked operands
        expr = _IDENT.sub(lambda m: subs.get(m.group(0), m.group(0)), d.expr)
        deps = list(dict.fromkeys(subs.values()))
        new = names.new(f"{k}_at")
        g.defs[new] = Def(new, R, d.ctype, expr, deps, max((g.defs[k2].round for k2 in deps), default=0),
                          None, f"{d.note}, at the label" if d.note else "at the label")
        g.picked[(k, label)] = new
        return new
    return at(key)


def _gather(g, key: str, vid: str, label: str, kind: str, names, vals) -> str:
    """A per-row load of `vid` at the label (Def.gather), recorded as the pick of `key` there."""
    from .rowgraph import R, Def
    new = names.new(f"{vals[vid].name}_at")
    g.defs[new] = Def(new, R, "float", None, [label], g.defs[label].round, vid, f"'{vals[vid].name}' at the label",
                      gather=(label, kind))
    g.picked[(key, label)] = new
    return new


def gathered(g) -> list:
    """The gather defs of the graph (rendered as guarded loads at the row's label)."""
    return [d for d in g.defs.values() if d.gather is not None]

