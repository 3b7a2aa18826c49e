"""Reductions a row kernel computes in its prologue, as windows (issue #14: reductions over different
axes of the same data in the fewest passes).

A sum, mean, max or min whose result another reduction of the region reads whole, as its own
elements, needs no kernel and no tensor of its own: each element the row kernel loads is a lambda
that loops over what that element reduces, as a pooling window's lambda does (layout_graph.py). A
ViT head's mean over the tokens then its LayerNorm over the features, or a convolution's min over
depth then a softmax over the channels, are one kernel that reads the input once.

The window is one contiguous block of dims of the input, [outer, K, inner] with the result
[outer, inner]: element i reads x[(i / inner) * K * inner + r * inner + i % inner] for r < K. Where
inner is large, a warp's neighbouring elements read neighbouring addresses at each step r; the
planner fuses only those, and only where the rows' elements are threads enough for the GPU
(planner/fusion.py: prologue_reductions).
"""
from __future__ import annotations

import math

from ..ir import Program
from ..ops.common import norm_dims
from .cuda import Names, float_literal
from .kernel import pow2_at_least
from .pointwise import is_elementwise

# op -> (the accumulator's start, the fold of one element xv into acc); NaN propagates through max / min
FOLDS = {"sum": ("0.0f", "acc += xv;"), "mean": ("0.0f", "acc += xv;"),
         "max": ("-INFINITY", "if (xv > acc || xv != xv) acc = xv;  // NaN propagates, as in torch"),
         "min": ("INFINITY", "if (xv < acc || xv != xv) acc = xv;  // NaN propagates, as in torch")}
CONSUMER_CATEGORIES = ("reduction", "normalization")
# window elements a thread loads before folding any (the loop unrolled so many times): each thread walks
# its window alone, so its loads in flight are the kernel's memory parallelism. 4 is what the H100 timed
# at s33 (benchmarks/h100-2026-12-07-s33); the tuner times 8 and 2 besides
WINDOW_UNROLL = 4


def reduced_block(program: Program, node) -> tuple[int, int, int] | None:
    """(outer, K, inner) of a float32 sum / mean / max / min over one contiguous block of dims (its
    window), else None."""
    if node.op not in FOLDS or len([v for v in node.inputs if v]) != 1:
        return None
    x, y = program.values[node.inputs[0]], program.values[node.outputs[0]]
    if x.dtype != "float32" or y.dtype != "float32" or not x.shape:
        return None
    dims = sorted(norm_dims(node.attrs.get("dim") or list(range(len(x.shape))), len(x.shape)))
    if dims != list(range(dims[0], dims[-1] + 1)):
        return None
    shape = list(x.shape)
    return math.prod(shape[:dims[0]]), math.prod(shape[dims[0]:dims[-1] + 1]), math.prod(shape[dims[-1] + 1:])


def _readers(program: Program, io) -> dict[str, list[str]]:
    """value -> the region's nodes that read it."""
    out: dict[str, list[str]] = {}
    for n in io.nodes:
        for v in program.nodes[n].inputs:
            if v:
                out.setdefault(v, []).append(n)
    return out


def window_threads_per_row(cols: int) -> int:
    """The threads of a row whose elements are windows: one per element, 32 to 1024 (codegen's
    rowkernel._window_threads, and the planner's figure for a staged window's chunk)."""
    return min(1024, max(32, pow2_at_least(cols)))


def window_reductions(program: Program, io) -> set[str]:
    """The reductions of a row region that its prologue computes: each a reduced_block whose result
    reaches, through pointwise ops and views of the region, another reduction or norm that reads it at
    its own size (its elements are that consumer's rows), not as per-row values broadcast along longer
    rows (a mean subtracted before a variance), and not a whole-tensor total of per-row values (a
    loss's mean over its rows, which the row graph folds row by row)."""
    from .layout_graph import is_layout_op     # it renders these windows (reduce_lambda)
    nodes, vals = program.nodes, program.values
    readers = _readers(program, io)
    out = set()
    for n in io.nodes:
        if reduced_block(program, nodes[n]) is None:
            continue
        size = math.prod(vals[nodes[n].outputs[0]].shape)
        todo, seen = list(nodes[n].outputs), set()
        while todo and n not in out:
            for c in readers.get(todo.pop(), []):
                node = nodes[c]
                if is_elementwise(node) or is_layout_op(node):
                    if c not in seen:
                        seen.add(c)
                        todo += node.outputs
                elif node.opdef.category in CONSUMER_CATEGORIES and node.inputs and node.inputs[0] and \
                        math.prod(vals[node.inputs[0]].shape) == size and \
                        math.prod(vals[node.outputs[0]].shape) > 1:
                    out.add(n)
    return out


def reduce_lambda(program: Program, node, fn: dict, names: Names, note: str, suffix: str,
                  unroll: int = WINDOW_UNROLL) -> list[str]:
    """The lambda of a window reduction's result at its flat index i: a loop over its K elements,
    calling its input's lambda (pointwise ops before it are evaluated where it reads them), unrolled
    `unroll` times so that many loads are in flight before the first fold."""
    _, k, inner = reduced_block(program, node)
    x, y = program.values[node.inputs[0]], program.values[node.outputs[0]]
    start, fold = FOLDS[node.op]
    fn[y.id] = names.new(y.name + suffix)
    base = "i * kWindow" if inner == 1 else "(i / kWindowStride) * (kWindow * kWindowStride) + i % kWindowStride"
    step = "r" if inner == 1 else "r * kWindowStride"
    result = f"acc / {float_literal(float(k))}" if node.op == "mean" else "acc"
    return [f"  // {note} -> {y.spec}: each element folds its {k} inputs, {inner} apart",
            f"  auto {fn[y.id]} = [&](index_t i) -> float {{",
            f"    constexpr index_t kWindow = {k}, kWindowStride = {inner};",
            f"    const index_t base = {base};",
            f"    float acc = {start};",
            f"    #pragma unroll {unroll}",
            "    for (index_t r = 0; r < kWindow; ++r) {",
            f"      const float xv = {fn[x.id]}(base + {step});",
            f"      {fold}",
            "    }",
            f"    return {result};",
            "  };"]


# Contiguous windows (inner == 1: a classifier head's mean over 7 x 7 pixels before a LayerNorm over the
# channels). A thread per element would walk its own 49 floats while its warp's neighbours walk theirs
# 196 bytes away: each load a sector of its own. Staged instead, the block reads the span of its rows'
# windows (contiguous) a chunk at a time into shared memory, neighbouring threads at neighbouring
# addresses, folds each window there, and the row kernel reads the results from a tile.
STAGE_CHUNK_MAX = 8192     # floats of one chunk (32 KB of shared memory), whole windows
STAGE_MAX_LOADS = 16       # loads a thread holds for one chunk (registers): longer windows are not staged
SAME_INDEX_OPS = ("reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "contiguous")


def staged_window(program: Program, io, node) -> bool:
    """A window reduction (window_reductions) whose elements are contiguous (inner 1, at most
    STAGE_CHUNK_MAX of them) and whose result every reader in the region reaches at its own flat
    index, through same-sized pointwise ops and reshapes: the block's rows are then exactly the block's
    windows, which it can compute together before reading its rows."""
    block = reduced_block(program, node)
    if block is None or block[2] != 1 or block[1] > STAGE_CHUNK_MAX:
        return False
    from .layout_graph import is_layout_op
    nodes, vals = program.nodes, program.values
    size = math.prod(vals[node.outputs[0]].shape)
    readers = _readers(program, io)
    todo, seen = list(node.outputs), set()
    while todo:
        for c in readers.get(todo.pop(), []):
            reader = nodes[c]
            if is_layout_op(reader):
                if reader.op not in SAME_INDEX_OPS:
                    return False
            elif is_elementwise(reader):
                if any(math.prod(vals[o].shape) != size for o in reader.outputs):
                    return False
            elif reader.opdef.category in CONSUMER_CATEGORIES:
                continue        # the row kernel's reduction reads it as its row (its size checked above)
            else:
                return False
            if c not in seen:
                seen.add(c)
                todo += reader.outputs
    return True


def staged_lambda(program: Program, node, fn: dict, names: Names, note: str, suffix: str, tile: str,
                  first: str) -> list[str]:
    """A staged window's result at its flat index i: its element of the block's tile (`first`: the
    block's first window), which stage_window_lines filled."""
    y = program.values[node.outputs[0]]
    fn[y.id] = names.new(y.name + suffix)
    return [f"  // {note} -> {y.spec}: the block's windows folded in shared memory (staged)",
            f"  auto {fn[y.id]} = [&](index_t i) -> float {{ return {tile}[(int)(i - {first})]; }};"]


def stage_chunk(k: int, block: int, unroll: int) -> tuple[int, int, int]:
    """(windows per chunk, each thread's loads of a chunk, lanes folding one window): a chunk is
    block * unroll floats rounded down to whole windows (at least one window: a long one takes more
    loads a thread); the lanes per window spread a chunk's folds over the block."""
    per_chunk = max(1, min(block * unroll, STAGE_CHUNK_MAX) // k)
    lanes = 1
    while lanes < 32 and block // (lanes * 2) >= per_chunk:
        lanes *= 2
    return per_chunk, math.ceil(per_chunk * k / block), lanes


def stageable(k: int, block: int, unroll: int) -> bool:
    """Whether a block of `block` threads can stage windows of k: a chunk's loads fit a thread's registers."""
    return stage_chunk(k, block, unroll)[1] <= STAGE_MAX_LOADS


def stage_buffer_floats(k: int, block: int, unroll: int) -> int:
    """Shared floats of a chunk, skewed one float in 32 (so a window's folding lanes, each k apart, do
    not share banks)."""
    per_chunk = stage_chunk(k, block, unroll)[0]
    return per_chunk * k + per_chunk * k // 32 + 1


def stage_window_lines(program: Program, node, x_fn: str, tile: str, first: str, buf: str,
                       block: int, unroll: int) -> list[str]:
    """The block's windows of `node` (staged_window), computed into `tile` before the row kernel reads
    its rows: each chunk of whole windows is loaded by every thread, `loads` elements kBlock apart (the
    span is contiguous: a warp's loads coalesce), stored to `buf`, then folded there by `lanes` lanes a
    window (shuffles combine them) while the next chunk's loads are in flight. Every thread of the
    block runs it (two barriers a chunk)."""
    _, k, _ = reduced_block(program, node)
    per_chunk, loads, lanes = stage_chunk(k, block, unroll)
    start, fold = FOLDS[node.op]
    combine = fold.replace("xv", "other").split("  //")[0]
    result = f"acc / {float_literal(float(k))}" if node.op == "mean" else "acc"
    y = program.values[node.outputs[0]]
    return [
        f"  // {y.name}: the block's windows of {k} contiguous elements, {per_chunk} a chunk read coalesced into shared",
        f"  // memory ({loads} loads a thread), each folded there by {lanes} lane(s) while the next chunk is read",
        "  {",
        f"    const int w_count = (int)min((index_t)kRowsPerBlock * kCols, (index_t)kRows * kCols - {first});",
        f"    float xs[{loads}];",
        "    auto load_chunk = [&](int c0) {",
        f"      const int n = min({per_chunk}, w_count - c0) * {k};",
        f"      const index_t x0 = ({first} + c0) * {k};",
        "      #pragma unroll",
        f"      for (int u = 0; u < {loads}; ++u) {{",
        "        const int t = u * kBlock + threadIdx.x;",
        f"        xs[u] = t < n ? {x_fn}(x0 + t) : 0.0f;",
        "      }",
        "    };",
        "    load_chunk(0);",
        f"    for (int c0 = 0; c0 < w_count; c0 += {per_chunk}) {{",
        f"      const int n = min({per_chunk}, w_count - c0) * {k};",
        "      #pragma unroll",
        f"      for (int u = 0; u < {loads}; ++u) {{",
        "        const int t = u * kBlock + threadIdx.x;",
        f"        if (t < n) {buf}[t + (t >> 5)] = xs[u];",
        "      }",
        "      __syncthreads();",
        f"      if (c0 + {per_chunk} < w_count) load_chunk(c0 + {per_chunk});   // in flight while this chunk folds",
        f"      for (int w0 = 0; w0 < {per_chunk}; w0 += kBlock / {lanes}) {{   // the same trips for every lane",
        f"        const int w = w0 + threadIdx.x / {lanes};" if lanes > 1 else "        const int w = w0 + threadIdx.x;",
        f"        const bool ok = w < n / {k};",
        f"        float acc = {start};",
        "        if (ok) {",
        f"          for (int r = threadIdx.x % {lanes}; r < {k}; r += {lanes}) {{" if lanes > 1 else
        f"          for (int r = 0; r < {k}; ++r) {{",
        f"            const int t = w * {k} + r;",
        f"            const float xv = {buf}[t + (t >> 5)];",
        f"            {fold}",
        "          }",
        "        }",
        *([f"        for (int o = {lanes // 2}; o > 0; o >>= 1) {{",
           "          const float other = __shfl_xor_sync(0xffffffffu, acc, o);",
           f"          {combine}",
           "        }"] if lanes > 1 else []),
        f"        if (ok && threadIdx.x % {lanes} == 0) {tile}[c0 + w] = {result};" if lanes > 1 else
        f"        if (ok) {tile}[c0 + w] = {result};",
        "      }",
        "      __syncthreads();",
        "    }",
        "  }"]
