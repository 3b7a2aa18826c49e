"""What a kernel that walks rows along one dim needs (the scans of scan.py; argmax / argmin are row-graph reductions):
the tensor viewed as [outer, L, inner] around that dim, R = outer * inner rows of L elements, element
l of row (o, i) at (o * L + l) * inner + i; the choice of schedule (a warp or a block per row, or a
thread per row when the dim is strided) and how the warp and block schedules are sized and described.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Program
from ..ops.common import norm_dim
from .cuda import index_type
from .kernel import CodegenError
from .region_io import RegionIO

WARP = 32


def single_node(program: Program, io: RegionIO, ops, what: str):
    """The region's one node, which must be one of `ops`; CodegenError otherwise."""
    nodes = [program.nodes[n] for n in io.nodes]
    if len(nodes) != 1 or nodes[0].op not in ops:
        found = ", ".join(f"{n.name} ({n.op})" for n in nodes)
        raise CodegenError(f"{what} kernels are generated for a region of exactly one {'/'.join(ops)} node; "
                           f"this one has {len(nodes)}: {found}")
    return nodes[0]


def outer_len_inner(shape, dim: int | None) -> tuple[int, int, int]:
    """[outer, L, inner] around dim (the whole tensor as one row when dim is None)."""
    if dim is None or not shape:
        return 1, math.prod(shape), 1
    d = norm_dim(dim, len(shape))
    return math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])


@dataclass(frozen=True)
class RowWalk:
    outer: int
    cols: int      # L, the length of the walked dim
    inner: int     # elements between neighbours along it

    @property
    def rows(self) -> int:
        return self.outer * self.inner

    @property
    def index_t(self) -> str:
        return index_type(self.rows * self.cols)

    def base_line(self) -> str:
        """The kernel line that sets `base`, the offset of element (outer, 0, inner) of `row`."""
        if self.inner > 1:
            return "  const index_t base = (row / kInner) * kCols * kInner + row % kInner;  // element (outer, 0, inner)"
        return "  const index_t base = row * kCols;"

    def describe(self, sched: str) -> str:
        return f"[outer {self.outer}, L {self.cols}, inner {self.inner}]: {self.rows} rows of {self.cols}; schedule: {sched}."


def row_walk(node, shape, dim, verb: str, empty_note: str = "there is nothing to launch") -> RowWalk:
    """The walk of `shape` along dim; CodegenError for an empty tensor ("<node> <verb> an empty tensor")."""
    walk = RowWalk(*outer_len_inner(shape, dim))
    if walk.rows == 0 or walk.cols == 0:
        raise CodegenError(f"{node.name} ({node.op}) {verb} an empty tensor {list(shape)}; {empty_note}",
                           node_id=node.id)
    return walk


def pick_schedule(p: dict, cols: int, inner: int) -> str:
    """A row walk's schedule: "column" when the walked dim is strided (neighbouring threads take
    neighbouring rows), else "warp" for rows up to p["warp_max_cols"] and "block" for longer ones."""
    if inner >= int(p["column_min_inner"]):
        return "column"
    return "warp" if cols <= int(p["warp_max_cols"]) else "block"


def vector_width(p: dict, schedule: str, cols: int, inner: int) -> int:
    """float4 loads when the row is contiguous and a multiple of 4 long, else single floats."""
    return 4 if schedule != "column" and inner == 1 and cols % 4 == 0 and int(p["vector_width"]) == 4 else 1


def threads_per_row(p: dict, schedule: str, walk: RowWalk) -> tuple[int, int, int]:
    """(threads per row, rows per block, grid) of the warp schedule (p["block"] // 32 rows of one warp
    per block) and the block schedule (one block per row, p["long_block"] threads past p["long_cols"])."""
    if schedule == "warp":
        rows_per_block = int(p["block"]) // WARP
        return WARP, rows_per_block, math.ceil(walk.rows / rows_per_block)
    tpr = int(p["block"]) if walk.cols <= int(p["long_cols"]) else int(p["long_block"])
    return tpr, 1, walk.rows


def describe_rows(schedule: str, tpr: int, rows_per_block: int, vec: int, inner: int, grid: int,
                  extra: str = "") -> str:
    """The schedule line of the warp and block schedules; extra goes before the kind of loads."""
    return ({"warp": f"one warp per row, {rows_per_block} rows per block",
             "block": f"one block of {tpr} threads per row"}[schedule]
            + extra + f", {'float4' if vec == 4 else 'scalar'} loads"
            + (f" strided by {inner}" if inner > 1 else "") + f", {grid} blocks")
