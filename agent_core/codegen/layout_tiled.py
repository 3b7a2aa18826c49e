"""The tiled schedule of a layout graph: for regions where neighbouring output elements read an input
far apart (pixel_shuffle's planes H*W apart, a transpose or permute that moves the last dim, a
channel shuffle of channels-last data), one thread per output element reads that input uncoalesced.

Per region input, the reads of the graph are composed down from the output's flat index into one
view of the input (codegen/views.py; contiguous reshapes on top peel off). An input read exactly once
per output element through a single view whose innermost stride is not 1, while some other output
dim walks it with stride 1, is *tiled*: a block owns a box of the output, TA positions along that dim
`a` times TB along the output's innermost dim `b`; it first loads the input's part of the box into
shared memory with neighbouring threads along `a` (coalesced in the input), then computes and stores
the box with neighbouring threads along `b` (coalesced in the output), reading the tiled input from
shared memory. Every other input stays a direct load at the store (a broadcast mean, a coalesced
arm of a cat), and pointwise ops are evaluated there too: layout_graph's lambdas, unchanged, except
that a tiled input's lambda returns the tile element of the output being stored.

The tile's row pitch is padded so that the TB rows a warp reads at a time fall in different banks.
Parameters: `tile_elems` (elements per block, default 1024), `block` (threads, 256).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import views as V
from .cuda import Names, index_type, kernel_name
from .kernel import CodegenError, KernelSource

BANKS = 32


@dataclass(frozen=True)
class TilePlan:
    fine: tuple        # the output's shape as the primary tiled input's single view sees it (merged)
    a: int             # the output dim that walks the tiled inputs with stride 1
    tiled: dict        # input value id -> its single View over `fine`
    ta: int            # tile extent along a (a power of two, >= 32 where kA allows)
    tb: int            # tile extent along the output's innermost dim

    @property
    def b(self) -> int:
        return len(self.fine) - 1


def composed_reads(g) -> dict:
    """Region input -> the ViewStacks through which the outputs read it, each from the first
    output's flat index (every output has its element count) down to the input's flat index."""
    program, io = g.program, g.io
    vals = program.values
    found: dict = {}

    def visit(v, stack):
        if v in io.inputs:
            found.setdefault(v, []).append(stack)
            return
        node = program.nodes[vals[v].producer]
        if node.op in _graph_ops():
            lay = _masked_cat(node, vals) if node.op in ("cat", "stack") else \
                g.layouts(node)[1][list(node.outputs).index(v)]
            for r in lay.reads:
                for layer in r.stack.layers:      # a gather's index tensor: never tiled
                    if isinstance(layer, V.Indirect):
                        found.setdefault(layer.index.source, []).append(None)
                if r.source is not None:
                    visit(r.source, V.ViewStack(r.stack.layers + stack.layers))
            return
        for u in node.inputs:
            if u:
                b = V.Layout.of("b", vals[u].shape)
                if tuple(vals[u].shape) != tuple(vals[v].shape):
                    b = V.expand(b, list(vals[v].shape))
                visit(u, V.ViewStack(b.reads[0].stack.layers + stack.layers))

    first = vals[io.outputs[0]].shape
    for out in io.outputs:
        visit(out, V.ViewStack.of(first))
    return found


def _masked_cat(node, vals) -> V.Layout:
    """A cat / stack with every arm masked to its place: views.cat leaves the last arm unmasked (the
    kernel reads it where no other arm is), which hides where it is read from."""
    ins = [V.Layout.of(u, vals[u].shape) for u in node.inputs if u]
    d = node.attrs.get("dim", 0)
    if node.op == "stack":
        d = d % (len(ins[0].shape) + 1)
        ins = [V.unsqueeze(x, d) for x in ins]
    d = d % len(ins[0].shape)
    total, pos, reads = sum(x.shape[d] for x in ins), 0, []
    for x in ins:
        n = x.shape[d]
        if n:
            reads += V.pad_constant(x, d, pos, total - pos - n).reads
        pos += n
    shape = list(ins[0].shape)
    shape[d] = total
    return V.Layout(tuple(shape), tuple(reads))


def _graph_ops():
    from .layout_graph import GRAPH_OPS
    return GRAPH_OPS


def single_view(stacks) -> V.View | None:
    """The one view through which an input is read, from the output's flat index, or None."""
    if len(stacks) != 1 or stacks[0] is None:
        return None
    layers = list(stacks[0].layers)
    while len(layers) > 1 and isinstance(layers[-1], V.View) and layers[-1].contiguous \
            and isinstance(layers[-2], V.View) and layers[-2].numel == layers[-1].numel:
        layers.pop()                      # a reshape on top: the flat index passes through
    layers = [l for l in layers[:-1] if not (isinstance(l, V.View) and l.contiguous)] + layers[-1:]
    if not all(isinstance(l, V.View) for l in layers):
        return None
    view = layers[0]
    for top in layers[1:]:
        view = _collapse(view, top)
        if view is None:
            return None
    return view.merged()


def _collapse(lower: V.View, top: V.View) -> V.View | None:
    """One view for `top` read over the flat index of `lower`, when top is a permutation of a
    contiguous view (a permute or transpose between reshapes): lower reshaped, then permuted."""
    if top.mask is not None:      # a padded or cat-arm view: its valid box, composed, then padded back
        box = top.shrink(top.mask)
        inner = _collapse(lower, V.View.create(box.shape, box.strides, box.offset))
        if inner is None:
            return None
        for d, ((lo, hi), n) in enumerate(zip(top.mask, top.shape)):
            if lo or hi != n:
                inner = inner.pad(d, lo, n - hi)
        return inner
    if top.offset or top.numel != lower.numel:
        return None       # (a read of part of `lower` stays two views)
    order = sorted(range(len(top.shape)), key=lambda d: -top.strides[d])
    shape = [top.shape[d] for d in order]
    want = V.contiguous_strides(shape)
    if any(top.strides[d] != w for d, w, s in zip(order, want, shape) if s != 1):
        return None
    v = lower.reshape(shape)
    return None if v is None else v.permute([order.index(d) for d in range(len(order))])


def _uncoalesced(view: V.View | None) -> bool:
    return view is not None and len(view.shape) >= 2 and view.strides[-1] != 1 and 1 in view.strides[:-1]


def plan_tiles(g, params: dict | None) -> TilePlan | None:
    """The tile plan when some input is read uncoalesced and tiling it helps; None keeps the
    one-thread-per-output schedule (every read already coalesced, or no view to tile through)."""
    params = params or {}
    if params.get("tiled") is False:
        return None
    vals = g.program.values
    views = {v: single_view(s) for v, s in composed_reads(g).items() if v not in g.indices}
    numel = math.prod(vals[g.io.outputs[0]].shape)
    cands = [v for v, view in views.items() if _uncoalesced(view) and view.numel == numel]
    if not cands:
        return None
    primary = max(cands, key=lambda v: vals[v].nbytes)
    fine = views[primary].shape
    a = views[primary].strides.index(1)
    tiled = {v: views[v] for v in cands if views[v].shape == fine and views[v].strides[a] == 1}
    ka, kb = fine[a], fine[-1]
    elems = int(params.get("tile_elems", 1024))
    tb = min(kb, int(params.get("tile_b", BANKS)))
    ta = 1 << max(0, min(math.ceil(math.log2(ka)), int(math.log2(max(1, elems // tb)))))
    return TilePlan(tuple(fine), a, tiled, ta, tb)


def _pitch(ta: int, tb: int) -> int:
    """Row pitch of a tile [tb][pitch]: a warp's store reads ceil(32 / tb) neighbours in each of tb
    rows, so rows start ceil(32 / tb) banks apart (32 x 32 tiles: the classic +1)."""
    want = math.ceil(BANKS / tb) % BANKS if tb < BANKS else 1
    return ta + (want - ta) % BANKS


def generate_tiled(g, plan: TilePlan, name: str, params: dict | None, kind: str, numel: int) -> KernelSource:
    from .layout_graph import _lambdas
    program, io = g.program, g.io
    vals = program.values
    params = params or {}
    block = int(params.get("block", 256))
    fine, a, b, ta, tb = plan.fine, plan.a, plan.b, plan.ta, plan.tb
    if math.prod(fine) != numel:
        raise CodegenError(f"tiled layout: the view's shape {list(fine)} does not cover {numel} outputs")
    batch = [d for d in range(len(fine)) if d not in (a, b)]
    out_strides = V.contiguous_strides(fine)
    nb = math.prod(fine[d] for d in batch)
    tiles_a, tiles_b = math.ceil(fine[a] / ta), math.ceil(fine[b] / tb)
    grid = tiles_a * tiles_b * nb
    pitch = _pitch(ta, tb)

    names = Names()
    names.taken.update(("o", "i", "t", "q", "ia", "ib", "la", "lb", "ti", "ta", "tb", "kNumel", "kBlock",
                        "kA", "kB", "kTA", "kTB", "kPitch", "kTilesA", "kTilesB", "out_base"))
    arg = {v: names.new(vals[v].name) for v in io.inputs + io.outputs}
    tile = {v: names.new("tile_" + vals[v].name) for v in plan.tiled}
    lines, fn = _lambdas(g, arg, names, False)
    for v in plan.tiled:      # the tiled input's lambda: the tile element of the output being stored
        prefix = f"  auto {fn[v]} = "
        k = next(i for i, line in enumerate(lines) if line.startswith(prefix))
        lines[k] = (f"{prefix}[&](index_t) -> float {{ return {tile[v]}[lb][la]; }};  "
                    f"// input {vals[v].spec}, staged in shared memory")

    # coordinates of the tile element (la, lb) of block (q, ta, tb) in the fine output dims
    qv = V.Var("q", 0, max(nb - 1, 0))
    bcoords = V.unravel(qv, [fine[d] for d in batch]) if batch else []
    coords = [None] * len(fine)
    for d, c in zip(batch, bcoords):
        coords[d] = c
    coords[a] = V.Var("ia", 0, fine[a] - 1)
    coords[b] = V.Var("ib", 0, fine[b] - 1)
    out_base = V.render_expr(V._sum([(c, out_strides[d]) for d, c in zip(batch, bcoords)], 0)) if batch else "0"
    # float4 loads where every tiled read keeps aligned runs of 4 along a and the tile's rows start
    # 16 bytes apart (a pitch of a multiple of 4: short sides of 1, 2, 4 or 8), stored whole into the tile
    vec = bool(params.get("vector", True)) and ta % 4 == 0 and fine[a] % 4 == 0 and pitch % 4 == 0 and all(
        view.offset % 4 == 0 and math.prod(vals[v].shape) % 4 == 0
        and all(st % 4 == 0 for d, st in enumerate(view.strides) if d != a)
        and (view.mask is None or view.mask[a][0] % 4 == 0 and view.mask[a][1] % 4 == 0)
        for v, view in plan.tiled.items())
    loads = []
    for v, view in plan.tiled.items():
        off, tests = view.locate(coords)
        idx, cond = V.render_expr(off, names=arg), V.render_tests(tests, names=arg)
        # the last arm of a cat has no mask (it is read where no earlier arm is): the bounds test keeps
        # its tile load inside the tensor where the output reads another arm
        n = math.prod(vals[v].shape)
        lo, hi = off.lo, off.hi
        inside = ([] if lo >= 0 else [f"{idx} >= 0"]) + ([] if hi < n else [f"{idx} < {n}"])
        guard = " && ".join(["ia < kA && ib < kB"] + ([cond] if cond else []) + inside)
        if vec:
            loads.append(f"    if ({guard}) *reinterpret_cast<float4*>(&{tile[v]}[lb][la]) = "
                         f"reinterpret_cast<const float4*>({arg[v]})[({idx}) / 4];")
        else:
            loads.append(f"    if ({guard}) {tile[v]}[lb][la] = {arg[v]}[{idx}];")

    index_t = index_type(max([numel] + [math.prod(vals[v].shape) for v in io.inputs]))
    consts = [f"typedef {index_t} index_t;", f"constexpr index_t kNumel = {numel};  // output elements",
              f"constexpr index_t kA = {fine[a]};  // output dim {a} of {list(fine)}: walks the tiled inputs contiguously",
              f"constexpr index_t kB = {fine[b]};  // the output's innermost dim",
              f"constexpr index_t kOutStrideA = {out_strides[a]};",
              f"constexpr int kTA = {ta}, kTB = {tb}, kPitch = {pitch};  // tile; pitch padded against bank conflicts",
              f"constexpr index_t kTilesA = {tiles_a}, kTilesB = {tiles_b};",
              f"constexpr int kBlock = {block};"]
    consts.append(f"constexpr int kVec = {4 if vec else 1};  // elements per load")
    # float4 stores: each thread evaluates 4 neighbours along the output's innermost dim b (the tile's
    # lambdas read tile[lb][la] as lb steps) and stores them at once; b's runs of 4 stay inside the
    # output's rows (kB a multiple of 4) and 16-byte aligned (every other output stride is a multiple of kB)
    store4 = bool(params.get("store_vector")) and tb % 4 == 0 and fine[b] % 4 == 0 and \
        all(vals[v].dtype == "float32" for v in io.outputs)
    if store4:
        consts.append("constexpr int kStoreVec = 4;  // outputs per store")
    body = [*(f"  __shared__ __align__(16) float {tile[v]}[kTB][kPitch];" for v in plan.tiled),
            "  const index_t ti = blockIdx.x % (kTilesA * kTilesB);",
            *(["  const index_t q = blockIdx.x / (kTilesA * kTilesB);  // the batch: dims neither a nor b"]
              if batch else []),
            "  const index_t ta = ti % kTilesA, tb = ti / kTilesA;",
            "  // load: neighbouring threads along dim a, contiguous in each tiled input (coalesced)",
            "  for (int t = threadIdx.x; t < kTA * kTB / kVec; t += kBlock) {",
            "    const int la = t % (kTA / kVec) * kVec, lb = t / (kTA / kVec);",
            "    const index_t ia = ta * kTA + la, ib = tb * kTB + lb;",
            *loads,
            "  }",
            "  __syncthreads();",
            f"  const index_t out_base = {out_base};",
            "  // store: neighbouring threads along the output's innermost dim (coalesced)",
            *(_stores4(lines, [(arg[v], fn[v]) for v in io.outputs]) if store4 else [
                "  for (int t = threadIdx.x; t < kTA * kTB; t += kBlock) {",
                "    const int lb = t % kTB, la = t / kTB;",
                "    const index_t ia = ta * kTA + la, ib = tb * kTB + lb;",
                "    if (ia >= kA || ib >= kB) continue;",
                "    const index_t o = out_base + ia * kOutStrideA + ib;",
                *("  " + line for line in lines),
                *(f"    {arg[v]}[o] = {fn[v]}(o);" for v in io.outputs),
                "  }"])]
    from .layout_graph import graph_source
    sched = (f"tiles of {ta} x {tb} through shared memory ({len(plan.tiled)} tiled input(s){', float4 loads' if vec else ''}"
             f"{', float4 stores' if store4 else ''}), "
             f"{grid} blocks of {block} threads")
    source, layout_nodes = graph_source(
        g, name, consts, body, arg, sched,
        [f"{vals[v].name} as read by the outputs: view shape {list(view.shape)}, strides "
         f"{list(view.strides)}, offset {view.offset}" for v, view in plan.tiled.items()], plan.tiled, " (tiled)")
    read = sum(min(vals[v].nbytes, numel * 4) for v in io.inputs if v in g.need)
    return KernelSource(
        name=kernel_name(name), kind=kind, source=source, node_ids=list(io.nodes), inputs=list(io.inputs),
        outputs=list(io.outputs), grid=(grid, 1, 1), block=(block, 1, 1), schedule=sched,
        params={"tiled": True, "graph": True, "vector": 4 if vec else 1, "store_vector": store4,
                "tile_elems": ta * tb, "tile_b": tb, "tile": [ta, tb],
                "block": block, "grid": grid, "tiled_inputs": [vals[v].name for v in plan.tiled],
                "chain": [n.op for n in layout_nodes]},
        align=16 if vec or store4 else 4, bytes_moved=read + sum(vals[v].nbytes for v in io.outputs),
        flops=sum(program.node_flops(n) for n in io.nodes))


def _stores4(lines: list, outs: list) -> list:
    """The store loop of the float4-store form: a thread takes 4 neighbours along b (lb0 .. lb0 + 3),
    evaluates each through the lambdas (which read the tile at lb) and stores the 4 at once."""
    return ["  for (int t = threadIdx.x; t < kTA * kTB / kStoreVec; t += kBlock) {",
            "    const int lb0 = t % (kTB / kStoreVec) * kStoreVec, la = t / (kTB / kStoreVec);",
            "    const index_t ia = ta * kTA + la, ib0 = tb * kTB + lb0;",
            "    if (ia >= kA || ib0 >= kB) continue;",
            "    const index_t o0 = out_base + ia * kOutStrideA + ib0;",
            "    int lb = lb0;",
            *("  " + line for line in lines),
            *(f"    float4 run_{k};" for k in range(len(outs))),
            "#pragma unroll",
            "    for (int e = 0; e < kStoreVec; ++e) {",
            "      lb = lb0 + e;",
            *(f"      (&run_{k}.x)[e] = {fn}(o0 + e);" for k, (_, fn) in enumerate(outs)),
            "    }",
            *(f"    reinterpret_cast<float4*>({out})[o0 / kStoreVec] = run_{k};" for k, (out, _) in enumerate(outs)),
            "  }"]


def tune_variants(params: dict) -> list[dict]:
    """Tile sizes to try besides the default: fewer or more elements per block, a shorter b side; and
    no tile at all (one thread per output reading through the view). Without the tile a warp's 32
    outputs read 32 / b runs of b neighbours: with b <= 8 floats (pixel_shuffle's r x r, a short last
    dim) each run still fills a 32-byte sector, so the gather moves the same DRAM bytes with no shared
    memory round trip or barrier, and it is tried first; with a long b side it is tried second (the
    tuner tries 6: last, it was never tried, and 48_Mamba2's permute of C ran tiled in 0.27 ms where
    the gather takes 0.20)."""
    if not params.get("tiled") or not params.get("graph"):
        return []
    out = [] if params.get("store_vector") or int((params.get("tile") or [0, 1])[1]) % 4 else [{"store_vector": True}]
    for cand in ({"tile_elems": 2048}, {"tile_elems": 512}, {"vector": False}, {"tile_elems": 2048, "block": 512},
                 {"tile_b": 16}, {"tile_elems": 4096, "block": 512}):
        if cand == {"vector": False} and params.get("vector") != 4:
            continue
        if any(params.get(k) != v for k, v in cand.items()):
            out.append(cand)
    short_b = int((params.get("tile") or [0, BANKS])[1]) * 4 <= 32
    return [{"tiled": False}, *out] if short_b else [*out[:1], {"tiled": False}, *out[1:]]


def tiles_region(program, io, kind: str, params: dict | None) -> bool:
    """Whether a region's layout graph would take the tiled schedule (layout.py asks it for a chain
    whose own 32 x 32 transpose does not fit: a stacked view as pixel_shuffle's, or a short last dim)."""
    from .layout_graph import _Graph, index_inputs
    what = kind.replace("_", "-")
    try:
        g = _Graph(program, io, what, index_inputs(program, io, what))
        return plan_tiles(g, params) is not None
    except CodegenError:
        return False
