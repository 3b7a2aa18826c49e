"""Class losses as one kernel: log_softmax over the class dim, the nll_loss terms that gather from it,
sums of (class-weighted) log-probabilities over the classes, per-row pointwise ops and the loss's
reduction, in one launch that reads every logit once and never writes the log-probabilities.

This is what cross_entropy's lowering (rewrites/lowering.py) writes, label smoothing included, what a
program that calls log_softmax then nll_loss itself holds, and a lone nll_loss over log-probabilities
computed elsewhere (the chain without its log_softmax step). Rows are the (sample, position)
pairs: the input [N, C, d1, ...] (or [N, C], or [C]) is viewed as [N, C, D]; element c of row
r = n * D + s sits at (n * C + c) * D + s.

  per row: online max and sum of exp(x - max) over the row (log-sum-exp), plus for each sum over the
      classes sum_c w_c x_c (and sum_c w_c) so that sum_c w_c logp_c = sum_c w_c x_c - lse * sum_c w_c;
      the label's log-probability is gathered by index (x[t] - lse) after the per-row label ops
      (`where(mask == 1, labels, -100)`); ignore_index contributes nothing, a class outside [0, C)
      gives NaN (torch raises) and nothing is read out of bounds. Then the row's pointwise ops.
  schedules: without a log_softmax or a sum over the classes (a lone nll_loss) no row is walked: one
      thread per row gathers its label's element. Otherwise classes innermost (D == 1): 4..512 lanes
      per row (about two steps each) stream it, float4 when C % 4 == 0; classes on dim 1 with D > 1:
      one thread per row walks the classes, neighbouring threads on neighbouring positions (coalesced). Each step loads kUnroll vectors per lane before
      folding any (loads in flight) and folds them with one max, one rescale and one exp per element
      (fold_lse): the per-element online update (a branch, up to two exps) was compute-bound at a
      third of the memory floor on 32k vocabularies.
  the reduction: values summed over every row (nll_loss's sum / mean and its weights, sum and mean of
      row values) are reduced per block in a fixed order into a workspace; the last block to finish
      (codegen/last_block.py) combines the blocks' partials in a fixed order and evaluates the scalar
      ops after them (the mean's division): deterministic, one launch.

Every region holding an nll_loss comes here. Anything else in the region is refused with the node that
does not fit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..analysis.cost import is_view
from ..ir import Program
from ..ops.common import norm_dim, norm_dims
from .cuda import VEC4, Names, c_type, float_literal, header, index_type, kernel_name, kernel_source
from .kernel import CodegenError, KernelSource
from .last_block import publish_and_arrive, reset_counter
from .pointwise import is_elementwise, render_chain
from .region_io import RegionIO

DEFAULTS = {"block": 256, "threads_per_row": None, "vector_width": 4, "unroll": None}
WARP = 32
KERNEL_LOCALS = ("group", "lane", "row", "active", "base", "c0", "st", "State", "combine", "row_reduce",
                 "block_sum", "warp_sum", "partial", "workspace", "counters", "last", "lse", "leader", "acc",
                 "total", "point", "xe", "t", "w", "sample", "pos", "k", "gi", "x", "u", "c", "e", "fold_lse")


@dataclass
class _Nll:
    node: str
    source: str            # "logp" (x[t] - lse), "const" (a full_like's fill) or "input" (a tensor of log-probabilities)
    fill: float = 0.0
    target: str = ""       # value id of the class indices (row space)
    weight: str | None = None
    slots: tuple = ()      # accumulator slots (loss, weight) for sum / mean


@dataclass
class _ClassSum:
    node: str
    weight: str | None     # class-weight input (a [C] vector through views), or None
    of_logp: bool          # sum of log-probabilities (else of the row's own values)


@dataclass
class _Plan:
    shape: tuple
    cd: int
    samples: int
    classes: int
    inner: int
    x_src: str                                    # the full-space value the rows are made of
    anchor: str | None = None                     # the log_softmax node
    alias: dict = field(default_factory=dict)     # view output -> the value it relabels
    space: dict = field(default_factory=dict)     # value id -> full | logp | wlogp | const | row | scalar
    prologue: list = field(default_factory=list)  # full-space pointwise nodes (evaluated per element)
    row_nodes: list = field(default_factory=list)  # per-row work in topological order
    scalar_nodes: list = field(default_factory=list)
    nll: dict = field(default_factory=dict)
    sums: dict = field(default_factory=dict)
    whole: dict = field(default_factory=dict)     # whole-tensor sum / mean node -> its slot
    class_weight: dict = field(default_factory=dict)  # wlogp value -> weight input
    fills: dict = field(default_factory=dict)     # const value -> fill
    slots: int = 0

    @property
    def rows(self) -> int:
        return self.samples * self.inner


def _refuse(program, nid, why):
    n = program.nodes[nid]
    raise CodegenError(f"{n.name} ({n.op}) {why}", node_id=nid)


def _class_dims(program: Program, io: RegionIO):
    """(full shape, class dim, anchor): from the log_softmax when there is one, else the first nll_loss."""
    nodes = program.nodes
    anchors = [n for n in io.nodes if nodes[n].op == "log_softmax"]
    if len(anchors) > 1:
        raise CodegenError("a class-loss region holds at most one log_softmax; this one has "
                           + ", ".join(nodes[n].name for n in anchors))
    if anchors:
        a = nodes[anchors[0]]
        shape = tuple(program.values[a.inputs[0]].shape)
        return shape, norm_dim(a.attrs["dim"], len(shape)), a.id
    nll = next(n for n in io.nodes if nodes[n].op == "nll_loss")
    shape = tuple(program.values[nodes[nll].inputs[0]].shape)
    return shape, 0 if len(shape) == 1 else 1, None


def analyse(program: Program, io: RegionIO) -> _Plan:
    vals, nodes = program.values, program.nodes
    shape, cd, anchor = _class_dims(program, io)
    samples, classes, inner = math.prod(shape[:cd]), shape[cd], math.prod(shape[cd + 1:])
    if classes * samples * inner == 0:
        raise CodegenError(f"the class loss over {list(shape)} is empty; there is nothing to launch")
    if classes < 2:   # a row of one class is as large as the rows: the logits and the labels look alike
        raise CodegenError(f"the class loss over {list(shape)} has one class; a row of one logit cannot be "
                           "told apart from a per-row value")
    full, rows = samples * classes * inner, samples * inner
    pl = _Plan(shape, cd, samples, classes, inner, x_src="", anchor=anchor)
    sp, alias = pl.space, pl.alias

    def src(v):
        return alias.get(v, v)

    def space_of(v):
        v = src(v)
        if v in sp:
            return sp[v]
        n = math.prod(vals[v].shape)          # a region input: by its size
        return {full: "full_in", rows: "row_in", 1: "one"}.get(n, "other")

    for nid in io.nodes:
        node = nodes[nid]
        out = node.outputs[0] if len(node.outputs) == 1 else None
        ins = [v for v in node.inputs if v is not None]
        if out is None:
            _refuse(program, nid, "has several outputs; the class-loss kernel computes one value per op")
        if is_view(program, nid):
            alias[out] = src(node.inputs[0])
            continue
        spaces = [space_of(v) for v in ins]
        if node.op == "log_softmax":
            if spaces[0] not in ("full", "full_in"):
                _refuse(program, nid, "does not read the rows of the class loss")
            pl.x_src = src(node.inputs[0])
            sp[out] = "logp"
        elif node.op == "nll_loss":
            _nll(program, pl, nid, spaces, src)
            sp[out] = "row" if node.attrs["reduction"] == "none" else "scalar"
        elif node.op in ("sum", "mean"):
            _reduction(program, pl, nid, spaces, src)
            sp[out] = "row" if nid in pl.sums else "scalar"
        elif is_elementwise(node):
            n_out = math.prod(vals[out].shape)
            if node.op in ("full_like", "zeros_like", "ones_like") and n_out == full:
                pl.fills[out] = {"zeros_like": 0.0, "ones_like": 1.0}.get(node.op, node.attrs.get("fill_value"))
                sp[out] = "const"
                continue
            if "logp" in spaces and node.op == "mul" and n_out == full:
                w = ins[spaces.index("logp") ^ 1] if len(ins) == 2 else None   # as broadcast ([C, 1, 1])
                if w is None or space_of(w) == "logp" or src(w) in sp or not _class_vector(program, w, shape, cd):
                    _refuse(program, nid, "multiplies the log-probabilities by something other than a "
                                          "per-class weight; the kernel never forms them per element")
                pl.class_weight[out] = src(w)
                sp[out] = "wlogp"
                continue
            if any(s in ("logp", "wlogp", "const", "other") for s in spaces):
                _refuse(program, nid, f"reads {_what(spaces)}; the class-loss kernel takes pointwise ops on "
                                      "the logits, on the rows' values, and on the scalars after the reduction")
            if "scalar" in spaces:
                space = "scalar"
            elif "row" in spaces:
                space = "row"
            elif "full" in spaces or (n_out == full and "row_in" not in spaces):
                space = "full"
            elif n_out == rows:
                space = "row"
            elif n_out == 1:
                space = "scalar"
            else:
                _refuse(program, nid, f"loops over {n_out} elements, neither the {full} logits nor the "
                                      f"{rows} rows of the class loss")
            if space == "full" and ("row_in" in spaces or "row" in spaces):
                _refuse(program, nid, "mixes the logits with per-row values")
            if space == "row" and any(s in ("full", "full_in") for s in spaces):
                _refuse(program, nid, "mixes per-row values with the logits")
            if space == "scalar" and any(s not in ("scalar", "one") for s in spaces):
                _refuse(program, nid, "mixes the loss's reduced value with per-row values")
            sp[out] = space
            {"full": pl.prologue, "row": pl.row_nodes, "scalar": pl.scalar_nodes}[space].append(nid)
        else:
            _refuse(program, nid, "is not part of a class loss (log_softmax, nll_loss, sums over the classes, "
                                  "pointwise ops)")
    if not pl.nll:
        raise CodegenError("the region holds no nll_loss; it is not a class loss")
    if not pl.x_src:
        srcs = {src(nodes[n].inputs[0]) for n, e in pl.nll.items() if e.source == "input"}
        srcs |= {src(nodes[n].inputs[0]) for n, s in pl.sums.items() if not s.of_logp}
        if len(srcs) > 1:
            raise CodegenError("the region's nll_loss and sums read different tensors of log-probabilities; "
                               "one kernel walks one set of rows")
        pl.x_src = srcs.pop() if srcs else ""
    _check_outputs(program, io, pl)
    return pl


def _what(spaces):
    return {"logp": "the log-probabilities", "wlogp": "the weighted log-probabilities", "const": "a filled tensor",
            "other": "a tensor broadcast over neither the logits nor the rows"}[
        next(s for s in spaces if s in ("logp", "wlogp", "const", "other"))]


def _class_vector(program, v, shape, cd) -> bool:
    """v holds C values lined up with the class dim ([C] for [N, C], [C, 1, 1] for [N, C, H, W])."""
    s = tuple(program.values[v].shape)
    if math.prod(s) != shape[cd]:
        return False
    pad = (1,) * (len(shape) - len(s)) + s
    return len(pad) == len(shape) and all(d == 1 for i, d in enumerate(pad) if i != cd)


def _nll(program, pl: _Plan, nid, spaces, src):
    node = program.nodes[nid]
    vals = program.values
    x, t = node.inputs[0], node.inputs[1]
    w = node.inputs[2] if len(node.inputs) > 2 else None
    if tuple(vals[x].shape) != pl.shape or (pl.cd != (0 if len(pl.shape) == 1 else 1)):
        _refuse(program, nid, f"reads {list(vals[x].shape)} with classes on its dim "
                              f"{0 if len(vals[x].shape) == 1 else 1}, not the rows of the class loss "
                              f"({list(pl.shape)}, classes on dim {pl.cd})")
    kind = {"logp": "logp", "const": "const", "full_in": "input", "full": "input"}.get(spaces[0])
    if kind is None or (kind == "input" and pl.anchor is not None):
        _refuse(program, nid, "reads log-probabilities the kernel does not compute from the same rows")
    labels = ("row", "row_in", "one") if pl.rows == 1 else ("row", "row_in")   # a [C] input has one label
    if spaces[1] not in labels or vals[t].dtype not in ("int64", "int32"):
        _refuse(program, nid, f"takes class indices '{vals[t].name}' {vals[t].spec}; the kernel reads one "
                              "int64 or int32 index per row")
    if w is not None and src(w) in pl.space:
        _refuse(program, nid, "has a class weight computed inside the region")
    e = _Nll(nid, kind, float(pl.fills.get(src(x), 0.0)), t, src(w) if w else None)
    if node.attrs["reduction"] != "none":
        e.slots = tuple(range(pl.slots, pl.slots + (2 if node.attrs["reduction"] == "mean" else 1)))
        pl.slots += len(e.slots)
    pl.nll[nid] = e
    pl.row_nodes.append(nid)


def _reduction(program, pl: _Plan, nid, spaces, src):
    node = program.nodes[nid]
    x = node.inputs[0]
    rank = len(program.values[x].shape)
    dims = norm_dims(node.attrs.get("dim"), rank)
    if spaces[0] in ("logp", "wlogp", "full", "full_in") and dims == [pl.cd] and node.op == "sum":
        if tuple(program.values[x].shape) != pl.shape:
            _refuse(program, nid, "sums a tensor that is not the rows of the class loss")
        if spaces[0] in ("full", "full_in") and pl.anchor is not None:
            _refuse(program, nid, "sums the logits themselves next to a log_softmax; only sums of the "
                                  "log-probabilities are generated here")
        pl.sums[nid] = _ClassSum(nid, pl.class_weight.get(src(x)), spaces[0] in ("logp", "wlogp"))
        pl.row_nodes.append(nid)
    elif spaces[0] in ("row", "row_in") and dims == list(range(rank)):
        pl.whole[nid] = pl.slots
        pl.slots += 1
        pl.row_nodes.append(nid)
    else:
        _refuse(program, nid, "is neither a sum over the classes nor a sum / mean over every row")


def _check_outputs(program, io, pl: _Plan):
    vals = program.values
    for v in io.outputs:
        s = pl.space.get(pl.alias.get(v, v))
        if s in ("logp", "wlogp", "full", "const"):
            raise CodegenError(f"'{vals[v].name}' {vals[v].spec} is used outside the region; the class-loss "
                               "kernel writes per-row values and the reduced loss, never a value per logit "
                               "(split the region there)")


# --- rendering ----------------------------------------------------------------------------------
def generate_class_loss(program: Program, io: RegionIO, name: str, params: dict | None = None) -> KernelSource:
    p = {**DEFAULTS, **(params or {})}
    vals, nodes = program.values, program.nodes
    pl = analyse(program, io)
    C, D, rows = pl.classes, pl.inner, pl.rows
    full = rows * C
    index_t = index_type(full)
    names = Names()
    names.taken.update(KERNEL_LOCALS)
    arg = {v: names.new(vals[v].name) for v in io.inputs + io.outputs}
    ct = {v: c_type(vals[v].dtype, f"'{vals[v].name}'") for v in io.inputs + io.outputs}
    for v in io.outputs:
        if vals[v].dtype != "float32" and pl.space.get(pl.alias.get(v, v)) == "scalar":
            raise CodegenError(f"'{vals[v].name}' is a reduced {vals[v].dtype}; the loss sums float32")
    src = lambda v: pl.alias.get(v, v)  # noqa: E731

    # the element of the rows (the prologue applied), by flat index
    need_walk = pl.anchor is not None or bool(pl.sums)
    pro_in = [v for v in io.inputs if any(src(u) == v for n in pl.prologue for u in nodes[n].inputs if u)]
    if pl.x_src and pl.x_src in io.inputs and pl.x_src not in pro_in:
        pro_in.insert(0, pl.x_src)
    for v in pro_in:
        if math.prod(vals[v].shape) not in (full, 1):
            raise CodegenError(f"'{vals[v].name}' {vals[v].spec} is broadcast over the logits; the class-loss "
                               "prologue reads full-size tensors and single values")
    pn = Names()
    penv = {v: pn.new(vals[v].name) for v in pro_in}
    plines = _chain(program, pl.prologue, penv, pn, pl.alias)
    point = ("// The rows' element: the prologue over the logits at one index.\n"
             f"__device__ __forceinline__ float point({', '.join(f'{ct[v]} {penv[v]}' for v in pro_in)}) {{\n"
             + "".join(ln + "\n" for ln in plines) + f"  return {penv[pl.x_src] if pl.x_src else '0.0f'};\n}}\n") if pl.x_src else ""

    def load(v, idx):
        return f"{arg[v]}[{idx}]" if math.prod(vals[v].shape) > 1 else f"{arg[v]}[0]"

    def point_at(idx):
        return f"point({', '.join(load(v, idx) for v in pro_in)})"

    # schedule: kUnroll vectors per lane in flight, then one online step over them (see fold_lse);
    # a region that only gathers the label's log-probability (a lone nll_loss) walks no row: a thread per row
    vec = 4 if (p["vector_width"] == 4 and D == 1 and C % 4 == 0 and need_walk) else 1
    unroll = int(p["unroll"] or (4 if vec == 4 else 8)) if need_walk else 1
    if unroll < 1 or unroll > 16:
        raise CodegenError(f"unroll must be 1..16 vectors per step, got {unroll}")
    if D > 1 or not need_walk:
        tpr = 1
    elif p.get("threads_per_row"):
        tpr = int(p["threads_per_row"])
        if tpr & (tpr - 1) or not 4 <= tpr <= 1024:
            raise CodegenError(f"threads_per_row must be a power of two from 4 to 1024, got {tpr}")
    else:
        # about two steps per lane; at most 512 lanes, so several blocks of a long row share an SM
        tpr = 1 << max(2, min(9, math.ceil(math.log2(max(1, math.ceil(C / (vec * unroll * 2)))))))
    block = max(int(p["block"]), tpr)
    rows_per_block = block // tpr
    grid = math.ceil(rows / rows_per_block)

    # row statistics: (m, s) for the log-sum-exp, (a_k, b_k) for each sum over the classes
    sums = list(pl.sums.values())
    fields = (["m", "s"] if pl.anchor else []) + [f for k, cs in enumerate(sums)
                                                  for f in ([f"a{k}"] + ([f"b{k}"] if cs.weight and cs.of_logp else []))]
    folds = []                     # sums over the classes, one element xe at a time (its weight wc{k})
    for k, cs in enumerate(sums):
        if cs.weight:
            folds.append(f"st.a{k} = fmaf(wc{k}, xe, st.a{k});" + (f" st.b{k} += wc{k};" if cs.of_logp else ""))
        else:
            folds.append(f"st.a{k} += xe;")
    helpers = []
    if fields:
        comb = []
        if pl.anchor:
            comb += ["  const float m = max_nan(a.m, b.m);",
                     "  r.m = m;",
                     "  r.s = m == -INFINITY ? 0.0f : (a.m == m ? a.s : a.s * expf(a.m - m)) + (b.m == m ? b.s : b.s * expf(b.m - m));"]
        comb += [f"  r.{f} = a.{f} + b.{f};" for f in fields if f not in ("m", "s")]
        helpers.append(
            "// Row statistics: online max and sum of exp(x - max); sums over the classes.\n"
            f"struct State {{ float {', '.join(fields)}; }};\n"
            "__device__ __forceinline__ State combine(State a, State b) {\n  State r;\n"
            + "\n".join(comb) + "\n  return r;\n}\n")
        if pl.anchor:
            # a branch and up to two exps per element made the per-element online update compute-bound
            helpers.append(
                "// One online step over a lane's kStep elements: one max over them, one rescale of the sum,\n"
                "// one exp per element, no branch. An infinite max uses 0 as the shift (no inf - inf).\n"
                "__device__ __forceinline__ void fold_lse(State& st, const float (&x)[kStep]) {\n"
                "  float m = st.m;\n"
                "#pragma unroll\n"
                "  for (int k = 0; k < kStep; ++k) m = fmaxf(m, x[k]);  // a NaN still reaches s through its exp\n"
                "  const float shift = fabsf(m) == INFINITY ? 0.0f : m;\n"
                "  float s = st.s * expf(st.m - shift);\n"
                "#pragma unroll\n"
                "  for (int k = 0; k < kStep; ++k) s += expf(x[k] - shift);\n"
                "  st.m = m;\n  st.s = s;\n}\n")
        if tpr > 1:
            helpers.append(
                "// All-reduce across the kThreadsPerRow lanes of a row (xor shuffles; then shared memory past a warp).\n"
                "__device__ __forceinline__ State row_reduce(State a) {\n"
                "#pragma unroll\n"
                "  for (int offset = kShuffleStart; offset > 0; offset >>= 1) {\n    State b;\n"
                + "".join(f"    b.{f} = __shfl_xor_sync(0xffffffffu, a.{f}, offset);\n" for f in fields)
                + "    a = combine(a, b);\n  }\n"
                + ("  __shared__ State partial[kBlock / kWarpSize];\n"
                   "  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;\n"
                   "  if (lane == 0) partial[warp] = a;\n  __syncthreads();\n"
                   "  const int first = threadIdx.x / kThreadsPerRow * (kThreadsPerRow / kWarpSize);  // this row's warps\n"
                   "  a = partial[first];\n"
                   "  for (int k = 1; k < kThreadsPerRow / kWarpSize; ++k) a = combine(a, partial[first + k]);  // fixed order\n"
                   if tpr > WARP else "")
                + "  return a;\n}\n")
    if pl.slots:
        helpers.append(
            "// Sum over the block in a fixed order (deterministic): warps, then the per-warp partials.\n"
            "__device__ __forceinline__ float block_sum(float v) {\n"
            "  __shared__ float partial[kBlock / kWarpSize];\n"
            "  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;\n"
            "#pragma unroll\n"
            "  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);\n"
            "  __syncthreads();  // an earlier call has read its partials\n"
            "  if (lane == 0) partial[warp] = v;\n  __syncthreads();\n"
            "  v = 0.0f;\n"
            "  for (int k = 0; k < kBlock / kWarpSize; ++k) v += partial[k];\n"
            "  return v;\n}\n")
    if point:
        helpers.append(point)

    # the kernel body
    body = ["  const int group = threadIdx.x / kThreadsPerRow, lane = threadIdx.x % kThreadsPerRow;",
            "  const index_t row = (index_t)blockIdx.x * kRowsPerBlock + group;",
            "  const bool active = row < kRows;  // inactive lanes still join the shuffles and block sums"]
    if D > 1:
        body.append("  const index_t base = row / kInner * (kClasses * kInner) + row % kInner;  // class c at base + c * kInner")
        step = "kInner"
    else:
        body.append("  const index_t base = row * kClasses;")
        step = "1"
    wts = [(k, cs.weight) for k, cs in enumerate(sums) if cs.weight]
    if fields and need_walk:
        body.append("  State st;")
        body += [f"  st.{f} = {'-INFINITY' if f == 'm' else '0.0f'};" for f in fields]
        lanes = "xyzw" if vec == 4 else [None]
        body += ["  for (int c0 = lane * kVec; active && c0 < kClasses; c0 += kThreadsPerRow * kStep) {"]
        if pl.anchor:
            body.append("    float x[kStep];  // this step's elements, every load issued before the step folds; -inf past the row")
        body += ["#pragma unroll",
                 "    for (int u = 0; u < kUnroll; ++u) {",
                 "      const int c = c0 + u * kThreadsPerRow * kVec;",
                 "      if (c < kClasses) {"]
        if vec == 4:
            for v in pro_in:
                if math.prod(vals[v].shape) > 1:
                    body.append(f"        const {VEC4[vals[v].dtype]} {arg[v]}4 = reinterpret_cast<const "
                                f"{VEC4[vals[v].dtype]}*>({arg[v]} + base + c)[0];")
            for k, w in wts:
                body.append(f"        const float4 wc{k}4 = reinterpret_cast<const float4*>({arg[w]} + c)[0];")
        idx = f"base + (index_t)c * {step}" if D > 1 else "base + c"
        for j, e in enumerate(lanes):
            if e is None:
                px = point_at(idx)
                wl = [f"const float wc{k} = {arg[w]}[c];" for k, w in wts]
            else:
                px = "point(" + ", ".join(f"{arg[v]}4.{e}" if math.prod(vals[v].shape) > 1 else f"{arg[v]}[0]"
                                          for v in pro_in) + ")"
                wl = [f"const float wc{k} = wc{k}4.{e};" for k, _ in wts]
            if not folds:
                body.append(f"        x[u * kVec + {j}] = {px};")
                continue
            body.append("        {")
            body += [f"          {ln}" for ln in wl]
            body.append(f"          const float xe = {px};")
            if pl.anchor:
                body.append(f"          x[u * kVec + {j}] = xe;")
            body += [f"          {ln}" for ln in folds]
            body.append("        }")
        if pl.anchor:
            body += ["      } else {",
                     "#pragma unroll",
                     "        for (int e = 0; e < kVec; ++e) x[u * kVec + e] = -INFINITY;"]
        body += ["      }", "    }"]
        if pl.anchor:
            body.append("    fold_lse(st, x);")
        body.append("  }")
        if tpr > 1:
            body.append("  st = row_reduce(st);")
    acc_names = [f"acc{k}" for k in range(pl.slots)]
    if acc_names:
        body.append(f"  float {', '.join(f'{a} = 0.0f' for a in acc_names)};  // this row's share of the loss's sums")
    body.append("  if (active && lane == 0) {")
    if pl.anchor:
        body.append("    const float lse = st.m + logf(st.s);  // log-sum-exp of the row")
    rn = Names()
    rn.taken.update(KERNEL_LOCALS, arg.values())
    renv = {}
    row_out = [v for v in io.outputs if pl.space.get(src(v)) == "row"]
    scalar_out = [v for v in io.outputs if pl.space.get(src(v)) == "scalar"]
    for v in io.inputs:
        if v not in pro_in or math.prod(vals[v].shape) == rows:
            renv[v] = load(v, "row") if math.prod(vals[v].shape) in (rows, 1) else None
    stat = {cs.node: k for k, cs in enumerate(sums)}
    for nid in pl.row_nodes:
        node = nodes[nid]
        out = node.outputs[0]
        ident = rn.new(vals[out].name)
        if nid in pl.nll:
            e = pl.nll[nid]
            t = renv[src(e.target)]
            gidx = f"base + t * {step}" if D > 1 else "base + t"
            term = {"logp": f"{point_at(gidx)} - lse", "const": float_literal(e.fill), "input": point_at(gidx)}[e.source]
            wt = f"{arg[e.weight]}[t]" if e.weight else "1.0f"
            ii = int(node.attrs["ignore_index"])
            body += [f"    float {ident}, {ident}_w;  // {node.name}: -weight[t] * logp[t] and the weight it counts",
                     "    {",
                     f"      const long long t = (long long){t};",
                     f"      if (t == {ii}LL) {{ {ident} = 0.0f; {ident}_w = 0.0f; }}  // ignore_index",
                     f"      else if (t < 0 || t >= kClasses) {{ {ident} = NAN; {ident}_w = NAN; }}  // torch raises; read nothing",
                     f"      else {{ {ident}_w = {wt}; {ident} = -{ident}_w * ({term}); }}",
                     "    }"]
            for slot, what in zip(e.slots, (ident, f"{ident}_w")):
                body.append(f"    acc{slot} = {what};")
        elif nid in pl.sums:
            k, cs = stat[nid], pl.sums[nid]
            if cs.of_logp:
                b = f"st.b{k}" if cs.weight else "kClassesF"
                body.append(f"    const float {ident} = st.a{k} - lse * {b};  // {node.name}: sum over the classes")
            else:
                body.append(f"    const float {ident} = st.a{k};  // {node.name}: sum over the classes")
        elif nid in pl.whole:
            body.append(f"    acc{pl.whole[nid]} = {renv[src(node.inputs[0])]};  // into {node.name}")
            continue
        else:
            body += _chain(program, [nid], renv, rn, pl.alias, indent="    ")
            continue
        renv[out] = ident
    for v in row_out:
        body.append(f"    {arg[v]}[row] = {renv[src(v)]};")
    body.append("  }")

    cparams = [f"const {ct[v]}* __restrict__ {arg[v]}" for v in io.inputs] + \
              [f"{ct[v]}* __restrict__ {arg[v]}" for v in io.outputs]
    workspace = []
    if pl.slots:
        cparams += ["float* __restrict__ workspace", "unsigned int* __restrict__ counters"]
        workspace = [("float32", grid * pl.slots), ("int32", 1)]
        body += [f"  {a} = block_sum({a});" for a in acc_names]
        body += ["  // publish this block's sums; the last block to arrive adds every block's, in block order"]
        body += publish_and_arrive([f"workspace[blockIdx.x * kSlots + {k}] = {a};" for k, a in enumerate(acc_names)],
                                   "counters[0]", "gridDim.x")
        body += ["  if (!last) return;", "  __threadfence();"]
        for k, a in enumerate(acc_names):
            body += [f"  {a} = 0.0f;",
                     f"  for (unsigned int b = threadIdx.x; b < gridDim.x; b += kBlock) {a} += __ldcg(workspace + b * kSlots + {k});",
                     f"  {a} = block_sum({a});"]
        body.append("  if (threadIdx.x != 0) return;")
        senv = {}
        for nid, e in pl.nll.items():
            if e.slots:
                out = nodes[nid].outputs[0]
                senv[out] = (f"(acc{e.slots[0]} / acc{e.slots[1]})" if len(e.slots) == 2 else f"acc{e.slots[0]}")
        for nid, k in pl.whole.items():
            senv[nodes[nid].outputs[0]] = f"acc{k}" if nodes[nid].op == "sum" else f"(acc{k} / kRowsF)"
        for v in io.inputs:
            if math.prod(vals[v].shape) == 1:
                senv.setdefault(v, f"{arg[v]}[0]")
        sn = Names()
        sn.taken.update(KERNEL_LOCALS, arg.values())
        body += ["  // the loss: mean divides by the summed weights of the rows not ignored (all ignored: 0 / 0 = NaN, as torch)"]
        body += _chain(program, pl.scalar_nodes, senv, sn, pl.alias)
        body += [f"  {arg[v]}[0] = {senv[src(v)]};" for v in scalar_out]
        body.append(reset_counter("counters[0]"))
    elif scalar_out:
        raise CodegenError("the region's reduced outputs need a sum over the rows the kernel does not hold")

    consts = [f"typedef {index_t} index_t;",
              f"constexpr index_t kRows = {rows};  // (sample, position) pairs: one class distribution each",
              f"constexpr long long kClasses = {C};",
              f"constexpr float kClassesF = {float_literal(C)};",
              f"constexpr float kRowsF = {float_literal(rows)};",
              f"constexpr index_t kInner = {D};  // positions per sample; class c of a row is kInner apart",
              f"constexpr int kVec = {vec};",
              f"constexpr int kThreadsPerRow = {tpr};",
              f"constexpr int kUnroll = {unroll};  // vectors per lane loaded before a step folds them",
              "constexpr int kStep = kVec * kUnroll;",
              f"constexpr int kRowsPerBlock = {rows_per_block};",
              "constexpr int kBlock = kThreadsPerRow * kRowsPerBlock;",
              f"constexpr int kShuffleStart = {min(tpr, WARP) // 2};",
              f"constexpr int kWarpSize = {WARP};"]
    if pl.slots:
        consts.append(f"constexpr int kSlots = {pl.slots};  // sums over every row, per block in the workspace")
    layout = ("classes innermost" if D == 1 else f"classes on dim {pl.cd}, {D} positions per sample")
    if not need_walk:
        sched = f"one thread per row gathers its label's element, {rows_per_block} rows per block, {grid} blocks"
    else:
        sched = (f"{tpr} lanes per row, {rows_per_block} rows per block" if D == 1 else
                 f"one thread per row, {rows_per_block} rows per block, coalesced over positions")
        sched += f", {'float4' if vec == 4 else 'scalar'} loads, {unroll} in flight, {grid} blocks"
    if pl.slots:
        sched += f"; {pl.slots} sum(s) over the rows, the last block combines"
    what = ("log_softmax + " if pl.anchor else "") + ", ".join(
        f"nll_loss ({nodes[n].attrs['reduction']})" for n in pl.nll) + (
        f", {len(sums)} sum(s) over the classes" if sums else "")
    head = header(program, f"Region {name}: class loss over {rows} rows of {C} classes: {what}", io.nodes, [
        "Inputs:  " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.inputs),
        "Outputs: " + ", ".join(f"{vals[v].name} {vals[v].spec}" for v in io.outputs),
        f"Rows of {list(pl.shape)} ({layout}), "
        f"{'each read once' if need_walk else 'each read at its label only'}; schedule: {sched}.",
        "A class index outside [0, C) (torch raises) gives NaN instead of reading out of bounds.",
    ])
    body = _drop_unused(body)
    source = kernel_source(head, consts, helpers, kernel_name(name), cparams, body)
    if block == 1024:   # as rowreduce: else ptxas aims for two such blocks per SM (32 registers) and spills
        source = source.replace("__launch_bounds__(kBlock)", "__launch_bounds__(kBlock, 1)", 1)
    # the memory floor: each input and output once, except that rows which are not walked are read at
    # their label's element only
    nbytes = sum(rows * vals[v].nbytes // full if not need_walk and v in pro_in and math.prod(vals[v].shape) == full
                 else vals[v].nbytes for v in io.inputs + io.outputs)
    return KernelSource(
        name=kernel_name(name), kind="class_loss", source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=(block, 1, 1), schedule=sched,
        params={"threads_per_row": tpr, "rows_per_block": rows_per_block, "vector_width": vec, "unroll": unroll, "block": block,
                "grid": grid, "walks_rows": need_walk}, align=16 if vec == 4 else 8, bytes_moved=nbytes,
        flops=sum(program.node_flops(n) for n in io.nodes), workspace=workspace)


def _chain(program, order, env, names, alias, indent="  "):
    """render_chain over pointwise nodes, views as the value they relabel."""
    lines = []
    for nid in order:
        node = program.nodes[nid]
        for v in node.inputs:
            if v is not None and v not in env and v in alias and alias[v] in env:
                env[v] = env[alias[v]]
        lines += render_chain(program, [nid], env, names, indent)
    for v, s in alias.items():
        if v not in env and s in env:
            env[v] = env[s]
    return lines


def _drop_unused(body: list[str]) -> list[str]:
    """Drop the declarations of base and lse when nothing reads them (a region of filled terms only)."""
    import re
    text = "\n".join(body)
    for name in ("lse", "base"):
        if len(re.findall(rf"\b{name}\b", text)) == 1:
            body = [ln for ln in body if not re.search(rf"\bconst \S+ {name} = ", ln)]
    return body


def tune_variants(params: dict) -> list[dict]:
    """Launch parameters to time besides the default schedule `params` (a KernelSource's params):
    lanes per row (waves of a few long rows against blocks per SM) and vectors in flight."""
    tpr, unroll = params.get("threads_per_row", 1), params.get("unroll", 4)
    if not params.get("walks_rows", True):   # a label's element gathered per row: rows per block only
        cands = [{"block": 128}, {"block": 512}]
    elif tpr == 1:                   # classes on dim 1: a thread per row, rows per block and loads in flight
        cands = [{"block": 128}, {"block": 512}, {"unroll": max(1, unroll // 2)}, {"unroll": min(16, unroll * 2)}]
    else:
        cands = [{"threads_per_row": t} for t in (tpr * 2, tpr // 2) if 4 <= t <= 1024]
        cands += [{"unroll": u} for u in (unroll // 2, unroll * 2) if 1 <= u <= 16 and u * tpr >= 8]
    return [c for c in cands if any(params.get(k) != v for k, v in c.items())]
