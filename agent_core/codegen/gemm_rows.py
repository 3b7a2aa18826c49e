"""Row reductions of a tile GEMM's output inside the GEMM kernel (codegen/gemm_mma.py): sum, mean,
max, min, prod, logsumexp, var and std over the output's last dim (N), after the pointwise epilogue,
and pointwise ops over the row results, so GEMM -> LSE / softmax statistics / norm statistics need no
second pass over the [M, N] output (which is then not written at all unless the program reads it).

A region after the GEMM splits into three phases (split_epilogue):
- full: pointwise ops over the GEMM's [..., N] elements (bias, activations, residuals), evaluated
  on the accumulators as before; the values the program reads are stored;
- reductions: each reads a full value and reduces its last dim; every element of a thread's
  accumulator tile is folded into the row's statistics state (rowstates.STATES: a sum, a max, the
  online max and sum of exponentials, Welford's mean and M2) as it is computed;
- rows: pointwise ops over the row results (and inputs broadcast to the rows), evaluated once per row.
A pointwise op that reads both a row result and the full elements (a written-out softmax's x - max)
needs the rows finished before the elements: that is a second pass, and the region is refused.

A normalising op (NORMS: layer_norm, rms_norm, softmax, log_softmax over the last dim) is that second
pass done inside the kernel where a CTA holds whole rows (block_n >= N, rows up to MAX_WHOLE_ROW; the
tiles of gemm_mma.whole_row_params): its statistics fold as a reduction's do, each accumulator is
overwritten with the element it normalises, the CTA's combined row states go to shared memory, and a
second loop over the accumulators applies the op (rowstates.row_op's expression) and the pointwise
ops after it (`after`, which may read the normalised values, that element and the region's inputs),
storing only what the program reads. GEMM -> residual add -> LayerNorm, a transformer sublayer's end,
is one kernel.

Combining a row's states, in a fixed order (the same bits however the CTAs were scheduled):
1. the 4 lanes that hold a fragment row (xor shuffles 1, 2);
2. the warps along N of the CTA, through shared memory (the pipeline's buffers, free by then), in
   warp order;
3. with several N tiles, either
   - the row tile's CTAs are one thread-block cluster (sm_90's TMA loop, up to CLUSTER_MAX CTAs): each
     puts its tile's states in its shared memory, and after a cluster barrier every CTA reads all of
     them (distributed shared memory) and combines them in tile order, so each holds the rows' states
     and a normalising op's second pass runs over its own accumulators, as with whole rows; the first
     CTA of the row tile evaluates the row ops and stores them;
   - or each CTA writes its tile's state per row to a workspace and counts in on its row tile's ticket
     (codegen/last_block.py); the last CTA of the row tile combines the states in tile order, evaluates
     the row ops, stores and resets the ticket (graph replays need no memset). A normalising op's inputs
     then go through the workspace too, and that last CTA normalises every element of the rows.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..ir import Program
from ..ops.common import norm_dims
from .cuda import Names, c_type
from .kernel import CodegenError
from .last_block import publish_and_arrive, reset_counter
from .pointwise import is_elementwise, iteration_space, operand_views, render_chain
from .region_io import BroadcastIndex, RegionIO
from .rowops import STATES

REDUCTIONS = ("sum", "mean", "max", "min", "prod", "logsumexp", "var", "std")
NORMS = ("softmax", "log_softmax", "layer_norm", "rms_norm")    # a row's statistics applied to its elements
# ops that give the same elements in the same order a new shape: inside the epilogue, where they keep
# the last dim (the GEMM's columns), they relabel a value and cost nothing (relabels)
RELABELS = ("reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "contiguous")
MAX_WHOLE_ROW = 1024     # the widest row a CTA holds in its accumulators for a normalising op
CLUSTER_MAX = 8          # the portable thread-block cluster size: the most CTAs that share rows as a cluster
# names of the row phase's C code that value names must not take
LOCALS = ("rs", "red", "st", "RowSt", "row_identity", "row_combine", "row_shfl", "row_put", "row_get", "row_get_cg",
          "workspace", "counters", "last", "h", "t", "w", "rrow", "kF", "kColsF", "kNTiles", "tile_st")


@dataclass
class RowReduce:
    node: str
    state: str          # rowstates.STATES key
    expr: str           # the result over the state, written over `st`
    input: str          # the full value reduced
    output: str


@dataclass
class RowNorm:
    """A normalising op over the GEMM's rows (NORMS): its statistics' state, folded like a reduction's,
    and the expression that applies them to each element in the second pass (rowstates.row_op)."""
    node: str
    state: str
    pre: str                 # per-row preamble over `st` (rstd, inv_sum, ...)
    expr: str                # the element's result over xe, st, the preamble, WEIGHT[col], BIAS[col]
    input: str
    output: str
    weight: str | None = None
    bias: str | None = None


@dataclass
class RowPart:
    reductions: list[RowReduce]
    post: list[str]                     # pointwise nodes over the row results
    space: tuple                        # the row results' iteration space (M elements)
    values: set = field(default_factory=set)   # values computed per row
    norms: list[RowNorm] = field(default_factory=list)
    after: list[str] = field(default_factory=list)       # pointwise nodes over the norms' results
    after_values: set = field(default_factory=set)       # values of the second pass, per element

    @property
    def states(self) -> list[str]:
        """Every state a row's RowSt holds: the reductions', then the norms' (s0, s1, ... in this order)."""
        return [r.state for r in self.reductions] + [n.state for n in self.norms]

    @property
    def fields(self) -> list[tuple[int, str]]:
        """(state index, state field) of every float a row's combined state holds."""
        return [(k, f) for k, st in enumerate(self.states) for f in STATES[st][0]]


def split_epilogue(program: Program, io: RegionIO, gemm: str, out: str, space: tuple,
                   halves: tuple = ()) -> tuple[list[str], RowPart | None]:
    """(pointwise nodes over the GEMM's elements (or over its two halves, values of `space`), the row
    part or None); CodegenError for a node that belongs to neither (a column reduction, a second pass
    over the elements, a non-pointwise op)."""
    from .rowstates import row_op
    vals, nodes = program.values, program.nodes
    full_vals, row_vals, after_vals = {out, *halves}, set(), set()
    full, post, reds, norms, after = [], [], [], [], []
    for nid in io.nodes:
        if nid == gemm:
            continue
        node = nodes[nid]
        here = [v for v in node.inputs if v is not None and v in io.produced]
        if node.op in RELABELS and _same_rows(vals[node.outputs[0]].shape, space):
            # the MHA out-projection's [L * B, E] viewed as [L, B, E] before the residual add
            for group, values in ((full, full_vals), (after, after_vals)):
                if node.inputs[0] in values:
                    group.append(nid)
                    values.update(node.outputs)
                    break
            else:
                raise CodegenError(f"{node.name} ({node.op}) relabels '{vals[node.inputs[0]].name}', which is "
                                   f"neither the GEMM's elements nor a normalised value", node_id=nid)
            continue
        if is_elementwise(node):
            kept = {n.input for n in norms}    # the one full value the second pass still holds
            if here and all(v in full_vals for v in here):
                full.append(nid)
                full_vals.update(node.outputs)
            elif here and all(v in row_vals for v in here):
                post.append(nid)
                row_vals.update(node.outputs)
            elif here and any(v in after_vals for v in here) and all(v in after_vals | kept for v in here):
                after.append(nid)
                after_vals.update(node.outputs)
            elif here:
                raise CodegenError(f"{node.name} ({node.op}) reads a row result and the GEMM's elements together: "
                                   f"a second pass over the output after its rows are reduced (the tile GEMM "
                                   f"reduces rows as it stores them)", node_id=nid)
            else:
                raise CodegenError(f"{node.name} ({node.op}) reads nothing the GEMM computes", node_id=nid)
            continue
        if node.op in NORMS:
            norms.append(_norm(program, io, nid, full_vals, space))
            after_vals.update(node.outputs)
            continue
        if node.op not in REDUCTIONS:
            raise CodegenError(f"{node.name} ({node.op}) is neither pointwise, a row reduction "
                               f"({', '.join(REDUCTIONS)}) nor a normalising op ({', '.join(NORMS)}); the tile "
                               f"GEMM fuses those after it", node_id=nid)
        x = node.inputs[0]
        if x not in full_vals:
            raise CodegenError(f"{node.name} ({node.op}) reduces '{vals[x].name}', which is not computed from the "
                               f"GEMM's elements in this region", node_id=nid)
        dims = norm_dims(node.attrs.get("dim"), len(vals[x].shape))
        if not _same_rows(vals[x].shape, space) or dims != [len(vals[x].shape) - 1]:
            raise CodegenError(f"{node.name} ({node.op}) reduces dims {dims} of {list(vals[x].shape)}; the tile "
                               f"GEMM reduces the output's last dim (its rows) only", node_id=nid)
        if vals[x].dtype != "float32":
            raise CodegenError(f"{node.name} ({node.op}) reduces {vals[x].dtype} values; float32 only", node_id=nid)
        state, _pre, expr, _keeps, _dims, _len = row_op(program, nid)
        reds.append(RowReduce(nid, state, expr, x, node.outputs[0]))
        row_vals.update(node.outputs)
    for nid in full + after:
        shape = vals[nodes[nid].outputs[0]].shape
        if math.prod(shape) != math.prod(space):
            raise CodegenError(f"the ops after {nodes[gemm].name} broadcast its output {list(space)} to "
                               f"{list(shape)}; the tile GEMM stores its own tile only")
    ins = [v for n in full + after for v in nodes[n].inputs if v is not None and v not in io.produced]
    for v, shape in operand_views(program, full + after, ins).items():
        operand_shape(shape, space)           # each is indexed over the GEMM's output, or refused here
    if len({n.input for n in norms}) > 1:
        raise CodegenError("normalising ops over two different values of the GEMM's elements: the second "
                           "pass holds one (" + ", ".join(nodes[n.node].name for n in norms) + ")")
    if norms and halves:
        raise CodegenError("a normalising op after a gated unit's halves is not fused")
    if not reds and not norms:
        return full, None
    rows = math.prod(space[:-1])
    if not reds:
        return full, RowPart([], [], (rows,), set(), norms, after, after_vals)
    rspace = tuple(vals[reds[0].output].shape)
    if post:
        rspace = iteration_space(program, RegionIO(post, [], [], set()))
    for v in [r.output for r in reds] + [o for n in post for o in nodes[n].outputs]:
        if math.prod(vals[v].shape) != rows:
            raise CodegenError(f"'{vals[v].name}' {vals[v].spec} is not one value per row of the GEMM's "
                               f"{list(space)} output")
    if math.prod(rspace) != rows:
        raise CodegenError(f"the ops after the row reductions broadcast to {list(rspace)}, not the "
                           f"{rows} rows")
    return full, RowPart(reds, post, tuple(rspace), row_vals, norms, after, after_vals)


def _same_rows(shape, space: tuple) -> bool:
    """A value of `shape` holds the GEMM output's elements in the same order: as many, the same last dim."""
    return math.prod(shape) == math.prod(space) and len(shape) > 0 and shape[-1] == space[-1]


def operand_shape(shape, space: tuple) -> tuple:
    """The shape an epilogue operand is indexed with over the GEMM's output `space`: its own where it
    broadcasts there, else space itself where it has the output's elements in its order (an operand of
    the ops after a relabel: the residual [L, B, E] against the GEMM's [L * B, E]); CodegenError else."""
    own = tuple(shape)
    while len(own) > len(space) and own[0] == 1:
        own = own[1:]
    padded = (1,) * (len(space) - len(own)) + own
    if len(own) <= len(space) and all(a in (1, b) for a, b in zip(padded, space)):
        return own
    if _same_rows(own, space):
        return tuple(space)
    raise CodegenError(f"an operand of {list(shape)} does not line up with the GEMM's {list(space)} output "
                       f"after its relabel")


def operand_loads(program: Program, io: RegionIO, order: list[str], space: tuple, index: str, arg: dict[str, str],
                  names: Names, env: dict[str, str], relabelled: bool = False,
                  coords: dict[int, str] | None = None) -> list[str]:
    """C lines loading each region input the nodes of `order` read, at flat index `index` of `space`
    (broadcast operands through BroadcastIndex), each named in env. relabelled: an operand may hold the
    GEMM output's elements in another shape (operand_shape). coords: C expressions of some dims'
    coordinates the caller already has (a tile's row and column): an operand that spans only those dims
    is read at them, without dividing the flat index (a convolution's per-channel bias at its column)."""
    vals = program.values
    ins = [v for v in io.inputs if any(v in program.nodes[n].inputs for n in order)]
    views = operand_views(program, order, ins)
    shapes = [views.get(v, vals[v].shape) for v in ins]
    seen = [operand_shape(sh, space) for sh in shapes] if relabelled else shapes
    bidx = BroadcastIndex(space, seen)
    lines = []
    for k, vid in enumerate(ins):
        plain = coords and tuple(seen[k]) == tuple(shapes[k])
        at = _at_coords(shapes[k], space, coords) if plain else None
        if at is None:
            at = "0" if bidx.is_scalar(k) else bidx.offset_expr(
                k, index, [str(s) for s in bidx.sizes], [str(s) for s in bidx.inner], [str(s) for s in bidx.strides[k]])
        ident = names.new(vals[vid].name)
        lines.append(f"const {c_type(vals[vid].dtype, vals[vid].name)} {ident} = {arg[vid]}[{at}];")
        env[vid] = ident
    return lines


def _at_coords(shape, space: tuple, coords: dict[int, str]) -> str | None:
    """An operand's offset from the coordinates of the dims it spans, where coords has them all (it
    broadcasts to `space` as is); None otherwise."""
    if len(shape) > len(space):
        return None
    padded = (1,) * (len(space) - len(shape)) + tuple(shape)
    spans = [d for d, n in enumerate(padded) if n != 1]
    if not spans or any(d not in coords or padded[d] != space[d] for d in spans):
        return None
    strides = [math.prod(padded[d + 1:]) for d in range(len(padded))]
    return " + ".join(f"({coords[d]})" + (f" * {strides[d]}" if strides[d] != 1 else "") for d in spans)


def _norm(program: Program, io: RegionIO, nid: str, full_vals: set, space: tuple) -> RowNorm:
    """The normalising op `nid` over the GEMM's rows; CodegenError where the second pass cannot apply it."""
    from .rowstates import row_op
    vals, node = program.values, program.nodes[nid]
    x = node.inputs[0]
    if x not in full_vals:
        raise CodegenError(f"{node.name} ({node.op}) normalises '{vals[x].name}', which is not computed from "
                           f"the GEMM's elements in this region", node_id=nid)
    state, pre, expr, _keeps, dims, _len = row_op(program, nid)
    if not _same_rows(vals[x].shape, space) or dims != [len(vals[x].shape) - 1] or vals[x].dtype != "float32":
        raise CodegenError(f"{node.name} ({node.op}) normalises dims {dims} of {vals[x].spec}; the tile GEMM "
                           f"normalises float32 rows of its output's last dim only", node_id=nid)
    if space[-1] > MAX_WHOLE_ROW:
        raise CodegenError(f"{node.name} ({node.op}) normalises rows of {space[-1]}: a CTA holds whole rows of "
                           f"at most {MAX_WHOLE_ROW} in its accumulators", node_id=nid)
    ports = [v for v in node.inputs[1:3] if v] if node.op in ("layer_norm", "rms_norm") else []
    for v in ports:
        if v in io.produced or tuple(vals[v].shape) != (space[-1],):
            raise CodegenError(f"{node.name} ({node.op}): its parameter '{vals[v].name}' {vals[v].spec} is not "
                               f"one value per column read from memory", node_id=nid)
    weight = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] and ports else None
    bias = node.inputs[2] if node.op == "layer_norm" and len(node.inputs) > 2 and node.inputs[2] else None
    return RowNorm(nid, state, pre, expr, x, node.outputs[0], weight, bias)


def state_code(part: RowPart) -> list[str]:
    """Device helpers: each state's struct / identity / fold / combine (rowkernel._state_code), and
    RowSt, every reduction's state of one row, with its identity, combine, shuffle, store and loads."""
    from .rowkernel import _state_code
    states = part.states
    kinds = list(dict.fromkeys(states))
    code = [_state_code(k) for k in kinds]
    members = " ".join(f"St_{st} s{k};" for k, st in enumerate(states))
    fl = part.fields
    code.append(
        "// one row's statistics: " + ", ".join(f"{st} (s{k})" for k, st in enumerate(states)) + "\n"
        f"struct RowSt {{ {members} }};\n"
        "__device__ __forceinline__ RowSt row_identity() { return RowSt{"
        + ", ".join(f"identity_{st}()" for st in states) + "}; }\n"
        "__device__ __forceinline__ RowSt row_combine(RowSt a, RowSt b) {\n"
        + "".join(f"  a.s{k} = combine_{st}(a.s{k}, b.s{k});\n" for k, st in enumerate(states))
        + "  return a;\n}\n"
        "__device__ __forceinline__ RowSt row_shfl(RowSt a, int offset) {\n"
        + "".join(f"  a.s{k}.{f} = __shfl_xor_sync(0xffffffffu, a.s{k}.{f}, offset);\n" for k, f in fl)
        + "  return a;\n}\n"
        "__device__ __forceinline__ void row_put(float* p, const RowSt& a) {\n"
        + "".join(f"  p[{n}] = a.s{k}.{f};\n" for n, (k, f) in enumerate(fl)) + "}\n"
        "__device__ __forceinline__ RowSt row_get(const float* p) {\n  RowSt a;\n"
        + "".join(f"  a.s{k}.{f} = p[{n}];\n" for n, (k, f) in enumerate(fl)) + "  return a;\n}\n"
        "// from L2: another CTA's state, published before its ticket\n"
        "__device__ __forceinline__ RowSt row_get_cg(const float* p) {\n  RowSt a;\n"
        + "".join(f"  a.s{k}.{f} = __ldcg(p + {n});\n" for n, (k, f) in enumerate(fl)) + "  return a;\n}\n")
    return "\n".join(code).splitlines()


def fold_lines(part: RowPart, env: dict[str, str]) -> list[str]:
    """Inside the epilogue's per-element loop: the element folded into its row's states."""
    inputs = [r.input for r in part.reductions] + [n.input for n in part.norms]
    return [f"fold_{st}(rs[mt][j >> 1].s{k}, {env[x]});" for k, (st, x) in enumerate(zip(part.states, inputs))]


def _finish(program: Program, io: RegionIO, part: RowPart, arg: dict[str, str], taken, indent: str) -> list[str]:
    """Lines that turn `st` (a row's combined state, row `rrow`) into the row results and store the
    ones the program reads."""
    vals = program.values
    names = Names()
    names.taken.update(taken)
    env, lines = {}, []
    for k, r in enumerate(part.reductions):
        ident = names.new(vals[r.output].name)
        expr = re.sub(r"\bst\.", f"st.s{k}.", r.expr)
        lines.append(f"const float {ident} = {expr};  // {program.nodes[r.node].name}: {program.nodes[r.node].op}")
        env[r.output] = ident
    if part.post:
        lines += operand_loads(program, io, part.post, part.space, "rrow", arg, names, env)
        lines += [ln.strip() for ln in render_chain(program, part.post, env, names, indent="")]
    lines += [f"{arg[v]}[rrow] = {env[v]};" for v in io.outputs if v in part.values]
    return [f"{indent}{ln}" for ln in lines]


def combine_lines(program: Program, io: RegionIO, part: RowPart, arg: dict[str, str], taken,
                  n_tiles: int, cluster: bool = False) -> list[str]:
    """After the per-element loop (every thread of the CTA): the row states combined across lanes,
    warps and (n_tiles > 1) the CTAs of the row tile, as a cluster or through the workspace, finished
    and stored. A cluster's CTAs arrive on its barrier once they have read each other's states; the
    kernel waits on it before it exits (cluster_exit)."""
    finish = _finish(program, io, part, arg, taken, "        ")
    lines = [
        "  // row reductions: the 4 lanes of each fragment row, then the CTA's warps along N (warp order)",
        "  #pragma unroll",
        "  for (int mt = 0; mt < kMT; ++mt)",
        "    #pragma unroll",
        "    for (int h = 0; h < 2; ++h) {",
        "      rs[mt][h] = row_combine(rs[mt][h], row_shfl(rs[mt][h], 1));",
        "      rs[mt][h] = row_combine(rs[mt][h], row_shfl(rs[mt][h], 2));",
        "    }",
        "  cta_sync();                       // every warp is done with the pipeline's buffers",
        "  float* red = smem;                // [kWarpsN][kBM][kF]",
        "  if (lane_t == 0) {",
        "    #pragma unroll",
        "    for (int mt = 0; mt < kMT; ++mt)",
        "      #pragma unroll",
        "      for (int h = 0; h < 2; ++h)",
        "        row_put(red + (warp_n * kBM + warp_m * kTM + mt * 16 + h * 8 + lane_g) * kF, rs[mt][h]);",
        "  }",
        "  cta_sync();",
    ]
    # a normalising op: the row's combined state, kept in shared memory for its pass (_normalise_loop)
    keep = ["row_put(red + (kWarpsN * kBM + r) * kF, st);   // for the normalising pass"] if part.norms else []
    tile_state = ["RowSt st = row_get(red + r * kF);",
                  "for (int w = 1; w < kWarpsN; ++w) st = row_combine(st, row_get(red + (w * kBM + r) * kF));"]
    if n_tiles == 1:   # the CTA holds whole rows
        return lines + [
            "  for (int r = tid; r < kBM; r += kBlock) {",
            "    const index_t rrow = bm + r;",
            "    if (rrow < kM) {",
            *[f"      {ln}" for ln in tile_state],
            *[ln[2:] for ln in finish],
            *[f"      {ln}" for ln in keep],
            "    }",
            "  }"]
    if cluster:
        return lines + [
            f"  // {n_tiles} CTAs share each row, one cluster: each CTA's tile states, read by all of them",
            "  float* const tile_st = red + (kWarpsN + 1) * kBM * kF;   // [kBM][kF], past the normalising pass's",
            "  for (int r = tid; r < kBM; r += kBlock) {",
            *[f"    {ln}" for ln in tile_state],
            "    row_put(tile_st + r * kF, st);",
            "  }",
            "  __cluster_barrier_arrive();   // release: this CTA's tile states, to the cluster",
            "  __cluster_barrier_wait();",
            "  for (int r = tid; r < kBM; r += kBlock) {",
            "    const index_t rrow = bm + r;",
            "    if (rrow < kM) {",
            "      RowSt st = row_get(static_cast<const float*>(__cluster_map_shared_rank(tile_st, 0)) + r * kF);",
            "      for (int t = 1; t < kNTiles; ++t)   // tile order: the same bits in every CTA",
            "        st = row_combine(st, row_get(static_cast<const float*>(__cluster_map_shared_rank(tile_st, t)) + r * kF));",
            *(["      if (tile_n == 0) {   // the row results, stored once",
                *[f"  {ln}" for ln in finish],
                "      }"] if any(ln.strip() for ln in finish) else []),
            *[f"      {ln}" for ln in keep],
            "    }",
            "  }",
            "  __cluster_barrier_arrive();   // done reading the cluster's states"]
    publish = ["for (int r = tid; r < kBM; r += kBlock) {",
               "  const index_t rrow = bm + r;",
               "  if (rrow < kM) {",
               *[f"    {ln}" for ln in tile_state],
               "    row_put(workspace + ((index_t)tile_n * kM + rrow) * kF, st);",
               "  }",
               "}"]
    # a normalising op: each CTA stored its tile's inputs past the states (gemm_mma._epilogue), fenced
    # before its ticket; the row tile's last CTA keeps each row's combined state for its pass over them
    fence = ["  __threadfence();   // this tile's normalising inputs, before its ticket"] if part.norms else []
    return lines + [
        f"  // {n_tiles} CTAs share each row: each publishes its tile's states, the row tile's last combines them",
        *fence,
        *publish_and_arrive(publish, "counters[tile_m]", "kNTiles", publisher="tid < kBM", arriver="tid == 0",
                            sync="cta_sync();"),
        "  if (last) {",
        "    __threadfence();",
        "    for (int r = tid; r < kBM; r += kBlock) {",
        "      const index_t rrow = bm + r;",
        "      if (rrow < kM) {",
        "        RowSt st = row_get_cg(workspace + rrow * kF);",
        "        for (int t = 1; t < kNTiles; ++t) st = row_combine(st, row_get_cg(workspace + ((index_t)t * kM + rrow) * kF));  // tile order",
        *finish,
        *[f"        {ln}" for ln in keep],
        "      }",
        "    }",
        "    if (tid == 0) " + reset_counter("counters[tile_m]", "").strip(),
        "  }"]


def workspace(part: RowPart, M: int, N: int, n_tiles: int, m_tiles: int,
              cluster: bool = False) -> list[tuple[str, int]]:
    """The per-tile row states (then, for a normalising op, its M x N inputs) and the row tiles'
    tickets; none when one CTA holds whole rows or the row tile's CTAs are a cluster."""
    if n_tiles == 1 or cluster:
        return []
    return [("float32", n_tiles * M * len(part.fields) + (M * N if part.norms else 0)), ("int32", m_tiles)]


def shared_floats(part: RowPart, bm: int, warps_n: int, cluster: bool = False) -> int:
    """The warps' row states, each row's combined state where a normalising pass reads it, and the
    tile's states that a cluster reads (at the same place with or without a normalising op)."""
    return (warps_n + (1 if part.norms or cluster else 0) + (1 if cluster else 0)) * bm * len(part.fields)


def cluster_exit() -> list[str]:
    """The cluster's CTAs leave together: none while another may still read its shared memory (its
    tile states, or a split-K part's sums)."""
    return ["  __cluster_barrier_wait();   // every CTA of the cluster is done reading this one's shared memory"]


__all__ = ["CLUSTER_MAX", "MAX_WHOLE_ROW", "NORMS", "REDUCTIONS", "RELABELS", "RowNorm", "RowPart", "RowReduce",
           "cluster_exit", "combine_lines", "fold_lines", "operand_loads", "operand_shape", "shared_floats",
           "split_epilogue", "state_code", "workspace"]
