"""The three questions of fusion, kept apart (as Inductor's scheduler does):

- `can_fuse`: may these two groups become one kernel? (loop shapes, anchors, budgets, user decisions;
  the cycle check lives in PlanState because it depends on every other group); and last, because it is
  the costliest, `backend_refusal`: would the code generator write that kernel? (codegen.can_lower);
- `score`: is it worth it? the estimated time saved on the roofline, less any recomputation;
- the reasons a user reads are written from the same summaries in explain.py.

Each refusal is one sentence that names the nodes and the numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..analysis.cost import library_reads_as_view
from ..analysis.gpu import GPUProfile
from ..codegen.gemm_mma import GEMM_OPS, estimate
from ..codegen.kernel import CodegenError
from ..codegen.reduce_window import (WINDOW_UNROLL, reduced_block, stageable, staged_window, window_reductions,
                                     window_threads_per_row)
from ..codegen.region_io import region_io
from ..ops.common import broadcasts_to, ntuple
from .class_loss import class_loss_refusal, class_loss_rows, reads_rows_once
from .geometry import Geometry


@dataclass(frozen=True)
class Budgets:
    max_ops: int = 40            # compute ops in one kernel (code size, compile time)
    max_inputs: int = 16         # distinct tensors one kernel reads (arguments, address registers)
    max_registers: int = 128     # per thread; above this occupancy halves
    base_registers: int = 24     # indices, addresses, loop state
    regs_per_op: int = 2         # live temporaries per fused op, roughly


@dataclass
class Summary:
    nodes: list[str]
    anchor: str | None = None            # the matmul or conv node
    anchor_role: str | None = None
    reductions: list[str] = field(default_factory=list)
    red: Geometry | None = None          # geometry of the first reduction
    numels: dict[str, int] = field(default_factory=dict)   # pointwise node -> loop size
    layouts: dict[str, int] = field(default_factory=dict)  # layout node (slice, cat, ...) -> output size
    ops: int = 0                         # compute ops (views excluded)
    blocker: str | None = None           # a node that never fuses (opaque / single, a second anchor)
    windows: list[str] = field(default_factory=list)   # windowed poolings (see _window_refusal)

    @property
    def window(self) -> str | None:
        return self.windows[0] if self.windows else None


def summarize(state, nodes: list[str]) -> Summary:
    s = Summary(nodes)
    geo = state.geo
    for nid in nodes:
        g = geo[nid]
        r = g.role
        if r == "view":
            continue
        s.ops += 1
        if r == "pointwise":
            s.numels[nid] = g.numel
        elif r == "layout":
            s.layouts[nid] = g.numel
        elif r in ("matmul", "conv"):
            if s.anchor is None:
                s.anchor, s.anchor_role = nid, r
            else:
                s.blocker = s.blocker or nid
        elif r == "reduction":
            s.reductions.append(nid)
            if s.red is None or (s.red.rows == 1 and g.rows > 1):     # rows before a total beside them
                s.red = g
        elif r == "window":
            s.windows.append(nid)
        else:
            s.blocker = nid
    if len({geo[r].key for r in s.reductions}) > 1:
        _as_windows(state, s)
    return s


def _name(state, nid: str) -> str:
    n = state.program.nodes[nid]
    return n.name if n.name == n.op else f"{n.name} ({n.op})"


def _shape(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def schedule_for(red: Geometry, full_inputs: int, gpu: GPUProfile) -> tuple[str, int]:
    """(schedule, values each thread holds) for a stitched reduction whose row reads `full_inputs`
    tensors from memory: column tiles for a reduction over a middle dim; else a warp per row up to
    1024 elements, a block per row while the rows fit the on-chip budget, a thread-block cluster per
    row while they fit 8 CTAs' registers, else two passes over memory."""
    k = max(full_inputs, 1)
    if not red.contiguous:
        # codegen's column tiles (rowkernel, inner > 1): a thread per column position, the columns side
        # by side so each load is coalesced across them, 8 thread rows sharing a column; a thread holds
        # its share in registers while that fits column_max_items, else streams it (holds nothing)
        from ..codegen.column_tile import TILE_Y
        from ..codegen.rowkernel import DEFAULTS as ROW_KERNEL
        share = k * math.ceil(red.row_len / TILE_Y)
        return "column-tiles", share if share <= ROW_KERNEL["column_max_items"] else 0
    if red.row_len <= gpu.warp_row_max and k * math.ceil(red.row_len / gpu.warp_size) <= 64:
        return "warp-per-row", k * math.ceil(red.row_len / gpu.warp_size)
    # codegen/rowsplit.py: fewer rows than two per SM, each in chunks over the GPU, each block holding
    # its chunk in registers where that fits, else streamed per phase
    from ..codegen.rowkernel import CLUSTER_PORTABLE, DEFAULTS as ROW_KERNEL, scalar_rows_stream
    from ..codegen.rowsplit import HOLD_THREAD_FLOATS, SPLIT_ROW_THREADS, held_split, row_split
    limits = {"sm_count": gpu.sm_count, "spread_min_bytes": ROW_KERNEL["spread_min_bytes"]}
    parts = row_split(red.rows, red.row_len, k, limits, False, red.row_len * 4 * k > gpu.block_row_bytes) \
        if red.contiguous else 1
    if parts > 1:
        held = held_split(red.row_len, k, parts, SPLIT_ROW_THREADS, limits)
        return "split-row", HOLD_THREAD_FLOATS if held else 0
    if red.row_len * 4 * k <= gpu.block_row_bytes:
        return "block-per-row", k * math.ceil(red.row_len / gpu.max_threads_per_block)
    if scalar_rows_stream(red.rows, 4 if red.row_len % 4 == 0 else 1, k, limits):
        return "two-pass", 0        # codegen streams it through one block (rowkernel._cluster_size)
    # codegen/rowkernel.py's cluster schedule: one read of a row that a cluster of CTAs holds
    ctas = min(CLUSTER_PORTABLE, 1 << math.ceil(math.log2(red.row_len * 4 * k / gpu.block_row_bytes)))
    held = k * math.ceil(red.row_len / (ctas * gpu.max_threads_per_block))
    if red.contiguous and held <= ROW_KERNEL["cluster_thread_floats"] and \
            red.full_numel * 4 * k >= ROW_KERNEL["spread_min_bytes"]:
        return "cluster-per-row", held
    return "two-pass", 0


def full_space_inputs(state, nodes, red: Geometry, facts=None) -> int:
    """Tensors of the reduction's full size that the group reads from memory."""
    n_full = red.full_numel
    vnumel = state.vnumel
    if facts is not None:
        return sum(1 for v in facts.reads if vnumel[v] == n_full)
    members = set(nodes)
    vprod = state.vprod
    seen = {v for nid in nodes for v in state.nin[nid] if vprod[v] not in members}
    return sum(1 for v in seen if vnumel[v] == n_full)


@dataclass
class Traffic:
    bytes_read: int
    bytes_written: int
    bytes_kept: int
    kept_values: list
    flops: int
    views_only: bool

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass
class Facts:
    """What a group reads from outside, produces, and must write out (values used outside it or
    returned), with their byte counts, kept per group so a union's facts come from set operations."""
    reads: set
    produced: set
    escaping: set
    read_bytes: int
    esc_bytes: int
    flops: int
    views_only: bool
    # value -> bytes read, for the values read only in part (a slice of a tensor, an embedding's rows);
    # None when every read value is read whole, as in most groups
    partial: dict | None = None


def _bytes(state, values) -> int:
    if not values:
        return 0
    return sum(map(state.vbytes.__getitem__, values))


def node_facts(state, nid) -> Facts:
    c = state.costs[nid]
    outs = set(state.nout[nid])
    # a value nobody reads and the program does not return is never written
    esc = {v for v in outs if v in state.outputs or state.consumers.get(v)}
    reads = set(state.nin[nid])
    if c.view:
        return Facts(reads, outs, esc, 0, 0, 0, True)
    partial = _layout_reads(state, nid) if state.geo[nid].role == "layout" else None
    read_bytes = _bytes(state, reads) if not partial else sum(partial.get(v, state.vbytes[v]) for v in reads)
    return Facts(reads, outs, esc, read_bytes, _bytes(state, esc), c.flops, False, partial)


def _layout_reads(state, nid) -> dict | None:
    """The inputs a layout node reads only in part: it reads at most as many elements of each input as
    it writes (a slice half its input, an embedding the rows it gathers, not the whole table)."""
    vnumel, vbytes = state.vnumel, state.vbytes
    out = sum(vnumel[v] for v in state.nout[nid])
    part = {v: vbytes[v] * out // vnumel[v] for v in state.nin[nid] if 0 < out < vnumel[v]}
    return part or None


def group_facts(state, nodes) -> Facts:
    members = set(nodes)
    f = None
    for nid in nodes:
        f = node_facts(state, nid) if f is None else union_facts(state, f, node_facts(state, nid), members)
    return f


def union_facts(state, fa: Facts, fb: Facts, members, light: bool = False,
                need_reads: bool = True) -> Facts:
    """Facts of two groups fused. `members` says whether a node is in the union: a set of node ids,
    or a pair of group ids (checked through state.group_of). With light=True only the byte counts
    (and the reads, if need_reads) are computed: enough to score a candidate, and cheap, because only
    the small intersections between the two groups are built."""
    # a group's reads are external to it, so fa.reads & fb.reads holds no value either produces
    a_in_b, b_in_a = fa.reads & fb.produced, fb.reads & fa.produced
    both = fa.reads & fb.reads
    crossing = (fa.escaping & b_in_a) | (fb.escaping & a_in_b)
    back = ()
    if crossing:
        outputs, cons = state.outputs, state.consumers
        if isinstance(members, tuple):
            group_of, pair = state.group_of, members
            inside = lambda u: group_of[u] in pair  # noqa: E731
        else:
            inside = members.__contains__
        back = [v for v in crossing if v in outputs or not all(map(inside, cons.get(v, ())))]
    views_only = fa.views_only and fb.views_only
    if fa.partial or fb.partial:
        return _union_partial(state, fa, fb, a_in_b, b_in_a, both, crossing, back, light, need_reads)
    if light:
        reads = ((fa.reads - a_in_b) | (fb.reads - b_in_a)) if need_reads else None
        produced = escaping = None
    else:
        reads = (fa.reads - a_in_b) | (fb.reads - b_in_a)
        produced = fa.produced | fb.produced
        escaping = (fa.escaping | fb.escaping) - crossing
        escaping.update(back)
    if views_only:
        return Facts(reads, produced, escaping, 0, 0, 0, True)
    vb = state.vbytes.__getitem__
    # views contribute no bytes of their own: recount a side that was views only
    rba = sum(map(vb, fa.reads)) if fa.views_only else fa.read_bytes
    rbb = sum(map(vb, fb.reads)) if fb.views_only else fb.read_bytes
    eba = sum(map(vb, fa.escaping)) if fa.views_only else fa.esc_bytes
    ebb = sum(map(vb, fb.escaping)) if fb.views_only else fb.esc_bytes
    read_bytes = rba + rbb - sum(map(vb, a_in_b)) - sum(map(vb, b_in_a)) - sum(map(vb, both))
    esc_bytes = eba + ebb - sum(map(vb, crossing)) + sum(map(vb, back))
    return Facts(reads, produced, escaping, read_bytes, esc_bytes, fa.flops + fb.flops, False)


def _union_partial(state, fa: Facts, fb: Facts, a_in_b, b_in_a, both, crossing, back, light, need_reads) -> Facts:
    """union_facts where a side reads some value only in part: a value both read costs the sum of the
    two parts, never more than the whole value; one made inside the union is not read at all."""
    vb = state.vbytes.__getitem__
    pa, pb = fa.partial or {}, fb.partial or {}
    part = {}
    for v in fa.reads - a_in_b - both:
        if v in pa:
            part[v] = pa[v]
    for v in fb.reads - b_in_a - both:
        if v in pb:
            part[v] = pb[v]
    for v in both:
        got = pa.get(v, vb(v)) + pb.get(v, vb(v))
        if got < vb(v):
            part[v] = got
    reads = ((fa.reads - a_in_b) | (fb.reads - b_in_a)) if need_reads or not light else None
    if light:
        produced = escaping = None
    else:
        produced = fa.produced | fb.produced
        escaping = (fa.escaping | fb.escaping) - crossing
        escaping.update(back)
    outside = (fa.reads - a_in_b) | (fb.reads - b_in_a) if reads is None else reads
    read_bytes = sum(part.get(v, vb(v)) for v in outside)
    esc = (sum(map(vb, fa.escaping)) if fa.views_only else fa.esc_bytes) + \
        (sum(map(vb, fb.escaping)) if fb.views_only else fb.esc_bytes) - sum(map(vb, crossing)) + sum(map(vb, back))
    return Facts(reads, produced, escaping, read_bytes, esc, fa.flops + fb.flops, False, part or None)


def traffic(state, nodes, facts: Facts | None = None) -> Traffic:
    """What `nodes` fused into one kernel read from and write to memory."""
    f = facts or group_facts(state, nodes)
    if f.views_only:
        return Traffic(0, 0, 0, [], 0, True)
    cons = state.consumers
    # in the nodes' order, so the words that name them are the same on every run (not a set's order)
    kept_values = [v for n in nodes for v in state.program.nodes[n].outputs
                   if v in f.produced and v not in f.escaping and cons.get(v)]
    return Traffic(f.read_bytes, f.esc_bytes, _bytes(state, kept_values), kept_values, f.flops, False)


def merge_summaries(sa: Summary, sb: Summary, state=None) -> Summary:
    """The summary of the two groups as one; with `state`, reductions of different rows where one
    reads the other's results as its elements count that one as a window (_as_windows)."""
    s = Summary(sa.nodes + sb.nodes)
    s.anchor, s.anchor_role = (sa.anchor, sa.anchor_role) if sa.anchor else (sb.anchor, sb.anchor_role)
    if sa.anchor and sb.anchor:
        s.blocker = sb.anchor
    s.reductions = sa.reductions + sb.reductions
    s.red = sa.red or sb.red
    if s.red is not None and s.red.rows == 1 and sb.red is not None and sb.red.rows > 1:
        s.red = sb.red           # a total beside rows: the rows decide the schedule
    s.numels = {**sa.numels, **sb.numels}
    s.layouts = {**sa.layouts, **sb.layouts}
    s.ops = sa.ops + sb.ops
    s.windows = sa.windows + sb.windows
    s.blocker = sa.blocker or sb.blocker or s.blocker
    if state is not None and sa.red is not None and sb.red is not None and sa.red.key != sb.red.key:
        _as_windows(state, s)
    return s


def _window_sized(state, r: str, numels) -> bool:
    """Reduction r may be a window of a row kernel whose rows' full shape has one of these sizes: a
    sum / mean / max / min over one block of dims whose result is that large (a cheap test before
    codegen's window_reductions walks the group)."""
    program = state.program
    node = program.nodes[r]
    return reduced_block(program, node) is not None and math.prod(program.values[node.outputs[0]].shape) in numels


def _as_windows(state, s: Summary) -> None:
    """Reductions whose results another reduction of the group reads as its elements are computed in
    that row kernel's prologue (codegen/reduce_window.py): they count as its windows, and the other
    reductions decide its rows."""
    fulls = {state.geo[r].full_numel for r in s.reductions}
    if not any(_window_sized(state, r, fulls) for r in s.reductions):
        return
    wins = window_reductions(state.program, region_io(state.program, state.sort_nodes(s.nodes)))
    if wins & set(s.reductions):
        s.windows += [r for r in s.reductions if r in wins]
        s.reductions = [r for r in s.reductions if r not in wins]
        geos = [state.geo[r] for r in s.reductions]
        s.red = next((g for g in geos if g.rows > 1), geos[0] if geos else None)


WINDOW_MAX = 4096         # the most elements one element's reduction window folds
WINDOW_MIN_STRIDE = 32    # a window's elements this far apart or more: a warp's neighbouring elements
#                           read neighbouring addresses at each step (coalesced), as the column
#                           reduction it replaces did
# threads per SM the fused kernel must have, at least: each walks its window's loads in turn, so only
# many threads keep enough bytes in flight (H100, region kernels: MiniLM's masked sum over 256 tokens
# then L2 norm, 256 rows x 384 threads (0.7 an SM of 1024), 0.058 ms fused against 0.047 + 0.005 apart;
# a ViT's mean over 196 tokens then LayerNorm, 256 x 768 (1.5), 0.067 against 0.065 + 0.006)
WINDOW_THREADS_PER_SM = 1024
WINDOW_STAGE_MAX_COLS = 4096   # rows a staged window's tile holds (16 KB beside its chunk: codegen/rowkernel.py)


def window_threads(red: Geometry) -> int:
    """The threads of a row kernel whose elements are windows: one per element of each row up to
    1024 (codegen/rowkernel._window_threads), or column tiles' TILE_Y thread rows per column."""
    from ..codegen.column_tile import TILE_Y
    return red.rows * min(red.row_len, 1024 if red.contiguous else TILE_Y)


def prologue_reductions(state, sa: Summary, sb: Summary, relation: str) -> bool:
    """sa's reductions become windows of sb's row kernel (codegen/reduce_window.py: a mean over the
    tokens before a norm over the features): each folds at most WINDOW_MAX elements WINDOW_MIN_STRIDE
    or more apart, and sb's rows give every SM WINDOW_THREADS_PER_SM threads (window_threads: each
    element's loop over its window is one thread's, so the rows' elements are all the parallelism)."""
    if relation != "producer" or sa.anchor or sb.anchor or sa.windows or sb.windows or not sa.reductions \
            or sb.red is None or window_threads(sb.red) < state.gpu.sm_count * WINDOW_THREADS_PER_SM:
        return False
    program = state.program
    io = region_io(program, state.sort_nodes(sa.nodes + sb.nodes))
    for r in sa.reductions:
        if not _window_sized(state, r, {sb.red.full_numel}):
            return False
        _, k, inner = reduced_block(program, program.nodes[r])
        if k > WINDOW_MAX or (inner < WINDOW_MIN_STRIDE and not _staged(state, io, r, sb.red)):
            return False
    wins = window_reductions(program, io)
    return set(sa.reductions) <= wins and not wins & set(sb.reductions)


def _staged(state, io, r: str, red: Geometry) -> bool:
    """Whether codegen stages reduction r's contiguous windows (reduce_window.staged_window): the block
    folds its rows' windows from coalesced chunks in shared memory, so the windows need not lie a
    warp apart; the rows must be short enough to be held (a tile of WINDOW_STAGE_MAX_COLS floats)."""
    k = reduced_block(state.program, state.program.nodes[r])[1]
    block = window_threads_per_row(red.row_len)
    return red.contiguous and red.row_len <= WINDOW_STAGE_MAX_COLS and stageable(k, block, WINDOW_UNROLL) and \
        staged_window(state.program, io, state.program.nodes[r])


def quick_refusal(state, a, b, sa: Summary, sb: Summary, relation: str) -> str | None:
    """The structural refusals that need no traffic figures (checked first: they are most of them)."""
    return _structural(state, a, b, sa, sb, relation)


def can_fuse(state, a, b, sa: Summary, sb: Summary, relation: str, facts=None) -> str | None:
    """Why groups a and b (a before b) may not become one kernel, or None. relation is 'producer'
    (a feeds b) or 'sibling' (they read a common input)."""
    why = _structural(state, a, b, sa, sb, relation)
    if why:
        return why
    return _budgetary(state, a, b, sa, sb, relation, facts)


def _structural(state, a, b, sa: Summary, sb: Summary, relation: str) -> str | None:
    budgets = state.budgets
    for g in (a, b):
        if g.frozen is not None:
            r = g.frozen
            return f"region {r.id} is {r.status}; the planner keeps it as it is"
    for s in (sa, sb):
        if s.blocker:
            nid = s.blocker
            role = state.geo[nid].role
            what = {"opaque": "is opaque (a call the planner cannot see into)",
                    "window": "is a windowed pooling and runs as its own kernel",
                    }.get(role, "runs as its own kernel (layout change or library call)")
            return f"{_name(state, nid)} {what}"
    ops = sa.ops + sb.ops
    if ops > budgets.max_ops:
        return f"the kernel would hold {ops} ops, over the budget of {budgets.max_ops}"
    if (sa.window or sb.window) and not _row_prologue(sa, sb, relation):
        return _window_refusal(state, sa, sb, relation) or state.rejected_conflict(a, b)
    anchors = [s for s in (sa, sb) if s.anchor]
    if len(anchors) == 2:
        return (f"{_name(state, sa.anchor)} and {_name(state, sb.anchor)} are both "
                f"{'matrix products' if sa.anchor_role == 'matmul' else 'convolutions'}; each is its own kernel")
    anchor = anchors[0] if anchors else None
    if anchor is not None and relation == "sibling":
        return f"{_name(state, anchor.anchor)} shares its input but not its loop with the other group"
    if anchor is not None and anchor is sb and relation == "producer" and (sa.ops or sa.reductions):
        return (f"feeding {_name(state, sb.anchor)}'s operand from a fused producer would recompute "
                f"that producer for every tile of the product")
    rows = class_loss_rows(state, sa, sb) if anchor is None and (sa.reductions or sb.reductions) else None
    if rows is not None:       # log_softmax -> nll_loss and the loss's sums: one kernel (planner/class_loss.py)
        return class_loss_refusal(state, a, b, sa, sb, rows)
    # reductions over the same rows, chained or side by side, share one kernel (codegen/rowkernel.py,
    # which can_lower asks before the merge); reductions over different rows do not
    reds = [s.red for s in (sa, sb) if s.red is not None]
    if len(reds) == 2 and reds[0].key != reds[1].key and not _total_beside_rows(state, sa, sb):
        if prologue_reductions(state, sa, sb, relation):
            return state.rejected_conflict(a, b)      # codegen (can_lower) has the last word
        r0, r1 = sa.reductions[0], sb.reductions[0]
        return (f"{_name(state, r0)} and {_name(state, r1)} reduce different rows "
                f"({reds[0].rows} x {reds[0].row_len} over {_shape(reds[0].full)} vs "
                f"{reds[1].rows} x {reds[1].row_len} over {_shape(reds[1].full)})")
    red = (sa.red if sa.red is not None and sa.red.rows > 1 else sb.red or sa.red) if reds else None
    if anchor is not None:
        an = anchor.anchor
        out = state.geo[an]
        # the epilogue is a kernel of its own that reads the library call's output back, so a
        # reduction there is an ordinary row reduction (whether it generates is codegen's answer); the
        # export generates a convolution with its epilogue inside, and that takes pointwise ops only
        if red is not None and anchor.anchor_role != "matmul":
            return f"{_name(state, an)}'s epilogue takes pointwise ops only, not a reduction"
        lay = next((n for s in (sa, sb) for n in s.layouts), None)
        if lay is not None and anchor.anchor_role != "matmul" and not gated_halves(state, an):
            return f"{_name(state, an)}'s epilogue takes pointwise ops only, not {_name(state, lay)}"
        allowed = {out.numel} | ({red.rows} if red is not None else set()) | gated_halves(state, an)
        for s in (sa, sb):
            for nid, ne in (*s.numels.items(), *s.layouts.items()):
                if ne not in allowed:
                    return (f"{_name(state, nid)} loops over {ne} elements, not the {out.numel} of "
                            f"{_name(state, an)}'s output")
    elif red is not None:
        # layout ops, and the pointwise ops between them, are read through views in a row kernel's
        # prologue whatever their sizes: there codegen's answer (can_lower) decides
        allowed = {red.full_numel, red.rows}
        for s in (sa, sb) if not (sa.layouts or sb.layouts or sa.windows or sb.windows) else ():
            for nid, ne in s.numels.items():
                # a smaller op that broadcasts into the rows (an attention mask's arithmetic on
                # [B, 1, 1, S]) is evaluated per element where the row kernel reads it: the recompute
                # guard weighs that, and codegen (can_lower) has the last word
                if ne not in allowed and not broadcasts_to(state.geo[nid].shape, red.full):
                    return (f"{_name(state, nid)} loops over {ne} elements, neither the "
                            f"{_shape(red.full)} rows nor the {red.rows} row results of "
                            f"{_name(state, (sa.reductions or sb.reductions)[0])}")
    else:
        na = max(sa.numels.values(), default=0)
        nb = max(sb.numels.values(), default=0)
        # a layout graph loops over its outputs, whatever its ops' sizes (codegen checks they agree)
        if relation == "sibling" and na != nb and not (sa.layouts or sb.layouts):
            return f"the two groups loop over different sizes ({na} and {nb} elements)"
    return state.rejected_conflict(a, b)


def _row_prologue(sa: Summary, sb: Summary, relation: str) -> bool:
    """The two groups make a row kernel whose windowed poolings all come before its reductions, in its
    prologue (codegen/layout_graph.py: each pooled element a lambda over its window): a pool feeding a
    channel log-sum-exp, a pool of a pool feeding a sum, a row group taking more ops after it. Then the
    row kernel's rules apply, and can_lower has the last word."""
    if relation != "producer" or sa.anchor or sb.anchor or not (sa.reductions or sb.reductions):
        return False
    return not (sa.reductions and sb.windows)       # a pool after a reduction reads its rows' results


NESTED_WINDOW_REPEAT = 4.0   # YOLO's SPPF (a 5 x 5 stride-1 pool of one) reads each input 7.7 times


def _nested_window_repeat(state, windows: list[str]) -> float:
    """How many times a chain of windows feeding windows, generated as one kernel, reads each input it
    covers per output: every window evaluates the one before it at each of its positions, so reads
    multiply (k1 * k2 per dim) while the input covered grows only by the first window's stride
    (its extent (k1 - 1) d1 + 1, dilation d1, plus (k2 - 1) d2 s1). Windows that do not overlap
    (stride = kernel, 78_Max_Max's pools) read each input once; a 5 x 5 stride-1 pool of another, 625
    reads of 81 inputs. The longest chain's figure."""
    program, member = state.program, set(windows)
    chains: dict[str, tuple[list[int], list[int], list[int]]] = {}   # window -> (reads, span, stride) per dim
    worst = 1.0
    for w in windows:              # the groups keep their nodes in execution order
        node = program.nodes[w]
        if not node.attrs.get("kernel_size"):
            continue               # adaptive or resampling windows: not a stencil
        rank = len(program.values[node.inputs[0]].shape) - 2
        k = ntuple(node.attrs["kernel_size"], rank, "kernel_size")
        st = ntuple(node.attrs.get("stride") or k, rank, "stride")
        dil = ntuple(node.attrs.get("dilation") or [1], rank, "dilation")
        before = chains.get(program.values[node.inputs[0]].producer) \
            if program.values[node.inputs[0]].producer in member else None
        if before is None:
            chains[w] = (k, [(b - 1) * e + 1 for b, e in zip(k, dil)], st)
            continue
        reads0, span0, st0 = before
        reads = [a * b for a, b in zip(reads0, k)]
        span = [sp + (b - 1) * e * s for sp, b, e, s in zip(span0, k, dil, st0)]
        chains[w] = (reads, span, [a * b for a, b in zip(st0, st)])
        worst = max(worst, math.prod(reads) / math.prod(span))
    return worst


def _window_refusal(state, sa: Summary, sb: Summary, relation: str) -> str | None:
    """A windowed pooling's kernel (codegen/pooling.py) takes pointwise ops over its input before it,
    evaluated where a window reads them (conv -> relu -> max_pool reads the pre-activation once and
    writes only the pooled map), pointwise ops over its output after it, and another pooling it feeds
    or is fed by (a pool of a pool); with views around it (a nearest upsample before a pool) it is a
    layout-graph kernel of window lambdas; nothing else (a row kernel after it takes it as its
    prologue: _row_prologue)."""
    if sa.window and sb.window:
        if relation == "producer" and not (sa.anchor or sb.anchor or sa.reductions or sb.reductions):
            # a pool of a pool: one kernel, each window a lambda (codegen/layout_graph.py) that calls the
            # window before it at every position: the reads per output multiply along the chain
            repeat = _nested_window_repeat(state, sa.windows + sb.windows)
            if repeat > NESTED_WINDOW_REPEAT:
                return (f"a pool of a pool in one kernel would read each input {repeat:.1f} times per output "
                        f"(each window evaluates the one before it at every position of its overlapping "
                        f"windows); more than {NESTED_WINDOW_REPEAT:g}")
            return None
        return (f"{_name(state, sa.window)} and {_name(state, sb.window)} are both windowed poolings; "
                f"only a chain of them with pointwise ops and views between is one kernel")
    pooled, other = (sa, sb) if sa.window else (sb, sa)
    if relation == "sibling":
        return f"{_name(state, pooled.window)} shares its input but not its loop with the other group"
    before = other is sa                 # the other group feeds the pooling: its prologue
    window = pooled.windows[0] if before else pooled.windows[-1]
    extra = other.anchor or next(iter(other.reductions), None)
    if extra is not None:
        return f"{_name(state, window)}'s kernel takes pointwise ops and views only, not {_name(state, extra)}"
    if other.layouts or pooled.layouts:
        return None      # views around a window: a layout-graph kernel reads through them (codegen/__init__.py)
    program = state.program
    node = program.nodes[window]
    loop = math.prod(program.values[node.inputs[0] if before else node.outputs[0]].shape)
    for nid, ne in other.numels.items():
        if ne != loop:
            return (f"{_name(state, nid)} loops over {ne} elements, not the {loop} of "
                    f"{_name(state, window)}'s {'input' if before else 'output'}")
    return None


def _total_beside_rows(state, sa: Summary, sb: Summary) -> bool:
    """Every reduction of the two groups reduces one set of rows, or every element of a value of those
    rows' size (KL's batchmean sum after its softmaxes), or of one value per row (a masked mean of
    per-token log-probabilities): each row folds its share of such a total and the row kernel's last
    block combines them (codegen/rowkernel.py), one launch."""
    geos = [state.geo[n] for n in sa.reductions + sb.reductions]
    rowwise = {g.key for g in geos if g.rows > 1}
    if len(rowwise) != 1:
        return False
    ref = next(g for g in geos if g.rows > 1)
    return all(g.rows > 1 or (g.full_numel == g.row_len and g.row_len in (ref.full_numel, ref.rows)) for g in geos)


def _budgetary(state, a, b, sa: Summary, sb: Summary, relation: str, facts, red=None) -> str | None:
    """red: the merged group's rows (merge_summaries(sa, sb, state).red), where the caller has it."""
    gpu, budgets = state.gpu, state.budgets
    ops = sa.ops + sb.ops
    red = red or merge_summaries(sa, sb, state).red
    regs = budgets.base_registers + budgets.regs_per_op * ops
    if red is not None:
        sched, held = schedule_for(red, full_space_inputs(state, sa.nodes + sb.nodes, red, facts), gpu)
        regs += held
    if regs > budgets.max_registers:
        return (f"the kernel would need about {regs} registers per thread, over the budget of "
                f"{budgets.max_registers}")
    return None


def backend_refusal(state, nodes, escaping, kind: str) -> str | None:
    """Why the code generator would not write the kernel of `nodes` (a group the planner is about to
    make), or None: codegen's own answer (codegen.can_lower, cached on the group's structure).
    `escaping`: the values of the group used outside it or returned."""
    from ..codegen import can_lower
    why = can_lower(state.program, state.sort_nodes(nodes), kind, outputs=escaping)
    return None if why is None else f"the generator has no kernel for them together ({why})"


def gated_halves(state, anchor: str) -> set[int]:
    """{elements of one half} where the anchor's output is read only as its two halves along its
    columns (codegen's gated_halves: the tile GEMM computes them side by side); else none."""
    from ..codegen.gemm_mma import columns_dim, gated_halves as halves
    out = state.program.nodes[anchor].outputs[0]
    if halves(state.program, out, columns_dim(state.program, anchor), state.consumers.get(out, ())) is None:
        return set()
    return {state.vnumel[out] // 2}


def group_time(state, nodes: list[str], summary: Summary | None = None,
               facts: Facts | None = None, red=False, anchor=False) -> tuple[float, object]:
    """Roofline ms of `nodes` as they will run, and their facts: one kernel (a two-pass reduction
    reads its rows twice), or, for a group that starts with a matmul or convolution, the library call
    (cuBLAS / cuDNN, writing its output) followed by the epilogue kernel, which reads that output back:
    two launches; for a compute-bound matmul group the tile GEMM takes, the faster of that and its one
    kernel. red / anchor (the anchor node id or None) describe the group when no summary is given
    (False: compute the summary)."""
    f = facts or group_facts(state, nodes)
    if f.views_only or (len(nodes) == 1 and library_reads_as_view(state.program, nodes[0])):
        return 0.0, f      # no kernel: an alias, or a strided view cuBLAS / cuDNN read as it is
    if red is False:
        s = summary or summarize(state, nodes)
        red, anchor = s.red, s.anchor
    if anchor:
        lib = library_form_ms(state, nodes, anchor, red)
        tile = tile_gemm_ms(state, nodes, anchor)
        return (lib if tile is None else min(lib, tile)), f
    return kernel_ms(state, nodes, f, red), f


def library_form_ms(state, nodes, anchor: str, red) -> float:
    """Roofline ms of an anchored group as the library call and then the epilogue kernel, which reads the
    call's output back (two launches); red: the group's first reduction."""
    lib = library_ms(state, anchor)
    rest = epilogue_nodes(state, nodes, anchor)
    fr = group_facts(state, rest) if rest else None
    if fr is not None and not fr.views_only:
        lib += kernel_ms(state, rest, fr, red)
    return lib


def tile_gemm_work(state, nodes):
    """(bytes, FLOPs) of the one tile-GEMM kernel codegen writes for the matmul or convolution group
    `nodes` (gemm_mma.estimate), or the CodegenError saying why codegen does not take them. Cached per
    node set (state.tile_work): the planner asks it of every candidate union with a matmul in it, and the
    region's reason asks it again."""
    key = frozenset(nodes)
    if key not in state.tile_work:
        try:
            state.tile_work[key] = estimate(state.program, state.sort_nodes(nodes), state.gpu.sm_count)
        except CodegenError as exc:
            state.tile_work[key] = exc
    return state.tile_work[key]


def _costs_tile_gemm(state, anchor: str) -> bool:
    # below the ridge point both forms take the bytes' time: the library's is the one costed
    return state.program.nodes[anchor].op in GEMM_OPS and state.costs[anchor].bound() == "compute"


def tile_gemm_ms(state, nodes, anchor: str) -> float | None:
    """Roofline ms of a compute-bound matmul group as the one tile-GEMM kernel codegen writes for it (split
    TF32 on the tensor cores, its epilogue before the store; the agent times it against the library call
    and keeps the faster), or None where it is not costed so or codegen does not take the group."""
    if not _costs_tile_gemm(state, anchor):
        return None
    work = tile_gemm_work(state, nodes)
    if isinstance(work, Exception):
        return None
    gpu, (nbytes, flops) = state.gpu, work
    return gpu.launch_ms(state.graph) + max(nbytes / gpu.bytes_per_ms, flops / gpu.split_tf32_flops_per_ms)


def tile_gemm_refusal(state, nodes, anchor: str) -> str | None:
    """Why codegen's tile GEMM does not take the compute-bound matmul group `nodes` (None: it does, or
    the group is not costed as one)."""
    if not _costs_tile_gemm(state, anchor):
        return None
    work = tile_gemm_work(state, nodes)
    return str(work) if isinstance(work, Exception) else None


def epilogue_nodes(state, nodes, anchor: str) -> list[str]:
    """The nodes of an anchored group that its epilogue kernel runs: all but the anchor and the views
    that shape its operands (those are the library call's input, not reads of the epilogue)."""
    members, program = set(nodes), state.program
    before, todo = set(), [v for v in program.nodes[anchor].inputs if v]
    while todo:
        u = program.values[todo.pop()].producer
        if u in members and u not in before and state.geo[u].role == "view":
            before.add(u)
            todo += [v for v in program.nodes[u].inputs if v]
    return [n for n in nodes if n != anchor and n not in before]


def kernel_ms(state, nodes, f: Facts, red) -> float:
    """Roofline ms of `nodes` as one generated kernel with facts f (red: its first reduction)."""
    extra = 0
    if red is not None:
        sched, held = schedule_for(red, full_space_inputs(state, nodes, red, f), state.gpu)
        streamed = sched == "two-pass" or (sched in ("column-tiles", "split-row") and not held)
        if streamed:   # the row streamed again for each chained reduction and the outputs
            extra = f.read_bytes * (reduction_depth(state, nodes) - 1 + rereads_rows(state, nodes, red))
    gpu = state.gpu
    return gpu.launch_ms(state.graph) + max((f.read_bytes + f.esc_bytes + extra) / gpu.bytes_per_ms,
                                            f.flops / gpu.flops_per_ms)


def reduction_depth(state, nodes) -> int:
    """The longest chain of reductions in `nodes` (one reading another's result): the passes over
    memory that a streamed row takes before its outputs (sibling reductions fold in the same pass)."""
    members, program, geo = set(nodes), state.program, state.geo
    depth: dict[str, int] = {}
    for nid in state.sort_nodes(nodes):
        ups = (program.values[v].producer for v in program.nodes[nid].inputs if v is not None)
        d = max((depth[u] for u in ups if u in members and u in depth), default=0)
        depth[nid] = d + (geo[nid].role == "reduction")
    return max(depth.values(), default=0)


def library_ms(state, anchor: str) -> float:
    """Roofline ms of a matmul / convolution run through the library: it reads its operands and always
    writes its output (an epilogue kernel reads it back)."""
    c, gpu = state.costs[anchor], state.gpu
    moved = library_bytes(state, anchor)
    return gpu.launch_ms(state.graph) + max(moved / gpu.bytes_per_ms, c.flops / gpu.flops_per_ms)


def library_bytes(state, anchor: str) -> int:
    return _bytes(state, state.nin[anchor]) + _bytes(state, state.nout[anchor])


def launches(state, nodes, anchor) -> int:
    """Launches of a group as it will run: none for views only, the library call plus the epilogue
    kernel after a matmul / convolution, else one kernel."""
    real = [n for n in nodes if not state.costs[n].view]
    if not real:
        return 0
    return 1 + (1 if anchor and len(real) > 1 else 0)


def group_bytes(state, nodes, anchor, f: Facts) -> int:
    """Bytes the group moves as it will run (the epilogue reads the library call's output back)."""
    if f.views_only:
        return 0
    if not anchor:
        return f.read_bytes + f.esc_bytes
    rest = epilogue_nodes(state, nodes, anchor)
    fr = group_facts(state, rest) if rest else None
    return library_bytes(state, anchor) + (0 if fr is None or fr.views_only else fr.read_bytes + fr.esc_bytes)


def rereads_rows(state, nodes, red: Geometry) -> bool:
    """Whether a two-pass schedule must read the rows again: something of the full row size is
    computed from a row's reduced result (softmax's division, a norm's scaling). A plain reduction
    only combines per-block partial results in its second pass."""
    if reads_rows_once(state, nodes):
        return False
    members = set(nodes)
    program, geo = state.program, state.geo
    n_full = red.full_numel
    after: set[str] = set()
    for nid in state.sort_nodes(nodes):
        g = geo[nid]
        if g.role == "reduction":
            if g.out_full:
                return True
            after.add(nid)
            continue
        ups = (program.values[v].producer for v in program.nodes[nid].inputs if v is not None)
        if any(u in after for u in ups if u in members):
            after.add(nid)
            if g.role == "pointwise" and g.numel == n_full:
                return True
    return False


def recompute_ms(state, sa: Summary, sb: Summary, facts: Facts | None = None) -> tuple[float, str | None]:
    """Extra time when a smaller pointwise loop is merged into a larger one and so recomputed per
    element of the larger loop (a broadcast producer), with a description. With the union's facts,
    only the part of the recomputed FLOPs that the kernel's memory time does not hide counts: a
    memory-bound kernel (a sigmoid of [N, C, 1, 1] scaling an [N, C, H, W] map) recomputes for free
    on the roofline, as kernel_ms takes the larger of bytes and FLOPs."""
    na = max(sa.numels.values(), default=0)
    nb = max(sb.numels.values(), default=0)
    if not na or not nb or na == nb:
        return 0.0, None
    small, big = (sa, nb) if na < nb else (sb, na)
    extra = 0.0
    worst = None
    for nid, ne in small.numels.items():
        if ne < big:
            f = state.costs[nid].flops * (big / ne - 1)
            extra += f
            if worst is None or f > worst[1]:
                worst = (nid, f, big // max(ne, 1))
    if worst is None:
        return 0.0, None
    gpu = state.gpu
    extra_ms = extra / gpu.flops_per_ms
    if facts is not None:
        bytes_ms, flops_ms = (facts.read_bytes + facts.esc_bytes) / gpu.bytes_per_ms, facts.flops / gpu.flops_per_ms
        extra_ms = max(0.0, flops_ms + extra_ms - max(bytes_ms, flops_ms))
    return extra_ms, (f"{_name(state, worst[0])} would be recomputed about "
                                            f"{worst[2]} times per value")
